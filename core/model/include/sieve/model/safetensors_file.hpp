// The safetensors container itself (a little-endian u64 header length, a JSON header, raw
// tensors), independent of what the tensors mean: the model loader (safetensors.hpp) and the
// SeerAttention-R gate files (plugins/seer/gate) both read it through here, and the gate tool
// writes it. Only regular files are read (sieve/util/file_input.hpp); the header is at most
// kMaxSafetensorsHeaderBytes; every extent is checked against the file and tensors may not share
// bytes; a tensor holding a NaN or an infinity is refused when read. Errors are one line
// "<what> '<file>': <problem>" (sieve::Error).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace sieve::model {

// The format's own cap on the JSON header (the reference implementation refuses larger ones).
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct SafetensorsEntry {
  std::string file;
  std::string dtype;  // "F32", "F16", "BF16", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // absolute file offsets
};

struct SafetensorsHeader {
  std::map<std::string, SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__" (string values only)
};

// Parse the header of `file` and add its tensors to `out` (metadata too). `what` prefixes every
// error ("model", "gate weights").
void read_safetensors_header(const std::string& file, SafetensorsHeader* out, const std::string& what = "model");

// One tensor as f32 (F32, F16 and BF16 are converted).
std::vector<float> read_safetensors_tensor(const SafetensorsEntry& e, const std::string& name,
                                           const std::string& what = "model");

// A tensor to write: f32 data, row-major.
struct SafetensorsTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// Write F32 tensors (in the order given) and string metadata. Throws sieve::Error when the file
// cannot be written or a tensor's data does not match its shape.
void write_safetensors(const std::string& file, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata);

}  // namespace sieve::model
