// `msa bench`: the BENCHMARKS.md cases (--case NAME, --list) and custom shapes. GPU cases go
// through one hook into the GPU benchmarks of bench/; the CPU mode times the reference stages,
// which is useful for small shapes and says plainly that it is the fp64 reference.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "bench/cases.h"
#ifdef MSA_CLI_GPU_BENCH
#include <unistd.h>

#include <filesystem>

#include "bench/gpu_benches.h"
#include "bench/gpu_timing.h"
#include "bench/sparse_fwd_cases.h"
#endif
#include "commands.h"
#include "json.h"
#include "options.h"
#include "pipeline.h"

namespace msa::cli {
namespace {

struct BenchSettings {
  int iters = 3;   // CPU timing mode; the GPU runner defaults to 20 (gpu_iters)
  int warmup = 0;  // CPU timing mode; the GPU runner defaults to 3 (gpu_warmup)
  int gpu_iters = 20, gpu_warmup = 3;
  DeviceChoice device = DeviceChoice::auto_select;
};

// ==== GPU benchmark hook ======================================================================
// The one place where `msa bench` reaches the GPU benchmarks. They live in bench/ next to the
// CUDA kernels and own the GPU timing rules of BENCHMARKS.md (CUDA events, warm-up, L2 flush,
// median and spread, a correctness check first): the sparse-prefill cases (P8K-tok ... CSR-32K)
// through bench/sparse_fwd_cases.h, IDX-32K-*, E2E-32K and DEC-* through bench/gpu_benches.h.
// They time the BENCHMARKS.md shapes; shape options make a custom shape, which they refuse.

#ifdef MSA_CLI_GPU_BENCH
enum class GpuRunner { none, sparse, indexer, pipeline, decode };

GpuRunner runner_of(const bench::BenchCase& c) {
  const std::vector<std::string>& sparse = msa_bench::sparse_case_names();
  if (std::find(sparse.begin(), sparse.end(), c.name) != sparse.end()) return GpuRunner::sparse;
  if (bench::find_case(c.name) == nullptr) return GpuRunner::none;  // a custom shape
  switch (c.kind) {
    case bench::CaseKind::block_scores: return GpuRunner::indexer;
    case bench::CaseKind::end_to_end: return GpuRunner::pipeline;
    case bench::CaseKind::decode: return GpuRunner::decode;
    default: return GpuRunner::none;
  }
}

bool same_shape(const bench::BenchCase& a, const bench::BenchCase& b) {
  return a.seqlens_q == b.seqlens_q && a.seqlens_k == b.seqlens_k &&
         a.num_q_heads == b.num_q_heads && a.num_kv_heads == b.num_kv_heads &&
         a.head_dim == b.head_dim && a.topk == b.topk && a.kv_block_size == b.kv_block_size &&
         a.causal == b.causal && a.pattern == b.pattern && a.seed == b.seed;
}

// Why this build cannot time `c` on the GPU; empty when it can (a GPU is checked separately).
std::string gpu_case_gap(const bench::BenchCase& c) {
  if (runner_of(c) == GpuRunner::none) return "no GPU benchmark for a custom shape";
  if (!same_shape(*bench::find_case(c.name), c))
    return "the GPU runner times the BENCHMARKS.md shape only; drop the shape options";
  return "";
}

// Runs the case's benchmark with its JSON records going to a scratch file, then moves them into
// `json` as "results" (one record per timed variant).
template <typename Run>
int run_with_records(Run&& run, JsonWriter& j) {
  const std::filesystem::path path = std::filesystem::temp_directory_path() /
                                     ("msa_bench_" + std::to_string(getpid()) + ".jsonl");
  std::filesystem::remove(path);
  const int rc = run(path.string());
  j.key("results").begin_array();
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) j.json(line);
  j.end_array();
  std::filesystem::remove(path);
  return rc;
}
#else
std::string gpu_case_gap(const bench::BenchCase&) { return "this build has no CUDA backend"; }
#endif

// Runs `c` on the GPU and writes its records into `json`; returns the exit code (0 ok, 1 a
// correctness check failed), or -1 when this build has no GPU benchmark for the case.
int dispatch_gpu_case(const bench::BenchCase& c, const BenchSettings& b, JsonWriter& j) {
  if (!gpu_unavailable_reason().empty() || !gpu_case_gap(c).empty()) return -1;
#ifdef MSA_CLI_GPU_BENCH
  const GpuRunner runner = runner_of(c);
  std::printf("msa bench %s on the GPU: median of %d runs after %d warm-up runs, L2 flushed (%s) "
              "before each, results checked first%s\n",
              c.name.c_str(), b.gpu_iters, b.gpu_warmup, msa::bench::flush_name(),
              runner == GpuRunner::sparse ? "; FlexAttention and cuDNN on the same selection: "
                                            "bench/peers.py"
                                          : "");
  std::fflush(stdout);
  const int rc = run_with_records([&](const std::string& records) {
    if (runner == GpuRunner::sparse) {
      msa_bench::SparseBenchOptions o;
      o.iters = b.gpu_iters;
      o.warmup = b.gpu_warmup;
      o.json_path = records;
      return msa_bench::run_sparse_case(c.name, o);
    }
    if (runner == GpuRunner::decode) {
      msa_bench::DecodeBenchOptions o;
      o.iters = b.gpu_iters;
      o.warmup = b.gpu_warmup;
      o.json = records;
      return msa_bench::run_decode_bench({c.name}, o);
    }
    bench::RunOptions o;
    o.seq = c.seqlens_q.at(0);
    o.hq = c.num_q_heads;
    o.hkv = c.num_kv_heads;
    o.topk = c.topk;
    o.fp8 = c.kv_dtypes == "fp8";
    o.iters = b.gpu_iters;
    o.warmup = b.gpu_warmup;
    o.json = records;
    return runner == GpuRunner::indexer ? msa_bench::run_indexer_bench(o)
                                        : msa_bench::run_pipeline_bench(o);
  }, j);
  MSA_CHECK(rc != 2, "msa bench: the GPU benchmark could not run ", c.name);
  j.field("device", "gpu").field("iters", b.gpu_iters).field("warmup", b.gpu_warmup);
  j.field("status", rc == 0 ? "ok" : "check_failed");
  return rc;
#else
  (void)b;
  (void)j;
  return -1;
#endif
}
// ==============================================================================================

std::vector<OptionSpec> bench_specs() {
  std::vector<OptionSpec> v = {
      {"case", "NAME", "a BENCHMARKS.md case (see --list); shape options override its values"},
      {"list", "", "list the cases with their shapes and whether this build can run them"},
  };
  for (const OptionSpec& s : shape_option_specs(true)) v.push_back(s);
  v.push_back(device_option_spec());
  v.push_back({"iters", "N", "timed runs, median reported (default 20 on the GPU, 3 per CPU stage)"});
  v.push_back({"warmup", "N", "untimed runs first (default 3 on the GPU, 0 on the CPU)"});
  v.push_back({"json", "FILE", "also write the results as JSON"});
  v.push_back({"help", "", "show this help"});
  return v;
}

// Why the CPU timing mode cannot run a case; empty when it can.
std::string cpu_gap(const bench::BenchCase& c) {
  if (c.kind == bench::CaseKind::decode) return "the CPU timing mode covers prefill stages only";
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
  Shape base;
  base.seqlens = c.seqlens_k;
  base.num_q_heads = c.num_q_heads;
  base.num_kv_heads = c.num_kv_heads;
  base.head_dim = c.head_dim;
  base.topk = c.topk;
  base.kv_block_size = c.kv_block_size;
  base.causal = c.causal;
  base.pattern = c.pattern;
  base.seed = c.seed;
  const Shape s = resolve_shape(o, base);
  const int64_t queries = c.seqlens_q.empty() ? 1 : c.seqlens_q[0];
  c.seqlens_k = s.seqlens;
  if (c.kind == bench::CaseKind::decode) c.seqlens_q.assign(s.seqlens.size(), queries);
  else c.seqlens_q = s.seqlens;
  c.num_q_heads = s.num_q_heads;
  c.num_kv_heads = s.num_kv_heads;
  c.head_dim = s.head_dim;
  c.topk = s.topk;
  c.kv_block_size = s.kv_block_size;
  c.causal = s.causal;
  c.pattern = s.pattern;
  c.seed = s.seed;
  return c;
}

// A custom prefill shape: BENCHMARKS.md defaults (Hq=64, Hkv=4, D=128, topK=16, tok) under the
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
  s.seqlens = c.seqlens_q;
  s.num_q_heads = c.num_q_heads;
  s.num_kv_heads = c.num_kv_heads;
  s.head_dim = c.head_dim;
  s.topk = c.topk;
  s.kv_block_size = c.kv_block_size;
  s.causal = c.causal;
  s.pattern = c.pattern;
  s.seed = c.seed;
  return s;
}

// The stage whose time the case is about (BENCHMARKS.md "what is timed"); -1: all of them.
int case_stage(const bench::BenchCase& c) {
  switch (c.kind) {
    case bench::CaseKind::sparse_prefill: return static_cast<int>(Stage::attention_forward);
    case bench::CaseKind::csr_build: return static_cast<int>(Stage::build_k2q_csr);
    case bench::CaseKind::block_scores: return static_cast<int>(Stage::block_scores);
    default: return -1;
  }
}

struct StageStats {
  double median = 0, min = 0, max = 0;
};
StageStats stats(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return {n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]), v.front(), v.back()};
}

void write_shape_json(JsonWriter& j, const bench::BenchCase& c) {
  j.key("shape").begin_object();
  j.key("seqlens_q").begin_array();
  for (int64_t l : c.seqlens_q) j.value(l);
  j.end_array().key("seqlens_k").begin_array();
  for (int64_t l : c.seqlens_k) j.value(l);
  j.end_array();
  j.field("hq", c.num_q_heads).field("hkv", c.num_kv_heads).field("dim", c.head_dim);
  j.field("topk", c.topk).field("blk", c.kv_block_size).field("causal", c.causal);
  j.field("pattern", bench::pattern_name(c.pattern)).field("seed", static_cast<int64_t>(c.seed));
  j.field("kv_dtypes", c.kv_dtypes).field("page_size", c.page_size).field("dense", c.dense);
  j.end_object();
}

// Runs every stage warmup + iters times; tok/blk selections replace the top-K output before the
// CSR build, so the CSR and attention stages see the case's pattern.
std::vector<std::vector<double>> time_stages(Pipeline& p, const Shape& s, const BenchSettings& b) {
  const std::vector<int32_t> selection = s.pattern == bench::Pattern::idx
                                             ? std::vector<int32_t>()
                                             : bench::make_selection(s.pattern, selection_shape(s));
  std::vector<std::vector<double>> ms(4);
  for (int it = 0; it < b.warmup + b.iters; ++it) {
    for (Stage st : kStages) {
      if (st == Stage::build_k2q_csr && !selection.empty()) p.set_q2k(selection);
      const double t = p.run(st);
      if (it >= b.warmup) ms[static_cast<int>(st)].push_back(t);
    }
  }
  return ms;
}

int time_cpu(const bench::BenchCase& c, const BenchSettings& b, JsonWriter& j) {
  const Shape s = shape_of(c);
  std::printf("msa bench %s on cpu (fp64 reference, %d OpenMP threads): %s, %s selection, bf16\n",
              c.name.c_str(), omp_get_max_threads(), describe(s).c_str(), bench::pattern_name(s.pattern));
  std::fflush(stdout);
  const HostInputs in = make_inputs(s);
  Pipeline p(s, in, Device{});
  const std::vector<std::vector<double>> ms = time_stages(p, s, b);
  const bench::PairCounts pairs = bench::count_pairs(p.q2k(), selection_shape(s), s.num_q_heads / s.num_kv_heads);
  const double flop[4] = {2.0 * s.head_dim * pairs.visible, 0, 0, 4.0 * s.head_dim * pairs.attended};
  const int focus = case_stage(c);
  std::printf("%-20s %11s %11s %11s  %s\n", "stage", "median ms", "min ms", "max ms", "rate");
  j.field("device", "cpu").field("threads", omp_get_max_threads()).field("iters", b.iters);
  j.field("warmup", b.warmup).key("stages").begin_array();
  for (Stage st : kStages) {
    const int i = static_cast<int>(st);
    const StageStats t = stats(ms[i]);
    std::printf("%s%-19s %11.2f %11.2f %11.2f  %s\n", i == focus ? "*" : " ", stage_name(st), t.median,
                t.min, t.max, flop[i] > 0 ? flop_rate(flop[i], t.median).c_str() : "");
    j.begin_object().field("name", stage_name(st)).field("median_ms", t.median).field("min_ms", t.min);
    j.field("max_ms", t.max).field("flop", static_cast<int64_t>(flop[i])).field("timed_by_case", focus < 0 || i == focus);
    j.end_object();
  }
  j.end_array().field("attended_pairs", pairs.attended).field("visible_pairs", pairs.visible);
  const double density = pairs.visible ? double(pairs.attended) / double(pairs.visible) : 0.0;
  j.field("density", density);
  std::printf("density %.2f%% (attended / causal dense (head, key) pairs)%s\n", 100 * density,
              focus >= 0 ? "; * = the stage this case times" : "");
  return 0;
}

void write_json(const std::string& path, const JsonWriter& j) {
  std::ofstream f(path);
  f << j.str() << "\n";
  MSA_CHECK(f.good(), "msa bench: cannot write --json file '", path, "'");
  std::printf("wrote %s\n", path.c_str());
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
               "Times a BENCHMARKS.md case on the GPU, or the CPU reference stages with --device cpu.\n"
               "A case this build has no backend for says what it needs and exits 0.",
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
  const std::optional<int64_t> iters = a.integer("iters", 1, 100000);
  const std::optional<int64_t> warmup = a.integer("warmup", 0, 100000);
  b.iters = static_cast<int>(iters.value_or(b.iters));
  b.gpu_iters = static_cast<int>(iters.value_or(b.gpu_iters));
  b.warmup = static_cast<int>(warmup.value_or(b.warmup));
  b.gpu_warmup = static_cast<int>(warmup.value_or(b.gpu_warmup));
  const bench::BenchCase c = pick_case(a, so);
  const std::optional<std::string> json_path = a.text("json");
  // Fail before a long run, not after it, when the JSON file cannot be written.
  if (json_path) MSA_CHECK(std::ofstream(*json_path).good(), "msa bench: cannot write --json file '", *json_path, "'");
  JsonWriter j;
  j.begin_object().field("tool", "msa bench").field("version", kVersion).field("case", c.name);
  write_shape_json(j, c);
  int rc = -1;
  if (b.device != DeviceChoice::cpu) {
    rc = dispatch_gpu_case(c, b, j);
    if (rc < 0 && (b.device == DeviceChoice::gpu || c.name != "custom")) {
      const std::string why = "needs " + c.needs + " (" + gpu_gap(c) + ")";
      std::printf("%s: %s\n", c.name.c_str(), why.c_str());
      if (cpu_gap(c).empty()) std::printf("(`--device cpu` times the fp64 CPU reference instead)\n");
      j.field("status", "no_backend").field("reason", why);
      rc = 0;
    } else if (rc < 0) {
      std::printf("no GPU backend for this shape (%s); timing the CPU reference\n", gpu_gap(c).c_str());
    }
  }
  if (rc < 0) {
    if (const std::string gap = cpu_gap(c); !gap.empty()) {
      std::printf("%s: %s\n", c.name.c_str(), gap.c_str());
      j.field("status", "no_backend").field("reason", gap);
      rc = 0;
    } else {
      rc = time_cpu(c, b, j);
      j.field("status", "ok");
    }
  }
  j.end_object();
  if (json_path) write_json(*json_path, j);
  return rc;
}

}  // namespace msa::cli
