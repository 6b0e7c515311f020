// HostSelection: a selection with host-owned CSR storage, poisoned so a test sees exactly which
// entries a policy wrote. Starts as the chain's initial state (kind ALL, no rows).
#pragma once
#include <sieve/sieve.h>
#include <sieve/util/tensor.hpp>

#include <vector>

namespace sieve::testing {

inline constexpr int32_t kSelectionPoison = -0x5eed;

class HostSelection {
 public:
  HostSelection(int64_t max_rows, int64_t capacity)
      : indptr_(size_t(max_rows + 1), kSelectionPoison),
        indices_(size_t(capacity), kSelectionPoison),
        shapes_{max_rows + 1, capacity} {
    sel_.hdr = SIEVE_HEADER_INIT(sieve_selection);
    sel_.kind = SIEVE_SEL_ALL;
    sel_.heads = SIEVE_SEL_PER_SEQUENCE;
    sel_.q_block = 1;
    sel_.k_block_pages = 1;
    sel_.n_rows = 0;
    sel_.indptr = sieve::make_view(indptr_.data(), sieve::kCpu, sieve::kI32, 1, &shapes_[0]);
    sel_.indices = sieve::make_view(indices_.data(), sieve::kCpu, sieve::kI32, 1, &shapes_[1]);
    sel_.capacity = capacity;
  }
  HostSelection(const HostSelection&) = delete;
  HostSelection& operator=(const HostSelection&) = delete;

  sieve_selection* get() { return &sel_; }
  const sieve_selection& sel() const { return sel_; }
  std::vector<int32_t>& indptr() { return indptr_; }
  std::vector<int32_t>& indices() { return indices_; }

  // The rows as lists (kind BLOCKS), read through indptr.
  std::vector<std::vector<int32_t>> rows() const {
    std::vector<std::vector<int32_t>> out(size_t(sel_.n_rows));
    for (int32_t r = 0; r < sel_.n_rows; ++r)
      out[size_t(r)].assign(indices_.begin() + indptr_[size_t(r)],
                            indices_.begin() + indptr_[size_t(r) + 1]);
    return out;
  }

 private:
  std::vector<int32_t> indptr_, indices_;
  std::vector<int64_t> shapes_;
  sieve_selection sel_{};
};

}  // namespace sieve::testing
