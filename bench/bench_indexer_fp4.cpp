// bench_indexer_fp4: the FP4 indexer cases of bench/CASES.md (seed 000's prefill_q8k_k8k,
// prefill_q8k_k64k and decode_uniform shapes: Hq 64, Hkv 4, D 128, blocks of 128, causal
// bottom-right), NVFP4 and MXFP4 q and K, K in a page pool of 128-slot pages in the seed's layout
// [pages, Hkv, 128, 64] (--flat: a flat [keys, Hkv, 64] cache). Block scores materialized and the
// fused indexer + top-16, in TFLOP/s (and the same shapes in bf16, IDX-8K-bf16 etc., for the
// FP4 cases' bf16 figures) with FLOP = 2 D Hq (visible pairs). Random packed values
// (every code) and scales (2^-3 .. 2^3); a check runs first: sampled score rows against an fp64
// host dot product of the decoded bits. --json FILE appends one record per timed op.
//   bench_indexer_fp4 [--case NAME]... [--flat] [--iters N] [--warmup N] [--json FILE]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/codecs.h"
#include "msa/msa.h"
#include "workloads/cases.h"
#include "workloads/gpu_timing.h"
#include "workloads/record.h"

namespace {

using msa::DType;
using msa::Tensor;
using namespace msa::bench;

struct Fp4Case {
  std::string name;
  std::vector<int64_t> lq, lk;  // per request
  bool nvfp4;
  bool bf16 = false;  // the same shape with bf16 q and K (the FP4 case's bf16 figure)
};

std::vector<Fp4Case> fp4_cases() {
  std::vector<Fp4Case> v;
  for (const bool nv : {true, false}) {
    const std::string f = nv ? "-nvfp4" : "-mxfp4";
    v.push_back({"IDX-8K" + f, {8192}, {8192}, nv});
    v.push_back({"IDX-8K-64K" + f, {8192}, {65536}, nv});
    v.push_back({"IDX-DEC" + f, std::vector<int64_t>(30, 8), std::vector<int64_t>(30, 67584), nv});
  }
  for (int i = 0; i < 3; ++i) {  // the bf16 companions: IDX-8K-bf16, ...
    Fp4Case c = v[i];
    c.name = c.name.substr(0, c.name.size() - 6) + "-bf16";
    c.bf16 = true;
    v.push_back(c);
  }
  return v;
}

constexpr int64_t kHq = 64, kHkv = 4, kD = 128, kBlk = 128, kPage = 128, kTopK = 16;

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(&v[i], &x, std::min<size_t>(8, n - i));
  }
  return v;
}

// Scale bytes in 2^-3 .. 2^3: e4m3 (any mantissa) or e8m0.
std::vector<uint8_t> random_scales(size_t n, bool nvfp4, uint64_t seed) {
  std::vector<uint8_t> v = random_bytes(n, seed);
  for (uint8_t& b : v) {
    const int e = int(b % 7) - 3;
    b = nvfp4 ? uint8_t(((e + 7) << 3) | ((b >> 3) & 7)) : uint8_t(127 + e);
  }
  return v;
}

// bf16 values in [-2, 2) as bytes (the bf16 companions).
std::vector<uint8_t> random_bf16(size_t n, uint64_t seed) {
  std::vector<uint8_t> v = random_bytes(2 * n, seed);
  for (size_t i = 0; i < n; ++i) {
    uint16_t r;
    std::memcpy(&r, &v[2 * i], 2);
    const uint16_t b = msa::codec::float_to_bf16(float(r) / 16384.f - 2.f);
    std::memcpy(&v[2 * i], &b, 2);
  }
  return v;
}

// Logical element d of a row: packed FP4 with its scales (exact in double), or bf16 (sc null).
double decode(const uint8_t* row, const uint8_t* sc, int64_t d, bool nvfp4, float global) {
  if (sc == nullptr) {
    uint16_t b;
    std::memcpy(&b, row + 2 * d, 2);
    return msa::codec::bf16_to_float(b);
  }
  return msa::codec::fp4_step(sc[d / (nvfp4 ? 16 : 32)], nvfp4, global) * msa::codec::fp4x2_get(row, d);
}

int run_case(const Fp4Case& c, bool flat, int warmup, int iters, const std::string& json) {
  cudaStream_t s;
  MSA_BENCH_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int64_t B = int64_t(c.lq.size()), G = c.nvfp4 ? kD / 16 : kD / 32;
  const int64_t total_q = std::accumulate(c.lq.begin(), c.lq.end(), int64_t(0));
  int64_t nblk = 0, max_pages = 0, total_pages = 0, total_k = 0;
  for (int64_t b = 0; b < B; ++b) {
    nblk = std::max(nblk, (c.lk[b] + kBlk - 1) / kBlk);
    max_pages = std::max(max_pages, (c.lk[b] + kPage - 1) / kPage);
    total_pages += (c.lk[b] + kPage - 1) / kPage;
    total_k += c.lk[b];
  }
  const int64_t krows = flat ? total_k : total_pages * kPage;  // key rows per head
  const float qg = c.nvfp4 ? 0.5f : 1.f, kg = c.nvfp4 ? 0.75f : 1.f;
  const int64_t row_bytes = c.bf16 ? kD * 2 : kD / 2;  // bytes of one (token, head) row
  const auto hq_vals = c.bf16 ? random_bf16(size_t(total_q * kHq * kD), 1) : random_bytes(size_t(total_q * kHq * row_bytes), 1);
  const auto hq_sc = c.bf16 ? std::vector<uint8_t>(1) : random_scales(size_t(total_q * kHq * G), c.nvfp4, 2);
  const auto hk_vals = c.bf16 ? random_bf16(size_t(krows * kHkv * kD), 3) : random_bytes(size_t(krows * kHkv * row_bytes), 3);
  const auto hk_sc = c.bf16 ? std::vector<uint8_t>(1) : random_scales(size_t(krows * kHkv * G), c.nvfp4, 4);
  std::vector<int32_t> cu_q{0}, cu_k{0};
  std::vector<int32_t> table(size_t(B * max_pages), 0), used(size_t(B), 0);
  int32_t next_page = 0;
  for (int64_t b = 0; b < B; ++b) {
    cu_q.push_back(int32_t(cu_q.back() + c.lq[b]));
    cu_k.push_back(int32_t(cu_k.back() + c.lk[b]));
    used[b] = int32_t(c.lk[b]);
    for (int64_t p = 0; p < (c.lk[b] + kPage - 1) / kPage; ++p) table[b * max_pages + p] = next_page++;
  }
  DeviceBuffer dq = gpu_buffer(hq_vals.size()), dqs = gpu_buffer(hq_sc.size());
  DeviceBuffer dk = gpu_buffer(hk_vals.size()), dks = gpu_buffer(hk_sc.size());
  DeviceBuffer dcq = gpu_buffer(cu_q.size() * 4), dck = gpu_buffer(cu_k.size() * 4);
  DeviceBuffer dt = gpu_buffer(table.size() * 4), du = gpu_buffer(used.size() * 4);
  DeviceBuffer scores = gpu_buffer(size_t(kHq * nblk * total_q) * 4);
  DeviceBuffer ids = gpu_buffer(size_t(kHkv * total_q * kTopK) * 4);
  DeviceBuffer status = gpu_buffer(16), flush = gpu_buffer(size_t(256) << 20);
  dq.upload(hq_vals.data(), hq_vals.size(), s);
  dqs.upload(hq_sc.data(), hq_sc.size(), s);
  dk.upload(hk_vals.data(), hk_vals.size(), s);
  dks.upload(hk_sc.data(), hk_sc.size(), s);
  dcq.upload(cu_q.data(), cu_q.size() * 4, s);
  dck.upload(cu_k.data(), cu_k.size() * 4, s);
  dt.upload(table.data(), table.size() * 4, s);
  du.upload(used.data(), used.size() * 4, s);
  const DType sdt = c.nvfp4 ? DType::fp8_e4m3 : DType::e8m0, vdt = c.bf16 ? DType::bf16 : DType::fp4x2;
  const int64_t last = c.bf16 ? kD : kD / 2;  // the values' last dim
  // bf16: no scales; FP4: scales in the values' layout with G groups.
  auto qt = [&](Tensor v, Tensor sc, float g) { return c.bf16 ? msa::QTensor(v) : msa::QTensor(v, sc, g); };

  msa::BlockScoresArgs a;
  a.q = qt(gpu_view(dq.get(), vdt, {total_q, kHq, last}), gpu_view(dqs.get(), sdt, {total_q, kHq, G}), qg);
  if (flat) {
    a.kv.k = qt(gpu_view(dk.get(), vdt, {total_k, kHkv, last}), gpu_view(dks.get(), sdt, {total_k, kHkv, G}), kg);
    a.kv.cu_seqlens_k = gpu_view(dck.get(), DType::i32, {B + 1});
  } else {  // the seed's pool: [pages, Hkv, 128, 64] (paged_hnd)
    a.kv.k = qt(gpu_view(dk.get(), vdt, {total_pages, kHkv, kPage, last}),
                gpu_view(dks.get(), sdt, {total_pages, kHkv, kPage, G}), kg);
    a.kv.layout = msa::KVLayout::paged_hnd;
    a.kv.page_table = gpu_view(dt.get(), DType::i32, {B, max_pages});
    a.kv.seqused_k = gpu_view(du.get(), DType::i32, {B});
  }
  a.cu_seqlens_q = gpu_view(dcq.get(), DType::i32, {B + 1});
  a.scores = gpu_view(scores.get(), DType::f32, {kHq, nblk, total_q});
  a.status = gpu_view(status.get(), DType::i32, {4});
  msa::BlockTopKArgs f;
  f.q = a.q;
  f.kv = a.kv;
  f.cu_seqlens_q = a.cu_seqlens_q;
  f.topk = int(kTopK);
  f.q2k = gpu_view(ids.get(), DType::i32, {kHkv, total_q, kTopK});
  f.status = a.status;

  msa::clear_status(a.status, s);
  msa::block_scores(a, s);
  msa::check_status(a.status, s);
  // Sampled rows against fp64 over the decoded bits (key j of request b: flat row cu_k[b] + j;
  // pooled: page table[b][j / 128], slot j % 128, in the [pages, Hkv, 128, 64] layout).
  double worst = 0;
  std::mt19937 rng(7);
  for (int sample = 0; sample < 6; ++sample) {
    const int64_t b = sample == 0 ? B - 1 : int64_t(rng() % B);
    const int64_t i = sample == 0 ? c.lq[b] - 1 : int64_t(rng() % c.lq[b]);
    const int64_t t = cu_q[b] + i, h = int64_t(rng() % kHq), hk = h / (kHq / kHkv);
    const int64_t last = c.lk[b] - c.lq[b] + i;  // causal, bottom-right
    const uint8_t* qrow = &hq_vals[(t * kHq + h) * row_bytes];
    const uint8_t* qsc = c.bf16 ? nullptr : &hq_sc[(t * kHq + h) * G];
    std::vector<double> qd(kD);
    for (int64_t d = 0; d < kD; ++d) qd[d] = decode(qrow, qsc, d, c.nvfp4, qg);
    for (int64_t kb = 0; kb < nblk; ++kb) {
      float got;
      scores.download(&got, 4, s, size_t((h * nblk + kb) * total_q + t) * 4);
      double best = -INFINITY;
      for (int64_t j = kb * kBlk; j < std::min(c.lk[b], (kb + 1) * kBlk) && j <= last; ++j) {
        const int64_t row = flat ? (cu_k[b] + j) * kHkv + hk
                                 : (int64_t(table[b * max_pages + j / kPage]) * kHkv + hk) * kPage + j % kPage;
        double dot = 0;
        const uint8_t* ksc = c.bf16 ? nullptr : &hk_sc[row * G];
        for (int64_t d = 0; d < kD; ++d) dot += qd[d] * decode(&hk_vals[row * row_bytes], ksc, d, c.nvfp4, kg);
        best = std::max(best, dot);
      }
      const double err = std::isinf(best) ? (got == best ? 0 : 1e9) : std::fabs(got - best) / (1 + std::fabs(best));
      worst = std::max(worst, err);
    }
  }
  const bool ok = worst < 1e-3;
  std::printf("%s: sampled score rows max rel err %.2e (%s)\n", c.name.c_str(), worst, ok ? "ok" : "FAILED");

  double visible = 0;  // causal bottom-right (query, key) pairs
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < c.lq[b]; ++i) visible += double(std::max<int64_t>(0, std::min(c.lk[b], c.lk[b] - c.lq[b] + i + 1)));
  const double flop = 2.0 * kD * kHq * visible;
  const double bytes = double(hq_vals.size() + hq_sc.size() + hk_vals.size() + hk_sc.size());
  const Timing ts = time_op([&] { msa::block_scores(a, s); }, warmup, iters, s, &flush, "block_scores");
  const Timing tf = time_op([&] { msa::block_topk(f, s); }, warmup, iters, s, &flush, "block_topk");
  msa::check_status(a.status, s);
  BenchCase bc;
  bc.name = c.name;
  bc.kind = CaseKind::block_scores;
  bc.seqlens_q = c.lq;
  bc.seqlens_k = c.lk;
  bc.pattern = Pattern::idx;
  bc.page_size = flat ? 0 : int(kPage);
  auto report = [&](const char* op, const Timing& x) {
    std::printf("%-22s %-13s %9.3f %9.3f %9.3f ms %8.1f TFLOP/s\n", c.name.c_str(), op, x.median, x.min, x.max,
                flop / (x.median * 1e9));
    if (json.empty()) return;
    Json r = new_record(c.name, op);
    add_shape(r, bc);
    if (c.bf16) add_dtypes(r, "bf16", "bf16");
    else add_dtypes(r, "fp4x2", "fp4x2", c.nvfp4 ? "nvfp4" : "mxfp4");
    add_timing(r, {x.median, x.min, x.max}, iters, warmup, flop, bytes, Metric::tflops);
    add_check(r, check_result(true, ok), Json{{"scores_max_rel", worst}});
    add_environment(r, true, flush_name());
    append_record(json, r);
  };
  report("block_scores", ts);
  report("block_topk", tf);
  cudaStreamDestroy(s);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> names;
  bool flat = false;
  int warmup = 3, iters = 10;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--case") names.push_back(next());
    else if (a == "--flat") flat = true;
    else if (a == "--iters") iters = std::stoi(next());
    else if (a == "--warmup") warmup = std::stoi(next());
    else if (a == "--json") json = next();
    else {
      std::fprintf(stderr, "usage: bench_indexer_fp4 [--case NAME]... [--flat] [--iters N] [--warmup N] [--json FILE]\n");
      return 2;
    }
  }
  int rc = 0, ran = 0;
  try {
    for (const Fp4Case& c : fp4_cases()) {
      if (!names.empty() && std::find(names.begin(), names.end(), c.name) == names.end()) continue;
      ++ran;
      rc |= run_case(c, flat, warmup, iters, json);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_indexer_fp4: %s\n", e.what());
    return 1;
  }
  if (ran == 0) {
    std::fprintf(stderr, "bench_indexer_fp4: no case of that name\n");
    return 2;
  }
  return rc;
}
