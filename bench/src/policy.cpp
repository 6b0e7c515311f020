// The policy-step benchmark (include/sieve/bench/policy.hpp, docs/bench/policy.md).
//
// Per (context, batch) and chain (dense = the empty chain first): a KV store of the device is
// created, the policies of the chain are created on it (LayerRunner), and the context enters the
// store in chunks through LayerRunner::append_only — the store's append plus the chain's on_append
// hooks (Quest min/max, RaaS stamps, ...), no attention — with the same deterministic contents for
// every chain. Then:
//   decode : warm-up + timed steps; a step = run_layer for every layer (1 new token per sequence)
//            + end_step, timed with CUDA events on the host stream (steady clock on the CPU). The
//            steps append: the store grows by one token per step (accepted; the context reported
//            is the one before the steps). Then one untimed step with the selections recorded;
//            before its end_step, the core kernel alone is timed on that step's views and
//            selections (and dense on the same views).
//   prefill: per sample a fresh store filled with ctx - new tokens, then one run_layer per layer
//            with the `new` last tokens + end_step, timed; the untimed warm-up sample records the
//            selections for the core-kernel-only time.
// With several --kv-store, each chain runs on every store in turn (same contents), and each row
// after the first store's carries its step time as a ratio of the first store's.
#include "sieve/bench/policy.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "policy_case.hpp"
#include "report.hpp"
#include "runner.hpp"

namespace sieve::bench {
namespace {

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// The options' geometry, dtype, device and key generator as the shape every case starts from;
// "" or the one-line problem.
std::string base_shape(const PolicyOptions& o, Shape* out) {
  Shape& base = *out;
  base.phase = o.phase == "prefill" ? SIEVE_PHASE_PREFILL : SIEVE_PHASE_DECODE;
  base.layers = o.layers, base.hq = o.hq, base.hkv = o.hkv, base.d = o.d, base.page = o.page;
  if (o.hq % o.hkv != 0) return "--hq " + std::to_string(o.hq) + " must be a multiple of --hkv " + std::to_string(o.hkv);
  if (o.dtype == "bf16") base.dtype = kBF16;
  else if (o.dtype == "f16") base.dtype = kF16;
  else if (o.dtype == "f32") base.dtype = kF32;
  else return "--dtype '" + o.dtype + "': bf16, f16 or f32";
  std::string device = o.device;
  if (device.empty()) device = runtime::cuda_devices() > 0 ? "cuda" : "cpu";
  if (device == "cuda") {
    if (runtime::cuda_devices() == 0) return "--device cuda: no CUDA device (or this build has no CUDA); use --device cpu";
    base.device = DLDevice{kDLCUDA, 0};
  } else if (device != "cpu") {
    return "--device '" + device + "': cuda or cpu";
  }
  if (o.keys.rfind("similar", 0) == 0) {
    base.similar = true;
    if (o.keys.size() > 7) {
      char* end = nullptr;
      if (o.keys[7] != ':') return "--keys '" + o.keys + "': random, similar or similar:COS";
      base.key_cos = std::strtod(o.keys.c_str() + 8, &end);
      if (*end || !(base.key_cos > 0 && base.key_cos < 1)) return "--keys '" + o.keys + "': the cosine must be in (0, 1)";
    }
  } else if (o.keys != "random") {
    return "--keys '" + o.keys + "': random, similar or similar:COS";
  }
  base.fill_phase = o.fill.empty() ? base.phase : uint32_t(o.fill == "prefill" ? SIEVE_PHASE_PREFILL : SIEVE_PHASE_DECODE);
  base.min_q_block = o.min_q_block;
  base.seed = o.seed;
  base.check = o.check;
  base.extra = base.decode_growth(o.warmup, o.steps);
  return {};
}

// Every sequence's similar-key context of shape `s` (one host thread per sequence: the generator
// is serial), a period of --similar-period tokens; "" or the generator's error.
std::string similar_contexts(const Shape& s, const PolicyOptions& o, std::vector<SimilarContext>* out) {
  std::vector<SimilarContext>& similar = *out;
  const auto t0 = Clock::now();
  const int32_t n = s.n_fill() + s.n_new, period = o.similar_period > 0 ? std::min(n, o.similar_period) : n;
  similar.resize(size_t(s.batch));
  std::vector<std::string> errors(size_t(s.batch));
  std::vector<std::thread> workers;
  for (int32_t b = 0; b < s.batch; ++b) {
    workers.emplace_back([&, b] {
      try {
        similar[size_t(b)] = make_similar(s, b, period);
      } catch (const std::exception& e) {
        errors[size_t(b)] = e.what();
      }
    });
    if (int(workers.size()) >= std::max(1, host_threads()) || b + 1 == s.batch) {
      for (auto& w : workers) w.join();
      workers.clear();
    }
  }
  for (const auto& e : errors)
    if (!e.empty()) return e;
  std::fprintf(stderr, "similar-key context for ctx %d x batch %d generated in %.1f s\n", s.ctx, s.batch,
               std::chrono::duration<double>(Clock::now() - t0).count());
  return {};
}

// The --kv-store arguments as rows name them ("paged" when there is none).
std::vector<std::string> store_labels(const PolicyOptions& o) {
  return o.kv_stores.empty() ? std::vector<std::string>{"paged"} : o.kv_stores;
}

// --json FILE: the run's settings, then every row; false when the file cannot be written.
bool write_json(const PolicyOptions& o, const Shape& base, const std::string& device_desc, const Report& sdpa,
                const nlohmann::json& sdpa_note, const nlohmann::json& rows) {
  nlohmann::json meta = {{"benchmark", "policy_step"}, {"device", device_desc}, {"date", today_utc()},
                         {"command", o.command}, {"phase", o.phase}, {"layers", o.layers},
                         {"n_q_heads", o.hq}, {"n_kv_heads", o.hkv}, {"head_dim", o.d}, {"page_size", o.page},
                         {"dtype", o.dtype}, {"keys", o.keys},
                         {"fill_phase", base.fill_phase == SIEVE_PHASE_PREFILL ? "prefill" : "decode"},
                         {"steps", o.steps}, {"warmup", o.warmup}, {"samples", o.samples}, {"runner_checks", o.check},
                         {"decode_store_growth_tokens", base.decode_growth(o.warmup, o.steps)},
                         {"cuda_graph_steps", base.graph_steps()},
                         {"host_threads", host_threads()}, {"kv_stores", store_labels(o)},
                         {"kv_store", store_labels(o).front()}};
  if (!sdpa.sdpa_meta.empty()) meta["sdpa"] = sdpa.sdpa_meta;
  if (!sdpa_note.is_null()) meta["sdpa_note"] = sdpa_note;
  std::ofstream f(o.json_out);
  f << nlohmann::json{{"meta", meta}, {"results", rows}}.dump(2) << "\n";
  return bool(f);
}

}  // namespace

int run_policy_bench(const PolicyOptions& o) {
  auto bad = [](const std::string& m) {
    std::fprintf(stderr, "sieve_bench --policy: %s\n", m.c_str());
    return 2;
  };
  Shape base;
  if (std::string e = base_shape(o, &base); !e.empty()) return bad(e);
  // Chains: dense (empty) first, then the user's; each with every store (stores[i][c]).
  std::vector<std::pair<std::string, runtime::ChainSpec>> chains;
  chains.emplace_back("dense", runtime::ChainSpec{});
  for (const auto& text : o.chains) {
    runtime::ChainSpec cs;
    std::string error;
    if (!runtime::parse_chain_argument(text, &cs, &error)) return bad("--chain '" + text + "': " + error);
    chains.emplace_back(text, std::move(cs));
  }
  const std::vector<std::string> store_names = store_labels(o);
  std::vector<std::vector<runtime::ChainSpec>> stores(store_names.size());
  for (size_t i = 0; i < store_names.size(); ++i)
    for (const auto& [label, spec] : chains) {
      runtime::ChainSpec with_store = spec;
      std::string error;
      if (!runtime::apply_store_argument(o.kv_stores.empty() ? std::string() : store_names[i], &with_store, &error))
        return bad("--kv-store '" + store_names[i] + "': " + error);
      stores[i].push_back(std::move(with_store));
    }
  const bool side_by_side = stores.size() > 1;

  runtime::DiscoveryOptions dopt;
  dopt.plugin_dirs = o.plugin_dirs;
  runtime::Registry registry = runtime::Registry::discover(dopt);
  for (const auto& m : registry.missing_dirs()) return bad("plugin directory '" + m + "' does not exist");
  for (const auto& f : registry.failures()) std::fprintf(stderr, "sieve_bench --policy: not loaded: %s\n", f.reason.c_str());

  std::unique_ptr<HostServices> services;
  try {
    services = std::make_unique<HostServices>(base.device);
  } catch (const std::exception& e) {
    return bad(e.what());
  }
  std::string device_desc = device_name(base.device);
#ifdef SIEVE_WITH_CUDA
  if (base.device.device_type == kDLCUDA) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) device_desc = prop.name;
  }
#endif
  if (base.device.device_type == kDLCPU) device_desc = "cpu (" + std::to_string(host_threads()) + " threads)";

  std::vector<Shape> shapes;
  for (int32_t ctx : o.ctx)
    for (int32_t b : o.batch) {
      Shape s = base;
      s.ctx = ctx;
      s.batch = b;
      s.n_new = s.prefill() ? (o.new_tokens > 0 ? std::min(o.new_tokens, ctx) : ctx) : 1;
      shapes.push_back(s);
    }
  // Every chain must resolve on every store (names, parameters, phases, devices) before anything
  // runs; whether a policy fits a store is the Session's check (the row fails, naming both).
  for (size_t i = 0; i < stores.size(); ++i)
    for (size_t c = 0; c < chains.size(); ++c) {
      runtime::ResolvedChains rc;
      if (std::string e = resolve(stores[i][c], registry, geometry_of(shapes.front()), &rc); !e.empty())
        return bad(c == 0 ? "--kv-store '" + store_names[i] + "': " + e  // dense has no policy: the store's
                          : "--chain '" + chains[c].first + "'" + (side_by_side ? " on '" + store_names[i] + "'" : "") +
                                ": " + e);
    }
  auto shape_name = [&](const Shape& s) {
    return "policy/" + o.phase + "/" + std::to_string(s.hq) + "q" + std::to_string(s.hkv) + "kv" + std::to_string(s.d) +
           "/bs" + std::to_string(s.batch) + "/ctx" + std::to_string(s.ctx) + "/" + o.dtype;
  };

  // PyTorch SDPA first, in its own process (it frees the GPU when it exits).
  Report sdpa;
  nlohmann::json sdpa_note;
  if (o.sdpa) {
    if (base.device.device_type != kDLCUDA) {
      sdpa_note = "SDPA runs only with --device cuda";
    } else {
      nlohmann::json cases = nlohmann::json::array();
      for (const Shape& s : shapes)
        if (s.n_new == (s.prefill() ? s.ctx : 1))
          cases.push_back({{"shape", shape_name(s)}, {"phase", o.phase}, {"n_q_heads", s.hq}, {"n_kv_heads", s.hkv},
                           {"head_dim", s.d}, {"batch", s.batch}, {"context", s.ctx}, {"dtype", o.dtype},
                           {"samples", s.prefill() ? 5 : 15}});
      SuiteOptions so;
      so.python = o.python;
      so.sdpa_script = o.sdpa_script.empty() ? default_sdpa_script() : o.sdpa_script;
      nlohmann::json out;
      std::string err = cases.empty() ? "no shape SDPA can run (prefill with --new < ctx)" : run_sdpa_script(so, cases, &out);
      if (err.empty()) err = merge_sdpa(sdpa, out);
      if (!err.empty()) {
        std::fprintf(stderr, "sieve_bench --policy: no PyTorch SDPA column: %s\n", err.c_str());
        sdpa_note = err;
      }
    }
  }

  std::printf("== Sieve policy step, %s, %s: %s, %d layer(s), %dq/%dkv d%d, page %d, %s, keys %s, context through the %s chain's on_append\n",
              today_utc().c_str(), device_desc.c_str(), o.phase.c_str(), o.layers, o.hq, o.hkv, o.d, o.page,
              o.dtype.c_str(), o.keys.c_str(), base.fill_phase == SIEVE_PHASE_PREFILL ? "prefill" : "decode");
  std::printf("%8s %5s %-44s %10s %10s %8s %10s %10s %9s %9s %9s %10s %9s%s\n", "ctx", "batch",
              side_by_side ? "chain [store]" : "chain", "step ms", "dense ms", "x dense", "core ms", "select ms",
              "attended", "resident", "x SDPA", "graph ms", "g x SDPA",
              side_by_side ? ("  / " + store_names[0]).c_str() : "");
  nlohmann::json rows = nlohmann::json::array();
  std::vector<std::vector<double>> ratios(stores.size());  // step time / the first store's, per store
  bool failed = false;
  for (const Shape& s : shapes) {
    const double need = estimate_bytes(s, true), have = available_bytes(s.device) * o.memory_fraction;
    auto row_json = [&](const Result& r, double dense_ms) {
      nlohmann::json j = {{"phase", o.phase}, {"chain", r.chain}, {"context", s.ctx}, {"batch", s.batch},
                          {"new_tokens", s.n_new}, {"layers", s.layers}, {"n_q_heads", s.hq}, {"n_kv_heads", s.hkv},
                          {"head_dim", s.d}, {"page_size", s.page}, {"dtype", o.dtype}, {"device", device_desc},
                          {"keys", o.keys}, {"shape", shape_name(s)}};
      if (!r.skipped.empty()) j["skipped"] = r.skipped;
      if (!r.error.empty()) j["error"] = r.error;
      if (r.skipped.empty() && r.error.empty()) {
        j["step_ms"] = r.step_ms;
        j["step_min_ms"] = r.step_min_ms;
        j["step_max_ms"] = r.step_max_ms;
        j["samples"] = r.samples;
        j["dense_step_ms"] = dense_ms;
        j["speedup_vs_dense"] = dense_ms > 0 ? dense_ms / r.step_ms : 0.0;
        j["core_ms"] = r.core_ms;
        j["core_dense_ms"] = r.core_dense_ms;
        j["selection_overhead_ms"] = r.step_ms - r.core_ms;
        if (s.graph_steps()) {
          j["step_graph_ms"] = r.step_graph_ms;
          j["step_graph_max_ms"] = r.step_graph_max_ms;
          j["graph_overhead_ms"] = r.step_graph_ms - r.core_ms;
          j["graph_replays"] = r.graph_replays;
          j["graph_captures"] = r.graph_captures;
          if (!r.graph_eager_reason.empty()) j["graph_eager_reason"] = r.graph_eager_reason;
        }
        j["attended_fraction"] = r.attended;
        j["resident_fraction"] = r.resident_fraction;
        j["kv_bytes"] = r.kv_bytes;
        j["selection"] = r.selection;
        auto it = sdpa.sdpa.find(shape_name(s));
        if (it != sdpa.sdpa.end() && it->second.best_ms > 0) {
          j["sdpa_ms"] = it->second.best_ms;
          j["sdpa_variant"] = it->second.best_variant;
          j["sdpa_per_layer"] = true;
          j["speedup_vs_sdpa"] = it->second.best_ms * s.layers / r.step_ms;
          if (s.graph_steps() && r.step_graph_ms > 0)
            j["speedup_vs_sdpa_graph"] = it->second.best_ms * s.layers / r.step_graph_ms;
        }
        nlohmann::json m = nlohmann::json::object();
        for (const auto& [name, v] : r.metrics) m[name] = {{"mean", v.mean()}, {"min", v.min}, {"max", v.max}, {"count", v.count}};
        if (!m.empty()) j["metrics"] = m;
      }
      return j;
    };
    if (need > have) {
      char why[256];
      std::snprintf(why, sizeof why, "needs ~%.1f GB, %.1f GB usable on %s", need / 1e9, have / 1e9, device_desc.c_str());
      std::printf("%8d %5d %-44s skipped: %s\n", s.ctx, s.batch, "(all chains)", why);
      for (size_t i = 0; i < stores.size(); ++i)
        for (const auto& [label, spec] : chains) {
          Result r;
          r.chain = label;
          r.skipped = why;
          rows.push_back(row_json(r, 0));
          rows.back()["kv_store"] = store_names[i];
        }
      continue;
    }
    // --keys similar: every sequence's context generated once (host), shared by the chains.
    std::vector<SimilarContext> similar;
    if (s.similar)
      if (std::string e = similar_contexts(s, o, &similar); !e.empty()) return bad(std::string("--keys ") + o.keys + ": " + e);
    std::vector<double> dense_ms(stores.size(), 0.0);
    for (size_t c = 0; c < chains.size(); ++c) {
      const std::string& label = chains[c].first;
      double base_ms = 0;  // this chain's step time on the first store
      for (size_t i = 0; i < stores.size(); ++i) {
        Result r = measure(s, label, stores[i][c], registry, *services, o, s.similar ? &similar : nullptr);
        if (c == 0 && r.error.empty()) dense_ms[i] = r.step_ms;
        if (i == 0 && r.error.empty()) base_ms = r.step_ms;
        nlohmann::json j = row_json(r, dense_ms[i]);
        j["kv_store"] = store_names[i];
        double ratio = 0;
        if (i > 0 && r.error.empty() && base_ms > 0) {
          ratio = r.step_ms / base_ms;
          j["base_kv_store"] = store_names[0];
          j["base_store_step_ms"] = base_ms;
          j["step_ratio_vs_base_store"] = ratio;
          ratios[i].push_back(ratio);
        }
        rows.push_back(j);
        // The store stays readable: the chain's text gives way when the column is full.
        const std::string tag = side_by_side ? " [" + store_names[i] + "]" : "";
        const size_t room = tag.size() < 30 ? 44 - tag.size() : 14;
        const std::string shown = (label.size() > room ? label.substr(0, room - 3) + "..." : label) + tag;
        if (!r.error.empty()) {
          failed = true;
          std::printf("%8d %5d %-44s FAILED: %s\n", s.ctx, s.batch, shown.c_str(), r.error.c_str());
          continue;
        }
        std::printf("%8d %5d %-44s %10.4f %10.4f %8s %10.4f %10.4f %8.2f%% %8.2f%% %9s %10s %9s%s\n", s.ctx, s.batch,
                    shown.size() > 44 ? (shown.substr(0, 41) + "...").c_str() : shown.c_str(), r.step_ms, dense_ms[i],
                    dense_ms[i] > 0 ? fmt("%.2fx", dense_ms[i] / r.step_ms).c_str() : "-", r.core_ms,
                    r.step_ms - r.core_ms, 100 * r.attended, 100 * r.resident_fraction,
                    j.contains("speedup_vs_sdpa") ? fmt("%.2fx", j["speedup_vs_sdpa"].get<double>()).c_str() : "-",
                    s.graph_steps() ? fmt("%.4f", r.step_graph_ms).c_str() : "-",
                    j.contains("speedup_vs_sdpa_graph") ? fmt("%.2fx", j["speedup_vs_sdpa_graph"].get<double>()).c_str() : "-",
                    !side_by_side ? "" : i == 0 ? "          1" : fmt(" %10.4f", ratio).c_str());
      }
    }
  }
  std::printf(
      "step ms: median over %d %s of every layer's run_layer (append + hooks + attention) + end_step; core ms: the core\n"
      "kernel alone on the selection the chain used (dense: on all keys); select ms = step - core (estimate, top-k,\n"
      "append, host work); attended: attended / causal keys; resident: tokens kept / appended (eviction); graph ms:\n"
      "the same steps again with the runner's per-layer CUDA graphs on (decode on CUDA; chains below cuda_graph\n"
      "full run eagerly there, see the JSON's graph_eager_reason).%s\n",
      base.prefill() ? o.samples : o.steps, base.prefill() ? "calls (--samples)" : "steps", o.sdpa ? " x SDPA: PyTorch SDPA (one layer, dense) x layers / step." : "");

  for (size_t i = 1; i < stores.size(); ++i) {
    if (ratios[i].empty()) continue;
    const auto [lo, hi] = std::minmax_element(ratios[i].begin(), ratios[i].end());
    std::printf("%s / %s step time: median %.4f, min %.4f, max %.4f over %zu row(s)\n", store_names[i].c_str(),
                store_names[0].c_str(), median(ratios[i]), *lo, *hi, ratios[i].size());
  }

  if (!o.json_out.empty() && !write_json(o, base, device_desc, sdpa, sdpa_note, rows)) {
    std::fprintf(stderr, "sieve_bench --policy: cannot write %s\n", o.json_out.c_str());
    return 1;
  }
  return failed ? 1 : 0;
}

}  // namespace sieve::bench
