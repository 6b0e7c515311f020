#include "sieve/model/engine.hpp"

#include <algorithm>

#include "ops.hpp"
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

  // One store for every layer, sized for max_batch sequences of max_seq_len tokens (the default).
  need_pre_q_ = (chains.needs & SIEVE_NEEDS_PRE_ROPE_Q) != 0;
  need_pre_k_ = (chains.needs & SIEVE_NEEDS_PRE_ROPE_K) != 0;
  runtime::Session::Options so;
  so.runner.check = options_.check;
  so.runner.record_selections = options_.record_selections;
  try {
    session_ = std::make_unique<runtime::Session>(*services_, geometry_, std::move(chains), so);
  } catch (const Error& e) {
    fail(e.status(), std::string("model: ") + e.what());
  }
}

Engine::~Engine() {
  session_.reset();  // instances, store, plugins (session.hpp)
  for (util::GrowBuffer* b : {&x_, &xb_, &q_, &k_, &v_, &q_pre_, &k_pre_, &att_, &h1_, &h3_, &tok_, &pos_, &qo_,
                              &last_, &xlast_, &logits_})
    b->release(*ops_);
  for (void* p : weight_ptrs_) ops_->free(p);
}

float* Engine::upload(const std::vector<float>& v) {
  void* p = ops_->alloc(v.size() * 4);
  weight_ptrs_.push_back(p);
  ops_->to_device(p, v.data(), v.size() * 4);
  return static_cast<float*>(p);
}

int32_t Engine::add_sequence() {
  require(int32_t(seq_pos_.size()) < options_.max_batch, SIEVE_ERR_CAPACITY,
          "model: " + std::to_string(seq_pos_.size()) + " sequences already, max_batch is " +
              std::to_string(options_.max_batch));
  const int32_t id = session_->add_sequence();
  seq_pos_[id] = 0;
  return id;
}

void Engine::remove_sequence(int32_t seq) {
  auto it = seq_pos_.find(seq);
  require(it != seq_pos_.end(), SIEVE_ERR_NOT_FOUND, "model: no sequence " + std::to_string(seq));
  session_->remove_sequence(seq);
  seq_pos_.erase(it);
}

int32_t Engine::seq_len(int32_t seq) const {
  auto it = seq_pos_.find(seq);
  require(it != seq_pos_.end(), SIEVE_ERR_NOT_FOUND, "model: no sequence " + std::to_string(seq));
  return it->second;
}

int32_t Engine::resident_tokens(int32_t layer, int32_t seq) const {
  return session_->seq_len(layer, seq);
}

uint64_t Engine::kv_bytes() const {
  return session_->bytes_in_use();
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

// The tensors one call's layers read and write (views over the activation buffers) and the
// LayerInputs the runtime sees; valid until the next call.
struct Engine::CallViews {
  int64_t q_shape[3], kv_shape[3], qo_shape[1];
  DLTensor q{}, k{}, v{}, att{}, qo{}, q_pre{}, k_pre{};
  runtime::LayerInputs in;
};

void Engine::check_call(std::span<const int32_t> seq_ids, const std::vector<int32_t>& qo,
                        const std::vector<int32_t>& tokens) const {
  const int32_t batch = int32_t(seq_ids.size());
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
}

void Engine::ensure_activations(int32_t n, int32_t batch) {
  const int32_t D = config_.dim, KV = config_.kv_dim(), F = config_.hidden_dim, V = config_.vocab_size;
  const size_t N = size_t(n);
  x_.ensure(*ops_, N * D * 4);
  xb_.ensure(*ops_, N * D * 4);
  q_.ensure(*ops_, N * D * 4);
  k_.ensure(*ops_, N * KV * 4);
  v_.ensure(*ops_, N * KV * 4);
  att_.ensure(*ops_, N * D * 4);
  h1_.ensure(*ops_, N * F * 4);
  h3_.ensure(*ops_, N * F * 4);
  tok_.ensure(*ops_, N * 4);
  pos_.ensure(*ops_, N * 4);
  qo_.ensure(*ops_, size_t(batch + 1) * 4);
  last_.ensure(*ops_, size_t(batch) * 4);
  xlast_.ensure(*ops_, size_t(batch) * D * 4);
  logits_.ensure(*ops_, size_t(batch) * V * 4);
  if (need_pre_q_) q_pre_.ensure(*ops_, N * D * 4);
  if (need_pre_k_) k_pre_.ensure(*ops_, N * KV * 4);
}

void Engine::upload_call(uint32_t phase, std::span<const int32_t> seq_ids, const std::vector<int32_t>& qo,
                         const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions, CallViews* v) {
  const int32_t batch = int32_t(seq_ids.size()), n = int32_t(tokens.size());
  const int32_t hq = config_.n_heads, hkv = config_.n_kv_heads, hd = config_.head_dim();
  const size_t N = size_t(n);
  ops_->to_device(tok_.get(), tokens.data(), N * 4);
  ops_->to_device(pos_.get(), positions.data(), N * 4);
  ops_->to_device(qo_.get(), qo.data(), qo.size() * 4);
  std::vector<int32_t> last(static_cast<size_t>(batch));
  for (int32_t b = 0; b < batch; ++b) last[size_t(b)] = qo[size_t(b) + 1] - 1;
  ops_->to_device(last_.get(), last.data(), last.size() * 4);

  const DLDevice dev = options_.device;
  v->q_shape[0] = n, v->q_shape[1] = hq, v->q_shape[2] = hd;
  v->kv_shape[0] = n, v->kv_shape[1] = hkv, v->kv_shape[2] = hd;
  v->qo_shape[0] = batch + 1;
  v->q = make_view(q_.get(), dev, kF32, 3, v->q_shape);
  v->k = make_view(k_.get(), dev, kF32, 3, v->kv_shape);
  v->v = make_view(v_.get(), dev, kF32, 3, v->kv_shape);
  v->att = make_view(att_.get(), dev, kF32, 3, v->q_shape);
  v->qo = make_view(qo_.get(), dev, kI32, 1, v->qo_shape);
  if (need_pre_q_) v->q_pre = make_view(q_pre_.get(), dev, kF32, 3, v->q_shape);
  if (need_pre_k_) v->k_pre = make_view(k_pre_.get(), dev, kF32, 3, v->kv_shape);

  runtime::LayerInputs& in = v->in;
  in.phase = phase;
  in.step = phase == SIEVE_PHASE_DECODE ? step_ : 0;
  in.batch = batch;
  in.seq_ids = seq_ids.data();
  in.qo_indptr_host = qo.data();
  in.qo_indptr = &v->qo;
  in.positions_host = positions.data();
  in.q = &v->q;
  in.q_pre_rope = need_pre_q_ ? &v->q_pre : nullptr;
  in.k = &v->k;
  in.v = &v->v;
  in.k_pre_rope = need_pre_k_ ? &v->k_pre : nullptr;
}

// x -> q, k, v (RoPE'd), attention through the layer's chain into att_, then x += att Wo^T.
void Engine::attention_block(int32_t L, CallViews& v) {
  const DeviceLayer& w = layers_[size_t(L)];
  const int32_t D = config_.dim, KV = config_.kv_dim();
  const int32_t hq = config_.n_heads, hkv = config_.n_kv_heads, hd = config_.head_dim();
  const int32_t n = int32_t(v.q_shape[0]);
  const size_t N = size_t(n);
  float* x = x_.as<float>();
  float* xb = xb_.as<float>();
  ops_->rmsnorm(x, w.rms_att, n, D, config_.norm_eps, xb);
  ops_->matmul(xb, n, D, w.wq, D, w.bq, q_.as<float>(), false);
  ops_->matmul(xb, n, D, w.wk, KV, w.bk, k_.as<float>(), false);
  ops_->matmul(xb, n, D, w.wv, KV, w.bv, v_.as<float>(), false);
  if (need_pre_q_) ops_->copy(q_pre_.get(), q_.get(), N * D * 4);
  if (need_pre_k_) ops_->copy(k_pre_.get(), k_.get(), N * KV * 4);
  ops_->rope(q_.as<float>(), n, hq, hd, pos_.as<int32_t>(), config_.rope_theta);
  ops_->rope(k_.as<float>(), n, hkv, hd, pos_.as<int32_t>(), config_.rope_theta);

  runtime::LayerInputs& in = v.in;
  in.layer = L;
  std::string error;
  if (sieve_status st = session_->runner().run_layer(in, &v.att, &error); st != SIEVE_OK) fail(st, error);
  if (probe_) {
    LayerProbe p;
    p.layer = L;
    p.phase = in.phase;
    p.step = in.step;
    p.batch = in.batch;
    p.seq_ids = in.seq_ids;
    p.qo_indptr_host = in.qo_indptr_host;
    p.positions_host = in.positions_host;
    p.q = &v.q;
    p.out = &v.att;
    p.kv = session_->store();
    p.kv_api = session_->store_api();
    p.services = services_.get();
    p.runner = &session_->runner();
    probe_(p);
  }
  ops_->matmul(att_.as<float>(), n, D, w.wo, D, nullptr, x, true);
}

// x += (silu(RMSNorm(x) W1^T) * (RMSNorm(x) W3^T)) W2^T
void Engine::ffn_block(int32_t L, int32_t n) {
  const DeviceLayer& w = layers_[size_t(L)];
  const int32_t D = config_.dim, F = config_.hidden_dim;
  float* x = x_.as<float>();
  float* xb = xb_.as<float>();
  ops_->rmsnorm(x, w.rms_ffn, n, D, config_.norm_eps, xb);
  ops_->matmul(xb, n, D, w.w1, F, nullptr, h1_.as<float>(), false);
  ops_->matmul(xb, n, D, w.w3, F, nullptr, h3_.as<float>(), false);
  ops_->swiglu(h1_.as<float>(), h3_.as<float>(), int64_t(n) * F);
  ops_->matmul(h1_.as<float>(), n, F, w.w2, D, nullptr, x, true);
}

// logits = RMSNorm(x_last) rms_final E^T for the last token of each sequence.
void Engine::last_token_logits(int32_t batch, std::vector<float>* logits) {
  const int32_t D = config_.dim, V = config_.vocab_size;
  ops_->gather_rows(x_.as<float>(), last_.as<int32_t>(), batch, D, xlast_.as<float>());
  ops_->rmsnorm(xlast_.as<float>(), rms_final_, batch, D, config_.norm_eps, xb_.as<float>());
  ops_->matmul(xb_.as<float>(), batch, D, classifier_, V, nullptr, logits_.as<float>(), false);
  logits->resize(size_t(batch) * V);
  ops_->to_host(logits->data(), logits_.get(), logits->size() * 4);
}

void Engine::forward(uint32_t phase, std::span<const int32_t> seq_ids, const std::vector<int32_t>& qo,
                     const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions,
                     std::vector<float>* logits) {
  check_call(seq_ids, qo, tokens);
  const int32_t batch = int32_t(seq_ids.size()), n = int32_t(tokens.size());
  ensure_activations(n, batch);
  CallViews views;
  upload_call(phase, seq_ids, qo, tokens, positions, &views);

  ops_->embed(tok_.as<int32_t>(), n, embedding_, config_.dim, x_.as<float>());
  for (int32_t L = 0; L < config_.n_layers; ++L) {
    attention_block(L, views);
    ffn_block(L, n);
  }
  std::string error;
  if (sieve_status st = session_->runner().end_step(phase, views.in.step, seq_ids.data(), batch, &error);
      st != SIEVE_OK)
    fail(st, error);
  for (int32_t b = 0; b < batch; ++b) seq_pos_[seq_ids[size_t(b)]] += qo[size_t(b) + 1] - qo[size_t(b)];
  last_token_logits(batch, logits);
}

}  // namespace sieve::model
