// Entry point of the `msa` command-line tool: picks the subcommand and maps outcomes to exit
// codes (0 success, 1 a failed check or an msa::Error, 2 bad usage).
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "commands.h"
#include "msa/msa.h"
#include "options.h"

namespace msa::cli {

std::string gpu_unavailable_reason() {
  if (!built_with_cuda()) return "msa was built without CUDA";
  if (cuda_device_count() == 0) return "no CUDA device is visible";
  return "";
}

std::string flop_rate(double flop, double ms) {
  if (ms <= 0) return "n/a";
  const double per_s = flop / (ms * 1e-3);
  char buf[64];
  if (per_s >= 1e12) std::snprintf(buf, sizeof(buf), "%.1f TFLOP/s", per_s * 1e-12);
  else std::snprintf(buf, sizeof(buf), "%.2f GFLOP/s", per_s * 1e-9);
  return buf;
}

namespace {

void print_usage(std::ostream& os) {
  const std::string gpu = gpu_unavailable_reason();
  os << "usage: msa <command> [options]\n\n"
        "msa " << kVersion << ": block-sparse attention for long-context inference ("
     << (gpu.empty() ? "GPU available" : "CPU only: " + gpu) << ").\n\n"
        "commands:\n"
        "  demo     run block scores -> top-K -> CSR -> sparse attention end to end and check it\n"
        "  bench    time a bench/CASES.md case (--case NAME, --list) or a custom shape\n\n"
        "`msa <command> --help` lists the options of a command; `msa --version` prints the version.\n";
}

int dispatch(const std::string& cmd, const std::vector<std::string>& rest) {
  if (cmd == "demo") return run_demo(rest);
  if (cmd == "bench") return run_bench(rest);
  throw UsageError("unknown command '" + cmd + "' (commands: demo, bench)");
}

}  // namespace
}  // namespace msa::cli

int main(int argc, char** argv) {
  using namespace msa::cli;
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    print_usage(std::cerr);
    return 2;
  }
  const std::string& cmd = args[0];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    print_usage(std::cout);
    return 0;
  }
  if (cmd == "--version") {
    std::cout << "msa " << msa::kVersion << (msa::built_with_cuda() ? " (CUDA sm_90a)" : " (CPU only)")
              << "\n";
    return 0;
  }
  try {
    return dispatch(cmd, std::vector<std::string>(args.begin() + 1, args.end()));
  } catch (const UsageError& e) {
    std::cerr << "msa " << cmd << ": " << e.what() << "\n(see `msa "
              << (cmd == "demo" || cmd == "bench" ? cmd + " --help" : "--help") << "`)\n";
    return 2;
  } catch (const msa::Error& e) {
    std::fflush(stdout);
    std::cerr << "msa " << cmd << ": error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::cerr << "msa " << cmd << ": unexpected failure: " << e.what() << "\n";
    return 1;
  }
}
