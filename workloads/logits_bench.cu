// The MQA logits benchmark (gpu_benches.h; program bench_logits), and the SDSA indexer's
// threshold select (SDSA-SELECT, below): bench/CASES.md's MQAL-PAGED-B64
// (B 64, next_n 2, 32768 keys, H 64, D 128, pool blocks of 64, FP8) and MQAL-PREFILL-32K (T = S =
// 32768, row t sees [0, t + 1), H 64, D 128, FP8). Inputs are filled on the device (e4m3 of
// N(0, 1)); the pool's blocks are shuffled. Before timing, two rows are checked against the CPU
// reference on the same bits. Rates: key (pool) bytes over time in TB/s and FLOP = 2 H D x the
// pairs computed (paged: every (row, visible key); prefill: visible pairs) in TFLOP/s.
// TOPK2048-B64 and TOPK2048-32K time token_topk (topk 2048) on those cases' logits, computed
// once: the paged rows whole (their -inf tail is never chosen), the prefill rows over their
// [ks, ke); sampled rows are checked id for id against the CPU; TB/s of the logits read (each
// row's range once) and the ids written. MQAL-TOPK-32K times mqa_logits_topk on the prefill case
// (run_logits_topk).
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "workloads/gpu_benches.h"
#include "workloads/gpu_timing.h"
#include "workloads/device_fill.cuh"
#include "workloads/inputs.h"
#include "workloads/record.h"
#include "msa/msa.h"

namespace {

using namespace msa;
using bench::DeviceBuffer;
using bench::gpu_buffer;
using bench::mix64;

// The fused pool's scale bytes: block_size f32 after each block's values.
__global__ void fill_pool_scales(uint8_t* pool, int64_t blocks, int bs, uint64_t seed) {
  const int64_t n = blocks * bs;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t blk = i / bs, slot = i % bs;
    float* s = reinterpret_cast<float*>(pool + blk * bs * 132 + bs * 128) + slot;
    *s = 0.5f + float(mix64(seed ^ uint64_t(i)) >> 40) * 0x1.0p-24f;
  }
}

// MXFP4: every 4-byte scale word of the fused pool (after each block's values) and q_sf's bytes
// as UE8M0 exponents in [123, 131] (scales 2^-4 .. 2^4). `stride` / `offset`: the bytes of a run
// of n_per words and where its words start (pool: bs * 68 per block, words at bs * 64).
__global__ void fill_e8m0(uint8_t* p, int64_t runs, int64_t stride, int64_t offset, int64_t n_per,
                          uint64_t seed) {
  const int64_t n = runs * n_per;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t run = i / n_per, k = i % n_per;
    p[run * stride + offset + k] = uint8_t(123 + (mix64(seed ^ uint64_t(i)) >> 60) % 9);
  }
}

template <typename T>
std::vector<T> download(const void* p, size_t n) {
  std::vector<T> h(n);
  MSA_BENCH_CUDA(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

// Relative L2 error of got against want over their finite entries, NaN when the -inf pattern
// differs.
double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double d2 = 0, r2 = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isinf(want[i]) || std::isinf(got[i])) {
      if (got[i] != want[i]) return NAN;
      continue;
    }
    d2 += double(got[i] - want[i]) * (got[i] - want[i]);
    r2 += double(want[i]) * want[i];
  }
  return r2 > 0 ? std::sqrt(d2 / r2) : std::sqrt(d2);
}

struct Result {
  double ms = 0, min_ms = 0, max_ms = 0, bytes = 0, flop = 0, err = 0;
  bool ok = true;
};

constexpr int64_t kD = 128, kH = 64;
constexpr int kTopK = 2048;

// token_topk (topk 2048) over computed logits, timed in place of the logits; rows_checked are
// compared with the CPU reference id for id (lo / hi: every row's range on the host, empty for
// whole rows).
Result run_topk(const msa_bench::LogitsBenchOptions& o, cudaStream_t s, const Tensor& logits,
                const Tensor& ks, const Tensor& ke, const std::vector<int32_t>& lo,
                const std::vector<int32_t>& hi, const Tensor& status, DeviceBuffer* flush,
                const char* name, std::initializer_list<int64_t> rows_checked) {
  const int64_t rows = logits.shape[0], cols = logits.shape[1];
  DeviceBuffer ids = gpu_buffer(size_t(rows * kTopK * 4));
  TokenTopKArgs a;
  a.logits = logits;
  a.ks = ks;
  a.ke = ke;
  a.topk = kTopK;
  a.ids = Tensor(ids.get(), DType::i32, {rows, int64_t(kTopK)}, logits.device);
  a.status = status;
  const auto run = [&] { token_topk(a, s); };
  run();
  check_status(status, s);
  Result r;
  if (o.check) {
    for (const int64_t row : rows_checked) {
      auto x = download<float>(static_cast<const float*>(logits.data) + row * logits.strides[0],
                               size_t(cols));
      auto got = download<int32_t>(static_cast<int32_t*>(ids.get()) + row * kTopK, size_t(kTopK));
      std::vector<int32_t> want(static_cast<size_t>(kTopK));
      std::vector<int32_t> l = {lo.empty() ? 0 : lo[size_t(row)]},
                           h = {hi.empty() ? int32_t(cols) : hi[size_t(row)]};
      TokenTopKArgs c;
      c.logits = Tensor(x.data(), DType::f32, {1, cols});
      c.ks = Tensor(l.data(), DType::i32, {1});
      c.ke = Tensor(h.data(), DType::i32, {1});
      c.topk = kTopK;
      c.ids = Tensor(want.data(), DType::i32, {1, int64_t(kTopK)});
      token_topk(c);
      r.ok = r.ok && got == want;
    }
  }
  const bench::Timing t = bench::time_op(run, o.warmup, o.iters, s, flush, name);
  check_status(status, s);
  r.ms = t.median;
  r.min_ms = t.min;
  r.max_ms = t.max;
  double read = 0;
  for (int64_t row = 0; row < rows; ++row)
    read += lo.empty() ? double(cols) : double(hi[row] - lo[row]);
  r.bytes = 4.0 * read + 4.0 * double(rows) * kTopK;
  return r;
}

// fp4: MQAL-PAGED-B64-fp4, the MXFP4 pool (64 value bytes and 4 scale bytes a token) and q.
Result run_paged(const msa_bench::LogitsBenchOptions& o, cudaStream_t s, bool topk, bool fp4 = false) {
  const int64_t batch = 64, next_n = 2, len = 32768, bs = 64;
  const int64_t per_req = len / bs, blocks = batch * per_req;
  const int64_t tb = fp4 ? 68 : 132, qd = fp4 ? kD / 2 : kD;  // bytes of a pool token, a q row
  DeviceBuffer q = gpu_buffer(size_t(batch * next_n * kH * qd)),
               q_sf = gpu_buffer(size_t(fp4 ? batch * next_n * kH * 4 : 16)),
               pool = gpu_buffer(size_t(blocks * bs * tb)),
               w = gpu_buffer(size_t(batch * next_n * kH * 4)),
               tables = gpu_buffer(size_t(batch * per_req * 4)), lens = gpu_buffer(size_t(batch * 4)),
               out = gpu_buffer(size_t(batch * next_n * len * 4)), status = gpu_buffer(16),
               flush = gpu_buffer(size_t(256) << 20);
  fill_fp8<<<1024, 256, 0, s>>>(static_cast<uint8_t*>(q.get()), batch * next_n * kH * qd, 11);
  fill_fp8<<<4096, 256, 0, s>>>(static_cast<uint8_t*>(pool.get()), blocks * bs * tb, 12);
  if (fp4) {
    fill_e8m0<<<1024, 256, 0, s>>>(static_cast<uint8_t*>(pool.get()), blocks, bs * tb, bs * 64,
                                   bs * 4, 13);
    fill_e8m0<<<256, 256, 0, s>>>(static_cast<uint8_t*>(q_sf.get()), 1, 0, 0,
                                  batch * next_n * kH * 4, 17);
  } else {
    fill_pool_scales<<<1024, 256, 0, s>>>(static_cast<uint8_t*>(pool.get()), blocks, int(bs), 13);
  }
  fill_uniform<<<256, 256, 0, s>>>(static_cast<float*>(w.get()), batch * next_n * kH, 14, -1.f, 2.f);
  std::vector<int32_t> order(blocks), lens_h(batch, int32_t(len));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(15));
  tables.upload(order, s);
  lens.upload(lens_h, s);
  const Device gpu{DeviceType::cuda, 0};
  PagedMqaLogitsArgs a;
  a.q = Tensor(q.get(), fp4 ? DType::fp4x2 : DType::fp8_e4m3, {batch, next_n, kH, qd}, gpu);
  if (fp4) a.q_sf = Tensor(q_sf.get(), DType::u8, {batch, next_n, kH, 4}, gpu);
  a.kv_fused = Tensor(pool.get(), DType::u8, {blocks, bs, 1, tb}, gpu);
  a.weights = Tensor(w.get(), DType::f32, {batch * next_n, kH}, gpu);
  a.block_tables = Tensor(tables.get(), DType::i32, {batch, per_req}, gpu);
  a.seq_lens = Tensor(lens.get(), DType::i32, {batch}, gpu);
  a.max_seq_len = len;
  a.logits = Tensor(out.get(), DType::f32, {batch * next_n, len}, gpu);
  a.status = Tensor(status.get(), DType::i32, {4}, gpu);
  clear_status(a.status, s);
  const auto run = [&] { paged_mqa_logits(a, s); };
  run();
  check_status(a.status, s);
  if (topk)
    return run_topk(o, s, a.logits, Tensor(), Tensor(), {}, {}, a.status, &flush, "TOPK2048-B64",
                    {0, 1, batch * next_n - 1});
  Result r;
  if (o.check) {  // request 0 on the CPU: its blocks, in table order, as a one-request pool
    std::vector<uint8_t> pool_h(size_t(per_req * bs * tb));
    for (int64_t c = 0; c < per_req; ++c)
      MSA_BENCH_CUDA(cudaMemcpy(pool_h.data() + c * bs * tb,
                                static_cast<uint8_t*>(pool.get()) + int64_t(order[c]) * bs * tb,
                                bs * tb, cudaMemcpyDeviceToHost));
    auto q_h = download<uint8_t>(q.get(), size_t(next_n * kH * qd));
    auto sf_h = download<uint8_t>(q_sf.get(), size_t(fp4 ? next_n * kH * 4 : 1));
    auto w_h = download<float>(w.get(), size_t(next_n * kH));
    auto got = download<float>(out.get(), size_t(next_n * len));
    std::vector<int32_t> ids(per_req), one_len = {int32_t(len)};
    std::iota(ids.begin(), ids.end(), 0);
    std::vector<float> want(got.size());
    PagedMqaLogitsArgs c;
    c.q = Tensor(q_h.data(), fp4 ? DType::fp4x2 : DType::fp8_e4m3, {1, next_n, kH, qd});
    if (fp4) c.q_sf = Tensor(sf_h.data(), DType::u8, {1, next_n, kH, 4});
    c.kv_fused = Tensor(pool_h.data(), DType::u8, {per_req, bs, 1, tb});
    c.weights = Tensor(w_h.data(), DType::f32, {next_n, kH});
    c.block_tables = Tensor(ids.data(), DType::i32, {1, per_req});
    c.seq_lens = Tensor(one_len.data(), DType::i32, {1});
    c.max_seq_len = len;
    c.logits = Tensor(want.data(), DType::f32, {next_n, len});
    paged_mqa_logits(c);
    r.err = rel_l2(got, want);
    r.ok = r.err <= 1e-3;
  }
  const bench::Timing t = bench::time_op(run, o.warmup, o.iters, s, &flush,
                                         fp4 ? "MQAL-PAGED-B64-fp4" : "MQAL-PAGED-B64");
  check_status(a.status, s);
  r.ms = t.median;
  r.min_ms = t.min;
  r.max_ms = t.max;
  r.bytes = double(batch) * len * tb;  // the pool's bytes of the keys read
  r.flop = 2.0 * kH * kD * double(batch * next_n) * double(len);
  return r;
}

// MQAL-TOPK-32K: mqa_logits_topk (top-2048) over MQAL-PREFILL-32K's rows through its default
// workspace; checked id for id against token_topk over the whole logits (computed once, untimed).
Result run_logits_topk(const msa_bench::LogitsBenchOptions& o, cudaStream_t s, const MqaLogitsArgs& a,
                       DeviceBuffer* flush) {
  const int64_t rows = a.q.values.shape[0], keys = a.k.values.shape[0];
  DeviceBuffer want = gpu_buffer(size_t(rows * kTopK * 4)), got = gpu_buffer(size_t(rows * kTopK * 4)),
               ws = gpu_buffer(size_t(mqa_logits_topk_workspace_bytes(rows, keys)));
  const Device gpu = a.q.values.device;
  TokenTopKArgs t;
  t.logits = a.logits;
  t.ks = a.ks;
  t.ke = a.ke;
  t.topk = kTopK;
  t.ids = Tensor(want.get(), DType::i32, {rows, int64_t(kTopK)}, gpu);
  t.status = a.status;
  token_topk(t, s);
  MqaLogitsTopKArgs f;
  f.q = a.q;
  f.k = a.k;
  f.weights = a.weights;
  f.ks = a.ks;
  f.ke = a.ke;
  f.topk = kTopK;
  f.ids = Tensor(got.get(), DType::i32, {rows, int64_t(kTopK)}, gpu);
  f.workspace = Tensor(ws.get(), DType::u8, {int64_t(ws.bytes())}, gpu);
  f.status = a.status;
  const auto run = [&] { mqa_logits_topk(f, s); };
  run();
  check_status(a.status, s);
  Result r;
  r.ok = !o.check || download<int32_t>(got.get(), size_t(rows * kTopK)) ==
                         download<int32_t>(want.get(), size_t(rows * kTopK));
  const bench::Timing tm = bench::time_op(run, o.warmup, o.iters, s, flush, "MQAL-TOPK-32K");
  check_status(a.status, s);
  r.ms = tm.median;
  r.min_ms = tm.min;
  r.max_ms = tm.max;
  r.bytes = double(keys) * (kD + 4);
  r.flop = 2.0 * kH * kD * double(rows) * double(rows + 1) / 2;
  return r;
}

// mode: 0 the logits (MQAL-PREFILL-32K), 1 token_topk on them (TOPK2048-32K), 2 mqa_logits_topk
// (MQAL-TOPK-32K).
Result run_prefill(const msa_bench::LogitsBenchOptions& o, cudaStream_t s, int mode) {
  const bool topk = mode == 1;
  const int64_t t_rows = o.seq, s_keys = o.seq;
  DeviceBuffer q = gpu_buffer(size_t(t_rows * kH * kD)), k = gpu_buffer(size_t(s_keys * kD)),
               ksc = gpu_buffer(size_t(s_keys * 4)), w = gpu_buffer(size_t(t_rows * kH * 4)),
               ks = gpu_buffer(size_t(t_rows * 4)), ke = gpu_buffer(size_t(t_rows * 4)),
               out = gpu_buffer(size_t(t_rows * s_keys * 4)), status = gpu_buffer(16),
               flush = gpu_buffer(size_t(256) << 20);
  fill_fp8<<<4096, 256, 0, s>>>(static_cast<uint8_t*>(q.get()), t_rows * kH * kD, 21);
  fill_fp8<<<1024, 256, 0, s>>>(static_cast<uint8_t*>(k.get()), s_keys * kD, 22);
  fill_uniform<<<256, 256, 0, s>>>(static_cast<float*>(ksc.get()), s_keys, 23, 0.5f, 1.f);
  fill_uniform<<<1024, 256, 0, s>>>(static_cast<float*>(w.get()), t_rows * kH, 24, -1.f, 2.f);
  std::vector<int32_t> lo(t_rows, 0), hi(t_rows);
  for (int64_t t = 0; t < t_rows; ++t) hi[t] = int32_t(t + 1);
  ks.upload(lo, s);
  ke.upload(hi, s);
  const Device gpu{DeviceType::cuda, 0};
  MqaLogitsArgs a;
  a.q = Tensor(q.get(), DType::fp8_e4m3, {t_rows, kH, kD}, gpu);
  a.k = QTensor(Tensor(k.get(), DType::fp8_e4m3, {s_keys, kD}, gpu),
                Tensor(ksc.get(), DType::f32, {s_keys}, gpu));
  a.weights = Tensor(w.get(), DType::f32, {t_rows, kH}, gpu);
  a.ks = Tensor(ks.get(), DType::i32, {t_rows}, gpu);
  a.ke = Tensor(ke.get(), DType::i32, {t_rows}, gpu);
  a.logits = Tensor(out.get(), DType::f32, {t_rows, s_keys}, gpu);
  a.status = Tensor(status.get(), DType::i32, {4}, gpu);
  clear_status(a.status, s);
  const auto run = [&] { mqa_logits(a, s); };
  run();
  check_status(a.status, s);
  if (topk)
    return run_topk(o, s, a.logits, a.ks, a.ke, lo, hi, a.status, &flush, "TOPK2048-32K",
                    {0, t_rows / 2, t_rows - 1});
  if (mode == 2) return run_logits_topk(o, s, a, &flush);
  Result r;
  if (o.check) {  // the first and the last row on the CPU
    auto k_h = download<uint8_t>(k.get(), size_t(s_keys * kD));
    auto sc_h = download<float>(ksc.get(), size_t(s_keys));
    r.err = 0;
    for (int64_t row : {int64_t(0), t_rows - 1}) {
      auto q_h = download<uint8_t>(static_cast<uint8_t*>(q.get()) + row * kH * kD, size_t(kH * kD));
      auto w_h = download<float>(static_cast<float*>(w.get()) + row * kH, size_t(kH));
      auto got = download<float>(static_cast<float*>(out.get()) + row * s_keys, size_t(s_keys));
      std::vector<float> want(static_cast<size_t>(s_keys));
      std::vector<int32_t> l = {0}, h = {int32_t(row + 1)};
      MqaLogitsArgs c;
      c.q = Tensor(q_h.data(), DType::fp8_e4m3, {1, kH, kD});
      c.k = QTensor(Tensor(k_h.data(), DType::fp8_e4m3, {s_keys, kD}), Tensor(sc_h.data(), DType::f32, {s_keys}));
      c.weights = Tensor(w_h.data(), DType::f32, {1, kH});
      c.ks = Tensor(l.data(), DType::i32, {1});
      c.ke = Tensor(h.data(), DType::i32, {1});
      c.logits = Tensor(want.data(), DType::f32, {1, s_keys});
      mqa_logits(c);
      const double e = rel_l2(got, want);
      r.err = std::isnan(e) ? e : std::max(r.err, e);
    }
    r.ok = r.err <= 1e-3;
  }
  const bench::Timing t = bench::time_op(run, o.warmup, o.iters, s, &flush, "MQAL-PREFILL-32K");
  check_status(a.status, s);
  r.ms = t.median;
  r.min_ms = t.min;
  r.max_ms = t.max;
  const double pairs = double(t_rows) * double(t_rows + 1) / 2;
  r.bytes = double(s_keys) * (kD + 4);
  r.flop = 2.0 * kH * kD * pairs;
  return r;
}


// SDSA-SELECT: indexer_threshold_select over B = 64 rows, one request each of 131072 NVFP4 keys
// (D 128, pages of 64, shuffled), NVFP4 queries. The thresholds come from the pipeline's own
// steps, untimed: gather every 16th key, score the sample, thresholds_from_sample for topk 2048
// at oversample 2. A timed run is one memset of the counts (the select needs them zero) and the
// select. The check: request 0's row on the CPU with the same threshold, equal counts and equal
// top_k_from_candidates ids.
Result run_sdsa_select(const msa_bench::LogitsBenchOptions& o, cudaStream_t s) {
  const int64_t batch = 64, len = 131072, ps = 64, stride = 16, topk = 2048;
  const int64_t per_req = len / ps, pages = batch * per_req, sample = len / stride;
  const int64_t cap = 4 * topk, tie_cap = topk;
  DeviceBuffer kv = gpu_buffer(size_t(pages * ps * kD / 2)), ksc = gpu_buffer(size_t(pages * ps * kD / 16)),
               q = gpu_buffer(size_t(batch * kD / 2)), qsc = gpu_buffer(size_t(batch * kD / 16)),
               tables = gpu_buffer(size_t(pages * 4)), lens = gpu_buffer(size_t(batch * 4)),
               reqs = gpu_buffer(size_t(batch * 4)), sv = gpu_buffer(size_t(batch * sample * kD / 2)),
               ssc = gpu_buffer(size_t(batch * sample * kD / 16)), slens = gpu_buffer(size_t(batch * 4)),
               stable = gpu_buffer(size_t(batch * 4)), sscores = gpu_buffer(size_t(batch * sample * 4)),
               thr = gpu_buffer(size_t(batch * 4)), cand = gpu_buffer(size_t(batch * cap * 8)),
               ties = gpu_buffer(size_t(batch * tie_cap * 4)), counts = gpu_buffer(size_t(batch * 12)),
               ids = gpu_buffer(size_t(batch * topk * 4)), rstat = gpu_buffer(size_t(batch * 4)),
               status = gpu_buffer(16), flush = gpu_buffer(size_t(256) << 20);
  fill_bytes<<<4096, 256, 0, s>>>(static_cast<uint8_t*>(kv.get()), pages * ps * kD / 2, 31);
  fill_e4m3_uniform<<<4096, 256, 0, s>>>(static_cast<uint8_t*>(ksc.get()), pages * ps * kD / 16, 32, 0.5f, 1.f);
  fill_bytes<<<64, 256, 0, s>>>(static_cast<uint8_t*>(q.get()), batch * kD / 2, 33);
  fill_e4m3_uniform<<<64, 256, 0, s>>>(static_cast<uint8_t*>(qsc.get()), batch * kD / 16, 34, 0.5f, 1.f);
  std::vector<int32_t> order(static_cast<size_t>(pages)), lens_h(batch, int32_t(len)), reqs_h(batch), st_h(batch);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(35));
  std::iota(reqs_h.begin(), reqs_h.end(), 0);
  std::iota(st_h.begin(), st_h.end(), 0);
  tables.upload(order, s);
  lens.upload(lens_h, s);
  reqs.upload(reqs_h, s);
  stable.upload(st_h, s);
  const Device gpu{DeviceType::cuda, 0};
  const float kglobal = 0.0123f, qglobal = 0.731f;
  IndexKeyCache cache;
  cache.key_cache = QTensor(Tensor(kv.get(), DType::fp4x2, {pages, ps, kD / 2}, gpu),
                            Tensor(ksc.get(), DType::fp8_e4m3, {pages, ps, kD / 16}, gpu), kglobal);
  cache.block_table = Tensor(tables.get(), DType::i32, {batch, per_req}, gpu);
  cache.seq_lens = Tensor(lens.get(), DType::i32, {batch}, gpu);
  IndexQueryRows rows;
  rows.query = QTensor(Tensor(q.get(), DType::fp4x2, {batch, kD / 2}, gpu),
                       Tensor(qsc.get(), DType::fp8_e4m3, {batch, kD / 16}, gpu), qglobal);
  rows.row_requests = Tensor(reqs.get(), DType::i32, {batch}, gpu);
  const Tensor st(status.get(), DType::i32, {4}, gpu);
  clear_status(st, s);
  // The thresholds, as the pipeline computes them.
  GatherKeySampleArgs g;
  g.cache = cache;
  g.stride = int(stride);
  g.sample = QTensor(Tensor(sv.get(), DType::fp4x2, {batch, sample, kD / 2}, gpu),
                     Tensor(ssc.get(), DType::fp8_e4m3, {batch, sample, kD / 16}, gpu));
  g.sample_lens = Tensor(slens.get(), DType::i32, {batch}, gpu);
  g.status = st;
  gather_key_sample(g, s);
  IndexerScoresArgs sc;
  sc.rows = rows;
  sc.cache.key_cache = QTensor(Tensor(sv.get(), DType::fp4x2, {batch, sample, kD / 2}, gpu),
                               Tensor(ssc.get(), DType::fp8_e4m3, {batch, sample, kD / 16}, gpu), kglobal);
  sc.cache.block_table = Tensor(stable.get(), DType::i32, {batch, 1}, gpu);
  sc.cache.seq_lens = g.sample_lens;
  sc.scores = Tensor(sscores.get(), DType::f32, {batch, sample}, gpu);
  sc.status = st;
  indexer_scores(sc, s);
  ThresholdsFromSampleArgs th;
  th.sample_scores = sc.scores;
  th.topk = int(topk);
  th.sample_stride = int(stride);
  th.oversample = 2.0;
  th.thresholds = Tensor(thr.get(), DType::f32, {batch}, gpu);
  th.counts = Tensor(counts.get(), DType::i32, {batch, 3}, gpu);
  thresholds_from_sample(th, s);
  ThresholdSelectArgs a;
  a.rows = rows;
  a.cache = cache;
  a.thresholds = th.thresholds;
  a.candidates = Tensor(cand.get(), DType::i32, {batch, cap, 2}, gpu);
  a.ties = Tensor(ties.get(), DType::i32, {batch, tie_cap}, gpu);
  a.counts = th.counts;
  a.status = st;
  const auto run = [&] {
    MSA_BENCH_CUDA(cudaMemsetAsync(counts.get(), 0, size_t(batch * 12), s));
    indexer_threshold_select(a, s);
  };
  run();
  check_status(st, s);
  TopKFromCandidatesArgs tk;
  tk.candidates = a.candidates;
  tk.ties = a.ties;
  tk.counts = a.counts;
  tk.topk = int(topk);
  tk.ids = Tensor(ids.get(), DType::i32, {batch, topk}, gpu);
  tk.row_status = Tensor(rstat.get(), DType::i32, {batch}, gpu);
  top_k_from_candidates(tk, s);
  Result r;
  if (o.check) {  // request 0 on the CPU: its pages in table order as a one-request pool
    std::vector<uint8_t> kv_h(size_t(per_req * ps * kD / 2)), sc_h(size_t(per_req * ps * kD / 16));
    for (int64_t c = 0; c < per_req; ++c) {
      MSA_BENCH_CUDA(cudaMemcpy(kv_h.data() + c * ps * kD / 2,
                                static_cast<uint8_t*>(kv.get()) + int64_t(order[c]) * ps * kD / 2,
                                ps * kD / 2, cudaMemcpyDeviceToHost));
      MSA_BENCH_CUDA(cudaMemcpy(sc_h.data() + c * ps * kD / 16,
                                static_cast<uint8_t*>(ksc.get()) + int64_t(order[c]) * ps * kD / 16,
                                ps * kD / 16, cudaMemcpyDeviceToHost));
    }
    auto q_h = download<uint8_t>(q.get(), size_t(kD / 2));
    auto qs_h = download<uint8_t>(qsc.get(), size_t(kD / 16));
    auto thr_h = download<float>(thr.get(), 1);
    auto counts_h = download<int32_t>(counts.get(), 3);
    auto cand_h = download<int32_t>(cand.get(), size_t(cap * 2));
    auto ties_h = download<int32_t>(ties.get(), size_t(tie_cap));
    auto ids_h = download<int32_t>(ids.get(), size_t(topk));
    std::vector<int32_t> table_h(static_cast<size_t>(per_req)), one_len = {int32_t(len)}, zero = {0};
    std::iota(table_h.begin(), table_h.end(), 0);
    std::vector<int32_t> want_cand(static_cast<size_t>(cap * 2)), want_ties(static_cast<size_t>(tie_cap)),
        want_counts(3, 0),
        want_ids(static_cast<size_t>(topk)), want_rs(1);
    ThresholdSelectArgs c;
    c.rows.query = QTensor(Tensor(q_h.data(), DType::fp4x2, {1, kD / 2}),
                           Tensor(qs_h.data(), DType::fp8_e4m3, {1, kD / 16}), qglobal);
    c.rows.row_requests = Tensor(zero.data(), DType::i32, {1});
    c.cache.key_cache = QTensor(Tensor(kv_h.data(), DType::fp4x2, {per_req, ps, kD / 2}),
                                Tensor(sc_h.data(), DType::fp8_e4m3, {per_req, ps, kD / 16}), kglobal);
    c.cache.block_table = Tensor(table_h.data(), DType::i32, {1, per_req});
    c.cache.seq_lens = Tensor(one_len.data(), DType::i32, {1});
    c.thresholds = Tensor(thr_h.data(), DType::f32, {1});
    c.candidates = Tensor(want_cand.data(), DType::i32, {1, cap, 2});
    c.ties = Tensor(want_ties.data(), DType::i32, {1, tie_cap});
    c.counts = Tensor(want_counts.data(), DType::i32, {1, 3});
    indexer_threshold_select(c);
    TopKFromCandidatesArgs ck;
    ck.candidates = c.candidates;
    ck.ties = c.ties;
    ck.counts = c.counts;
    ck.topk = int(topk);
    ck.ids = Tensor(want_ids.data(), DType::i32, {1, topk});
    ck.row_status = Tensor(want_rs.data(), DType::i32, {1});
    top_k_from_candidates(ck);
    r.ok = counts_h == want_counts && ids_h == want_ids && want_rs[0] == 0;
    r.err = r.ok ? 0.0 : 1.0;
    std::fprintf(stderr, "  SDSA-SELECT row 0: counts (%d, %d, %d), CPU (%d, %d, %d), status %d\n",
                 counts_h[0], counts_h[1], counts_h[2], want_counts[0], want_counts[1],
                 want_counts[2], want_rs[0]);
  }
  const bench::Timing t = bench::time_op(run, o.warmup, o.iters, s, &flush, "SDSA-SELECT");
  check_status(st, s);
  r.ms = t.median;
  r.min_ms = t.min;
  r.max_ms = t.max;
  r.bytes = double(batch) * len * (kD / 2 + kD / 16);  // key codes and scale bytes
  r.flop = 2.0 * kD * double(batch) * double(len);
  return r;
}

}  // namespace

int msa_bench::run_logits_bench(std::vector<std::string> names, const LogitsBenchOptions& o) {
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "bench_logits: no CUDA device\n");
    return 2;
  }
  if (names.empty())
    names = {"MQAL-PAGED-B64", "MQAL-PAGED-B64-fp4", "MQAL-PREFILL-32K", "TOPK2048-B64",
             "TOPK2048-32K", "MQAL-TOPK-32K", "SDSA-SELECT"};
  cudaStream_t s;
  MSA_BENCH_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int rc = 0;
  for (const std::string& n : names) {
    Result r;
    std::string op;
    const bool fp4 = n == "MQAL-PAGED-B64-fp4";
    const bool paged = n == "MQAL-PAGED-B64" || fp4 || n == "TOPK2048-B64";
    const bool topk = n.rfind("TOPK", 0) == 0;
    const bool fused = n == "MQAL-TOPK-32K";  // ids checked, rated as the logits
    const bool sdsa = n == "SDSA-SELECT";
    if (n == "MQAL-PAGED-B64" || fp4 || n == "TOPK2048-B64") {
      r = run_paged(o, s, topk, fp4);
      op = topk ? "token_topk" : "paged_mqa_logits";
    } else if (n == "MQAL-PREFILL-32K" || n == "TOPK2048-32K") {
      r = run_prefill(o, s, topk ? 1 : 0);
      op = topk ? "token_topk" : "mqa_logits";
    } else if (n == "MQAL-TOPK-32K") {
      r = run_prefill(o, s, 2);
      op = "mqa_logits_topk";
    } else if (sdsa) {
      r = run_sdsa_select(o, s);
      op = "indexer_threshold_select";
    } else {
      std::fprintf(stderr, "unknown logits case %s\n", n.c_str());
      rc = 2;
      continue;
    }
    const double tbs = r.bytes / (r.ms * 1e-3) / 1e12, tfs = r.flop / (r.ms * 1e-3) / 1e12;
    if (topk)
      std::printf("%-18s median %9.1f us [%9.1f, %9.1f]  %6.3f TB/s of logits and ids  check ids %s\n",
                  n.c_str(), r.ms * 1e3, r.min_ms * 1e3, r.max_ms * 1e3, tbs,
                  !o.check ? "skipped" : r.ok ? "ok" : "FAILED");
    else if (fused)
      std::printf("%-18s median %9.1f us [%9.1f, %9.1f]  %7.1f TFLOP/s  check ids %s\n", n.c_str(),
                  r.ms * 1e3, r.min_ms * 1e3, r.max_ms * 1e3, tfs, !o.check ? "skipped" : r.ok ? "ok" : "FAILED");
    else
      std::printf("%-18s median %9.1f us [%9.1f, %9.1f]  %7.1f TFLOP/s  %6.3f TB/s of keys  check rel_l2 %.2e %s\n",
                n.c_str(), r.ms * 1e3, r.min_ms * 1e3, r.max_ms * 1e3, tfs, tbs, r.err,
                !o.check ? "skipped" : r.ok ? "ok" : "FAILED");
    std::fflush(stdout);
    if (o.check && !r.ok) rc = std::max(rc, 1);
    if (!o.json.empty()) {
      bench::Json rec = bench::new_record(n, op);
      rec["batch"] = paged || sdsa ? 64 : 1;
      rec["seq_k"] = paged ? 32768 : sdsa ? 131072 : o.seq;
      rec["hq"] = sdsa ? 1 : kH;
      rec["d"] = kD;
      if (topk) {
        rec["topk"] = kTopK;
        rec["rows"] = paged ? 128 : o.seq;
        bench::add_dtypes(rec, "f32", "f32");
      } else if (sdsa) {
        bench::add_dtypes(rec, "fp4x2", "fp4x2", "nvfp4");
      } else if (fused) {
        rec["topk"] = kTopK;
        bench::add_dtypes(rec, "fp8_e4m3", "fp8_e4m3", "token");
      } else if (fp4) {
        bench::add_dtypes(rec, "fp4x2", "fp4x2", "mxfp4");
      } else {
        bench::add_dtypes(rec, "fp8_e4m3", "fp8_e4m3", "token");
      }
      bench::add_timing(rec, {r.ms, r.min_ms, r.max_ms}, o.iters, o.warmup, topk ? 0.0 : r.flop,
                        r.bytes, paged || topk || sdsa ? bench::Metric::tbps : bench::Metric::tflops);
      // SDSA: exact (row 0's counts and ids equal to the CPU's); token top-K: ids checked
      bench::add_check(rec, bench::check_result(o.check, r.ok),
                       !o.check || topk || fused ? bench::Json()
                       : sdsa          ? bench::Json{{"row0_mismatch", r.ok ? 0 : 1}}
                                       : bench::Json{{"out_rel_l2", r.err}});
      bench::add_environment(rec, true, bench::flush_name());
      bench::append_record(o.json, rec);
    }
  }
  cudaStreamDestroy(s);
  return rc;
}
