// The fuzz targets' main() where libFuzzer is missing (gcc, the default build): replay the seed
// corpus, then a seeded mutation loop (bit flips, byte sets, inserts, deletes, splices, interesting
// integers as bytes and as decimal text) for a bounded time or number of runs. The same seed and
// corpus give the same inputs, so a failure reproduces from the line printed at the start; the
// input that crashed (or hung past -timeout) is also written to <name>-crash.bin.
//
// Flags follow libFuzzer's spelling, so ctest runs either binary the same way:
//   fuzz_X [-seed=N] [-max_total_time=S] [-runs=N] [-max_len=N] [-timeout=S] [-artifact_prefix=P]
//          DIR|FILE...        (directories: every file in them, in name order)
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

using Bytes = std::vector<uint8_t>;

// What a crash handler writes: set before every input (async-signal-safe to read).
const Bytes* g_current = nullptr;
char g_crash_path[4096] = "fuzz-crash.bin";

void write_current_input() {
  if (!g_current) return;
  const int fd = ::open(g_crash_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;
  size_t done = 0;
  while (done < g_current->size()) {
    const ssize_t n = ::write(fd, g_current->data() + done, g_current->size() - done);
    if (n <= 0) break;
    done += size_t(n);
  }
  ::close(fd);
  const char note[] = "fuzz driver: the failing input is in ";
  (void)!::write(2, note, sizeof note - 1);
  (void)!::write(2, g_crash_path, std::strlen(g_crash_path));
  (void)!::write(2, "\n", 1);
}

void on_fatal_signal(int sig) {
  if (sig == SIGALRM) {
    const char msg[] = "fuzz driver: one input ran past -timeout\n";
    (void)!::write(2, msg, sizeof msg - 1);
  }
  write_current_input();
  ::signal(sig == SIGALRM ? SIGABRT : sig, SIG_DFL);
  ::raise(sig == SIGALRM ? SIGABRT : sig);
}

void install_crash_handlers() {
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGALRM}) ::signal(sig, on_fatal_signal);
#if defined(__SANITIZE_ADDRESS__)
  // A sanitizer report ends the process without a signal: it calls this first.
  __sanitizer_set_death_callback(write_current_input);
#endif
}

bool read_file(const std::filesystem::path& p, size_t max_len, Bytes* out) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return false;
  out->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  if (out->size() > max_len) out->resize(max_len);
  return true;
}

// Integers at the edges parsers get wrong: as little-endian bytes and as decimal text.
const int64_t kInteresting[] = {0, 1, -1, 7, 8, 9, 16, 64, 127, 128, 255, 256, 1024, 4096, 32767, 65535, 65536,
                                (1LL << 24), INT32_MAX, int64_t(INT32_MAX) + 1, UINT32_MAX, int64_t(UINT32_MAX) + 1,
                                INT64_MAX, INT64_MIN, 99999999999LL};

class Mutator {
 public:
  Mutator(uint64_t seed, size_t max_len) : rng_(seed), max_len_(max_len) {}

  Bytes mutate(const std::vector<Bytes>& corpus) {
    Bytes x = corpus.empty() ? Bytes{} : corpus[pick(corpus.size())];
    const size_t n = 1 + pick(4);
    for (size_t i = 0; i < n; ++i) step(&x, corpus);
    if (x.size() > max_len_) x.resize(max_len_);
    return x;
  }

 private:
  size_t pick(size_t n) { return n ? size_t(rng_() % n) : 0; }

  void step(Bytes* x, const std::vector<Bytes>& corpus) {
    switch (pick(8)) {
      case 0:  // flip one bit
        if (!x->empty()) (*x)[pick(x->size())] ^= uint8_t(1u << pick(8));
        break;
      case 1:  // set a byte (often a structural one of the texts fuzzed here)
        if (!x->empty()) {
          static const char kSpecial[] = "=;>,()[]\"@:*-#\n\t 0123456789";
          (*x)[pick(x->size())] = pick(2) ? uint8_t(rng_()) : uint8_t(kSpecial[pick(sizeof kSpecial - 1)]);
        }
        break;
      case 2: {  // insert bytes
        const size_t at = pick(x->size() + 1), len = 1 + pick(8);
        Bytes ins(len);
        for (auto& b : ins) b = uint8_t(rng_());
        x->insert(x->begin() + ptrdiff_t(at), ins.begin(), ins.end());
        break;
      }
      case 3:  // delete a range
        if (!x->empty()) {
          const size_t at = pick(x->size()), len = 1 + pick(std::min<size_t>(16, x->size() - at));
          x->erase(x->begin() + ptrdiff_t(at), x->begin() + ptrdiff_t(std::min(x->size(), at + len)));
        }
        break;
      case 4:  // duplicate a range (repetition grows nesting and lists)
        if (!x->empty()) {
          const size_t at = pick(x->size()), len = 1 + pick(std::min<size_t>(32, x->size() - at));
          const Bytes part(x->begin() + ptrdiff_t(at), x->begin() + ptrdiff_t(at + len));
          x->insert(x->begin() + ptrdiff_t(pick(x->size() + 1)), part.begin(), part.end());
        }
        break;
      case 5:  // splice: our head, another entry's tail
        if (!corpus.empty()) {
          const Bytes& o = corpus[pick(corpus.size())];
          x->resize(pick(x->size() + 1));
          const size_t from = pick(o.size() + 1);
          x->insert(x->end(), o.begin() + ptrdiff_t(from), o.end());
        }
        break;
      case 6: {  // an interesting integer as decimal text, replacing a run of digits or inserted
        const std::string t = std::to_string(kInteresting[pick(std::size(kInteresting))]);
        size_t at = pick(x->size() + 1), end = at;
        while (end < x->size() && (*x)[end] >= '0' && (*x)[end] <= '9') ++end;
        x->erase(x->begin() + ptrdiff_t(at), x->begin() + ptrdiff_t(end));
        x->insert(x->begin() + ptrdiff_t(at), t.begin(), t.end());
        break;
      }
      default: {  // an interesting integer as 1, 2, 4 or 8 little-endian bytes, overwriting
        const uint64_t v = uint64_t(kInteresting[pick(std::size(kInteresting))]);
        const size_t width = size_t(1) << pick(4);
        if (x->size() < width) x->resize(width);
        const size_t at = pick(x->size() - width + 1);
        for (size_t i = 0; i < width; ++i) (*x)[at + i] = uint8_t(v >> (8 * i));
      }
    }
  }

  std::mt19937_64 rng_;
  size_t max_len_;
};

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed = 1;
  double max_seconds = 10;
  long long max_runs = -1;
  size_t max_len = 4096;
  unsigned timeout = 60;
  std::string artifact_prefix;
  std::vector<std::filesystem::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto flag = [&](const char* name, std::string* v) {
      const std::string p = std::string("-") + name + "=";
      if (a.rfind(p, 0) != 0) return false;
      *v = a.substr(p.size());
      return true;
    };
    std::string v;
    if (flag("seed", &v)) seed = std::strtoull(v.c_str(), nullptr, 10);
    else if (flag("max_total_time", &v)) max_seconds = std::strtod(v.c_str(), nullptr);
    else if (flag("runs", &v)) max_runs = std::strtoll(v.c_str(), nullptr, 10);
    else if (flag("max_len", &v)) max_len = std::strtoull(v.c_str(), nullptr, 10);
    else if (flag("timeout", &v)) timeout = unsigned(std::strtoul(v.c_str(), nullptr, 10));
    else if (flag("artifact_prefix", &v)) artifact_prefix = v;
    else if (!a.empty() && a[0] == '-') std::fprintf(stderr, "fuzz driver: ignoring unknown flag %s\n", a.c_str());
    else inputs.emplace_back(a);
  }
  const std::string name = std::filesystem::path(argv[0]).filename().string();
  std::snprintf(g_crash_path, sizeof g_crash_path, "%s%s-crash.bin", artifact_prefix.c_str(), name.c_str());
  install_crash_handlers();

  std::vector<Bytes> corpus;
  for (const auto& in : inputs) {
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(in)) {
      for (const auto& e : std::filesystem::directory_iterator(in))
        if (e.is_regular_file()) files.push_back(e.path());
      std::sort(files.begin(), files.end());
    } else {
      files.push_back(in);
    }
    for (const auto& f : files) {
      Bytes b;
      if (!read_file(f, max_len, &b)) {
        std::fprintf(stderr, "fuzz driver: cannot read %s\n", f.c_str());
        return 2;
      }
      corpus.push_back(std::move(b));
    }
  }
  std::printf("%s: mutation driver, -seed=%llu, %zu corpus inputs, -max_total_time=%g -runs=%lld -max_len=%zu\n",
              name.c_str(), static_cast<unsigned long long>(seed), corpus.size(), max_seconds, max_runs, max_len);
  std::fflush(stdout);

  auto run_one = [&](const Bytes& b) {
    g_current = &b;
    ::alarm(timeout);
    LLVMFuzzerTestOneInput(b.data(), b.size());
    ::alarm(0);
    g_current = nullptr;
  };
  for (const Bytes& b : corpus) run_one(b);  // every seed first: the known crashers stay fixed

  // Without coverage feedback, mutants stack by going back into a bounded pool next to the seeds.
  constexpr size_t kPool = 256;
  std::vector<Bytes> pool = corpus;
  Mutator m(seed, max_len);
  const auto t0 = std::chrono::steady_clock::now();
  long long runs = 0;
  for (; max_runs < 0 || runs < max_runs; ++runs) {
    if ((runs & 63) == 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >= max_seconds)
      break;
    Bytes x = m.mutate(pool);
    run_one(x);
    if (pool.size() < corpus.size() + kPool) pool.push_back(std::move(x));
    else pool[corpus.size() + size_t(runs) % kPool] = std::move(x);
  }
  std::printf("%s: %lld mutated inputs in %.1f s, no failure\n", name.c_str(), runs,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return 0;
}
