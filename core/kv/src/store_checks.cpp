// The argument checks shared by the core's stores.
#include "sieve/kv/store_checks.hpp"

#include "sieve/util/dtype_dispatch.hpp"
#include "sieve/util/error.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::kv {

std::string config_problem(const sieve_kv_config& c) {
  const auto& g = c.geometry;
  if (g.hdr.struct_size < sizeof(sieve_geometry)) return "geometry struct is older than v1.0";
  if (g.n_layers <= 0) return "n_layers must be > 0, got " + std::to_string(g.n_layers);
  if (g.n_kv_heads <= 0) return "n_kv_heads must be > 0, got " + std::to_string(g.n_kv_heads);
  if (g.head_dim <= 0) return "head_dim must be > 0, got " + std::to_string(g.head_dim);
  if (g.page_size != 16 && g.page_size != 32 && g.page_size != 64)
    return "page_size must be 16, 32 or 64, got " + std::to_string(g.page_size);
  if (!is_float_storage(g.kv_dtype))
    return "kv_dtype must be f32, f16 or bf16, got " + dtype_name(g.kv_dtype);
  if (c.pages_per_layer <= 0)
    return "pages_per_layer must be > 0, got " + std::to_string(c.pages_per_layer);
  return {};
}

void check_append(const sieve_kv_append& a, const sieve_kv_config& config, DLDevice device) {
  const auto& g = config.geometry;
  if (a.hdr.struct_size < sizeof(sieve_kv_append))
    fail(SIEVE_ERR_VERSION, "append: argument struct older than v1.0");
  if (a.layer < 0 || a.layer >= g.n_layers)
    fail(SIEVE_ERR_NOT_FOUND, "layer " + std::to_string(a.layer) + " out of range (store has " +
                                  std::to_string(g.n_layers) + " layers)");
  if (a.batch < 0) fail(SIEVE_ERR_INVALID_ARGUMENT, "append: negative batch");
  if (a.batch > 0 && (!a.seq_ids || !a.token_indptr))
    fail(SIEVE_ERR_INVALID_ARGUMENT, "append: seq_ids / token_indptr is null");
  const int64_t n_tokens = a.batch ? a.token_indptr[a.batch] : 0;
  auto check = [&](const DLTensor* t, const char* what, bool optional) {
    if (optional && !t) return;
    std::string p = check_tensor(t, what, 3, {n_tokens, g.n_kv_heads, g.head_dim});
    if (!p.empty()) fail(SIEVE_ERR_INVALID_ARGUMENT, "append: " + p);
    if (!storage_of(t->dtype))
      fail(SIEVE_ERR_INVALID_ARGUMENT, "append: " + unsupported_dtype_message(what, t->dtype));
    if (t->device.device_type != device.device_type)
      fail(SIEVE_ERR_INVALID_ARGUMENT, std::string("append: ") + what + " is on " + device_name(t->device) +
                                           ", the store is on " + device_name(device));
    if (stride(*t, 2) != 1)
      fail(SIEVE_ERR_INVALID_ARGUMENT, std::string("append: ") + what + " must be unit-stride along head_dim");
  };
  if (n_tokens > 0) {
    check(a.k, "k", false);
    check(a.v, "v", false);
    check(a.k_pre_rope, "k_pre_rope", true);
    if (config.keep_pre_rope_k && !a.k_pre_rope)
      fail(SIEVE_ERR_INVALID_ARGUMENT, "append: this store keeps pre-RoPE keys, k_pre_rope is required");
  }
  for (int32_t b = 0; b < a.batch; ++b) {
    if (a.token_indptr[b] > a.token_indptr[b + 1] || a.token_indptr[0] != 0)
      fail(SIEVE_ERR_INVALID_ARGUMENT, "append: token_indptr is not non-decreasing from 0");
    for (int32_t c = 0; c < b; ++c)
      if (a.seq_ids[c] == a.seq_ids[b])
        fail(SIEVE_ERR_INVALID_ARGUMENT, "append: sequence " + std::to_string(a.seq_ids[b]) + " listed twice");
  }
}

Sidecar checked_sidecar(const sieve_sidecar_desc& d, const std::vector<Sidecar>& registered, int32_t n_kv_heads) {
  require(d.hdr.struct_size >= sizeof(sieve_sidecar_desc), SIEVE_ERR_VERSION,
          "register_sidecar: descriptor struct older than v1.0");
  require(d.name && *d.name, SIEVE_ERR_INVALID_ARGUMENT, "register_sidecar: empty name");
  require(d.elems_per_head > 0, SIEVE_ERR_INVALID_ARGUMENT,
          std::string("register_sidecar '") + d.name + "': elems_per_head must be > 0");
  require(d.dtype.bits % 8 == 0 && d.dtype.bits > 0 && d.dtype.lanes == 1,
          SIEVE_ERR_INVALID_ARGUMENT, std::string("register_sidecar '") + d.name + "': bad dtype");
  for (const auto& s : registered)
    require(s.name != d.name, SIEVE_ERR_INVALID_ARGUMENT,
            std::string("register_sidecar: '") + d.name + "' is already registered");
  return Sidecar{d.name, d.dtype, d.elems_per_head, size_t(n_kv_heads) * d.elems_per_head * dtype_bytes(d.dtype)};
}

size_t sidecar_bytes_per_page(const std::vector<Sidecar>& registered) {
  size_t side = 0;
  for (const auto& sc : registered) side += sc.bytes_per_page;
  return side;
}

std::vector<char> evict_marks(int32_t layer, int32_t seq, int32_t np, const int32_t* logical, int32_t n) {
  require(n >= 0 && (n == 0 || logical), SIEVE_ERR_INVALID_ARGUMENT, "evict: null page list");
  std::vector<char> mark(size_t(np), 0);
  for (int32_t i = 0; i < n; ++i) {
    int32_t p = logical[i];
    require(p >= 0 && p < np, SIEVE_ERR_INVALID_ARGUMENT,
            "evict: page " + std::to_string(p) + " out of range (sequence " + std::to_string(seq) +
                " has " + std::to_string(np) + " pages in layer " + std::to_string(layer) + ")");
    require(p != np - 1, SIEVE_ERR_INVALID_ARGUMENT,
            "evict: page " + std::to_string(p) + " is the sequence's last page (appends continue there)");
    require(!mark[p], SIEVE_ERR_INVALID_ARGUMENT, "evict: page " + std::to_string(p) + " listed twice");
    mark[p] = 1;
  }
  return mark;
}

}  // namespace sieve::kv
