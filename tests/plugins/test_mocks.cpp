// The test doubles other policy tests build on: FakePagedKv keeps K/V where the page table says,
// evicts and frees, zeroes sidecars of reused pages; MockKvStore's C table reaches the gmock
// object and, by default, the fake; MockHostServices tracks what it hands out.
#include <gmock/gmock.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include "mocks/mock_host_services.hpp"
#include "mocks/mock_kv_store.hpp"
#include "support/layer_call.hpp"

namespace {

using namespace sieve::testing;
using ::testing::_;
using ::testing::NiceMock;
using ::testing::Return;

sieve_kv_config small_config(DLDataType dtype) {
  sieve_geometry g = test_geometry(4);
  g.kv_dtype = dtype;
  return test_kv_config(g, 8);
}

// K of token `tok`, head h, channel d of a sequence, read through a view like a kernel would.
float k_at(const sieve_paged_kv& v, int32_t b, int32_t tok, int32_t h, int32_t d) {
  const int32_t P = v.page_size;
  const int32_t page = sieve::data_ptr<int32_t>(v.indices)[v.indptr_host[b] + tok / P];
  const int64_t H = v.k_pages.shape[1], D = v.k_pages.shape[3];
  const int64_t i = ((int64_t(page) * H + h) * P + tok % P) * D + d;
  return sieve::load_float(v.k_pages.data, v.k_pages.dtype, i);
}

TEST(FakePagedKv, AppendedKeysAreWhereThePageTableSays) {
  for (DLDataType dt : {sieve::kF32, sieve::kBF16}) {
    FakePagedKv kv(small_config(dt));
    int32_t a = -1, b = -1;
    ASSERT_EQ(kv.add_sequence(&a), SIEVE_OK);
    ASSERT_EQ(kv.add_sequence(&b), SIEVE_OK);
    // Interleave appends so the two sequences' pages interleave in the pool.
    sieve::HostTensor k({10, 2, 8}, sieve::kF32), v({10, 2, 8}, sieve::kF32);
    for (int64_t i = 0; i < k.numel(); ++i) {
      k.set(i, 0.25f * float(i % 37) - 3.f);
      v.set(i, -1.f * float(i % 11));
    }
    const int32_t ids[2] = {a, b}, split[3] = {0, 3, 10};  // a gets tokens 0..2, b gets 3..9
    sieve_kv_append ap{};
    ap.hdr = SIEVE_HEADER_INIT(sieve_kv_append);
    ap.layer = 1;
    ap.batch = 2;
    ap.seq_ids = ids;
    ap.token_indptr = split;
    ap.k = &k.dl();
    ap.v = &v.dl();
    ASSERT_EQ(kv.append(&ap), SIEVE_OK) << kv.last_error();
    ASSERT_EQ(kv.append(&ap), SIEVE_OK) << kv.last_error();  // a: 6 tokens, b: 14 tokens
    sieve_paged_kv view{};
    ASSERT_EQ(kv.view(1, ids, 2, &view), SIEVE_OK);
    EXPECT_EQ(std::vector<int32_t>(view.indptr_host, view.indptr_host + 3), (std::vector<int32_t>{0, 2, 6}));
    EXPECT_EQ(std::vector<int32_t>(view.last_page_len_host, view.last_page_len_host + 2), (std::vector<int32_t>{2, 2}));
    for (int32_t tok = 0; tok < 14; ++tok) {
      const int32_t src = 3 + tok % 7;  // b's tokens repeat rows 3..9
      for (int32_t h = 0; h < 2; ++h)
        for (int32_t d = 0; d < 8; ++d) {
          const float x = k.get((src * 2 + h) * 8 + d);
          const float stored = dt.bits == 32 ? x : sieve::bf16_to_f32(sieve::f32_to_bf16(x));
          EXPECT_EQ(k_at(view, 1, tok, h, d), stored) << "token " << tok;
        }
    }
    int32_t len = 0;
    EXPECT_EQ(kv.seq_len(0, b, &len), SIEVE_OK);
    EXPECT_EQ(len, 0) << "layer 0 received nothing";
  }
}

TEST(FakePagedKv, EvictFreesPagesAndSidecarsOfReusedPagesAreZero) {
  FakePagedKv kv(small_config(sieve::kF32));
  std::mt19937 rng(3);
  int32_t s = -1;
  ASSERT_EQ(kv.add_sequence(&s), SIEVE_OK);
  sieve_sidecar_desc desc{SIEVE_HEADER_INIT(sieve_sidecar_desc), "test.minmax", sieve::kF32, 16};
  int32_t slot = -1;
  ASSERT_EQ(kv.register_sidecar(&desc, &slot), SIEVE_OK);
  EXPECT_EQ(kv.register_sidecar(&desc, &slot), SIEVE_ERR_INVALID_ARGUMENT) << "names are unique";
  ASSERT_EQ(kv.append_random(s, 14, rng), SIEVE_OK);  // 4 pages per layer
  const std::vector<int32_t> before = kv.pages(0, s);
  ASSERT_EQ(before.size(), 4u);

  DLTensor side{};
  ASSERT_EQ(kv.sidecar(0, slot, &side), SIEVE_OK);
  float* sc = sieve::data_ptr<float>(side);
  for (int64_t i = 0; i < sieve::numel(side); ++i) sc[i] = 7.f;  // a policy wrote every page

  uint64_t bytes0 = 0, bytes1 = 0, freed = 0;
  ASSERT_EQ(kv.bytes_in_use(&bytes0), SIEVE_OK);
  const int32_t victims[2] = {2, 0};
  ASSERT_EQ(kv.evict(0, s, victims, 2, &freed), SIEVE_OK) << kv.last_error();
  const uint64_t page_bytes = 2 * 2 * 4 * 8 * 4 + 2 * 16 * 4;  // K + V + sidecar
  EXPECT_EQ(freed, 2 * page_bytes);
  ASSERT_EQ(kv.bytes_in_use(&bytes1), SIEVE_OK);
  EXPECT_EQ(bytes0 - bytes1, freed);
  EXPECT_EQ(kv.pages(0, s), (std::vector<int32_t>{before[1], before[3]}));
  int32_t len = 0;
  ASSERT_EQ(kv.seq_len(0, s, &len), SIEVE_OK);
  EXPECT_EQ(len, 6);

  const int32_t last = 1;
  EXPECT_EQ(kv.evict(0, s, &last, 1, &freed), SIEVE_ERR_INVALID_ARGUMENT) << "the last page stays";
  EXPECT_EQ(kv.evict(0, s, victims, 2, &freed), SIEVE_ERR_INVALID_ARGUMENT) << kv.last_error();

  // Layer 0 now has free pages that held 7s; appending reuses them, zeroed.
  ASSERT_EQ(kv.append_random(s, 8, rng), SIEVE_OK);
  const std::vector<int32_t> after = kv.pages(0, s);
  ASSERT_EQ(after.size(), 4u);
  for (size_t i = 2; i < after.size(); ++i)
    for (int64_t e = 0; e < 2 * 16; ++e) EXPECT_EQ(sc[after[i] * 32 + e], 0.f) << "page " << after[i];
}

TEST(MockKvStore, TheCTableReachesTheMockAndDelegatesToTheFake) {
  FakePagedKv fake(small_config(sieve::kF32));
  NiceMock<MockKvStore> store;
  store.delegate_to(fake);
  const sieve_kv_store_api* api = store.api();
  int32_t id = -1;
  EXPECT_CALL(store, add_sequence(_)).Times(1);
  ASSERT_EQ(api->add_sequence(store.handle(), &id), SIEVE_OK);
  std::mt19937 rng(1);
  ASSERT_EQ(fake.append_random(id, 5, rng), SIEVE_OK);
  int32_t len = 0;
  ASSERT_EQ(api->seq_len(store.handle(), 1, id, &len), SIEVE_OK);
  EXPECT_EQ(len, 5);
  sieve_paged_kv view{};
  ASSERT_EQ(api->view(store.handle(), 1, &id, 1, &view), SIEVE_OK);
  EXPECT_EQ(view.indptr_host[1], 2);
  EXPECT_EQ(api->remove_sequence(store.handle(), 99), SIEVE_ERR_NOT_FOUND);
  EXPECT_STREQ(api->last_error(store.handle()), "remove_sequence: unknown sequence 99");

  EXPECT_CALL(store, evict(_, _, _, _, _)).WillOnce(Return(SIEVE_ERR_INTERNAL));
  EXPECT_EQ(api->evict(store.handle(), 0, id, nullptr, 0, nullptr), SIEVE_ERR_INTERNAL);

  sieve_kv_store* made = nullptr;
  ReasonLog err;
  EXPECT_EQ(api->create(nullptr, nullptr, &made, err.sink()), SIEVE_ERR_UNSUPPORTED);
  EXPECT_EQ(made, nullptr);
}

TEST(MockHostServices, TracksAllocationsAndFlagsForeignFrees) {
  NiceMock<MockHostServices> host;
  const sieve_host_services* s = host.table();
  void* p = s->alloc(s->host_ctx, sieve::kCpu, 100, 256);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
  EXPECT_EQ(host.live_allocations(), 1u);
  EXPECT_EQ(s->alloc(s->host_ctx, DLDevice{kDLCUDA, 0}, 100, 256), nullptr)
      << "no device allocator was given";
  s->free(s->host_ctx, sieve::kCpu, p);
  EXPECT_EQ(host.live_allocations(), 0u);
  int local = 0;
  EXPECT_NONFATAL_FAILURE(s->free(s->host_ctx, sieve::kCpu, &local), "was not allocated by this host");
  EXPECT_EQ(s->cuda_stream(s->host_ctx), nullptr);
  EXPECT_EQ(s->kernels->attend(s->host_ctx, nullptr), SIEVE_ERR_UNSUPPORTED);
  const uint64_t t0 = s->now_ns(s->host_ctx), t1 = s->now_ns(s->host_ctx);
  EXPECT_LE(t0, t1);
}

}  // namespace
