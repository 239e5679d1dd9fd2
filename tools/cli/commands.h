// The subcommands of `msa` and the helpers they share. Each run_* takes the arguments after its
// name and returns the process exit code; bad options throw UsageError (exit code 2).
#pragma once

#include <string>
#include <vector>

#include "msa/tensor.h"

namespace msa::cli {

int run_demo(const std::vector<std::string>& args);
int run_bench(const std::vector<std::string>& args);

// Empty when this build and machine can run on a GPU, else the reason it cannot.
std::string gpu_unavailable_reason();
// "12.3 GFLOP/s" or "456.7 TFLOP/s": FLOP over milliseconds, scaled to a readable unit.
std::string flop_rate(double flop, double ms);

}  // namespace msa::cli
