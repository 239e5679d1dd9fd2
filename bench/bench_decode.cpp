// bench_decode: the decode cases of bench/CASES.md; the benchmark itself is workloads/decode_bench.cu.
//   bench_decode [--case NAME]... [--iters N] [--warmup N] [--json FILE] [--no-check]
//                [--layout nhd|hnd]   (page layout, default nhd: [pages, page_size, Hkv, D])
//                [--warps 4|8]        (force the CUDA decode CTA width; default: the planner's)
//                [--topk N]           (sparse cases: N blocks per query instead of the case's topK)
//                [--fp8-scales tensor|slot]  (FP8 KV scales: one per tensor (default) or per pool slot)
// --json FILE appends one record per case and KV dtype (bench/SCHEMA.md); progress goes to stderr.
// Exit status: 0 ok, 1 a check failed, 2 usage / no GPU.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "workloads/gpu_benches.h"

int main(int argc, char** argv) {
  msa_bench::DecodeBenchOptions o;
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
    else if (arg == "--layout") o.hnd = next() == "hnd";
    else if (arg == "--warps") o.warps = std::atoi(next().c_str());
    else if (arg == "--fp8-scales") {
      const std::string k = next();
      if (k != "tensor" && k != "slot") {
        std::fprintf(stderr, "--fp8-scales takes tensor or slot, got %s\n", k.c_str());
        return 2;
      }
      o.slot_scales = k == "slot";
    }
    else if (arg == "--topk") {
      o.topk = std::atoi(next().c_str());
      if (o.topk < 1) {
        std::fprintf(stderr, "--topk needs a value >= 1\n");
        return 2;
      }
    }
    else {
      std::fprintf(stderr, "unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  try {
    return msa_bench::run_decode_bench(names, o);
  } catch (const msa::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 3;
  }
}
