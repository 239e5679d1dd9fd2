// `msa demo`: block_scores -> select_topk -> build_k2q_csr -> attention_forward end to end on
// random inputs, with per-stage wall time, density and an fp64 check of sampled rows. Runs on the
// GPU when it can; a GPU backend that lacks a stage is reported and the demo reruns on the CPU.
#include <omp.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

#include "commands.h"
#include "options.h"
#include "pipeline.h"
#include "reference_check.h"

namespace msa::cli {
namespace {

// Sized to finish in well under 30 s on 2 CPU cores (measured: see README), and to the
// BENCHMARKS.md E2E-32K shape on the GPU.
Shape cpu_default() {
  Shape s;
  s.seqlens = {2048};
  s.num_q_heads = 16;
  s.num_kv_heads = 2;
  s.topk = 8;
  return s;
}
Shape gpu_default() {
  Shape s;
  s.seqlens = {32768};
  s.num_q_heads = 64;
  s.num_kv_heads = 4;
  s.topk = 16;
  return s;
}

std::vector<OptionSpec> demo_specs() {
  std::vector<OptionSpec> v = shape_option_specs(false);
  v.push_back(device_option_spec());
  v.push_back({"rows", "N", "(token, head) rows checked against fp64 dense attention (default 32)"});
  v.push_back({"help", "", "show this help"});
  return v;
}

// A GPU stage that the CUDA backend does not implement yet (its capability table raises
// msa::Error with "not supported on CUDA"), as opposed to a real failure.
struct MissingGpuStage {
  Stage stage;
  std::string message;
};

bool is_missing_on_cuda(const Error& e) {
  return std::string(e.what()).find("not supported on CUDA") != std::string::npos;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Runs the four stages, printing each as it finishes; returns their times in ms.
std::array<double, 4> run_stages(Pipeline& p) {
  std::array<double, 4> ms{};
  for (Stage st : kStages) {
    try {
      ms[static_cast<int>(st)] = p.run(st);
    } catch (const Error& e) {
      if (p.device().type == DeviceType::cuda && is_missing_on_cuda(e)) throw MissingGpuStage{st, e.what()};
      throw;
    }
    std::printf("  %-18s %10.2f ms\n", stage_name(st), ms[static_cast<int>(st)]);
    std::fflush(stdout);
  }
  return ms;
}

void print_check(const CheckResult& c) {
  std::printf("check vs fp64 dense attention over the selected blocks, %d sampled (token, head) rows:\n", c.rows);
  std::printf("  out: rel L2 %.2e, max abs %.2e (bound %.0e rel L2)\n", c.out_rel_l2, c.out_max_abs, kOutRelTol);
  std::printf("  lse: max abs %.2e (bound %.0e)\n", c.lse_max_abs, kLseAbsTol);
  std::printf("  rows with -inf/NaN at the wrong place: %d; rows missing a forced sink/local block: %d\n",
              c.special_mismatch, c.forced_missing);
  std::printf("result: %s\n", c.pass() ? "PASS" : "FAIL");
}

int run_on(const Shape& s, Device dev, int rows) {
  const std::string where = dev.type == DeviceType::cuda
                                ? "gpu (" + device_description(dev.index) + ")"
                                : "cpu (" + std::to_string(omp_get_max_threads()) + " OpenMP threads)";
  std::printf("msa demo on %s\nshape: %s, bf16, seed %llu\n", where.c_str(), describe(s).c_str(),
              static_cast<unsigned long long>(s.seed));
  auto t0 = std::chrono::steady_clock::now();
  const HostInputs in = make_inputs(s);
  Pipeline p(s, in, dev);
  std::printf("inputs: random normal q, k, v generated and placed in %.0f ms (not counted below)\n", ms_since(t0));
  std::printf("stage                    time\n");
  const std::array<double, 4> ms = run_stages(p);
  std::printf("  %-18s %10.2f ms\n", "total", ms[0] + ms[1] + ms[2] + ms[3]);
  const std::vector<int32_t> q2k = p.q2k();
  const bench::PairCounts pairs = bench::count_pairs(q2k, selection_shape(s), s.num_q_heads / s.num_kv_heads);
  std::printf("density: %.2f%% of causal dense pairs (%lld attended (head, key) pairs of %lld)\n",
              pairs.visible ? 100.0 * pairs.attended / pairs.visible : 0.0,
              static_cast<long long>(pairs.attended), static_cast<long long>(pairs.visible));
  std::printf("rates: block_scores %s (2*D*visible pairs), attention_forward %s (4*D*attended pairs)\n",
              flop_rate(2.0 * s.head_dim * pairs.visible, ms[0]).c_str(),
              flop_rate(4.0 * s.head_dim * pairs.attended, ms[3]).c_str());
  const CheckResult c = check_sampled_rows(s, in, q2k, p, rows);
  print_check(c);
  return c.pass() ? 0 : 1;
}

}  // namespace

int run_demo(const std::vector<std::string>& args) {
  const std::vector<OptionSpec> specs = demo_specs();
  const ParsedArgs a(specs, args);
  if (a.has("help")) {
    print_help(std::cout, "msa demo [options]",
               "Runs block_scores -> select_topk -> build_k2q_csr -> attention_forward on random\n"
               "bf16 inputs and prints per-stage time, the density of the selection and the error\n"
               "against fp64 dense attention restricted to the selected blocks on sampled rows.\n"
               "Defaults: CPU B=1 S=2048 Hq=16 Hkv=2 D=128 blk=128 topK=8; GPU B=1 S=32768 Hq=64\n"
               "Hkv=4 D=128 blk=128 topK=16. Exit code 0 when the check passes, 1 when it fails.",
               specs);
    return 0;
  }
  const ShapeOptions so = parse_shape_options(a);
  const DeviceChoice choice = parse_device(a);
  const int rows = static_cast<int>(a.integer("rows", 1, 1 << 20).value_or(32));
  const std::string no_gpu = gpu_unavailable_reason();
  if (choice == DeviceChoice::gpu && !no_gpu.empty()) fail("msa demo: --device gpu, but ", no_gpu);
  if (choice == DeviceChoice::cpu || !no_gpu.empty()) {
    if (choice == DeviceChoice::auto_select) std::printf("no GPU: %s; running the demo on the CPU\n", no_gpu.c_str());
    return run_on(resolve_shape(so, cpu_default()), Device{}, rows);
  }
  try {
    return run_on(resolve_shape(so, gpu_default()), Device{DeviceType::cuda, 0}, rows);
  } catch (const MissingGpuStage& m) {
    if (choice == DeviceChoice::gpu) {
      std::printf("GPU backend lacks %s (%s); not running on the CPU because --device gpu was given\n",
                  stage_name(m.stage), m.message.c_str());
      return 1;
    }
    std::printf("GPU backend lacks %s; running the demo on the CPU\n  (msa: %s)\n\n",
                stage_name(m.stage), m.message.c_str());
    return run_on(resolve_shape(so, cpu_default()), Device{}, rows);
  }
}

}  // namespace msa::cli
