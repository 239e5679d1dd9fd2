// bench_sparse_fwd: runs the sparse prefill / CSR cases of bench/CASES.md on the GPU.
//   bench_sparse_fwd [--case NAME]... [--iters N] [--warmup N] [--partial bf16|f32]
//                    [--json FILE] [--dump DIR] [--no-check] [--no-flush]
// Without --case it runs every case. --json appends one record per case (bench/SCHEMA.md);
// --dump writes each case's selection for bench/peers.py. Progress goes to stderr.
// Exit status: 0 ok, 1 a check failed, 2 usage / no GPU.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "workloads/sparse_fwd_cases.h"
#include "msa/error.h"

int main(int argc, char** argv) {
  msa_bench::SparseBenchOptions o;
  std::vector<std::string> cases;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) { std::fprintf(stderr, "%s needs a value\n", arg.c_str()); std::exit(2); }
      return argv[++i];
    };
    if (arg == "--case") cases.push_back(next());
    else if (arg == "--iters") o.iters = std::atoi(next().c_str());
    else if (arg == "--warmup") o.warmup = std::atoi(next().c_str());
    else if (arg == "--partial") o.partial = next();
    else if (arg == "--json") o.json_path = next();
    else if (arg == "--dump") o.dump_dir = next();
    else if (arg == "--no-check") o.check = false;
    else if (arg == "--no-flush") o.flush_l2 = false;
    else { std::fprintf(stderr, "unknown argument %s\n", arg.c_str()); return 2; }
  }
  if (cases.empty()) cases = msa_bench::sparse_case_names();
  int rc = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string& c = cases[i];
    std::fprintf(stderr, "[case %zu/%zu] %s\n", i + 1, cases.size(), c.c_str());
    try {
      rc = std::max(rc, msa_bench::run_sparse_case(c, o));
    } catch (const msa::Error& e) {
      std::fprintf(stderr, "%s: %s\n", c.c_str(), e.what());
      rc = std::max(rc, 1);
    }
  }
  return rc;
}
