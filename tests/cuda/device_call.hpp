// A reference Workload's attention call on the device: its tensors uploaded once and the
// sieve_attention_args that point at them; run() poisons the outputs, calls attend_cuda and reads
// them back. Shared by the CUDA kernel tests (attention_cuda_test.cpp, attention_variant_cuda_test.cpp).
#pragma once
#include <string>

#include "cuda_test_util.hpp"
#include "sieve/kernels/attention_cuda.hpp"
#include "sieve/kernels/attention_cuda_checks.hpp"
#include "sieve/reference/page_pool.hpp"
#include "sieve/reference/workload.hpp"

namespace sieve::cuda_test {

// A workload's tensors on the device and the sieve_attention_args that point at them. Inputs are
// uploaded once (after the workload is set up, tampering included); outputs on every run. With a
// `pool`, K and V are its engine-layout copy (strided views over one device buffer).
class DeviceCall {
 public:
  explicit DeviceCall(reference::Workload& w, const reference::LaidOutPool* pool = nullptr) : w_(w) {
    q_ = DeviceTensor(w.q);
    out_ = DeviceTensor(w.out);
    qo_ = DeviceTensor(w.qo_indptr);
    k_ = DeviceTensor(w.k_pages);
    v_ = DeviceTensor(w.v_pages);
    kv_indptr_ = DeviceTensor(w.kv_indptr);
    kv_indices_ = DeviceTensor(w.kv_indices);
    kv_last_ = DeviceTensor(w.kv_last_page_len);
    kv_ = w.kv;
    kv_.k_pages = k_.dl;
    kv_.v_pages = v_.dl;
    if (pool) {
      pool_ = DeviceTensor(pool->storage);
      kv_.k_pages = pool->k_view(pool_.dl);
      kv_.v_pages = pool->v_view(pool_.dl);
    }
    kv_.indptr = kv_indptr_.dl;
    kv_.indices = kv_indices_.dl;
    kv_.last_page_len = kv_last_.dl;
    args = w.args;
    args.q = &q_.dl;
    args.out = &out_.dl;
    args.qo_indptr = &qo_.dl;
    args.kv = &kv_;
    if (w.args.selection) {
      sel_indptr_ = DeviceTensor(w.sel_indptr);
      sel_indices_ = DeviceTensor(w.sel_indices);
      sel_ = *w.args.selection;
      sel_.indptr = sel_indptr_.dl;
      sel_.indices = sel_indices_.dl;
      args.selection = &sel_;
    }
    if (w.args.q_rows) {
      q_rows_ = DeviceTensor(w.q_rows);
      args.q_rows = &q_rows_.dl;
    }
    if (w.args.lse) {
      lse_ = DeviceTensor(w.lse);
      args.lse = &lse_.dl;
    }
    if (w.args.page_mass) {
      page_mass_ = DeviceTensor(w.page_mass);
      args.page_mass = &page_mass_.dl;
    }
  }

  // Poisons the outputs, runs attend_cuda on `stream`, reads the outputs back into the workload.
  sieve_status run(cudaStream_t stream, const kernels::CudaAttentionOptions& opt, std::string* err) {
    poison();
    const sieve_status st = kernels::attend_cuda(args, opt, stream, err);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    download();
    return st;
  }
  // Poisons the outputs, captures attend_cuda on `stream` into a CUDA graph (the capture fails if
  // the call synchronises or allocates device-wide), replays it once and reads the outputs back.
  void run_captured(cudaStream_t stream, const kernels::CudaAttentionOptions& opt, std::string* err) {
    poison();
    cudaGraph_t graph = nullptr;
    SIEVE_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const sieve_status st = kernels::attend_cuda(args, opt, stream, err);
    SIEVE_CUDA_OK(cudaStreamEndCapture(stream, &graph));
    ASSERT_EQ(st, SIEVE_OK) << *err;
    cudaGraphExec_t exec = nullptr;
    SIEVE_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    SIEVE_CUDA_OK(cudaGraphLaunch(exec, stream));
    SIEVE_CUDA_OK(cudaStreamSynchronize(stream));
    download();
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  void poison() {
    w_.poison_outputs();
    out_.upload(w_.out);
    if (args.lse) lse_.upload(w_.lse);
    if (args.page_mass) page_mass_.upload(w_.page_mass);
  }
  void download() {
    out_.download(w_.out);
    if (args.lse) lse_.download(w_.lse);
    if (args.page_mass) page_mass_.download(w_.page_mass);
  }

  sieve_attention_args args{};
  sieve_paged_kv& kv() { return kv_; }  // what args.kv points at, for tampering

 private:
  reference::Workload& w_;
  DeviceTensor q_, out_, qo_, k_, v_, kv_indptr_, kv_indices_, kv_last_, sel_indptr_, sel_indices_,
      q_rows_, lse_, page_mass_, pool_;
  sieve_paged_kv kv_{};
  sieve_selection sel_{};
};

}  // namespace sieve::cuda_test
