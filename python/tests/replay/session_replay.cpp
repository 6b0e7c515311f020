// sieve_session_replay: the C++ side of the Python binding's tests. It reads a trace of session
// calls that the Python tests recorded (python/tests/replay.py: geometry, chain, every attend with
// its q/k/v bytes, sequence ids, qo_indptr and positions, every end_step) and makes the same calls
// from C++ on tensors it builds itself, writing each attend's output, so the tests can compare the
// outputs of the session Python drove with a session driven without Python, DLPack or ctypes.
//
//   sieve_session_replay TRACE_DIR PLUGIN_DIR      (reads trace.json + data.bin, writes out.bin)
#include <sieve/host.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sieve/runtime/host_services.hpp"

namespace {

using nlohmann::json;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "sieve_session_replay: %s\n", what.c_str());
  std::exit(1);
}

DLDataType dtype_of(const std::string& name) {
  if (name == "float32") return {kDLFloat, 32, 1};
  if (name == "float16") return {kDLFloat, 16, 1};
  if (name == "bfloat16") return {kDLBfloat, 16, 1};
  die("unknown dtype " + name);
}

// One [rows, heads, head_dim] tensor, on the host or uploaded to the session's device.
struct Tensor {
  std::vector<char> host;
  int64_t shape[3];
  DLTensor t{};
  sieve::runtime::HostServices* device = nullptr;
  Tensor(const char* bytes, int64_t rows, int64_t heads, int64_t dim, DLDataType dt, sieve::runtime::HostServices* dev)
      : host(bytes, bytes + rows * heads * dim * dt.bits / 8), shape{rows, heads, dim}, device(dev) {
    t.ndim = 3;
    t.shape = shape;
    t.dtype = dt;
    t.device = {kDLCPU, 0};
    t.data = host.data();
    if (device) {
      const auto* s = device->table();
      t.device = device->device();
      t.data = s->alloc(s->host_ctx, t.device, host.size(), 256);
      std::string err;
      if (!t.data || !device->copy(t.data, t.device, host.data(), {kDLCPU, 0}, host.size(), &err)) die("upload: " + err);
    }
  }
  Tensor(const Tensor&) = delete;
  ~Tensor() {
    if (device) device->table()->free(device->table()->host_ctx, t.device, t.data);
  }
  const char* download() {
    std::string err;
    if (device && !device->copy(host.data(), {kDLCPU, 0}, t.data, t.device, host.size(), &err)) die("download: " + err);
    return host.data();
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) die("usage: sieve_session_replay TRACE_DIR PLUGIN_DIR");
  const std::string dir = argv[1];
  std::ifstream jf(dir + "/trace.json"), df(dir + "/data.bin", std::ios::binary);
  if (!jf || !df) die("cannot read " + dir + "/trace.json and data.bin");
  const json trace = json::parse(jf);
  const std::vector<char> data((std::istreambuf_iterator<char>(df)), std::istreambuf_iterator<char>());

  sieve_runtime_options ro{};
  ro.hdr = SIEVE_HEADER_INIT(sieve_runtime_options);
  ro.flags = SIEVE_RUNTIME_NO_ENV | SIEVE_RUNTIME_NO_DEFAULT_DIRS;
  sieve_runtime* rt = nullptr;
  if (sieve_runtime_create(&ro, &rt) != SIEVE_OK) die("runtime_create failed");
  if (sieve_runtime_add_plugin_dir(rt, argv[2]) != SIEVE_OK) die(sieve_runtime_last_error(rt));
  const json& g = trace["geometry"];
  sieve_geometry geo{};
  geo.hdr = SIEVE_HEADER_INIT(sieve_geometry);
  geo.n_layers = g["n_layers"], geo.n_q_heads = g["n_q_heads"], geo.n_kv_heads = g["n_kv_heads"];
  geo.head_dim = g["head_dim"], geo.page_size = g["page_size"], geo.max_batch = g["max_batch"];
  geo.max_seq_len = g["max_seq_len"], geo.rope_theta = g["rope_theta"], geo.rope_dim = g["rope_dim"];
  geo.kv_dtype = dtype_of(g["dtype"]);
  geo.device = {g["device_type"].get<int>() == kDLCUDA ? kDLCUDA : kDLCPU, g["device_id"].get<int32_t>()};
  sieve_chain* chain = nullptr;
  const std::string chain_text = trace["chain"];
  if (!chain_text.empty() && sieve_chain_parse(rt, chain_text.c_str(), &chain) != SIEVE_OK)
    die(sieve_runtime_last_error(rt));
  sieve_session_options so{};
  so.hdr = SIEVE_HEADER_INIT(sieve_session_options);
  so.check = trace["check"];
  sieve_session* s = nullptr;
  if (sieve_session_create(rt, &geo, chain, &so, &s) != SIEVE_OK) die(sieve_runtime_last_error(rt));
  sieve_chain_destroy(chain);
  std::unique_ptr<sieve::runtime::HostServices> device;
  if (geo.device.device_type == kDLCUDA) device = std::make_unique<sieve::runtime::HostServices>(geo.device);

  std::vector<int32_t> seq(trace["sequences"].get<size_t>());
  for (int32_t& id : seq)
    if (sieve_session_add_sequence(s, &id) != SIEVE_OK) die(sieve_session_last_error(s));
  std::ofstream out(dir + "/out.bin", std::ios::binary);
  for (const json& c : trace["calls"]) {
    std::vector<int32_t> ids;
    for (int i : c["seq"]) ids.push_back(seq.at(size_t(i)));
    const uint32_t phase = c["phase"];
    if (c["op"] == "end_step") {
      if (sieve_session_end_step(s, phase, ids.data(), int32_t(ids.size())) != SIEVE_OK) die(sieve_session_last_error(s));
      continue;
    }
    const std::vector<int32_t> qo = c["qo"];
    std::vector<int32_t> positions;
    if (!c["positions"].is_null()) positions = c["positions"].get<std::vector<int32_t>>();
    const int64_t rows = qo.back();
    const size_t at = c["offset"];
    const size_t q_bytes = size_t(rows * geo.n_q_heads * geo.head_dim * geo.kv_dtype.bits / 8);
    const size_t kv_bytes = size_t(rows * geo.n_kv_heads * geo.head_dim * geo.kv_dtype.bits / 8);
    if (at + q_bytes + 2 * kv_bytes > data.size()) die("data.bin is shorter than the trace says");
    Tensor q(&data[at], rows, geo.n_q_heads, geo.head_dim, geo.kv_dtype, device.get());
    Tensor k(&data[at + q_bytes], rows, geo.n_kv_heads, geo.head_dim, geo.kv_dtype, device.get());
    Tensor v(&data[at + q_bytes + kv_bytes], rows, geo.n_kv_heads, geo.head_dim, geo.kv_dtype, device.get());
    Tensor o(&data[at], rows, geo.n_q_heads, geo.head_dim, geo.kv_dtype, device.get());  // overwritten
    sieve_layer_inputs in{};
    in.hdr = SIEVE_HEADER_INIT(sieve_layer_inputs);
    in.layer = c["layer"], in.phase = phase, in.batch = int32_t(ids.size());
    in.seq_ids = ids.data(), in.qo_indptr = qo.data(), in.positions = positions.empty() ? nullptr : positions.data();
    in.q = &q.t, in.k = &k.t, in.v = &v.t;
    if (sieve_session_attend(s, &in, &o.t) != SIEVE_OK) die(sieve_session_last_error(s));
    if (sieve_session_synchronize(s) != SIEVE_OK) die(sieve_session_last_error(s));
    out.write(o.download(), std::streamsize(o.host.size()));
  }
  sieve_session_destroy(s);
  sieve_runtime_destroy(rt);
  return out ? 0 : 1;
}
