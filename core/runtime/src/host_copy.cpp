#include "sieve/runtime/host_copy.hpp"

#include <algorithm>
#include <cstring>

#include "sieve/util/error.hpp"
#include "sieve/util/page_layout.hpp"

namespace sieve::runtime {

void copy_to_host(HostServices& s, void* dst, const DLTensor& src, size_t bytes) {
  std::string err;
  require(s.copy(dst, kCpu, data_ptr<void>(src), src.device, bytes, &err), SIEVE_ERR_DEVICE, err);
}

namespace {

// The pool `src` (any layout page_strides accepts, any device) as compact HND host pages.
HostTensor pages_to_host(HostServices& s, const DLTensor& src, const char* name) {
  PageStrides at;
  const std::string bad = page_strides(src, name, &at);
  require(bad.empty(), SIEVE_ERR_INVALID_ARGUMENT, "copy_view_to_host: " + bad);
  HostTensor out(std::vector<int64_t>(src.shape, src.shape + 4), src.dtype);
  const int64_t H = src.shape[1], P = src.shape[2], D = src.shape[3];
  if (at == compact_hnd_strides(H, P, D)) {  // one copy
    if (out.nbytes() > 0) copy_to_host(s, out.dl().data, src, out.nbytes());
    return out;
  }
  const int64_t span = page_span(src, at);
  const size_t elem = dtype_bytes(src.dtype);
  std::vector<unsigned char> raw(size_t(span) * elem);
  copy_to_host(s, raw.data(), src, raw.size());
  unsigned char* dst = out.data<unsigned char>();
  for (int64_t c = 0; c < src.shape[0]; ++c)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < P; ++t)
        std::memcpy(dst + size_t(((c * H + h) * P + t) * D) * elem,
                    raw.data() + size_t(at.row(c, h, t)) * elem, size_t(D) * elem);
  return out;
}

}  // namespace

void copy_view_to_host(HostServices& s, const sieve_paged_kv& src, HostPagedView* h) {
  const int32_t batch = src.batch;
  h->k = pages_to_host(s, src.k_pages, "kv.k_pages");
  h->v = pages_to_host(s, src.v_pages, "kv.v_pages");
  const int64_t nnz = src.indptr_host[batch];
  h->indices = HostTensor({std::max<int64_t>(nnz, 1)}, kI32);
  h->indptr = HostTensor({batch + 1}, kI32);
  h->last_page_len = HostTensor({std::max(batch, 1)}, kI32);
  if (nnz > 0) copy_to_host(s, h->indices.dl().data, src.indices, size_t(nnz) * 4);
  std::memcpy(h->indptr.data<int32_t>(), src.indptr_host, size_t(batch + 1) * 4);
  std::memcpy(h->last_page_len.data<int32_t>(), src.last_page_len_host, size_t(batch) * 4);
  h->indices.dl().shape[0] = nnz;
  h->last_page_len.dl().shape[0] = batch;
  h->view = src;
  h->view.k_pages = h->k.dl();
  h->view.v_pages = h->v.dl();
  h->view.indptr = h->indptr.dl();
  h->view.indices = h->indices.dl();
  h->view.last_page_len = h->last_page_len.dl();
  h->view.indptr_host = h->indptr.data<int32_t>();
  h->view.last_page_len_host = h->last_page_len.data<int32_t>();
  h->view.k_pre_rope_pages = DLTensor{};
}

void selection_to_host(const SelectionSnapshot& snap, HostSelection* h) {
  h->indptr = HostTensor({std::max<int64_t>(int64_t(snap.indptr.size()), 1)}, kI32);
  h->indices = HostTensor({std::max<int64_t>(int64_t(snap.indices.size()), 1)}, kI32);
  std::copy(snap.indptr.begin(), snap.indptr.end(), h->indptr.data<int32_t>());
  std::copy(snap.indices.begin(), snap.indices.end(), h->indices.data<int32_t>());
  h->selection = sieve_selection{};
  h->selection.hdr = SIEVE_HEADER_INIT(sieve_selection);
  h->selection.kind = snap.kind;
  h->selection.heads = snap.heads;
  h->selection.q_block = snap.q_block;
  h->selection.k_block_pages = snap.k_block_pages;
  h->selection.n_rows = snap.n_rows;
  h->selection.indptr = h->indptr.dl();
  h->selection.indices = h->indices.dl();
  h->selection.capacity = int64_t(snap.indices.size());
}

}  // namespace sieve::runtime
