// What the CPU and CUDA paged stores share: the page bookkeeping (free lists, per-layer page
// lists of every sequence, sidecar registry, byte accounting), argument checking, and the
// translation to the C table. A concrete store only says where bytes live and how they move.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "sieve/host_services.h"
#include "sieve/kv/store_checks.hpp"
#include "sieve/kv/token_scatter.hpp"
#include "sieve/kv/view_delta.hpp"
#include "sieve/kv_store.h"

namespace sieve::kv {


class PagedStoreBase {
 public:
  PagedStoreBase(const sieve_host_services* services, const sieve_kv_config& config);
  virtual ~PagedStoreBase() = default;
  PagedStoreBase(const PagedStoreBase&) = delete;
  PagedStoreBase& operator=(const PagedStoreBase&) = delete;

  // The ABI operations (throwing sieve::kv::Error on bad input; the C table catches).
  int32_t add_sequence();
  void remove_sequence(int32_t seq);
  int32_t seq_len(int32_t layer, int32_t seq) const;
  void append(const sieve_kv_append& a);
  void view(int32_t layer, const int32_t* seq_ids, int32_t batch, sieve_paged_kv* out);
  int32_t register_sidecar(const sieve_sidecar_desc& desc);
  void sidecar(int32_t layer, int32_t slot, DLTensor* out);
  uint64_t evict(int32_t layer, int32_t seq, const int32_t* logical_pages, int32_t n);
  uint64_t bytes_in_use() const;

  const std::string& last_error() const { return last_error_; }
  void set_last_error(std::string e) { last_error_ = std::move(e); }

  // Geometry helpers.
  const sieve_kv_config& config() const { return config_; }
  const sieve_geometry& geometry() const { return config_.geometry; }
  size_t elem_bytes() const;
  size_t page_elems() const;       // n_kv_heads * page_size * head_dim
  size_t kv_page_bytes() const;    // K + V (+ pre-RoPE K) bytes of one page

 protected:
  // Storage hooks of a concrete store.
  virtual void allocate_pools() = 0;  // called once from the concrete constructor
  // `view_last` (null, or [a.batch]): the layer's last view lists exactly the append's sequences
  // in its order and no page is added, so this is that view's last_page_len after the append. A
  // store that publishes it into the view's table along with the tokens returns true (the next
  // view of the layer is then unchanged); false leaves it to the next view.
  virtual bool write_tokens(int32_t layer, const std::vector<TokenSlot>& slots, const sieve_kv_append& a,
                            const int32_t* view_last) = 0;
  virtual void allocate_sidecar(int32_t slot) = 0;  // storage for every layer of sidecar `slot`
  virtual void clear_sidecar_page(int32_t layer, int32_t slot, int32_t page) = 0;
  virtual void release_pages(int32_t layer, const std::vector<int32_t>& pages) = 0;
  // Brings the layer's page table to `delta` (see view_delta.hpp) and fills out's tensors and
  // host mirrors (the mirrors may point into delta.packed, which lives until the next view of
  // the layer). A throw makes the next view of the layer a full rebuild.
  virtual void publish_view(int32_t layer, const ViewDelta& delta, sieve_paged_kv* out) = 0;
  virtual void sidecar_tensor(int32_t layer, int32_t slot, DLTensor* out) = 0;
  virtual DLDevice device() const = 0;

  const sieve_host_services* services_;
  sieve_kv_config config_;
  std::vector<Sidecar> sidecars_;

 private:
  struct Sequence {
    bool live = false;
    std::vector<std::vector<int32_t>> pages;  // per layer: physical page ids in token order
    std::vector<int32_t> last_len;            // per layer: tokens in the last page
    std::vector<int32_t> resident;            // per layer: resident tokens
    // Per layer: changes whenever pages leave the list (evict), and differs between two
    // sequences that held the same id (add_sequence); appends leave it alone.
    std::vector<uint64_t> version;
  };
  // What the last view of a layer published, to describe the next one against it.
  struct PublishedView {
    bool valid = false;             // false: the next view is a full rebuild
    std::vector<int32_t> seq_ids;   // batch order
    std::vector<uint64_t> versions; // Sequence::version of each, at that view
    std::vector<int32_t> packed;    // ViewDelta's array of that view (indptr, last_page_len, ...)
    std::vector<int32_t> next;      // scratch for the next packed array (swapped in)
  };
  int32_t take_page(int32_t layer);
  void check_layer(int32_t layer) const;
  Sequence& sequence(int32_t seq);
  const Sequence& sequence(int32_t seq) const;

  std::vector<Sequence> seqs_;
  std::vector<std::vector<int32_t>> free_pages_;  // per layer: freed pages, used as a stack
  std::vector<int32_t> never_used_;               // per layer: pages [never_used_, pages_per_layer) not yet used
  std::vector<int64_t> pages_in_use_;             // per layer
  std::vector<PublishedView> views_;              // per layer
  std::vector<TokenSlot> slots_;                  // append's scratch, grow-only
  std::vector<int32_t> view_last_;                // append's scratch, grow-only
  uint64_t next_version_ = 0;
  std::string last_error_;
};

// Builds the C table for a store type `S` whose constructor is S(services, config).
template <class S>
const sieve_kv_store_api* make_store_api(const char* name);

}  // namespace sieve::kv
