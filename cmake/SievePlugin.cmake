# sieve_add_plugin(NAME name SOURCES ... [CUDA_SOURCES ...] [OUTPUT_DIR dir] [NO_INSTALL])
# A plugin is a shared module that exports exactly one entry point (plus the optional score
# function): a linker version script hides every other symbol. It links the ABI headers and the
# small plugin-support library, never the runtime.
set(SIEVE_PLUGIN_VERSION_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/plugin.map)
function(sieve_add_plugin)
  cmake_parse_arguments(P "NO_INSTALL" "NAME;OUTPUT_DIR" "SOURCES;CUDA_SOURCES" ${ARGN})
  set(target sieve_plugin_${P_NAME})
  set(srcs ${P_SOURCES})
  if(SIEVE_WITH_CUDA)
    list(APPEND srcs ${P_CUDA_SOURCES})
  endif()
  add_library(${target} MODULE ${srcs})
  set_target_properties(${target} PROPERTIES
    OUTPUT_NAME sieve_${P_NAME} PREFIX "lib"
    CXX_VISIBILITY_PRESET hidden CUDA_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
  if(NOT P_OUTPUT_DIR)
    set(P_OUTPUT_DIR ${SIEVE_PLUGIN_OUTPUT_DIR})
  endif()
  set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${P_OUTPUT_DIR})
  target_link_libraries(${target} PRIVATE sieve_plugin_support)
  target_link_options(${target} PRIVATE "LINKER:--version-script=${SIEVE_PLUGIN_VERSION_SCRIPT}"
                                        "LINKER:--no-undefined")
  if(SIEVE_WITH_CUDA)
    target_compile_definitions(${target} PRIVATE SIEVE_WITH_CUDA=1)
    if(P_CUDA_SOURCES)
      target_link_libraries(${target} PRIVATE CUDA::cudart)
    endif()
  endif()
  if(NOT P_NO_INSTALL)
    install(TARGETS ${target} LIBRARY DESTINATION ${SIEVE_PLUGIN_INSTALL_DIR})
    # Every installed plugin is conformance-tested (tests/conformance reads this list).
    set_property(GLOBAL APPEND PROPERTY SIEVE_PLUGIN_TARGETS ${target})
  endif()
endfunction()

# sieve_plugin_tools(NAME name SOURCES ... [LIBS ...]): the plugin's command-line tools (ABI 1.1
# sieve_tool; the policy class lists them in kTools under #ifdef SIEVE_PLUGIN_TOOLS). They link
# sieve_cli (the model host, option parsing), found beside the plugin directory once installed.
# Without Boost.program_options there is no sieve_cli: the plugin is built without its tools.
function(sieve_plugin_tools)
  cmake_parse_arguments(T "" "NAME" "SOURCES;LIBS" ${ARGN})
  if(NOT TARGET sieve_cli)
    return()
  endif()
  set(target sieve_plugin_${T_NAME})
  target_sources(${target} PRIVATE ${T_SOURCES})
  target_compile_definitions(${target} PRIVATE SIEVE_PLUGIN_TOOLS=1)
  target_link_libraries(${target} PRIVATE sieve_cli ${T_LIBS})
  set_target_properties(${target} PROPERTIES INSTALL_RPATH "$ORIGIN/../..")
endfunction()
