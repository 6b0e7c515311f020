// A K/V page pool laid out as an engine keeps it (ABI 1.1 strided views), for tests: the same
// pages as a compact HND pool, copied bit for bit into NHD, HND with explicit strides, or one
// combined [num_pages, 2, ...] tensor (vLLM's FlashInfer backend; NHD or HND inside), with views
// shaped [page_capacity, n_kv_heads, page_size, head_dim] whose strides and byte_offset say where
// each row lives (api/sieve/kv_store.h).
//
// Every layout puts K and V in one buffer and gives V a non-zero byte_offset, so a reader that
// ignores byte_offset or the strides reads the wrong rows (or the NaN the source pool holds in
// spare pages and past each sequence's last token).
#pragma once
#include <cstdint>

#include "sieve/kv_store.h"
#include "sieve/util/page_layout.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::reference {

class LaidOutPool {
 public:
  // Copies host pages k, v (compact HND [page_capacity, n_kv_heads, page_size, head_dim], one
  // dtype) into `layout` (one of kKvLayouts). Throws std::invalid_argument for anything else.
  LaidOutPool(const DLTensor& k, const DLTensor& v, KvLayout layout);
  LaidOutPool(const LaidOutPool&) = delete;
  LaidOutPool& operator=(const LaidOutPool&) = delete;

  HostTensor storage;  // every K and V element, 1-dim; upload it for a device pool

  // The K / V views over `mem`: storage.dl(), or a device copy of it (its data and device).
  DLTensor k_view(const DLTensor& mem) const;
  DLTensor v_view(const DLTensor& mem) const;
  // Points kv.k_pages / kv.v_pages at the views over storage.
  void install(sieve_paged_kv& kv) const;

 private:
  DLTensor view(const DLTensor& mem, uint64_t byte_offset) const;
  DLDataType dtype_{};
  int64_t shape_[4] = {};
  int64_t strides_[4] = {};
  uint64_t v_byte_offset_ = 0;
};

}  // namespace sieve::reference
