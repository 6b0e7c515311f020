# ctest conform.plugin_dir: at test time, every libsieve_*.so in the plugin directory (DIR) must
# be one of the plugins that have a conform.<name> test (NAMES, comma-separated): a plugin that
# lands there any other way would otherwise ship unconformed. Fails when the directory holds none.
cmake_minimum_required(VERSION 3.20)  # IN_LIST in script mode
string(REPLACE "," ";" NAMES "${NAMES}")
file(GLOB _found RELATIVE ${DIR} ${DIR}/libsieve_*.so)
if(NOT _found)
  message(FATAL_ERROR "no libsieve_*.so in ${DIR}: nothing was conformed")
endif()
foreach(_f IN LISTS _found)
  string(REGEX REPLACE "^libsieve_(.*)\\.so$" "\\1" _name "${_f}")
  if(NOT _name IN_LIST NAMES)
    message(FATAL_ERROR "${DIR}/${_f} has no conform.${_name} test (plugins are added with sieve_add_plugin)")
  endif()
endforeach()
list(LENGTH _found _n)
message(STATUS "${_n} plugins in ${DIR}, each conformed by its conform.<name> test")
