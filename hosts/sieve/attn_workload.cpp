#include "attn_workload.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>

#include "sieve/util/printable.hpp"

namespace sieve::cli {

namespace {

std::string range_problem(const char* option, int64_t v, int64_t lo, int64_t hi) {
  if (v >= lo && v <= hi) return {};
  return std::string(option) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
         std::to_string(v);
}

// A count that may exceed int64 (the totals below), written in full.
std::string count_text(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.0f", v);
  return b;
}

std::string first_of(std::initializer_list<std::string> problems) {
  for (const auto& p : problems)
    if (!p.empty()) return p;
  return {};
}

}  // namespace

std::string parse_contexts(const std::string& text, int32_t batch, std::vector<int32_t>* out) {
  using attn_limits::kMaxContext;
  const std::string usage = "--context must be N or one N per sequence (--batch " + std::to_string(batch) +
                            "), each in [1, " + std::to_string(kMaxContext) + " = 2^24]";
  out->clear();
  if (std::string p = range_problem("--batch", batch, 1, attn_limits::kMaxBatch); !p.empty()) return p;
  for (size_t start = 0;;) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item(text.data() + start, comma - start);
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size())
      return usage + ", got '" + printable(text) + "'";
    if (v < 1 || v > kMaxContext) return usage + ", got " + std::to_string(v);
    out->push_back(int32_t(v));
    if (comma == text.size()) break;
    start = comma + 1;
  }
  // One length serves every sequence; with the default --batch 1 the lengths give the batch.
  if (out->size() == 1 && batch > 1) out->assign(size_t(batch), out->front());
  if (batch > 1 && int32_t(out->size()) != batch) return usage + ", got " + std::to_string(out->size()) + " lengths";
  return range_problem("--batch (the number of --context lengths)", int64_t(out->size()), 1, attn_limits::kMaxBatch);
}

std::string attn_workload_problem(const runtime::SyntheticSpec& s) {
  namespace L = attn_limits;
  const bool prefill = s.phase == SIEVE_PHASE_PREFILL;
  std::string p = first_of({range_problem("--q-heads", s.n_q_heads, 1, L::kMaxHeads),
                            range_problem("--kv-heads", s.n_kv_heads, 1, L::kMaxHeads),
                            range_problem("--head-dim", s.head_dim, 1, L::kMaxHeadDim),
                            prefill ? range_problem("--new-tokens", s.new_tokens, 1, L::kMaxContext) : "",
                            range_problem("--reps", s.timing_reps, 1, L::kMaxReps)});
  if (!p.empty()) return p;
  if (s.n_q_heads % s.n_kv_heads != 0)
    return "--q-heads " + std::to_string(s.n_q_heads) + " must be a multiple of --kv-heads " +
           std::to_string(s.n_kv_heads);
  if (s.page_size != 16 && s.page_size != 32 && s.page_size != 64)
    return "--page-size must be 16, 32 or 64, got " + std::to_string(s.page_size);
  // Totals in double: the product of the per-option limits overflows int64.
  double kv = 0, ref = 0;
  for (int32_t c : s.context) {
    const double rows = prefill ? std::min(s.new_tokens, c) : 1;
    kv += double(c) * s.n_kv_heads * s.head_dim;
    ref += rows * s.n_q_heads * c;
  }
  if (kv > double(L::kMaxKvElements))
    return "the KV cache (--context summed over --batch x --kv-heads x --head-dim = " + count_text(kv) +
           " elements per K and V) exceeds sieve attn's limit of 2^29";
  if (ref > double(L::kMaxReferenceEntries))
    return "the f64 reference (query rows x --q-heads x --context, summed over --batch = " +
           count_text(ref) + " attention weights) exceeds sieve attn's limit of 2^28" +
           (prefill ? "; lower --new-tokens" : "");
  return {};
}

}  // namespace sieve::cli
