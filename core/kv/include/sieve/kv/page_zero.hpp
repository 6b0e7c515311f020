// Zeroing a list of pages of per-page tensors (sidecars): what a store does when pages enter a
// sequence while no sequence held them. The engine-pool store's pages come in the engine's
// shuffled order, so they are zeroed page by page from one id list (on CUDA in one kernel launch
// per list, page_zeroer.cuh), never as ranges of consecutive ids.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace sieve::kv {

// One per-page tensor: page p is bytes [p * bytes_per_page, (p + 1) * bytes_per_page) of base.
struct PageBytes {
  void* base = nullptr;
  size_t bytes_per_page = 0;
};

// Host memory: every listed page of every target reads zero afterwards; nothing else changes.
void zero_pages_cpu(const std::vector<PageBytes>& targets, const std::vector<int32_t>& pages);

}  // namespace sieve::kv
