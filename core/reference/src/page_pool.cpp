// Engine-layout copies of a compact HND page pool (see page_pool.hpp).
#include "sieve/reference/page_pool.hpp"

#include <cstring>
#include <stdexcept>
#include <string>

namespace sieve::reference {

LaidOutPool::LaidOutPool(const DLTensor& k, const DLTensor& v, KvLayout layout) {
  if (k.ndim != 4 || v.ndim != 4 || !is_contiguous(k) || !is_contiguous(v) ||
      !same_dtype(k.dtype, v.dtype) || k.device.device_type != kDLCPU ||
      v.device.device_type != kDLCPU)
    throw std::invalid_argument("LaidOutPool: k and v must be compact host [cap, H, P, D] pages of one dtype");
  for (int i = 0; i < 4; ++i) {
    if (k.shape[i] != v.shape[i]) throw std::invalid_argument("LaidOutPool: k and v shapes differ");
    shape_[i] = k.shape[i];
  }
  dtype_ = k.dtype;
  const int64_t cap = shape_[0], H = shape_[1], P = shape_[2], D = shape_[3];
  const int64_t page = H * P * D;
  const bool combined = layout.bit == SIEVE_KV_LAYOUT_COMBINED;
  const PageStrides at = layout_strides(layout, H, P, D);
  if (at.page == 0) throw std::invalid_argument("LaidOutPool: unknown layout");
  strides_[0] = at.page;
  strides_[1] = at.head;
  strides_[2] = at.token;
  strides_[3] = 1;
  const size_t elem = dtype_bytes(dtype_);
  v_byte_offset_ = uint64_t(combined ? page : cap * page) * elem;
  storage = HostTensor({2 * cap * page}, dtype_);

  const auto* ks = data_ptr<const unsigned char>(k);
  const auto* vs = data_ptr<const unsigned char>(v);
  unsigned char* dst = storage.data<unsigned char>();
  for (int64_t c = 0; c < cap; ++c)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < P; ++t) {
        const size_t src = size_t(((c * H + h) * P + t) * D) * elem;
        const size_t to = size_t(at.row(c, h, t)) * elem;
        std::memcpy(dst + to, ks + src, size_t(D) * elem);
        std::memcpy(dst + v_byte_offset_ + to, vs + src, size_t(D) * elem);
      }
}

DLTensor LaidOutPool::view(const DLTensor& mem, uint64_t byte_offset) const {
  DLTensor t = make_view(data_ptr<void>(mem), mem.device, dtype_, 4,
                         const_cast<int64_t*>(shape_), const_cast<int64_t*>(strides_));
  t.byte_offset = byte_offset;
  return t;
}
DLTensor LaidOutPool::k_view(const DLTensor& mem) const { return view(mem, 0); }
DLTensor LaidOutPool::v_view(const DLTensor& mem) const { return view(mem, v_byte_offset_); }

void LaidOutPool::install(sieve_paged_kv& kv) const {
  kv.k_pages = k_view(storage.dl());
  kv.v_pages = v_view(storage.dl());
}

}  // namespace sieve::reference
