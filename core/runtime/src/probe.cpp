// probe_plugin_files (probe.hpp): load plugin files in a child process before the host does.
#include "sieve/runtime/probe.hpp"

#include <dlfcn.h>
#include <sys/stat.h>

#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

#include "child_process.hpp"
#include "sieve/runtime/loader.hpp"

namespace sieve::runtime {

namespace {

// Loading a plugin is one dlopen and a few checks: a child still busy after this many seconds per
// file it was given hangs (generous: hosts run under sanitizers and on slow file systems).
constexpr auto kProbeTimeout = std::chrono::seconds(10);

// path, host major, device, inode, size, mtime (ns)
using FileKey = std::tuple<std::string, uint32_t, dev_t, ino_t, off_t, int64_t>;

std::string file_name(const std::string& path) {
  return std::filesystem::path(path).filename().string();
}

// One child loads paths[first..] in order. It announces each file ("B <i>") before loading it,
// then ("U <i>") before unloading it, and answers ("R <i> ok" / "R <i> error <reason>") after, so
// when it dies the file it died in, and whether in its constructors or its finalisers, is known.
// Unloading runs the finalisers (DT_FINI, DT_FINI_ARRAY, C++ static destructors) the host would
// otherwise run first at its exit, after every check had passed (the child _exit()s, running none).
// A library marked NODELETE (linked -z nodelete) stays mapped and keeps its finalisers for exit.
// Fills answers[i] for every file it finished and returns the index of the one it died in, or
// paths.size() when it finished them all.
size_t probe_batch(const std::vector<std::string>& paths, size_t first, uint32_t host_major,
                   std::vector<std::string>* answers) {
  ChildResult r = run_in_child(
      [&](int fd) {
        for (size_t i = first; i < paths.size(); ++i) {
          write_all(fd, "B " + std::to_string(i) + "\n");
          std::string error;
          {
            PluginLibrary lib;
            LoadedPlugin plugin;
            if (open_plugin_library(paths[i], &lib, &error, Unload::on_release)) {
              lib.score = nullptr;  // the score may initialise a GPU: the host asks it, not the probe
              negotiate_plugin(lib, &plugin, &error, host_major);
            }
            write_all(fd, "U " + std::to_string(i) + "\n");
          }  // the last holders of the library go: dlclose
          for (char& c : error)
            if (c == '\n') c = ' ';
          write_all(fd, "R " + std::to_string(i) + (error.empty() ? " ok" : " error " + error) + "\n");
        }
      },
      kProbeTimeout * int(paths.size() - first));
  if (!r.forked) {
    spdlog::warn("no probe process could be started (fork failed): loading plugin files unprobed");
    for (size_t i = first; i < paths.size(); ++i) (*answers)[i].clear();
    return paths.size();
  }
  size_t begun = paths.size();
  bool unloading = false;  // the child had announced unloading `begun`
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream in(line);
    std::string kind, rest;
    size_t i = 0;
    if (!(in >> kind >> i) || i < first || i >= paths.size()) continue;
    std::getline(in, rest);
    if (kind == "B") begun = i, unloading = false;
    if (kind == "U") unloading = i == begun;
    if (kind != "R") continue;
    begun = paths.size();
    (*answers)[i] = rest == " ok" ? "" : rest.rfind(" error ", 0) == 0 ? rest.substr(7) : rest;
  }
  if (begun == paths.size()) {  // not inside a file: the next one without an answer is to blame
    begun = first;
    while (begun < paths.size() && (*answers)[begun] != "?") ++begun;
    if (begun == paths.size()) return begun;
  }
  const std::string file = file_name(paths[begun]) + ": ";
  const std::string doing = unloading ? "unloading it (its finalisers)" : "loading it";
  if (r.timed_out)
    (*answers)[begun] = file + doing + " did not finish in a probe process (killed after " +
                        std::to_string(kProbeTimeout.count() * int(paths.size() - first)) + " s)";
  else if (r.term_signal)
    (*answers)[begun] = file + doing + " crashed a probe process (" + strsignal(r.term_signal) +
                        ", signal " + std::to_string(r.term_signal) + ")";
  else if (r.exit_status)
    (*answers)[begun] = file + doing + " ended a probe process with exit status " +
                        std::to_string(r.exit_status);
  else
    (*answers)[begun] = file + "a probe process " + doing + " ended without an answer";
  return begun;
}

}  // namespace

std::vector<std::string> probe_plugin_files(const std::vector<std::string>& paths,
                                            uint32_t host_major) {
  static std::mutex mu;
  static std::map<FileKey, std::string> cache;
  std::lock_guard<std::mutex> lock(mu);
  std::vector<std::string> answers(paths.size());
  std::vector<std::string> pending;  // the files a child must load, in order
  std::vector<size_t> pending_index;
  std::vector<FileKey> pending_key;
  for (size_t i = 0; i < paths.size(); ++i) {
    // The file checks read bounded bytes and run no plugin code: no child needed for them.
    if (std::string why = check_elf_file(paths[i]); !why.empty()) {
      answers[i] = file_name(paths[i]) + ": " + why;
      continue;
    }
    // Mapped already (an earlier registry loaded it): loading it again maps nothing new.
    if (void* h = ::dlopen(paths[i].c_str(), RTLD_NOW | RTLD_NOLOAD)) {
      ::dlclose(h);
      continue;
    }
    struct stat st {};
    if (::stat(paths[i].c_str(), &st) != 0) {
      answers[i] = file_name(paths[i]) + ": cannot stat it: " + std::strerror(errno);
      continue;
    }
    FileKey key{paths[i], host_major, st.st_dev, st.st_ino, st.st_size,
                int64_t(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec};
    if (auto it = cache.find(key); it != cache.end()) {
      answers[i] = it->second;
      continue;
    }
    pending.push_back(paths[i]);
    pending_index.push_back(i);
    pending_key.push_back(std::move(key));
  }
  // One child for the lot; after a crash or a hang, a new one for the files after the culprit.
  std::vector<std::string> got(pending.size(), "?");
  for (size_t next = 0; next < pending.size();) next = probe_batch(pending, next, host_major, &got) + 1;
  for (size_t k = 0; k < pending.size(); ++k) {
    if (got[k] == "?") got[k] = file_name(pending[k]) + ": the probe process gave no answer for it";
    answers[pending_index[k]] = cache[pending_key[k]] = got[k];
  }
  return answers;
}

std::string probe_plugin_file(const std::string& path, uint32_t host_major) {
  return probe_plugin_files({path}, host_major).front();
}

}  // namespace sieve::runtime
