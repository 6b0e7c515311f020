// Page bookkeeping shared by the CPU and CUDA paged stores.
#include "sieve/kv/paged_store_base.hpp"
#include "sieve/kv/paged_store.hpp"

#include "sieve/kv/store_checks.hpp"

#include <algorithm>
#include <climits>

#include "sieve/util/error.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::kv {


PagedStoreBase::PagedStoreBase(const sieve_host_services* services, const sieve_kv_config& config)
    : services_(services), config_(config) {
  std::string p = config_problem(config_);
  require(p.empty(), SIEVE_ERR_INVALID_ARGUMENT, "KV store config: " + p);
  const int L = config_.geometry.n_layers;
  // Pages never used are handed out lowest id first from a counter rather than listed up front:
  // the bookkeeping grows with the pages used, not with the pool's size.
  free_pages_.resize(L);
  never_used_.assign(L, 0);
  pages_in_use_.assign(L, 0);
  views_.resize(L);
}

size_t PagedStoreBase::elem_bytes() const { return dtype_bytes(config_.geometry.kv_dtype); }
size_t PagedStoreBase::page_elems() const {
  const auto& g = config_.geometry;
  return size_t(g.n_kv_heads) * g.page_size * g.head_dim;
}
size_t PagedStoreBase::kv_page_bytes() const {
  return page_elems() * elem_bytes() * (config_.keep_pre_rope_k ? 3 : 2);
}

// The checks on every step's path build their message only when they fail.
void PagedStoreBase::check_layer(int32_t layer) const {
  if (layer < 0 || layer >= config_.geometry.n_layers)
    fail(SIEVE_ERR_NOT_FOUND, "layer " + std::to_string(layer) + " out of range (store has " +
                                  std::to_string(config_.geometry.n_layers) + " layers)");
}

PagedStoreBase::Sequence& PagedStoreBase::sequence(int32_t seq) {
  if (seq < 0 || seq >= int32_t(seqs_.size()) || !seqs_[seq].live)
    fail(SIEVE_ERR_NOT_FOUND, "unknown sequence id " + std::to_string(seq));
  return seqs_[seq];
}
const PagedStoreBase::Sequence& PagedStoreBase::sequence(int32_t seq) const {
  return const_cast<PagedStoreBase*>(this)->sequence(seq);
}

int32_t PagedStoreBase::add_sequence() {
  auto it = std::find_if(seqs_.begin(), seqs_.end(), [](const Sequence& s) { return !s.live; });
  if (it == seqs_.end()) it = seqs_.insert(seqs_.end(), Sequence{});
  const int L = config_.geometry.n_layers;
  it->live = true;
  it->pages.assign(L, {});
  it->last_len.assign(L, 0);
  it->resident.assign(L, 0);
  it->version.assign(L, ++next_version_);
  return int32_t(it - seqs_.begin());
}

void PagedStoreBase::remove_sequence(int32_t seq) {
  Sequence& s = sequence(seq);
  for (int32_t l = 0; l < config_.geometry.n_layers; ++l) {
    release_pages(l, s.pages[l]);
    for (int32_t p : s.pages[l]) free_pages_[l].push_back(p);
    pages_in_use_[l] -= int64_t(s.pages[l].size());
  }
  s = Sequence{};
}

int32_t PagedStoreBase::seq_len(int32_t layer, int32_t seq) const {
  check_layer(layer);
  return sequence(seq).resident[layer];
}

int32_t PagedStoreBase::take_page(int32_t layer) {
  auto& fl = free_pages_[layer];
  require(!fl.empty() || never_used_[layer] < config_.pages_per_layer, SIEVE_ERR_CAPACITY,
          "layer " + std::to_string(layer) + ": page pool full (" +
              std::to_string(config_.pages_per_layer) + " pages of " +
              std::to_string(config_.geometry.page_size) + " tokens)");
  int32_t p = 0;
  if (fl.empty()) {
    p = never_used_[layer]++;
  } else {
    p = fl.back();
    fl.pop_back();
  }
  ++pages_in_use_[layer];
  for (int32_t slot = 0; slot < int32_t(sidecars_.size()); ++slot) clear_sidecar_page(layer, slot, p);
  return p;
}

void PagedStoreBase::append(const sieve_kv_append& a) {
  const auto& g = config_.geometry;
  check_append(a, config_, device());
  for (int32_t b = 0; b < a.batch; ++b) sequence(a.seq_ids[b]);
  int64_t new_pages = 0;
  for (int32_t b = 0; b < a.batch; ++b) {
    const Sequence& s = sequence(a.seq_ids[b]);
    int32_t room = s.pages[a.layer].empty() ? 0 : g.page_size - s.last_len[a.layer];
    int32_t n = a.token_indptr[b + 1] - a.token_indptr[b];
    if (n > room) new_pages += (n - room + g.page_size - 1) / g.page_size;
  }
  const int64_t free_pages = config_.pages_per_layer - pages_in_use_[a.layer];
  if (new_pages > free_pages)
    fail(SIEVE_ERR_CAPACITY, "layer " + std::to_string(a.layer) + ": page pool full: append needs " +
                                 std::to_string(new_pages) + " new pages, " + std::to_string(free_pages) +
                                 " free of " + std::to_string(config_.pages_per_layer));
  std::vector<TokenSlot>& slots = slots_;
  slots.clear();
  slots.reserve(size_t(a.batch ? a.token_indptr[a.batch] : 0));
  for (int32_t b = 0; b < a.batch; ++b) {
    Sequence& s = sequence(a.seq_ids[b]);
    auto& pages = s.pages[a.layer];
    int32_t& last = s.last_len[a.layer];
    for (int32_t r = a.token_indptr[b]; r < a.token_indptr[b + 1]; ++r) {
      if (pages.empty() || last == g.page_size) {
        pages.push_back(take_page(a.layer));
        last = 0;
      }
      slots.push_back({r, pages.back(), last});
      ++last;
      ++s.resident[a.layer];
    }
  }
  if (slots.empty()) return;
  // A decode step appends to exactly the sequences of the layer's last view, in its order, and
  // usually fills no new page: then the next view differs only in last_page_len, known now, and a
  // store may publish it with the tokens (one launch less per layer on a device); the next view
  // of the layer then finds nothing changed.
  const int32_t* view_last = nullptr;
  PublishedView& pv = views_[a.layer];
  if (new_pages == 0 && pv.valid && int32_t(pv.seq_ids.size()) == a.batch) {
    bool same = true;
    for (int32_t b = 0; b < a.batch && same; ++b)
      same = pv.seq_ids[b] == a.seq_ids[b] && pv.versions[b] == sequence(a.seq_ids[b]).version[a.layer];
    if (same) {
      view_last_.resize(size_t(a.batch));
      for (int32_t b = 0; b < a.batch; ++b) {
        const Sequence& s = sequence(a.seq_ids[b]);
        view_last_[b] = s.pages[a.layer].empty() ? 0 : s.last_len[a.layer];
      }
      view_last = view_last_.data();
    }
  }
  const bool published = write_tokens(a.layer, slots, a, view_last);
  if (view_last && published)
    std::copy(view_last_.begin(), view_last_.end(), pv.packed.begin() + ptrdiff_t(ViewDelta::last_at(a.batch)));
}

// The view is described against the previous view of the same layer (view_delta.hpp), so a
// decode step costs O(batch + pages added) on the host, not O(pages):
//   - same sequences in the same order, none evicted or replaced since (same versions): each
//     sequence's previous pages are still the first pages of its list, in the same order, since
//     appends only push pages at the end. Then: no page added and no last_page_len moved ->
//     kNone; only last_page_len moved -> kLastPageLen; else kPages with keep[b] = the previous
//     page count and the pages after it added;
//   - anything else (first view, another batch, an eviction, a sequence removed and its id
//     reused, a failed publish) -> kPages as a full rebuild (keep[b] = 0, every page added).
// The view's contract (kv_store.h: valid until the next append/evict/remove) holds as before:
// what a view points at is rewritten only after an append, evict or remove changed that layer
// (by that append, see above, or by the next view of the layer), or by a view of the layer for
// another batch, the same as when every view was rebuilt; on a device, every rewrite is
// stream-ordered after the work already enqueued.
void PagedStoreBase::view(int32_t layer, const int32_t* seq_ids, int32_t batch, sieve_paged_kv* out) {
  check_layer(layer);
  if (!out) fail(SIEVE_ERR_INVALID_ARGUMENT, "view: out is null");
  if (batch < 0 || (batch > 0 && !seq_ids))
    fail(SIEVE_ERR_INVALID_ARGUMENT, "view: seq_ids is null or batch negative");
  PublishedView& pv = views_[layer];
  const int32_t B = batch;
  bool same = pv.valid && int32_t(pv.seq_ids.size()) == B;
  bool grew = false, moved = false;
  int64_t nnz = 0, n_added = 0;
  for (int32_t b = 0; b < B; ++b) {  // every id checked before anything changes
    const Sequence& s = sequence(seq_ids[b]);
    const int32_t n = int32_t(s.pages[layer].size());
    nnz += n;
    if (same && (pv.seq_ids[b] != seq_ids[b] || pv.versions[b] != s.version[layer])) same = false;
    if (!same) continue;
    const int32_t had = pv.packed[b + 1] - pv.packed[b];
    const int32_t last = n ? s.last_len[layer] : 0;
    if (n < had) same = false;  // cannot happen without an eviction; rebuild rather than trust it
    grew |= n > had;
    n_added += n - had;
    moved |= last != pv.packed[ViewDelta::last_at(B) + b];
  }
  if (nnz > INT32_MAX) fail(SIEVE_ERR_CAPACITY, "view: more than 2^31 - 1 pages");
  ViewDelta d;
  d.batch = B;
  d.nnz = int32_t(nnz);
  pv.valid = false;  // until the publish below succeeds
  if (!same) {
    pv.seq_ids.assign(seq_ids, seq_ids + B);
    pv.versions.resize(size_t(B));
    for (int32_t b = 0; b < B; ++b) pv.versions[b] = sequence(seq_ids[b]).version[layer];
    n_added = nnz;
  }
  if (!same || grew) {
    d.change = ViewChange::kPages;
    std::vector<int32_t>& p = pv.next;
    p.resize(ViewDelta::packed_size(B, int32_t(n_added)));
    int32_t* indptr = p.data();
    int32_t* last = indptr + B + 1;
    int32_t* keep_from = last + B;
    int32_t* keep = keep_from + B;
    int32_t* added_indptr = keep + B;
    int32_t* added = added_indptr + B + 1;
    indptr[0] = 0;
    added_indptr[0] = 0;
    for (int32_t b = 0; b < B; ++b) {
      const Sequence& s = sequence(seq_ids[b]);
      const auto& pages = s.pages[layer];
      const int32_t n = int32_t(pages.size());
      keep_from[b] = same ? pv.packed[b] : 0;
      keep[b] = same ? pv.packed[b + 1] - pv.packed[b] : 0;
      indptr[b + 1] = indptr[b] + n;
      last[b] = n ? s.last_len[layer] : 0;
      std::copy(pages.begin() + keep[b], pages.end(), added + added_indptr[b]);
      added_indptr[b + 1] = added_indptr[b] + (n - keep[b]);
    }
    std::swap(pv.packed, pv.next);
    d.n_added = int32_t(n_added);
  } else if (moved) {
    d.change = ViewChange::kLastPageLen;
    int32_t* last = pv.packed.data() + ViewDelta::last_at(B);
    for (int32_t b = 0; b < B; ++b) {
      const Sequence& s = sequence(seq_ids[b]);
      last[b] = s.pages[layer].empty() ? 0 : s.last_len[layer];
    }
  }
  d.packed = pv.packed.data();
  *out = sieve_paged_kv{};
  out->hdr = {uint32_t(sizeof(sieve_paged_kv)), SIEVE_ABI_MINOR};
  out->batch = batch;
  out->page_size = config_.geometry.page_size;
  publish_view(layer, d, out);
  pv.valid = true;
}

int32_t PagedStoreBase::register_sidecar(const sieve_sidecar_desc& d) {
  return add_sidecar(sidecars_, d, config_.geometry.n_kv_heads, [this](int32_t slot) { allocate_sidecar(slot); });
}

void PagedStoreBase::sidecar(int32_t layer, int32_t slot, DLTensor* out) {
  check_layer(layer);
  require(slot >= 0 && slot < int32_t(sidecars_.size()), SIEVE_ERR_NOT_FOUND,
          "unknown sidecar slot " + std::to_string(slot));
  sidecar_tensor(layer, slot, out);
}

uint64_t PagedStoreBase::evict(int32_t layer, int32_t seq, const int32_t* logical, int32_t n) {
  check_layer(layer);
  Sequence& s = sequence(seq);
  auto& pages = s.pages[layer];
  const int32_t np = int32_t(pages.size());
  const std::vector<char> mark = evict_marks(layer, seq, np, logical, n);
  std::vector<int32_t> freed, kept;
  kept.reserve(pages.size());
  for (int32_t i = 0; i < np; ++i) (mark[i] ? freed : kept).push_back(pages[i]);
  release_pages(layer, freed);
  for (int32_t p : freed) free_pages_[layer].push_back(p);
  pages_in_use_[layer] -= int64_t(freed.size());
  pages = std::move(kept);
  if (!freed.empty()) s.version[layer] = ++next_version_;  // views of this layer rebuild
  s.resident[layer] -= int32_t(freed.size()) * config_.geometry.page_size;  // never the last page
  return uint64_t(freed.size()) * (kv_page_bytes() + sidecar_bytes_per_page(sidecars_));
}

uint64_t PagedStoreBase::bytes_in_use() const {
  uint64_t pages = 0;
  for (int64_t p : pages_in_use_) pages += uint64_t(p);
  return pages * (kv_page_bytes() + sidecar_bytes_per_page(sidecars_));
}

}  // namespace sieve::kv
