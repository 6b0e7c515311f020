// The engine-pool store's bookkeeping (CPU and CUDA share it; a concrete store only says where
// Sieve's own bytes live and how tokens move). The engine owns the K/V pool and the page
// tables; per call it binds one layer's pool and CSR table (bind_pages) and the store:
//   - checks each page id new to a sequence against the pool, the layout against the store's
//     `layout` parameter, and that each sequence's table starts with the pages Sieve already
//     knows for it (an engine only appends pages to a request, and drops exactly the pages Sieve
//     evicted; when each held id is compared: below);
//   - on append, counts the new tokens (the table must then hold exactly the tokens Sieve has),
//     zeroes the sidecars of pages no sequence held before (a prefix page the engine shares
//     between requests keeps them), and writes the tokens into the last slots the table names
//     unless the engine already wrote them (new_tokens_written); pre-RoPE keys, when kept, always
//     go to Sieve's own pool, indexed by the engine's page ids;
//   - hands out the engine's pool as the view (strided for NHD and combined pools) with the
//     bound table, copying no K/V;
//   - on evict, sends the physical pages to the engine's release sink and forgets them.
// Host work per call is O(batch + new pages + held pages / kHeldWindows): the id checks look at
// pages new to a sequence, and the pages it holds are compared with the table's prefix in full
// only when its list is not settled (first bind, after an eviction, another pool size), else one
// window of them per bind (every held id again within kHeldWindows binds of an unchanged list),
// and in full before an eviction sends any to the engine; nothing is copied to or from a device.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "sieve/host_services.h"
#include "sieve/kv/page_zero.hpp"
#include "sieve/kv/store_checks.hpp"
#include "sieve/kv/token_scatter.hpp"
#include "sieve/kv_store.h"

namespace sieve::kv {

// The pool layout the store's `layout` parameter names.
struct EngineLayout {
  uint32_t bit = SIEVE_KV_LAYOUT_HND;  // one sieve_kv_layout_bits value
  int32_t combined_hnd = 0;            // COMBINED: 1 = HND inside each half
};
// From the schema-validated parameters of a kv_config (none: HND).
EngineLayout engine_layout(const sieve_kv_config& config);

class EnginePoolBase {
 public:
  // A settled sequence's held page ids are compared with the bound table a 1/kHeldWindows
  // window per bind (see bind_pages).
  static constexpr int64_t kHeldWindows = 8;

  EnginePoolBase(const sieve_host_services* services, const sieve_kv_config& config);
  virtual ~EnginePoolBase() = default;
  EnginePoolBase(const EnginePoolBase&) = delete;
  EnginePoolBase& operator=(const EnginePoolBase&) = delete;

  // The ABI operations (throwing sieve::Error on bad input; the C table catches).
  int32_t add_sequence();
  void remove_sequence(int32_t seq);
  int32_t seq_len(int32_t layer, int32_t seq) const;
  void bind_pages(const sieve_kv_pages& p);
  void append(const sieve_kv_append& a);
  void view(int32_t layer, const int32_t* seq_ids, int32_t batch, sieve_paged_kv* out);
  int32_t register_sidecar(const sieve_sidecar_desc& desc);
  void sidecar(int32_t layer, int32_t slot, DLTensor* out);
  uint64_t evict(int32_t layer, int32_t seq, const int32_t* logical_pages, int32_t n);
  uint64_t bytes_in_use() const;

  const std::string& last_error() const { return last_error_; }
  void set_last_error(std::string e) { last_error_ = std::move(e); }

 protected:
  const sieve_kv_config& config() const { return config_; }
  const sieve_geometry& geometry() const { return config_.geometry; }
  size_t page_bytes() const;  // one page of K (or V) in kv_dtype
  uint64_t counted_page_bytes() const;  // what bytes_in_use counts per page (see there)

  // Storage hooks of a concrete store.
  virtual DLDevice device() const = 0;
  // Writes inputs[i] (K, V, pre-RoPE K; null: skip) to targets[i] at `slots`.
  virtual void write_tokens(const std::vector<TokenSlot>& slots, const DLTensor* const inputs[3],
                            const PoolTarget targets[3]) = 0;
  virtual void allocate_sidecar(int32_t slot) = 0;  // every layer's [pages_per_layer, ...] tensor, zeroed
  virtual void clear_sidecar_pages(int32_t layer, const std::vector<int32_t>& pages) = 0;  // every slot
  virtual void sidecar_tensor(int32_t layer, int32_t slot, DLTensor* out) = 0;
  virtual void* pre_rope_pool(int32_t layer) = 0;  // compact HND [pages_per_layer, ...]; null if not kept
  // One layer's sidecar tensors (`bases`, slot order) as per-page targets to zero.
  std::vector<PageBytes> sidecar_pages(const std::vector<void*>& bases) const;

  const sieve_host_services* services_;
  std::vector<Sidecar> sidecars_;

 private:
  struct Sequence {
    bool live = false;
    std::vector<std::vector<int32_t>> pages;  // per layer: the engine's page ids Sieve knows, in order
    std::vector<int32_t> resident;            // per layer: tokens
    std::vector<char> settled;                // per layer: its last bind compared/checked every held page
    std::vector<int64_t> held_cursor;         // per layer: where the next bind's window of held pages starts
  };
  // What bind_pages borrowed for one layer, and the view it makes.
  struct Bound {
    bool valid = false;
    sieve_kv_pages pages{};
    const int32_t* indices_host = nullptr;
    std::vector<int32_t> seq_ids;
    int64_t num_pages = 0;
    std::array<int64_t, 4> shape{}, k_strides{}, v_strides{};
    bool compact = true;  // the view is compact HND: strides NULL (what a 1.0 consumer reads)
    uint64_t v_byte_offset = 0;
    void* v_data = nullptr;
    std::array<int64_t, 1> indptr_shape{}, indices_shape{}, last_shape{};
    std::array<int64_t, 4> pre_shape{};
  };
  void check_layer(int32_t layer) const;
  Sequence& sequence(int32_t seq);
  const Sequence& sequence(int32_t seq) const;
  void check_pool(const sieve_kv_pages& p, Bound& b) const;
  int32_t table_tokens(const Bound& b, int32_t i) const;  // tokens the table names for entry i
  const Bound& bound(int32_t layer, const char* op) const;

  sieve_kv_config config_;
  EngineLayout layout_;
  std::vector<Sequence> seqs_;
  std::vector<Bound> bound_;            // per layer
  std::vector<int64_t> pages_in_use_;   // per layer: pages Sieve's sequences name
  std::vector<std::vector<int32_t>> holders_;  // per layer, per page id: sequences naming it
  std::vector<uint32_t> seen_;          // bind's duplicate check: stamp per page id, grow-only
  std::vector<int64_t> checked_pool_;   // per layer: pool size the pages Sieve holds were checked against
  uint32_t stamp_ = 0;
  std::vector<TokenSlot> slots_;        // append's scratch, grow-only
  std::vector<int32_t> fresh_;          // append's scratch: pages new to a sequence
  std::string last_error_;
};

// The concrete stores (the CUDA one refuses in a build without CUDA).
EnginePoolBase* make_engine_pool_cpu(const sieve_host_services* services, const sieve_kv_config& config);
EnginePoolBase* make_engine_pool_cuda(const sieve_host_services* services, const sieve_kv_config& config);

}  // namespace sieve::kv
