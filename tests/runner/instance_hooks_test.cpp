// Per-instance hooks (ABI 1.1 sieve_policy_api.instance_hooks) through the layer runner, with the
// `hooks` fixture (tests/fixtures/per_instance_hooks.c: a table with select, attend and observe,
// each instance using the ones its parameters name) and `hooks_v1_0` (the same select and attend
// in a 1.0-sized table, so every instance attends):
//  - an instance whose hooks leave out attend is no attender: a chain with another attender runs
//    (the same chain with the 1.0 table is refused), and the runner never calls the hooks it left
//    out (the fixture fails any such call);
//  - two instances that do attend are still refused, once created;
//  - page statistics reach an observer beside an instance whose table has attend but which does
//    not use it, and are refused beside one that does;
//  - an instance naming a hook its table does not implement is refused with one line naming it;
//  - dpxa mode=select beside an attender: refused before, runs now.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "sieve/runtime/chain_spec.hpp"
#include "sieve/runtime/registry.hpp"
#include "sieve/workload/synthetic.hpp"
#include "../plugins/support/chain_session.hpp"

using namespace sieve::runtime;
using sieve::testing::parse_chain;
using sieve::testing::registry_with;
using ::testing::HasSubstr;
using ::testing::Not;

namespace {

SyntheticSpec session(uint32_t phase) { return sieve::testing::small_session(phase, 64, {300, 77, 16}, 40); }

// Runs `chain`; "" when it ran, else the error.
std::string run(const Registry& reg, uint32_t phase, const std::string& chain, SyntheticReport* r = nullptr) {
  SyntheticReport ignored;
  std::string error;
  return run_synthetic(session(phase), parse_chain(chain), reg, r ? r : &ignored, &error) ? "" : error;
}

const std::string kHooksDir = std::string(SIEVE_FIXTURE_DIR) + "/hooks";

}  // namespace

TEST(InstanceHooks, AnInstanceThatDoesNotAttendIsNoAttender) {
  Registry reg = registry_with({kHooksDir});
  for (uint32_t phase : {uint32_t(SIEVE_PHASE_DECODE), uint32_t(SIEVE_PHASE_PREFILL)}) {
    SCOPED_TRACE(phase);
    // Before instance_hooks: the table's attend made every instance an attender.
    EXPECT_THAT(run(reg, phase, "*=hooks_v1_0>hooks_v1_0@b"),
                HasSubstr("more than one policy implements attend (hooks_v1_0, hooks_v1_0@b)"));
    // The same table with instance_hooks: the first instance only selects, the second attends.
    // The empty chain: the core kernel, dense, on the same workload.
    SyntheticReport dense;
    std::string error;
    ASSERT_TRUE(run_synthetic(session(phase), ChainSpec{}, reg, &dense, &error)) << error;
    SyntheticReport r;
    EXPECT_EQ(run(reg, phase, "*=hooks>hooks@b(attend=true)", &r), "");
    // hooks@b's attend is the core kernel on the (dense) selection: the same arithmetic as the
    // empty chain, so the same output and the same error against the f64 reference, exactly.
    EXPECT_EQ(r.rel_err, dense.rel_err);
    EXPECT_EQ(r.non_finite, 0);
    // With no attender, the runner compares with the core kernel's result again: the same kernel
    // on the same dense selection as the empty chain.
    EXPECT_EQ(run(reg, phase, "*=hooks>hooks@b", &r), "");
    EXPECT_GE(r.kernel_rel_err, 0.0) << "an instance without attend does not rewrite the output";
    EXPECT_EQ(r.kernel_rel_err, dense.kernel_rel_err);
    EXPECT_EQ(r.rel_err, dense.rel_err);
  }
}

TEST(InstanceHooks, TwoInstancesThatAttendAreRefusedOnceCreated) {
  Registry reg = registry_with({kHooksDir});
  const std::string e = run(reg, SIEVE_PHASE_DECODE, "decode:*=hooks(attend=true)>hooks@b(attend=true)");
  EXPECT_THAT(e, HasSubstr("layers 0 (decode): more than one policy implements attend (hooks, hooks@b)"));
  EXPECT_THAT(e, Not(HasSubstr("\n"))) << "one line";
}

TEST(InstanceHooks, StatisticsAreRefusedOnlyBesideAnInstanceThatAttends) {
  Registry reg = registry_with({kHooksDir});
  // hooks@b's table has attend but this instance does not use it: the runner keeps the core
  // kernel, which computes the statistics hooks asked for (before instance_hooks it refused them).
  EXPECT_EQ(run(reg, SIEVE_PHASE_DECODE, "decode:*=hooks(stats=true)>hooks@b"), "");
  EXPECT_THAT(run(reg, SIEVE_PHASE_DECODE, "decode:*=hooks(stats=true)>hooks@b(attend=true)"),
              HasSubstr("layers 0 (decode): hooks asks for page statistics, which the core kernel "
                        "computes, but hooks@b replaces it (attend)"));
}

TEST(InstanceHooks, HooksOutsideTheTableAreRefused) {
  Registry reg = registry_with({kHooksDir});
  const std::string e = run(reg, SIEVE_PHASE_DECODE, "decode:*=hooks(claim_correct=true)");
  EXPECT_EQ(e, "plugin 'hooks' (instance hooks): instance_hooks names correct, which its table does not "
               "implement (it implements select, attend, observe)");
}

TEST(InstanceHooks, DpxaSelectModeIsNoAttender) {
  Registry reg = registry_with({SIEVE_PLUGIN_DIR, kHooksDir});
  ASSERT_NE(reg.find("dpxa"), nullptr);
  // dpxa's table has attend (for mode=deltax): before instance_hooks this chain was refused as
  // two attenders. hooks@b attends with the core kernel on dpxa's tiles.
  SyntheticReport r;
  EXPECT_EQ(run(reg, SIEVE_PHASE_PREFILL, "prefill:*=dpxa(block=16,tau=0.5)>hooks@b(attend=true)", &r), "");
  EXPECT_EQ(r.non_finite, 0);
  EXPECT_LT(r.attended_fraction, 1.0) << "dpxa's selection reached the kernel";
  // mode=deltax does attend: still one attender too many.
  EXPECT_THAT(run(reg, SIEVE_PHASE_PREFILL, "prefill:*=dpxa(block=16,mode=deltax)>hooks@b(attend=true)"),
              HasSubstr("more than one policy implements attend (dpxa, hooks@b)"));
}
