// What every Boost.program_options subcommand does first: parse argv, answer --help, refuse a bad
// option in one line.
#pragma once
#include <boost/program_options.hpp>

#include <optional>

namespace sieve::cli {

// Parses argv into *vm. Returns the exit status when the command is done: 0 after printing `opts`
// for --help, 2 after "<command>: <what>" on stderr for a bad option; nullopt when it goes on.
// Refused as bad options too: a word that belongs to no option (`--prompt Lily saw a cat`
// unquoted would otherwise drop "saw a cat" silently) and a float option that is nan or inf.
// A command with positional arguments (`sieve plugins NAME`) passes their mapping in `positional`:
// those words fill the options it names, any further word is still refused.
std::optional<int> parse_options(const char* command, const boost::program_options::options_description& opts,
                                 int argc, const char* const* argv, boost::program_options::variables_map* vm,
                                 const boost::program_options::positional_options_description* positional = nullptr);

}  // namespace sieve::cli
