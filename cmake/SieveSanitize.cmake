# SIEVE_SANITIZE=ON: AddressSanitizer + UndefinedBehaviorSanitizer over every target (the runtime,
# the plugins, the CLI, the tests, the fuzz targets), each report fatal (-fno-sanitize-recover), so
# a finding fails the test that triggered it. CPU only: nvcc does not take these flags, so the
# CUDA code is not built (SIEVE_WITH_CUDA defaults to OFF here, see the top-level CMakeLists).
# CI configures it as build-asan (the README's second command). A test that cannot run under it is
# DISABLED next to its add_test, with the reason (ctest lists it as "Not Run (Disabled)").
if(SIEVE_WITH_CUDA)
  message(FATAL_ERROR "SIEVE_SANITIZE is CPU only: configure it with -DSIEVE_WITH_CUDA=OFF")
endif()
set(_sieve_sanitize_flags -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${_sieve_sanitize_flags}>")
add_link_options(-fsanitize=address,undefined)

# The sanitizers' run-time options for every test of this tree: ctest includes this file before
# it runs any, and the tests inherit its environment.
#  - handle_segv/sigbus/sigfpe=0: conformance crashes fixture plugins on purpose in forked children
#    and names the signal that ended them (and the mutation driver saves the input that crashed);
#    ASan's own handler would turn the signal into "exit status 1". Memory errors are still caught
#    where they happen, before any signal; a stray SIGSEGV still fails its test.
#  - print_stacktrace=1: where a UBSan report comes from.
set(_sieve_sanitize_env ${PROJECT_BINARY_DIR}/sieve_sanitize_env.cmake)
file(WRITE ${_sieve_sanitize_env}
  "set(ENV{ASAN_OPTIONS} \"handle_segv=0:handle_sigbus=0:handle_sigfpe=0\")\n"
  "set(ENV{UBSAN_OPTIONS} \"print_stacktrace=1\")\n")
set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY TEST_INCLUDE_FILES ${_sieve_sanitize_env})
