// `msa bench`: the named cases of bench/CASES.md (--case NAME, --list) and custom shapes. GPU
// cases go through one hook into the GPU benchmarks of bench/; the CPU mode times the reference
// stages, which is useful for small shapes and says plainly that it is the fp64 reference. Both
// append records of bench/SCHEMA.md to the --json file, say on stderr how far a long run has
// got, and warn when the selection is dense.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "workloads/cases.h"
#include "workloads/counts.h"
#include "workloads/record.h"
#ifdef MSA_CLI_GPU_BENCH
#include "workloads/gpu_benches.h"
#include "workloads/gpu_timing.h"
#include "workloads/sparse_fwd_cases.h"
#endif
#include "commands.h"
#include "options.h"
#include "pipeline.h"

namespace msa::cli {
namespace {

struct BenchSettings {
  int iters = 3;   // CPU timing mode; the GPU runner defaults to 20 (gpu_iters)
  int warmup = 0;  // CPU timing mode; the GPU runner defaults to 3 (gpu_warmup)
  int gpu_iters = 20, gpu_warmup = 3;
  DeviceChoice device = DeviceChoice::auto_select;
  bool allow_slow = false;  // time the CPU reference even where it would take very long
};

// The fp64 CPU reference's rate assumed when estimating a run (scalar double loops; measured
// 1.5-3 GFLOP/s a thread on the build machines), and the estimate past which `msa bench` asks for
// --allow-slow rather than starting: a named 32K case runs for hours.
constexpr double kCpuFlopsPerThread = 2e9;
constexpr double kSlowSeconds = 600;

// ==== GPU benchmark hook ======================================================================
// The one place where `msa bench` reaches the GPU benchmarks. They live in bench/ next to the
// CUDA kernels and own the GPU timing rules of bench/CASES.md (CUDA events, warm-up, L2 flush,
// median and spread, a correctness check first): the sparse-prefill cases (P8K-tok ... CSR-32K)
// through workloads/sparse_fwd_cases.h, IDX-32K-*, E2E-32K and DEC-* through workloads/gpu_benches.h.
// They time the named shapes; shape options make a custom shape, which they refuse.

#ifdef MSA_CLI_GPU_BENCH
enum class GpuRunner { none, sparse, indexer, pipeline, decode, latency };

GpuRunner runner_of(const bench::BenchCase& c) {
  const std::vector<std::string>& sparse = msa_bench::sparse_case_names();
  if (std::find(sparse.begin(), sparse.end(), c.name) != sparse.end()) return GpuRunner::sparse;
  if (bench::find_case(c.name) == nullptr) return GpuRunner::none;  // a custom shape
  switch (c.kind) {
    case bench::CaseKind::block_scores: return GpuRunner::indexer;
    case bench::CaseKind::end_to_end: return GpuRunner::pipeline;
    case bench::CaseKind::decode: return GpuRunner::decode;
    case bench::CaseKind::latency: return GpuRunner::latency;
    default: return GpuRunner::none;
  }
}

bool same_shape(const bench::BenchCase& a, const bench::BenchCase& b) {
  return a.seqlens_q == b.seqlens_q && a.seqlens_k == b.seqlens_k &&
         static_cast<const bench::CaseShape&>(a) == b;
}

// Why this build cannot time `c` on the GPU; empty when it can (a GPU is checked separately).
std::string gpu_case_gap(const bench::BenchCase& c) {
  if (runner_of(c) == GpuRunner::none) return "no GPU benchmark for a custom shape";
  if (!same_shape(*bench::find_case(c.name), c))
    return "the GPU runner times the named case's shape only; drop the shape options";
  return "";
}
#else
std::string gpu_case_gap(const bench::BenchCase&) { return "this build has no CUDA backend"; }
#endif

// Runs `c` on the GPU, its records appended to `json` when not empty; returns the exit code (0
// ok, 1 a correctness check failed), or -1 when this build has no GPU benchmark for the case.
int dispatch_gpu_case(const bench::BenchCase& c, const BenchSettings& b, const std::string& json) {
  if (!gpu_unavailable_reason().empty() || !gpu_case_gap(c).empty()) return -1;
#ifdef MSA_CLI_GPU_BENCH
  const GpuRunner runner = runner_of(c);
  if (runner == GpuRunner::latency)
    std::printf("msa bench %s on the GPU: per call, the median host time of calls on an idle stream "
                "and the GPU time of calls back to back (no L2 flush), results checked first; FA4 "
                "and cuDNN on the same shapes: bench/python_bench.py\n", c.name.c_str());
  else
    std::printf("msa bench %s on the GPU: median of %d runs after %d warm-up runs, L2 flushed (%s) "
                "before each, results checked first%s\n",
                c.name.c_str(), b.gpu_iters, b.gpu_warmup, msa::bench::flush_name(),
                runner == GpuRunner::sparse ? "; FlexAttention and cuDNN on the same selection: "
                                              "bench/peers.py"
                                            : "");
  std::fflush(stdout);
  int rc = 2;
  if (runner == GpuRunner::sparse) {
    msa_bench::SparseBenchOptions o;
    o.iters = b.gpu_iters;
    o.warmup = b.gpu_warmup;
    o.json_path = json;
    rc = msa_bench::run_sparse_case(c.name, o);
  } else if (runner == GpuRunner::latency) {
    msa_bench::LatencyBenchOptions o;
    o.json = json;
    rc = msa_bench::run_latency_bench({c.name}, o);
  } else if (runner == GpuRunner::decode) {
    msa_bench::DecodeBenchOptions o;
    o.iters = b.gpu_iters;
    o.warmup = b.gpu_warmup;
    o.json = json;
    rc = msa_bench::run_decode_bench({c.name}, o);
  } else {
    bench::RunOptions o;
    o.seq = c.seqlens_q.at(0);
    o.hq = c.num_q_heads;
    o.hkv = c.num_kv_heads;
    o.topk = c.topk;
    o.fp8 = c.kv_dtypes == "fp8";
    o.m3 = c.name == "E2E-32K-M3";
    o.iters = b.gpu_iters;
    o.warmup = b.gpu_warmup;
    o.json = json;
    rc = runner == GpuRunner::indexer ? msa_bench::run_indexer_bench(o) : msa_bench::run_pipeline_bench(o);
  }
  MSA_CHECK(rc != 2, "msa bench: the GPU benchmark could not run ", c.name);
  return rc;
#else
  (void)b;
  (void)json;
  return -1;
#endif
}
// ==============================================================================================

std::vector<OptionSpec> bench_specs() {
  std::vector<OptionSpec> v = {
      {"case", "NAME", "a case of bench/CASES.md (see --list); shape options override its values"},
      {"list", "", "list the cases with their shapes and whether this build can run them"},
  };
  for (const OptionSpec& s : shape_option_specs(true)) v.push_back(s);
  v.push_back(device_option_spec());
  v.push_back({"iters", "N", "timed runs, median reported (default 20 on the GPU, 3 per CPU stage)"});
  v.push_back({"warmup", "N", "untimed runs first (default 3 on the GPU, 0 on the CPU)"});
  v.push_back({"json", "FILE", "append one JSON record per timed op to FILE (JSON Lines, bench/SCHEMA.md)"});
  v.push_back({"allow-slow", "", "time the CPU reference even when that is estimated to take over 10 minutes"});
  v.push_back({"help", "", "show this help"});
  return v;
}

// Why the CPU timing mode cannot run a case; empty when it can.
std::string cpu_gap(const bench::BenchCase& c) {
  if (c.pattern == bench::Pattern::ids)
    return "the CPU timing mode runs block selections (block scores, top-K, CSR, attention), not "
           "token ids";
  if (c.kind == bench::CaseKind::decode) return "the CPU timing mode covers prefill stages only";
  if (c.kind == bench::CaseKind::latency) return "latency cases time GPU calls (host and launch costs)";
  if (c.kind == bench::CaseKind::block_scores && c.kv_dtypes != "bf16")
    return "the CPU timing mode runs bf16 inputs only";
  return "";
}

std::string gpu_gap(const bench::BenchCase& c) {
  const std::string gap = gpu_case_gap(c);
  if (!gap.empty()) return gap;
  return gpu_unavailable_reason();
}

void print_list() {
  std::printf("%-14s %-48s %s\n", "case", "what is timed", "shape");
  for (const bench::BenchCase& c : bench::bench_cases()) {
    std::printf("%-14s %-48s %s\n", c.name.c_str(), c.timed.c_str(), bench::describe_shape(c).c_str());
    const std::string g = gpu_gap(c), p = cpu_gap(c);
    std::printf("%-14s gpu: %s\n", "", g.empty() ? "yes" : ("no, needs " + c.needs + " (" + g + ")").c_str());
    std::printf("%-14s cpu: %s\n", "", p.empty() ? "fp64 reference with --device cpu (slow at this size)" : ("no, " + p).c_str());
  }
  std::printf("\nCustom shapes: `msa bench --device cpu --seq 1024 [--hq --hkv --topk --pattern ...]`\n"
              "times the CPU reference stages.\n");
}

// Applies shape options on top of a case (validated by resolve_shape). Decode cases keep their
// queries per request; --seq there sets the keys per request.
bench::BenchCase with_overrides(bench::BenchCase c, const ShapeOptions& o) {
  // Token-id cases (G = 64, blk 1) lie outside the block shapes that resolve_shape checks; they run
  // as the table has them.
  if (c.pattern == bench::Pattern::ids) {
    if (o.any()) throw UsageError(c.name + " takes no shape options: it runs as bench/CASES.md has it");
    return c;
  }
  Shape base;
  static_cast<bench::CaseShape&>(base) = c;
  base.seqlens = c.seqlens_k;
  const Shape s = resolve_shape(o, base);
  const int64_t queries = c.seqlens_q.empty() ? 1 : c.seqlens_q[0];
  c.seqlens_k = s.seqlens;
  if (c.kind == bench::CaseKind::decode) c.seqlens_q.assign(s.seqlens.size(), queries);
  else c.seqlens_q = s.seqlens;
  static_cast<bench::CaseShape&>(c) = s;
  return c;
}

// A custom prefill shape: the defaults of bench/CASES.md (Hq=64, Hkv=4, D=128, topK=16, tok) under the
// given options; --seq (or --seqlens) is required.
bench::BenchCase custom_case(const ShapeOptions& o) {
  bench::BenchCase c;
  c.name = "custom";
  c.kind = bench::CaseKind::end_to_end;
  c.timed = "indexer + top-K + CSR + attention, each stage";
  c.needs = "the CUDA indexer, top-K, CSR builder and sparse prefill";
  return with_overrides(c, o);
}

Shape shape_of(const bench::BenchCase& c) {
  Shape s;
  static_cast<bench::CaseShape&>(s) = c;
  s.seqlens = c.seqlens_q;
  return s;
}

// The stage whose time the case is about (its "what is timed" in bench/CASES.md); -1: all of them.
int case_stage(const bench::BenchCase& c) {
  switch (c.kind) {
    case bench::CaseKind::sparse_prefill: return static_cast<int>(Stage::attention_forward);
    case bench::CaseKind::csr_build: return static_cast<int>(Stage::build_k2q_csr);
    case bench::CaseKind::block_scores: return static_cast<int>(Stage::block_scores);
    default: return -1;
  }
}

bench::Times stats(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return {n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]), v.front(), v.back()};
}

bench::Op op_of(Stage st) {
  switch (st) {
    case Stage::block_scores: return bench::Op::block_scores;
    case Stage::select_topk: return bench::Op::select_topk;
    case Stage::build_k2q_csr: return bench::Op::build_k2q_csr;
    case Stage::attention_forward: return bench::Op::attention_forward;
    case Stage::index_topk: return bench::Op::block_topk;
  }
  return bench::Op::pipeline;
}

// Progress of a CPU run on stderr, a line per iteration, when the whole run looks like taking
// more than a few seconds: announced up front from its FLOP count (the fp64 reference does a few
// GFLOP/s), or found out once an iteration has been timed. Small shapes finish without a word.
class IterationProgress {
 public:
  IterationProgress(int warmup, int iters, double flop_per_iteration)
      : warmup_(warmup), total_(warmup + iters), announced_(flop_per_iteration * total_ > 1e10) {
    if (!announced_) return;
    std::fprintf(stderr, "msa bench: %d warm-up + %d timed iterations of the four stages, %.1f GFLOP each, "
                 "on the CPU: this takes a while\n", warmup, iters, flop_per_iteration * 1e-9);
    std::fflush(stderr);
  }
  void done(int it) {
    const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
    const double left = elapsed / (it + 1) * (total_ - it - 1);
    if (!announced_ && elapsed + left < 3.0) return;
    std::fprintf(stderr, "[iteration %d/%d] %s, %.1f s so far, about %.0f s left\n", it + 1, total_,
                 it < warmup_ ? "warm-up" : "timed", elapsed, left);
    std::fflush(stderr);
  }

 private:
  using Clock = std::chrono::steady_clock;
  int warmup_, total_;
  bool announced_;
  Clock::time_point start_ = Clock::now();
};

// Runs every stage warmup + iters times; a tok/blk `selection` replaces the top-K output before
// the CSR build, so the CSR and attention stages see the case's pattern.
std::vector<std::vector<double>> time_stages(Pipeline& p, const std::vector<int32_t>& selection,
                                             const BenchSettings& b, double flop_per_iteration) {
  std::vector<std::vector<double>> ms(4);
  IterationProgress progress(b.warmup, b.iters, flop_per_iteration);
  for (int it = 0; it < b.warmup + b.iters; ++it) {
    for (Stage st : kStages) {
      if (st == Stage::build_k2q_csr && !selection.empty()) p.set_q2k(selection);
      const double t = p.run(st);
      if (it >= b.warmup) ms[static_cast<int>(st)].push_back(t);
    }
    progress.done(it);
  }
  return ms;
}

void warn_if_dense(const bench::PairCounts& pairs, const bench::SelectionShape& sel) {
  const std::string w = bench::dense_selection_warning(pairs, sel);
  if (w.empty()) return;
  std::fprintf(stderr, "msa bench: %s\n", w.c_str());
  std::fflush(stderr);
}

// One record per stage: the CPU reference is what a check would compare against, so "check" is
// skipped.
void append_stage_record(const std::string& path, const bench::BenchCase& c, Stage st,
                         const bench::Times& t, const BenchSettings& b, const bench::OpCount& n,
                         const bench::PairCounts& pairs) {
  bench::Json r = bench::new_record(c.name, stage_name(st));
  bench::add_shape(r, c);
  bench::add_dtypes(r, "bf16", "bf16");
  bench::add_pairs(r, pairs);
  r["threads"] = omp_get_max_threads();
  bench::add_timing(r, t, b.iters, b.warmup, n.flop, n.bytes,
                    n.flop > 0 ? bench::Metric::tflops : bench::Metric::tbps);
  bench::add_check(r, bench::Check::skipped);
  bench::add_environment(r, false, "none");
  bench::append_record(path, r);
}

int time_cpu(const bench::BenchCase& c, const BenchSettings& b, const std::string& json) {
  const Shape s = shape_of(c);
  std::printf("msa bench %s on cpu (fp64 reference, %d OpenMP threads): %s, %s selection, bf16\n",
              c.name.c_str(), omp_get_max_threads(), describe(s).c_str(), bench::pattern_name(s.pattern));
  std::fflush(stdout);
  const bench::SelectionShape sel = selection_shape(s);
  const int group = s.num_q_heads / s.num_kv_heads;
  // tok / blk: known before the run, so a dense one is named before the wait.
  const std::vector<int32_t> selection = s.pattern == bench::Pattern::idx
                                             ? std::vector<int32_t>()
                                             : bench::make_selection(s.pattern, sel);
  bench::SelectionShape unselected = sel;  // idx: visible pairs only, the selection comes later
  unselected.topk = 0;
  const bench::PairCounts known = selection.empty() ? bench::count_pairs({}, unselected, group)
                                                    : bench::count_pairs(selection, sel, group);
  if (!selection.empty()) warn_if_dense(known, sel);
  // Block scores plus attention; dense attention bounds an idx selection's.
  const double flop = 2.0 * s.head_dim * double(known.visible) +
                      4.0 * s.head_dim * double(selection.empty() ? known.visible : known.attended);
  const int runs = b.warmup + b.iters;
  const double seconds = flop * runs / (kCpuFlopsPerThread * omp_get_max_threads());
  if (seconds > kSlowSeconds && !b.allow_slow)
    throw UsageError(detail::concat(
        "timing ", c.name, " on the CPU reference would take about ", int64_t(seconds / 60 + 1),
        " minutes (", int64_t(flop / 1e9), " GFLOP a run, ", runs, " runs, at ~",
        int64_t(kCpuFlopsPerThread / 1e9), " GFLOP/s on each of ", omp_get_max_threads(),
        " threads); shrink it (--seq, --batch, --hq) or pass --allow-slow"));
  check_host_memory(s);
  const HostInputs in = make_inputs(s);
  Pipeline p(s, in, Device{});
  const std::vector<std::vector<double>> ms = time_stages(p, selection, b, flop);
  const bench::PairCounts pairs = bench::count_pairs(p.q2k(), sel, group);
  if (selection.empty()) warn_if_dense(pairs, sel);
  const bench::OpShape shape = bench::op_shape(sel, s.num_q_heads, s.head_dim);
  const int focus = case_stage(c);
  std::printf("%-20s %11s %11s %11s  %s\n", "stage", "median ms", "min ms", "max ms", "rate");
  for (Stage st : kStages) {
    const int i = static_cast<int>(st);
    const bench::Times t = stats(ms[i]);
    const bench::OpCount n = bench::count_op(op_of(st), shape, pairs);
    std::printf("%s%-19s %11.2f %11.2f %11.2f  %s\n", i == focus ? "*" : " ", stage_name(st), t.median_ms,
                t.min_ms, t.max_ms, n.flop > 0 ? flop_rate(n.flop, t.median_ms).c_str() : "");
    if (!json.empty()) append_stage_record(json, c, st, t, b, n, pairs);
  }
  const double density = pairs.visible ? double(pairs.attended) / double(pairs.visible) : 0.0;
  std::printf("density %.2f%% (attended / causal dense (head, key) pairs)%s\n", 100 * density,
              focus >= 0 ? "; * = the stage this case times" : "");
  return 0;
}

// Resolves what to run: a named case with overrides, or a custom shape.
bench::BenchCase pick_case(const ParsedArgs& a, const ShapeOptions& so) {
  if (auto name = a.text("case")) {
    const bench::BenchCase* c = bench::find_case(*name);
    if (c == nullptr) throw UsageError("unknown case '" + *name + "' (`msa bench --list` shows the cases)");
    return with_overrides(*c, so);
  }
  if (!so.any_length()) throw UsageError("give --case NAME, --list, or a custom shape (--seq N ...)");
  return custom_case(so);
}

}  // namespace

int run_bench(const std::vector<std::string>& args) {
  const std::vector<OptionSpec> specs = bench_specs();
  const ParsedArgs a(specs, args);
  if (a.has("help")) {
    print_help(std::cout, "msa bench (--case NAME | --list | --seq N) [options]",
               "Times a case of bench/CASES.md on the GPU, or the CPU reference stages with --device\n"
               "cpu. A case this build has no backend for says what it needs and exits 0.\n"
               "`python bench/plot.py FILE --out DIR` draws the --json records.",
               specs);
    return 0;
  }
  if (a.has("list")) {
    print_list();
    return 0;
  }
  const ShapeOptions so = parse_shape_options(a);
  BenchSettings b;
  b.device = parse_device(a);
  b.allow_slow = a.has("allow-slow");
  const std::optional<int64_t> iters = a.integer("iters", 1, 100000);
  const std::optional<int64_t> warmup = a.integer("warmup", 0, 100000);
  b.iters = static_cast<int>(iters.value_or(b.iters));
  b.gpu_iters = static_cast<int>(iters.value_or(b.gpu_iters));
  b.warmup = static_cast<int>(warmup.value_or(b.warmup));
  b.gpu_warmup = static_cast<int>(warmup.value_or(b.gpu_warmup));
  const bench::BenchCase c = pick_case(a, so);
  const std::string json = a.text("json").value_or("");
  // Fail before a long run, not after it, when the records cannot be appended.
  if (!json.empty())
    MSA_CHECK(std::ofstream(json, std::ios::app).good(), "msa bench: cannot append to --json file '", json, "'");
  int rc = -1;
  bool timed = false;
  if (b.device != DeviceChoice::cpu) {
    rc = dispatch_gpu_case(c, b, json);
    timed = rc >= 0;
    if (rc < 0 && (b.device == DeviceChoice::gpu || c.name != "custom")) {
      std::printf("%s: needs %s (%s)\n", c.name.c_str(), c.needs.c_str(), gpu_gap(c).c_str());
      if (cpu_gap(c).empty()) std::printf("(`--device cpu` times the fp64 CPU reference instead)\n");
      rc = 0;
    } else if (rc < 0) {
      std::printf("no GPU backend for this shape (%s); timing the CPU reference\n", gpu_gap(c).c_str());
    }
  }
  if (rc < 0) {
    if (const std::string gap = cpu_gap(c); !gap.empty()) {
      std::printf("%s: %s\n", c.name.c_str(), gap.c_str());
      rc = 0;
    } else {
      rc = time_cpu(c, b, json);
      timed = true;
    }
  }
  if (!json.empty())
    std::printf(timed ? "records appended to %s\n" : "nothing was timed: no record written to %s\n", json.c_str());
  return rc;
}

}  // namespace msa::cli
