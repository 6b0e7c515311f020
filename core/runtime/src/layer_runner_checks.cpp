// LayerRunner's check mode (RunnerOptions::check): what a chain's policies wrote is validated
// before the layer goes on — the selection's CSR (bounds, order, and holes left by a select that
// wrote its rows at the wrong offsets, found through the poison fill) and the attention output
// (finite everywhere). The layer steps themselves are in layer_runner.cpp.
#include <algorithm>
#include <cmath>

#include "sieve/kernels/attention_args.hpp"
#include "sieve/runtime/layer_runner.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::runtime {

// Copy device arrays to the host when needed and check the selection's contents.
std::string LayerRunner::check_selection(const sieve_attention_args& args) {
  const sieve_selection* sel = args.selection;
  if (!sel || sel->kind == SIEVE_SEL_ALL) return {};
  std::string e = kernels::check_attention_args(args);
  if (!e.empty()) return e;
  const int64_t n_indptr = int64_t(sel->n_rows) + 1;
  std::vector<int32_t> indptr(static_cast<size_t>(n_indptr));
  std::string err;
  if (!services_.copy(indptr.data(), kCpu, data_ptr<void>(sel->indptr), sel->indptr.device,
                      size_t(n_indptr) * 4, &err))
    return err;
  int64_t nnz = std::clamp<int64_t>(indptr.back(), 0, sel->capacity);
  std::vector<int32_t> indices(size_t(std::max<int64_t>(nnz, 1)));
  if (nnz > 0 && !services_.copy(indices.data(), kCpu, data_ptr<void>(sel->indices),
                                 sel->indices.device, size_t(nnz) * 4, &err))
    return err;
  if (std::string e = find_hole(indptr, indices, nnz); !e.empty()) return e;
  return kernels::check_selection_contents(args, indptr.data(), indices.data());
}

// An entry the policy never wrote still holds the poison fill: its row has a hole (rows written
// at fixed row * budget offsets while indptr counts them back to back, or the reverse).
std::string LayerRunner::find_hole(const std::vector<int32_t>& indptr, const std::vector<int32_t>& indices,
                                   int64_t nnz) {
  const auto hole = std::find(indices.begin(), indices.begin() + nnz, kUnwrittenIndex);
  if (hole == indices.begin() + nnz) return {};
  const int64_t e = hole - indices.begin();
  const int64_t row = std::upper_bound(indptr.begin(), indptr.end(), int32_t(e)) - indptr.begin() - 1;
  return "selection row " + std::to_string(row) + ": selection.indices[" + std::to_string(e) +
         "] was never written (rows span indptr[" + std::to_string(row) + "] = " + std::to_string(indptr[size_t(row)]) +
         " .. indptr[" + std::to_string(row + 1) + "] = " + std::to_string(indptr[size_t(row) + 1]) +
         "): rows must be packed back to back, without holes";
}

// Check mode: every index entry past what the chain's selection holds so far gets the poison,
// so a select that leaves holes in its rows is caught by find_hole.
std::string LayerRunner::poison_indices(const sieve_selection& sel, int64_t capacity) {
  int64_t from = 0;
  std::string err;
  if (sel.kind != SIEVE_SEL_ALL) {
    int32_t end = 0;
    if (!services_.copy(&end, kCpu, data_ptr<int32_t>(sel.indptr) + sel.n_rows, geometry_.device, 4, &err))
      return err;
    from = std::clamp<int64_t>(end, 0, capacity);
  }
  if (from >= capacity) return {};
  poison_.assign(size_t(capacity - from), kUnwrittenIndex);
  if (!services_.copy(static_cast<int32_t*>(sel_indices_.get()) + from, geometry_.device, poison_.data(), kCpu,
                      poison_.size() * 4, &err))
    return err;
  return {};
}

std::string LayerRunner::check_output(const DLTensor& out, const int32_t* rows, int64_t n_rows) {
  const int64_t row_elems = int64_t(geometry_.n_q_heads) * geometry_.head_dim;
  const size_t bytes = size_t(numel(out)) * dtype_bytes(out.dtype);
  const void* host = data_ptr<void>(out);
  if (out.device.device_type != kDLCPU) {
    host_scratch_.resize(bytes);
    std::string err;
    if (!services_.copy(host_scratch_.data(), kCpu, host, out.device, bytes, &err)) return err;
    host = host_scratch_.data();
  }
  const int64_t total_rows = out.shape[0];
  for (int64_t r = 0; r < (rows ? n_rows : total_rows); ++r) {
    int64_t row = rows ? rows[r] : r;
    for (int64_t j = 0; j < row_elems; ++j) {
      float v = load_float(host, out.dtype, row * row_elems + j);
      if (!std::isfinite(v))
        return "output is " + std::string(std::isnan(v) ? "NaN" : "Inf") + " at query token " +
               std::to_string(row) + ", head " + std::to_string(j / geometry_.head_dim);
    }
  }
  return {};
}

}  // namespace sieve::runtime
