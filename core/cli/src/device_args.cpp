#include "sieve/cli/device_args.hpp"

#include <charconv>
#include <cstdint>
#include <limits>

#include "sieve/util/printable.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::cli {

std::optional<DLDevice> parse_device_arg(std::string_view text) {
  if (text == "cpu") return kCpu;
  if (text == "cuda") return DLDevice{kDLCUDA, 0};
  constexpr std::string_view prefix = "cuda:";
  if (text.substr(0, prefix.size()) != prefix) return std::nullopt;
  const std::string_view digits = text.substr(prefix.size());
  int32_t index = -1;
  // from_chars refuses a sign, spaces and an index past INT32_MAX (cuda:99999999999) alike.
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  if (digits.empty() || digits.front() == '-' || ec != std::errc() || end != digits.data() + digits.size())
    return std::nullopt;
  return DLDevice{kDLCUDA, index};
}

std::optional<DLDataType> parse_dtype_arg(std::string_view text) {
  if (text == "f32") return kF32;
  if (text == "f16") return kF16;
  if (text == "bf16") return kBF16;
  return std::nullopt;
}

std::string bad_device_message(std::string_view text) {
  return "--device must be cpu or cuda[:N] (N a device index in [0, " +
         std::to_string(std::numeric_limits<int32_t>::max()) + "]), got '" + printable(text) + "'";
}

std::string bad_dtype_message(std::string_view option, std::string_view text) {
  return std::string(option) + " must be f32, f16 or bf16, got '" + printable(text) + "'";
}

}  // namespace sieve::cli
