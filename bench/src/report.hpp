// The suite's summary: rates against the measured ceilings, speedups (block-sparse vs dense in the
// same run, ours vs PyTorch SDPA), and the targets, as a table and as JSON. Internal to
// bench/.
#pragma once
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runner.hpp"
#include "sieve/bench/suite.hpp"

namespace sieve::bench {

// PyTorch SDPA on one shape (bench/sdpa_reference.py): the fastest backend variant that ran.
struct SdpaEntry {
  double best_ms = 0;
  std::string best_variant;
  nlohmann::json variants;  // every variant: median ms, or the error it raised
};

struct Report {
  std::string date, command;
  Ceilings ceilings;
  std::vector<CaseResult> results;
  std::map<std::string, SdpaEntry> sdpa;  // by Case::shape
  nlohmann::json sdpa_meta;               // torch version, device, notes
};

// Reads the script's JSON ({"results": {shape: {"variants": {...}}}, ...}) into report.sdpa.
// Returns "" or what was wrong.
std::string merge_sdpa(Report& report, const nlohmann::json& sdpa);

void print_summary(const Report& report, std::FILE* f);
nlohmann::json report_json(const Report& report);

// Runs `o.python o.sdpa_script --cases FILE` on `cases` (sdpa_reference.py's input list) and
// parses what it prints into *out. Returns "" or what went wrong. (suite.cpp; also the policy bench)
std::string run_sdpa_script(const SuiteOptions& o, const nlohmann::json& cases, nlohmann::json* out);
// Today's date, UTC, as YYYY-MM-DD.
std::string today_utc();

}  // namespace sieve::bench
