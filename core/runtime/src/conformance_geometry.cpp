// What conformance runs a policy on: the geometry its descriptor declares, and the --geometry
// text that replaces fields of it.
#include <cstdlib>

#include "sieve/runtime/conformance.hpp"

namespace sieve::runtime {

// A geometry the descriptor declares it supports.
sieve_geometry declared_geometry(const sieve_policy_descriptor& d) {
  sieve_geometry g{};
  g.hdr = SIEVE_HEADER_INIT(sieve_geometry);
  g.n_layers = 4;
  g.n_q_heads = 8;
  g.n_kv_heads = 2;
  g.head_dim = d.n_head_dims ? d.head_dims[0] : 128;
  for (uint32_t i = 0; i < d.n_head_dims; ++i)  // prefer a common size when several are listed
    if (d.head_dims[i] == 128) g.head_dim = 128;
  g.page_size = d.n_page_sizes ? d.page_sizes[0] : 16;
  for (uint32_t i = 0; i < d.n_page_sizes; ++i)
    if (d.page_sizes[i] == 16) g.page_size = 16;
  g.max_batch = 4;
  g.max_seq_len = 4096;
  g.kv_dtype = (d.dtypes & SIEVE_DTYPE_F32)   ? DLDataType{kDLFloat, 32, 1}
               : (d.dtypes & SIEVE_DTYPE_F16) ? DLDataType{kDLFloat, 16, 1}
                                              : DLDataType{kDLBfloat, 16, 1};
  g.device = (d.devices & SIEVE_DEVICE_CPU) ? DLDevice{kDLCPU, 0} : DLDevice{kDLCUDA, 0};
  g.rope_theta = 10000.f;
  g.rope_dim = g.head_dim;
  return g;
}

sieve_geometry declared_geometry(const sieve_policy_descriptor& d, const GeometryOverride& o) {
  sieve_geometry g = declared_geometry(d);
  if (o.n_q_heads) g.n_q_heads = o.n_q_heads;
  if (o.n_kv_heads) g.n_kv_heads = o.n_kv_heads;
  if (o.head_dim) g.head_dim = g.rope_dim = o.head_dim;
  if (o.page_size) g.page_size = o.page_size;
  if (o.kv_dtype.bits) g.kv_dtype = o.kv_dtype;
  if (o.n_layers) g.n_layers = o.n_layers;
  return g;
}

bool parse_geometry_override(const std::string& text, GeometryOverride* out, std::string* error) {
  GeometryOverride g;
  auto bad = [&](const std::string& m) {
    if (error) *error = "--geometry '" + text + "': " + m;
    return false;
  };
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    start = comma == std::string::npos ? text.size() + 1 : comma + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos) return bad("'" + item + "' is not key=value");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "dtype") {
      if (value == "f32") g.kv_dtype = DLDataType{kDLFloat, 32, 1};
      else if (value == "f16") g.kv_dtype = DLDataType{kDLFloat, 16, 1};
      else if (value == "bf16") g.kv_dtype = DLDataType{kDLBfloat, 16, 1};
      else return bad("dtype '" + value + "': allowed are f32, f16, bf16");
      continue;
    }
    int32_t* field = key == "hq" ? &g.n_q_heads : key == "hkv" ? &g.n_kv_heads : key == "d" ? &g.head_dim
                   : key == "page" ? &g.page_size : key == "layers" ? &g.n_layers : nullptr;
    if (!field) return bad("unknown key '" + key + "': allowed are hq, hkv, d, page, dtype, layers");
    char* end = nullptr;
    const long v = std::strtol(value.c_str(), &end, 10);
    if (value.empty() || *end || v < 1 || v > 65536) return bad(key + " = '" + value + "': an integer in [1, 65536]");
    *field = int32_t(v);
  }
  if (g.n_q_heads && g.n_kv_heads && g.n_q_heads % g.n_kv_heads)
    return bad("hq " + std::to_string(g.n_q_heads) + " is not a multiple of hkv " + std::to_string(g.n_kv_heads));
  *out = g;
  return true;
}

}  // namespace sieve::runtime
