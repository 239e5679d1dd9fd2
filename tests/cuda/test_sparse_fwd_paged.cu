// GPU sparse attention forward over paged KV (src/cuda/sm90/sparse_fwd: kv_load.cuh, paged_checks.cuh)
// against the CPU reference: page sizes 16-256 in both pool layouts, G 1/4/16, causal both ways,
// varlen batches with empty requests, shuffled page tables, seqused_k below what the pages hold,
// NaN in every unused slot and unselected block, per-token and block-uniform selections,
// poisoned outputs with every element checked, paged == flat bitwise on the same logical KV,
// and device-reported bad page ids / lengths. MSA_TEST_SMALL=1 shortens every request.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <string>

#include "support/sparse_case.h"

namespace msa::test {
namespace {

struct Result {
  HostTensor out, lse;
};

Result make_result(const SparseCase& c) {
  const int64_t tq = c.p.total_q();
  return Result{HostTensor(c.p.out_dtype(), {tq, c.p.hq, c.p.dim}), HostTensor(DType::f32, {c.p.hq, tq})};
}

// The CPU backend on the flat KV the pool was built from.
Result run_cpu(const SparseCase& c) {
  Result r = make_result(c);
  AttentionArgs a = cpu_args(c);
  a.out = r.out.t;
  a.lse = r.lse.t;
  attention_forward(a);
  return r;
}

// The case's inputs on the device: q, q2k, cu_seqlens and both KV forms (flat and paged).
struct DeviceInputs {
  DeviceTensor q, cu_q, q2k;
  DeviceQTensor k, v;  // values with their FP8 scales, if any
  DeviceTensor cu_k;
  DeviceQTensor pool_k, pool_v;
  DeviceTensor page_table, seqused_k;
  std::optional<DeviceTensor> causal_offset, q_scale;
  KVLayout layout;
  float k_global, v_global;  // NVFP4

  DeviceInputs(const SparseCase& c, const PagedKV& h, cudaStream_t s)
      : q(to_device(c.p.q, s)), cu_q(to_device(c.p.cu_q, s)), q2k(to_device(c.q2k, s)),
        k(to_device(c.p.k, c.p.k_scale, s)), v(to_device(c.p.v, c.p.v_scale, s)),
        cu_k(to_device(c.p.cu_k, s)), pool_k(to_device(h.k, h.k_scale, s)),
        pool_v(to_device(h.v, h.v_scale, s)),
        page_table(to_device(h.page_table, s)), seqused_k(to_device(h.seqused_k, s)),
        layout(h.layout), k_global(c.p.k_global), v_global(c.p.v_global) {
    if (c.causal_offset) causal_offset = to_device(*c.causal_offset, s);
    if (c.p.q_scale) q_scale = to_device(*c.p.q_scale, s);
  }
  KVCache flat() const {
    KVCache kv;
    kv.k = k.view();
    kv.v = v.view();
    kv.k.global_scale = k_global;
    kv.v.global_scale = v_global;
    kv.cu_seqlens_k = cu_k.t;
    return kv;
  }
  KVCache paged(bool with_seqused = true) const {
    KVCache kv;
    kv.k = pool_k.view();
    kv.v = pool_v.view();
    kv.k.global_scale = k_global;
    kv.v.global_scale = v_global;
    kv.layout = layout;
    kv.page_table = page_table.t;
    if (with_seqused) kv.seqused_k = seqused_k.t;
    return kv;
  }
};

// Runs the GPU forward into poisoned outputs (and a poisoned workspace) on a fresh status;
// throws msa::Error for an offence the device reported.
Result run_gpu(const SparseCase& c, const DeviceInputs& d, const KVCache& kv, cudaStream_t s) {
  Result host = make_result(c);
  DeviceTensor out = device_like(host.out, s), lse = device_like(host.lse, s);
  AttentionArgs a;
  a.params = params_of(c);
  a.q = d.q.t;
  a.kv = kv;
  a.cu_seqlens_q = d.cu_q.t;
  if (!c.dense) a.q2k = d.q2k.t;
  if (d.causal_offset) a.causal_offset = d.causal_offset->t;
  if (d.q_scale) a.q_scale = d.q_scale->t;
  a.out = out.t;
  a.lse = lse.t;
  DeviceBuffer status(16);
  a.status = Tensor(status.get(), DType::i32, {4}, gpu0());
  clear_status(a.status, s);
  run_attention_poisoned_workspace(a, s);
  copy_to_host(out, host.out, s);
  copy_to_host(lse, host.lse, s);
  check_status(a.status, s);
  return host;
}

// docs/semantics.md, Numerics, on out and lse (sparse_case.h); FP8 / FP4 K/V within 3e-2.
void expect_close(const Result& gpu, const Result& ref, bool quantized = false) {
  expect_out_close(gpu.out, ref.out, quantized ? 3e-2 : 1e-2);
  expect_stat_close(gpu.lse, ref.lse, "lse", quantized ? 3e-2 : 2e-3);
}

void expect_bitwise(const Result& a, const Result& b) {
  EXPECT_EQ(std::memcmp(a.out.t.data, b.out.t.data, a.out.bytes()), 0) << "out differs";
  EXPECT_EQ(std::memcmp(a.lse.t.data, b.lse.t.data, a.lse.bytes()), 0) << "lse differs";
}

struct Spec {
  const char* name;
  std::vector<int32_t> lq, lk;
  int64_t g, hkv, topk;
  bool causal, blk;       // blk: block-uniform selections (the uniform Q-major path)
  int64_t page_size;
  KVLayout layout;
  int64_t row_pad = 0;    // pool row = D + row_pad elements: non-contiguous strides
  DType dtype = DType::bf16;
  bool spare_columns = false;  // page-table columns past seqused_k hold valid ids of real pages
  std::optional<Fp8Scale> fp8;  // FP8 e4m3 K/V with scales of this kind (bf16 q)
  int fp4 = 0;                  // 1: NVFP4, 2: MXFP4 K/V (bf16 q)
  bool dense = false;           // no q2k: every visible key (topk, blk unused)
  bool offsets = false;         // random per-batch causal offsets (causal specs)
  bool fp8_q = false;           // e4m3 q with per-token-head scales (with fp8: QK in FP8)
  int64_t kv_block = 128;       // keys per kv block of the q2k ids (kv_block_size)
  int64_t dim = 128;            // head dim
};

// A SparseCase from a spec: random q2k (-1 slots, sometimes unsorted) and NaN in every K/V row
// of a block its kv head never selects. small: requests shortened for the sanitizer runs.
// Per-batch causal offsets for c: the default diagonal, ones that hide every key, cut inside the
// request, or pass its last key.
void add_offsets(SparseCase& c, unsigned seed) {
  std::mt19937 rng(seed);
  HostTensor off(DType::i32, {c.p.batch()});
  for (int64_t b = 0; b < c.p.batch(); ++b) {
    const int32_t lq = c.p.lq[b], lk = c.p.lk[b];
    const int32_t picks[] = {lk - lq, -1 - int32_t(rng() % 100), int32_t(rng() % (lk + 1)),
                             lk + 5, lk - lq - 77};
    off.data<int32_t>()[b] = picks[rng() % 5];
  }
  c.causal_offset = std::move(off);
}

SparseCase make_case(const Spec& sp, unsigned seed, bool small) {
  std::vector<int32_t> lq = sp.lq, lk = sp.lk;
  if (small)
    for (size_t b = 0; b < lq.size(); ++b) {
      lq[b] = std::min(lq[b], 150);
      lk[b] = std::min(lk[b], 300);
    }
  std::mt19937 rng(seed);
  Problem prob = make_problem(lq, lk, sp.g * sp.hkv, sp.hkv, sp.dim, seed,
                              sp.fp8_q ? DType::fp8_e4m3 : sp.dtype,
                              sp.fp8 ? DType::fp8_e4m3 : sp.dtype, sp.fp8.value_or(Fp8Scale::none));
  if (sp.dense) {  // every key is attended: NaN only in the pool's unused slots (make_paged)
    SparseCase c = dense_case(std::move(prob), sp.causal);
    if (sp.fp4) quantize_kv_fp4(c.p, sp.fp4 == 1);
    if (sp.offsets) add_offsets(c, seed);
    c.name = sp.name;
    return c;
  }
  HostTensor ids = indexer_like_q2k(prob, sp.topk, sp.causal, rng, sp.blk, sp.kv_block);
  SparseCase c(std::move(prob), std::move(ids), sp.topk, sp.kv_block);
  c.causal = sp.causal;
  if (seed % 3) c.partial = seed % 3 == 1 ? DType::bf16 : DType::f32;  // 0: the default
  poison_unselected(c.p, c.q2k, c.topk, sp.kv_block);
  if (sp.fp4) quantize_kv_fp4(c.p, sp.fp4 == 1);  // the NaN rows get NaN block scales
  if (sp.offsets) add_offsets(c, seed);
  c.name = sp.name;
  return c;
}

// Page-table columns a request does not use point at real pages (other requests' keys): a
// kernel that read past seqused_k would attend them.
void fill_spare_columns(PagedKV& h, const std::vector<int32_t>& lk, int64_t page_size) {
  const int64_t batch = h.page_table.t.shape[0], cols = h.page_table.t.shape[1];
  const int64_t pages = h.k.t.shape[0];
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t col = (lk[b] + page_size - 1) / page_size; col < cols; ++col)
      h.page_table.data<int32_t>()[b * cols + col] = int32_t((b * 7 + col) % pages);
}

// Each spec (seeds from `seed` + 1): GPU paged vs the CPU reference, and GPU paged == GPU flat
// bitwise on the same logical KV.
template <size_t N>
void run_specs(const Spec (&specs)[N], unsigned seed, bool small, cudaStream_t s) {
  for (const Spec& sp : specs) {
    SparseCase c = make_case(sp, ++seed, small);
    SCOPED_TRACE(c.name);
    PagedKV h = make_paged(c.p, sp.layout, sp.page_size, seed, sp.row_pad);
    if (sp.spare_columns) fill_spare_columns(h, c.p.lk, sp.page_size);
    DeviceInputs d(c, h, s);
    const Result paged = run_gpu(c, d, d.paged(), s);
    expect_close(paged, run_cpu(c), /*quantized=*/sp.fp8.has_value() || sp.fp4 != 0 || sp.fp8_q);
    expect_bitwise(paged, run_gpu(c, d, d.flat(), s));
    if (::testing::Test::HasFailure()) break;
  }
}

// Every page size in both layouts, G 1/4/16, causal both ways, lengths that are not multiples of
// 128 or of the page size, requests without keys or queries, Lq > Lk, tok and blk selections.
// Each: GPU paged vs the CPU reference, and GPU paged == GPU flat bitwise.
TEST(SparseFwdPagedGpu, PageSizesLayoutsMatchCpu) {
  MSA_REQUIRE_GPU();
  const bool small = small_tests();
  TestStream s;
  const KVLayout nhd = KVLayout::paged_nhd, hnd = KVLayout::paged_hnd;
  const Spec specs[] = {
      {"ps16 nhd G1", {300, 0, 77}, {300, 50, 200}, 1, 2, 4, true, false, 16, nhd},
      {"ps16 hnd G4 non-causal", {200, 5, 130}, {513, 0, 130}, 4, 2, 8, false, false, 16, hnd},
      {"ps32 nhd G16 blk", {260, 17}, {260, 700}, 16, 1, 4, true, true, 32, nhd},
      {"ps32 hnd G1 padded rows", {100, 0, 90}, {333, 0, 257}, 1, 3, 4, false, false, 32, hnd, 8},
      {"ps64 nhd G4 blk f16 padded", {257, 40, 0, 9}, {400, 0, 5, 130}, 4, 2, 4, true, true, 64,
       nhd, 8, DType::f16},
      {"ps64 hnd G16 spare columns", {200, 64}, {90, 640}, 16, 1, 8, true, false, 64, hnd, 0,
       DType::bf16, true},
      {"ps128 nhd G1 blk", {129, 0, 300}, {129, 0, 1000}, 1, 2, 8, true, true, 128, nhd},
      {"ps128 hnd G4 non-causal f16", {150, 33}, {383, 129}, 4, 2, 4, false, false, 128, hnd, 0,
       DType::f16},
      {"ps256 nhd G16", {300, 1}, {700, 257}, 16, 1, 4, true, false, 256, nhd},
      {"ps256 hnd G4 blk padded spare", {333, 0}, {600, 0}, 4, 2, 4, true, true, 256, hnd, 8,
       DType::bf16, true},
      {"ps16 nhd G16 blk non-causal", {128, 70}, {200, 1100}, 16, 1, 8, false, true, 16, nhd},
      {"ps256 nhd G1 one key", {1, 3}, {1, 3}, 1, 1, 2, true, false, 256, nhd},
  };
  run_specs(specs, 9000, small, s);
}

// 64-key kv blocks over pools: page sizes below, at and above the block (boxes of at most 64
// slots), both layouts, tok and blk selections, FP8 and FP4 pools, FP8 q over FP8 pools (Q K^T in
// FP8: scales per slot, slot and head, tensor), causal offsets; GPU paged vs the CPU reference and
// paged == flat bitwise.
TEST(SparseFwdPagedGpu, Blocks64MatchCpu) {
  MSA_REQUIRE_GPU();
  const bool small = small_tests();
  TestStream s;
  const KVLayout nhd = KVLayout::paged_nhd, hnd = KVLayout::paged_hnd;
  Spec specs[] = {
      {"b64 ps16 nhd G1", {300, 0, 77}, {300, 50, 200}, 1, 2, 8, true, false, 16, nhd},
      {"b64 ps32 hnd G4 blk padded", {200, 5, 130}, {513, 0, 130}, 4, 2, 8, true, true, 32, hnd, 8},
      {"b64 ps64 nhd G16 blk f16", {260, 17}, {260, 700}, 16, 1, 6, true, true, 64, nhd, 0,
       DType::f16},
      {"b64 ps128 hnd G8 spare columns", {129, 0, 300}, {129, 0, 1000}, 8, 1, 16, true, false, 128,
       hnd, 0, DType::bf16, true},
      {"b64 ps256 nhd G2 non-causal", {150, 33}, {383, 65}, 2, 2, 4, false, false, 256, nhd},
      {"b64 ps64 nhd G4 fp8 per slot", {200, 40}, {450, 63}, 4, 2, 8, true, false, 64, nhd, 0,
       DType::bf16, false, Fp8Scale::per_token},
      {"b64 ps32 hnd G16 blk nvfp4", {140, 9}, {300, 64}, 16, 1, 8, true, true, 32, hnd, 0,
       DType::bf16, false, std::nullopt, 1},
      {"b64 ps128 nhd G4 offsets", {100, 70}, {300, 200}, 4, 2, 8, true, false, 128, nhd, 0,
       DType::bf16, false, std::nullopt, 0, false, true},
      {"b64 fp8 qk ps32 nhd G4 token scales", {300, 0, 77}, {300, 50, 200}, 4, 2, 8, true, false,
       32, nhd, 0, DType::bf16, false, Fp8Scale::per_token, 0, false, false, true},
      {"b64 fp8 qk ps64 hnd G16 blk token-head padded", {260, 17}, {260, 700}, 16, 1, 8, true,
       true, 64, hnd, 16, DType::bf16, false, Fp8Scale::per_token_head, 0, false, false, true},
      {"b64 fp8 qk ps128 nhd G1 blk tensor spare", {129, 0, 300}, {129, 0, 1000}, 1, 2, 8, true,
       true, 128, nhd, 0, DType::bf16, true, Fp8Scale::per_tensor, 0, false, false, true},
  };
  for (Spec& sp : specs) sp.kv_block = 64;
  run_specs(specs, 9900, small, s);
}

// Sparse attention at head dims 64 and 256 over pools (the KV-major and uniform kernels at that
// D; at 256 boxes of at most 64 slots): page sizes 16-256 in both layouts, 128- and 64-key blocks,
// tok and blk selections, padded rows, spare columns, causal offsets, dense calls beside them;
// GPU paged vs the CPU reference and paged == flat bitwise.
TEST(SparseFwdPagedGpu, HeadDimsMatchCpu) {
  MSA_REQUIRE_GPU();
  const bool small = small_tests();
  TestStream s;
  const KVLayout nhd = KVLayout::paged_nhd, hnd = KVLayout::paged_hnd;
  Spec specs[] = {
      {"ps16 nhd G1", {300, 0, 77}, {300, 50, 200}, 1, 2, 4, true, false, 16, nhd},
      {"b64 ps32 hnd G4 blk padded", {200, 5, 130}, {513, 0, 130}, 4, 2, 8, true, true, 32, hnd,
       8},
      {"ps64 nhd G16 blk f16", {260, 17}, {260, 700}, 16, 1, 6, true, true, 64, nhd, 0,
       DType::f16},
      {"b64 ps128 hnd G8 spare columns", {129, 0, 300}, {129, 0, 1000}, 8, 1, 16, true, false,
       128, hnd, 0, DType::bf16, true},
      {"ps256 nhd G2 non-causal", {150, 33}, {383, 65}, 2, 2, 4, false, false, 256, nhd},
      {"b64 ps128 nhd G4 offsets", {100, 70}, {300, 200}, 4, 2, 8, true, false, 128, nhd, 0,
       DType::bf16, false, std::nullopt, 0, false, true},
      {"ps64 hnd G4 dense", {90, 7}, {300, 129}, 4, 2, 0, true, false, 64, hnd, 0, DType::bf16,
       false, std::nullopt, 0, true},
  };
  for (const int64_t dim : {64, 256}) {
    int i = 0;
    for (Spec& sp : specs) {
      sp.dim = dim;
      if (i++ % 2) sp.kv_block = 64;  // the specs named b64
    }
    SCOPED_TRACE("D " + std::to_string(dim));
    run_specs(specs, dim == 64 ? 9950 : 9970, small, s);
    if (HasFailure()) break;
  }
}

// Dense attention at head dim 32 over pools: D = 64's tiles over 32-column pool maps (boxes wider
// than the tensor: TMA fills columns 32-63 with zeros), both layouts, padded rows, offsets, spare
// columns; a test of its own, so a failure of that load scheme shows alone.
TEST(SparseFwdPagedGpu, DenseHeadDim32MatchesCpu) {
  MSA_REQUIRE_GPU();
  const bool small = small_tests();
  TestStream s;
  const KVLayout nhd = KVLayout::paged_nhd, hnd = KVLayout::paged_hnd;
  const Spec d32[] = {
      {"D 32 ps16 nhd G4 dense", {90, 7}, {300, 129}, 4, 2, 0, true, false, 16, nhd, 0,
       DType::bf16, false, std::nullopt, 0, true, false, false, 128, 32},
      {"D 32 ps64 hnd G16 dense padded f16", {200, 0, 33}, {513, 0, 700}, 16, 1, 0, true, false,
       64, hnd, 8, DType::f16, false, std::nullopt, 0, true, false, false, 128, 32},
      {"D 32 ps256 nhd G8 dense offsets spare", {150, 33}, {383, 65}, 8, 2, 0, true, false, 256,
       nhd, 0, DType::bf16, true, std::nullopt, 0, true, true, false, 128, 32},
      {"D 32 ps128 hnd G1 dense non-causal", {129, 1}, {129, 1}, 1, 3, 0, false, false, 128, hnd,
       0, DType::bf16, false, std::nullopt, 0, true, false, false, 128, 32},
  };
  run_specs(d32, 9990, small, s);
}

// Token ids (kv_block_size 1: the token kernel, token_kernel.cuh): every page size in both
// layouts, padded rows, spare columns, causal offsets, a G of 64 and 128 on one kv head, top-K
// past the keys and far below them, requests without keys or queries, FP8 pools with per-slot
// scales and an NVFP4 pool, at head dims 128, 64 and 256. Each: GPU paged vs the CPU reference,
// and paged == flat bitwise.
TEST(SparseFwdPagedGpu, TokenIdsMatchCpu) {
  MSA_REQUIRE_GPU();
  const bool small = small_tests();
  TestStream s;
  const KVLayout nhd = KVLayout::paged_nhd, hnd = KVLayout::paged_hnd;
  Spec specs[] = {
      {"tok ps16 nhd G1", {300, 0, 77}, {300, 50, 200}, 1, 2, 64, true, false, 16, nhd},
      {"tok ps32 hnd G4 padded non-causal", {200, 5, 130}, {513, 0, 130}, 4, 2, 100, false, false,
       32, hnd, 8},
      {"tok ps64 nhd G16 f16", {260, 17}, {260, 700}, 16, 1, 300, true, false, 64, nhd, 0,
       DType::f16},
      {"tok ps128 hnd G64 spare columns", {40, 0, 30}, {129, 0, 1000}, 64, 1, 512, true, false,
       128, hnd, 0, DType::bf16, true},
      {"tok ps256 nhd G128 K2048", {20, 9}, {2500, 9}, 128, 1, 2048, true, false, 256, nhd},
      {"tok ps64 nhd G8 offsets", {100, 70}, {300, 200}, 8, 2, 37, true, false, 64, nhd, 0,
       DType::bf16, false, std::nullopt, 0, false, true},
      {"tok ps16 hnd G48", {30, 12}, {700, 12}, 48, 1, 1000, true, false, 16, hnd, 16},
      {"tok ps64 nhd G16 fp8 per slot", {200, 40}, {450, 63}, 16, 1, 200, true, false, 64, nhd,
       0, DType::bf16, false, Fp8Scale::per_token},
      {"tok ps32 hnd G4 fp8 per slot and head padded", {100, 9}, {300, 64}, 4, 2, 64, true, false,
       32, hnd, 16, DType::bf16, false, Fp8Scale::per_token_head},
      {"tok ps128 nhd G64 nvfp4", {30, 9}, {900, 64}, 64, 1, 512, true, false, 128, nhd, 0,
       DType::bf16, false, std::nullopt, 1},
  };
  for (Spec& sp : specs) sp.kv_block = 1;
  run_specs(specs, 12400, small, s);
  if (HasFailure()) return;
  // The same pools at head dims 64 and 256 (the token kernel per head dim).
  for (const int64_t dim : {64, 256}) {
    for (Spec& sp : specs) sp.dim = dim;
    SCOPED_TRACE("D " + std::to_string(dim));
    run_specs(specs, dim == 64 ? 12500 : 12600, small, s);
    if (HasFailure()) return;
  }
}

// bf16 q over FP8 pools (per tensor, per slot, per slot and head scales; the slots that hold no key
// have NaN scales) and FP4 pools (NVFP4, MXFP4; scale pools of the values' layout), both layouts,
// padded rows, spare columns, tok and blk: GPU paged vs the CPU reference, and paged == flat
// bitwise (both run on the same dequantized bf16 rows).
TEST(SparseFwdPagedGpu, QuantizedPoolsMatchCpu) {
  MSA_REQUIRE_GPU();
  const bool small = small_tests();
  TestStream s;
  const KVLayout nhd = KVLayout::paged_nhd, hnd = KVLayout::paged_hnd;
  const DType bf = DType::bf16;
  const Spec specs[] = {
      {"fp8 ps16 nhd G4 token scales", {300, 0, 77}, {300, 50, 200}, 4, 2, 4, true, false, 16, nhd,
       0, bf, false, Fp8Scale::per_token},
      {"fp8 ps64 hnd G16 blk token-head padded", {260, 17}, {260, 700}, 16, 1, 8, true, true, 64,
       hnd, 16, bf, false, Fp8Scale::per_token_head},
      {"fp8 ps128 nhd G1 tensor spare", {129, 0, 300}, {129, 0, 1000}, 1, 2, 8, true, true, 128, nhd,
       0, bf, true, Fp8Scale::per_tensor},
      {"fp8 ps256 hnd G8 non-causal no scales", {150, 33}, {383, 129}, 8, 1, 4, false, false, 256,
       hnd, 0, bf, false, Fp8Scale::none},
      {"nvfp4 ps32 nhd G4", {200, 5, 130}, {513, 0, 130}, 4, 2, 8, true, false, 32, nhd, 0, bf,
       false, std::nullopt, 1},
      {"mxfp4 ps128 hnd G16 blk spare", {260, 17}, {260, 700}, 16, 1, 4, true, true, 128, hnd, 0,
       bf, true, std::nullopt, 2},
  };
  run_specs(specs, 9500, small, s);
}

// FP8 q over FP8 pools: QK on e4m3 operands with per-key scales (the kFp8 kernels read the flat
// copy of the pool's K bytes and its scales, per tensor, slot, or slot and head; NaN scales in
// unused slots), tok, blk and dense, both layouts; paged == flat bitwise.
TEST(SparseFwdPagedGpu, Fp8QkPoolsMatchCpu) {
  MSA_REQUIRE_GPU();
  const bool small = small_tests();
  TestStream s;
  const KVLayout nhd = KVLayout::paged_nhd, hnd = KVLayout::paged_hnd;
  const DType bf = DType::bf16;
  const Spec specs[] = {
      {"fp8 qk ps16 nhd G4 token scales", {300, 0, 77}, {300, 50, 200}, 4, 2, 4, true, false, 16,
       nhd, 0, bf, false, Fp8Scale::per_token, 0, false, false, true},
      {"fp8 qk ps64 hnd G16 blk token-head padded", {260, 17}, {260, 700}, 16, 1, 8, true, true, 64,
       hnd, 16, bf, false, Fp8Scale::per_token_head, 0, false, false, true},
      {"fp8 qk ps128 nhd G1 tensor spare", {129, 0, 300}, {129, 0, 1000}, 1, 2, 8, true, true, 128,
       nhd, 0, bf, true, Fp8Scale::per_tensor, 0, false, false, true},
      {"fp8 qk ps256 hnd G8 dense offsets", {150, 33}, {383, 129}, 8, 1, 0, true, false, 256, hnd,
       0, bf, false, Fp8Scale::per_token_head, 0, true, true, true},
  };
  run_specs(specs, 9600, small, s);
}

// Dense attention (no q2k) over page pools: page sizes 16-256 in both layouts, G 1/4/16, causal
// both ways, padded rows, spare columns, FP8 and NVFP4 pools; GPU paged vs the CPU reference and
// paged == flat bitwise.
TEST(SparseFwdPagedGpu, DenseMatchesCpu) {
  MSA_REQUIRE_GPU();
  const bool small = small_tests();
  TestStream s;
  const KVLayout nhd = KVLayout::paged_nhd, hnd = KVLayout::paged_hnd;
  const DType bf = DType::bf16;
  const auto none = std::nullopt;
  const Spec specs[] = {
      {"dense ps16 nhd G1", {300, 0, 77}, {300, 50, 200}, 1, 2, 0, true, false, 16, nhd, 0, bf,
       false, none, 0, true},
      {"dense ps32 hnd G4 non-causal padded", {200, 5, 130}, {513, 0, 130}, 4, 2, 0, false, false,
       32, hnd, 8, bf, false, none, 0, true},
      {"dense ps64 nhd G16 f16 spare", {260, 17}, {260, 700}, 16, 1, 0, true, false, 64, nhd, 0,
       DType::f16, true, none, 0, true},
      {"dense ps128 hnd G4 Lq > Lk", {333, 0}, {200, 0}, 4, 2, 0, true, false, 128, hnd, 0, bf,
       false, none, 0, true},
      {"dense ps256 nhd G8 fp8 token-head spare", {129, 0, 300}, {129, 0, 1000}, 8, 1, 0, true,
       false, 256, nhd, 0, bf, true, Fp8Scale::per_token_head, 0, true},
      {"dense ps64 hnd G4 nvfp4", {150, 33}, {383, 129}, 4, 2, 0, true, false, 64, hnd, 0, bf, false,
       none, 1, true},
  };
  run_specs(specs, 9700, small, s);
}

// Per-batch causal offsets over page pools: sparse (tok and blk) and dense, both layouts.
TEST(SparseFwdPagedGpu, CausalOffsetsMatchCpu) {
  MSA_REQUIRE_GPU();
  const bool small = small_tests();
  TestStream s;
  const KVLayout nhd = KVLayout::paged_nhd, hnd = KVLayout::paged_hnd;
  const DType bf = DType::bf16;
  const auto none = std::nullopt;
  const Spec specs[] = {
      {"offsets ps16 nhd G4 tok", {300, 0, 77}, {300, 50, 200}, 4, 2, 8, true, false, 16, nhd, 0, bf,
       false, none, 0, false, true},
      {"offsets ps64 hnd G16 blk spare", {260, 17}, {260, 700}, 16, 1, 4, true, true, 64, hnd, 0, bf,
       true, none, 0, false, true},
      {"offsets ps128 nhd G1 dense", {129, 0, 300}, {129, 0, 1000}, 1, 2, 0, true, false, 128, nhd, 0,
       bf, false, none, 0, true, true},
      {"offsets ps256 hnd G8 dense fp8", {150, 33}, {383, 129}, 8, 1, 0, true, false, 256, hnd, 0, bf,
       false, Fp8Scale::per_token, 0, true, true},
  };
  run_specs(specs, 9800, small, s);
}

// seqused_k absent: every request has max_pages * page_size keys (docs/semantics.md, Paged KV).
TEST(SparseFwdPagedGpu, DefaultLengthsWithoutSeqused) {
  MSA_REQUIRE_GPU();
  TestStream s;
  for (const KVLayout layout : {KVLayout::paged_nhd, KVLayout::paged_hnd}) {
    const Spec sp{"no seqused_k", {100, 384}, {384, 384}, 4, 2, 4, true, layout == KVLayout::paged_hnd,
                  64, layout};
    SparseCase c = make_case(sp, 31, /*small=*/false);
    SCOPED_TRACE(kv_layout_name(layout));
    const PagedKV h = make_paged(c.p, layout, 64, 32, 0, 3, /*extra_columns=*/0);
    ASSERT_EQ(h.page_table.t.shape[1] * 64, 384);
    DeviceInputs d(c, h, s);
    const Result paged = run_gpu(c, d, d.paged(/*with_seqused=*/false), s);
    expect_close(paged, run_cpu(c));
    expect_bitwise(paged, run_gpu(c, d, d.flat(), s));
  }
}

// A page id outside [0, num_pages) in a column that seqused_k uses is an msa::Error naming the
// batch and the column (logical page); the same ids past seqused_k are never read.
TEST(SparseFwdPagedGpu, BadPageIdsReported) {
  MSA_REQUIRE_GPU();
  TestStream s;
  const Spec sp{"bad page", {300, 40}, {300, 500}, 4, 2, 4, true, false, 64, KVLayout::paged_nhd};
  for (const bool blk : {false, true}) {
    Spec spec = sp;
    spec.blk = blk;
    SparseCase c = make_case(spec, 41, /*small=*/false);
    PagedKV h = make_paged(c.p, spec.layout, 64, 42);
    const int64_t cols = h.page_table.t.shape[1], pages = h.k.t.shape[0];
    for (const int64_t bad : {int64_t(INT_MIN), int64_t(-1), pages, int64_t(INT_MAX)}) {
      SCOPED_TRACE("bad id " + std::to_string(bad) + (blk ? " blk" : " tok"));
      const int32_t keep = h.page_table.data<int32_t>()[1 * cols + 3];
      h.page_table.data<int32_t>()[1 * cols + 3] = int32_t(bad);  // batch 1 uses 8 columns
      DeviceInputs d(c, h, s);
      try {
        run_gpu(c, d, d.paged(), s);
        ADD_FAILURE() << "no error for page id " << bad;
      } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("page_table"), std::string::npos) << msg;
        EXPECT_NE(msg.find("page id " + std::to_string(bad)), std::string::npos) << msg;
        EXPECT_NE(msg.find("batch 1"), std::string::npos) << msg;
        EXPECT_NE(msg.find("column 3"), std::string::npos) << msg;
      }
      h.page_table.data<int32_t>()[1 * cols + 3] = keep;
    }
  }
}

// seqused_k outside [0, max_pages * page_size] is reported (and clamped, never read past).
TEST(SparseFwdPagedGpu, BadSequsedReported) {
  MSA_REQUIRE_GPU();
  TestStream s;
  const Spec sp{"bad seqused", {300, 40}, {300, 500}, 4, 2, 4, true, false, 64, KVLayout::paged_hnd};
  SparseCase c = make_case(sp, 51, /*small=*/false);
  PagedKV h = make_paged(c.p, sp.layout, 64, 52);
  const int64_t cap = h.page_table.t.shape[1] * 64;
  for (const int32_t bad : {int32_t(cap + 1), -5}) {
    SCOPED_TRACE("seqused_k[1] = " + std::to_string(bad));
    h.seqused_k.data<int32_t>()[1] = bad;
    DeviceInputs d(c, h, s);
    try {
      run_gpu(c, d, d.paged(), s);
      ADD_FAILURE() << "no error for seqused_k " << bad;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(bad > 0 ? "batch 1 has " + std::to_string(bad) + " keys"
                                 : std::string("batch 1")),
                std::string::npos) << msg;
    }
  }
}

}  // namespace
}  // namespace msa::test
