# Every dependency comes from Debian packages (README: the setup command installs them).
find_package(Threads REQUIRED)

# DLPack: header-only (libdlpack-dev). DLPACK_INCLUDE_DIR may point elsewhere (e.g. a carried copy).
find_path(DLPACK_INCLUDE_DIR dlpack/dlpack.h)
if(NOT DLPACK_INCLUDE_DIR)
  message(FATAL_ERROR "dlpack/dlpack.h not found: apt-get install libdlpack-dev (or -DDLPACK_INCLUDE_DIR=...)")
endif()

# Boost.DLL is header-only; it needs Boost.Filesystem's library on Boost < 1.76 unless told to use
# std::filesystem, which we do (C++20).
find_package(Boost 1.74 REQUIRED)
find_package(Boost 1.74 QUIET COMPONENTS program_options)
if(NOT Boost_PROGRAM_OPTIONS_FOUND)
  message(WARNING "Boost.program_options not found: the sieve CLI will not be built "
                  "(apt-get install libboost-program-options-dev)")
endif()

find_package(spdlog REQUIRED)
find_package(nlohmann_json 3 REQUIRED)

# OpenBLAS (libopenblas-dev): CBLAS interface.
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
find_path(CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas x86_64-linux-gnu/openblas-pthread x86_64-linux-gnu)
if(NOT CBLAS_INCLUDE_DIR)
  message(FATAL_ERROR "cblas.h not found: apt-get install libopenblas-dev")
endif()
add_library(sieve_blas INTERFACE)
target_include_directories(sieve_blas INTERFACE ${CBLAS_INCLUDE_DIR})
target_link_libraries(sieve_blas INTERFACE ${BLAS_LIBRARIES})

if(SIEVE_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(SIEVE_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()
