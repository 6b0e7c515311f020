// Fidelity metrics against the f64 reference (see fidelity.hpp).
#include "sieve/reference/fidelity.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "sieve/util/tensor.hpp"

namespace sieve::reference {
namespace {

template <class T>
double rel_err(const double* ref, const T* got, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double e = double(got[i]) - ref[i];
    num += e * e;
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

std::vector<int32_t> rows_to_compare(const RefAttention& ref, std::span<const int32_t> tokens) {
  std::vector<int32_t> rows;
  if (!tokens.empty()) {
    for (int32_t t : tokens) {
      if (t < 0 || t >= ref.n_q_tokens)
        throw std::invalid_argument("tokens: " + std::to_string(t) + " is outside [0, " +
                                    std::to_string(ref.n_q_tokens) + ")");
      rows.push_back(t);
    }
    return rows;
  }
  for (int32_t t = 0; t < ref.n_q_tokens; ++t)
    if (ref.computed[size_t(t)]) rows.push_back(t);
  return rows;
}

void require_host_shape(const DLTensor& t, const char* what, std::initializer_list<int64_t> shape) {
  std::string e = check_tensor(&t, what, int(shape.size()), shape);
  if (e.empty() && t.device.device_type != kDLCPU) e = std::string(what) + ": not in host memory";
  if (e.empty() && !is_float_storage(t.dtype)) e = std::string(what) + ": not a float tensor";
  if (e.empty() && !is_contiguous(t)) e = std::string(what) + ": not compact row-major";
  if (!e.empty()) throw std::invalid_argument(e);
}

}  // namespace

double relative_error(const double* ref, const double* got, size_t n) { return rel_err(ref, got, n); }
double relative_error(const double* ref, const float* got, size_t n) { return rel_err(ref, got, n); }

OutputError compare_output(const RefAttention& ref, const DLTensor& out,
                           std::span<const int32_t> tokens) {
  require_host_shape(out, "out", {ref.n_q_tokens, ref.hq, ref.d});
  const void* base = data_ptr<const void>(out);
  OutputError e;
  double num = 0, den = 0;
  std::vector<double> row(static_cast<size_t>(ref.d));
  for (int32_t t : rows_to_compare(ref, tokens)) {
    for (int32_t h = 0; h < ref.hq; ++h) {
      const int64_t o = (int64_t(t) * ref.hq + h) * ref.d;
      double rn = 0, rd = 0;
      for (int32_t i = 0; i < ref.d; ++i) {
        row[size_t(i)] = load_float(base, out.dtype, o + i);
        if (!std::isfinite(row[size_t(i)])) ++e.non_finite;
        const double diff = row[size_t(i)] - ref.out[size_t(o + i)];
        rn += diff * diff;
        rd += ref.out[size_t(o + i)] * ref.out[size_t(o + i)];
      }
      num += rn;
      den += rd;
      const double rel = rd > 0 ? std::sqrt(rn / rd) : std::sqrt(rn);
      // NaN compares false with everything: a NaN row is the worst unless one was found already.
      const bool worse = std::isnan(rel) ? !std::isnan(e.max_row_rel) : rel > e.max_row_rel;
      if (e.worst_token < 0 || worse) {
        e.max_row_rel = rel;
        e.worst_token = t;
        e.worst_head = h;
      }
      ++e.rows;
    }
  }
  e.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return e;
}

double max_relative_error(const double* ref, const DLTensor& got, int64_t n, double floor) {
  if (numel(got) < n) throw std::invalid_argument("got: holds fewer values than compared");
  if (got.device.device_type != kDLCPU || !is_float_storage(got.dtype))
    throw std::invalid_argument("got: not a host float tensor");
  const void* base = data_ptr<const void>(got);
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double g = load_float(base, got.dtype, i), r = ref[i];
    double e;
    if (!std::isfinite(g) || !std::isfinite(r))
      e = (g == r) ? 0 : std::numeric_limits<double>::infinity();
    else
      e = std::abs(g - r) / std::max(std::abs(r), floor);
    worst = std::max(worst, e);
  }
  return worst;
}

double max_lse_error(const RefAttention& ref, const DLTensor& lse, std::span<const int32_t> tokens) {
  require_host_shape(lse, "lse", {ref.n_q_tokens, ref.hq});
  const void* base = data_ptr<const void>(lse);
  double worst = 0;
  for (int32_t t : rows_to_compare(ref, tokens))
    for (int32_t h = 0; h < ref.hq; ++h) {
      const int64_t i = int64_t(t) * ref.hq + h;
      const double g = load_float(base, lse.dtype, i), r = ref.lse[size_t(i)];
      const double e = (!std::isfinite(g) || !std::isfinite(r))
                           ? (g == r ? 0 : std::numeric_limits<double>::infinity())
                           : std::abs(g - r);
      worst = std::max(worst, e);
    }
  return worst;
}

double attention_recall(const sieve_attention_args& args) {
  RefOptions opt;
  opt.keep_probs = true;
  const RefAttention sparse = attend_reference(args, opt);  // for its attended-key masks
  opt.ignore_selection = true;
  const RefAttention dense = attend_reference(args, opt);
  double total = 0;
  int64_t rows = 0;
  for (int32_t t = 0; t < dense.n_q_tokens; ++t) {
    if (!dense.computed[size_t(t)]) continue;
    for (int32_t h = 0; h < dense.hq; ++h) {
      const std::span<const double> p = dense.prob_row(t, h);
      const std::span<const uint8_t> kept = sparse.attended_row(t, h);
      double mass = 0;
      for (size_t k = 0; k < p.size(); ++k)
        if (kept[k]) mass += p[k];
      total += mass;
      ++rows;
    }
  }
  return rows ? total / double(rows) : 1.0;
}

}  // namespace sieve::reference
