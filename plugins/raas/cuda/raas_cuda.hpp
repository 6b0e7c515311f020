// The CUDA half of raas: from the Quest bounds (core/selection's launch_page_bounds, layout
// [n_q_heads, nnz pages]) to one "stamped this step" byte per resident page, and the pinned host
// mirror those bytes travel to so end_step can apply them without a round trip per layer.
//   alpha mode:     kernel 1, a block per (q head, sequence): max and Σ exp of the head's scaled
//                   bounds over the sequence's pages (the softmax denominator, in double as the
//                   CPU); kernel 2, a thread per page: stamped if exp(x - max) / Σ > alpha for any
//                   q head. The same float operations as the CPU (rounded, never fused), the
//                   same double exp and compare.
//   top_ratio mode: core/selection's batched top-k (one launch per sequence: k depends on its
//                   page count) writes each head's top pages; a block per head marks them.
// Plain types only, so raas.cpp needs no CUDA headers. Everything is enqueued on the given stream;
// nothing allocates or synchronises except StampMirror's constructor/destructor and wait().
#pragma once
#include <cstddef>
#include <cstdint>

namespace sieve::raas {

struct AlphaFlagsLaunch {
  const float* scores;        // device [n_q_heads, nnz]: head h, page j at h * nnz + j
  int64_t nnz;                // resident pages of the call (head stride)
  const int32_t* kv_indptr;   // device [batch + 1] page table of the view
  int32_t batch, n_q_heads;
  int32_t max_pages;          // max pages of a sequence (host mirror): grid size
  float scale;                // 1 / sqrt(head_dim)
  double alpha;
  float* head_max;            // device scratch [batch * n_q_heads]
  double* head_sum;           // device scratch [batch * n_q_heads]
  uint8_t* flags;             // device [nnz]: 1 = stamped this step
  void* stream;
};
const char* launch_alpha_flags(const AlphaFlagsLaunch& a) noexcept;

// flags[seg_begin[0] + indices[r][i]] = 1 for every entry of the n_rows CSR rows (zero the
// flags first). seg_begin: device pointer to the sequence's first page in the view.
struct MarkRowsLaunch {
  const int32_t* row_indptr;  // device [n_rows + 1]
  const int32_t* row_indices; // device
  int32_t n_rows;
  const int32_t* seg_begin;   // device, one int32
  uint8_t* flags;
  void* stream;
};
const char* launch_mark_rows(const MarkRowsLaunch& a) noexcept;

// Zero `bytes` device bytes on the stream.
const char* zero_async(void* device_ptr, size_t bytes, void* stream) noexcept;

// Host memory (from the host's allocator) registered with CUDA as pinned so copies to and from
// it are asynchronous, plus one event recorded after each device-to-host copy. The host reads the
// memory only after wait(), and rewrites a range it uploaded only after a wait() that followed
// the upload on the stream.
class StampMirror {
 public:
  StampMirror() = default;
  // Registers [host, host + bytes) and creates the event; throws nothing, check error().
  StampMirror(void* host, size_t bytes);
  ~StampMirror();
  StampMirror(StampMirror&& o) noexcept;
  StampMirror& operator=(StampMirror&& o) noexcept;
  StampMirror(const StampMirror&) = delete;
  StampMirror& operator=(const StampMirror&) = delete;

  const char* error() const noexcept { return error_; }  // NULL when usable
  // Enqueue a copy of `bytes` device bytes to host + offset, then record the event.
  const char* copy_async(size_t offset, const void* device_src, size_t bytes, void* stream) noexcept;
  // Enqueue a copy of `bytes` bytes at host + offset to device_dst (no event).
  const char* upload_async(size_t offset, void* device_dst, size_t bytes, void* stream) noexcept;
  // Wait on the host for the last recorded event (every copy enqueued so far).
  const char* wait() noexcept;

 private:
  void release() noexcept;
  void* host_ = nullptr;
  void* event_ = nullptr;  // cudaEvent_t
  const char* error_ = "not created";
};

}  // namespace sieve::raas
