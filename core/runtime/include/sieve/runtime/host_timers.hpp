// Switchable host-side timers of the runtime's per-layer work, for finding where a step's host
// time goes (issue 20). With SIEVE_HOST_TIMERS=1 in the environment, each phase's host wall time
// in microseconds is reported through the host services' metric hook as "host_us.<phase>" (the
// benchmark's JSON carries every metric: mean, min, max, count); otherwise every call is one
// predictable branch. Host time only: the enqueue cost of device work, not its run time.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "sieve/host_services.h"

namespace sieve::runtime {

class HostTimers {
 public:
  using Clock = std::chrono::steady_clock;

  explicit HostTimers(const sieve_host_services* services)
      : services_(services), on_(enabled() && services && services->metric) {}

  static bool enabled() {
    const char* v = std::getenv("SIEVE_HOST_TIMERS");
    return v && *v && std::strcmp(v, "0") != 0;
  }
  bool on() const { return on_; }

  // The start of the first phase.
  Clock::time_point start() const { return on_ ? Clock::now() : Clock::time_point{}; }

  // Reports the time since `mark` as phase `name` of `layer` (-1: not per layer) and restarts
  // `mark` after the report, so the reporting is in no phase.
  void lap(const char* name, int32_t layer, Clock::time_point& mark) const {
    if (!on_) return;
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - mark).count();
    services_->metric(services_->host_ctx, name, layer, -1, us);
    mark = Clock::now();
  }

 private:
  const sieve_host_services* services_;
  bool on_;
};

}  // namespace sieve::runtime
