// The C11 translation unit links into a C++ test: the ABI is usable from both languages.
#include <gtest/gtest.h>

#include "sieve/sieve.h"

extern "C" int sieve_abi_c_check(void);

TEST(Abi, CHeadersCompileAsC11AndNegotiate) { EXPECT_EQ(sieve_abi_c_check(), 0); }

TEST(Abi, StructsStartWithSizeAndVersion) {
  sieve_selection s{};
  s.hdr = SIEVE_HEADER_INIT(sieve_selection);
  EXPECT_EQ(s.hdr.struct_size, sizeof(sieve_selection));
  EXPECT_EQ(s.hdr.version, SIEVE_ABI_MINOR);
  EXPECT_TRUE((SIEVE_HAS_FIELD(&s, sieve_selection, capacity)));
  s.hdr.struct_size = offsetof(sieve_selection, indices);  // a producer from an older minor
  EXPECT_FALSE((SIEVE_HAS_FIELD(&s, sieve_selection, capacity)));
}
