# The installed SDK: headers (api/CMakeLists.txt), libsieve_runtime.so (core/runtime), the CLIs
# (hosts/), every plugin under ${SIEVE_PLUGIN_INSTALL_DIR} (sieve_add_plugin), and here the CMake
# package (find_package(Sieve): Sieve::api, Sieve::plugin_support, Sieve::runtime,
# sieve_plugin_properties) and the
# pkg-config files (sieve: the plugin ABI headers; sieve-runtime: the C host API + library).
# The runtime finds the plugin directory relative to itself (discovery.hpp), so any prefix works:
#   cmake --install build --prefix /opt/sieve
include(CMakePackageConfigHelpers)
set(SIEVE_CMAKE_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/Sieve)
set(SIEVE_PLUGIN_SUPPORT_FILE
    ${CMAKE_STATIC_LIBRARY_PREFIX}sieve_plugin_support${CMAKE_STATIC_LIBRARY_SUFFIX})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/SieveConfig.cmake.in
  ${PROJECT_BINARY_DIR}/SieveConfig.cmake
  INSTALL_DESTINATION ${SIEVE_CMAKE_INSTALL_DIR}
  PATH_VARS CMAKE_INSTALL_INCLUDEDIR CMAKE_INSTALL_LIBDIR CMAKE_INSTALL_BINDIR SIEVE_PLUGIN_INSTALL_DIR)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/SieveConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/SieveConfig.cmake ${PROJECT_BINARY_DIR}/SieveConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/plugin.map
        DESTINATION ${SIEVE_CMAKE_INSTALL_DIR})

# Relocatable: the prefix is found from the .pc file's own place (pkg-config's ${pcfiledir}).
file(RELATIVE_PATH SIEVE_PC_PREFIX_REL "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
foreach(_pc sieve sieve-runtime)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/${_pc}.pc.in ${PROJECT_BINARY_DIR}/${_pc}.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/${_pc}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endforeach()

# The guides and the out-of-tree example travel with the SDK.
install(FILES ${PROJECT_SOURCE_DIR}/docs/plugin-authoring.md ${PROJECT_SOURCE_DIR}/docs/conformance.md
              ${PROJECT_SOURCE_DIR}/docs/host-api.md
              ${PROJECT_SOURCE_DIR}/docs/abi.md ${PROJECT_SOURCE_DIR}/docs/chains.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR} OPTIONAL)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/examples DESTINATION ${CMAKE_INSTALL_DOCDIR} OPTIONAL)
