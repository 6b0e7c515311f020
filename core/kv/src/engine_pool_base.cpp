// The engine-pool store's bookkeeping (see engine_pool_base.hpp).
#include "sieve/kv/engine_pool_base.hpp"

#include <algorithm>
#include <climits>
#include <cstring>

#include "sieve/policy.h"
#include "sieve/util/error.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::kv {

EngineLayout engine_layout(const sieve_kv_config& c) {
  // The schema (engine_pool.cpp) has one ENUM, `layout`: hnd | nhd | combined | combined_hnd.
  if (c.hdr.struct_size < sizeof(sieve_kv_config) || c.n_params == 0 || !c.params) return {};
  switch (c.params[0].i) {
    case 1: return {SIEVE_KV_LAYOUT_NHD, 0};
    case 2: return {SIEVE_KV_LAYOUT_COMBINED, 0};
    case 3: return {SIEVE_KV_LAYOUT_COMBINED, 1};
    default: break;
  }
  return {};
}

namespace {
const char* layout_name(const EngineLayout& l) {
  if (l.bit == SIEVE_KV_LAYOUT_NHD) return "nhd";
  if (l.bit == SIEVE_KV_LAYOUT_COMBINED) return l.combined_hnd ? "combined_hnd" : "combined";
  return "hnd";
}
std::string str(int64_t v) { return std::to_string(v); }

// Which of a sequence's held page ids one bind compares with its table: all of them, or the
// window [from, from + count) (wrapping) of kHeldWindows-th of them plus the last one (an engine
// that replaced the page it appends to, or kept a page Sieve evicted, shows there at once).
struct HeldWindow {
  bool all = true;
  int64_t from = 0, count = 0;
};
HeldWindow held_window(int64_t held, int64_t cursor, bool settled) {
  if (!settled || held <= EnginePoolBase::kHeldWindows) return {true, 0, held};
  return {false, cursor % held, (held + EnginePoolBase::kHeldWindows - 1) / EnginePoolBase::kHeldWindows};
}
// The first logical page in `w` whose id differs between Sieve's list and the table; -1: none.
int64_t first_mismatch(const std::vector<int32_t>& known, const int32_t* table, const HeldWindow& w) {
  const int64_t held = int64_t(known.size());
  auto scan = [&](int64_t a, int64_t b) -> int64_t {  // [a, b)
    if (a >= b || std::memcmp(known.data() + a, table + a, size_t(b - a) * sizeof(int32_t)) == 0) return -1;
    for (int64_t i = a;; ++i)
      if (known[size_t(i)] != table[i]) return i;
  };
  if (w.all) return scan(0, held);
  const int64_t end = w.from + w.count;
  int64_t m = scan(w.from, std::min(end, held));
  if (m < 0 && end > held) m = scan(0, end - held);
  if (m < 0) m = scan(held - 1, held);
  return m;
}
}  // namespace

EnginePoolBase::EnginePoolBase(const sieve_host_services* services, const sieve_kv_config& config)
    : services_(services), config_(config), layout_(engine_layout(config)) {
  const std::string p = config_problem(config_);
  require(p.empty(), SIEVE_ERR_INVALID_ARGUMENT, "engine_pool store config: " + p);
  const int L = config_.geometry.n_layers;
  bound_.resize(size_t(L));
  pages_in_use_.assign(size_t(L), 0);
  checked_pool_.assign(size_t(L), 0);
  holders_.assign(size_t(L), std::vector<int32_t>(size_t(config_.pages_per_layer), 0));
  // The config's borrowed pointers do not outlive create.
  config_.params = nullptr;
  config_.n_params = 0;
  config_.geometry_ref = nullptr;
}

size_t EnginePoolBase::page_bytes() const {
  const auto& g = config_.geometry;
  return size_t(g.n_kv_heads) * g.page_size * g.head_dim * dtype_bytes(g.kv_dtype);
}

uint64_t EnginePoolBase::counted_page_bytes() const {
  return page_bytes() * (config_.keep_pre_rope_k ? 3 : 2) + sidecar_bytes_per_page(sidecars_);
}

void EnginePoolBase::check_layer(int32_t layer) const {
  if (layer < 0 || layer >= config_.geometry.n_layers)
    fail(SIEVE_ERR_NOT_FOUND, "layer " + str(layer) + " out of range (store has " + str(config_.geometry.n_layers) +
                                  " layers)");
}

EnginePoolBase::Sequence& EnginePoolBase::sequence(int32_t seq) {
  if (seq < 0 || seq >= int32_t(seqs_.size()) || !seqs_[size_t(seq)].live)
    fail(SIEVE_ERR_NOT_FOUND, "unknown sequence id " + str(seq));
  return seqs_[size_t(seq)];
}
const EnginePoolBase::Sequence& EnginePoolBase::sequence(int32_t seq) const {
  return const_cast<EnginePoolBase*>(this)->sequence(seq);
}

int32_t EnginePoolBase::add_sequence() {
  auto it = std::find_if(seqs_.begin(), seqs_.end(), [](const Sequence& s) { return !s.live; });
  if (it == seqs_.end()) it = seqs_.insert(seqs_.end(), Sequence{});
  it->live = true;
  it->pages.assign(size_t(config_.geometry.n_layers), {});
  it->resident.assign(size_t(config_.geometry.n_layers), 0);
  it->settled.assign(size_t(config_.geometry.n_layers), 0);
  it->held_cursor.assign(size_t(config_.geometry.n_layers), 0);
  return int32_t(it - seqs_.begin());
}

// The engine frees a finished request's pages itself: nothing goes to the release sink.
void EnginePoolBase::remove_sequence(int32_t seq) {
  Sequence& s = sequence(seq);
  for (size_t l = 0; l < s.pages.size(); ++l) {
    pages_in_use_[l] -= int64_t(s.pages[l].size());
    for (int32_t p : s.pages[l]) --holders_[l][size_t(p)];
  }
  s = Sequence{};
}

int32_t EnginePoolBase::seq_len(int32_t layer, int32_t seq) const {
  check_layer(layer);
  return sequence(seq).resident[size_t(layer)];
}

// The pool tensors against the geometry and the store's layout; fills the view's shape and
// strides: the view is always shaped [num_pages, n_kv_heads, page_size, head_dim].
void EnginePoolBase::check_pool(const sieve_kv_pages& p, Bound& b) const {
  const auto& g = config_.geometry;
  if (p.layout != layout_.bit || (p.layout == SIEVE_KV_LAYOUT_COMBINED && p.combined_hnd != layout_.combined_hnd))
    fail(SIEVE_ERR_INVALID_ARGUMENT, "bind_pages: the pages are in layout " +
                                         std::string(layout_name({p.layout, p.combined_hnd})) +
                                         ", the store was created with layout=" + layout_name(layout_));
  const bool combined = layout_.bit == SIEVE_KV_LAYOUT_COMBINED;
  const int ndim = combined ? 5 : 4;
  // Which axis of the pool tensor is the page, head and slot axis; -1: none.
  int page_ax = 0, kv_ax = -1, head_ax = 1, slot_ax = 2;
  if (layout_.bit == SIEVE_KV_LAYOUT_NHD) head_ax = 2, slot_ax = 1;
  if (combined) kv_ax = 1, head_ax = layout_.combined_hnd ? 2 : 3, slot_ax = layout_.combined_hnd ? 3 : 2;
  auto check = [&](const DLTensor& t, const char* what) {
    if (!t.data) fail(SIEVE_ERR_INVALID_ARGUMENT, std::string("bind_pages: ") + what + " has no data");
    if (t.ndim != ndim)
      fail(SIEVE_ERR_INVALID_ARGUMENT, std::string("bind_pages: ") + what + " has " + str(t.ndim) + " dims, layout " +
                                           layout_name(layout_) + " has " + str(ndim));
    if (!same_dtype(t.dtype, g.kv_dtype))
      fail(SIEVE_ERR_INVALID_ARGUMENT, std::string("bind_pages: ") + what + " is " + dtype_name(t.dtype) +
                                           ", the store's kv_dtype is " + dtype_name(g.kv_dtype));
    if (t.device.device_type != device().device_type || t.device.device_id != device().device_id)
      fail(SIEVE_ERR_INVALID_ARGUMENT, std::string("bind_pages: ") + what + " is on " + device_name(t.device) +
                                           ", the store is on " + device_name(device()));
    const int64_t want[4] = {g.n_kv_heads, g.page_size, g.head_dim, 2};
    const int axes[4] = {head_ax, slot_ax, ndim - 1, kv_ax};
    const char* names[4] = {"n_kv_heads", "page_size", "head_dim", "K/V"};
    for (int i = 0; i < 4; ++i)
      if (axes[i] >= 0 && t.shape[axes[i]] != want[i])
        fail(SIEVE_ERR_INVALID_ARGUMENT, std::string("bind_pages: ") + what + " dim " + str(axes[i]) + " is " +
                                             str(t.shape[axes[i]]) + ", expected " + names[i] + " = " + str(want[i]));
    if (t.shape[0] <= 0 || t.shape[0] > config_.pages_per_layer)
      fail(SIEVE_ERR_INVALID_ARGUMENT, std::string("bind_pages: ") + what + " has " + str(t.shape[0]) +
                                           " pages; the store was configured for at most pages_per_layer = " +
                                           str(config_.pages_per_layer));
    if (stride(t, ndim - 1) != 1)
      fail(SIEVE_ERR_INVALID_ARGUMENT, std::string("bind_pages: ") + what + " must be unit-stride along head_dim");
  };
  check(p.k_pool, combined ? "k_pool (combined K/V)" : "k_pool");
  b.num_pages = p.k_pool.shape[0];
  b.shape = {b.num_pages, g.n_kv_heads, g.page_size, g.head_dim};
  b.k_strides = {stride(p.k_pool, page_ax), stride(p.k_pool, head_ax), stride(p.k_pool, slot_ax), 1};
  if (combined) {
    if (p.v_pool.data)
      fail(SIEVE_ERR_INVALID_ARGUMENT, "bind_pages: a combined pool is one tensor: v_pool.data must be NULL");
    b.v_strides = b.k_strides;
    b.v_data = p.k_pool.data;
    b.v_byte_offset = p.k_pool.byte_offset + uint64_t(stride(p.k_pool, kv_ax)) * dtype_bytes(g.kv_dtype);
  } else {
    check(p.v_pool, "v_pool");
    if (p.v_pool.shape[0] != b.num_pages)
      fail(SIEVE_ERR_INVALID_ARGUMENT, "bind_pages: v_pool has " + str(p.v_pool.shape[0]) + " pages, k_pool " +
                                           str(b.num_pages));
    b.v_strides = {stride(p.v_pool, page_ax), stride(p.v_pool, head_ax), stride(p.v_pool, slot_ax), 1};
    b.v_data = p.v_pool.data;
    b.v_byte_offset = p.v_pool.byte_offset;
  }
  if (b.v_strides != b.k_strides)
    fail(SIEVE_ERR_INVALID_ARGUMENT,
         "bind_pages: v_pool's strides differ from k_pool's (K and V of a view share one layout)");
  const int64_t hnd[4] = {int64_t(g.n_kv_heads) * g.page_size * g.head_dim, int64_t(g.page_size) * g.head_dim,
                          g.head_dim, 1};
  b.compact = std::equal(hnd, hnd + 4, b.k_strides.begin()) && std::equal(hnd, hnd + 4, b.v_strides.begin());
  if (layout_.bit == SIEVE_KV_LAYOUT_HND && !b.compact)
    fail(SIEVE_ERR_INVALID_ARGUMENT,
         "bind_pages: layout=hnd needs compact [num_pages, n_kv_heads, page_size, head_dim] pools; a strided pool "
         "is layout nhd or combined");
}

void EnginePoolBase::bind_pages(const sieve_kv_pages& p) {
  if (p.hdr.struct_size < sizeof(sieve_kv_pages))
    fail(SIEVE_ERR_VERSION, "bind_pages: argument struct older than this store's");
  check_layer(p.layer);
  const auto& g = config_.geometry;
  const int32_t B = p.batch;
  if (B < 0) fail(SIEVE_ERR_INVALID_ARGUMENT, "bind_pages: negative batch");
  if (B > 0 && (!p.seq_ids || !p.indptr_host || !p.last_page_len_host))
    fail(SIEVE_ERR_INVALID_ARGUMENT, "bind_pages: seq_ids, indptr_host or last_page_len_host is null");
  Bound& b = bound_[size_t(p.layer)];
  b.valid = false;  // until every check below passed
  check_pool(p, b);
  const int64_t nnz = B ? p.indptr_host[B] : 0;
  if (B > 0 && p.indptr_host[0] != 0) fail(SIEVE_ERR_INVALID_ARGUMENT, "bind_pages: indptr_host[0] must be 0");
  const int32_t* ids = p.indices_host;
  if (!ids && device().device_type == kDLCPU) ids = static_cast<const int32_t*>(p.indices.data);
  if (nnz > 0 && !ids)
    fail(SIEVE_ERR_INVALID_ARGUMENT, "bind_pages: indices_host is null (required for a pool on " +
                                         device_name(device()) + ")");
  auto check_table = [&](const DLTensor& t, const char* what, int64_t n) {
    if (t.ndim != 1 || t.shape[0] != n || !same_dtype(t.dtype, kI32) || (n > 0 && !t.data) ||
        t.device.device_type != device().device_type || !is_contiguous(t))
      fail(SIEVE_ERR_INVALID_ARGUMENT, std::string("bind_pages: ") + what + " must be a contiguous int32 [" + str(n) +
                                           "] on " + device_name(device()));
  };
  check_table(p.indptr, "indptr", int64_t(B) + 1);
  check_table(p.indices, "indices", nnz);
  check_table(p.last_page_len, "last_page_len", B);
  if (seen_.size() < size_t(b.num_pages)) seen_.resize(size_t(config_.pages_per_layer), 0);
  for (int32_t i = 0; i < B; ++i) {
    const int32_t seq = p.seq_ids[i];
    const Sequence& s = sequence(seq);
    for (int32_t j = 0; j < i; ++j)
      if (p.seq_ids[j] == seq) fail(SIEVE_ERR_INVALID_ARGUMENT, "bind_pages: sequence " + str(seq) + " listed twice");
    const int32_t lo = p.indptr_host[i], hi = p.indptr_host[i + 1];
    if (hi < lo || hi > nnz)
      fail(SIEVE_ERR_INVALID_ARGUMENT, "bind_pages: indptr_host is not non-decreasing up to indptr_host[batch]");
    const int32_t last = p.last_page_len_host[i];
    if (hi > lo ? (last < 1 || last > g.page_size) : last != 0)
      fail(SIEVE_ERR_INVALID_ARGUMENT, "bind_pages: sequence " + str(seq) + ": last_page_len " + str(last) +
                                           (hi > lo ? " is not in 1.." + str(g.page_size) : " with no pages (must be 0)"));
    // The pages Sieve already holds for the sequence were checked when they entered its table
    // (in the pool, once each). Their ids are compared with the table's prefix in full when the
    // sequence's list is not settled (its first bind in the layer, the first after an eviction,
    // a pool of another size); otherwise over one window of them per bind (held_window): a held
    // id the engine rewrites is refused within kHeldWindows binds of the layer, and a decode
    // step's bind costs O(new pages + held / kHeldWindows), not O(held) (16 x 8193 held ids at
    // 128K tokens: 15-20 us of memcmp per bind).
    const auto& known = s.pages[size_t(p.layer)];
    const bool settled = s.settled[size_t(p.layer)] && b.num_pages == checked_pool_[size_t(p.layer)];
    const HeldWindow w = held_window(int64_t(known.size()), settled ? s.held_cursor[size_t(p.layer)] : 0, settled);
    const int64_t mismatch = int64_t(known.size()) > hi - lo ? 0 : first_mismatch(known, ids + lo, w);
    const bool prefix_held = mismatch < 0;
    const bool tail_only = prefix_held && b.num_pages == checked_pool_[size_t(p.layer)];
    if (++stamp_ == 0) std::fill(seen_.begin(), seen_.end(), 0), stamp_ = 1;  // a page twice in one sequence
    for (int32_t k = tail_only ? lo + int32_t(known.size()) : lo; k < hi; ++k) {
      const int32_t id = ids[k];
      if (id < 0 || id >= b.num_pages)
        fail(SIEVE_ERR_INVALID_ARGUMENT, "bind_pages: sequence " + str(seq) + ", page " + str(k - lo) + ": id " +
                                             str(id) + " is outside the pool of " + str(b.num_pages) + " pages");
      // Tail only: a page the sequence holds has a holder (append counts it), so the scan of
      // its pages is needed only for a page some sequence holds (a shared prefix page: rare).
      if (seen_[size_t(id)] == stamp_ ||
          (tail_only && holders_[size_t(p.layer)][size_t(id)] > 0 &&
           std::find(known.begin(), known.end(), id) != known.end()))
        fail(SIEVE_ERR_INVALID_ARGUMENT, "bind_pages: sequence " + str(seq) + " names page " + str(id) + " twice");
      seen_[size_t(id)] = stamp_;
    }
    if (!prefix_held)
      fail(SIEVE_ERR_INVALID_ARGUMENT,
           "bind_pages: sequence " + str(seq) + ", layer " + str(p.layer) + ": the table does not start with the " +
               str(int64_t(known.size())) + " pages Sieve holds for it" +
               (int64_t(known.size()) > hi - lo
                    ? " (it names " + str(hi - lo) + ")"
                    : " (logical page " + str(mismatch) + " is " + str(ids[lo + mismatch]) + ", Sieve holds " +
                          str(known[size_t(mismatch)]) + ")") +
               "; an engine only appends pages to a sequence and drops exactly those Sieve evicted; "
               "remove_sequence to start it over");
  }
  // Every check passed: the windows move on and every bound list is settled.
  for (int32_t i = 0; i < B; ++i) {
    Sequence& s = sequence(p.seq_ids[i]);
    const size_t L = size_t(p.layer);
    const int64_t held = int64_t(s.pages[L].size());
    s.held_cursor[L] = s.settled[L] && held > 0 ? (s.held_cursor[L] + held_window(held, 0, true).count) % held : 0;
    s.settled[L] = 1;
  }
  b.pages = p;
  b.indices_host = ids;
  b.seq_ids.assign(p.seq_ids, p.seq_ids + B);
  b.pages.seq_ids = b.seq_ids.data();
  b.indptr_shape[0] = int64_t(B) + 1;
  b.indices_shape[0] = nnz;
  b.last_shape[0] = B;
  b.pre_shape = {config_.pages_per_layer, g.n_kv_heads, g.page_size, g.head_dim};
  checked_pool_[size_t(p.layer)] = b.num_pages;
  b.valid = true;
}

int32_t EnginePoolBase::table_tokens(const Bound& b, int32_t i) const {
  const int32_t n = b.pages.indptr_host[i + 1] - b.pages.indptr_host[i];
  return n ? (n - 1) * config_.geometry.page_size + b.pages.last_page_len_host[i] : 0;
}

const EnginePoolBase::Bound& EnginePoolBase::bound(int32_t layer, const char* op) const {
  check_layer(layer);
  const Bound& b = bound_[size_t(layer)];
  if (!b.valid)
    fail(SIEVE_ERR_INVALID_ARGUMENT, std::string(op) + ": layer " + str(layer) +
                                         " has no pages bound (bind_pages before each call of the layer; an "
                                         "eviction ends the binding)");
  return b;
}

void EnginePoolBase::append(const sieve_kv_append& a) {
  check_append(a, config_, device());
  const Bound& b = bound(a.layer, "append");
  const auto& g = config_.geometry;
  const size_t L = size_t(a.layer);
  // Where each appending sequence sits in the bound table; every check before anything changes.
  std::vector<int32_t> at(size_t(a.batch));
  for (int32_t i = 0; i < a.batch; ++i) {
    const Sequence& s = sequence(a.seq_ids[i]);
    const auto it = std::find(b.seq_ids.begin(), b.seq_ids.end(), a.seq_ids[i]);
    if (it == b.seq_ids.end())
      fail(SIEVE_ERR_INVALID_ARGUMENT, "append: sequence " + str(a.seq_ids[i]) + " is not in the pages bound for layer " +
                                           str(a.layer));
    at[size_t(i)] = int32_t(it - b.seq_ids.begin());
    const int32_t n = a.token_indptr[i + 1] - a.token_indptr[i];
    const int32_t want = table_tokens(b, at[size_t(i)]);
    if (s.resident[L] + n != want)
      fail(SIEVE_ERR_INVALID_ARGUMENT, "append: sequence " + str(a.seq_ids[i]) + ", layer " + str(a.layer) + ": " +
                                           str(s.resident[L]) + " tokens + " + str(n) + " new != the " + str(want) +
                                           " tokens the bound table names");
  }
  slots_.clear();
  fresh_.clear();
  for (int32_t i = 0; i < a.batch; ++i) {
    Sequence& s = sequence(a.seq_ids[i]);
    auto& known = s.pages[L];
    const int32_t lo = b.pages.indptr_host[at[size_t(i)]], hi = b.pages.indptr_host[at[size_t(i)] + 1];
    // A page another sequence already holds (an engine's shared prefix) keeps its sidecars.
    for (int32_t k = lo + int32_t(known.size()); k < hi; ++k)
      if (holders_[L][size_t(b.indices_host[k])]++ == 0) fresh_.push_back(b.indices_host[k]);
    pages_in_use_[L] += hi - lo - int64_t(known.size());
    known.insert(known.end(), b.indices_host + lo + known.size(), b.indices_host + hi);
    // Token t of the sequence is in its page t / page_size: every page but the last is full
    // (evictions take whole pages, never the last).
    for (int32_t r = a.token_indptr[i], t = s.resident[L]; r < a.token_indptr[i + 1]; ++r, ++t)
      slots_.push_back({r, known[size_t(t / g.page_size)], t % g.page_size});
    s.resident[L] += a.token_indptr[i + 1] - a.token_indptr[i];
  }
  if (!fresh_.empty() && !sidecars_.empty()) clear_sidecar_pages(a.layer, fresh_);
  if (slots_.empty()) return;
  const bool write_kv = !b.pages.new_tokens_written;
  void* pre = config_.keep_pre_rope_k ? pre_rope_pool(a.layer) : nullptr;
  const DLTensor* inputs[3] = {write_kv ? a.k : nullptr, write_kv ? a.v : nullptr, pre ? a.k_pre_rope : nullptr};
  if (!inputs[0] && !inputs[2]) return;
  const PoolTarget targets[3] = {
      {data_ptr<void>(b.pages.k_pool), b.k_strides[0], b.k_strides[1], b.k_strides[2]},
      {static_cast<char*>(b.v_data) + b.v_byte_offset, b.v_strides[0], b.v_strides[1], b.v_strides[2]},
      compact_hnd(pre, g.n_kv_heads, g.page_size, g.head_dim)};
  write_tokens(slots_, inputs, targets);
}

void EnginePoolBase::view(int32_t layer, const int32_t* seq_ids, int32_t batch, sieve_paged_kv* out) {
  Bound& b = const_cast<Bound&>(bound(layer, "view"));
  if (!out) fail(SIEVE_ERR_INVALID_ARGUMENT, "view: out is null");
  if (batch != int32_t(b.seq_ids.size()) || (batch > 0 && (!seq_ids || !std::equal(b.seq_ids.begin(), b.seq_ids.end(), seq_ids))))
    fail(SIEVE_ERR_INVALID_ARGUMENT, "view: layer " + str(layer) +
                                         ": the sequences differ from those of the pages bound for it (same ids, same order)");
  for (int32_t i = 0; i < batch; ++i) {
    const int32_t have = sequence(seq_ids[i]).resident[size_t(layer)], want = table_tokens(b, i);
    if (have != want)
      fail(SIEVE_ERR_INVALID_ARGUMENT, "view: sequence " + str(seq_ids[i]) + ", layer " + str(layer) +
                                           ": the bound table names " + str(want) + " tokens, Sieve holds " + str(have) +
                                           " (append the new tokens first)");
  }
  const auto& g = config_.geometry;
  *out = sieve_paged_kv{};
  out->hdr = {uint32_t(sizeof(sieve_paged_kv)), SIEVE_ABI_MINOR};
  out->batch = batch;
  out->page_size = g.page_size;
  out->k_pages = make_view(b.pages.k_pool.data, device(), g.kv_dtype, 4, b.shape.data(),
                           b.compact ? nullptr : b.k_strides.data());
  out->k_pages.byte_offset = b.pages.k_pool.byte_offset;
  out->v_pages = make_view(b.v_data, device(), g.kv_dtype, 4, b.shape.data(), b.compact ? nullptr : b.v_strides.data());
  out->v_pages.byte_offset = b.v_byte_offset;
  out->indptr = make_view(b.pages.indptr.data, device(), kI32, 1, b.indptr_shape.data());
  out->indptr.byte_offset = b.pages.indptr.byte_offset;
  out->indices = make_view(b.pages.indices.data, device(), kI32, 1, b.indices_shape.data());
  out->indices.byte_offset = b.pages.indices.byte_offset;
  out->last_page_len = make_view(b.pages.last_page_len.data, device(), kI32, 1, b.last_shape.data());
  out->last_page_len.byte_offset = b.pages.last_page_len.byte_offset;
  out->indptr_host = b.pages.indptr_host;
  out->last_page_len_host = b.pages.last_page_len_host;
  out->k_pre_rope_pages = make_view(config_.keep_pre_rope_k ? pre_rope_pool(layer) : nullptr, device(), g.kv_dtype, 4,
                                    b.pre_shape.data());
}

std::vector<PageBytes> EnginePoolBase::sidecar_pages(const std::vector<void*>& bases) const {
  std::vector<PageBytes> out;
  for (size_t slot = 0; slot < bases.size() && slot < sidecars_.size(); ++slot)
    out.push_back({bases[slot], sidecars_[slot].bytes_per_page});
  return out;
}

int32_t EnginePoolBase::register_sidecar(const sieve_sidecar_desc& d) {
  return add_sidecar(sidecars_, d, config_.geometry.n_kv_heads, [this](int32_t slot) { allocate_sidecar(slot); });
}

void EnginePoolBase::sidecar(int32_t layer, int32_t slot, DLTensor* out) {
  check_layer(layer);
  require(slot >= 0 && slot < int32_t(sidecars_.size()), SIEVE_ERR_NOT_FOUND, "unknown sidecar slot " + str(slot));
  require(out != nullptr, SIEVE_ERR_INVALID_ARGUMENT, "sidecar: out is null");
  sidecar_tensor(layer, slot, out);
}

uint64_t EnginePoolBase::evict(int32_t layer, int32_t seq, const int32_t* logical, int32_t n) {
  check_layer(layer);
  Sequence& s = sequence(seq);
  auto& pages = s.pages[size_t(layer)];
  const std::vector<char> mark = evict_marks(layer, seq, int32_t(pages.size()), logical, n);
  std::vector<int32_t> freed, kept;
  kept.reserve(pages.size());
  for (size_t i = 0; i < pages.size(); ++i) (mark[i] ? freed : kept).push_back(pages[i]);
  if (freed.empty()) return 0;
  // The pages go to the engine only if its bound table agrees on every page Sieve holds (a bind
  // compares only a window of them): the sink never receives a page the engine uses elsewhere.
  if (const Bound& b = bound_[size_t(layer)]; b.valid) {
    const auto at = std::find(b.seq_ids.begin(), b.seq_ids.end(), seq);
    if (at != b.seq_ids.end()) {
      const int32_t lo = b.pages.indptr_host[at - b.seq_ids.begin()];
      if (const int64_t m = first_mismatch(pages, b.indices_host + lo, HeldWindow{}); m >= 0)
        fail(SIEVE_ERR_INVALID_ARGUMENT, "evict: sequence " + str(seq) + ", layer " + str(layer) +
                                             ": the bound table names page " + str(b.indices_host[lo + m]) +
                                             " at logical page " + str(m) + ", Sieve holds " + str(pages[size_t(m)]) +
                                             " (the engine changed a page Sieve holds); nothing was released");
    }
  }
  require(config_.release.release != nullptr, SIEVE_ERR_UNSUPPORTED,
          "evict: the engine registered no page release sink (kv_config.release), so evicted pages could not go "
          "back to it");
  // Sieve forgets the pages first: the engine may reuse them as soon as the sink returns.
  pages = std::move(kept);
  pages_in_use_[size_t(layer)] -= int64_t(freed.size());
  for (int32_t p : freed) --holders_[size_t(layer)][size_t(p)];
  s.resident[size_t(layer)] -= int32_t(freed.size()) * config_.geometry.page_size;  // never the last page
  s.settled[size_t(layer)] = 0;  // the next bind compares every page it still holds
  bound_[size_t(layer)].valid = false;  // the engine's table still names them: it binds anew
  config_.release.release(config_.release.ctx, layer, seq, freed.data(), int32_t(freed.size()));
  return uint64_t(freed.size()) * counted_page_bytes();
}

// Per page a sequence names: the engine's K and V bytes of it (the memory eviction hands back to
// the engine), Sieve's pre-RoPE K page when kept, and Sieve's sidecar slots: the same count the
// core stores report for the same cache. A page two sequences share counts for each.
uint64_t EnginePoolBase::bytes_in_use() const {
  uint64_t pages = 0;
  for (int64_t p : pages_in_use_) pages += uint64_t(p);
  return pages * counted_page_bytes();
}

}  // namespace sieve::kv
