// sieve eval: a chain against dense attention on a real model — per layer attention recall and
// output error, logits KL and top-1 agreement (teacher-forced on the dense tokens), free-running
// greedy token agreement, KV bytes, time. The numbers come from sieve::model::evaluate_fidelity
// (core/model/include/sieve/model/fidelity_eval.hpp says how each is measured); this only prints.
// With --task: held-out instances of a long-context task (task_eval.hpp) instead of prompts, and
// the task accuracy of dense attention and of the chain beside the same metrics.
#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.hpp"
#include "sieve/cli/error_line.hpp"
#include "sieve/cli/model_args.hpp"
#include "sieve/cli/parse_options.hpp"
#include "sieve/cli/prompts.hpp"
#include "sieve/model/fidelity_eval.hpp"
#include "sieve/model/task_eval.hpp"
#include "sieve/util/error.hpp"

namespace po = boost::program_options;

namespace sieve::cli {

namespace {

nlohmann::json to_json(const model::AttentionFidelity& a) {
  return {{"rows", a.rows}, {"recall", a.recall}, {"min_recall", a.min_recall},
          {"output_rel_err", a.out_rel_err}, {"attended_fraction", a.attended}};
}

std::string cell(const model::AttentionFidelity& a, double resident) {
  char line[160];
  if (a.rows == 0) std::snprintf(line, sizeof line, "%8s %10s %12s %9s", "-", "-", "-", "-");
  else
    std::snprintf(line, sizeof line, "%8.4f %10.4f %12.3e %8.1f%%", a.recall, a.min_recall, a.out_rel_err,
                  100.0 * a.attended);
  std::string s = line;
  if (resident >= 0) {
    std::snprintf(line, sizeof line, " %8.1f%%", 100.0 * resident);
    s += line;
  }
  return s;
}


// Every metric of a run (the texts aside).
nlohmann::json report_json(const model::ModelWeights& w, const model::EvalReport& r) {
  nlohmann::json j = {{"model", w.source}, {"chain", r.chain}, {"device", r.device}, {"prompts", r.prompts},
                      {"steps", r.steps}};
  // Not measured (--no-attention-metrics): absent or null, not the defaults of an empty measurement.
  for (const auto& l : r.layers)
    j["layers"].push_back(r.attention_measured
                              ? nlohmann::json{{"layer", l.layer}, {"prefill", to_json(l.prefill)},
                                               {"decode", to_json(l.decode)}, {"resident_fraction", l.resident_fraction}}
                              : nlohmann::json{{"layer", l.layer}, {"resident_fraction", l.resident_fraction}});
  j["attention"] = r.attention_measured
                       ? nlohmann::json{{"prefill", to_json(r.prefill)}, {"decode", to_json(r.decode)}}
                       : nlohmann::json();
  j["teacher_forced"] = {{"positions", r.positions}, {"kl_mean", r.kl_mean}, {"kl_max", r.kl_max},
                         {"top1_agreement", r.top1_agreement}};
  j["free_running"] = r.free_running ? nlohmann::json{{"token_agreement", r.token_agreement},
                                                      {"first_divergence", r.first_divergence}}
                                     : nlohmann::json();
  j["kv_bytes"] = {{"dense", r.kv_bytes_dense}, {"chain", r.kv_bytes_chain}};
  j["seconds"] = {{"dense", r.dense_seconds}, {"chain", r.chain_seconds}, {"measured_run", r.measure_seconds}};
  j["metrics"] = nlohmann::json::object();
  for (const auto& [name, m] : r.metrics)
    j["metrics"][name] = {{"count", m.count}, {"mean", m.mean()}, {"min", m.min}, {"max", m.max}};
  return j;
}

// The per-layer attention table (or, not measured, the resident fractions alone).
void print_attention(const model::EvalReport& r) {
  if (!r.attention_measured) {
    std::printf("attention metrics not measured (--no-attention-metrics); resident per layer:");
    for (const auto& l : r.layers) std::printf(" %.1f%%", 100.0 * l.resident_fraction);
    std::printf("\n\n");
    return;
  }
  std::printf("%-6s %-8s %8s %10s %12s %9s %9s\n", "layer", "phase", "recall", "min recall", "out rel err",
              "attended", "resident");
  for (const auto& l : r.layers) {
    std::printf("%-6d %-8s %s\n", l.layer, "prefill", cell(l.prefill, -1).c_str());
    std::printf("%-6s %-8s %s\n", "", "decode", cell(l.decode, l.resident_fraction).c_str());
  }
  std::printf("%-6s %-8s %s\n", "all", "prefill", cell(r.prefill, -1).c_str());
  std::printf("%-6s %-8s %s\n\n", "", "decode", cell(r.decode, -1).c_str());
}

void print_report(const model::EvalReport& r) {
  print_attention(r);
  std::printf("teacher-forced on the %s tokens (%lld positions): KL(dense||chain) mean %.3e, max %.3e; "
              "top-1 agreement %.4f\n",
              r.free_running ? "dense" : "task's", static_cast<long long>(r.positions), r.kl_mean, r.kl_max,
              r.top1_agreement);
  if (r.free_running) {
    std::string firsts;
    for (int32_t f : r.first_divergence)
      firsts += (firsts.empty() ? "" : ", ") + (f < 0 ? std::string("none") : std::to_string(f));
    std::printf("free-running greedy: token agreement %.4f; first divergence per prompt: %s\n", r.token_agreement,
                firsts.c_str());
  }
  std::printf("KV bytes after the last step: dense %llu, chain %llu\n",
              static_cast<unsigned long long>(r.kv_bytes_dense), static_cast<unsigned long long>(r.kv_bytes_chain));
  for (const auto& [name, m] : r.metrics)
    std::printf("metric %s (reported by the chain): mean %.4f, min %.4f, max %.4f over %llu reports\n", name.c_str(),
                m.mean(), m.min, m.max, static_cast<unsigned long long>(m.count));
  const double toks = double(r.prompts) * r.steps;
  if (r.free_running)
    std::printf("time (free-running, prefill + decode): dense %.3f s (%.0f tokens/s), chain %.3f s (%.0f tokens/s)\n",
                r.dense_seconds, toks / r.dense_seconds, r.chain_seconds, toks / r.chain_seconds);
  else
    std::printf("time (prefill + decode): dense %.3f s; the chain's measured run %.3f s\n", r.dense_seconds,
                r.measure_seconds);
  if (!r.attention_measured) return;
  std::printf("\nrecall: f64 dense softmax mass (over the layer's resident keys) on the keys the chain attends;\n"
              "out rel err: |o_chain - o_dense| / |o_dense|, o_dense in f64 on the same queries and cache;\n"
              "attended: keys attended / causal keys; resident: resident tokens / tokens fed.\n");
}

struct TaskArgs {
  std::string task;
  int32_t length = 4096, instances = 8;
  int64_t seed = 1000;
};

nlohmann::json score_json(const model::TaskScore& s) {
  return {{"accuracy", s.accuracy()}, {"exact", s.exact()}, {"graded", s.graded}, {"instances", s.instances}};
}

// --dump-instances: the instances as JSON, no model (the generator's cross-check with
// bench/train/sieve_tasks.py).
int dump_instances(const TaskArgs& t) {
  nlohmann::json j = {{"task", t.task}, {"length", t.length}, {"seed", t.seed}, {"instances", nlohmann::json::array()}};
  for (int32_t i = 0; i < t.instances; ++i) {
    const model::TaskInstance inst = model::make_task_instance(t.task, t.length, uint64_t(t.seed), uint64_t(i));
    j["instances"].push_back({{"prompt", inst.prompt}, {"continuation", inst.continuation}, {"scored", inst.scored}});
  }
  std::cout << j.dump() << "\n";
  return 0;
}

int run_task(const ModelArgs& ma, const TaskArgs& t, const runtime::ChainSpec& spec, const model::EvalOptions& eo,
             bool json) {
  std::string error;
  runtime::Registry registry;
  if (!discover_plugins(ma, &registry, &error)) fail(SIEVE_ERR_NOT_FOUND, error);
  const model::ModelWeights w = load_model_arg(ma);
  if (const auto trained = model::training_seed(ma.model); trained && *trained == uint64_t(t.seed))
    fail(SIEVE_ERR_INVALID_ARGUMENT, "--seed " + std::to_string(t.seed) +
                                         " is the model's training seed (training.json): held-out instances need "
                                         "another");
  const model::TaskReport r =
      model::evaluate_task(w, t.task, t.length, uint64_t(t.seed), t.instances, spec, registry, eo);
  if (json) {
    nlohmann::json j = report_json(w, r.fidelity);
    j["task"] = {{"name", r.task}, {"length", r.length}, {"seed", r.seed}, {"dense", score_json(r.dense)},
                 {"chain", score_json(r.chain)}};
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("model: %s\n", describe(w).c_str());
  std::printf("task: %s at %d tokens, %d held-out instances (seed %llu) | chain: %s | device %s\n\n", r.task.c_str(),
              r.length, t.instances, static_cast<unsigned long long>(r.seed), r.fidelity.chain.c_str(),
              r.fidelity.device.c_str());
  std::printf("task accuracy (graded tokens right; instances all right): dense %.4f, %.4f; chain %.4f, %.4f\n\n",
              r.dense.accuracy(), r.dense.exact(), r.chain.accuracy(), r.chain.exact());
  print_report(r.fidelity);
  return 0;
}

}  // namespace

int cmd_eval(int argc, char** argv) {
  po::options_description opts("sieve eval: a chain against dense attention on a real model");
  ModelArgs ma;
  std::string chain_text, prompts_file;
  model::EvalOptions eo;
  TaskArgs ta;
  opts.add_options()("help,h", "this help")
      ("model", po::value(&ma.model), "model file or directory (as sieve run); default: the embedded stories260K")
      ("tokenizer", po::value(&ma.tokenizer), "llama2.c tokenizer file (as sieve run)")
      ("chain", po::value(&chain_text), "chain spec to evaluate (required); a bare chain means every layer")
      ("prompts", po::value(&prompts_file), "file with one prompt per line; default: 4 built-in prompts")
      ("steps", po::value(&eo.steps)->default_value(128), "positions compared per prompt")
      ("device", po::value(&ma.device)->default_value("cpu"), "cpu | cuda[:N]")
      ("page-size", po::value(&ma.page_size)->default_value(16), "tokens per KV page: 16, 32 or 64")
      ("kv-dtype", po::value(&ma.kv_dtype)->default_value("f32"), "KV storage: f32 | f16 | bf16")
      ("plugin-dir", po::value(&ma.plugin_dirs), "extra plugin directory (searched first; repeatable)")
      ("json", "print JSON instead of a table")
      ("task", po::value(&ta.task), "a long-context task instead of prompts: passkey | mqar | copy (a model "
                                    "trained by bench/train/train.py; --chain then defaults to dense)")
      ("length", po::value(&ta.length)->default_value(4096), "--task: tokens per instance")
      ("instances", po::value(&ta.instances)->default_value(8), "--task: held-out instances (one batch)")
      ("seed", po::value(&ta.seed)->default_value(1000), "--task: instance seed (never the model's training seed)")
      ("dump-instances", "--task: print the instances as JSON and exit (no model)")
      ("no-attention-metrics", "skip the per-call attention measurement (recall, output error, attended: an f64 "
                               "reference over every query row, slow at long contexts); logits metrics and task "
                               "accuracy stay");
  add_kv_store_option(opts, &ma.kv_store);
  po::variables_map vm;
  if (const auto done = parse_options("sieve eval", opts, argc, argv, &vm)) return *done;
  const bool json = vm.count("json") > 0;
  if (!ta.task.empty()) {
    if (vm.count("prompts") || !vm["steps"].defaulted() || vm.count("tokenizer")) {
      std::fprintf(stderr, "sieve eval: --task makes its own prompts and answers: --prompts, --steps and "
                           "--tokenizer do not apply\n");
      return 2;
    }
    if (ta.instances < 1 || ta.seed < 0) {
      std::fprintf(stderr, "sieve eval: --instances must be >= 1 and --seed >= 0, got %d and %lld\n", ta.instances,
                   static_cast<long long>(ta.seed));
      return 2;
    }
    std::string error;
    if (!engine_options(ma, &eo.engine, &error)) return report_error("sieve eval", error, 2);
    eo.measure_attention = vm.count("no-attention-metrics") == 0;
    try {
      if (vm.count("dump-instances")) return dump_instances(ta);
      return run_task(ma, ta, chain_arg(chain_text, ma.kv_store), eo, json);
    } catch (const std::exception& e) {
      return report_error("sieve eval", e.what(), 1);
    }
  }
  if (vm.count("dump-instances") || !vm["length"].defaulted() || !vm["instances"].defaulted() ||
      !vm["seed"].defaulted()) {
    std::fprintf(stderr, "sieve eval: --length, --instances, --seed and --dump-instances need --task\n");
    return 2;
  }
  eo.measure_attention = vm.count("no-attention-metrics") == 0;
  if (chain_text.empty()) {
    std::fprintf(stderr, "sieve eval: --chain is required (e.g. --chain 'streaming(sink=4,window=64)')\n");
    return 2;
  }
  if (eo.steps < 1) {
    std::fprintf(stderr, "sieve eval: --steps must be >= 1, got %d\n", eo.steps);
    return 2;
  }
  std::string error;
  if (!engine_options(ma, &eo.engine, &error)) {
    return report_error("sieve eval", error, 2);
  }
  try {
    const runtime::ChainSpec spec = chain_arg(chain_text, ma.kv_store);
    runtime::Registry registry;
    if (!discover_plugins(ma, &registry, &error)) fail(SIEVE_ERR_NOT_FOUND, error);
    const model::ModelWeights w = load_model_arg(ma);
    const model::Tokenizer tok = load_tokenizer_arg(ma, w);
    const std::vector<std::string> texts = prompts_or_defaults(prompts_file);
    std::vector<std::vector<int32_t>> prompts;
    for (const auto& t : texts) prompts.push_back(tok.encode(t, true, false, w.config.seq_len));
    const model::EvalReport r = model::evaluate_fidelity(w, prompts, spec, registry, eo);

    if (json) {
      nlohmann::json j = report_json(w, r);
      for (size_t b = 0; b < prompts.size(); ++b)
        j["texts"].push_back({{"prompt", texts[b]},
                              {"dense", tok.decode(r.dense_tokens[b], prompts[b].back())},
                              {"chain", tok.decode(r.chain_tokens[b], prompts[b].back())}});
      // Prompts from a file and generated byte tokens need not be UTF-8: shown as U+FFFD, not an abort.
      std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
      return 0;
    }
    std::printf("model: %s\n", describe(w).c_str());
    std::printf("chain: %s | device %s | %d prompts x %d positions\n\n", r.chain.c_str(), r.device.c_str(),
                r.prompts, r.steps);
    print_report(r);
  } catch (const std::exception& e) {
    return report_error("sieve eval", e.what(), 1);
  }
  return 0;
}

}  // namespace sieve::cli
