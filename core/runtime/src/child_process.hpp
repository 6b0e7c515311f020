// Running untrusted plugin code in a forked child, so that a crash or a hang in it costs the
// caller a reason string instead of its process. Conformance runs its checks this way, and
// discovery probes every plugin file this way before it loads the file into the host.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <string_view>

namespace sieve::runtime {

struct ChildResult {
  bool forked = false;     // false: pipe() or fork() failed and `body` never ran
  bool timed_out = false;  // killed with SIGKILL after the timeout
  int term_signal = 0;     // the signal that ended the child (0: it exited)
  int exit_status = 0;     // its exit status when it exited
  std::string output;      // every byte the child wrote to its end of the pipe

  bool died() const { return timed_out || term_signal != 0 || exit_status != 0; }
};

// Fork; the child runs body(fd) with the write end of a pipe, flushes spdlog and _exit()s
// (status 70 if body threw), without running the parent's atexit handlers or destructors. The
// parent reads the pipe until EOF or `timeout`, then reaps the child. Fork from a process that
// has not started OpenMP threads (libgomp is not fork-safe).
ChildResult run_in_child(const std::function<void(int fd)>& body, std::chrono::milliseconds timeout);

// write() all of `bytes` to `fd`, retrying on EINTR; false when the reader is gone.
bool write_all(int fd, std::string_view bytes);

}  // namespace sieve::runtime
