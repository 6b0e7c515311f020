// Helpers shared by the runtime tests: fixture paths, scratch directories, environment guards.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <sieve/abi.h>

namespace sieve::test {

// A small CPU model the fixture plugins accept: 5 layers, 8 query / 2 KV heads, head_dim 64,
// pages of 16, f32.
inline sieve_geometry model_geometry() {
  sieve_geometry g{};
  g.hdr = SIEVE_HEADER_INIT(sieve_geometry);
  g.n_layers = 5;
  g.n_q_heads = 8;
  g.n_kv_heads = 2;
  g.head_dim = 64;
  g.page_size = 16;
  g.max_batch = 2;
  g.max_seq_len = 512;
  g.kv_dtype = {kDLFloat, 32, 1};
  g.device = {kDLCPU, 0};
  g.rope_theta = 10000.f;
  g.rope_dim = 64;
  return g;
}

inline std::string fixture(const std::string& name) {
  return std::string(SIEVE_FIXTURE_DIR) + "/libsieve_" + name + ".so";
}
inline std::string fixture_variant(const std::string& name) {
  return std::string(SIEVE_FIXTURE_DIR) + "/variants/libsieve_" + name + ".so";
}

// A file's bytes, and a file written from bytes (corrupted copies of real plugins).
inline std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
inline void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

// A fresh directory under the system temp dir, removed with its contents at scope exit.
class ScratchDir {
 public:
  ScratchDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("sieve_rt_" + std::to_string(::getpid()) + "_" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string str() const { return path_.string(); }
  // Copy `file` into this directory as `name` and return the new path.
  std::string add(const std::string& file, const std::string& name) const {
    auto to = path_ / name;
    std::filesystem::copy_file(file, to, std::filesystem::copy_options::overwrite_existing);
    return to.string();
  }

 private:
  std::filesystem::path path_;
};

// Sets (or unsets, with nullopt) an environment variable for the scope, then restores it.
class EnvGuard {
 public:
  EnvGuard(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) ::setenv(name, value->c_str(), 1);
    else ::unsetenv(name);
  }
  ~EnvGuard() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace sieve::test
