// copy_view_to_host over engine page layouts (ABI 1.1 strided views): a view laid out HND with
// explicit strides, NHD or as a combined pool comes back as the compact HND pages it holds, bit
// for bit (NaN spares and page tails included); strides page_strides refuses are one line.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "sieve/reference/page_pool.hpp"
#include "sieve/reference/workload.hpp"
#include "sieve/runtime/host_copy.hpp"
#include "sieve/util/error.hpp"

namespace sieve {
namespace {

bool same_bytes(const HostTensor& a, const HostTensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.dl().data, b.dl().data, a.nbytes()) == 0;
}

TEST(HostCopy, EngineLayoutsComeBackCompact) {
  runtime::HostServices services(kCpu);
  for (const KvLayout layout : kKvLayouts) {
    SCOPED_TRACE(kv_layout_name(layout));
    reference::WorkloadSpec spec;
    spec.kv_lens = {3, 40, 17};
    spec.kv_dtype = kBF16;
    spec.seed = 5 + layout.bit + layout.combined_hnd;
    reference::Workload w(spec);
    reference::LaidOutPool pool(w.k_pages.dl(), w.v_pages.dl(), layout);
    pool.install(w.kv);
    runtime::HostPagedView h;
    runtime::copy_view_to_host(services, w.kv, &h);
    EXPECT_EQ(h.view.k_pages.strides, nullptr);
    EXPECT_EQ(h.view.v_pages.byte_offset, 0u);
    EXPECT_TRUE(same_bytes(h.k, w.k_pages)) << "K pages differ";
    EXPECT_TRUE(same_bytes(h.v, w.v_pages)) << "V pages differ";
  }
}

TEST(HostCopy, BadStridesAreRefusedWithOneLine) {
  runtime::HostServices services(kCpu);
  reference::WorkloadSpec spec;
  spec.n_kv_heads = 2;
  spec.page_size = 4;
  spec.head_dim = 8;
  reference::Workload w(spec);
  int64_t strides[4] = {64, 32, 8, 2};  // head_dim stride 2
  w.kv.v_pages.strides = strides;
  runtime::HostPagedView h;
  try {
    runtime::copy_view_to_host(services, w.kv, &h);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), SIEVE_ERR_INVALID_ARGUMENT);
    EXPECT_THAT(e.what(), ::testing::StartsWith("copy_view_to_host: kv.v_pages: head_dim stride 2"));
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
  }
}

}  // namespace
}  // namespace sieve
