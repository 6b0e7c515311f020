// The seer gate library (gate/) on its own, without the plugin: the gate arithmetic (pooling,
// projection, RoPE, score) against an f64 recomputation, the built-in mean gate and the gate file
// (round trip and refusals). The distillation is in test_seer_distill.cpp, the plugin over the
// paged store in test_seer.cpp.
#include <gtest/gtest.h>
#include <sieve/util/error.hpp>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "gate/builtin_gate.hpp"
#include "gate/gate_file.hpp"
#include "gate/gate_math.hpp"
#include "seer_reference.hpp"
#include "seer_session.hpp"

namespace {

using namespace sieve::testing;
namespace sg = sieve::seer;

TEST(SeerGateMath, PoolProjectRopeScoreMatchF64) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  for (bool rms : {false, true}) {
    sieve_geometry g = seer_geometry(sieve::kCpu, 12, 3, 10);
    const sg::GateWeights w = sg::random_gate(seer_shape(g, 32, 14, rms), 5);
    const int32_t d = g.head_dim, T = 3 * 32 + 7;
    std::vector<float> k_pre(size_t(T) * 3 * d), q_pre(size_t(12) * d);
    for (float& x : k_pre) x = u(rng);
    for (float& x : q_pre) x = u(rng);
    for (int32_t h = 0; h < 3; ++h)
      for (int64_t j = 0; j < 3; ++j) {
        std::vector<float> pooled(size_t(3 * d)), key(14), query(14);
        auto kf = [&](int32_t t, int32_t c) { return k_pre[(size_t(j * 32 + t) * 3 + h) * d + c]; };
        sg::pool_block(kf, 32, d, pooled.data());
        sg::gate_key(w.wk_at(1, h), pooled.data(), d, 14, rms, j * 32, g.rope_theta, key.data());
        // Each element to the f32 arithmetic's bound (seer_reference.hpp: ref_gate_bound).
        std::vector<double> kb, qb;
        const std::vector<double> ref = ref_gate_key(w, 1, h, k_pre, j, &kb);
        for (int32_t i = 0; i < 14; ++i) EXPECT_NEAR(key[size_t(i)], ref[size_t(i)], kb[size_t(i)]);
        const int64_t pos = T - 1;
        sg::gate_query(w.wq_at(1, h), q_pre.data() + size_t(h) * 4 * d, 4 * d, 14, rms, pos, g.rope_theta, query.data());
        const std::vector<double> rq = ref_gate_query(w, 1, h, q_pre, pos, &qb);
        for (int32_t i = 0; i < 14; ++i) EXPECT_NEAR(query[size_t(i)], rq[size_t(i)], qb[size_t(i)]);
        EXPECT_NEAR(sg::gate_score(query.data(), key.data(), 14), ref_dot(rq, ref) / std::sqrt(14.0),
                    ref_score_bound(rq, qb, ref, kb));
      }
  }
}

// builtin:mean is the plain definition: mean of the group's pre-RoPE queries . mean of the
// block's pre-RoPE keys / sqrt(head_dim), unrotated whatever the positions. f32 against f64: every
// f32 sum has at most 32 terms of magnitude <= 4, so it is off by <= 32 * 4 * 32 * 2^-24 < 1e-3
// of the terms' scale; the score's terms are means (<= 2 each), hence 1e-4 * (1 + |ref|).
TEST(SeerGateMath, BuiltinMeanGateIsGroupMeanQueryDotBlockMeanKey) {
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  const sieve_geometry g = seer_geometry(sieve::kCpu, 12, 3, 10);
  const int32_t d = g.head_dim, group = 4, block = 32;
  const sg::GateWeights w = sg::builtin_gate("builtin:mean", g, block, false);
  ASSERT_EQ(w.shape.gate_dim, d);
  EXPECT_EQ(w.shape.rope_theta, 0.f);
  std::vector<float> k_pre(size_t(block) * d), q_pre(size_t(group) * d);
  for (float& x : k_pre) x = u(rng);
  for (float& x : q_pre) x = u(rng);
  std::vector<float> pooled(static_cast<size_t>(3 * d)), key(static_cast<size_t>(d)), query(static_cast<size_t>(d));
  sg::pool_block([&](int32_t t, int32_t c) { return k_pre[size_t(t) * d + c]; }, block, d, pooled.data());
  sg::gate_key(w.wk_at(g.n_layers - 1, 2), pooled.data(), d, d, false, 5 * block, w.shape.rope_theta, key.data());
  sg::gate_query(w.wq_at(g.n_layers - 1, 2), q_pre.data(), group * d, d, false, 999, w.shape.rope_theta, query.data());
  double ref = 0, magnitude = 0;  // magnitude: the same sums over |terms|
  for (int32_t c = 0; c < d; ++c) {
    double qm = 0, km = 0, qa = 0, ka = 0;
    for (int32_t j = 0; j < group; ++j) {
      qm += q_pre[size_t(j) * d + c] / double(group);
      qa += std::fabs(q_pre[size_t(j) * d + c]) / double(group);
    }
    for (int32_t t = 0; t < block; ++t) {
      km += k_pre[size_t(t) * d + c] / double(block);
      ka += std::fabs(k_pre[size_t(t) * d + c]) / double(block);
    }
    ref += qm * km;
    magnitude += qa * ka;
  }
  ref /= std::sqrt(double(d));
  magnitude /= std::sqrt(double(d));
  // f32 roundings on the way: the block and group means, the two identity projections (d terms
  // each) and the score's d-term dot product, plus the divisions; first-order, so the relative
  // errors of the factors add (tests/common/tolerance.hpp).
  namespace tol = sieve::tolerance;
  const double bound = tol::kSafety * tol::gamma(block + group + 3 * d + 4, tol::kF32) * magnitude;
  EXPECT_NEAR(sg::gate_score(query.data(), key.data(), d), ref, bound);
  EXPECT_THROW(sg::builtin_gate("builtin:max", g, block, false), sieve::Error);
}

TEST(SeerGateMath, InverseRopeUndoesRope) {
  std::vector<float> x = {0.3f, -1.2f, 2.f, 0.5f, -0.7f, 1.1f}, y = x;
  sg::rope_rotate(y.data(), 6, 4321, 10000.f);
  EXPECT_GT(std::fabs(y[0] - x[0]), 1e-3f);
  sg::rope_rotate(y.data(), 6, 4321, 10000.f, true);
  // Both turns use the same f32 angle and cos / sin (2 ulp each), so R^T R = (c^2 + s^2) I is off
  // I by 8u; each turn's two-term sums add gamma_2 of the pair's magnitude.
  const double u = sieve::tolerance::kF32;
  for (size_t i = 0; i < x.size(); ++i) {
    const double pair = std::fabs(x[i & ~size_t(1)]) + std::fabs(x[i | 1]);
    EXPECT_NEAR(y[i], x[i], sieve::tolerance::kSafety * (8 * u + 4 * sieve::tolerance::gamma(2, u)) * pair);
  }
}

TEST(SeerGateFile, RoundTripAndRefusals) {
  const sieve_geometry g = seer_geometry(sieve::kCpu, 6, 3, 4);
  const sg::GateWeights w = sg::random_gate(seer_shape(g, 64, 6, true), 17);
  const std::string path = temp_path("roundtrip");
  sg::write_gate(path, w);
  const sg::GateWeights r = sg::read_gate(path);
  EXPECT_EQ(r.shape.block, 64);
  EXPECT_EQ(r.shape.gate_dim, 6);
  EXPECT_TRUE(r.shape.rmsnorm);
  EXPECT_EQ(r.wq, w.wq);
  EXPECT_EQ(r.wk, w.wk);
  EXPECT_EQ(sg::random_gate(seer_shape(g, 64, 6, true), 17).wq, w.wq) << "deterministic per seed";

  // Truncated: refused with one line naming the file.
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string cut = temp_path("cut");
  std::ofstream(cut, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size() - 10));
  try {
    sg::read_gate(cut);
    ADD_FAILURE() << "a truncated gate file was accepted";
  } catch (const sieve::Error& e) {
    EXPECT_NE(std::string(e.what()).find("gate weights '" + cut + "'"), std::string::npos) << e.what();
  }
  // An odd gate_dim cannot be written.
  EXPECT_THROW(sg::random_gate(seer_shape(g, 64, 5, false), 1), sieve::Error);
}

// Metadata integers must be whole int32 values ("4294967301" used to wrap to 5), rope_theta a
// finite float; a directory is not a gate file.
TEST(SeerGateFile, RefusesOutOfRangeMetadataAndDirectories) {
  const sieve_geometry g = seer_geometry(sieve::kCpu, 6, 3, 4);
  const std::string path = temp_path("meta");
  sg::write_gate(path, sg::random_gate(seer_shape(g, 64, 6, false), 3));
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(bytes[size_t(i)]);
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  // The same file with one metadata value replaced (the header re-padded, the data unchanged).
  auto with_meta = [&](const std::string& key, const std::string& value) {
    nlohmann::json h = header;
    h["__metadata__"][key] = value;
    std::string text = h.dump();
    while (text.size() % 8) text += ' ';
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[size_t(i)] = char((text.size() >> (8 * i)) & 0xff);
    const std::string edited = temp_path("meta_" + key);
    std::ofstream(edited, std::ios::binary) << out << text << bytes.substr(8 + n);
    return edited;
  };
  auto error_of = [](const std::string& file) {
    try {
      sg::read_gate_shape(file);
    } catch (const sieve::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of(with_meta("n_layers", "4294967301")).find("'n_layers' = '4294967301' is outside the int32 range"),
            std::string::npos);
  EXPECT_NE(error_of(with_meta("gate_dim", "6x")).find("'gate_dim' = '6x' is not an integer"), std::string::npos);
  EXPECT_NE(error_of(with_meta("rope_theta", "1e39")).find("'rope_theta' = '1e39' is not a finite 32-bit float"),
            std::string::npos);
  EXPECT_NE(error_of(with_meta("head_dim", "1073741824")).find("too large"), std::string::npos);
  const std::string dir = error_of(::testing::TempDir());
  EXPECT_NE(dir.find("is a directory"), std::string::npos) << dir;
}

}  // namespace
