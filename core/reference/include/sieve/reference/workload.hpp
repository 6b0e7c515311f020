// Random paged attention workloads for tests, conformance and `sieve attn`.
//
// A Workload owns every host tensor of one attention call and a sieve_attention_args that points
// at them, ready for attend_cpu / attend_reference (or to be copied to a device):
//   - q, out [n_q_tokens, n_q_heads, head_dim] and qo_indptr (decode: one query per sequence;
//     prefill: the last n_new tokens of each sequence);
//   - a paged K/V pool [page_capacity, n_kv_heads, page_size, head_dim] whose physical page ids
//     are shuffled (not in token order) and include spare pages no sequence uses; ragged last
//     pages. Spare pages and the unused tail of every last page hold NaN, so a kernel that reads
//     a token it must not read produces NaN;
//   - the page table (indptr / indices / last_page_len) and its host mirrors;
//   - optionally a block selection, q_rows, lse and page_mass.
// Inputs come from a seeded std::mt19937: normal q, k, v, plus a few "heavy" key directions per
// KV head that the query heads lean towards, so attention is peaked (a few keys carry much of the
// mass) as in real models rather than uniform.
//
// Workload is neither copyable nor movable: `args` and `kv` point into it. Tests may tamper with
// any public member (that is how malformed arguments are built).
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "sieve/attention.h"
#include "sieve/util/tensor.hpp"

namespace sieve::reference {

struct WorkloadSpec {
  int32_t n_q_heads = 8;
  int32_t n_kv_heads = 2;
  int32_t head_dim = 64;
  int32_t page_size = 16;
  DLDataType kv_dtype = kF32;
  DLDataType q_dtype = kF32;
  DLDataType out_dtype = kF32;
  sieve_phase phase = SIEVE_PHASE_DECODE;
  std::vector<int32_t> kv_lens = {100};  // resident tokens per sequence (new ones included); batch = size
  std::vector<int32_t> n_new;            // prefill: query tokens per sequence (<= kv_len); empty: all
  uint64_t seed = 1;
  int32_t spare_pages = 3;    // pool pages no sequence uses (NaN-filled)
  float scale = 0.f;          // args.scale (0: 1/sqrt(head_dim))
  int32_t heavy_directions = 2;   // per KV head
  double heavy_fraction = 0.05;   // of key tokens that carry a heavy direction
  double heavy_logit = 4.0;       // extra logit (at the default scale) of a heavy key
};

// A direction drawn uniformly on the unit sphere of `d` dimensions.
std::vector<float> random_unit_vector(std::mt19937& rng, int32_t d);

// One key-block list per selection row, row order as in attention.h.
using SelectionRows = std::vector<std::vector<int32_t>>;

struct Workload {
  explicit Workload(WorkloadSpec spec);
  Workload(const Workload&) = delete;
  Workload& operator=(const Workload&) = delete;

  WorkloadSpec spec;
  int32_t batch = 0;
  int32_t n_q_tokens = 0;
  std::vector<int32_t> kv_len;  // per sequence
  std::vector<int32_t> n_new;   // per sequence (1 in decode)

  HostTensor q, out;            // [n_q_tokens, n_q_heads, head_dim]
  HostTensor qo_indptr;         // int32 [batch + 1] (its data is also the host mirror)
  HostTensor k_pages, v_pages;  // [page_capacity, n_kv_heads, page_size, head_dim]
  HostTensor kv_indptr, kv_indices, kv_last_page_len;  // the page table (data = host mirrors)
  HostTensor sel_indptr, sel_indices;  // the selection's CSR (after set_selection)
  HostTensor q_rows;                   // int32 [m] (after set_q_rows)
  HostTensor lse;                      // f32 [n_q_tokens, n_q_heads] (after request_lse)
  HostTensor page_mass;                // f32 [nnz, H] (after request_stats)

  sieve_paged_kv kv{};
  sieve_selection selection{};
  sieve_attention_args args{};

  // Pages / key blocks / query blocks of sequence b.
  int32_t pages(int32_t b) const;
  int32_t key_blocks(int32_t b, int32_t k_block_pages) const;
  int32_t query_blocks(int32_t b, int32_t q_block) const;
  // Rows a selection with these heads and q_block has.
  int32_t selection_rows(uint32_t heads, int32_t q_block) const;

  // Every key block of each row kept with probability `keep` (rows may come out empty).
  SelectionRows random_selection_rows(uint32_t heads, int32_t q_block, int32_t k_block_pages,
                                      double keep, uint64_t seed) const;
  // Installs a BLOCKS selection (args.selection points at it). The indices tensor has a few
  // spare entries past the last row, holding -1, so a kernel reading past indptr[n_rows] fails.
  void set_selection(uint32_t heads, int32_t q_block, int32_t k_block_pages,
                     const SelectionRows& rows);
  void clear_selection();  // back to dense (args.selection = NULL)

  void set_q_rows(const std::vector<int32_t>& rows);  // args.q_rows
  void clear_q_rows();
  void request_lse();                             // args.lse
  void request_stats(sieve_stats_request stats);  // args.stats + args.page_mass

  // NaN in out, lse and page_mass: after a call, a NaN left where a value belongs is a row the
  // kernel failed to write; a non-NaN where none belongs is a row it wrote but must not.
  void poison_outputs();
};

}  // namespace sieve::reference
