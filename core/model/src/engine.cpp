#include "sieve/model/engine.hpp"

#include <algorithm>

#include "ops.hpp"
#include "sieve/kv/paged_store.hpp"
#include "sieve/util/error.hpp"

namespace sieve::model {

struct Engine::DeviceLayer {
  const float *rms_att = nullptr, *wq = nullptr, *wk = nullptr, *wv = nullptr, *bq = nullptr, *bk = nullptr,
              *bv = nullptr, *wo = nullptr, *rms_ffn = nullptr, *w1 = nullptr, *w2 = nullptr, *w3 = nullptr;
};

sieve_geometry Engine::geometry_for(const ModelConfig& c, const EngineOptions& o) {
  sieve_geometry g{};
  g.hdr = SIEVE_HEADER_INIT(sieve_geometry);
  g.n_layers = c.n_layers;
  g.n_q_heads = c.n_heads;
  g.n_kv_heads = c.n_kv_heads;
  g.head_dim = c.head_dim();
  g.page_size = o.page_size;
  g.max_batch = o.max_batch;
  g.max_seq_len = o.max_seq_len > 0 ? o.max_seq_len : c.seq_len;
  g.kv_dtype = o.kv_dtype;
  g.device = o.device;
  g.rope_theta = c.rope_theta;
  g.rope_dim = c.head_dim();
  return g;
}

Engine::Engine(const ModelWeights& w, const EngineOptions& options, runtime::ResolvedChains chains)
    : config_(w.config), options_(options), geometry_(geometry_for(w.config, options)) {
  if (std::string p = config_.problem(); !p.empty()) fail(SIEVE_ERR_INVALID_ARGUMENT, "model: " + p);
  require(options_.max_batch >= 1, SIEVE_ERR_INVALID_ARGUMENT, "model: max_batch must be >= 1");
  require(options_.page_size >= 1, SIEVE_ERR_INVALID_ARGUMENT, "model: page_size must be >= 1");
  require(geometry_.max_seq_len >= 1, SIEVE_ERR_INVALID_ARGUMENT, "model: max_seq_len must be >= 1");
  check_sizes(w);
  services_ = std::make_unique<runtime::HostServices>(options_.device);
  ops_ = options_.device.device_type == kDLCUDA ? detail::make_cuda_ops(options_.device, services_->cuda_stream())
                                                : detail::make_cpu_ops();
  try {
    setup(w, std::move(chains));
  } catch (...) {
    for (void* p : weight_ptrs_) ops_->free(p);
    throw;
  }
}

void Engine::check_sizes(const ModelWeights& w) const {
  const int64_t D = config_.dim, F = config_.hidden_dim, KV = config_.kv_dim(), V = config_.vocab_size;
  auto expect = [&](const std::vector<float>& v, int64_t n, const std::string& what) {
    require(int64_t(v.size()) == n, SIEVE_ERR_INVALID_ARGUMENT,
            "model '" + w.source + "': " + what + " holds " + std::to_string(v.size()) + " values, the config implies " +
                std::to_string(n));
  };
  expect(w.token_embedding, V * D, "token_embedding");
  expect(w.rms_final, D, "rms_final");
  if (!config_.shared_classifier) expect(w.classifier, V * D, "classifier");
  require(int64_t(w.layers.size()) == config_.n_layers, SIEVE_ERR_INVALID_ARGUMENT,
          "model '" + w.source + "': " + std::to_string(w.layers.size()) + " layers of weights, the config says " +
              std::to_string(config_.n_layers));
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    const std::string at = "layer " + std::to_string(i) + " ";
    expect(l.rms_att, D, at + "rms_att");
    expect(l.wq, D * D, at + "wq");
    expect(l.wk, KV * D, at + "wk");
    expect(l.wv, KV * D, at + "wv");
    if (config_.qkv_bias) {
      expect(l.bq, D, at + "bq");
      expect(l.bk, KV, at + "bk");
      expect(l.bv, KV, at + "bv");
    }
    expect(l.wo, D * D, at + "wo");
    expect(l.rms_ffn, D, at + "rms_ffn");
    expect(l.w1, F * D, at + "w1");
    expect(l.w2, D * F, at + "w2");
    expect(l.w3, F * D, at + "w3");
  }
}

void Engine::setup(const ModelWeights& w, runtime::ResolvedChains chains) {
  // Weights.
  embedding_ = upload(w.token_embedding);
  rms_final_ = upload(w.rms_final);
  classifier_ = w.config.shared_classifier ? embedding_ : upload(w.classifier);
  for (const LayerWeights& l : w.layers) {
    DeviceLayer d;
    d.rms_att = upload(l.rms_att);
    d.wq = upload(l.wq);
    d.wk = upload(l.wk);
    d.wv = upload(l.wv);
    if (config_.qkv_bias) {
      d.bq = upload(l.bq);
      d.bk = upload(l.bk);
      d.bv = upload(l.bv);
    }
    d.wo = upload(l.wo);
    d.rms_ffn = upload(l.rms_ffn);
    d.w1 = upload(l.w1);
    d.w2 = upload(l.w2);
    d.w3 = upload(l.w3);
    layers_.push_back(d);
  }

  // One store for every layer, sized for max_batch sequences of max_seq_len tokens.
  need_pre_q_ = (chains.needs & SIEVE_NEEDS_PRE_ROPE_Q) != 0;
  need_pre_k_ = (chains.needs & SIEVE_NEEDS_PRE_ROPE_K) != 0;
  kv_api_ = options_.device.device_type == kDLCUDA ? kv::paged_cuda_store_api() : kv::paged_cpu_store_api();
  require(kv_api_ != nullptr, SIEVE_ERR_UNSUPPORTED, "model: this build has no CUDA KV store");
  sieve_kv_config kc{};
  kc.hdr = SIEVE_HEADER_INIT(sieve_kv_config);
  kc.geometry = geometry_;
  const int64_t pages = int64_t(options_.max_batch) * ((int64_t(geometry_.max_seq_len) + options_.page_size - 1) /
                                                      options_.page_size);
  require(pages <= INT32_MAX, SIEVE_ERR_CAPACITY,
          "model: " + std::to_string(options_.max_batch) + " sequences of " + std::to_string(geometry_.max_seq_len) +
              " tokens need " + std::to_string(pages) + " KV pages per layer, more than int32 page ids can name");
  kc.pages_per_layer = int32_t(pages);
  kc.keep_pre_rope_k = need_pre_k_ ? 1 : 0;
  std::string reason;
  sieve_reason_sink sink{&reason, [](void* c, const char* m) { *static_cast<std::string*>(c) = m ? m : ""; }};
  if (sieve_status st = kv_api_->create(services_->table(), &kc, &kv_, sink); st != SIEVE_OK)
    fail(st, "KV store '" + std::string(kv_api_->name) + "': " + reason);

  runtime::LayerRunner::Options ro;
  ro.check = options_.check;
  ro.record_selections = options_.record_selections;
  try {
    runner_ = std::make_unique<runtime::LayerRunner>(*services_, geometry_, kv_, kv_api_, std::move(chains), ro);
  } catch (...) {
    kv_api_->destroy(kv_);
    kv_ = nullptr;
    throw;
  }
}

Engine::~Engine() {
  runner_.reset();  // instances go before the store they registered sidecars in
  if (kv_) kv_api_->destroy(kv_);
  for (Buffer* b : {&x_, &xb_, &q_, &k_, &v_, &q_pre_, &k_pre_, &att_, &h1_, &h3_, &tok_, &pos_, &qo_, &last_,
                    &xlast_, &logits_})
    if (b->ptr) ops_->free(b->ptr);
  for (void* p : weight_ptrs_) ops_->free(p);
}

float* Engine::upload(const std::vector<float>& v) {
  void* p = ops_->alloc(v.size() * 4);
  weight_ptrs_.push_back(p);
  ops_->to_device(p, v.data(), v.size() * 4);
  return static_cast<float*>(p);
}

void Engine::ensure(Buffer& b, size_t bytes) {
  if (b.bytes >= bytes) return;
  const size_t grown = std::max(bytes, b.bytes * 2);
  if (b.ptr) ops_->free(b.ptr);
  b.ptr = nullptr;
  b.bytes = 0;
  b.ptr = ops_->alloc(grown);
  b.bytes = grown;
}

int32_t Engine::add_sequence() {
  require(int32_t(seq_pos_.size()) < options_.max_batch, SIEVE_ERR_CAPACITY,
          "model: " + std::to_string(seq_pos_.size()) + " sequences already, max_batch is " +
              std::to_string(options_.max_batch));
  int32_t id = -1;
  if (sieve_status st = kv_api_->add_sequence(kv_, &id); st != SIEVE_OK)
    fail(st, "KV store add_sequence: " + std::string(kv_api_->last_error(kv_)));
  seq_pos_[id] = 0;
  return id;
}

void Engine::remove_sequence(int32_t seq) {
  auto it = seq_pos_.find(seq);
  require(it != seq_pos_.end(), SIEVE_ERR_NOT_FOUND, "model: no sequence " + std::to_string(seq));
  kv_api_->remove_sequence(kv_, seq);
  seq_pos_.erase(it);
}

int32_t Engine::seq_len(int32_t seq) const {
  auto it = seq_pos_.find(seq);
  require(it != seq_pos_.end(), SIEVE_ERR_NOT_FOUND, "model: no sequence " + std::to_string(seq));
  return it->second;
}

int32_t Engine::resident_tokens(int32_t layer, int32_t seq) const {
  int32_t len = 0;
  if (sieve_status st = kv_api_->seq_len(kv_, layer, seq, &len); st != SIEVE_OK)
    fail(st, "KV store seq_len: " + std::string(kv_api_->last_error(kv_)));
  return len;
}

uint64_t Engine::kv_bytes() const {
  uint64_t b = 0;
  kv_api_->bytes_in_use(kv_, &b);
  return b;
}

void Engine::prefill(std::span<const int32_t> seq_ids, const std::vector<std::vector<int32_t>>& tokens,
                     std::vector<float>* logits) {
  require(seq_ids.size() == tokens.size(), SIEVE_ERR_INVALID_ARGUMENT,
          "prefill: " + std::to_string(seq_ids.size()) + " sequences but " + std::to_string(tokens.size()) +
              " token lists");
  std::vector<int32_t> qo(1, 0), flat, positions;
  for (size_t b = 0; b < seq_ids.size(); ++b) {
    require(!tokens[b].empty(), SIEVE_ERR_INVALID_ARGUMENT, "prefill: sequence " + std::to_string(seq_ids[b]) +
                                                               " has no token");
    const int32_t start = seq_len(seq_ids[b]);
    for (size_t i = 0; i < tokens[b].size(); ++i) {
      flat.push_back(tokens[b][i]);
      positions.push_back(start + int32_t(i));
    }
    qo.push_back(int32_t(flat.size()));
  }
  forward(SIEVE_PHASE_PREFILL, seq_ids, qo, flat, positions, logits);
}

void Engine::decode(std::span<const int32_t> seq_ids, std::span<const int32_t> tokens, std::vector<float>* logits) {
  require(seq_ids.size() == tokens.size(), SIEVE_ERR_INVALID_ARGUMENT,
          "decode: " + std::to_string(seq_ids.size()) + " sequences but " + std::to_string(tokens.size()) + " tokens");
  std::vector<int32_t> qo(seq_ids.size() + 1), flat(tokens.begin(), tokens.end()), positions;
  for (size_t b = 0; b < seq_ids.size(); ++b) {
    qo[b + 1] = int32_t(b + 1);
    positions.push_back(seq_len(seq_ids[b]));
  }
  ++step_;
  forward(SIEVE_PHASE_DECODE, seq_ids, qo, flat, positions, logits);
}

void Engine::forward(uint32_t phase, std::span<const int32_t> seq_ids, const std::vector<int32_t>& qo,
                     const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions,
                     std::vector<float>* logits) {
  const int32_t batch = int32_t(seq_ids.size());
  const int32_t n = int32_t(tokens.size());
  require(batch >= 1 && batch <= options_.max_batch, SIEVE_ERR_INVALID_ARGUMENT,
          "model: a call of " + std::to_string(batch) + " sequences (max_batch " + std::to_string(options_.max_batch) +
              ")");
  for (int32_t b = 0; b < batch; ++b) {
    for (int32_t c = 0; c < b; ++c)
      require(seq_ids[size_t(c)] != seq_ids[size_t(b)], SIEVE_ERR_INVALID_ARGUMENT,
              "model: sequence " + std::to_string(seq_ids[size_t(b)]) + " listed twice in one call");
    const int32_t end = seq_len(seq_ids[size_t(b)]) + qo[size_t(b) + 1] - qo[size_t(b)];
    require(end <= geometry_.max_seq_len, SIEVE_ERR_CAPACITY,
            "model: sequence " + std::to_string(seq_ids[size_t(b)]) + " would reach " + std::to_string(end) +
                " tokens, more than max_seq_len " + std::to_string(geometry_.max_seq_len));
  }
  for (int32_t t : tokens)
    require(t >= 0 && t < config_.vocab_size, SIEVE_ERR_INVALID_ARGUMENT,
            "model: token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                std::to_string(config_.vocab_size) + ")");

  const int32_t D = config_.dim, KV = config_.kv_dim(), F = config_.hidden_dim, V = config_.vocab_size;
  const int32_t hq = config_.n_heads, hkv = config_.n_kv_heads, hd = config_.head_dim();
  const size_t N = size_t(n);
  ensure(x_, N * D * 4);
  ensure(xb_, N * D * 4);
  ensure(q_, N * D * 4);
  ensure(k_, N * KV * 4);
  ensure(v_, N * KV * 4);
  ensure(att_, N * D * 4);
  ensure(h1_, N * F * 4);
  ensure(h3_, N * F * 4);
  ensure(tok_, N * 4);
  ensure(pos_, N * 4);
  ensure(qo_, size_t(batch + 1) * 4);
  ensure(last_, size_t(batch) * 4);
  ensure(xlast_, size_t(batch) * D * 4);
  ensure(logits_, size_t(batch) * V * 4);
  if (need_pre_q_) ensure(q_pre_, N * D * 4);
  if (need_pre_k_) ensure(k_pre_, N * KV * 4);
  auto f = [](Buffer& b) { return static_cast<float*>(b.ptr); };
  auto i32 = [](Buffer& b) { return static_cast<int32_t*>(b.ptr); };

  ops_->to_device(tok_.ptr, tokens.data(), N * 4);
  ops_->to_device(pos_.ptr, positions.data(), N * 4);
  ops_->to_device(qo_.ptr, qo.data(), qo.size() * 4);
  std::vector<int32_t> last(static_cast<size_t>(batch));
  for (int32_t b = 0; b < batch; ++b) last[size_t(b)] = qo[size_t(b) + 1] - 1;
  ops_->to_device(last_.ptr, last.data(), last.size() * 4);

  const DLDevice dev = options_.device;
  int64_t q_shape[3] = {n, hq, hd}, kv_shape[3] = {n, hkv, hd}, qo_shape[1] = {batch + 1};
  DLTensor tq = make_view(q_.ptr, dev, kF32, 3, q_shape), tk = make_view(k_.ptr, dev, kF32, 3, kv_shape),
           tv = make_view(v_.ptr, dev, kF32, 3, kv_shape), tatt = make_view(att_.ptr, dev, kF32, 3, q_shape),
           tqo = make_view(qo_.ptr, dev, kI32, 1, qo_shape), tq_pre{}, tk_pre{};
  if (need_pre_q_) tq_pre = make_view(q_pre_.ptr, dev, kF32, 3, q_shape);
  if (need_pre_k_) tk_pre = make_view(k_pre_.ptr, dev, kF32, 3, kv_shape);

  runtime::LayerInputs in;
  in.phase = phase;
  in.step = phase == SIEVE_PHASE_DECODE ? step_ : 0;
  in.batch = batch;
  in.seq_ids = seq_ids.data();
  in.qo_indptr_host = qo.data();
  in.qo_indptr = &tqo;
  in.positions_host = positions.data();
  in.q = &tq;
  in.q_pre_rope = need_pre_q_ ? &tq_pre : nullptr;
  in.k = &tk;
  in.v = &tv;
  in.k_pre_rope = need_pre_k_ ? &tk_pre : nullptr;

  ops_->embed(i32(tok_), n, embedding_, D, f(x_));
  for (int32_t L = 0; L < config_.n_layers; ++L) {
    const DeviceLayer& w = layers_[size_t(L)];
    ops_->rmsnorm(f(x_), w.rms_att, n, D, config_.norm_eps, f(xb_));
    ops_->matmul(f(xb_), n, D, w.wq, D, w.bq, f(q_), false);
    ops_->matmul(f(xb_), n, D, w.wk, KV, w.bk, f(k_), false);
    ops_->matmul(f(xb_), n, D, w.wv, KV, w.bv, f(v_), false);
    if (need_pre_q_) ops_->copy(q_pre_.ptr, q_.ptr, N * D * 4);
    if (need_pre_k_) ops_->copy(k_pre_.ptr, k_.ptr, N * KV * 4);
    ops_->rope(f(q_), n, hq, hd, i32(pos_), config_.rope_theta);
    ops_->rope(f(k_), n, hkv, hd, i32(pos_), config_.rope_theta);

    in.layer = L;
    std::string error;
    if (sieve_status st = runner_->run_layer(in, &tatt, &error); st != SIEVE_OK) fail(st, error);
    if (probe_) {
      LayerProbe p;
      p.layer = L;
      p.phase = phase;
      p.step = in.step;
      p.batch = batch;
      p.seq_ids = seq_ids.data();
      p.qo_indptr_host = qo.data();
      p.positions_host = positions.data();
      p.q = &tq;
      p.out = &tatt;
      p.kv = kv_;
      p.kv_api = kv_api_;
      p.services = services_.get();
      p.runner = runner_.get();
      probe_(p);
    }

    ops_->matmul(f(att_), n, D, w.wo, D, nullptr, f(x_), true);
    ops_->rmsnorm(f(x_), w.rms_ffn, n, D, config_.norm_eps, f(xb_));
    ops_->matmul(f(xb_), n, D, w.w1, F, nullptr, f(h1_), false);
    ops_->matmul(f(xb_), n, D, w.w3, F, nullptr, f(h3_), false);
    ops_->swiglu(f(h1_), f(h3_), int64_t(n) * F);
    ops_->matmul(f(h1_), n, F, w.w2, D, nullptr, f(x_), true);
  }
  std::string error;
  if (sieve_status st = runner_->end_step(phase, in.step, seq_ids.data(), batch, &error); st != SIEVE_OK)
    fail(st, error);
  for (int32_t b = 0; b < batch; ++b) seq_pos_[seq_ids[size_t(b)]] += qo[size_t(b) + 1] - qo[size_t(b)];

  ops_->gather_rows(f(x_), i32(last_), batch, D, f(xlast_));
  ops_->rmsnorm(f(xlast_), rms_final_, batch, D, config_.norm_eps, f(xb_));
  ops_->matmul(f(xb_), batch, D, classifier_, V, nullptr, f(logits_), false);
  logits->resize(size_t(batch) * V);
  ops_->to_host(logits->data(), logits_.ptr, logits->size() * 4);
}

}  // namespace sieve::model
