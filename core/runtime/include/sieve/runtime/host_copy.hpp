// Host copies of what an attention call used, for the f64 reference (sieve attn, sieve eval,
// conformance): a store's paged view and the selection a layer's chain produced. Tools only —
// these copy synchronously and allocate.
#pragma once
#include "sieve/runtime/host_services.hpp"
#include "sieve/runtime/layer_runner.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::runtime {

// A paged view whose pages and index arrays live in host memory (`view` borrows the tensors).
struct HostPagedView {
  HostTensor k, v, indptr, indices, last_page_len;
  sieve_paged_kv view{};
};
// Copies `src` (on any device, pages in any layout page_strides accepts) to `out`, its pages as
// compact HND; throws sieve::Error (SIEVE_ERR_DEVICE) if a copy fails, SIEVE_ERR_INVALID_ARGUMENT
// for strides page_strides refuses.
void copy_view_to_host(HostServices& services, const sieve_paged_kv& src, HostPagedView* out);

// The selection of a SelectionSnapshot as host tensors; get() is nullptr for a dense selection.
struct HostSelection {
  HostTensor indptr, indices;
  sieve_selection selection{};
  const sieve_selection* get() const { return selection.kind == SIEVE_SEL_ALL ? nullptr : &selection; }
};
void selection_to_host(const SelectionSnapshot& snapshot, HostSelection* out);

// Copies `bytes` of `src` (any device) to host memory at `dst`; throws like copy_view_to_host.
void copy_to_host(HostServices& services, void* dst, const DLTensor& src, size_t bytes);

}  // namespace sieve::runtime
