# A policy plugin links only what a policy needs (the ABI, the plugin-support library, its own
# static libraries, the CUDA runtime): never libsieve_runtime or libsieve_cli. A host loads
# plugins into its own process; one that pulled in the runtime's and CLI's libraries a second time
# crashed sieve_session_create inside a torch process (docs/results/transformers.md). Tools that
# need them live in tool modules (sieve_plugin_tools, cmake/SievePlugin.cmake).
#
#   cmake -DREADELF=readelf -DFILES="a.so|b.so" -P plugin_links.cmake
#
# Reads each file's dynamic section (DT_NEEDED) with readelf; fails, naming the file and the
# library, when one needs a forbidden library, and when a file shows no DT_NEEDED at all (every
# plugin needs libc: no entries means readelf's output was not read, not that the file is clean).
foreach(var READELF FILES)
  if(NOT ${var})
    message(FATAL_ERROR "plugin_links.cmake: -D${var}=... is required")
  endif()
endforeach()
string(REPLACE "|" ";" FILES "${FILES}")
list(REMOVE_ITEM FILES "")
set(forbidden "libsieve_runtime" "libsieve_cli")
set(bad "")
foreach(file IN LISTS FILES)
  execute_process(COMMAND ${READELF} --dynamic --wide ${file}
                  OUTPUT_VARIABLE dyn ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${file}: readelf failed (${rc}): ${err}")
  endif()
  string(REGEX MATCHALL "\\(NEEDED\\)[^\n]*\\[[^]\n]+\\]" needed "${dyn}")
  if(NOT needed)
    message(FATAL_ERROR "${file}: no DT_NEEDED entry read from readelf's output")
  endif()
  set(names "")
  foreach(entry IN LISTS needed)
    string(REGEX REPLACE ".*\\[([^]]+)\\]" "\\1" name "${entry}")
    list(APPEND names ${name})
    foreach(prefix IN LISTS forbidden)
      if(name MATCHES "^${prefix}[.]so")
        list(APPEND bad "${file} needs ${name}")
      endif()
    endforeach()
  endforeach()
  list(JOIN names ", " shown)
  message(STATUS "${file}: ${shown}")
endforeach()
if(bad)
  list(JOIN bad "\n  " lines)
  message(FATAL_ERROR "policy plugins must not link the runtime or the CLI:\n  ${lines}")
endif()
