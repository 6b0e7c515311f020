// deltakv_fidelity: Delta-KV's output error on synthetic long contexts with realistic adjacent-key
// similarity (reference/long_context.hpp), CPU, against the f64 dense reference.
//
// One prefill call: a sequence of --tokens keys, its last --queries tokens are the queries (the
// last chunk of a long prefill: a long compressed history before the critical diagonal). For
// every --run (a deltakv parameter list, "threshold=0.83,q_block=64"), prints one JSON line:
//   {"method":"deltakv","params":..,"kv_reduction":..,"out_rel_err":..,"row_rel_err_p50":..,
//    "row_rel_err_max":..}
// out_rel_err = ‖o − o_dense‖ / ‖o_dense‖ over all rows and heads; row_rel_err = the same per
// (query, head) row. kv_reduction = 1 − anchors / keys over the KV heads (the plugin's metric).
// A run may say reduction=match: it then takes the kv_reduction of the last delta-packing run (the
// paper's "at matched KV reduction" baselines: packing=periodic|random after a delta run).
//
// usage: deltakv_fidelity --plugin PATH [--tokens 4096] [--queries 512] [--q-heads 8]
//          [--kv-heads 2] [--d 128] [--seed 1] [--key-adjacent-cos 0.88] --run 'k=v,...' ...
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "sieve/reference/attention_ref.hpp"
#include "sieve/reference/long_context.hpp"
#include "sieve/reference/workload.hpp"
#include "sieve/runtime/host_services.hpp"
#include "sieve/runtime/loader.hpp"
#include "sieve/runtime/params.hpp"

namespace {

using sieve::runtime::ParamPairs;

bool split_params(const std::string& text, ParamPairs* out) {
  size_t i = 0;
  while (i < text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    const std::string item = text.substr(i, j - i);
    const size_t eq = item.find('=');
    if (eq == std::string::npos) return false;
    out->emplace_back(item.substr(0, eq), item.substr(eq + 1));
    i = j + 1;
  }
  return true;
}

int fail(const std::string& m) {
  std::fprintf(stderr, "deltakv_fidelity: %s\n", m.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string plugin;
  int32_t tokens = 4096, queries = 512, hq = 8, hkv = 2, d = 128;
  uint64_t seed = 1;
  double key_adjacent_cos = -1;
  std::vector<std::string> runs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return fail("option " + a + " needs a value");
    const std::string v = argv[++i];
    if (a == "--plugin") plugin = v;
    else if (a == "--tokens") tokens = std::atoi(v.c_str());
    else if (a == "--queries") queries = std::atoi(v.c_str());
    else if (a == "--q-heads") hq = std::atoi(v.c_str());
    else if (a == "--kv-heads") hkv = std::atoi(v.c_str());
    else if (a == "--d") d = std::atoi(v.c_str());
    else if (a == "--seed") seed = std::strtoull(v.c_str(), nullptr, 10);
    else if (a == "--key-adjacent-cos") key_adjacent_cos = std::atof(v.c_str());
    else if (a == "--run") runs.push_back(v);
    else return fail("unknown option " + a);
  }
  if (plugin.empty() || runs.empty()) return fail("--plugin PATH and at least one --run are required");
  if (tokens < 1 || queries < 1 || queries > tokens || hq < 1 || hkv < 1 || hq % hkv || d < 1)
    return fail("need 1 <= queries <= tokens, q-heads a multiple of kv-heads, d >= 1");

  sieve::runtime::LoadedPlugin lp;
  std::string error;
  if (!sieve::runtime::load_plugin(plugin, &lp, &error)) return fail(error);
  const sieve_policy_api* api = lp.policy();
  if (!api) return fail(plugin + " has no policy table");

  sieve::reference::WorkloadSpec ws;
  ws.n_q_heads = hq;
  ws.n_kv_heads = hkv;
  ws.head_dim = d;
  ws.page_size = 16;
  ws.phase = SIEVE_PHASE_PREFILL;
  ws.kv_lens = {tokens};
  ws.n_new = {queries};
  ws.seed = seed;
  sieve::reference::Workload w(ws);
  sieve::reference::LongContextSpec ls;
  ls.seed = seed;
  if (key_adjacent_cos > 0) ls.key_adjacent_cos = key_adjacent_cos;
  sieve::reference::fill_workload(w, ls);
  const std::vector<double> dense = sieve::reference::attend_reference(w.args).out;

  sieve_geometry g{};
  g.hdr = SIEVE_HEADER_INIT(sieve_geometry);
  g.n_layers = 1;
  g.n_q_heads = hq;
  g.n_kv_heads = hkv;
  g.head_dim = d;
  g.page_size = ws.page_size;
  g.max_batch = 1;
  g.max_seq_len = tokens;
  g.kv_dtype = sieve::kF32;
  g.device = sieve::kCpu;
  g.rope_theta = 10000.f;
  g.rope_dim = d;
  sieve::runtime::HostServices host(sieve::kCpu);
  const sieve::runtime::ParamSchema schema = sieve::runtime::ParamSchema::of(*api);

  double last_reduction = -1;
  for (const std::string& run : runs) {
    ParamPairs pairs;
    if (!split_params(run, &pairs)) return fail("--run '" + run + "' is not k=v,k=v");
    for (auto& [k, v] : pairs)
      if (k == "reduction" && v == "match") {
        if (last_reduction < 0) return fail("reduction=match needs an earlier run");
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.4f", std::min(0.999, last_reduction));
        v = buf;
      }
    sieve::runtime::ParamValues values;
    std::vector<std::string> errors;
    if (!sieve::runtime::parse_params(schema, pairs, &values, &errors, "deltakv"))
      return fail(errors.empty() ? "bad parameters" : errors.front());
    sieve_policy* p = nullptr;
    std::string err;
    sieve_reason_sink sink{&err, [](void* c, const char* m) { *static_cast<std::string*>(c) += m; }};
    if (api->create(host.table(), &g, values.data(), values.size(), nullptr, nullptr, &p, sink) != SIEVE_OK)
      return fail(err);
    std::vector<int32_t> seq_ids = {0};
    sieve_layer_call c{};
    c.hdr = SIEVE_HEADER_INIT(sieve_layer_call);
    c.layer = 0;
    c.phase = SIEVE_PHASE_PREFILL;
    c.batch = 1;
    c.seq_ids = seq_ids.data();
    c.qo_indptr = &w.qo_indptr.dl();
    c.qo_indptr_host = w.qo_indptr.data<int32_t>();
    c.kv_len_host = w.kv_len.data();
    c.q = &w.q.dl();
    c.geometry = &g;
    c.kv_view = &w.kv;
    sieve_selection sel{};
    sel.hdr = SIEVE_HEADER_INIT(sieve_selection);
    host.clear_metrics();
    if (api->attend(p, &c, &sel, &w.out.dl()) != SIEVE_OK) {
      const std::string m = api->last_error(p);
      api->destroy(p);
      return fail(m);
    }
    api->destroy(p);
    // Reports: one per KV head and one for the layer (the heads' mean, as every head has n keys).
    double reduction = -1;
    for (const auto& [name, m] : host.metrics())
      if (name == "kv_reduction") reduction = m.mean();
    double num = 0, den = 0;
    std::vector<double> rows;
    for (int64_t r = 0; r < int64_t(queries) * hq; ++r) {
      double rn = 0, rd = 0;
      for (int32_t i = 0; i < d; ++i) {
        const double o = w.out.get(r * d + i), e = dense[size_t(r * d + i)];
        rn += (o - e) * (o - e);
        rd += e * e;
      }
      num += rn;
      den += rd;
      rows.push_back(rd > 0 ? std::sqrt(rn / rd) : 0.0);
    }
    std::sort(rows.begin(), rows.end());
    std::printf("{\"method\":\"deltakv\",\"params\":\"%s\",\"tokens\":%d,\"queries\":%d,\"q_heads\":%d,"
                "\"kv_heads\":%d,\"head_dim\":%d,\"seed\":%llu,\"kv_reduction\":%.4f,\"out_rel_err\":%.5f,"
                "\"row_rel_err_p50\":%.5f,\"row_rel_err_p90\":%.5f,\"row_rel_err_max\":%.5f}\n",
                run.c_str(), tokens, queries, hq, hkv, d, (unsigned long long)seed, reduction,
                std::sqrt(num / den), rows[rows.size() / 2], rows[rows.size() * 9 / 10], rows.back());
    std::fflush(stdout);
    const bool delta = run.find("packing=") == std::string::npos || run.find("packing=delta") != std::string::npos;
    if (delta) last_reduction = reduction;
  }
  return 0;
}
