// The paged CPU KV store through its C table: bookkeeping, dtype conversion, views, sidecars,
// eviction that really returns memory, and clear statuses on bad input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "kv_test_support.hpp"
#include "sieve/kv/paged_store.hpp"
#include "sieve/util/tensor.hpp"

using namespace sieve;

namespace {

using kv_test::keep_last_reason;
using kv_test::make_append;
using kv_test::make_config;
using kv_test::random_tokens;
using kv_test::Store;

constexpr int kMaxBatch = 8;  // sequences one view may take

// Value of token t (in token order) of a sequence, read back through the view.
float read_kv(const sieve_paged_kv& view, int b, int t, int h, int d, bool value, int hkv, int hd) {
  const int32_t* indptr = view.indptr_host;
  const int32_t* indices = data_ptr<int32_t>(view.indices);
  int page = indices[indptr[b] + t / view.page_size];
  int64_t off = ((int64_t(page) * hkv + h) * view.page_size + t % view.page_size) * hd + d;
  const DLTensor& pool = value ? view.v_pages : view.k_pages;
  return load_float(data_ptr<void>(pool), pool.dtype, off);
}

int64_t resident_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

}  // namespace

TEST(PagedCpuStore, AppendsRaggedBatchesAndViewsThemInTokenOrder) {
  const int hkv = 2, d = 8, page = 16;
  Store st(make_config(2, hkv, d, page, kF32, 64, kCpu, kMaxBatch));
  std::vector<int32_t> ids = {st.add(), st.add(), st.add()};
  // Two appends per sequence (prefill then two decode tokens) with ragged lengths.
  std::vector<int> lens1 = {1, 17, 40}, total = {3, 19, 42};
  std::vector<std::vector<HostTensor>> kept(3);
  for (int round = 0; round < 2; ++round) {
    std::vector<int32_t> indptr = {0};
    for (int b = 0; b < 3; ++b) indptr.push_back(indptr.back() + (round == 0 ? lens1[b] : 2));
    HostTensor k = random_tokens(indptr.back(), hkv, d, kF32, 7 + round);
    HostTensor v = random_tokens(indptr.back(), hkv, d, kF32, 70 + round);
    auto a = make_append(1, ids, indptr, &k.dl(), &v.dl());
    ASSERT_EQ(st.api->append(st.s, &a), SIEVE_OK) << st.error();
    for (int b = 0; b < 3; ++b) kept[b].push_back(k), kept[b].push_back(v);
    if (round == 0) {
      // Keep the row offsets of each sequence for the check below.
    }
  }
  sieve_paged_kv view{};
  ASSERT_EQ(st.api->view(st.s, 1, ids.data(), 3, &view), SIEVE_OK) << st.error();
  EXPECT_EQ(view.batch, 3);
  for (int b = 0; b < 3; ++b) {
    int32_t len = -1;
    ASSERT_EQ(st.api->seq_len(st.s, 1, ids[b], &len), SIEVE_OK);
    EXPECT_EQ(len, total[b]);
    int npages = view.indptr_host[b + 1] - view.indptr_host[b];
    EXPECT_EQ(npages, (total[b] + page - 1) / page);
    EXPECT_EQ(view.last_page_len_host[b], total[b] - (npages - 1) * page);
    EXPECT_EQ(data_ptr<int32_t>(view.last_page_len)[b], view.last_page_len_host[b]);
  }
  // Token contents: first-round rows then second-round rows, each at its own offset.
  std::vector<int32_t> off1 = {0, 1, 18}, off2 = {0, 2, 4};
  for (int b = 0; b < 3; ++b)
    for (int t = 0; t < total[b]; ++t)
      for (int h = 0; h < hkv; ++h)
        for (int dd = 0; dd < d; ++dd) {
          bool first = t < lens1[b];
          int row = first ? off1[b] + t : off2[b] + (t - lens1[b]);
          const HostTensor& K = kept[b][first ? 0 : 2];
          const HostTensor& V = kept[b][first ? 1 : 3];
          ASSERT_EQ(read_kv(view, b, t, h, dd, false, hkv, d), K.get((int64_t(row) * hkv + h) * d + dd));
          ASSERT_EQ(read_kv(view, b, t, h, dd, true, hkv, d), V.get((int64_t(row) * hkv + h) * d + dd));
        }
  // Layer 0 saw nothing.
  int32_t len0 = -1;
  ASSERT_EQ(st.api->seq_len(st.s, 0, ids[2], &len0), SIEVE_OK);
  EXPECT_EQ(len0, 0);
}

TEST(PagedCpuStore, ConvertsToBf16AndF16StorageWithRoundToNearest) {
  for (DLDataType dt : {kBF16, kF16}) {
    Store st(make_config(1, 4, 64, 32, dt, 8, kCpu, kMaxBatch));
    std::vector<int32_t> ids = {st.add()};
    std::vector<int32_t> indptr = {0, 45};
    HostTensor k = random_tokens(45, 4, 64, kF32, 3), v = random_tokens(45, 4, 64, kF32, 4);
    auto a = make_append(0, ids, indptr, &k.dl(), &v.dl());
    ASSERT_EQ(st.api->append(st.s, &a), SIEVE_OK) << st.error();
    sieve_paged_kv view{};
    ASSERT_EQ(st.api->view(st.s, 0, ids.data(), 1, &view), SIEVE_OK);
    EXPECT_TRUE(same_dtype(view.k_pages.dtype, dt));
    for (int t = 0; t < 45; ++t)
      for (int h = 0; h < 4; ++h)
        for (int dd = 0; dd < 64; ++dd) {
          float ref = k.get((int64_t(t) * 4 + h) * 64 + dd);
          uint16_t bits = dt.code == kDLBfloat ? f32_to_bf16(ref) : f32_to_f16(ref);
          float want = dt.code == kDLBfloat ? bf16_to_f32(bits) : f16_to_f32(bits);
          ASSERT_EQ(read_kv(view, 0, t, h, dd, false, 4, 64), want);
        }
  }
}

TEST(PagedCpuStore, CapacityFailureLeavesTheStoreUnchanged) {
  Store st(make_config(1, 1, 8, 16, kF32, 4, kCpu, kMaxBatch));
  std::vector<int32_t> ids = {st.add()};
  std::vector<int32_t> indptr = {0, 50};  // 4 pages: fits
  HostTensor k = random_tokens(50, 1, 8, kF32, 1), v = random_tokens(50, 1, 8, kF32, 2);
  auto a = make_append(0, ids, indptr, &k.dl(), &v.dl());
  ASSERT_EQ(st.api->append(st.s, &a), SIEVE_OK);
  std::vector<int32_t> indptr2 = {0, 15};  // needs a 5th page
  HostTensor k2 = random_tokens(15, 1, 8, kF32, 1), v2 = random_tokens(15, 1, 8, kF32, 2);
  auto a2 = make_append(0, ids, indptr2, &k2.dl(), &v2.dl());
  EXPECT_EQ(st.api->append(st.s, &a2), SIEVE_ERR_CAPACITY);
  EXPECT_NE(std::string(st.error()).find("page pool full"), std::string::npos) << st.error();
  int32_t len = 0;
  ASSERT_EQ(st.api->seq_len(st.s, 0, ids[0], &len), SIEVE_OK);
  EXPECT_EQ(len, 50);
}

TEST(PagedCpuStore, SidecarsAreZeroWhenAPageIsReallocated) {
  Store st(make_config(1, 2, 8, 16, kF32, 4, kCpu, kMaxBatch));
  sieve_sidecar_desc d{};
  d.hdr = SIEVE_HEADER_INIT(sieve_sidecar_desc);
  d.name = "test.minmax";
  d.dtype = kF32;
  d.elems_per_head = 16;
  int32_t slot = -1;
  ASSERT_EQ(st.api->register_sidecar(st.s, &d, &slot), SIEVE_OK);
  EXPECT_EQ(st.api->register_sidecar(st.s, &d, &slot), SIEVE_ERR_INVALID_ARGUMENT);  // same name
  EXPECT_NE(std::string(st.error()).find("already registered"), std::string::npos);
  std::vector<int32_t> ids = {st.add()};
  std::vector<int32_t> indptr = {0, 40};
  HostTensor k = random_tokens(40, 2, 8, kF32, 1), v = random_tokens(40, 2, 8, kF32, 2);
  auto a = make_append(0, ids, indptr, &k.dl(), &v.dl());
  ASSERT_EQ(st.api->append(st.s, &a), SIEVE_OK);
  DLTensor side{};
  ASSERT_EQ(st.api->sidecar(st.s, 0, slot, &side), SIEVE_OK);
  ASSERT_EQ(side.ndim, 3);
  EXPECT_EQ(side.shape[0], 4);
  EXPECT_EQ(side.shape[1], 2);
  EXPECT_EQ(side.shape[2], 16);
  float* sp = data_ptr<float>(side);
  for (int i = 0; i < 4 * 2 * 16; ++i) sp[i] = 1.5f;  // a policy writes its metadata
  ASSERT_EQ(st.api->remove_sequence(st.s, ids[0]), SIEVE_OK);
  int32_t id2 = st.add();
  std::vector<int32_t> ids2 = {id2};
  std::vector<int32_t> indptr2 = {0, 1};
  HostTensor k2 = random_tokens(1, 2, 8, kF32, 5), v2 = random_tokens(1, 2, 8, kF32, 6);
  auto a2 = make_append(0, ids2, indptr2, &k2.dl(), &v2.dl());
  ASSERT_EQ(st.api->append(st.s, &a2), SIEVE_OK);
  sieve_paged_kv view{};
  ASSERT_EQ(st.api->view(st.s, 0, ids2.data(), 1, &view), SIEVE_OK);
  int page = data_ptr<int32_t>(view.indices)[0];
  for (int i = 0; i < 2 * 16; ++i) EXPECT_EQ(sp[page * 32 + i], 0.f);
  EXPECT_EQ(st.api->sidecar(st.s, 0, slot + 1, &side), SIEVE_ERR_NOT_FOUND);
}

TEST(PagedCpuStore, EvictionFreesBytesAndReturnsMemoryToTheOs) {
  // 8 KV heads x 64 tokens x 128 dims x f32 = 256 KiB per page for K (and V): far above OS pages.
  const int hkv = 8, d = 128, page = 64, pages = 48;
  Store st(make_config(1, hkv, d, page, kF32, pages, kCpu, kMaxBatch));
  std::vector<int32_t> ids = {st.add()};
  const int tokens = 40 * page + 5;
  std::vector<int32_t> indptr = {0, tokens};
  HostTensor k = random_tokens(tokens, hkv, d, kF32, 1), v = random_tokens(tokens, hkv, d, kF32, 2);
  auto a = make_append(0, ids, indptr, &k.dl(), &v.dl());
  ASSERT_EQ(st.api->append(st.s, &a), SIEVE_OK);
  uint64_t before = 0;
  ASSERT_EQ(st.api->bytes_in_use(st.s, &before), SIEVE_OK);
  const uint64_t page_bytes = uint64_t(2) * hkv * page * d * 4;
  EXPECT_EQ(before, 41 * page_bytes);
  sieve_paged_kv view{};
  ASSERT_EQ(st.api->view(st.s, 0, ids.data(), 1, &view), SIEVE_OK);
  std::vector<int32_t> old(data_ptr<int32_t>(view.indices), data_ptr<int32_t>(view.indices) + 41);
  float keep = read_kv(view, 0, 31 * page + 3, 5, 77, true, hkv, d);

  int64_t rss_before = resident_bytes();
  std::vector<int32_t> evict;
  for (int p = 1; p < 31; ++p) evict.push_back(p);  // keep page 0 (a sink) and the recent pages
  uint64_t freed = 0;
  ASSERT_EQ(st.api->evict(st.s, 0, ids[0], evict.data(), int32_t(evict.size()), &freed), SIEVE_OK) << st.error();
  int64_t rss_after = resident_bytes();
  EXPECT_EQ(freed, 30 * page_bytes);
  uint64_t after = 0;
  ASSERT_EQ(st.api->bytes_in_use(st.s, &after), SIEVE_OK);
  EXPECT_EQ(after, before - freed);
  // The OS got (nearly all of) it back.
  EXPECT_GT(rss_before - rss_after, int64_t(0.9 * double(freed))) << rss_before << " -> " << rss_after;
  int32_t len = 0;
  ASSERT_EQ(st.api->seq_len(st.s, 0, ids[0], &len), SIEVE_OK);
  EXPECT_EQ(len, tokens - 30 * page);
  // Remaining pages keep their order and contents: old logical page 31 is now page 1.
  ASSERT_EQ(st.api->view(st.s, 0, ids.data(), 1, &view), SIEVE_OK);
  EXPECT_EQ(view.indptr_host[1], 11);
  EXPECT_EQ(data_ptr<int32_t>(view.indices)[0], old[0]);
  EXPECT_EQ(data_ptr<int32_t>(view.indices)[1], old[31]);
  EXPECT_EQ(read_kv(view, 0, 1 * page + 3, 5, 77, true, hkv, d), keep);
}

TEST(PagedCpuStore, BadInputGetsAStatusAndOneClearMessage) {
  Store st(make_config(2, 2, 8, 16, kF32, 4, kCpu, kMaxBatch));
  int32_t id = st.add();
  std::vector<int32_t> ids = {id};
  std::vector<int32_t> indptr = {0, 3};
  HostTensor k = random_tokens(3, 2, 8, kF32, 1), v = random_tokens(3, 2, 8, kF32, 2);
  HostTensor wrong = random_tokens(3, 2, 4, kF32, 2);  // head_dim 4, store has 8
  auto a = make_append(0, ids, indptr, &k.dl(), &wrong.dl());
  EXPECT_EQ(st.api->append(st.s, &a), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(st.error()).find("append: v: dim 2 is 4, expected 8"), std::string::npos) << st.error();
  a = make_append(5, ids, indptr, &k.dl(), &v.dl());
  EXPECT_EQ(st.api->append(st.s, &a), SIEVE_ERR_NOT_FOUND);
  EXPECT_NE(std::string(st.error()).find("layer 5 out of range (store has 2 layers)"), std::string::npos);
  std::vector<int32_t> unknown = {42};
  a = make_append(0, unknown, indptr, &k.dl(), &v.dl());
  EXPECT_EQ(st.api->append(st.s, &a), SIEVE_ERR_NOT_FOUND);
  EXPECT_NE(std::string(st.error()).find("unknown sequence id 42"), std::string::npos);
  a = make_append(0, ids, indptr, &k.dl(), &v.dl());
  ASSERT_EQ(st.api->append(st.s, &a), SIEVE_OK);
  int32_t last = 0;
  EXPECT_EQ(st.api->evict(st.s, 0, id, &last, 1, nullptr), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(st.error()).find("last page"), std::string::npos);
  int32_t far = 9;
  EXPECT_EQ(st.api->evict(st.s, 0, id, &far, 1, nullptr), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(st.error()).find("page 9 out of range"), std::string::npos);
  EXPECT_EQ(st.api->append(st.s, nullptr), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(st.api->view(st.s, 0, ids.data(), 1, nullptr), SIEVE_ERR_INVALID_ARGUMENT);

  // A configuration the store cannot take is refused at create with the reason.
  auto bad = make_config(1, 2, 8, 24, kF32, 4, kCpu, kMaxBatch);
  std::string err;
  sieve_kv_store* s = nullptr;
  EXPECT_EQ(st.api->create(nullptr, &bad, &s, keep_last_reason(&err)), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(s, nullptr);
  EXPECT_NE(err.find("page_size must be 16, 32 or 64, got 24"), std::string::npos) << err;
}
