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
# sieve_tool). They need the model host and option parsing (sieve_cli, which links the runtime),
# which a policy must never link: a host that loads the plugin (a Python process under torch)
# would get a second set of the runtime's and CLI's dependencies with it. So the tools are built
# into their own module, lib/sieve/tools/libsieve_<name>_tools.so (outside the plugin directories,
# so discovery never takes it for a plugin), each exported with SIEVE_EXPORT_TOOL; the policy lists
# them with sp::module_tool<SIEVE_TOOL_MODULE, "symbol">, which loads that module when the tool
# runs. The module links what the plugin links plus sieve_cli and LIBS; building the plugin builds
# it. Without Boost.program_options there is no sieve_cli: the plugin is built without its tools.
set(SIEVE_TOOL_OUTPUT_DIR ${PROJECT_BINARY_DIR}/lib/sieve/tools)
set(SIEVE_TOOL_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/sieve/tools)
function(sieve_plugin_tools)
  cmake_parse_arguments(T "" "NAME" "SOURCES;LIBS" ${ARGN})
  if(NOT TARGET sieve_cli)
    return()
  endif()
  set(plugin sieve_plugin_${T_NAME})
  set(target sieve_tools_${T_NAME})
  add_library(${target} MODULE ${T_SOURCES})
  set_target_properties(${target} PROPERTIES
    OUTPUT_NAME sieve_${T_NAME}_tools PREFIX "lib" LIBRARY_OUTPUT_DIRECTORY ${SIEVE_TOOL_OUTPUT_DIR}
    CXX_VISIBILITY_PRESET hidden CUDA_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON
    INSTALL_RPATH "$ORIGIN/../..")
  target_include_directories(${target} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  target_compile_definitions(${target} PRIVATE $<TARGET_PROPERTY:${plugin},COMPILE_DEFINITIONS>)
  target_link_libraries(${target} PRIVATE $<TARGET_PROPERTY:${plugin},LINK_LIBRARIES> sieve_cli ${T_LIBS})
  target_link_options(${target} PRIVATE "LINKER:--no-undefined")
  install(TARGETS ${target} LIBRARY DESTINATION ${SIEVE_TOOL_INSTALL_DIR})
  file(RELATIVE_PATH module ${SIEVE_PLUGIN_OUTPUT_DIR} ${SIEVE_TOOL_OUTPUT_DIR}/libsieve_${T_NAME}_tools.so)
  target_compile_definitions(${plugin} PRIVATE SIEVE_PLUGIN_TOOLS=1 SIEVE_TOOL_MODULE="${module}")
  add_dependencies(${plugin} ${target})
  set_property(GLOBAL APPEND PROPERTY SIEVE_TOOL_TARGETS ${target})
endfunction()
