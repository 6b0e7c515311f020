// The llama2.c checkpoint format (karpathy/llama2.c "legacy" export, version 0): the embedded
// default model's format.
//
// Layout (little-endian): 7 int32 — dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
// seq_len; a negative vocab_size means the classifier is NOT shared with the token embedding
// (its |value| is the vocabulary). Then f32 tensors in this order: token embedding [vocab, dim],
// rms_att [L, dim], wq [L, dim, dim], wk [L, kv_dim, dim], wv [L, kv_dim, dim], wo [L, dim, dim],
// rms_ffn [L, dim], w1 [L, hidden, dim], w2 [L, dim, hidden], w3 [L, hidden, dim],
// rms_final [dim], two legacy RoPE tables of seq_len * head_dim / 2 floats each (skipped: RoPE is
// computed), and the classifier [vocab, dim] only when vocab_size was negative.
// RoPE theta 10000, RMSNorm eps 1e-5 (the format does not store them).
//
// Refused with one line naming the file: anything but a regular file, a file shorter than the
// header, the version-1+ export (magic "ak42"), an impossible header (non-positive sizes,
// dim % n_heads, n_heads % n_kv_heads, odd head_dim), a length that is not exactly what the header
// implies (truncated or longer; computed with overflow checks), and a tensor holding a NaN or an
// infinity (named). Nothing is allocated before the header has been checked against the length.
#pragma once
#include <cstddef>
#include <span>
#include <string>

#include "sieve/model/model.hpp"

namespace sieve::model {

// Parse a checkpoint held in memory; `name` names it in messages. Throws sieve::Error.
ModelWeights parse_llama2c(std::span<const std::byte> bytes, const std::string& name);
// Read and parse a file.
ModelWeights load_llama2c(const std::string& path);

}  // namespace sieve::model
