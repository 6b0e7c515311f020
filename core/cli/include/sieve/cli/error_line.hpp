// How every subcommand reports a failure: one line on stderr, "<command>: <message>", whatever the
// message holds — several resolution problems (one per line) are joined with "; ", and control
// characters or bytes that are not UTF-8 (from user input) are escaped.
#pragma once
#include <string>
#include <string_view>

namespace sieve::cli {

std::string one_line(std::string_view message);

// Print "<command>: <message>" as one line; returns `status` (1 a failure, 2 bad usage).
int report_error(std::string_view command, std::string_view message, int status);

// Runs a command's main; whatever it lets escape (std::bad_alloc included) ends as one line and
// status 1 instead of std::terminate's abort. `command` names it in that line ("sieve run").
int run_guarded(std::string_view command, int (*run)(int, char**), int argc, char** argv);

}  // namespace sieve::cli
