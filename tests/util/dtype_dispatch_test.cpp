// sieve/util/dtype_dispatch.hpp: each storage dtype reaches its own template type, anything else
// is refused with the one message before any template runs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <type_traits>

#include "sieve/util/dtype_dispatch.hpp"

namespace {

using ::testing::HasSubstr;
using sieve::Storage;

// Distinct element types per dtype (on the host f16 and bf16 are both uint16_t bit patterns).
struct F32 { static constexpr const char* name = "f32"; };
struct F16 { static constexpr const char* name = "f16"; };
struct BF16 { static constexpr const char* name = "bf16"; };
using Tags = sieve::StorageTypes<F32, F16, BF16>;

std::string dispatched_name(Storage s) {
  return sieve::dispatch_storage<Tags>(s, [](auto t) { return std::string(decltype(t)::type::name); });
}

TEST(DtypeDispatch, EachStorageDtypeReachesItsType) {
  struct Case { DLDataType dtype; Storage storage; const char* name; int bytes; uint32_t bit; };
  for (const Case& c : {Case{sieve::kF32, Storage::f32, "f32", 4, SIEVE_DTYPE_F32},
                        Case{sieve::kF16, Storage::f16, "f16", 2, SIEVE_DTYPE_F16},
                        Case{sieve::kBF16, Storage::bf16, "bf16", 2, SIEVE_DTYPE_BF16}}) {
    SCOPED_TRACE(c.name);
    ASSERT_EQ(sieve::storage_of(c.dtype), c.storage);
    EXPECT_EQ(sieve::require_storage(c.dtype, "q"), c.storage);
    EXPECT_EQ(dispatched_name(c.storage), c.name);
    EXPECT_STREQ(sieve::storage_name(c.storage), c.name);
    EXPECT_EQ(sieve::storage_bytes(c.storage), c.bytes);
    EXPECT_EQ(size_t(sieve::storage_bytes(c.storage)), sieve::dtype_bytes(c.dtype));
    EXPECT_EQ(sieve::dtype_bit(c.storage), c.bit);
    EXPECT_EQ(sieve::dtype_bit(c.dtype), c.bit);
    int calls = 0;
    const std::string via_dtype = sieve::dispatch_storage<Tags>(c.dtype, "q", [&](auto t) {
      ++calls;
      return std::string(decltype(t)::type::name);
    });
    EXPECT_EQ(via_dtype, c.name);
    EXPECT_EQ(calls, 1);
  }
}

TEST(DtypeDispatch, ReturnsWhatTheCallableReturnsOrNothing) {
  // A launcher returns a status; a kernel enqueue returns nothing.
  const int bits = sieve::dispatch_storage<sieve::StorageTypes<float, double, long double>>(
      Storage::f16, [](auto t) { return int(sizeof(typename decltype(t)::type)) * 8; });
  EXPECT_EQ(bits, int(sizeof(double)) * 8);
  std::string ran;
  sieve::dispatch_storage<Tags>(Storage::bf16, [&](auto t) { ran += decltype(t)::type::name; });
  EXPECT_EQ(ran, "bf16");
}

TEST(DtypeDispatch, OtherDtypesGetOneErrorAndNoDispatch) {
  for (DLDataType t : {sieve::kI32, DLDataType{kDLFloat, 64, 1}, DLDataType{kDLFloat, 32, 2},
                       DLDataType{kDLBfloat, 32, 1}, DLDataType{kDLUInt, 16, 1}}) {
    SCOPED_TRACE(sieve::dtype_name(t));
    EXPECT_FALSE(sieve::storage_of(t).has_value());
    EXPECT_EQ(sieve::dtype_bit(t), 0u);
    int calls = 0;
    try {
      sieve::dispatch_storage<Tags>(t, "kv.k_pages", [&](auto) { ++calls; });
      ADD_FAILURE() << "no error";
    } catch (const sieve::Error& e) {
      EXPECT_EQ(e.status(), SIEVE_ERR_INVALID_ARGUMENT);
      EXPECT_EQ(std::string(e.what()), sieve::unsupported_dtype_message("kv.k_pages", t));
      EXPECT_EQ(std::string(e.what()), "kv.k_pages has dtype " + sieve::dtype_name(t) + "; f32, f16 or bf16 expected");
    }
    EXPECT_EQ(calls, 0);
  }
  // The exact text for the common case, as the plugins and the CLI print it.
  EXPECT_EQ(sieve::unsupported_dtype_message("q", sieve::kI32), "q has dtype int32; f32, f16 or bf16 expected");
}

TEST(DtypeDispatch, AStorageCastFromABadIntegerIsRefused) {
  int calls = 0;
  try {
    sieve::dispatch_storage<Tags>(static_cast<Storage>(7), [&](auto) { ++calls; });
    ADD_FAILURE() << "no error";
  } catch (const sieve::Error& e) {
    EXPECT_EQ(e.status(), SIEVE_ERR_INVALID_ARGUMENT);
    EXPECT_THAT(e.what(), HasSubstr("7 is not a storage dtype"));
  }
  EXPECT_EQ(calls, 0);
}

}  // namespace
