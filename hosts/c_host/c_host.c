/* sieve_c_host: a model-free host in plain C11 over the C host API (sieve/host.h) alone.
 *
 * It lists the plugins it finds, then runs a 2-layer "model" (random post-RoPE q/k/v, two ragged
 * sequences: one prefill call, then decode steps) through two sessions: dense (no chain) and the
 * chain given with --chain. The dense session's output is checked against a plain f64 attention
 * this program computes from its own copy of K/V, so a wrong runtime fails here; the chain's output
 * is checked for finiteness and reported as its distance from dense, with the KV bytes each holds.
 * Finally it checks that bad input is refused with a status and a message, not a crash.
 * With --engine-pool the chain also runs over a cache this host keeps itself (engine_pages.c: its
 * own pool in shuffled page order, HND and then NHD, bound per layer and step through
 * sieve_session_bind_pages, evicted pages coming back through the release sink), and must give the
 * core store's outputs and KV bytes bit for bit; a table naming a page outside the pool is refused.
 *
 *   sieve_c_host [--plugin-dir DIR]... [--chain SPEC] [--steps N] [--engine-pool]
 * Exit status 0 when every check passed, 1 otherwise, 2 on bad usage. */
#include <sieve/host.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_pages.h"

enum { LAYERS = 2, HQ = 8, HKV = 2, DIM = 64, PAGE = 16, BATCH = 2, MAX_SEQ = 256 };
static const int32_t kPrompt[BATCH] = {37, 70}; /* ragged: last pages of 5 and 6 tokens */

static int g_failures = 0;
#define CHECK(cond, ...)                          \
  do {                                            \
    if (!(cond)) {                                \
      fprintf(stderr, "c_host: FAIL: " __VA_ARGS__); \
      fputc('\n', stderr);                        \
      ++g_failures;                               \
    }                                             \
  } while (0)

/* Deterministic inputs: a small LCG, uniform in [-1, 1). */
static uint64_t g_rng = 0x5eed5eedULL;
static float uniform(void) {
  g_rng = g_rng * 6364136223846793005ULL + 1442695040888963407ULL;
  return (float)((double)(g_rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static DLTensor tensor3(float* data, int64_t* shape, int64_t rows, int64_t heads) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = 3;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  shape[0] = rows, shape[1] = heads, shape[2] = DIM;
  t.shape = shape;
  return t;
}

/* The host's own copy of every key and value, [layer][seq][token][kv head][dim]. */
static float g_keys[LAYERS][BATCH][MAX_SEQ][HKV][DIM];
static float g_values[LAYERS][BATCH][MAX_SEQ][HKV][DIM];
static int32_t g_len[LAYERS][BATCH];

/* f64 causal attention of query row `q` (position pos of sequence b) in `layer`, head h. */
static void reference_row(int layer, int b, int32_t pos, int h, const float* q, double* out) {
  const int kvh = h / (HQ / HKV);
  double m = -INFINITY, sum = 0, acc[DIM] = {0};
  int32_t t;
  int d;
  const double scale = 1.0 / sqrt((double)DIM);
  for (t = 0; t <= pos; ++t) {
    double s = 0;
    for (d = 0; d < DIM; ++d) s += (double)q[d] * g_keys[layer][b][t][kvh][d];
    s *= scale;
    if (s > m) {
      const double c = exp(m - s);
      sum *= c;
      for (d = 0; d < DIM; ++d) acc[d] *= c;
      m = s;
    }
    {
      const double p = exp(s - m);
      sum += p;
      for (d = 0; d < DIM; ++d) acc[d] += p * g_values[layer][b][t][kvh][d];
    }
  }
  for (d = 0; d < DIM; ++d) out[d] = acc[d] / sum;
}

typedef struct run_result {
  double err_vs_reference; /* ‖o − o_ref‖ / ‖o_ref‖ over every output row */
  double diff_vs_dense;    /* filled by the caller for the chain session */
  int non_finite;
  uint64_t kv_bytes;
} run_result;

/* Runs prefill + `steps` decode steps through `session`, writing all outputs to `outputs`
 * (rows in call order) and comparing each against reference_row. */
static int run_model(sieve_session* session, engine_pages* engine, int steps, float* outputs, run_result* r) {
  int32_t seq[BATCH];
  int32_t qo[BATCH + 1];
  int64_t qs[3], ks[3], vs[3], os[3];
  static float q[MAX_SEQ * BATCH][HQ][DIM], k[MAX_SEQ * BATCH][HKV][DIM], v[MAX_SEQ * BATCH][HKV][DIM];
  double num = 0, den = 0;
  int b, layer, step, row, h, d;
  size_t out_row = 0;
  sieve_layer_inputs in;

  g_rng = 0x5eed5eedULL; /* both sessions see the same inputs */
  memset(g_len, 0, sizeof g_len);
  r->non_finite = 0;
  for (b = 0; b < BATCH; ++b)
    if (sieve_session_add_sequence(session, &seq[b]) != SIEVE_OK) {
      fprintf(stderr, "c_host: add_sequence: %s\n", sieve_session_last_error(session));
      return 0;
    }
  for (step = 0; step <= steps; ++step) {
    const uint32_t phase = step == 0 ? SIEVE_PHASE_PREFILL : SIEVE_PHASE_DECODE;
    qo[0] = 0;
    for (b = 0; b < BATCH; ++b) qo[b + 1] = qo[b] + (step == 0 ? kPrompt[b] : 1);
    for (layer = 0; layer < LAYERS; ++layer) {
      DLTensor tq = tensor3(&q[0][0][0], qs, qo[BATCH], HQ), tk = tensor3(&k[0][0][0], ks, qo[BATCH], HKV),
               tv = tensor3(&v[0][0][0], vs, qo[BATCH], HKV),
               to = tensor3(outputs + out_row * HQ * DIM, os, qo[BATCH], HQ);
      for (row = 0; row < qo[BATCH]; ++row) {
        for (h = 0; h < HQ; ++h)
          for (d = 0; d < DIM; ++d) q[row][h][d] = uniform();
        for (h = 0; h < HKV; ++h)
          for (d = 0; d < DIM; ++d) k[row][h][d] = uniform(), v[row][h][d] = uniform();
      }
      for (row = 0; row < qo[BATCH] * HQ * DIM; ++row) outputs[out_row * HQ * DIM + (size_t)row] = NAN;
      memset(&in, 0, sizeof in);
      in.hdr.struct_size = sizeof in;
      in.hdr.version = SIEVE_ABI_MINOR;
      in.layer = layer;
      in.phase = phase;
      in.batch = BATCH;
      in.seq_ids = seq;
      in.qo_indptr = qo;
      in.q = &tq;
      in.k = &tk;
      in.v = &tv;
      if (engine && engine_pages_step(engine, session, layer, seq, BATCH, qo, &k[0][0][0], &v[0][0][0]) != SIEVE_OK) {
        fprintf(stderr, "c_host: engine pages (layer %d, step %d): %s%s\n", layer, step,
                engine_pages_last_error(engine), sieve_session_last_error(session));
        return 0;
      }
      if (sieve_session_attend(session, &in, &to) != SIEVE_OK) {
        fprintf(stderr, "c_host: attend (layer %d, step %d): %s\n", layer, step, sieve_session_last_error(session));
        return 0;
      }
      /* The host's copy of the cache, then the reference for each new row. */
      for (b = 0; b < BATCH; ++b)
        for (row = qo[b]; row < qo[b + 1]; ++row) {
          int32_t pos = g_len[layer][b]++;
          memcpy(g_keys[layer][b][pos], k[row], sizeof k[row]);
          memcpy(g_values[layer][b][pos], v[row], sizeof v[row]);
        }
      for (b = 0; b < BATCH; ++b)
        for (row = qo[b]; row < qo[b + 1]; ++row) {
          const int32_t pos = g_len[layer][b] - (qo[b + 1] - row);
          for (h = 0; h < HQ; ++h) {
            double ref[DIM];
            const float* o = outputs + (out_row + (size_t)row) * HQ * DIM + (size_t)h * DIM;
            reference_row(layer, b, pos, h, q[row][h], ref);
            for (d = 0; d < DIM; ++d) {
              if (!isfinite(o[d])) ++r->non_finite;
              num += (o[d] - ref[d]) * (o[d] - ref[d]);
              den += ref[d] * ref[d];
            }
          }
        }
      out_row += (size_t)qo[BATCH];
    }
    if (sieve_session_end_step(session, phase, seq, BATCH) != SIEVE_OK) {
      fprintf(stderr, "c_host: end_step: %s\n", sieve_session_last_error(session));
      return 0;
    }
    /* Evicted pages came back to the engine: its lists hold exactly the tokens Sieve keeps. */
    for (layer = 0; engine && layer < LAYERS; ++layer)
      for (b = 0; b < BATCH; ++b) {
        int32_t kept = -1;
        sieve_session_seq_len(session, layer, seq[b], &kept);
        CHECK(kept == engine_pages_tokens(engine, layer, b),
              "step %d, layer %d, sequence %d: Sieve keeps %d tokens, the engine's pages hold %d", step, layer, b,
              (int)kept, (int)engine_pages_tokens(engine, layer, b));
      }
  }
  r->err_vs_reference = sqrt(num / den);
  if (sieve_session_synchronize(session) != SIEVE_OK || sieve_session_kv_bytes(session, &r->kv_bytes) != SIEVE_OK) {
    fprintf(stderr, "c_host: %s\n", sieve_session_last_error(session));
    return 0;
  }
  return 1;
}

static sieve_geometry model_geometry(void) {
  sieve_geometry g;
  memset(&g, 0, sizeof g);
  g.hdr.struct_size = sizeof g;
  g.hdr.version = SIEVE_ABI_MINOR;
  g.n_layers = LAYERS;
  g.n_q_heads = HQ;
  g.n_kv_heads = HKV;
  g.head_dim = DIM;
  g.page_size = PAGE;
  g.max_batch = BATCH;
  g.max_seq_len = MAX_SEQ;
  g.kv_dtype.code = kDLFloat;
  g.kv_dtype.bits = 32;
  g.kv_dtype.lanes = 1;
  g.device.device_type = kDLCPU;
  g.rope_theta = 10000.f;
  g.rope_dim = DIM;
  return g;
}

/* Bad input must come back as a status and a message. */
static void check_error_paths(sieve_runtime* rt, sieve_session* s) {
  sieve_chain* chain = NULL;
  sieve_layer_inputs in;
  int32_t seq = 0, qo[2] = {0, 1}; /* a sequence run_model added */
  sieve_status st = sieve_chain_parse(rt, "decode:*=", &chain);
  CHECK(st == SIEVE_ERR_INVALID_ARGUMENT && chain == NULL && *sieve_runtime_last_error(rt),
        "a malformed chain spec was not refused with a message");
  printf("refused as expected: %s\n", sieve_runtime_last_error(rt));
  st = sieve_chain_parse(rt, "decode:*=no_such_policy", &chain);
  if (st == SIEVE_OK) {
    sieve_geometry g = model_geometry();
    sieve_session* bad = NULL;
    st = sieve_session_create(rt, &g, chain, NULL, &bad);
    CHECK(st != SIEVE_OK && bad == NULL && *sieve_runtime_last_error(rt), "an unknown policy was not refused");
    printf("refused as expected: %s\n", sieve_runtime_last_error(rt));
    sieve_chain_destroy(chain);
  }
  memset(&in, 0, sizeof in);
  in.hdr.struct_size = sizeof in;
  in.phase = SIEVE_PHASE_DECODE;
  in.batch = 1;
  in.seq_ids = &seq;
  in.qo_indptr = qo;
  st = sieve_session_attend(s, &in, NULL);
  CHECK(st != SIEVE_OK && *sieve_session_last_error(s), "attend without tensors was not refused");
  printf("refused as expected: %s\n", sieve_session_last_error(s));
}

/* The chain again, over this host's own cache (engine_pages.c) in `layout` through the engine_pool
 * store: the same inputs must give the core store's outputs bit for bit (the same arithmetic in
 * the same order; only the pages' physical ids and strides differ) and the same KV bytes. Pages
 * the chain evicts must come back to the engine, and only pages the sequence held. */
static void run_engine_pool(sieve_runtime* rt, const char* chain_text, int steps, uint32_t layout,
                            const float* core_out, size_t n_out, const run_result* core, uint64_t dense_kv_bytes) {
  const int32_t pool = BATCH * (MAX_SEQ / PAGE); /* what the core store holds per layer */
  const char* name = layout == SIEVE_KV_LAYOUT_NHD ? "nhd" : "hnd";
  char store[64];
  sieve_geometry g = model_geometry();
  sieve_session_options opt;
  sieve_chain* chain = NULL;
  sieve_session* s = NULL;
  engine_pages* e = engine_pages_create(&g, pool, layout, 7u);
  float* out = (float*)malloc(n_out * sizeof(float));
  run_result r;
  memset(&r, 0, sizeof r);
  memset(&opt, 0, sizeof opt);
  opt.hdr.struct_size = sizeof opt;
  opt.hdr.version = SIEVE_ABI_MINOR;
  opt.pages_per_layer = pool;
  snprintf(store, sizeof store, "engine_pool(layout=%s)", name);
  opt.kv_store = store;
  if (!e || !out) {
    CHECK(0, "out of memory");
  } else if (sieve_chain_parse(rt, chain_text, &chain) != SIEVE_OK ||
             (opt.release = engine_pages_sink(e), sieve_session_create(rt, &g, chain, &opt, &s)) != SIEVE_OK) {
    CHECK(0, "engine-pool session (%s): %s", name, sieve_runtime_last_error(rt));
  } else {
    CHECK(!strcmp(sieve_session_kv_store_name(s), "engine_pool"), "the session runs on '%s', not engine_pool",
          sieve_session_kv_store_name(s));
    if (!run_model(s, e, steps, out, &r)) {
      ++g_failures;
    } else {
      sieve_status st;
      CHECK(!memcmp(out, core_out, n_out * sizeof(float)),
            "%s: the chain over the engine's pages differs from the core store", name);
      CHECK(r.kv_bytes == core->kv_bytes, "%s: KV bytes %llu over the engine's pages, %llu over the core store", name,
            (unsigned long long)r.kv_bytes, (unsigned long long)core->kv_bytes);
      /* A chain that kept fewer bytes than dense evicted: those pages went back through the sink. */
      CHECK((core->kv_bytes < dense_kv_bytes) == (engine_pages_released(e) > 0),
            "%s: the chain keeps %llu of dense's %llu KV bytes, and %d page(s) came back to the engine", name,
            (unsigned long long)core->kv_bytes, (unsigned long long)dense_kv_bytes, engine_pages_released(e));
      CHECK(engine_pages_bad_releases(e) == 0, "%s: %d page(s) released that the sequence did not hold", name,
            engine_pages_bad_releases(e));
      printf("engine pool (%s): identical to the core store, KV %llu bytes, %d page(s) given back to the host\n",
             name, (unsigned long long)r.kv_bytes, engine_pages_released(e));
      st = engine_pages_bind_bad_page(e, s, 0);
      CHECK(st == SIEVE_ERR_INVALID_ARGUMENT && strstr(sieve_session_last_error(s), "outside the pool"),
            "%s: a page id past the engine's pool was not refused (%d: %s)", name, (int)st,
            sieve_session_last_error(s));
      printf("refused as expected: %s\n", sieve_session_last_error(s));
    }
  }
  sieve_session_destroy(s);
  sieve_chain_destroy(chain);
  engine_pages_destroy(e);
  free(out);
}

int main(int argc, char** argv) {
  const char* chain_text = "decode:*=streaming(sink=16, window=32)";
  int steps = 6, i, engine_mode = 0;
  uint32_t n = 0, major = sieve_host_api_version() >> 16;
  sieve_runtime* rt = NULL;
  sieve_chain* chain = NULL;
  sieve_session *dense = NULL, *sparse = NULL;
  sieve_geometry g = model_geometry();
  float *dense_out, *sparse_out;
  size_t n_out;
  run_result rd, rs;

  if (major != SIEVE_HOST_API_MAJOR) {
    fprintf(stderr, "c_host: the runtime speaks host API %u, this host was built for %u\n", major,
            SIEVE_HOST_API_MAJOR);
    return 1;
  }
  if (sieve_runtime_create(NULL, &rt) != SIEVE_OK) return fprintf(stderr, "c_host: runtime_create failed\n"), 1;
  for (i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--plugin-dir") && i + 1 < argc) {
      if (sieve_runtime_add_plugin_dir(rt, argv[++i]) != SIEVE_OK)
        return fprintf(stderr, "c_host: %s\n", sieve_runtime_last_error(rt)), sieve_runtime_destroy(rt), 2;
    } else if (!strcmp(argv[i], "--chain") && i + 1 < argc) {
      chain_text = argv[++i];
    } else if (!strcmp(argv[i], "--steps") && i + 1 < argc) {
      char* end = NULL;
      const long v = strtol(argv[++i], &end, 10);
      if (*argv[i] == '\0' || *end || v < 0 || v > MAX_SEQ - kPrompt[BATCH - 1]) {
        fprintf(stderr, "c_host: --steps '%s': expected an integer in [0, %d]\n", argv[i], MAX_SEQ - kPrompt[BATCH - 1]);
        sieve_runtime_destroy(rt);
        return 2;
      }
      steps = (int)v;
    } else if (!strcmp(argv[i], "--engine-pool")) {
      engine_mode = 1;
    } else {
      fprintf(stderr,
              "c_host: %s '%s' (usage: sieve_c_host [--plugin-dir DIR]... [--chain SPEC] [--steps N] [--engine-pool])\n",
              i + 1 == argc && (!strcmp(argv[i], "--plugin-dir") || !strcmp(argv[i], "--chain") ||
                                !strcmp(argv[i], "--steps"))
                  ? "missing value after"
                  : "unexpected argument",
              argv[i]);
      sieve_runtime_destroy(rt);
      return 2;
    }
  }

  if (sieve_runtime_plugin_count(rt, &n) != SIEVE_OK) return fprintf(stderr, "c_host: %s\n", sieve_runtime_last_error(rt)), 1;
  printf("%u plugin(s)\n", n);
  for (i = 0; i < (int)n; ++i) {
    sieve_plugin_info info;
    memset(&info, 0, sizeof info);
    info.hdr.struct_size = sizeof info;
    if (sieve_runtime_plugin_info(rt, (uint32_t)i, &info) != SIEVE_OK) continue;
    printf("  %-18s ABI %u.%u  %u param(s)  %s\n", info.name, info.abi_major, info.abi_minor, info.n_params,
           info.descriptor ? info.descriptor->summary : "(no policy)");
  }

  if (sieve_chain_parse(rt, chain_text, &chain) != SIEVE_OK)
    return fprintf(stderr, "c_host: %s\n", sieve_runtime_last_error(rt)), sieve_runtime_destroy(rt), 1;
  if (sieve_session_create(rt, &g, NULL, NULL, &dense) != SIEVE_OK ||
      sieve_session_create(rt, &g, chain, NULL, &sparse) != SIEVE_OK) {
    fprintf(stderr, "c_host: session_create: %s\n", sieve_runtime_last_error(rt));
    sieve_session_destroy(dense);
    sieve_chain_destroy(chain);
    sieve_runtime_destroy(rt);
    return 1;
  }
  printf("chain: %s\n", sieve_chain_text(chain));
  sieve_chain_destroy(chain); /* the session keeps what it needs */

  n_out = (size_t)LAYERS * (size_t)(kPrompt[0] + kPrompt[1] + BATCH * steps) * HQ * DIM;
  dense_out = (float*)malloc(n_out * sizeof(float));
  sparse_out = (float*)malloc(n_out * sizeof(float));
  if (!dense_out || !sparse_out) return fprintf(stderr, "c_host: out of memory\n"), 1;
  memset(&rd, 0, sizeof rd);
  memset(&rs, 0, sizeof rs);
  if (!run_model(dense, NULL, steps, dense_out, &rd) || !run_model(sparse, NULL, steps, sparse_out, &rs)) ++g_failures;
  else {
    double num = 0, den = 0;
    size_t j;
    for (j = 0; j < n_out; ++j) {
      num += ((double)sparse_out[j] - dense_out[j]) * ((double)sparse_out[j] - dense_out[j]);
      den += (double)dense_out[j] * dense_out[j];
    }
    rs.diff_vs_dense = sqrt(num / den);
    printf("dense: rel err vs f64 reference %.3e, %d non-finite, KV %llu bytes\n", rd.err_vs_reference,
           rd.non_finite, (unsigned long long)rd.kv_bytes);
    printf("chain: rel diff vs dense %.3e, %d non-finite, KV %llu bytes\n", rs.diff_vs_dense, rs.non_finite,
           (unsigned long long)rs.kv_bytes);
    CHECK(rd.non_finite == 0 && rd.err_vs_reference < 1e-4, "dense output differs from the f64 reference (%.3e)",
          rd.err_vs_reference);
    CHECK(rs.non_finite == 0, "the chain's output has %d non-finite values", rs.non_finite);
  }
  if (engine_mode && g_failures == 0) {
    run_engine_pool(rt, chain_text, steps, SIEVE_KV_LAYOUT_HND, sparse_out, n_out, &rs, rd.kv_bytes);
    run_engine_pool(rt, chain_text, steps, SIEVE_KV_LAYOUT_NHD, sparse_out, n_out, &rs, rd.kv_bytes);
  }
  check_error_paths(rt, dense);

  free(dense_out);
  free(sparse_out);
  sieve_session_destroy(sparse);
  sieve_session_destroy(dense);
  sieve_runtime_destroy(rt);
  printf("%s\n", g_failures ? "FAIL" : "PASS");
  return g_failures ? 1 : 0;
}
