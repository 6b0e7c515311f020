// The shared argument checker: every malformed argument is refused with one line that starts
// with the argument's name, by check_attention_args, by attend_cpu (INVALID_ARGUMENT, output
// untouched) and by the f64 reference; contents errors (page ids, selection entries) name the
// offending row and index.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <list>
#include <stdexcept>

#include "sieve/kernels/attention_args.hpp"
#include "sieve/kernels/attention_cpu.hpp"
#include "sieve/kernels/attention_cuda.hpp"
#include "sieve/reference/attention_ref.hpp"
#include "sieve/reference/workload.hpp"

namespace sieve {
namespace {

using kernels::attend_cpu;
using kernels::check_attention_args;
using reference::Workload;
using reference::WorkloadSpec;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// A small decode call that uses every optional argument: selection (per KV head), q_rows, lse and
// page statistics. Two sequences of 5 and 9 tokens, pages of 4.
WorkloadSpec base_spec() {
  WorkloadSpec s;
  s.n_q_heads = 4;
  s.n_kv_heads = 2;
  s.head_dim = 8;
  s.page_size = 4;
  s.kv_lens = {5, 9};
  s.seed = 7;
  return s;
}
void decorate(Workload& w) {
  w.set_selection(SIEVE_SEL_PER_KV_HEAD, 1, 1, {{0, 1}, {1}, {0, 2}, {}});
  w.set_q_rows({0, 1});
  w.request_lse();
  w.request_stats(SIEVE_STATS_PAGE_MASS_PER_KV_HEAD);
}

bool all_nan(const HostTensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isnan(t.get(i))) return false;
  return true;
}

// Tensors a mutation puts in place of the workload's own; std::list keeps their addresses.
using Keep = std::list<HostTensor>;
DLTensor* keep(Keep& k, std::vector<int64_t> shape, DLDataType t) {
  return &k.emplace_back(std::move(shape), t).dl();
}

struct Malformed {
  const char* label;
  const char* prefix;  // the message must start with this (the argument's name)
  std::function<void(Workload&, Keep&)> mutate;
};

const DLDevice kCuda0{kDLCUDA, 0};

// Page strides (ABI 1.1 views) sieve/util/page_layout.hpp refuses. base_spec's pages are
// [cap, 2 heads, 4 tokens, 8 dims]: compact strides [64, 32, 8, 1].
struct BadStrides {
  const char* label;
  int64_t strides[4];
  uint64_t byte_offset;
  bool on_v;           // applied to v_pages only (K stays compact)
  const char* prefix;  // the message starts with it, naming the problem
};
BadStrides kBadStrides[] = {
    {"head_dim stride 2", {128, 64, 16, 2}, 0, false, "kv.k_pages: head_dim stride 2, expected 1"},
    {"negative token stride", {64, 32, -8, 1}, 0, false, "kv.k_pages: token stride -8, expected > 0"},
    {"zero KV head stride", {64, 0, 8, 1}, 0, false, "kv.k_pages: KV head stride 0, expected > 0"},
    {"tokens overlap", {64, 32, 4, 1}, 0, false, "kv.k_pages: strides [64, 32, 4, 1] overlap the rows"},
    {"heads overlap tokens", {64, 16, 8, 1}, 0, false, "kv.k_pages: strides [64, 16, 8, 1] overlap the rows"},
    {"pages overlap (NHD)", {48, 8, 16, 1}, 0, false, "kv.k_pages: page stride 48 is smaller than one page"},
    {"beyond any pool", {int64_t(1) << 60, 32, 8, 1}, 0, false, "kv.k_pages: 8 pages of stride"},
    {"byte_offset inside an element", {64, 32, 8, 1}, 2, false,
     "kv.k_pages: byte_offset 2 is not a whole number of 4-byte elements"},
    {"V laid out unlike K", {64, 8, 16, 1}, 0, true, "kv.v_pages: strides [64, 8, 16, 1] differ"},
};

std::vector<Malformed> malformed_cases() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<Malformed> cases = {
      {"struct size", "args:", [](Workload& w, Keep&) { w.args.hdr.struct_size = 8; }},
      {"phase", "phase:", [](Workload& w, Keep&) { w.args.phase = 3; }},
      {"no q heads", "n_q_heads:", [](Workload& w, Keep&) { w.args.n_q_heads = 0; }},
      {"kv heads do not divide", "n_kv_heads:", [](Workload& w, Keep&) { w.args.n_kv_heads = 3; }},
      {"head dim", "head_dim:", [](Workload& w, Keep&) { w.args.head_dim = 0; }},
      {"scale", "scale:", [nan](Workload& w, Keep&) { w.args.scale = nan; }},
      {"kv null", "kv:", [](Workload& w, Keep&) { w.args.kv = nullptr; }},
      {"kv struct size", "kv:", [](Workload& w, Keep&) { w.kv.hdr.struct_size = 4; }},
      {"kv batch", "kv.batch:", [](Workload& w, Keep&) { w.kv.batch = 0; }},
      {"kv indptr mirror", "kv.indptr_host:", [](Workload& w, Keep&) { w.kv.indptr_host = nullptr; }},
      {"kv last mirror", "kv.last_page_len_host:",
       [](Workload& w, Keep&) { w.kv.last_page_len_host = nullptr; }},
      {"k pages heads", "kv.k_pages:",
       [](Workload& w, Keep& k) {
         w.kv.k_pages = *keep(k, {w.k_pages.shape()[0], 3, 4, 8}, kF32);
       }},
      {"page size vs pages", "kv.k_pages:", [](Workload& w, Keep&) { w.kv.page_size = 8; }},
      {"k pages dtype", "kv.k_pages:",
       [](Workload& w, Keep& k) { w.kv.k_pages = *keep(k, w.k_pages.shape(), kI32); }},
      {"v pages dtype", "kv.v_pages:",
       [](Workload& w, Keep& k) { w.kv.v_pages = *keep(k, w.v_pages.shape(), kF16); }},
      {"v pages shape", "kv.v_pages:",
       [](Workload& w, Keep& k) {
         w.kv.v_pages = *keep(k, {w.v_pages.shape()[0], 2, 4, 16}, kF32);
       }},
      {"kv indptr length", "kv.indptr:",
       [](Workload& w, Keep& k) { w.kv.indptr = *keep(k, {2}, kI32); }},
      {"kv indices dtype", "kv.indices:",
       [](Workload& w, Keep& k) { w.kv.indices = *keep(k, {5}, kF32); }},
      {"kv indices too short", "kv.indices:",
       [](Workload& w, Keep& k) { w.kv.indices = *keep(k, {1}, kI32); }},
      {"kv last dtype", "kv.last_page_len:",
       [](Workload& w, Keep& k) { w.kv.last_page_len = *keep(k, {2}, kF32); }},
      {"last page empty", "kv.last_page_len_host[1]:",
       [](Workload& w, Keep&) { w.kv_last_page_len.data<int32_t>()[1] = 0; }},
      {"last page overfull", "kv.last_page_len_host[1]:",
       [](Workload& w, Keep&) { w.kv_last_page_len.data<int32_t>()[1] = 5; }},
      {"kv indptr decreasing", "kv.indptr_host:",
       [](Workload& w, Keep&) { w.kv_indptr.data<int32_t>()[1] = 6; }},  // 0, 6, 5
      {"q null", "q:", [](Workload& w, Keep&) { w.args.q = nullptr; }},
      {"q heads", "q:", [](Workload& w, Keep& k) { w.args.q = keep(k, {2, 2, 8}, kF32); }},
      {"q dtype", "q:", [](Workload& w, Keep& k) { w.args.q = keep(k, {2, 4, 8}, kI32); }},
      {"q strided", "q:",
       [](Workload& w, Keep& k) {
         DLTensor* t = keep(k, {2, 4, 8}, kF32);
         static int64_t strides[] = {64, 8, 1};  // token stride 64 instead of 32
         t->strides = strides;
         w.args.q = t;
       }},
      {"q no data", "q:", [](Workload& w, Keep& k) {
         DLTensor* t = keep(k, {2, 4, 8}, kF32);
         t->data = nullptr;
         w.args.q = t;
       }},
      {"out null", "out:", [](Workload& w, Keep&) { w.args.out = nullptr; }},
      {"out tokens", "out:", [](Workload& w, Keep& k) { w.args.out = keep(k, {3, 4, 8}, kF32); }},
      {"out dtype", "out:",
       [](Workload& w, Keep& k) { w.args.out = keep(k, {2, 4, 8}, DLDataType{kDLFloat, 64, 1}); }},
      {"out aliases q", "out:", [](Workload& w, Keep&) { w.args.out = &w.q.dl(); }},
      {"qo_indptr null", "qo_indptr:", [](Workload& w, Keep&) { w.args.qo_indptr = nullptr; }},
      {"qo_indptr dtype", "qo_indptr:",
       [](Workload& w, Keep& k) { w.args.qo_indptr = keep(k, {3}, kF32); }},
      {"qo mirror null", "qo_indptr_host:", [](Workload& w, Keep&) { w.args.qo_indptr_host = nullptr; }},
      {"decode with two queries", "qo_indptr_host:",
       [](Workload& w, Keep&) { w.qo_indptr.data<int32_t>()[1] = 2; }},
      {"more queries than keys", "qo_indptr_host:",
       [](Workload& w, Keep&) {
         w.args.phase = SIEVE_PHASE_PREFILL;
         w.qo_indptr.data<int32_t>()[1] = 6;  // sequence 0 has 5 tokens
         w.qo_indptr.data<int32_t>()[2] = 7;
       }},
      {"selection struct size", "selection:",
       [](Workload& w, Keep&) { w.selection.hdr.struct_size = 8; }},
      {"selection kind", "selection.kind:", [](Workload& w, Keep&) { w.selection.kind = 7; }},
      {"selection heads", "selection.heads:", [](Workload& w, Keep&) { w.selection.heads = 5; }},
      {"selection q_block", "selection.q_block:", [](Workload& w, Keep&) { w.selection.q_block = 0; }},
      {"selection k_block_pages", "selection.k_block_pages:",
       [](Workload& w, Keep&) { w.selection.k_block_pages = 0; }},
      {"selection rows", "selection.n_rows:",
       [](Workload& w, Keep&) { w.selection.heads = SIEVE_SEL_PER_Q_HEAD; }},
      {"selection indptr dtype", "selection.indptr:",
       [](Workload& w, Keep& k) { w.selection.indptr = *keep(k, {5}, DLDataType{kDLInt, 64, 1}); }},
      {"selection indices rank", "selection.indices:",
       [](Workload& w, Keep& k) { w.selection.indices = *keep(k, {5, 2}, kI32); }},
      {"selection capacity", "selection.capacity:",
       [](Workload& w, Keep&) { w.selection.capacity = w.sel_indices.shape()[0] + 1; }},
      {"stats request", "stats:", [](Workload& w, Keep&) { w.args.stats = 9; }},
      {"page mass missing", "page_mass:", [](Workload& w, Keep&) { w.args.page_mass = nullptr; }},
      {"page mass columns", "page_mass:",
       [](Workload& w, Keep&) { w.args.stats = SIEVE_STATS_PAGE_MASS_ALL_HEADS; }},
      {"page mass rows", "page_mass:",
       [](Workload& w, Keep& k) { w.args.page_mass = keep(k, {4, 2}, kF32); }},
      {"page mass dtype", "page_mass:",
       [](Workload& w, Keep& k) { w.args.page_mass = keep(k, {5, 2}, kF16); }},
      {"lse shape", "lse:", [](Workload& w, Keep& k) { w.args.lse = keep(k, {2, 2}, kF32); }},
      {"lse dtype", "lse:", [](Workload& w, Keep& k) { w.args.lse = keep(k, {2, 4}, kBF16); }},
      {"q_rows dtype", "q_rows:", [](Workload& w, Keep& k) { w.args.q_rows = keep(k, {1}, kF32); }},
      {"q_rows rank", "q_rows:", [](Workload& w, Keep& k) { w.args.q_rows = keep(k, {1, 1}, kI32); }},
      {"q_rows range", "q_rows[1]:", [](Workload& w, Keep&) { w.q_rows.data<int32_t>()[1] = 2; }},
      {"out on cuda", "out:", [](Workload& w, Keep&) { w.out->device = kCuda0; }},
      {"kv indices on cuda", "kv.indices:", [](Workload& w, Keep&) { w.kv.indices.device = kCuda0; }},
      {"selection on cuda", "selection.indptr:",
       [](Workload& w, Keep&) { w.selection.indptr.device = kCuda0; }},
      {"page mass on cuda", "page_mass:", [](Workload& w, Keep&) { w.page_mass->device = kCuda0; }},
      {"lse on another cpu", "lse:", [](Workload& w, Keep&) { w.lse->device = DLDevice{kDLCPU, 1}; }},
  };
  for (BadStrides& c : kBadStrides)
    cases.push_back({c.label, c.prefix, [&c](Workload& w, Keep&) {
                       DLTensor& t = c.on_v ? w.kv.v_pages : w.kv.k_pages;
                       t.strides = c.strides;
                       t.byte_offset = c.byte_offset;
                     }});
  return cases;
}

TEST(AttentionArgs, BaseCallIsValid) {
  Workload w(base_spec());
  decorate(w);
  EXPECT_EQ(check_attention_args(w.args), "");
  std::string err;
  EXPECT_EQ(attend_cpu(w.args, &err), SIEVE_OK) << err;
}

TEST(AttentionArgs, EachMalformedArgumentIsNamed) {
  for (const Malformed& m : malformed_cases()) {
    SCOPED_TRACE(m.label);
    Workload w(base_spec());
    decorate(w);
    Keep k;
    m.mutate(w, k);
    const std::string msg = check_attention_args(w.args);
    EXPECT_THAT(msg, StartsWith(m.prefix));
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;

    w.poison_outputs();
    std::string err;
    EXPECT_EQ(attend_cpu(w.args, &err), SIEVE_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(err, msg);
    EXPECT_TRUE(all_nan(w.out)) << "a refused call wrote its output";
    EXPECT_TRUE(all_nan(w.lse));
    EXPECT_TRUE(all_nan(w.page_mass));

    try {
      reference::attend_reference(w.args);
      ADD_FAILURE() << "the reference accepted it";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(e.what(), msg);
    }
  }
}

TEST(AttentionArgs, EngineLayoutsAreAccepted) {
  // NHD, HND with explicit strides and the halves of a combined pool (V one K page in): the
  // checker takes them and the shape reports their strides.
  struct Good {
    int64_t strides[4];
    uint64_t v_offset;
  };
  const int64_t cap = 8;  // base_spec: 5 pages + 3 spare
  for (const Good& g : {Good{{64, 32, 8, 1}, 0}, Good{{64, 8, 16, 1}, 0},
                        Good{{128, 8, 16, 1}, 64 * 4}, Good{{128, 32, 8, 1}, 64 * 4}}) {
    Workload w(base_spec());
    decorate(w);
    ASSERT_EQ(w.k_pages.shape()[0], cap);
    HostTensor pool({cap * 128}, kF32);  // room for every layout; values do not matter here
    int64_t strides[4] = {g.strides[0], g.strides[1], g.strides[2], g.strides[3]};
    for (DLTensor* t : {&w.kv.k_pages, &w.kv.v_pages}) {
      t->data = pool.dl().data;
      t->strides = strides;
    }
    w.kv.v_pages.byte_offset = g.v_offset ? g.v_offset : uint64_t(cap * 64 * 4);
    EXPECT_EQ(check_attention_args(w.args), "") << strides[0] << "," << strides[1] << "," << strides[2];
    const kernels::AttentionShape s = kernels::attention_shape(w.args);
    EXPECT_EQ(s.pages.page, g.strides[0]);
    EXPECT_EQ(s.pages.head, g.strides[1]);
    EXPECT_EQ(s.pages.token, g.strides[2]);
  }
}

// ---- contents: checked by attend_cpu on the host, reported with row and index --------------

sieve_status run(Workload& w, std::string* err) {
  w.poison_outputs();
  return attend_cpu(w.args, err);
}

TEST(AttentionContents, PageIdOutsideThePool) {
  Workload w(base_spec());
  w.kv_indices.data<int32_t>()[3] = int32_t(w.k_pages.shape()[0]);
  std::string err;
  EXPECT_EQ(run(w, &err), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(err, StartsWith("kv.indices[3]:"));
  EXPECT_THAT(err, HasSubstr("sequence 1, logical page 1"));
  EXPECT_TRUE(all_nan(w.out));
}

TEST(AttentionContents, SelectionIndexOutOfRangeNamesRowAndIndex) {
  Workload w(base_spec());
  // Rows (decode, per KV head): b * 2 + g. Sequence 1 has 3 pages, so key block 3 is out of range.
  w.set_selection(SIEVE_SEL_PER_KV_HEAD, 1, 1, {{0}, {1}, {0, 3}, {2}});
  std::string err;
  EXPECT_EQ(run(w, &err), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(err, StartsWith("selection row 2 (sequence 1, query block 0, head 0)"));
  EXPECT_THAT(err, HasSubstr("key block 3"));
  EXPECT_THAT(err, HasSubstr("[0, 3)"));
  EXPECT_TRUE(all_nan(w.out));
  EXPECT_THROW(reference::attend_reference(w.args), std::invalid_argument);
}

TEST(AttentionContents, SelectionNegativeIndex) {
  Workload w(base_spec());
  w.set_selection(SIEVE_SEL_PER_SEQUENCE, 1, 2, {{0}, {-1}});
  std::string err;
  EXPECT_EQ(run(w, &err), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(err, StartsWith("selection row 1 "));
  EXPECT_THAT(err, HasSubstr("key block -1"));
}

TEST(AttentionContents, SelectionNotIncreasing) {
  Workload w(base_spec());
  w.set_selection(SIEVE_SEL_PER_KV_HEAD, 1, 1, {{0}, {1}, {2, 2}, {}});
  std::string err;
  EXPECT_EQ(run(w, &err), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(err, StartsWith("selection row 2 "));
  EXPECT_THAT(err, HasSubstr("strictly increasing"));
}

TEST(AttentionContents, SelectionIndptr) {
  Workload w(base_spec());
  w.set_selection(SIEVE_SEL_PER_KV_HEAD, 1, 1, {{0}, {1}, {0, 2}, {}});
  w.sel_indptr.data<int32_t>()[2] = 0;  // 1, 0, 3: decreases
  std::string err;
  EXPECT_EQ(run(w, &err), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(err, StartsWith("selection.indptr: decreases at row 1"));

  w.set_selection(SIEVE_SEL_PER_KV_HEAD, 1, 1, {{0}, {1}, {0, 2}, {}});
  w.selection.capacity = 3;  // rows hold 4 entries
  EXPECT_EQ(run(w, &err), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(err, StartsWith("selection.indptr[n_rows]:"));
}

TEST(AttentionContents, PrefillStatisticsAreUnsupported) {
  WorkloadSpec s = base_spec();
  s.phase = SIEVE_PHASE_PREFILL;
  Workload w(s);
  w.request_stats(SIEVE_STATS_PAGE_MASS_ALL_HEADS);
  std::string err;
  EXPECT_EQ(run(w, &err), SIEVE_ERR_UNSUPPORTED);
  EXPECT_THAT(err, StartsWith("stats:"));
  EXPECT_TRUE(all_nan(w.out));
}

TEST(AttentionContents, CpuKernelRefusesDeviceTensors) {
  Workload w(base_spec());
  for (DLTensor* t : {&w.q.dl(), &w.out.dl(), &w.qo_indptr.dl(), &w.kv.k_pages, &w.kv.v_pages,
                      &w.kv.indptr, &w.kv.indices, &w.kv.last_page_len})
    t->device = kCuda0;
  EXPECT_EQ(check_attention_args(w.args), "");  // consistent: the checker has no objection
  std::string err;
  EXPECT_EQ(attend_cpu(w.args, &err), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(err, StartsWith("q: on cuda:0"));
}

#ifndef SIEVE_WITH_CUDA
TEST(AttentionContents, CudaEntryPointsWithoutCuda) {
  Workload w(base_spec());
  std::string err;
  EXPECT_EQ(kernels::attend_cuda(w.args, nullptr, &err), SIEVE_ERR_UNSUPPORTED);
  EXPECT_EQ(err, "built without CUDA");
  EXPECT_EQ(kernels::cuda_device_count(), 0);
}
#endif

// ---- geometry helpers ------------------------------------------------------------------------

TEST(AttentionShapeHelpers, SelectionRowsFollowTheAbiFormula) {
  const int32_t qo[] = {0, 5, 5, 40};  // 5, 0 and 35 query tokens
  EXPECT_EQ(kernels::query_block_offsets(qo, 3, 16), (std::vector<int64_t>{0, 1, 1, 4}));
  EXPECT_EQ(kernels::query_block_offsets(qo, 3, 1), (std::vector<int64_t>{0, 5, 5, 40}));
  // Sequence 2, query block 1, H = 8: (C_2 + 1) * 8 + h.
  EXPECT_EQ(kernels::selection_row(1, 1, 8, 3), 19);
  EXPECT_EQ(kernels::selection_head_count(SIEVE_SEL_PER_SEQUENCE, 32, 8), 1);
  EXPECT_EQ(kernels::selection_head_count(SIEVE_SEL_PER_KV_HEAD, 32, 8), 8);
  EXPECT_EQ(kernels::selection_head_count(SIEVE_SEL_PER_Q_HEAD, 32, 8), 32);
  EXPECT_EQ(kernels::selection_head(SIEVE_SEL_PER_SEQUENCE, 13, 4), 0);
  EXPECT_EQ(kernels::selection_head(SIEVE_SEL_PER_KV_HEAD, 13, 4), 3);
  EXPECT_EQ(kernels::selection_head(SIEVE_SEL_PER_Q_HEAD, 13, 4), 13);
  EXPECT_EQ(kernels::key_blocks(7, 3), 3);
  EXPECT_EQ(kernels::key_blocks(0, 3), 0);
}

TEST(AttentionShapeHelpers, ShapeOfACall) {
  Workload w(base_spec());
  decorate(w);
  const kernels::AttentionShape s = kernels::attention_shape(w.args);
  EXPECT_EQ(s.batch, 2);
  EXPECT_EQ(s.n_q_tokens, 2);
  EXPECT_EQ(s.group, 2);
  EXPECT_EQ(s.page_size, 4);
  EXPECT_EQ(s.nnz_pages, 5);  // 2 + 3 pages
  EXPECT_FLOAT_EQ(s.scale, 1.f / std::sqrt(8.f));
  EXPECT_FALSE(s.dense);
  EXPECT_EQ(s.sel_h, 2);
  EXPECT_EQ(s.n_rows, 4);
  EXPECT_EQ(s.q_rows, 2);
  EXPECT_EQ(s.stats_h, 2);
  EXPECT_EQ(kernels::kv_len(w.kv, 0), 5);
  EXPECT_EQ(kernels::kv_len(w.kv, 1), 9);
}

}  // namespace
}  // namespace sieve
