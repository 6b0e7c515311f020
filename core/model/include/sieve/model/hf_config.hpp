// A Hugging Face config.json (Llama / Qwen2) as a ModelConfig: the keys, defaults and refusals
// safetensors.hpp lists. Values are checked for their JSON type, not converted: a size must be
// an integral JSON number within int32 (64.7 and 4294967360 are refused, not truncated), a real
// must fit a 32-bit float. Errors: one sieve::Error line "model '<name>': ...".
#pragma once
#include <string>

#include "sieve/model/model.hpp"

namespace sieve::model {

// `text` is the file's content; `name` names it in messages.
ModelConfig parse_hf_config(const std::string& text, const std::string& name);

// The largest config.json read (a real one is a few KiB).
constexpr uint64_t kMaxHfConfigBytes = 16u << 20;

}  // namespace sieve::model
