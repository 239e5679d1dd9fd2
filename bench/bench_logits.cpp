// bench_logits: the MQA logits cases of bench/CASES.md (MQAL-PAGED-B64, MQAL-PREFILL-32K), the
// token top-K over their logits (TOPK2048-B64, TOPK2048-32K; with the logits, MQAL-TOPK-32K) and
// the SDSA indexer's threshold select (SDSA-SELECT); the benchmark itself is
// workloads/logits_bench.cu.
//   bench_logits [--case NAME]... [--iters N] [--warmup N] [--json FILE] [--no-check] [--seq N]
// --seq: T = S of MQAL-PREFILL-32K and TOPK2048-32K (default 32768). Exit status: 0 ok, 1 a check failed, 2 usage
// / no GPU, 3 an msa::Error.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "workloads/gpu_benches.h"

int main(int argc, char** argv) {
  msa_bench::LogitsBenchOptions o;
  std::vector<std::string> names;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--case") names.push_back(next());
    else if (arg == "--iters") o.iters = std::max(1, std::atoi(next().c_str()));
    else if (arg == "--warmup") o.warmup = std::atoi(next().c_str());
    else if (arg == "--json") o.json = next();
    else if (arg == "--no-check") o.check = false;
    else if (arg == "--seq") o.seq = std::max(1, std::atoi(next().c_str()));
    else {
      std::fprintf(stderr, "unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  try {
    return msa_bench::run_logits_bench(names, o);
  } catch (const msa::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 3;
  }
}
