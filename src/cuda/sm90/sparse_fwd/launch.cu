// Host side of the sm_90a sparse attention forward: capability checks, workspace plan, TMA
// descriptors and the launch sequence (paged-KV checks, CSR build or q2k check, schedule check +
// chunk table, main kernel, combine). Defines cuda::attention_forward / attention_workspace_bytes.
// Instantiations (the only ones): sparse_fwd_kernel and sparse_fwd_uniform_kernel, each <false>
// (bf16) and <true> (f16).

#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <climits>
#include <cmath>
#include <mutex>

#include "backend.h"
#include "common/schedule.h"
#include "cuda/common/combine.cuh"
#include "cuda/common/csr_build.cuh"
#include "cuda/common/index_checks.cuh"
#include "cuda/common/paged_checks.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/device/check.h"
#include "cuda/device/tma_map.h"
#include "cuda/sm90/sparse_fwd/kernel.cuh"
#include "cuda/sm90/sparse_fwd/scheduler.cuh"
#include "cuda/sm90/sparse_fwd/uniform_scheduler.cuh"

namespace msa::cuda {
namespace {

using namespace sparse_fwd;

size_t align256(size_t x) { return (x + 255) & ~size_t(255); }

// Bits of the window sort keys: real keys are 0 .. window_keys - 1, the unused capacity sorts
// last with key window_keys (PrepParams::window_keys). One radix pass up to 8 bits (S <= 128K
// tokens at 1024-token windows).
int window_key_bits(int32_t window_keys) {
  int bits = 1;
  while ((1u << bits) <= uint32_t(window_keys)) ++bits;
  return bits;
}

// Temporary bytes of the stable radix sort of `n` (window key of `bits` bits, chunk id) pairs.
// CUB's size query costs microseconds of host time (device attribute and occupancy queries) and a
// call plans twice (the workspace size, then the launch) with the same (n, bits), so the last
// answer is kept per thread.
size_t chunk_sort_bytes(int64_t n, int bits) {
  thread_local int64_t last_n = -1;
  thread_local int last_bits = -1, last_device = -1;
  thread_local size_t last_bytes = 0;
  int device = 0;
  MSA_CUDA_CHECK(cudaGetDevice(&device));
  if (n == last_n && bits == last_bits && device == last_device) return last_bytes;
  size_t bytes = 0;
  MSA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const uint32_t*>(nullptr),
                                                 static_cast<uint32_t*>(nullptr),
                                                 static_cast<const int32_t*>(nullptr),
                                                 static_cast<int32_t*>(nullptr), int(n), 0,
                                                 bits));
  last_n = n;
  last_bits = bits;
  last_device = device;
  last_bytes = bytes;
  return bytes;
}

// Byte offsets into the attention workspace; sized from host-known shapes only.
struct AttnPlan {
  int64_t total_rows = 0;        // rows of the CSR in use (caller's, or an upper bound)
  int64_t schedule_capacity = 0; // items
  int64_t chunk_capacity = 0;
  int32_t chunk_tokens = 0;
  int64_t qblock_cap = 0, unit_cap = 0;
  int32_t window_keys = 0;       // query windows (PrepParams::window_keys)
  bool build_csr = false, build_schedule = false;
  size_t paged_offence = 0, key_offsets = 0;  // paged KV only
  size_t check = 0, row_start = 0, chunk_start = 0, num_chunks = 0, chunks = 0;
  size_t valid_per_head = 0, k2q_first = 0;  // the caller's k2q check (build_csr false)
  size_t chunks_by_row = 0, chunk_keys = 0, chunk_keys_sorted = 0, chunk_ids = 0, chunk_order = 0;
  size_t sort_tmp = 0, sort_tmp_bytes = 0;
  size_t work_local = 0, work_slot = 0;
  size_t qblock_start = 0, uniform = 0, unit_start = 0, unit_order_start = 0, num_units = 0;
  size_t units = 0;
  size_t part_o = 0, part_lse = 0, part_tlse = 0;
  size_t row_ptr = 0, q_idx = 0, schedule = 0, csr_ws = 0;
  size_t total = 0;
};

AttnPlan make_plan(const AttentionArgs& a, const ProblemShape& s) {
  AttnPlan w;
  const int64_t hkv = s.num_kv_heads, nnz = s.total_q * s.topk;
  w.build_csr = !a.k2q.row_ptr.defined();
  w.build_schedule = !w.build_csr && !a.k2q.schedule.defined();
  const bool paged = a.kv.layout != KVLayout::flat;
  if (w.build_csr && paged) {
    // Lk_b <= max_pages * page_size (longer seqused_k are clamped and reported).
    w.total_rows = s.batch * ((s.max_pages * s.page_size + kBlockN - 1) / kBlockN);
  } else if (w.build_csr) {
    // sum_b ceil(Lk_b / 128) <= total_k / 128 + B: rows past the real total stay empty.
    w.total_rows = (a.kv.k.values.shape[0] + kBlockN - 1) / kBlockN + s.batch;
  } else {
    w.total_rows = a.k2q.row_ptr.shape[1] - 1;
  }
  w.schedule_capacity = hkv * w.total_rows;
  w.chunk_tokens = kChunkTiles * tokens_per_tile(int(s.group));
  w.chunk_capacity = w.schedule_capacity + (hkv * nnz + w.chunk_tokens - 1) / w.chunk_tokens;
  // sum_b ceil(Lq_b / 128) <= ceil(total_q / 128) + B; a pair has at most G units of 128 rows.
  w.qblock_cap = (s.total_q + 127) / 128 + s.batch;
  w.unit_cap = hkv * w.qblock_cap * s.group;
  w.window_keys = int32_t(std::min<int64_t>(((w.qblock_cap - 1) >> kWindowShift) + 1,
                                            kMaxWindowKeys));
  const size_t part_elems = size_t(hkv) * size_t(nnz) * size_t(s.group);
  const size_t part_bytes = a.params.partial_dtype == DType::bf16 ? 2 : 4;
  size_t off = 0;
  auto take = [&off](size_t bytes) { const size_t at = off; off += align256(bytes); return at; };
  if (paged) {
    w.paged_offence = take(sizeof(unsigned long long));
    w.key_offsets = take(size_t(s.batch + 1) * 4);
  }
  w.check = take(kQ2KCheckWorkspaceBytes);
  w.valid_per_head = take(size_t(hkv) * 4);
  w.k2q_first = take(sizeof(unsigned long long));
  w.row_start = take(size_t(s.batch + 1) * 4);
  w.chunk_start = take(size_t(w.schedule_capacity + 1) * 4);
  w.num_chunks = take(4);
  w.chunks = take(size_t(w.chunk_capacity) * sizeof(ChunkDesc));
  w.chunks_by_row = take(size_t(w.chunk_capacity) * sizeof(ChunkDesc));
  w.chunk_keys = take(size_t(w.chunk_capacity) * 4);
  w.chunk_keys_sorted = take(size_t(w.chunk_capacity) * 4);
  w.chunk_ids = take(size_t(w.chunk_capacity) * 4);
  w.chunk_order = take(size_t(w.chunk_capacity) * 4);
  w.sort_tmp_bytes = chunk_sort_bytes(w.chunk_capacity, window_key_bits(w.window_keys));
  w.sort_tmp = take(w.sort_tmp_bytes);
  w.work_local = take(size_t(hkv * nnz) * 4);
  w.work_slot = take(size_t(hkv * nnz) * 4);
  w.qblock_start = take(size_t(s.batch + 1) * 4);
  w.uniform = take(size_t(hkv * w.qblock_cap) * 4);
  w.unit_start = take(size_t(hkv * w.qblock_cap) * 4);
  w.unit_order_start = take(size_t(hkv * w.qblock_cap + 1) * 4);
  w.num_units = take(4);
  w.units = take(size_t(w.unit_cap) * sizeof(UnitDesc));
  w.part_o = take(part_elems * kHeadDim * part_bytes);
  w.part_lse = take(part_elems * 4);
  w.part_tlse = take(a.params.temperature > 0.f ? part_elems * 4 : 0);
  if (w.build_csr) {
    w.row_ptr = take(size_t(hkv * (w.total_rows + 1)) * 4);
    w.q_idx = take(size_t(hkv * nnz) * 4);
  }
  if (w.build_csr || w.build_schedule)
    w.schedule = take(size_t(sched::max_schedule_ints(hkv, w.total_rows)) * 4);
  if (w.build_csr) w.csr_ws = take(csr_build_workspace_bytes(hkv, w.total_rows, s.total_q, s.topk));
  w.total = off;
  return w;
}

// Rejects what this kernel does not cover, naming the missing feature (no silent fallback).
void check_supported(const AttentionArgs& a, const ProblemShape& s) {
  MSA_CHECK(a.q2k.defined(), "attention_forward: dense attention (no q2k) is not supported on "
            "CUDA yet; pass a q2k selection or run on CPU tensors");
  MSA_CHECK(s.head_dim == kHeadDim, "q: head dim must be 128 on CUDA, got ", s.head_dim);
  MSA_CHECK(a.kv.k.values.dtype == a.q.dtype && a.kv.v.values.dtype == a.q.dtype,
            "k, v: must have q's dtype (", dtype_name(a.q.dtype),
            ") on CUDA; quantized KV is not supported by the sparse prefill yet");
  MSA_CHECK(!a.kv.k.scale.defined() && !a.kv.v.scale.defined(),
            "k, v: scales are not supported by the CUDA sparse prefill");
  MSA_CHECK(s.kv_block_size == kBlockN, "params.kv_block_size: must be 128 on CUDA, got ",
            s.kv_block_size);
  MSA_CHECK(s.group == 1 || s.group == 2 || s.group == 4 || s.group == 8 || s.group == 16,
            "q: Hq / Hkv must be 1, 2, 4, 8 or 16 on CUDA, got ", s.group);
  MSA_CHECK(s.total_q * s.topk * s.num_kv_heads < INT32_MAX,
            "q2k: Hkv * total_q * topk must be below 2^31 on CUDA");
  MSA_CHECK(a.kv.k.values.shape[0] < INT32_MAX && s.total_q < INT32_MAX,
            "q, k: token counts must be below 2^31 on CUDA (TMA coordinates are int32)");
  if (a.kv.layout != KVLayout::flat)
    MSA_CHECK(s.batch * s.max_pages * s.page_size < INT32_MAX,
              "page_table: B * max_pages * page_size (", s.batch, " * ", s.max_pages, " * ",
              s.page_size, ") must be below 2^31 on CUDA (paged key offsets are int32)");
}

// Enqueues the paged-KV checks (paged_checks.cuh) and returns their key_offsets, the clamped
// lengths as a flat cu_seqlens_k for everything that follows.
const int32_t* launch_paged_checks(const AttentionArgs& a, const ProblemShape& s,
                                   const AttnPlan& w, uint8_t* ws, int32_t* status,
                                   cudaStream_t stream) {
  PagedCheckParams c;
  c.page_table = a.kv.page_table.ptr<int32_t>();
  c.page_table_stride = a.kv.page_table.strides[0];
  c.seqused_k = a.kv.seqused_k.defined() ? a.kv.seqused_k.ptr<int32_t>() : nullptr;
  c.batch = s.batch;
  c.max_pages = s.max_pages;
  c.num_pages = s.num_pages;
  c.page_size = int32_t(s.page_size);
  c.max_keys = s.max_pages * s.page_size;
  c.key_offsets = reinterpret_cast<int32_t*>(ws + w.key_offsets);
  c.offence = reinterpret_cast<unsigned long long*>(ws + w.paged_offence);
  c.status = status;
  launch_paged_checks_with_offsets(c, stream);
  return c.key_offsets;
}

int sm_count() {
  int dev = 0, n = 0;
  MSA_CUDA_CHECK(cudaGetDevice(&dev));
  MSA_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  return n;
}

// One persistent launch (a CTA per SM) of either kernel; each instantiation raises its shared
// memory limit once per process.
template <typename P>
void launch_persistent(void (*kernel)(CUtensorMap, CUtensorMap, CUtensorMap, P),
                       std::once_flag& smem_limit_set, const CUtensorMap& tq, const CUtensorMap& tk,
                       const CUtensorMap& tv, const P& p, cudaStream_t stream) {
  std::call_once(smem_limit_set, [kernel] {
    MSA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  });
  launch_pdl(kernel, sm_count(), kThreads, kSmemBytes, stream, tq, tk, tv, p);
}

template <bool kF16>
void launch_main(const CUtensorMap& tq, const CUtensorMap& tk, const CUtensorMap& tv,
                 const MainParams& p, cudaStream_t stream) {
  static std::once_flag once;
  launch_persistent(sparse_fwd_kernel<kF16>, once, tq, tk, tv, p, stream);
}

template <bool kF16>
void launch_uniform(const CUtensorMap& tq, const CUtensorMap& tk, const CUtensorMap& tv,
                    const UniformParams& p, cudaStream_t stream) {
  static std::once_flag once;
  launch_persistent(sparse_fwd_uniform_kernel<kF16>, once, tq, tk, tv, p, stream);
}

}  // namespace

size_t attention_workspace_bytes(const AttentionArgs& a, const ProblemShape& s) {
  if (!a.q2k.defined()) return 0;  // dense: attention_forward reports it unsupported
  return make_plan(a, s).total;
}

void attention_forward(const AttentionArgs& a, const ProblemShape& s, cudaStream_t stream) {
  check_supported(a, s);
  if (s.total_q == 0) return;
  const AttnPlan w = make_plan(a, s);
  auto* ws = static_cast<uint8_t*>(a.workspace.data);
  MSA_CHECK((reinterpret_cast<uintptr_t>(ws) & 255) == 0,
            "workspace: must be 256-byte aligned on CUDA");
  int32_t* status = a.status.ptr<int32_t>();
  const auto* q2k = a.q2k.ptr<int32_t>();
  const auto* cu_q = a.cu_seqlens_q.ptr<int32_t>();
  const bool paged = a.kv.layout != KVLayout::flat;
  // Paged: the checked, clamped lengths as a flat cu_seqlens_k, so the CSR build, the q2k check,
  // the prep kernels and the combine treat paged batches like flat ones.
  const auto* cu_k = paged ? launch_paged_checks(a, s, w, ws, status, stream)
                           : a.kv.cu_seqlens_k.ptr<int32_t>();
  // cu_seqlens_k[B] must equal the flat token count; paged offsets have no such total (-1).
  const int64_t total_k = paged ? -1 : a.kv.k.values.shape[0];
  // Whether any key can exist: no TMA map over an empty extent (all lengths may be 0).
  const bool has_keys = paged ? s.num_pages > 0 && s.max_pages > 0 : total_k > 0;

  PrepParams pp;
  pp.q2k = q2k;
  pp.q2k_vec4 = s.topk % 4 == 0 && (reinterpret_cast<uintptr_t>(q2k) & 15) == 0 ? 1 : 0;
  pp.cu_seqlens_q = cu_q;
  pp.cu_seqlens_k = cu_k;
  pp.paged = paged ? 1 : 0;
  pp.batch = s.batch;
  pp.num_kv_heads = s.num_kv_heads;
  pp.total_q = s.total_q;
  pp.topk = s.topk;
  pp.total_rows = w.total_rows;
  pp.schedule_capacity = w.schedule_capacity;
  pp.chunk_capacity = w.chunk_capacity;
  pp.chunk_tokens = w.chunk_tokens;
  pp.window_keys = w.window_keys;
  pp.row_start = reinterpret_cast<int32_t*>(ws + w.row_start);
  pp.chunk_start = reinterpret_cast<int32_t*>(ws + w.chunk_start);
  pp.num_chunks = reinterpret_cast<int32_t*>(ws + w.num_chunks);
  pp.chunks = ws + w.chunks;
  pp.chunks_by_row = ws + w.chunks_by_row;
  pp.chunk_keys = reinterpret_cast<uint32_t*>(ws + w.chunk_keys);
  pp.chunk_ids = reinterpret_cast<int32_t*>(ws + w.chunk_ids);
  pp.work_local = reinterpret_cast<int32_t*>(ws + w.work_local);
  pp.work_slot = reinterpret_cast<int32_t*>(ws + w.work_slot);
  pp.group = int32_t(s.group);
  pp.uniform_enabled = has_keys ? 1 : 0;
  pp.qblock_cap = w.qblock_cap;
  pp.unit_cap = w.unit_cap;
  pp.qblock_start = reinterpret_cast<int32_t*>(ws + w.qblock_start);
  pp.uniform = reinterpret_cast<int32_t*>(ws + w.uniform);
  pp.unit_start = reinterpret_cast<int32_t*>(ws + w.unit_start);
  pp.unit_order_start = reinterpret_cast<int32_t*>(ws + w.unit_order_start);
  pp.num_units = reinterpret_cast<int32_t*>(ws + w.num_units);
  pp.units = ws + w.units;
  pp.status = status;

  Q2KCheckParams index;  // the q2k check's inputs, also the CSR builder's
  index.q2k = q2k;
  index.cu_seqlens_q = cu_q;
  index.keys.cu_seqlens_k = cu_k;
  index.keys.total_k = total_k;
  index.batch = s.batch;
  index.num_kv_heads = s.num_kv_heads;
  index.total_q = s.total_q;
  index.topk = s.topk;
  index.kv_block_size = kBlockN;
  if (w.build_csr) {
    CsrBuildParams c;
    static_cast<Q2KCheckParams&>(c) = index;
    c.total_rows = w.total_rows;
    c.check_total_rows = false;  // an upper bound: the real rows come first, the rest are empty
    c.row_ptr = reinterpret_cast<int32_t*>(ws + w.row_ptr);
    c.q_idx = reinterpret_cast<int32_t*>(ws + w.q_idx);
    c.schedule = reinterpret_cast<int32_t*>(ws + w.schedule);
    c.workspace = ws + w.csr_ws;
    c.status = status;
    launch_csr_build(c, stream);
    pp.check_rows = 0;  // rows past the real total are empty by construction
    pp.row_ptr = c.row_ptr;
    pp.q_idx = c.q_idx;
    pp.schedule = c.schedule;
  } else {
    // The caller's k2q must be the one build_k2q_csr makes from this q2k (checked on the way:
    // the q2k check counts each head's ids in range, the prep kernels test every entry).
    index.valid_per_head = reinterpret_cast<int32_t*>(ws + w.valid_per_head);
    pp.valid_per_head = index.valid_per_head;
    pp.k2q_first = reinterpret_cast<unsigned long long*>(ws + w.k2q_first);
    // Before the check's kernels: from there on, kernels only (each one's launch overlaps the
    // previous kernel's run; pdl.cuh).
    MSA_CUDA_CHECK(cudaMemsetAsync(pp.k2q_first, 0xff, sizeof(unsigned long long), stream));
    launch_q2k_check(index, ws + w.check, status, stream);
    pp.row_ptr = a.k2q.row_ptr.ptr<int32_t>();
    pp.q_idx = a.k2q.q_idx.ptr<int32_t>();
    pp.schedule = w.build_schedule ? reinterpret_cast<int32_t*>(ws + w.schedule)
                                   : a.k2q.schedule.ptr<int32_t>();
    if (w.build_schedule) {
      launch_pdl(schedule_from_row_ptr_kernel, 1, kPrepThreads, 0, stream, pp,
                 reinterpret_cast<int32_t*>(ws + w.schedule));
    }
  }
  const int sms = sm_count();
  launch_pdl(row_start_kernel, 1, kPrepThreads, 0, stream, pp);
  const int64_t pairs = int64_t(s.num_kv_heads) * w.qblock_cap;  // one block per pair
  launch_pdl(uniform_detect_kernel, unsigned(std::clamp<int64_t>(pairs, 1, 16 * int64_t(sms))), 256,
             0, stream, pp);
  launch_pdl(unit_scan_kernel, 1, kPrepThreads, 0, stream, pp);
  launch_pdl(unit_table_kernel, 2 * sms, 256, 0, stream, pp);
  launch_pdl(schedule_check_kernel, 1, kPrepThreads, 0, stream, pp);
  launch_pdl(chunk_table_kernel, 8 * sms, 256, 0, stream, pp);  // a warp per chunk: latency-bound
  size_t sort_bytes = w.sort_tmp_bytes;
  auto* order = reinterpret_cast<int32_t*>(ws + w.chunk_order);
  MSA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      ws + w.sort_tmp, sort_bytes, pp.chunk_keys, reinterpret_cast<uint32_t*>(ws + w.chunk_keys_sorted),
      pp.chunk_ids, order, int(w.chunk_capacity), 0, window_key_bits(w.window_keys), stream));
  launch_pdl(chunk_permute_kernel, 2 * sms, 256, 0, stream, pp, order);

  const bool f16 = a.q.dtype == DType::f16;
  const bool bf16_part = a.params.partial_dtype == DType::bf16;
  const float scale = a.params.softmax_scale > 0.f ? a.params.softmax_scale
                                                   : 1.f / std::sqrt(float(s.head_dim));
  if (has_keys) {
    const PagedKV pk = paged ? make_paged_kv(a.kv.page_table.ptr<int32_t>(),
                                             a.kv.page_table.strides[0], s.num_pages, s.page_size,
                                             a.kv.layout == KVLayout::paged_hnd)
                             : PagedKV{};
    MainParams mp;
    mp.chunks = pp.chunks;
    mp.num_chunks = pp.num_chunks;
    mp.work_local = pp.work_local;
    mp.work_slot = pp.work_slot;
    mp.q_idx_stride = s.total_q * s.topk;
    mp.total_q = s.total_q;
    mp.group = int32_t(s.group);
    mp.topk = int32_t(s.topk);
    mp.tokens_per_tile = tokens_per_tile(int(s.group));
    mp.causal = a.params.causal ? 1 : 0;
    mp.scale_log2 = scale * 1.4426950408889634f;
    mp.inv_temperature = a.params.temperature > 0.f ? 1.f / a.params.temperature : 0.f;
    mp.part_o = ws + w.part_o;
    mp.part_bf16 = bf16_part ? 1 : 0;
    if (bf16_part)  // [entries, G, 128] bf16: each token's G partial rows are one box per half
      mp.tm_part = make_tma_3d(Tensor(mp.part_o, DType::bf16,
                                      {s.num_kv_heads * s.total_q * s.topk, s.group, kHeadDim},
                                      a.q.device),
                               kHalfCols, uint32_t(s.group), 1, "attention_forward");
    mp.part_lse = reinterpret_cast<float*>(ws + w.part_lse);
    mp.part_tlse = a.params.temperature > 0.f ? reinterpret_cast<float*>(ws + w.part_tlse) : nullptr;
    mp.paged = pk;
    const CUtensorMap tq = make_tma_3d(a.q, kHalfCols, uint32_t(s.group), 1, "attention_forward");
    const uint32_t box_keys = 1u << pk.box_shift;
    const bool slots_outer = a.kv.layout == KVLayout::paged_nhd;
    auto kv_map = [&](const Tensor& t, const char* name) {
      return paged ? make_tma_paged(t, slots_outer, kHalfCols, box_keys, name, "attention_forward")
                   : make_tma_3d(t, kHalfCols, 1, kBlockN, "attention_forward");
    };
    const CUtensorMap tk = kv_map(a.kv.k.values, "k"), tv = kv_map(a.kv.v.values, "v");
    if (f16) launch_main<true>(tq, tk, tv, mp, stream);
    else launch_main<false>(tq, tk, tv, mp, stream);
    UniformParams up;
    up.units = pp.units;
    up.num_units = pp.num_units;
    up.q2k = q2k;
    up.total_q = s.total_q;
    up.group = int32_t(s.group);
    up.topk = int32_t(s.topk);
    up.tokens_per_tile = mp.tokens_per_tile;
    up.causal = mp.causal;
    up.scale_log2 = mp.scale_log2;
    up.inv_temperature = mp.inv_temperature;
    up.out = a.out.data;
    up.out_stride_t = a.out.strides[0];
    up.out_stride_h = a.out.strides[1];
    up.lse = a.lse.defined() ? a.lse.ptr<float>() : nullptr;
    up.tlse = a.tlse.defined() ? a.tlse.ptr<float>() : nullptr;
    up.paged = pk;
    if (f16) launch_uniform<true>(tq, tk, tv, up, stream);
    else launch_uniform<false>(tq, tk, tv, up, stream);
  }

  CombineParams cp;
  cp.q2k = q2k;
  cp.cu_seqlens_q = cu_q;
  cp.cu_seqlens_k = cu_k;
  cp.part_o = ws + w.part_o;
  cp.part_bf16 = bf16_part ? 1 : 0;
  cp.part_lse = reinterpret_cast<const float*>(ws + w.part_lse);
  cp.part_tlse = a.tlse.defined() ? reinterpret_cast<const float*>(ws + w.part_tlse) : nullptr;
  cp.out = a.out.data;
  cp.out_stride_t = a.out.strides[0];
  cp.out_stride_h = a.out.strides[1];
  cp.lse = a.lse.defined() ? a.lse.ptr<float>() : nullptr;
  cp.tlse = a.tlse.defined() ? a.tlse.ptr<float>() : nullptr;
  cp.batch = s.batch;
  cp.total_q = s.total_q;
  cp.num_kv_heads = int32_t(s.num_kv_heads);
  cp.group = int32_t(s.group);
  cp.topk = int32_t(s.topk);
  cp.kv_block_size = kBlockN;
  cp.uniform = pp.uniform;
  cp.qblock_start = pp.qblock_start;
  cp.qblock_cap = w.qblock_cap;
  launch_sparse_combine(cp, f16, stream);
}

}  // namespace msa::cuda
