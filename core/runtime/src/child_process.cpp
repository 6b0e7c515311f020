// fork + pipe + poll + waitpid for child_process.hpp.
#include "child_process.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>

namespace sieve::runtime {

bool write_all(int fd, std::string_view bytes) {
  for (size_t off = 0; off < bytes.size();) {
    ssize_t w = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    off += size_t(w);
  }
  return true;
}

ChildResult run_in_child(const std::function<void(int fd)>& body, std::chrono::milliseconds timeout) {
  ChildResult r;
  int fds[2];
  if (::pipe(fds) != 0) return r;
  std::fflush(nullptr);  // buffered output must not be written twice
  const pid_t child = ::fork();
  if (child < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return r;
  }
  if (child == 0) {
    ::close(fds[0]);
    int code = 0;
    try {
      body(fds[1]);
    } catch (...) {
      code = 70;
    }
    spdlog::default_logger()->flush();
    ::close(fds[1]);
    ::_exit(code);  // no atexit handlers / static destructors of the parent's state
  }
  r.forked = true;
  ::close(fds[1]);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      r.timed_out = true;
      break;
    }
    pollfd pfd{fds[0], POLLIN, 0};
    int n = ::poll(&pfd, 1, int(std::min<long long>(left, 1000)));
    if (n <= 0) continue;  // EINTR or nothing yet
    char tmp[4096];
    ssize_t got = ::read(fds[0], tmp, sizeof tmp);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;  // EOF: the child closed its end (finished or died)
    r.output.append(tmp, size_t(got));
  }
  ::close(fds[0]);
  if (r.timed_out) ::kill(child, SIGKILL);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status) && !r.timed_out) r.term_signal = WTERMSIG(status);
  if (WIFEXITED(status)) r.exit_status = WEXITSTATUS(status);
  return r;
}

}  // namespace sieve::runtime
