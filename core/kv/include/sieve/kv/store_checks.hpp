// The argument checks every store of the core makes (the paged stores and the engine-pool
// store): one place, so both refuse the same input with the same line.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "sieve/kv_store.h"

namespace sieve::kv {

struct Sidecar {
  std::string name;
  DLDataType dtype;
  int32_t elems_per_head;
  size_t bytes_per_page;  // n_kv_heads * elems_per_head * dtype bytes
};

// What is wrong with a store config's geometry and pool size, or "".
std::string config_problem(const sieve_kv_config& c);

// Throws on a bad append: header, layer, batch, token_indptr, k/v/k_pre_rope shapes, dtypes,
// device, unit stride along head_dim, k_pre_rope present when the store keeps pre-RoPE keys,
// a sequence listed twice. Sequence ids are the caller's to check.
void check_append(const sieve_kv_append& a, const sieve_kv_config& config, DLDevice device);

// The sidecar a descriptor describes, after checking it against those already registered.
Sidecar checked_sidecar(const sieve_sidecar_desc& d, const std::vector<Sidecar>& registered, int32_t n_kv_heads);
size_t sidecar_bytes_per_page(const std::vector<Sidecar>& registered);

// register_sidecar of every core store: checks `d`, appends it, lets `allocate(slot)` make its
// storage and takes it back out if that throws. Returns the slot.
template <class Allocate>
int32_t add_sidecar(std::vector<Sidecar>& registered, const sieve_sidecar_desc& d, int32_t n_kv_heads,
                    Allocate&& allocate) {
  registered.push_back(checked_sidecar(d, registered, n_kv_heads));
  const int32_t slot = int32_t(registered.size() - 1);
  try {
    allocate(slot);
  } catch (...) {
    registered.pop_back();
    throw;
  }
  return slot;
}

// Marks the logical pages an evict names (of a sequence of `n_pages` pages), refusing an
// out-of-range page, the last page and a page listed twice.
std::vector<char> evict_marks(int32_t layer, int32_t seq, int32_t n_pages, const int32_t* logical, int32_t n);

}  // namespace sieve::kv
