// `sieve calibrate <method>`: per-method calibration studies on a real model. One command, one
// small table of methods (cmd_calibrate.cpp); each method's study lives in calibrate_<method>.cpp
// and parses its own options (argv[0] is the method's name). Exit status as every command: 0, 1
// for a reported failure, 2 for bad usage.
#pragma once

namespace sieve::cli {
int calibrate_delta(int argc, char** argv);  // calibrate_delta.cpp: DELTA's Δ-layers
int calibrate_dpxa(int argc, char** argv);   // calibrate_dpxa.cpp: dpxa's per-head tau
}  // namespace sieve::cli
