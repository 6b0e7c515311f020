#include "sieve/model/safetensors_file.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "sieve/util/checked.hpp"
#include "sieve/util/error.hpp"
#include "sieve/util/file_input.hpp"
#include "sieve/util/half.hpp"
#include "sieve/util/printable.hpp"

namespace sieve::model {

using nlohmann::json;

namespace {
[[noreturn]] void refuse(const std::string& what, const std::string& file, const std::string& problem) {
  fail(SIEVE_ERR_INVALID_ARGUMENT, file_label(what, file) + ": " + problem);
}
std::string tensor_label(const std::string& name) { return "tensor '" + printable(name) + "'"; }
}  // namespace

void read_safetensors_header(const std::string& file, SafetensorsHeader* out, const std::string& what) {
  const InputFile f(file, what);
  const uint64_t size = f.size();
  if (size < 8)
    refuse(what, file, "truncated safetensors file: " + std::to_string(size) + " bytes, the header length alone is 8");
  unsigned char len_bytes[8];
  f.read_at(0, len_bytes, 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  if (n > size - 8)
    refuse(what, file, "truncated safetensors file: the header claims " + std::to_string(n) + " bytes, " +
                           std::to_string(size - 8) + " follow");
  if (n > kMaxSafetensorsHeaderBytes)
    refuse(what, file, "the safetensors header claims " + std::to_string(n) + " bytes, more than the format's " +
                           std::to_string(kMaxSafetensorsHeaderBytes));
  std::string text(size_t(n), '\0');
  f.read_at(8, text.data(), text.size());
  json h;
  try {
    h = json::parse(text);
  } catch (const std::exception& e) {
    refuse(what, file, std::string("safetensors header is not JSON: ") + printable(e.what()));
  }
  if (!h.is_object()) refuse(what, file, "safetensors header is not a JSON object");
  const uint64_t data_start = 8 + n, data_size = size - data_start;
  std::vector<std::pair<uint64_t, uint64_t>> extents;  // [begin, end) of each tensor's data
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (it.value().is_object())
        for (auto m = it.value().begin(); m != it.value().end(); ++m)
          if (m.value().is_string()) out->metadata[m.key()] = m.value().get<std::string>();
      continue;
    }
    const json& t = it.value();
    const std::string where = tensor_label(it.key()) + ": ";
    if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") || !t.contains("data_offsets") ||
        !t["dtype"].is_string() || !t["shape"].is_array() || !t["data_offsets"].is_array() ||
        t["data_offsets"].size() != 2)
      refuse(what, file, where + "needs dtype, shape and data_offsets [begin, end]");
    SafetensorsEntry e;
    e.file = file;
    e.dtype = t["dtype"].get<std::string>();
    int64_t elems = 1;
    for (const auto& s : t["shape"]) {
      if (!s.is_number_unsigned() || s.get<uint64_t>() > uint64_t(INT64_MAX))
        refuse(what, file, where + "shape entries must be non-negative 64-bit integers");
      e.shape.push_back(s.get<int64_t>());
      elems = checked_mul(elems, e.shape.back(), file_label(what, file) + ": " + where + "element count");
    }
    if (!t["data_offsets"][0].is_number_unsigned() || !t["data_offsets"][1].is_number_unsigned())
      refuse(what, file, where + "data_offsets must be non-negative integers");
    const uint64_t b = t["data_offsets"][0].get<uint64_t>(), en = t["data_offsets"][1].get<uint64_t>();
    if (b > en || en > data_size)
      refuse(what, file, where + "data_offsets [" + std::to_string(b) + ", " + std::to_string(en) +
                             "] fall outside the " + std::to_string(data_size) + " data bytes (truncated file?)");
    const int64_t elem_bytes = e.dtype == "F32" ? 4 : (e.dtype == "F16" || e.dtype == "BF16") ? 2 : 0;
    if (elem_bytes && (elems > int64_t(data_size) || uint64_t(elems * elem_bytes) != en - b))
      refuse(what, file, where + std::to_string(en - b) + " bytes for " + std::to_string(elems) + " " +
                             printable(e.dtype) + " elements");
    e.begin = data_start + b;
    e.end = data_start + en;
    if (en > b) extents.emplace_back(b, en);
    out->tensors[it.key()] = std::move(e);
  }
  // Tensors must not share bytes (the format lays them end to end): then what the tensors
  // expand to is bounded by the file's length, however many names the header lists.
  std::sort(extents.begin(), extents.end());
  for (size_t i = 1; i < extents.size(); ++i)
    if (extents[i].first < extents[i - 1].second)
      refuse(what, file, "two tensors overlap in the data bytes [" + std::to_string(extents[i].first) + ", " +
                             std::to_string(extents[i - 1].second) + ")");
}

std::vector<float> read_safetensors_tensor(const SafetensorsEntry& e, const std::string& name, const std::string& what) {
  if (e.dtype != "F32" && e.dtype != "F16" && e.dtype != "BF16")
    refuse(what, e.file, tensor_label(name) + " has dtype " + printable(e.dtype) + "; supported: F32, F16, BF16");
  const InputFile f(e.file, what);
  std::vector<unsigned char> raw(size_t(e.end - e.begin));
  f.read_at(e.begin, raw.data(), raw.size());
  std::vector<float> v;
  if (e.dtype == "F32") {
    v.resize(raw.size() / 4);
    std::memcpy(v.data(), raw.data(), raw.size());
  } else {
    v.resize(raw.size() / 2);
    for (size_t i = 0; i < v.size(); ++i) {
      const uint16_t h = uint16_t(raw[2 * i] | (raw[2 * i + 1] << 8));
      v[i] = e.dtype == "F16" ? f16_to_f32(h) : bf16_to_f32(h);
    }
  }
  // One pass: a NaN or an infinity would make every output of the model NaN, silently.
  for (float x : v)
    if (!std::isfinite(x)) refuse(what, e.file, tensor_label(name) + " holds a non-finite value (NaN or infinity)");
  return v;
}

void write_safetensors(const std::string& file, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json h = json::object();
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    uint64_t elems = 1;
    for (int64_t s : t.shape) elems *= uint64_t(s);
    require(elems == t.data.size(), SIEVE_ERR_INVALID_ARGUMENT,
            "safetensors '" + file + "': tensor '" + t.name + "' has " + std::to_string(t.data.size()) +
                " values for a shape of " + std::to_string(elems));
    h[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + elems * 4}}};
    offset += elems * 4;
  }
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::string text = h.dump();
  while (text.size() % 8) text += ' ';  // the format pads the header to 8-byte alignment
  std::ofstream f(file, std::ios::binary | std::ios::trunc);
  if (!f) fail(SIEVE_ERR_NOT_FOUND, "safetensors '" + file + "': cannot write: " + std::strerror(errno));
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t((uint64_t(text.size()) >> (8 * i)) & 0xff);
  f.write(reinterpret_cast<const char*>(len), 8);
  f.write(text.data(), std::streamsize(text.size()));
  for (const auto& t : tensors)  // little-endian hosts only (x86-64, aarch64)
    f.write(reinterpret_cast<const char*>(t.data.data()), std::streamsize(t.data.size() * 4));
  if (!f) fail(SIEVE_ERR_INTERNAL, "safetensors '" + file + "': write failed");
}

}  // namespace sieve::model
