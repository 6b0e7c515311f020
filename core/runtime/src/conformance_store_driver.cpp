// conformance_store_driver.hpp: making, feeding and reading back one store on one device.
#include "conformance_store_driver.hpp"

#include <algorithm>

#include "conformance_isolation.hpp"
#include "sieve/util/status.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::runtime::store_conform {

Traits traits_of(const StoreUnderTest& st) {
  const sieve_kv_store_api* api = st.api;
  Traits t;
  const sieve_kv_store_descriptor* d =
      SIEVE_HAS_FIELD(api, sieve_kv_store_api, descriptor) ? api->descriptor : nullptr;
  if (d) {
    t = {d->devices, d->dtypes, d->layouts, d->features, {}, true};
    if (d->page_sizes) t.page_sizes.assign(d->page_sizes, d->page_sizes + d->n_page_sizes);
    return t;
  }
  t.devices = st.devices_1_0;
  t.dtypes = SIEVE_DTYPE_F32 | SIEVE_DTYPE_F16 | SIEVE_DTYPE_BF16;
  if (api->register_sidecar && api->sidecar) t.features |= SIEVE_KV_FEATURE_SIDECARS;
  if (api->evict) t.features |= SIEVE_KV_FEATURE_EVICTION;
  return t;
}

const char* device_word(uint32_t bit) { return bit == SIEVE_DEVICE_CUDA ? "cuda" : "cpu"; }

DLDataType dtype_of(uint32_t bit) {
  return bit == SIEVE_DTYPE_BF16 ? kBF16 : bit == SIEVE_DTYPE_F16 ? kF16 : kF32;
}

sieve_geometry suite_geometry(const Traits& t, uint32_t device) {
  sieve_geometry g{};
  g.hdr = SIEVE_HEADER_INIT(sieve_geometry);
  g.n_layers = 2;
  g.n_q_heads = 4;
  g.n_kv_heads = 2;
  g.head_dim = g.rope_dim = 16;
  const auto& ps = t.page_sizes;
  g.page_size = ps.empty() || std::find(ps.begin(), ps.end(), 16) != ps.end() ? 16 : ps.front();
  g.max_batch = 4;
  g.max_seq_len = 4096;
  g.kv_dtype = dtype_of(t.dtypes & SIEVE_DTYPE_F32   ? SIEVE_DTYPE_F32
                        : t.dtypes & SIEVE_DTYPE_F16 ? SIEVE_DTYPE_F16
                                                     : SIEVE_DTYPE_BF16);
  g.device = device == SIEVE_DEVICE_CUDA ? DLDevice{kDLCUDA, 0} : kCpu;
  g.rope_theta = 10000.f;
  return g;
}

Instance::Instance(const sieve_kv_store_api* api, HostServices& host, const sieve_kv_config& config) : api_(api) {
  Reasons r;
  status = api->create(host.table(), &config, &s, r.sink());
  reason = join(r.lines);
  if (status != SIEVE_OK) s = nullptr;
}
Instance::~Instance() {
  if (s) api_->destroy(s);
}
std::string Instance::last_error() const { return bounded_text(s ? api_->last_error(s) : nullptr, 300); }

void failed(const std::string& why) { throw CheckFailed{why}; }

StoreDriver::StoreDriver(const sieve_kv_store_api* api, const Traits& traits, uint32_t device, HostServices& host)
    : api_(api), traits_(traits), device_(device), host_(&host), geometry_(suite_geometry(traits, device)) {
  page_ = geometry_.page_size;
  dtype_ = geometry_.kv_dtype;
}

sieve_kv_config StoreDriver::config(DLDataType dtype, int32_t capacity) {
  full_ = geometry_;
  full_.kv_dtype = dtype;
  sieve_kv_config c{};
  c.hdr = SIEVE_HEADER_INIT(sieve_kv_config);
  c.geometry = full_;
  c.pages_per_layer = capacity;
  c.keep_pre_rope_k = pre_rope() ? 1 : 0;
  c.geometry_ref = &full_;
  c.params = params_.data();
  c.n_params = params_.size();
  if (engine_) c.release = engine_->sink();
  return c;
}
bool StoreDriver::engine() const { return traits_.features & SIEVE_KV_FEATURE_ENGINE_PAGES; }
// A store that keeps pre-RoPE keys is made keeping them in every check: they go in with every
// append and come back in every view.
bool StoreDriver::pre_rope() const { return traits_.features & SIEVE_KV_FEATURE_PRE_ROPE_K; }
// The store's parameters: schema defaults, and for an ENGINE_PAGES store whose pool layout is
// fixed at creation, its enum parameter `layout` set to the layout under test.
void StoreDriver::set_params() {
  params_ = ParamValues{};
  if (!SIEVE_HAS_FIELD(api_, sieve_kv_store_api, n_params) || !api_->n_params) return;
  const ParamSchema schema(api_->params, api_->n_params);
  ParamPairs pairs;
  const int at = schema.find("layout");
  if (engine() && at >= 0 && schema[uint32_t(at)].type == SIEVE_PARAM_ENUM) pairs.emplace_back("layout", layout_.name());
  std::vector<std::string> errors;  // the loader checked that the defaults parse
  if (!parse_params(schema, pairs, &params_, &errors)) failed("the store's parameters: " + join(errors));
}
Shape StoreDriver::shape(DLDataType dtype, int32_t capacity) const {
  return {geometry_.n_kv_heads, geometry_.head_dim, page_, capacity, dtype, geometry_.device, pre_rope()};
}

// Creates the store or fails the check.
std::unique_ptr<Instance> StoreDriver::make(DLDataType dtype, int32_t capacity) {
  set_params();
  engine_.reset();
  if (engine()) engine_ = std::make_unique<EnginePool>(*host_, shape(dtype, capacity), geometry_.n_layers, layout_);
  auto inst = std::make_unique<Instance>(api_, *host_, config(dtype, capacity));
  if (inst->status != SIEVE_OK || !inst->s)
    failed("create (" + dtype_name(dtype) + ", " + std::to_string(capacity) + " pages per layer) returned " +
           status_name(inst->status) + (inst->s ? "" : " and no store") + ": " + inst->reason);
  ref_.clear();
  return inst;
}

std::vector<int32_t> StoreDriver::add(Instance& in, int n) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) {
    int32_t id = -1;
    sieve_status st = api_->add_sequence(in.s, &id);
    if (st != SIEVE_OK) failed("add_sequence returned " + status_name(st) + ": " + in.last_error());
    if (std::find(ids.begin(), ids.end(), id) != ids.end())
      failed("add_sequence handed out id " + std::to_string(id) + " twice");
    ids.push_back(id);
  }
  return ids;
}

// Appends counts[b] new tokens to ids[b] in `layer`; on SIEVE_OK the reference grows by them.
sieve_status StoreDriver::append(Instance& in, int32_t layer, const std::vector<int32_t>& ids, const std::vector<int32_t>& counts) {
  const int64_t row = int64_t(geometry_.n_kv_heads) * geometry_.head_dim;
  std::vector<int32_t> indptr{0};
  for (int32_t c : counts) indptr.push_back(indptr.back() + c);
  const int64_t n = indptr.back();
  std::vector<float> k(size_t(n * row)), v(size_t(n * row)), pk(pre_rope() ? size_t(n * row) : 0);
  std::uniform_real_distribution<float> mag(0.05f, 4.f);
  for (auto* x : {&k, &v, &pk})
    for (auto& e : *x) e = (rng_() & 1 ? -1.f : 1.f) * mag(rng_);
  DeviceBuffer dk(*host_, k.size() * 4), dv(*host_, v.size() * 4), dp(*host_, pk.size() * 4);
  dk.upload(k.data(), k.size() * 4);
  dv.upload(v.data(), v.size() * 4);
  if (!pk.empty()) dp.upload(pk.data(), pk.size() * 4);
  int64_t shp[3] = {n, geometry_.n_kv_heads, geometry_.head_dim};
  DLTensor tk = make_view(dk.data(), geometry_.device, kF32, 3, shp);
  DLTensor tv = make_view(dv.data(), geometry_.device, kF32, 3, shp);
  DLTensor tp = make_view(dp.data(), geometry_.device, kF32, 3, shp);
  sieve_kv_append a{SIEVE_HEADER_INIT(sieve_kv_append), layer, int32_t(ids.size()), ids.data(), indptr.data(),
                    &tk, &tv, pk.empty() ? nullptr : &tp};
  std::vector<int32_t> after;  // ENGINE_PAGES: the table holds the tokens after the append
  if (engine_) {
    for (size_t b = 0; b < ids.size(); ++b) {
      after.push_back(engine_->tokens(layer, ids[b]) + counts[b]);
      if (!engine_->reserve(layer, ids[b], after.back())) failed("the suite's engine pool is too small (a suite bug)");
    }
  }
  sieve_status st = engine_ ? engine_->bind(api_, in.s, layer, ids, after) : SIEVE_OK;
  if (st == SIEVE_OK) st = api_->append(in.s, &a);
  if (st != SIEVE_OK) {
    if (engine_)  // the engine takes back the pages it reserved for the refused tokens
      for (int32_t id : ids) engine_->trim(layer, id);
    return st;
  }
  if (engine_)
    for (size_t b = 0; b < ids.size(); ++b) engine_->set_tokens(layer, ids[b], after[b]);
  for (size_t b = 0; b < ids.size(); ++b) {
    RefRows& r = ref_[{layer, ids[b]}];
    r.k.insert(r.k.end(), k.begin() + indptr[b] * row, k.begin() + indptr[b + 1] * row);
    r.v.insert(r.v.end(), v.begin() + indptr[b] * row, v.begin() + indptr[b + 1] * row);
    if (!pk.empty()) r.k_pre_rope.insert(r.k_pre_rope.end(), pk.begin() + indptr[b] * row, pk.begin() + indptr[b + 1] * row);
  }
  return st;
}
void StoreDriver::append_ok(Instance& in, int32_t layer, const std::vector<int32_t>& ids, const std::vector<int32_t>& counts) {
  sieve_status st = append(in, layer, ids, counts);
  if (st != SIEVE_OK)
    failed("append of " + std::to_string(counts.size()) + " sequence(s) to layer " + std::to_string(layer) +
           " returned " + status_name(st) + ": " + in.last_error());
}

// An ENGINE_PAGES store reads the host's table of the layer: bound before every call that reads it.
sieve_status StoreDriver::bind(Instance& in, int32_t layer, const std::vector<int32_t>& ids) {
  if (!engine_) return SIEVE_OK;
  std::vector<int32_t> tokens;
  for (int32_t id : ids) tokens.push_back(engine_->tokens(layer, id));
  return engine_->bind(api_, in.s, layer, ids, tokens);
}
sieve_status StoreDriver::do_view(Instance& in, int32_t layer, const std::vector<int32_t>& ids, sieve_paged_kv* out) {
  if (sieve_status st = bind(in, layer, ids); st != SIEVE_OK) return st;
  return api_->view(in.s, layer, ids.data(), int32_t(ids.size()), out);
}
sieve_status StoreDriver::do_evict(Instance& in, int32_t layer, int32_t seq, const int32_t* pages, int32_t n, uint64_t* freed) {
  if (sieve_status st = bind(in, layer, {seq}); st != SIEVE_OK) return st;
  return api_->evict(in.s, layer, seq, pages, n, freed);
}
sieve_status StoreDriver::do_remove(Instance& in, int32_t seq) {
  const sieve_status st = api_->remove_sequence(in.s, seq);
  if (st == SIEVE_OK && engine_) engine_->forget(seq);  // the engine frees a finished request's pages
  return st;
}

// The reference after logical page `p` of a sequence was evicted.
void StoreDriver::drop_page(RefRows& r, int32_t p) {
  const int64_t n = int64_t(page_) * geometry_.n_kv_heads * geometry_.head_dim;
  for (auto* x : {&r.k, &r.v, &r.k_pre_rope})
    if (!x->empty()) x->erase(x->begin() + p * n, x->begin() + (p + 1) * n);
}

int32_t StoreDriver::resident(int32_t layer, int32_t id) {
  const auto it = ref_.find({layer, id});
  const int64_t row = int64_t(geometry_.n_kv_heads) * geometry_.head_dim;
  return it == ref_.end() ? 0 : int32_t(it->second.tokens(row));
}

// view(layer, ids) copied and checked for structure; seq_len of each against the reference;
// with `content`, every resident token against the reference.
ViewCopy StoreDriver::view(Instance& in, int32_t layer, const std::vector<int32_t>& ids, const Shape& sh, bool content,
              const std::string& when) {
  std::vector<int32_t> res;
  for (int32_t id : ids) {
    int32_t len = -1;
    sieve_status st = api_->seq_len(in.s, layer, id, &len);
    if (st != SIEVE_OK) failed(when + ": seq_len(layer " + std::to_string(layer) + ", sequence " + std::to_string(id) +
                               ") returned " + status_name(st) + ": " + in.last_error());
    if (len != resident(layer, id))
      failed(when + ": seq_len(layer " + std::to_string(layer) + ", sequence " + std::to_string(id) + ") is " +
             std::to_string(len) + ", " + std::to_string(resident(layer, id)) + " tokens are resident");
    res.push_back(len);
  }
  sieve_paged_kv out{};
  sieve_status st = do_view(in, layer, ids, &out);
  if (st != SIEVE_OK) failed(when + ": view of layer " + std::to_string(layer) + " returned " + status_name(st) + ": " + in.last_error());
  ViewCopy vc;
  auto bad = copy_view(*host_, out, sh, res, &vc);
  if (!bad.empty()) failed(when + ", view of layer " + std::to_string(layer) + ": " + join(bad));
  if (content)
    for (size_t b = 0; b < ids.size(); ++b) {
      auto it = ref_.find({layer, ids[b]});
      if (it == ref_.end()) continue;
      std::string m = compare_rows(vc, int32_t(b), it->second, sh,
                                   when + ", layer " + std::to_string(layer) + ", sequence " + std::to_string(ids[b]));
      if (!m.empty()) failed(m);
    }
  return vc;
}

uint64_t StoreDriver::bytes(Instance& in) {
  uint64_t b = 0;
  sieve_status st = api_->bytes_in_use(in.s, &b);
  if (st != SIEVE_OK) failed("bytes_in_use returned " + status_name(st) + ": " + in.last_error());
  return b;
}

// Sidecar values are written through the tensor the store hands out; on CUDA via copies.
std::vector<float> StoreDriver::read_sidecar(const DLTensor& t) {
  std::vector<float> out(size_t(numel(t)));
  std::string err;
  if (!host_->copy(out.data(), kCpu, data_ptr<void>(t), t.device, out.size() * 4, &err)) failed("sidecar read: " + err);
  return out;
}
void StoreDriver::write_sidecar(const DLTensor& t, const std::vector<float>& values) {
  std::string err;
  if (!host_->copy(data_ptr<void>(t), t.device, values.data(), kCpu, values.size() * 4, &err)) failed("sidecar write: " + err);
}
DLTensor StoreDriver::sidecar(Instance& in, int32_t layer, int32_t slot, int32_t elems, int32_t capacity) {
  DLTensor t{};
  sieve_status st = api_->sidecar(in.s, layer, slot, &t);
  if (st != SIEVE_OK) failed("sidecar(layer " + std::to_string(layer) + ", slot " + std::to_string(slot) + ") returned " + status_name(st));
  if (!t.data || t.ndim != 3 || !t.shape || t.shape[0] < capacity || t.shape[1] != geometry_.n_kv_heads ||
      t.shape[2] != elems || !same_dtype(t.dtype, kF32) || t.device.device_type != geometry_.device.device_type ||
      (t.strides && !is_contiguous(t)))
    failed("sidecar(slot " + std::to_string(slot) + ") is not a contiguous f32 [" + std::to_string(capacity) + "+, " +
           std::to_string(geometry_.n_kv_heads) + ", " + std::to_string(elems) + "] tensor on the store's device");
  return t;
}


}  // namespace sieve::runtime::store_conform
