// The --device and KV dtype options every command shares, parsed once: "cpu", "cuda" or "cuda:N"
// (N a decimal device index that fits an int32), and "f32", "f16" or "bf16".
#pragma once
#include <dlpack/dlpack.h>

#include <optional>
#include <string>
#include <string_view>

namespace sieve::cli {

std::optional<DLDevice> parse_device_arg(std::string_view text);
std::optional<DLDataType> parse_dtype_arg(std::string_view text);

// "--device must be cpu or cuda[:N] ..., got '<text>'" (text escaped), for the command's error line.
std::string bad_device_message(std::string_view text);
// "<option> must be f32, f16 or bf16, got '<text>'".
std::string bad_dtype_message(std::string_view option, std::string_view text);

}  // namespace sieve::cli
