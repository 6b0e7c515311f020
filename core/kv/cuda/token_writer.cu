// The scatter kernel and the staging ring of token_writer.cuh.
#include "token_writer.cuh"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "sieve/util/error.hpp"
#include "sieve/util/storage_cuda.cuh"
#include "sieve/util/tensor.hpp"

namespace sieve::kv {

void check_cuda(cudaError_t e, const char* who, const char* what) {
  if (e != cudaSuccess)
    fail(SIEVE_ERR_DEVICE, std::string(who) + ": " + what + " failed: " + cudaGetErrorName(e) + " (" +
                               cudaGetErrorString(e) + ")");
}

DeviceScope::DeviceScope(int device) {
  check_cuda(cudaGetDevice(&prev_), "KV store", "cudaGetDevice");
  if (prev_ != device) {
    check_cuda(cudaSetDevice(device), "KV store", "cudaSetDevice");
    changed_ = true;
  }
}
DeviceScope::~DeviceScope() {
  if (changed_) cudaSetDevice(prev_);
}

namespace {

constexpr size_t kStageBytes = size_t(256) << 10;
constexpr int64_t kSlotsPerChunk = int64_t(kStageBytes / sizeof(TokenSlot));
constexpr int64_t kInline = TokenWriter::kInlineSlots;

// Same dtype: copy the bits (NaN payloads included), as the CPU stores' memcpy does.
template <class S, class D>
__device__ inline D convert(S v) {
  if constexpr (std::is_same_v<S, D>) return v;
  else return from_f32<D>(to_f32<S>(v));
}

struct ScatterSource {
  const void* data;  // element 0 of the [n_tokens, n_kv_heads, head_dim] input
  int64_t s0, s1;    // strides (elements) of token and head; head_dim is unit-stride
  PoolTarget pool;   // destination pages
};

// The inputs one launch scatters (K, V and pre-RoPE K when they share a dtype), in one grid.
struct ScatterSources {
  ScatterSource s[3];
  int32_t n;
};

// The slots of one launch: a decode step's few slots travel in the kernel's parameters (no copy,
// no staging buffer), larger appends in device memory (`list`, uploaded through the ring).
// A launch may also write a view's last_page_len (the store's view_last).
struct SlotList {
  const TokenSlot* list;  // null: the slots are `inline_slots`
  int64_t n;
  TokenSlot inline_slots[kInline];
  int32_t* last_dst;  // null, or where view_last[0, n_last) goes
  int32_t n_last;
  int32_t view_last[kInline];
};

static_assert(sizeof(SlotList) + sizeof(ScatterSources) + 2 * sizeof(int32_t) <= 4096,
              "scatter_tokens' parameters must stay within 4 KB");

// One thread per (source, slot, head, dim): row `src` of the input lands in (page, offset).
// __grid_constant__: the parameters are read in place (indexed by slot), never copied per thread.
template <class S, class D>
__global__ void scatter_tokens(const __grid_constant__ SlotList slots, int32_t hkv, int32_t head_dim,
                               const __grid_constant__ ScatterSources src) {
  if (slots.last_dst && blockIdx.x == 0 && int32_t(threadIdx.x) < slots.n_last)  // blockDim >= kInline
    slots.last_dst[threadIdx.x] = slots.view_last[threadIdx.x];
  const int64_t per_source = slots.n * hkv * head_dim;
  const int64_t total = per_source * src.n;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int32_t which = int32_t(i / per_source);
    const int64_t j = i - which * per_source;
    const int32_t d = int32_t(j % head_dim);
    const int32_t h = int32_t((j / head_dim) % hkv);
    const int64_t k = j / (int64_t(head_dim) * hkv);
    const TokenSlot ts = slots.list ? slots.list[k] : slots.inline_slots[k];
    const ScatterSource& in = src.s[which];
    const S v = static_cast<const S*>(in.data)[ts.src * in.s0 + h * in.s1 + d];
    const int64_t dst = ts.page * in.pool.page + h * in.pool.head + ts.offset * in.pool.slot + d;
    static_cast<D*>(in.pool.base)[dst] = convert<S, D>(v);
  }
}

template <class S, class D>
cudaError_t launch_scatter(const SlotList& slots, int32_t hkv, int32_t head_dim, const ScatterSources& src,
                           cudaStream_t stream) {
  const int64_t total = slots.n * hkv * head_dim * src.n;
  constexpr int threads = 256;
  static_assert(threads >= kInline, "block 0 writes view_last, one thread per entry");
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((total + threads - 1) / threads, 65535));
  scatter_tokens<S, D><<<unsigned(blocks), threads, 0, stream>>>(slots, hkv, head_dim, src);
  return cudaGetLastError();
}

cudaError_t scatter(DLDataType src_dt, DLDataType dst_dt, const SlotList& slots, int32_t hkv, int32_t head_dim,
                    const ScatterSources& src, cudaStream_t stream) {
  return dispatch_cuda_storage(require_storage(src_dt, "append: the new tokens"), [&](auto s) {
    return dispatch_cuda_storage(require_storage(dst_dt, "the store's pages"), [&](auto d) {
      return launch_scatter<typename decltype(s)::type, typename decltype(d)::type>(slots, hkv, head_dim, src, stream);
    });
  });
}

}  // namespace

TokenWriter::TokenWriter(const sieve_host_services* services, DLDevice device, cudaStream_t stream, const char* who)
    : services_(services), device_(device), stream_(stream), who_(who) {
  try {
    device_slots_ = static_cast<TokenSlot*>(services_->alloc(services_->host_ctx, device_, kStageBytes, 256));
    require(device_slots_ != nullptr, SIEVE_ERR_OUT_OF_MEMORY,
            std::string(who_) + ": cannot allocate " + std::to_string(kStageBytes) + " bytes of " +
                device_name(device_) + " memory for the token slot list");
    void* host = nullptr;
    check_cuda(cudaMallocHost(&host, kStageBytes * kStages), who_, "cudaMallocHost(staging ring)");
    staging_ = static_cast<char*>(host);
    for (auto& ev : stage_done_) {
      check_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), who_, "cudaEventCreate");
      ++n_events_;
    }
  } catch (...) {
    release();
    throw;
  }
}

TokenWriter::~TokenWriter() { release(); }

void TokenWriter::release() noexcept {
  cudaStreamSynchronize(stream_);  // teardown is not the hot path
  for (int i = 0; i < n_events_; ++i) cudaEventDestroy(stage_done_[size_t(i)]);
  n_events_ = 0;
  if (staging_) cudaFreeHost(staging_);
  staging_ = nullptr;
  if (device_slots_) services_->free(services_->host_ctx, device_, device_slots_);
  device_slots_ = nullptr;
}

bool TokenWriter::write(const std::vector<TokenSlot>& slots, const DLTensor* const inputs[3],
                        const PoolTarget targets[3], DLDataType dst_dtype, int32_t hkv, int32_t head_dim,
                        int32_t* last_dst, const int32_t* view_last, int32_t n_last) {
  // K, V (and pre-RoPE K) in one launch when they share a dtype (the usual case), else one
  // launch per dtype.
  std::array<ScatterSources, 3> groups{};
  std::array<DLDataType, 3> group_dtype{};
  int n_groups = 0;
  for (int i = 0; i < 3; ++i) {
    const DLTensor* t = inputs[i];
    if (!t) continue;
    if (t->device.device_id != device_.device_id)
      fail(SIEVE_ERR_INVALID_ARGUMENT,
           "append: input on " + device_name(t->device) + ", the store is on " + device_name(device_));
    int gi = 0;
    while (gi < n_groups && !same_dtype(group_dtype[size_t(gi)], t->dtype)) ++gi;
    if (gi == n_groups) group_dtype[size_t(n_groups++)] = t->dtype;
    ScatterSources& grp = groups[size_t(gi)];
    grp.s[grp.n++] = ScatterSource{data_ptr<const void>(*t), stride(*t, 0), stride(*t, 1), targets[i]};
  }
  SlotList list;
  // A decode step's view change (the view's last_page_len) goes with its one launch.
  const bool publish = view_last && last_dst && n_last <= kInline && int64_t(slots.size()) <= kInline;
  list.last_dst = publish ? last_dst : nullptr;
  list.n_last = publish ? n_last : 0;
  if (publish) std::memcpy(list.view_last, view_last, size_t(n_last) * sizeof(int32_t));
  for (size_t begin = 0; begin < slots.size(); begin += size_t(kSlotsPerChunk)) {
    list.n = std::min<int64_t>(kSlotsPerChunk, int64_t(slots.size() - begin));
    if (list.n <= kInline) {
      list.list = nullptr;
      std::memcpy(list.inline_slots, slots.data() + begin, size_t(list.n) * sizeof(TokenSlot));
    } else {
      upload(device_slots_, slots.data() + begin, size_t(list.n) * sizeof(TokenSlot));
      list.list = device_slots_;
    }
    for (int gi = 0; gi < n_groups; ++gi) {
      check_cuda(scatter(group_dtype[size_t(gi)], dst_dtype, list, hkv, head_dim, groups[size_t(gi)], stream_), who_,
                 "scatter kernel launch");
      list.last_dst = nullptr;  // written once
    }
  }
  return publish;
}

void TokenWriter::upload(void* dst, const void* src, size_t bytes) {
  for (size_t off = 0; off < bytes; off += kStageBytes) {
    const size_t n = std::min(kStageBytes, bytes - off);
    const int s = next_stage_;
    next_stage_ = (next_stage_ + 1) % kStages;
    // Host wait on the copy enqueued kStages uploads ago from this buffer (not a device sync).
    check_cuda(cudaEventSynchronize(stage_done_[size_t(s)]), who_, "cudaEventSynchronize(staging buffer)");
    char* stage = staging_ + size_t(s) * kStageBytes;
    std::memcpy(stage, static_cast<const char*>(src) + off, n);
    check_cuda(cudaMemcpyAsync(static_cast<char*>(dst) + off, stage, n, cudaMemcpyHostToDevice, stream_), who_,
               "cudaMemcpyAsync(staging -> device)");
    check_cuda(cudaEventRecord(stage_done_[size_t(s)], stream_), who_, "cudaEventRecord(staging buffer)");
  }
}

}  // namespace sieve::kv
