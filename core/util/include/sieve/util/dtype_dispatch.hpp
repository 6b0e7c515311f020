// The element dtypes of float storage (f32, f16, bf16) and the one place a runtime dtype becomes a
// template type. As in FlashInfer's csrc/pytorch_extension_utils.h: convert a DLDataType once at
// the boundary (require_storage: one error for anything else), carry the Storage value in launch
// structs, and let dispatch_storage pick the template below. Plain C++ (no CUDA headers), so it
// serves .cpp files and the host code of .cu files alike; storage_cuda.cuh adds the CUDA types.
#pragma once
#include <dlpack/dlpack.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "sieve/abi.h"
#include "sieve/util/error.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve {

// The values are the ABI's dtype bit positions (SIEVE_DTYPE_F32 = 1 << 0, ...), see dtype_bit.
enum class Storage : int32_t { f32 = 0, f16 = 1, bf16 = 2 };

inline std::optional<Storage> storage_of(DLDataType t) noexcept {
  if (same_dtype(t, kF32)) return Storage::f32;
  if (same_dtype(t, kF16)) return Storage::f16;
  if (same_dtype(t, kBF16)) return Storage::bf16;
  return std::nullopt;
}

// The one message for a dtype outside f32 / f16 / bf16: "<what> has dtype int32; f32, f16 or
// bf16 expected".
inline std::string unsupported_dtype_message(std::string_view what, DLDataType t) {
  return std::string(what) + " has dtype " + dtype_name(t) + "; f32, f16 or bf16 expected";
}

// storage_of, or sieve::Error(SIEVE_ERR_INVALID_ARGUMENT, unsupported_dtype_message(what, t)).
inline Storage require_storage(DLDataType t, std::string_view what) {
  if (auto s = storage_of(t)) return *s;
  throw Error(SIEVE_ERR_INVALID_ARGUMENT, unsupported_dtype_message(what, t));
}

constexpr int storage_bytes(Storage s) { return s == Storage::f32 ? 4 : 2; }
constexpr const char* storage_name(Storage s) {
  return s == Storage::f32 ? "f32" : s == Storage::f16 ? "f16" : "bf16";
}
// The descriptor's capability bit (sieve_descriptor::dtypes) of a storage dtype.
constexpr uint32_t dtype_bit(Storage s) { return 1u << uint32_t(s); }
static_assert(dtype_bit(Storage::f32) == SIEVE_DTYPE_F32 && dtype_bit(Storage::f16) == SIEVE_DTYPE_F16 &&
              dtype_bit(Storage::bf16) == SIEVE_DTYPE_BF16);
// The capability bit of a DLDataType, 0 for one that is not a storage dtype.
inline uint32_t dtype_bit(DLDataType t) {
  const auto s = storage_of(t);
  return s ? dtype_bit(*s) : 0;
}

// The C++ element types a dispatch maps each Storage to (host code: distinct tag types or the bit
// patterns; CUDA: float, __half, __nv_bfloat16 in storage_cuda.cuh).
template <class F32, class F16, class BF16>
struct StorageTypes {
  using f32 = F32;
  using f16 = F16;
  using bf16 = BF16;
};
template <class T>
struct type_tag {
  using type = T;
};

// f(type_tag<T>{}) with T the element type of `s` in `Types`; returns what f returns. Every
// instantiation f makes happens here, once per dtype. A Storage only comes from storage_of /
// require_storage, so the throw after the switch is reached only through a cast from a bad integer.
template <class Types, class F>
decltype(auto) dispatch_storage(Storage s, F&& f) {
  switch (s) {
    case Storage::f32: return f(type_tag<typename Types::f32>{});
    case Storage::f16: return f(type_tag<typename Types::f16>{});
    case Storage::bf16: return f(type_tag<typename Types::bf16>{});
  }
  throw Error(SIEVE_ERR_INVALID_ARGUMENT,
              "dispatch_storage: " + std::to_string(int32_t(s)) + " is not a storage dtype (f32, f16 or bf16)");
}

// The boundary in one call: require_storage(t, what), then dispatch.
template <class Types, class F>
decltype(auto) dispatch_storage(DLDataType t, std::string_view what, F&& f) {
  return dispatch_storage<Types>(require_storage(t, what), std::forward<F>(f));
}

}  // namespace sieve
