// bench_latency: the latency cases of bench/CASES.md (LAT-256, LAT-2K, LAT-8K, LAT-CHUNK; all of
// them by default): per call of the pipeline, attention_forward with its selection and dense
// attention, the host time, the GPU time and the launches (workloads/latency_bench.cpp).
// bench/python_bench.py --latency-cpp times the same calls through the Python API, and FA4 and
// cuDNN dense on the same shapes.
//   bench_latency [--case NAME]... [--op NAME]... [--calls N] [--warmup N] [--host-only]
//                 [--no-check] [--json FILE]
// --op keeps the named ops only (pipeline, attention_forward, ...): a host trace of one op
// (bench/host_trace.cpp) then sees its calls alone, besides the untimed setup; --host-only skips
// the back-to-back GPU-time loop, whose launches wait for a full queue; --no-check skips the
// output check, for host times under bench/host_sim.cpp's stand-in runtime (no kernel runs there).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "workloads/gpu_benches.h"
#include "msa/msa.h"

int main(int argc, char** argv) {
  try {
    std::vector<std::string> names;
    msa_bench::LatencyBenchOptions o;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--host-only") {
        o.gpu_loop = false;
        continue;
      }
      if (a == "--no-check") {
        o.check = false;
        continue;
      }
      MSA_CHECK(i + 1 < argc, "bench_latency: ", a, " needs a value");
      const char* v = argv[++i];
      if (a == "--case") names.push_back(v);
      else if (a == "--calls") o.calls = std::atoi(v);
      else if (a == "--warmup") o.warmup = std::atoi(v);
      else if (a == "--json") o.json = v;
      else if (a == "--op") o.ops.push_back(v);
      else msa::fail("bench_latency: unknown option ", a);
    }
    MSA_CHECK(o.calls > 0 && o.warmup >= 0, "bench_latency: --calls must be positive, --warmup >= 0");
    return msa_bench::run_latency_bench(names, o);
  } catch (const msa::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 3;
  }
}
