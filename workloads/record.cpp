// The common fields of a benchmark record (record.h). The GPU fields come from the CUDA runtime
// in CUDA builds only; the commit comes from the header that workloads/commit.cmake writes at build
// time.
#include "workloads/record.h"

#include <algorithm>
#include <cmath>
#include <cctype>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <sstream>

#ifdef MSA_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include "workloads/cases.h"
#include "workloads/patterns.h"
#include "msa/error.h"
#include "msa_build_commit.h"  // MSA_BUILD_COMMIT

namespace msa::bench {
namespace {

// "13.0" from CUDA's 1000 * major + 10 * minor.
[[maybe_unused]] std::string cuda_version(int v) {
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

// The kernel module's version from /proc/driver/nvidia/version, whose first line reads
// "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  <build date>" (or "... Open Kernel
// Module for x86_64  580.159.04 ..."): its first word that starts with a digit and holds a dot;
// the whole line when there is none, null when there is no such file.
[[maybe_unused]] Json nvidia_driver() {
  std::ifstream f("/proc/driver/nvidia/version");
  std::string line;
  if (!std::getline(f, line)) return nullptr;
  std::istringstream words(line);
  for (std::string w; words >> w;)
    if (std::isdigit(static_cast<unsigned char>(w[0])) && w.find('.') != std::string::npos) return Json(w);
  return Json(line);
}

struct GpuInfo {
  Json gpu, driver, cuda;  // null when unknown
};

GpuInfo query_gpu() {
  GpuInfo g;
#ifdef MSA_WITH_CUDA
  int dev = 0, v = 0;
  cudaDeviceProp p{};
  if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&p, dev) == cudaSuccess) g.gpu = p.name;
  g.driver = Json::object();
  g.driver["cuda"] = cudaDriverGetVersion(&v) == cudaSuccess ? Json(cuda_version(v)) : Json();
  g.driver["nvidia"] = nvidia_driver();
  if (cudaRuntimeGetVersion(&v) == cudaSuccess) g.cuda = cuda_version(v);
#endif
  return g;
}

// Asked once: the process times one device.
const GpuInfo& gpu_info() {
  static const GpuInfo g = query_gpu();
  return g;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// null for a quantity that was not counted (0) or has no finite value.
Json number_or_null(double x) { return x > 0 && std::isfinite(x) ? Json(x) : Json(); }

}  // namespace

Json new_record(std::string_view case_name, std::string_view op, std::string_view impl) {
  Json r = Json::object();
  r["schema"] = kRecordSchema;
  r["case"] = case_name;
  r["impl"] = impl;
  r["op"] = op;
  return r;
}

void add_shape(Json& r, const BenchCase& c) {
  const auto longest = [](const std::vector<int64_t>& v) {
    return v.empty() ? int64_t{0} : *std::max_element(v.begin(), v.end());
  };
  const auto uniform = [](const std::vector<int64_t>& v) {
    return std::adjacent_find(v.begin(), v.end(), std::not_equal_to<>()) == v.end();
  };
  r["batch"] = c.seqlens_q.size();
  r["seq_q"] = longest(c.seqlens_q);
  r["seq_k"] = longest(c.seqlens_k);
  if (!uniform(c.seqlens_q) || !uniform(c.seqlens_k)) {
    r["seqlens_q"] = c.seqlens_q;
    r["seqlens_k"] = c.seqlens_k;
  }
  r["hq"] = c.num_q_heads;
  r["hkv"] = c.num_kv_heads;
  r["d"] = c.head_dim;
  r["blk"] = c.kv_block_size;
  r["topk"] = c.dense ? 0 : c.topk;
  r["pattern"] = c.dense ? "dense" : pattern_name(c.pattern);
  r["causal"] = c.causal;
  if (c.page_size > 0) r["page_size"] = c.page_size;
}

void add_dtypes(Json& r, std::string_view q, std::string_view kv, std::string_view scales) {
  Json d = Json::object();
  d["q"] = q;
  d["kv"] = kv;
  if (!scales.empty()) d["scales"] = scales;
  r["dtypes"] = d;
}

void add_timing(Json& r, const Times& t, int iters, int warmup, double flop, double bytes,
                Metric headline) {
  r["median_ms"] = t.median_ms;
  r["min_ms"] = t.min_ms;
  r["max_ms"] = t.max_ms;
  r["iters"] = iters;
  r["warmup"] = warmup;
  const double seconds = t.median_ms * 1e-3;
  r["flop"] = number_or_null(flop);
  r["bytes"] = number_or_null(bytes);
  r["tflops"] = flop > 0 && seconds > 0 ? number_or_null(flop / seconds / 1e12) : Json();
  r["tbps"] = bytes > 0 && seconds > 0 ? number_or_null(bytes / seconds / 1e12) : Json();
  r["metric"] = headline == Metric::tflops ? "tflops" : "tbps";
}

void add_pairs(Json& r, const PairCounts& p) {
  r["pairs"] = {{"attended", p.attended}, {"visible", p.visible}, {"selected_keys", p.selected_keys}};
  r["density"] = p.visible > 0 ? double(p.attended) / double(p.visible) : 0.0;
}

void add_check(Json& r, Check c, const Json& errors) {
  r["check"] = c == Check::passed ? "passed" : c == Check::failed ? "failed" : "skipped";
  if (!errors.is_null()) r["errors"] = errors;
}

void add_environment(Json& r, bool on_gpu, std::string_view flush) {
  const GpuInfo g = on_gpu ? gpu_info() : GpuInfo{};
  r["flush"] = flush;
  r["commit"] = build_commit();
  r["device"] = on_gpu ? "gpu" : "cpu";
  r["gpu"] = g.gpu;
  r["driver"] = g.driver;
  r["cuda"] = g.cuda;
  r["date"] = utc_now();
}

std::string build_commit() {
  const char* e = std::getenv("MSA_COMMIT");
  return e && *e ? e : MSA_BUILD_COMMIT;
}

void append_record(const std::string& path, const Json& r) {
  std::ofstream f(path, std::ios::app);
  f << r.dump() << "\n";
  MSA_CHECK(f.good(), "bench: cannot append a record to '", path, "'");
}

}  // namespace msa::bench
