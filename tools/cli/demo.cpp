// `msa demo`: the serving pipeline end to end on random inputs: block_topk (an index branch of
// its own, fused with top-K) -> build_k2q_csr -> attention_forward, with per-stage wall time,
// density, an fp64 check of sampled rows and, on the GPU, the dense reference (dense_reference.h).
// Runs on the GPU when it can; a GPU backend that lacks a stage is reported and the demo reruns
// on the CPU.
#include <omp.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <optional>
#include <string>

#include "commands.h"
#include "dense_reference.h"
#include "options.h"
#include "pipeline.h"
#include "reference_check.h"

namespace msa::cli {
namespace {

// Sized to finish in well under 30 s on 2 CPU cores (measured: see README), and to the
// E2E-32K attention shape of bench/CASES.md on the GPU. The index branch has one index head per
// kv head (index_q [T, Hkv, D], index_k [T, Hkv, D]), as a model's indexer scores with a few
// heads of its own rather than all the attention heads.
Shape demo_shape(int64_t seq, int hq, int hkv, int topk) {
  Shape s;
  s.seqlens = {seq};
  s.num_q_heads = hq;
  s.num_kv_heads = hkv;
  s.topk = topk;
  s.index_heads = hkv;
  return s;
}
Shape cpu_default() { return demo_shape(2048, 16, 2, 8); }
Shape gpu_default() { return demo_shape(32768, 64, 4, 16); }

std::vector<OptionSpec> demo_specs() {
  std::vector<OptionSpec> v = shape_option_specs(false);
  v.push_back({"index-heads", "N", "index heads Hi of the index branch, a multiple of Hkv (default "
                                   "Hkv); 0 scores with the attention heads q, k"});
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

constexpr size_t kNumStages = std::size(kServingStages);

// Runs the serving stages, printing each as it finishes (when `print`); returns their times in
// ms, each from launch to completion.
std::array<double, kNumStages> run_stages(Pipeline& p, bool print) {
  std::array<double, kNumStages> ms{};
  for (size_t i = 0; i < kNumStages; ++i) {
    const Stage st = kServingStages[i];
    try {
      ms[i] = p.run(st);
    } catch (const Error& e) {
      if (p.device().type == DeviceType::cuda && is_missing_on_cuda(e)) throw MissingGpuStage{st, e.what()};
      throw;
    }
    if (!print) continue;
    std::printf("  %-18s %10.2f ms\n", stage_name(st), ms[i]);
    std::fflush(stdout);
  }
  return ms;
}

// The dense reference on the GPU: dense causal attention's FLOP at this GPU's bf16 GEMM rate.
void print_dense_reference(double dense_flop, double sparse_ms) {
  const GemmRate g = measure_bf16_gemm_rate();
  if (g.tflops <= 0) {
    std::printf("dense reference: unavailable (%s)\n", g.error.c_str());
    return;
  }
  const double dense_ms = dense_flop / (g.tflops * 1e12) * 1e3;
  std::printf("dense reference: causal dense attention at this shape is %.2f TFLOP: at least %.2f ms "
              "at this GPU's bf16 GEMM rate (%.0f TFLOP/s, cuBLAS 8192^3, measured now); no dense "
              "kernel runs faster\n",
              dense_flop / 1e12, dense_ms, g.tflops);
  std::printf("sparse pipeline: %.2f ms = %.2fx %s than that dense bound\n", sparse_ms,
              sparse_ms < dense_ms ? dense_ms / sparse_ms : sparse_ms / dense_ms,
              sparse_ms < dense_ms ? "faster" : "slower");
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
  check_host_memory(s);  // the inputs are made on the host for either device
  const std::string where = dev.type == DeviceType::cuda
                                ? "gpu (" + device_description(dev.index) + ")"
                                : "cpu (" + std::to_string(omp_get_max_threads()) + " OpenMP threads)";
  std::printf("msa demo on %s\nshape: %s, bf16, seed %llu\n", where.c_str(), describe(s).c_str(),
              static_cast<unsigned long long>(s.seed));
  auto t0 = std::chrono::steady_clock::now();
  const HostInputs in = make_inputs(s);
  Pipeline p(s, in, dev);
  std::printf("inputs: random normal q, k, v generated and placed in %.0f ms (not counted below)\n", ms_since(t0));
  const bool gpu = dev.type == DeviceType::cuda;
  if (gpu) run_stages(p, /*print=*/false);  // warm-up: module loads and first-launch setup
  std::printf("stage                    time%s\n", gpu ? " (after one warm-up run)" : "");
  const std::array<double, kNumStages> ms = run_stages(p, /*print=*/true);
  double total_ms = 0;
  for (double t : ms) total_ms += t;
  std::printf("  %-18s %10.2f ms\n", "total", total_ms);
  const std::vector<int32_t> q2k = p.q2k();
  const bench::PairCounts pairs = bench::count_pairs(q2k, selection_shape(s), s.num_q_heads / s.num_kv_heads);
  std::printf("density: %.2f%% of causal dense pairs (%lld attended (head, key) pairs of %lld)\n",
              pairs.visible ? 100.0 * pairs.attended / pairs.visible : 0.0,
              static_cast<long long>(pairs.attended), static_cast<long long>(pairs.visible));
  const int index_heads = s.index_heads > 0 ? s.index_heads : s.num_q_heads;
  std::printf("rates: block_topk %s (2*D*Hi*visible token pairs), attention_forward %s "
              "(4*D*attended pairs)\n",
              flop_rate(2.0 * s.head_dim * index_heads * (pairs.visible / s.num_q_heads), ms[0]).c_str(),
              flop_rate(4.0 * s.head_dim * pairs.attended, ms[2]).c_str());
  if (gpu) print_dense_reference(4.0 * s.head_dim * pairs.visible, total_ms);
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
               "Runs block_topk (an index branch scoring kv blocks, fused with top-K) ->\n"
               "build_k2q_csr -> attention_forward on random bf16 inputs and prints per-stage time,\n"
               "the density of the selection and the error against fp64 dense attention restricted\n"
               "to the selected blocks on sampled rows; on the GPU also the dense reference (dense\n"
               "causal attention's FLOP at the bf16 GEMM rate measured in the same run).\n"
               "Defaults: CPU B=1 S=2048 Hq=16 Hkv=2 D=128 blk=128 topK=8; GPU B=1 S=32768 Hq=64\n"
               "Hkv=4 D=128 blk=128 topK=16; index heads Hi = Hkv. Exit code 0 when the check\n"
               "passes, 1 when it fails.",
               specs);
    return 0;
  }
  const ShapeOptions so = parse_shape_options(a);
  const std::optional<int64_t> index_heads = a.integer("index-heads", 0, 1024);
  // The index branch's default follows the resolved kv heads; a given count must group evenly.
  auto with_index = [&index_heads](Shape s) {
    s.index_heads = int(index_heads.value_or(s.num_kv_heads));
    const int gi = s.index_heads / s.num_kv_heads;
    if (s.index_heads > 0 && (s.index_heads % s.num_kv_heads != 0 || (gi & (gi - 1)) != 0 || gi > 16))
      throw UsageError("--index-heads " + std::to_string(s.index_heads) + " must be 0 or Hkv times 1, "
                       "2, 4, 8 or 16 (Hkv = " + std::to_string(s.num_kv_heads) + ")");
    return s;
  };
  const DeviceChoice choice = parse_device(a);
  const int rows = static_cast<int>(a.integer("rows", 1, 1 << 20).value_or(32));
  const std::string no_gpu = gpu_unavailable_reason();
  if (choice == DeviceChoice::gpu && !no_gpu.empty()) fail("msa demo: --device gpu, but ", no_gpu);
  if (choice == DeviceChoice::cpu || !no_gpu.empty()) {
    if (choice == DeviceChoice::auto_select) std::printf("no GPU: %s; running the demo on the CPU\n", no_gpu.c_str());
    return run_on(with_index(resolve_shape(so, cpu_default())), Device{}, rows);
  }
  try {
    return run_on(with_index(resolve_shape(so, gpu_default())), Device{DeviceType::cuda, 0}, rows);
  } catch (const MissingGpuStage& m) {
    if (choice == DeviceChoice::gpu) {
      std::printf("GPU backend lacks %s (%s); not running on the CPU because --device gpu was given\n",
                  stage_name(m.stage), m.message.c_str());
      return 1;
    }
    std::printf("GPU backend lacks %s; running the demo on the CPU\n  (msa: %s)\n\n",
                stage_name(m.stage), m.message.c_str());
    return run_on(with_index(resolve_shape(so, cpu_default())), Device{}, rows);
  }
}

}  // namespace msa::cli
