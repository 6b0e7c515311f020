// The suite's summary table, targets and JSON (see report.hpp).
#include "report.hpp"

#include <algorithm>
#include <cmath>

namespace sieve::bench {
namespace {

// The case of this shape and sparsity with the default kernel and options.
const CaseResult* find(const Report& r, const std::string& shape, double sparsity, Backend backend) {
  for (const auto& x : r.results)
    if (x.ran && x.c.shape == shape && std::abs(x.c.sparsity - sparsity) < 1e-9 && x.c.backend == backend &&
        x.c.tensor_cores && !x.c.cpu_portable && !x.c.kv_splits && !x.c.split_min_keys)
      return &x;
  return nullptr;
}

double gbs(const CaseResult& x) { return x.work.bytes() / (x.t.median_ms * 1e-3) / 1e9; }

// Median and range of a set of values (all 0 when empty).
struct Spread {
  double median = 0, min = 0, max = 0;
};
Spread spread(std::vector<double> v) {
  Spread s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  s.min = v.front();
  s.max = v.back();
  return s;
}
// Sample i's GB/s over the ceiling measured right before it (Adjacent), over the samples.
Spread adjacent_fraction(const CaseResult& x, const std::vector<double>& ceiling_gbs) {
  std::vector<double> f;
  for (size_t i = 0; i < x.adjacent.ms.size() && i < ceiling_gbs.size(); ++i)
    if (x.adjacent.ms[i] > 0 && ceiling_gbs[i] > 0)
      f.push_back(x.work.bytes() / (x.adjacent.ms[i] * 1e-3) / 1e9 / ceiling_gbs[i]);
  return spread(std::move(f));
}
// A CPU decode case's fraction of memcpy: against the copies beside its samples where it has
// them, else against the process-start memcpy.
double copy_fraction(const Report& r, const CaseResult& x) {
  if (!x.adjacent.empty()) return adjacent_fraction(x, x.adjacent.copy_gbs).median;
  return r.ceilings.host_copy_gbs > 0 ? gbs(x) / r.ceilings.host_copy_gbs : 0;
}
double tflops(const CaseResult& x) { return x.work.flops / (x.t.median_ms * 1e-3) / 1e12; }

// Speedup of x over the dense tensor-core case of its shape (0 when there is none).
double vs_dense(const Report& r, const CaseResult& x) {
  const CaseResult* d = find(r, x.c.shape, 0, x.c.backend);
  return d && d != &x ? d->t.median_ms / x.t.median_ms : 0;
}
// SDPA's time over ours (> 1: ours is faster), 0 when SDPA did not run this shape.
double vs_sdpa(const Report& r, const CaseResult& x) {
  if (!x.c.dense() || x.c.backend != Backend::kCuda) return 0;
  auto it = r.sdpa.find(x.c.shape);
  return it == r.sdpa.end() || it->second.best_ms <= 0 ? 0 : it->second.best_ms / x.t.median_ms;
}
// The bandwidth a case's bytes are measured against: on the GPU the read-only stream (decode
// reads K/V and writes next to nothing; a copy also writes, so it runs slower than a read), on the
// CPU memcpy.
double floor_gbs(const Report& r, const CaseResult& x) {
  return x.c.backend == Backend::kCuda ? r.ceilings.read_gbs : r.ceilings.host_copy_gbs;
}
// Measured time over the time to move its bytes at bandwidth `bw` (decode).
double vs_floor(const CaseResult& x, double bw) {
  return bw > 0 ? x.t.median_ms * 1e-3 / (x.work.bytes() / (bw * 1e9)) : 0;
}
double vs_floor(const Report& r, const CaseResult& x) {
  if (x.c.backend == Backend::kCpu && !x.adjacent.empty()) {  // against the memcpy beside each sample
    const double f = copy_fraction(r, x);
    return f > 0 ? 1 / f : 0;
  }
  return vs_floor(x, floor_gbs(r, x));
}

struct Target {
  std::string name, criterion, measured, where;
  bool evaluated = false, met = false;
};

template <class... A>
std::string fmt(const char* f, A... a) {
  char buf[512];
  std::snprintf(buf, sizeof buf, f, a...);
  return buf;
}

std::vector<Target> targets(const Report& r) {
  std::vector<Target> t;
  const std::string head = "decode/64q8kv128/bs16/ctx32768/bf16";
  {
    Target x{"dense decode at the bandwidth limit", ">= 80% of measured copy bandwidth", "", "gpu/" + head + "/dense"};
    if (const CaseResult* d = find(r, head, 0, Backend::kCuda); d && r.ceilings.copy_gbs > 0) {
      const double f = gbs(*d) / r.ceilings.copy_gbs;
      x.evaluated = true;
      x.met = f >= 0.8;
      x.measured = fmt("%.0f GB/s = %.1f%% of %.0f GB/s", gbs(*d), 100 * f, r.ceilings.copy_gbs) +
                   fmt(" (%.1f%% of the read-only %.0f GB/s)", r.ceilings.read_gbs > 0 ? 100 * gbs(*d) / r.ceilings.read_gbs : 0,
                       r.ceilings.read_gbs);
    }
    t.push_back(x);
  }
  {
    Target a{"block-sparse decode speedup at 90% sparsity", ">= 8x our dense decode, same run", "", "gpu/" + head + "/sparse0.90"};
    Target b{"block-sparse decode at the bytes-read limit", "time <= 1.2x (bytes read / copy bandwidth)", "", a.where};
    const CaseResult* d = find(r, head, 0, Backend::kCuda);
    const CaseResult* s = find(r, head, 0.9, Backend::kCuda);
    if (d && s) {
      a.evaluated = true;
      a.met = vs_dense(r, *s) >= 8;
      a.measured = fmt("%.2fx (%.1f us vs %.1f us)", vs_dense(r, *s), s->t.median_ms * 1e3, d->t.median_ms * 1e3);
      b.evaluated = r.ceilings.copy_gbs > 0;
      b.met = vs_floor(*s, r.ceilings.copy_gbs) <= 1.2;
      b.measured = fmt("%.2fx of %.1f us (%.0f MB read)", vs_floor(*s, r.ceilings.copy_gbs),
                       s->work.bytes() / (r.ceilings.copy_gbs * 1e9) * 1e6, s->work.bytes() / 1e6);
    }
    t.push_back(a);
    t.push_back(b);
  }
  for (const auto& x : r.results) {  // dense decode vs SDPA (issue 20), each shape
    if (!x.ran || x.c.prefill() || !x.c.dense() || x.c.backend != Backend::kCuda || !x.c.tensor_cores ||
        x.c.kv_splits || x.c.split_min_keys)
      continue;
    const double want = x.c.batch >= 16 ? 1.0 : 0.9;
    Target p{"dense decode vs PyTorch SDPA", fmt(">= %.1fx SDPA's speed (best backend)", want), "", x.c.name};
    if (double v = vs_sdpa(r, x); v > 0) {
      p.evaluated = true;
      p.met = v >= want;
      p.measured = fmt("%.2fx (%.1f us vs SDPA %.1f us)", v, x.t.median_ms * 1e3, r.sdpa.at(x.c.shape).best_ms * 1e3);
    }
    t.push_back(p);
    if (x.c.batch < 16) continue;
    Target q{"dense decode at the read bandwidth", ">= 90% of the measured read-only bandwidth", "", x.c.name};
    if (r.ceilings.read_gbs > 0) {
      const double f = gbs(x) / r.ceilings.read_gbs;
      q.evaluated = true;
      q.met = f >= 0.9;
      q.measured = fmt("%.0f GB/s = %.1f%% of %.0f GB/s", gbs(x), 100 * f, r.ceilings.read_gbs);
    }
    t.push_back(q);
  }
  for (const auto& x : r.results) {  // dense prefill vs SDPA, each shape
    if (!x.ran || !x.c.prefill() || !x.c.dense() || x.c.backend != Backend::kCuda || !x.c.tensor_cores) continue;
    Target p{"dense prefill vs PyTorch SDPA", "time <= 1.5x SDPA's (best backend)", "", x.c.name};
    auto it = r.sdpa.find(x.c.shape);
    if (it != r.sdpa.end() && it->second.best_ms > 0) {
      const double ratio = x.t.median_ms / it->second.best_ms;
      p.evaluated = true;
      p.met = ratio <= 1.5;
      p.measured = fmt("%.2fx SDPA's time (%.2f ms vs %.2f ms", ratio, x.t.median_ms, it->second.best_ms) +
                   ", " + it->second.best_variant + "); ours " +
                   fmt("%.0f TFLOP/s = %.0f%% of the mma.sync peak", tflops(x),
                       r.ceilings.mma_sync_tflops > 0 ? 100 * tflops(x) / r.ceilings.mma_sync_tflops : 0);
    }
    t.push_back(p);
  }
  for (const auto& x : r.results) {  // block-sparse prefill proportional to the work kept
    if (!x.ran || !x.c.prefill() || x.c.dense() || x.c.backend != Backend::kCuda || !x.c.tensor_cores) continue;
    const CaseResult* d = find(r, x.c.shape, 0, Backend::kCuda);
    Target p{"block-sparse prefill proportional to tiles kept", "time fraction <= 1.25x work fraction", "", x.c.name};
    if (d) {
      const double tf = x.t.median_ms / d->t.median_ms, wf = x.work.kept;
      p.evaluated = true;
      p.met = tf <= 1.25 * wf;
      p.measured = fmt("time %.3f of dense, work %.3f (ratio %.2f)", tf, wf, tf / wf);
    }
    t.push_back(p);
  }
  // CPU dense prefill against OpenBLAS sgemm of the same process, same threads (issue 24).
  for (const auto& x : r.results) {
    if (!x.ran || x.c.backend != Backend::kCpu || !x.c.prefill() || !x.c.dense()) continue;
    const double pct = 100 * tflops(x) * 1e3 / r.ceilings.host_sgemm_gflops;
    const std::string rate = fmt("%.1f GFLOP/s = %.1f%% of sgemm %.1f GFLOP/s", tflops(x) * 1e3, pct,
                                 r.ceilings.host_sgemm_gflops);
    Target p{x.c.cpu_portable ? "CPU dense prefill, portable path (BLAS tiles)" : "CPU dense prefill vs sgemm",
             x.c.cpu_portable ? "report" : ">= 50% of OpenBLAS sgemm FLOP/s, same process", rate, x.c.name};
    p.evaluated = r.ceilings.host_sgemm_gflops > 0;
    p.met = x.c.cpu_portable || pct >= 50;
    t.push_back(p);
  }
  // CPU decode against memcpy of the same process (issue 24): dense >= 60% (f32) / 50% (bf16, f16),
  // 90% block-sparse >= 8x dense; the portable-loop baseline and other sparsities reported.
  for (const auto& x : r.results) {
    if (!x.ran || x.c.backend != Backend::kCpu || x.c.prefill()) continue;
    const double pct = 100 * copy_fraction(r, x);
    std::string bw;
    if (!x.adjacent.empty()) {
      const Spread fc = adjacent_fraction(x, x.adjacent.copy_gbs), fr = adjacent_fraction(x, x.adjacent.read_gbs);
      const Spread c = spread(x.adjacent.copy_gbs), rd = spread(x.adjacent.read_gbs);
      bw = fmt("%.1f GB/s = %.1f%% of the memcpy beside each sample (%.1f-%.1f%% over %zu samples; memcpy "
               "%.1f-%.1f GB/s), %.0f%% of read-only (%.0f-%.0f%%; read-only %.1f-%.1f GB/s)",
               gbs(x), pct, 100 * fc.min, 100 * fc.max, x.adjacent.ms.size(), c.min, c.max, 100 * fr.median,
               100 * fr.min, 100 * fr.max, rd.min, rd.max);
    } else {
      bw = fmt("%.1f GB/s = %.1f%% of memcpy %.1f GB/s", gbs(x), pct, r.ceilings.host_copy_gbs);
    }
    if (r.ceilings.host_paged_read_gbs > 0)
      bw += fmt(", %.0f%% of paged read-only %.1f at start", 100 * gbs(x) / r.ceilings.host_paged_read_gbs,
                r.ceilings.host_paged_read_gbs);
    if (x.c.dense() && !x.c.cpu_portable) {
      const double want = x.c.dtype.bits == 32 ? 60 : 50;
      Target p{"CPU dense decode at the memory floor", fmt(">= %.0f%% of memcpy, measured beside each sample", want), bw, x.c.name};
      p.evaluated = r.ceilings.host_copy_gbs > 0;
      p.met = pct >= want;
      t.push_back(p);
    } else if (std::abs(x.c.sparsity - 0.9) < 1e-9) {
      Target p{"CPU block-sparse decode speedup at 90% sparsity", ">= 8x dense decode, same run", "", x.c.name};
      p.evaluated = vs_dense(r, x) > 0;
      p.met = vs_dense(r, x) >= 8;
      p.measured = fmt("%.2fx; ", vs_dense(r, x)) + bw;
      t.push_back(p);
    } else {
      Target p{"CPU decode bytes/s vs memcpy", "report", bw, x.c.name};
      p.evaluated = r.ceilings.host_copy_gbs > 0;
      p.met = true;
      t.push_back(p);
    }
  }
  return t;
}

}  // namespace

std::string merge_sdpa(Report& report, const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("results") || !j["results"].is_object())
    return "SDPA output has no \"results\" object";
  report.sdpa_meta = j.value("meta", nlohmann::json::object());
  for (const auto& [shape, entry] : j["results"].items()) {
    SdpaEntry e;
    e.variants = entry.value("variants", nlohmann::json::object());
    for (const auto& [name, v] : e.variants.items()) {
      if (!v.is_object() || !v.contains("ms") || !v["ms"].is_number()) continue;
      const double ms = v["ms"].get<double>();
      if (ms > 0 && (e.best_ms == 0 || ms < e.best_ms)) {
        e.best_ms = ms;
        e.best_variant = name;
      }
    }
    report.sdpa[shape] = e;
  }
  return {};
}

void print_summary(const Report& r, std::FILE* f) {
  std::fprintf(f, "\n== Sieve attention benchmark, %s\n", r.date.c_str());
  if (!r.ceilings.device.empty())
    std::fprintf(f,
                 "GPU %s (%d SMs, L2 %.0f MB): read %.0f GB/s (16-byte loads; bulk-copy engine %.0f; 2 CTAs/SM "
                 "reading 4 KB of every 32 KB %.0f, contiguous %.0f), copy %.0f GB/s (read+write), bf16 GEMM %.0f "
                 "TFLOP/s (cuBLAS), mma.sync bf16 %.0f TFLOP/s (register-only loop)\n",
                 r.ceilings.device.c_str(), r.ceilings.sm_count, r.ceilings.l2_bytes / 1e6, r.ceilings.read_gbs,
                 r.ceilings.bulk_read_gbs, r.ceilings.paged8_read_gbs, r.ceilings.paged1_read_gbs, r.ceilings.copy_gbs,
                 r.ceilings.mma_tflops, r.ceilings.mma_sync_tflops);
  if (r.ceilings.graph_launch_us > 0)
    std::fprintf(f, "GPU: an empty kernel of %d CTAs replayed back to back from a CUDA graph: %.2f us per launch, "
                 "%.2f us as programmatic dependent launches\n",
                 2 * r.ceilings.sm_count, r.ceilings.graph_launch_us, r.ceilings.graph_launch_pdl_us);
  if (r.ceilings.host_copy_gbs > 0)
    std::fprintf(f, "CPU %s, %d threads: at the start memcpy %.1f GB/s (read+write), read-only %.1f GB/s sequential, "
                 "%.1f GB/s 4 KiB slabs of scattered pages; each decode sample's %%copy / %%read is against the "
                 "memcpy / read-only stream measured right before it\n",
                 r.ceilings.host_cpu.c_str(), r.ceilings.host_threads, r.ceilings.host_copy_gbs,
                 r.ceilings.host_read_gbs, r.ceilings.host_paged_read_gbs);
  if (r.ceilings.host_sgemm_gflops > 0)
    std::fprintf(f, "CPU: OpenBLAS sgemm %.1f GFLOP/s (3072^3, %d threads)\n", r.ceilings.host_sgemm_gflops,
                 r.ceilings.host_threads);
  std::fprintf(f, "%-58s %-11s %4s %10s %8s %6s %6s %8s %6s %7s %7s %6s\n", "case", "kernel", "spl", "median_us",
               "GB/s", "%read", "%copy", "TFLOP/s", "%mma", "xdense", "xSDPA", "floor");
  for (const auto& x : r.results) {
    if (!x.ran) {
      std::fprintf(f, "%-58s FAILED: %s\n", x.c.name.c_str(), x.error.c_str());
      continue;
    }
    const bool gpu = x.c.backend == Backend::kCuda;
    // CPU decode: the medians of each sample against the ceilings measured beside it
    const double rd = gpu ? (r.ceilings.read_gbs > 0 ? 100 * gbs(x) / r.ceilings.read_gbs : 0)
                          : !x.adjacent.empty() ? 100 * adjacent_fraction(x, x.adjacent.read_gbs).median : 0;
    const double bw = gpu ? r.ceilings.copy_gbs : r.ceilings.host_copy_gbs;
    const double cp = !gpu && !x.c.prefill() ? 100 * copy_fraction(r, x) : bw > 0 ? 100 * gbs(x) / bw : 0;
    const double dn = vs_dense(r, x), sd = vs_sdpa(r, x), fl = x.c.prefill() ? 0 : vs_floor(r, x);
    std::fprintf(f, "%-58s %-11s %4d %10.1f %8.0f %6s %5.1f%% %8.1f %5.1f%% %7s %7s %6s\n", x.c.name.c_str(),
                 x.kernel.c_str(), x.splits, x.t.median_ms * 1e3, gbs(x),
                 rd > 0 ? fmt("%.1f%%", rd).c_str() : "-", cp,
                 tflops(x), gpu && r.ceilings.mma_tflops > 0 ? 100 * tflops(x) / r.ceilings.mma_tflops
                 : !gpu && x.c.prefill() && r.ceilings.host_sgemm_gflops > 0
                     ? 1e5 * tflops(x) / r.ceilings.host_sgemm_gflops  // CPU prefill: % of sgemm
                     : 0,
                 dn > 0 ? fmt("%.2fx", dn).c_str() : "-", sd > 0 ? fmt("%.2fx", sd).c_str() : "-",
                 fl > 0 ? fmt("%.2f", fl).c_str() : "-");
  }
  if (!r.sdpa.empty()) {
    std::fprintf(f, "\nPyTorch SDPA (%s), fastest variant per shape:\n",
                 r.sdpa_meta.value("torch", std::string("?")).c_str());
    for (const auto& [shape, e] : r.sdpa)
      std::fprintf(f, "  %-44s %10.1f us  %s\n", shape.c_str(), e.best_ms * 1e3, e.best_variant.c_str());
  }
  std::fprintf(f, "\nTargets (issues 4, 20 and 24):\n");
  for (const Target& t : targets(r)) {
    if (t.criterion == "report") {
      std::fprintf(f, "  [info]    %s: %s (%s)\n", t.name.c_str(), t.measured.c_str(), t.where.c_str());
      continue;
    }
    std::fprintf(f, "  [%s] %s (%s): %s  [%s]\n", !t.evaluated ? "not run" : t.met ? "MET    " : "NOT MET",
                 t.name.c_str(), t.criterion.c_str(), t.evaluated ? t.measured.c_str() : "-", t.where.c_str());
  }
}

nlohmann::json report_json(const Report& r) {
  nlohmann::json j;
  j["date"] = r.date;
  j["command"] = r.command;
  j["ceilings"] = {{"gpu", r.ceilings.device},
                   {"sm_count", r.ceilings.sm_count},
                   {"l2_bytes", r.ceilings.l2_bytes},
                   {"read_gbs", r.ceilings.read_gbs},
                   {"bulk_read_gbs", r.ceilings.bulk_read_gbs},
                   {"paged8_read_gbs", r.ceilings.paged8_read_gbs},
                   {"paged1_read_gbs", r.ceilings.paged1_read_gbs},
                   {"copy_gbs", r.ceilings.copy_gbs},
                   {"bf16_gemm_tflops", r.ceilings.mma_tflops},
                   {"mma_sync_bf16_tflops", r.ceilings.mma_sync_tflops},
                   {"graph_launch_us", r.ceilings.graph_launch_us},
                   {"graph_launch_pdl_us", r.ceilings.graph_launch_pdl_us},
                   {"host_cpu", r.ceilings.host_cpu},
                   {"host_copy_gbs", r.ceilings.host_copy_gbs},
                   {"host_read_gbs", r.ceilings.host_read_gbs},
                   {"host_paged_read_gbs", r.ceilings.host_paged_read_gbs},
                   {"host_threads", r.ceilings.host_threads},
                   {"host_sgemm_gflops", r.ceilings.host_sgemm_gflops}};
  j["cases"] = nlohmann::json::array();
  for (const auto& x : r.results) {
    nlohmann::json c = {{"name", x.c.name},
                        {"shape", x.c.shape},
                        {"backend", x.c.backend == Backend::kCuda ? "cuda" : "cpu"},
                        {"phase", x.c.prefill() ? "prefill" : "decode"},
                        {"n_q_heads", x.c.hq},
                        {"n_kv_heads", x.c.hkv},
                        {"head_dim", x.c.d},
                        {"batch", x.c.batch},
                        {"context", x.c.ctx},
                        {"dtype", dtype_name(x.c.dtype)},
                        {"sparsity", x.c.sparsity},
                        {"tensor_cores", x.c.tensor_cores},
                        {"cpu_portable", x.c.cpu_portable},
                        {"ok", x.ran}};
    if (!x.ran) {
      c["error"] = x.error;
    } else {
      c["kernel"] = x.kernel;
      c["kv_splits"] = x.splits;
      if (!x.merge.empty()) c["merge"] = x.merge;
      c["median_ms"] = x.t.median_ms;
      c["min_ms"] = x.t.min_ms;
      c["max_ms"] = x.t.max_ms;
      c["samples"] = x.t.samples;
      c["calls_per_sample"] = x.t.calls_per_sample;
      c["bytes"] = x.work.bytes();
      c["flops"] = x.work.flops;
      c["work_kept"] = x.work.kept;
      c["gbs"] = gbs(x);
      c["tflops"] = tflops(x);
      if (x.c.backend == Backend::kCpu && x.c.prefill() && r.ceilings.host_sgemm_gflops > 0)
        c["fraction_of_sgemm"] = tflops(x) * 1e3 / r.ceilings.host_sgemm_gflops;
      if (!x.adjacent.empty()) {  // CPU decode: each sample against the ceilings measured beside it
        auto js = [](const Spread& v) { return nlohmann::json{{"median", v.median}, {"min", v.min}, {"max", v.max}}; };
        c["adjacent"] = {{"samples", x.adjacent.ms.size()},
                         {"copy_gbs", js(spread(x.adjacent.copy_gbs))},
                         {"read_gbs", js(spread(x.adjacent.read_gbs))},
                         {"fraction_of_copy", js(adjacent_fraction(x, x.adjacent.copy_gbs))},
                         {"fraction_of_read", js(adjacent_fraction(x, x.adjacent.read_gbs))}};
      }
      if (x.c.backend == Backend::kCpu && !x.c.prefill() && r.ceilings.host_read_gbs > 0) {
        c["fraction_of_host_read"] = gbs(x) / r.ceilings.host_read_gbs;
        c["fraction_of_host_paged_read"] = gbs(x) / r.ceilings.host_paged_read_gbs;
      }
      if (double v = vs_dense(r, x); v > 0) c["speedup_vs_dense"] = v;
      if (double v = vs_sdpa(r, x); v > 0) c["speedup_vs_sdpa"] = v;
      if (!x.c.prefill()) {
        c["time_over_bytes_floor"] = vs_floor(r, x);  // GPU: read-only bandwidth; CPU: memcpy
        if (x.c.backend == Backend::kCuda) c["time_over_copy_floor"] = vs_floor(x, r.ceilings.copy_gbs);
      }
    }
    j["cases"].push_back(c);
  }
  j["sdpa"] = nlohmann::json::object();
  for (const auto& [shape, e] : r.sdpa)
    j["sdpa"][shape] = {{"best_ms", e.best_ms}, {"best_variant", e.best_variant}, {"variants", e.variants}};
  j["sdpa_meta"] = r.sdpa_meta;
  j["targets"] = nlohmann::json::array();
  for (const Target& t : targets(r))
    j["targets"].push_back({{"target", t.name},
                            {"criterion", t.criterion},
                            {"case", t.where},
                            {"evaluated", t.evaluated},
                            {"met", t.met},
                            {"measured", t.measured}});
  return j;
}

}  // namespace sieve::bench
