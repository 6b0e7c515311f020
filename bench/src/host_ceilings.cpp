// The CPU cases' ceilings: memcpy and read-only streams over the cases' threads (once at the start,
// and one repetition of each right before every timed decode call: HostStreamProbe), paged
// read-only slabs, OpenBLAS sgemm, and the CPU's name. Buffers are PoolBuffers (huge pages) far
// past any last-level cache.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <utility>

#include "host_buffer.hpp"
#include "runner.hpp"

namespace sieve::bench {
namespace {

using Clock = std::chrono::steady_clock;

double elapsed_ms(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Sum of the 64-bit words of [p, p + bytes) (the compiler vectorises it; 8 independent sums keep
// the adds off the critical path), and the same over 4 KiB slabs of K and V at offsets off[0, n)
// with the next slab pair's lines prefetched one per line read.
uint64_t sum_words(const unsigned char* p, size_t bytes) {
  const auto* w = reinterpret_cast<const uint64_t*>(p);
  uint64_t s[8] = {};
  for (size_t i = 0; i + 8 <= bytes / 8; i += 8)
    for (int k = 0; k < 8; ++k) s[k] += w[i + size_t(k)];
  return std::accumulate(s, s + 8, uint64_t(0));
}

uint64_t sum_slabs(const unsigned char* k, const unsigned char* v, const size_t* off, size_t n) {
  constexpr size_t kSlab = 4096;
  uint64_t s[8] = {};
  for (size_t j = 0; j < n; ++j)
    for (const unsigned char* base : {k, v})
      for (size_t b = 0; b < kSlab; b += 64) {
        if (j + 1 < n) __builtin_prefetch(base + off[j + 1] + b, 0, 3);
        const auto* w = reinterpret_cast<const uint64_t*>(base + off[j] + b);
        for (int e = 0; e < 8; ++e) s[e] += w[e];
      }
  return std::accumulate(s, s + 8, uint64_t(0));
}

// Median rate of reps timed repetitions after one warm-up; `once` returns GB/s.
template <class F>
double median_rate(int reps, F once) {
  once();  // warm-up (threads started, pages mapped)
  std::vector<double> gbs;
  for (int r = 0; r < reps; ++r) gbs.push_back(once());
  std::sort(gbs.begin(), gbs.end());
  return gbs.size() % 2 ? gbs[gbs.size() / 2] : 0.5 * (gbs[gbs.size() / 2 - 1] + gbs[gbs.size() / 2]);
}

}  // namespace

HostStreamProbe::HostStreamProbe(int threads, size_t bytes)
    : threads_(std::max(threads, 1)), bytes_(bytes / size_t(std::max(threads, 1)) / 64 * 64 * size_t(std::max(threads, 1))),
      src_(std::make_unique<PoolBuffer>(bytes_)), dst_(std::make_unique<PoolBuffer>(bytes_)),
      sink_(size_t(threads_) * 8) {
  fill_host_random(src_->data(), kF32, int64_t(bytes_ / 4), 3);
  std::memset(dst_->data(), 1, bytes_);  // touch the pages before timing
}
HostStreamProbe::~HostStreamProbe() {
  if (std::accumulate(sink_.begin(), sink_.end(), uint64_t(0)) == 1) std::puts("");  // keep the sums
}

double HostStreamProbe::copy_gbs() {
  const size_t chunk = bytes_ / size_t(threads_);
  unsigned char* d = dst_->data();
  const unsigned char* s = src_->data();
  const auto t0 = Clock::now();
#pragma omp parallel for num_threads(threads_) schedule(static)
  for (int i = 0; i < threads_; ++i) std::memcpy(d + size_t(i) * chunk, s + size_t(i) * chunk, chunk);
  return 2.0 * double(bytes_) / (elapsed_ms(t0) * 1e-3) / 1e9;
}

double HostStreamProbe::read_gbs() {
  const size_t chunk = bytes_ / size_t(threads_);
  const unsigned char* s = src_->data();
  const auto t0 = Clock::now();
#pragma omp parallel for num_threads(threads_) schedule(static)
  for (int i = 0; i < threads_; ++i) sink_[size_t(i) * 8] += sum_words(s + size_t(i) * chunk, chunk);
  return double(bytes_) / (elapsed_ms(t0) * 1e-3) / 1e9;
}

std::pair<double, double> measure_host_stream_gbs(HostStreamProbe& probe) {
  return {median_rate(6, [&] { return probe.copy_gbs(); }), median_rate(6, [&] { return probe.read_gbs(); })};
}

double measure_host_paged_read_gbs(int threads) {
  const size_t bytes = size_t(1) << 30, slab = 4096, slabs = bytes / 2 / slab;
  PoolBuffer a(bytes);
  fill_host_random(a.data(), kF32, int64_t(bytes / 4), 5);
  const unsigned char* k = a.data();
  const unsigned char* v = a.data() + bytes / 2;
  std::vector<size_t> off(slabs);
  for (size_t i = 0; i < slabs; ++i) off[i] = i * slab;
  std::shuffle(off.begin(), off.end(), std::mt19937_64(7));
  const int t = std::max(threads, 1);
  const size_t per = slabs / size_t(t);
  std::vector<uint64_t> sink(size_t(t) * 8);  // a result per thread, a line apart
  const double gbs = median_rate(6, [&] {
    const auto t0 = Clock::now();
#pragma omp parallel for num_threads(t) schedule(static)
    for (int i = 0; i < t; ++i) sink[size_t(i) * 8] += sum_slabs(k, v, off.data() + per * size_t(i), per);
    return double(per * size_t(t)) * 2 * slab / (elapsed_ms(t0) * 1e-3) / 1e9;
  });
  if (std::accumulate(sink.begin(), sink.end(), uint64_t(0)) == 1) std::puts("");  // keep the sums
  return gbs;
}

// Square sgemm of n = 3072 (three 36 MiB operands, each past a 32 MiB LLC) on `threads` OpenBLAS
// threads, FLOP/s of the median of 5 calls after a warm-up. The attention kernel's own sgemm
// calls are below OpenBLAS's threading threshold, so the setting changes nothing for them.
double measure_host_sgemm_gflops(int threads) {
  const int n = 3072;
  const size_t bytes = size_t(n) * n * sizeof(float);
  PoolBuffer a(bytes), b(bytes), c(bytes);
  fill_host_random(a.data(), kF32, int64_t(n) * n, 4);
  fill_host_random(b.data(), kF32, int64_t(n) * n, 5);
  std::memset(c.data(), 0, bytes);
  openblas_set_num_threads(std::max(threads, 1));
  auto* A = reinterpret_cast<const float*>(a.data());
  auto* B = reinterpret_cast<const float*>(b.data());
  auto* C = reinterpret_cast<float*>(c.data());
  return median_rate(5, [&] {
    const auto t0 = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, A, n, B, n, 0.f, C, n);
    return 2.0 * double(n) * n * n / (elapsed_ms(t0) * 1e-3) / 1e9;
  });
}

std::string host_cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  return "unknown CPU";
}

}  // namespace sieve::bench
