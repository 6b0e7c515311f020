// sieve attn: one attention call of a synthetic workload through a chain, with fidelity against
// the f64 dense reference (attention recall, output relative error), KV bytes and time.
// With no --chain it runs the built-in comparison the README's main command shows.
#include <spdlog/spdlog.h>

#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attn_workload.hpp"
#include "commands.hpp"
#include "sieve/cli/device_args.hpp"
#include "sieve/cli/error_line.hpp"
#include "sieve/cli/model_args.hpp"
#include "sieve/cli/parse_options.hpp"
#include "sieve/runtime/chain_spec.hpp"
#include "sieve/runtime/registry.hpp"
#include "sieve/workload/synthetic.hpp"
#include "sieve/util/printable.hpp"
#include "sieve/util/tensor.hpp"

namespace po = boost::program_options;

namespace sieve::cli {

namespace {

nlohmann::json to_json(const std::string& chain, const runtime::SyntheticReport& r) {
  nlohmann::json j = {{"chain", chain},
                      {"device", r.device},
                      {"recall", r.recall},
                      {"output_rel_err", r.rel_err},
                      {"attended_fraction", r.attended_fraction},
                      {"kv_bytes", r.kv_bytes},
                      {"chain_seconds", r.chain_seconds},
                      {"dense_kernel_seconds", r.dense_seconds},
                      {"hook_allocations", r.hook_allocations}};
  j["kernel_rel_err"] = r.kernel_rel_err >= 0 ? nlohmann::json(r.kernel_rel_err) : nlohmann::json(nullptr);
  for (const auto& [name, m] : r.metrics)
    j["metrics"][name] = {{"mean", m.mean()}, {"min", m.min}, {"max", m.max}, {"count", m.count}};
  return j;
}

}  // namespace

int cmd_attn(int argc, char** argv) {
  constexpr const char* kCmd = "sieve attn";
  po::options_description opts("sieve attn: run a synthetic attention workload through a chain");
  std::string chain_text, chain_file, phase = "decode", dtype = "f32", device = "cpu", contexts, keys = "random";
  std::vector<std::string> plugin_dirs;
  int32_t batch = 1, hq = 32, hkv = 8, d = 128, page = 16, new_tokens = 256, reps = 3;
  uint64_t seed = 1;
  opts.add_options()("help,h", "this help")
      ("chain", po::value(&chain_text), "chain spec, e.g. 'streaming(sink=4,window=512)'; layer 0 is the workload's layer")
      ("chain-file", po::value(&chain_file), "chain file (same grammar, one rule per line)")
      ("phase", po::value(&phase)->default_value("decode"), "decode | prefill")
      ("batch", po::value(&batch)->default_value(1), "sequences")
      ("context", po::value(&contexts)->default_value("4096"), "tokens per sequence after the call: N or N1,N2,... (ragged)")
      ("new-tokens", po::value(&new_tokens)->default_value(256), "prefill: query tokens per sequence")
      ("q-heads", po::value(&hq)->default_value(32), "query heads")
      ("kv-heads", po::value(&hkv)->default_value(8), "KV heads")
      ("head-dim", po::value(&d)->default_value(128), "head dimension")
      ("page-size", po::value(&page)->default_value(16), "tokens per KV page: 16, 32 or 64")
      ("dtype", po::value(&dtype)->default_value("f32"), "KV storage: f32 | f16 | bf16")
      ("device", po::value(&device)->default_value("cpu"), "cpu | cuda[:N]")
      ("seed", po::value(&seed)->default_value(1), "workload seed")
      ("keys", po::value(&keys)->default_value("random"),
       "random | similar: realistic adjacent-key similarity (reference/long_context.hpp)")
      ("reps", po::value(&reps)->default_value(3), "repetitions of the dense kernel timed for the ratio")
      ("plugin-dir", po::value(&plugin_dirs), "extra plugin directory (searched first; repeatable)")
      ("json", "print JSON instead of a table");
  std::string kv_store;
  add_kv_store_option(opts, &kv_store);
  po::variables_map vm;
  if (const auto done = parse_options(kCmd, opts, argc, argv, &vm)) return *done;
  const bool json = vm.count("json") > 0;
  const bool builtin = chain_text.empty() && chain_file.empty();

  runtime::SyntheticSpec spec;
  if (phase == "decode") spec.phase = SIEVE_PHASE_DECODE;
  else if (phase == "prefill") spec.phase = SIEVE_PHASE_PREFILL;
  else return report_error(kCmd, "--phase must be decode or prefill, got '" + printable(phase) + "'", 2);
  const std::optional<DLDataType> kv_dtype = parse_dtype_arg(dtype);
  if (!kv_dtype) return report_error(kCmd, bad_dtype_message("--dtype", dtype), 2);
  spec.kv_dtype = *kv_dtype;
  const std::optional<DLDevice> dev = parse_device_arg(device);
  if (!dev) return report_error(kCmd, bad_device_message(device), 2);
  spec.device = *dev;
  if (keys != "random" && keys != "similar")
    return report_error(kCmd, "--keys must be random or similar, got '" + printable(keys) + "'", 2);
  spec.similar_keys = keys == "similar";
  if (builtin) {
    // The README's main job: a mid-size decode workload, dense against StreamingLLM windows.
    if (vm["context"].defaulted()) contexts = "2048";
    if (vm["q-heads"].defaulted()) hq = 8;
    if (vm["kv-heads"].defaulted()) hkv = 2;
    if (vm["head-dim"].defaulted()) d = 64;
  }
  if (std::string p = parse_contexts(contexts, batch, &spec.context); !p.empty()) return report_error(kCmd, p, 2);
  spec.n_q_heads = hq;
  spec.n_kv_heads = hkv;
  spec.head_dim = d;
  spec.page_size = page;
  spec.new_tokens = new_tokens;
  spec.seed = seed;
  spec.timing_reps = reps;
  if (std::string p = attn_workload_problem(spec); !p.empty()) return report_error(kCmd, p, 2);

  runtime::DiscoveryOptions dopt;
  dopt.plugin_dirs = plugin_dirs;
  runtime::Registry registry = runtime::Registry::discover(dopt);
  for (const auto& m : registry.missing_dirs())
    return report_error(kCmd, "plugin directory '" + m + "' does not exist", 1);

  // The chains to run: the user's, or the built-in comparison.
  std::vector<std::string> chains;
  if (builtin) {
    chains = {"dense", "streaming(sink=4,window=1024)", "streaming(sink=4,window=256)",
              "streaming(sink=0,window=256)"};
  } else {
    chains = {chain_text};
  }

  // Parse every chain before running any. A bare chain ("streaming(window=64)") means every layer.
  std::vector<runtime::ChainSpec> specs;
  for (const auto& text : chains) {
    runtime::ChainSpec cs;
    std::string error;
    bool ok = chain_file.empty() ? runtime::parse_chain_argument(text, &cs, &error)
                                 : runtime::load_chain_file(chain_file, &cs, &error);
    if (!ok) return report_error(kCmd, error, 1);
    if (!runtime::apply_store_argument(kv_store, &cs, &error)) return report_error(kCmd, "--kv-store: " + error, 1);
    specs.push_back(std::move(cs));
  }

  nlohmann::json all = nlohmann::json::array();
  // Nothing is printed until every chain ran: a failure leaves no partial table behind.
  std::string table;
  auto add = [&table](const char* fmt, auto... args) {
    char line[512];
    std::snprintf(line, sizeof line, fmt, args...);
    table += line;
  };
  add("workload: %s, batch %zu, context %s, %d q heads / %d kv heads, head dim %d, page %d, %s KV on %s\n",
      phase.c_str(), spec.context.size(), contexts.c_str(), spec.n_q_heads, spec.n_kv_heads, spec.head_dim,
      spec.page_size, dtype.c_str(), sieve::device_name(spec.device).c_str());
  add("%-34s %8s %12s %10s %12s %12s %12s\n", "chain", "recall", "out rel err", "attended", "KV bytes", "chain ms",
      "dense ms");
  for (size_t c = 0; c < chains.size(); ++c) {
    const std::string& text = chains[c];
    std::string error;
    runtime::SyntheticReport r;
    if (!runtime::run_synthetic(spec, specs[c], registry, &r, &error)) return report_error(kCmd, error, 1);
    std::string label = chain_file.empty() ? text : chain_file;
    if (json) {
      all.push_back(to_json(label, r));
    } else {
      add("%-34s %8.4f %12.3e %9.1f%% %12llu %12.3f %12.3f\n", label.c_str(), r.recall, r.rel_err,
                  100.0 * r.attended_fraction, static_cast<unsigned long long>(r.kv_bytes), 1e3 * r.chain_seconds,
                  1e3 * r.dense_seconds);
      for (const auto& [name, m] : r.metrics)
        add("    metric %-20s mean %.4g (min %.4g, max %.4g, %llu reports)\n", name.c_str(), m.mean(), m.min,
                    m.max, static_cast<unsigned long long>(m.count));
    }
  }
  if (json) std::cout << (all.size() == 1 ? all[0] : all).dump(2) << "\n";
  else
    std::printf("%s", table.c_str()), std::printf("recall: dense softmax mass (f64) on the attended keys; out rel err: |o - o_dense| / |o_dense|;\n"
                "chain ms: the layer call through the chain (KV append included); dense ms: the core dense kernel alone.\n");
  return 0;
}

}  // namespace sieve::cli
