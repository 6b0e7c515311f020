// The benchmark's device arena: an upload lands in stream order on the case's non-blocking stream,
// after the work queued there before it and before the kernels queued after it (the suite case
// gpu/prefill/64q8kv128/bs1/ctx16384/bf16/sparse0.50 read zeros of its selection on an H200 when
// the uploads were plain cudaMemcpy calls on the legacy stream). Skips without a CUDA device.
#include "device_arena.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <numeric>
#include <vector>

#include "cuda/cuda_test_util.hpp"

namespace sieve::bench {
namespace {

using cuda_test::CudaTest;

// A host function that holds its stream until open() (or a timeout, so that a copy which waits for
// the stream cannot deadlock the test: such a copy is in stream order too).
class Gate {
 public:
  static void CUDART_CB hold(void* self) {
    auto* g = static_cast<Gate*>(self);
    std::unique_lock lock(g->m_);
    g->cv_.wait_for(lock, std::chrono::seconds(10), [g] { return g->open_; });
  }
  void open() {
    {
      std::lock_guard lock(m_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool open_ = false;
};

class DeviceArenaTest : public CudaTest {};

TEST_F(DeviceArenaTest, UploadLandsAfterTheWorkQueuedBeforeItOnItsStream) {
  std::vector<int32_t> h(64 * 1024);  // 256 KiB: the failing selection's size
  std::iota(h.begin(), h.end(), 1);
  const size_t bytes = h.size() * sizeof(int32_t);
  DeviceArena arena;
  ASSERT_TRUE(arena.reserve(bytes));
  void* piece = arena.take(bytes);  // where the upload will land: reserve() starts over at it
  ASSERT_TRUE(arena.reserve(bytes));

  // On the stream, held: poison the piece. Then the upload. In stream order the upload comes last
  // and the piece holds h; a copy outside the stream lands first and the poison overwrites it.
  Gate gate;
  SIEVE_CUDA_OK(cudaLaunchHostFunc(stream_, &Gate::hold, &gate));
  SIEVE_CUDA_OK(cudaMemsetAsync(piece, 0xff, bytes, stream_));
  cudaError_t e = cudaSuccess;
  int32_t* d = arena.upload(h, stream_, &e);
  SIEVE_CUDA_OK(e);
  ASSERT_EQ(static_cast<void*>(d), piece);
  // A copy on the legacy stream has landed once this returns (it does not wait for stream_).
  SIEVE_CUDA_OK(cudaStreamSynchronize(cudaStreamLegacy));
  gate.open();
  SIEVE_CUDA_OK(cudaStreamSynchronize(stream_));

  std::vector<int32_t> back(h.size());
  SIEVE_CUDA_OK(cudaMemcpy(back.data(), d, bytes, cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, h);
}

TEST_F(DeviceArenaTest, EmptyUploadTakesAPieceAndCopiesNothing) {
  DeviceArena arena;
  ASSERT_TRUE(arena.reserve(1024));
  cudaError_t e = cudaSuccess;
  const std::vector<int32_t> none;
  int32_t* a = arena.upload(none, stream_, &e);
  int32_t* b = arena.upload(none, stream_, &e);
  SIEVE_CUDA_OK(e);
  // Each takes one element's room (a valid pointer for a zero-length tensor), 256-byte aligned.
  EXPECT_EQ(reinterpret_cast<char*>(b) - reinterpret_cast<char*>(a), 256);
}

}  // namespace
}  // namespace sieve::bench
