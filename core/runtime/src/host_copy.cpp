#include "sieve/runtime/host_copy.hpp"

#include <algorithm>
#include <cstring>

#include "sieve/util/error.hpp"

namespace sieve::runtime {

void copy_to_host(HostServices& s, void* dst, const DLTensor& src, size_t bytes) {
  std::string err;
  require(s.copy(dst, kCpu, data_ptr<void>(src), src.device, bytes, &err), SIEVE_ERR_DEVICE, err);
}

void copy_view_to_host(HostServices& s, const sieve_paged_kv& src, HostPagedView* h) {
  const int32_t batch = src.batch;
  const std::vector<int64_t> pool(src.k_pages.shape, src.k_pages.shape + 4);
  h->k = HostTensor(pool, src.k_pages.dtype);
  h->v = HostTensor(pool, src.v_pages.dtype);
  const int64_t nnz = src.indptr_host[batch];
  h->indices = HostTensor({std::max<int64_t>(nnz, 1)}, kI32);
  h->indptr = HostTensor({batch + 1}, kI32);
  h->last_page_len = HostTensor({std::max(batch, 1)}, kI32);
  copy_to_host(s, h->k.dl().data, src.k_pages, h->k.nbytes());
  copy_to_host(s, h->v.dl().data, src.v_pages, h->v.nbytes());
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
