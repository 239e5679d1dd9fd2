// The prep of the sm_90a sparse forward (prep.h): one cooperative kernel (q2k rows of at most
// kQ2KStagedMaxTopk ids; the CSR built in it when the call passes none), otherwise the chain of
// kernels (scheduler.cuh, uniform_scheduler.cuh, their only instantiation) with CUB's sorts.

#include "cuda/sm90/sparse_fwd/prep.h"

#include <cooperative_groups.h>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <atomic>

#include "cuda/common/csr_build.cuh"
#include "cuda/common/block_sort.cuh"
#include "cuda/common/index_check_device.cuh"
#include "cuda/common/index_checks.cuh"
#include "cuda/common/paged_check_device.cuh"
#include "cuda/common/paged_checks.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/device/check.h"
#include "cuda/device/info.h"
#include "cuda/sm90/sparse_fwd/scheduler.cuh"
#include "cuda/sm90/sparse_fwd/uniform_scheduler.cuh"

namespace msa::cuda::sparse_fwd {

// Real keys are 0 .. window_keys - 1, the unused capacity sorts last with key window_keys
// (PrepParams::window_keys). One radix pass up to 8 bits (S <= 128K tokens at 1024-token windows).
int window_key_bits(int32_t window_keys) {
  int bits = 1;
  while ((1u << bits) <= uint32_t(window_keys)) ++bits;
  return bits;
}

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

// The paged checks' inputs, their key offsets and offence key in the workspace.
static PagedCheckParams paged_check_params(const AttentionArgs& a, const ProblemShape& s,
                                           const AttnPlan& w, uint8_t* ws, int32_t* status) {
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
  return c;
}

const int32_t* launch_paged_checks(const AttentionArgs& a, const ProblemShape& s,
                                   const AttnPlan& w, uint8_t* ws, int32_t* status,
                                   cudaStream_t stream) {
  const PagedCheckParams c = paged_check_params(a, s, w, ws, status);
  launch_paged_checks_with_offsets(c, stream);
  return c.key_offsets;
}

namespace {

// Where the keys' lengths come from, as every prep step reads them: a flat cache's cu_seqlens_k
// (cu_seqlens_k[B] must equal its token count), or a pool's clamped lengths that the paged check
// writes as a flat cu_seqlens_k (key_offsets, no such total: -1). has_keys: whether any key can
// exist (no TMA map over an empty extent; all lengths may be 0).
struct KeyLengthsSource {
  const int32_t* cu_k;
  int64_t total_k;
  bool has_keys;
};
KeyLengthsSource key_lengths(const AttentionArgs& a, const ProblemShape& s, const int32_t* key_offsets) {
  if (a.kv.layout != KVLayout::flat) return {key_offsets, -1, s.num_pages > 0 && s.max_pages > 0};
  const int64_t total_k = a.kv.k.values.shape[0];
  return {a.kv.cu_seqlens_k.ptr<int32_t>(), total_k, total_k > 0};
}

// The prep kernels' inputs and workspace tables.
PrepParams prep_params(const AttentionArgs& a, const ProblemShape& s, const AttnPlan& w,
                       uint8_t* ws, const int32_t* cu_k, bool has_keys) {
  auto at = [ws](size_t offset) { return reinterpret_cast<int32_t*>(ws + offset); };
  PrepParams pp;
  pp.q2k = a.q2k.ptr<int32_t>();
  pp.q2k_vec4 = s.topk % 4 == 0 && (reinterpret_cast<uintptr_t>(pp.q2k) & 15) == 0 ? 1 : 0;
  pp.cu_seqlens_q = a.cu_seqlens_q.ptr<int32_t>();
  pp.cu_seqlens_k = cu_k;
  pp.causal_offset = a.causal_offset.defined() ? a.causal_offset.ptr<int32_t>() : nullptr;
  // The kernels read a pool through the page table, or a flat dequantized copy (plan.h).
  pp.paged = a.kv.layout != KVLayout::flat && !w.dequant_kv ? 1 : 0;
  pp.batch = s.batch;
  pp.num_kv_heads = query_kv_heads(s, w);  // the sparse path's: kv_split 1
  pp.total_q = s.total_q;
  pp.topk = s.topk;
  pp.total_rows = w.total_rows;
  pp.kv_block_size = int32_t(w.blk);
  pp.schedule_capacity = w.schedule_capacity;
  pp.chunk_capacity = w.chunk_capacity;
  pp.chunk_tokens = w.chunk_tokens;
  pp.window_keys = w.window_keys;
  pp.row_start = at(w.row_start);
  pp.chunk_start = at(w.chunk_start);
  pp.num_chunks = at(w.num_chunks);
  pp.chunks = ws + w.chunks;
  pp.chunks_by_row = ws + w.chunks_by_row;
  pp.chunk_keys = reinterpret_cast<uint32_t*>(ws + w.chunk_keys);
  pp.chunk_ids = at(w.chunk_ids);
  pp.work_local = at(w.work_local);
  pp.work_slot = at(w.work_slot);
  pp.group = query_group(s, w);
  pp.uniform_enabled = has_keys ? 1 : 0;
  pp.qblock_cap = w.qblock_cap;
  pp.qblock_shift = w.qblock_shift;
  pp.unit_cap = w.unit_cap;
  pp.unit_tiles = w.unit_tiles;
  pp.qblock_start = at(w.qblock_start);
  pp.uniform = at(w.uniform);
  pp.unit_start = at(w.unit_start);
  pp.unit_order_start = at(w.unit_order_start);
  {
    // One uniform CTA an SM (launch_kernels.cuh); the K/V as bf16 K and V rows of every key
    // (a pool's every slot), an upper bound where K is e4m3 (FP8 Q K^T).
    const int64_t keys = a.kv.layout == KVLayout::flat ? a.kv.k.values.shape[0]
                                                       : s.num_pages * s.page_size;
    const int64_t kv_bytes = keys * s.num_kv_heads * s.head_dim * 4;
    pp.unit_window = walk_window(current_sm_count(),
                                 units_per_qblock(pp.group, 1 << pp.qblock_shift, pp.unit_tiles),
                                 kv_bytes, current_l2_bytes());
  }
  pp.num_units = at(w.num_units);
  pp.units = ws + w.units;
  pp.status = a.status.ptr<int32_t>();
  return pp;
}

// The CSR: built from q2k into the workspace, or the caller's k2q checked against q2k (the q2k
// check counts each head's ids in range, the prep kernels test every entry). Sets pp's CSR inputs.
// The q2k check's inputs (also the CSR builder's): keys from pp's flat cu_seqlens_k.
Q2KCheckParams q2k_check_params(const ProblemShape& s, const PrepParams& pp, int64_t total_k) {
  Q2KCheckParams index;
  index.q2k = pp.q2k;
  index.cu_seqlens_q = pp.cu_seqlens_q;
  index.keys.cu_seqlens_k = pp.cu_seqlens_k;
  index.keys.total_k = total_k;
  index.batch = s.batch;
  index.num_kv_heads = s.num_kv_heads;
  index.total_q = s.total_q;
  index.topk = s.topk;
  index.kv_block_size = pp.kv_block_size;
  return index;
}

// A caller's k2q (checked against q2k): sets pp's CSR inputs and the check's outputs.
void use_callers_k2q(const AttentionArgs& a, const AttnPlan& w, uint8_t* ws, PrepParams& pp,
                     Q2KCheckParams& index) {
  index.valid_per_head = reinterpret_cast<int32_t*>(ws + w.valid_per_head);
  pp.valid_per_head = index.valid_per_head;
  pp.k2q_first = reinterpret_cast<unsigned long long*>(ws + w.k2q_first);
  pp.row_ptr = a.k2q.row_ptr.ptr<int32_t>();
  pp.q_idx = a.k2q.q_idx.ptr<int32_t>();
  pp.schedule = w.build_schedule ? reinterpret_cast<int32_t*>(ws + w.schedule)
                                 : a.k2q.schedule.ptr<int32_t>();
}

void launch_csr(const AttentionArgs& a, const ProblemShape& s, const AttnPlan& w, uint8_t* ws,
                int64_t total_k, PrepParams& pp, cudaStream_t stream) {
  Q2KCheckParams index = q2k_check_params(s, pp, total_k);
  if (w.build_csr) {
    CsrBuildParams c;
    static_cast<Q2KCheckParams&>(c) = index;
    c.total_rows = w.total_rows;
    c.check_total_rows = false;  // an upper bound: the real rows come first, the rest are empty
    c.row_ptr = reinterpret_cast<int32_t*>(ws + w.row_ptr);
    c.q_idx = reinterpret_cast<int32_t*>(ws + w.q_idx);
    c.schedule = reinterpret_cast<int32_t*>(ws + w.schedule);
    c.workspace = ws + w.csr_ws;
    c.status = pp.status;
    launch_csr_build(c, stream);
    pp.check_rows = 0;  // rows past the real total are empty by construction
    pp.row_ptr = c.row_ptr;
    pp.q_idx = c.q_idx;
    pp.schedule = c.schedule;
    return;
  }
  use_callers_k2q(a, w, ws, pp, index);
  // Before the check's kernels: from there on, kernels only (each one's launch overlaps the
  // previous kernel's run; pdl.cuh).
  MSA_CUDA_CHECK(cudaMemsetAsync(pp.k2q_first, 0xff, sizeof(unsigned long long), stream));
  launch_q2k_check(index, ws + w.check, pp.status, stream);
  if (w.build_schedule)
    launch_pdl(schedule_from_row_ptr_kernel, 1, kPrepThreads, 0, stream, pp,
               reinterpret_cast<int32_t*>(ws + w.schedule));
}


// ---- the fused prep ---------------------------------------------------------------------------

namespace cg = cooperative_groups;

struct FusedPrepParams {
  PrepParams p;
  Q2KCheckParams check;               // the q2k check's inputs (keys: p.cu_seqlens_k)
  unsigned long long* first = nullptr;  // the check's first-offence key
  PagedCheckParams paged;             // page_table null: flat keys
  int32_t* built_schedule = nullptr;  // the schedule built from row_ptr (null: the caller's)
  uint32_t* window_count = nullptr;   // [window_keys] chunks per query window, then first places
  uint32_t* window_hist = nullptr;    // [gridDim.x, window_keys] per CTA range, then first places
  // The CSR build (kBuildCsr; plan.h csr_*): row_ptr / q_idx are p's, written here.
  int32_t* row_ptr = nullptr;
  int32_t* q_idx = nullptr;
  int64_t tile_rows = 0, tiles_per_head = 0, tile_cap = 0;
  uint32_t* tile_keys = nullptr;
  int32_t* tile_counts = nullptr;
  int32_t* row_totals = nullptr;
  // The merging KV-major kernel (plan.h AttnPlan::merge; null: the combine kernel runs): its
  // arrival counts, its merge list and cursors (emptied here), and out / lse for the rows of
  // tokens without a partial.
  uint32_t* merge_count = nullptr;
  unsigned long long* merge_list = nullptr;
  uint32_t* merge_ctr = nullptr;
  void* out = nullptr;  // bf16 [total_q, Hq, kHeadDim]
  int64_t out_stride_t = 0, out_stride_h = 0;
  float* lse = nullptr;
};

constexpr int kFusedThreads = kQ2KStagedThreads;  // the staged q2k check's block size
// CTAs an SM: enough warps for the latency-bound chunk table and q2k check (the chain ran them at
// 64 warps an SM); more CTAs make each grid barrier slower. Registers (64) and shared memory
// (49 KB with the CSR tiles' keys: kCsrTileKeys) are kept to fit it.
constexpr int kFusedBlocksPerSm = 4;
// A CSR tile key: row << kTokenBits | the token's place in its tile (plan.h kCsrMaxRows).
constexpr int kTokenBits = 12;
static_assert(kCsrTileKeys <= (int64_t(1) << kTokenBits), "a tile's tokens must fit kTokenBits");
static_assert(kCsrMaxRows <= (int64_t(1) << (32 - kTokenBits)), "rows must fit a 32-bit key");
constexpr uint32_t kNoKey = ~0u;

// First index in s[0, n) whose key is >= x (s ascending).
__device__ __forceinline__ int lower_bound_key(const uint32_t* s, int n, uint32_t x) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (s[mid] < x) lo = mid + 1; else hi = mid;
  }
  return lo;
}

// The CSR of q2k, as csr_build.cu's (each row's batch-local tokens ascending: the CPU builder's
// bits), in tiles of tile_rows tokens of one kv head. Sort pass (scatter false): each tile sorts
// its (row, token) keys in shared memory, stores them, and counts each row's entries into its
// column of tile_counts. Scatter pass (after the counts' prefix over tiles and row_ptr): each entry
// goes to row_ptr[row] + the earlier tiles' entries of the row + its rank in the tile's run.
// Ids outside [0, nblk_b) (the q2k check reports them) and rows past total_rows take no entry.
__device__ void csr_tiles_body(const FusedPrepParams& f, int64_t block, int64_t blocks,
                               bool scatter) {
  __shared__ uint32_t keys[kCsrTileKeys];
  const PrepParams& p = f.p;
  const int64_t n_tiles = p.num_kv_heads * f.tiles_per_head, topk = p.topk;
  const int cap = int(f.tile_cap);
  for (int64_t tile = block; tile < n_tiles; tile += blocks) {
    const int64_t h = tile / f.tiles_per_head, t0 = (tile % f.tiles_per_head) * f.tile_rows;
    const int n = int(min(f.tile_rows, p.total_q - t0) * topk);
    uint32_t* stored = f.tile_keys + tile * f.tile_cap;
    // The tile's column of the head's [total_rows, tiles_per_head] counts (zeroed in phase 0).
    int32_t* counts = f.tile_counts + (h * p.total_rows) * f.tiles_per_head + tile % f.tiles_per_head;
    const int64_t row_stride = f.tiles_per_head;
    if (!scatter) {
      for (int e = threadIdx.x; e < cap; e += kFusedThreads) {
        uint32_t key = kNoKey;
        if (e < n) {
          const int64_t t = t0 + e / topk;
          const int64_t kb = p.q2k[(h * p.total_q + t) * topk + e % topk];
          const int64_t b = find_batch(p.cu_seqlens_q, p.batch, t);
          const int64_t lk = int64_t(p.cu_seqlens_k[b + 1]) - p.cu_seqlens_k[b];
          const int64_t nblk = lk > 0 ? (lk + p.kv_block_size - 1) / p.kv_block_size : 0;
          const int64_t row = int64_t(p.row_start[b]) + kb;
          if (p.cu_seqlens_q[b] <= t && kb >= 0 && kb < nblk && row < p.total_rows)
            key = (uint32_t(row) << kTokenBits) | uint32_t(e / topk);
        }
        keys[e] = key;
      }
      block_bitonic_sort(keys, cap);  // synchronized before and after
      for (int e = threadIdx.x; e < cap; e += kFusedThreads) {
        const uint32_t k = keys[e];
        stored[e] = k;
        if (k != kNoKey && (e + 1 == cap || keys[e + 1] >> kTokenBits != k >> kTokenBits)) {
          const uint32_t row = k >> kTokenBits;  // the run's last key: its length
          counts[row * row_stride] = e + 1 - lower_bound_key(keys, e, row << kTokenBits);
        }
      }
    } else {
      for (int e = threadIdx.x; e < cap; e += kFusedThreads) keys[e] = stored[e];
      __syncthreads();
      const int32_t* row_ptr = f.row_ptr + h * (p.total_rows + 1);
      int32_t* q_idx = f.q_idx + h * p.total_q * topk;
      for (int e = threadIdx.x; e < cap; e += kFusedThreads) {
        const uint32_t k = keys[e];
        if (k == kNoKey) continue;
        const uint32_t row = k >> kTokenBits;
        const int64_t t = t0 + int64_t(k & ((1u << kTokenBits) - 1));
        const int64_t rank = e - lower_bound_key(keys, e, row << kTokenBits);
        const int64_t b = find_batch(p.cu_seqlens_q, p.batch, t);
        q_idx[row_ptr[row] + counts[row * row_stride] + rank] = int32_t(t - p.cu_seqlens_q[b]);
      }
    }
    __syncthreads();  // the next tile rewrites keys
  }
}

// A warp per (kv head, row) (warp of `warps`): the row's counts become the exclusive prefix over
// the head's earlier tiles, and its total goes to row_totals.
__device__ void csr_tile_prefix_body(const FusedPrepParams& f, int64_t warp, int64_t warps) {
  const PrepParams& p = f.p;
  const int lane = threadIdx.x & 31;
  for (int64_t i = warp; i < p.num_kv_heads * p.total_rows; i += warps) {
    int32_t* counts = f.tile_counts + i * f.tiles_per_head;  // the row's tiles, contiguous
    int32_t carry = 0;
    for (int64_t j0 = 0; j0 < f.tiles_per_head; j0 += 32) {
      const int64_t j = j0 + lane;
      const int32_t c = j < f.tiles_per_head ? counts[j] : 0;
      int32_t incl = c;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int32_t x = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += x;
      }
      if (j < f.tiles_per_head) counts[j] = carry + incl - c;
      carry += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0) f.row_totals[i] = carry;
  }
}

// One block per kv head (block h of `blocks`): row_ptr[h] = the exclusive prefix of its rows'
// totals, row_ptr[h][total_rows] = its entries.
__device__ void csr_row_ptr_body(const FusedPrepParams& f, int64_t block, int64_t blocks) {
  using Scan = cub::BlockScan<int, kFusedThreads>;
  __shared__ typename Scan::TempStorage tmp;
  const PrepParams& p = f.p;
  for (int64_t h = block; h < p.num_kv_heads; h += blocks) {
    int32_t* row_ptr = f.row_ptr + h * (p.total_rows + 1);
    const int32_t* totals = f.row_totals + h * p.total_rows;
    int carry = 0;
    for (int64_t base = 0; base < p.total_rows; base += kFusedThreads) {
      const int64_t r = base + threadIdx.x;
      const int c = r < p.total_rows ? totals[r] : 0;
      int excl = 0, agg = 0;
      Scan(tmp).ExclusiveSum(c, excl, agg);
      if (r < p.total_rows) row_ptr[r] = carry + excl;
      carry += agg;
      __syncthreads();
    }
    if (threadIdx.x == 0) row_ptr[p.total_rows] = carry;
  }
}

// A warp per window (warp of `warps`): the CTAs' counts of the window become the exclusive
// prefix over the CTAs before them, and its total goes to window_count.
__device__ void window_prefix_body(const FusedPrepParams& f, int64_t warp, int64_t warps,
                                   int64_t blocks) {
  const PrepParams& p = f.p;
  const int lane = threadIdx.x & 31;
  for (int64_t k = warp; k < p.window_keys; k += warps) {
    uint32_t carry = 0;
    for (int64_t j0 = 0; j0 < blocks; j0 += 32) {
      const int64_t j = j0 + lane;
      uint32_t* h = f.window_hist + j * p.window_keys + k;
      const uint32_t c = j < blocks ? *h : 0u;
      uint32_t incl = c;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const uint32_t x = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += x;
      }
      if (j < blocks) *h = carry + incl - c;
      carry += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0) f.window_count[k] = carry;
  }
}

// The merging kernel's arrival counts (merge.cuh, MainParams::merge_count), a warp per (kv head,
// query block) the KV-major path does: each token's slots holding a block of its batch (the
// combine's valid slots; the chunk table gives each a partial) as a mask in bits 16-31, their
// count in bits 0-15. A token with none has no arrival: its zero rows and -inf LSE are written
// here, as the combine writes them.
__device__ inline void merge_counts_body(const FusedPrepParams& f, int64_t warp, int64_t warps,
                                         int lane) {
  const PrepParams& p = f.p;
  const int64_t pairs = p.num_kv_heads * p.qblock_cap;
  const int64_t qblocks = p.qblock_start[p.batch];
  for (int64_t pair = warp; pair < pairs; pair += warps) {
    const int64_t h = pair / p.qblock_cap, qb = pair % p.qblock_cap;
    if (qb >= qblocks || p.uniform[pair]) continue;
    const int64_t b = last_le(p.qblock_start, p.batch, qb);
    const int32_t q_start = p.cu_seqlens_q[b], lq = p.cu_seqlens_q[b + 1] - q_start;
    const int32_t lk = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
    const int32_t nblk = lk > 0 ? (lk - 1) / p.kv_block_size + 1 : 0;
    const int64_t lo = (qb - p.qblock_start[b]) << p.qblock_shift;
    const int64_t hi = min(int64_t(lq), lo + (int64_t(1) << p.qblock_shift));
    if (q_start < 0) continue;
    for (int64_t tl = lo + lane; tl < hi && q_start + tl < p.total_q; tl += 32) {
      const int64_t t = q_start + tl;
      const int32_t* ids = p.q2k + (h * p.total_q + t) * p.topk;
      uint32_t mask = 0;
      for (int s = 0; s < p.topk; ++s) {
        const int32_t id = ids[s];
        if (id >= 0 && id < nblk) mask |= 1u << s;
      }
      f.merge_count[h * p.total_q + t] = (mask << 16) | uint32_t(__popc(mask));
      if (mask != 0) continue;
      for (int g = 0; g < p.group; ++g) {
        const int64_t hq = h * p.group + g;
        auto* row = reinterpret_cast<uint4*>(static_cast<uint16_t*>(f.out) + t * f.out_stride_t +
                                             hq * f.out_stride_h);
        for (int i = 0; i < kHeadDim / 8; ++i) row[i] = make_uint4(0, 0, 0, 0);
        if (f.lse) f.lse[hq * p.total_q + t] = -INFINITY;
      }
    }
  }
}

// The prep as phases of one cooperative grid, each phase a step of the chain (same bodies, same
// order of reads and writes) and a grid barrier between phases that depend on each other:
//   0 re-arm the offence keys and counters; paged: the checked key lengths (block 0)
//   1 page ids, cu_seqlens and q2k checks (grid); row_start (last block); the schedule from a
//     caller's row_ptr (the block before it)
//   2 the checks' first offences into the status buffer; uniform_detect (grid); kBuildCsr: the
//     CSR tiles' sort and counts
//   kBuildCsr: the counts' prefix over tiles; row_ptr; the entries into q_idx and the schedule
//   3 unit_scan (block 0) and schedule_check (block 1)
//   4 unit_table and chunk_table (grid)
//   5 the walk order, a stable counting sort by query window (the chain's radix sort's order):
//     each CTA's window counts of its range of chunks; their prefixes over the CTAs (a warp a
//     window); the windows' first places (block 0); each CTA's chunks placed in order (warp 0)
// One launch instead of the chain's 10 to 25 (and its 3 to 6 memsets).
template <bool kBuildCsr>
__global__ void __launch_bounds__(kFusedThreads, kFusedBlocksPerSm) prep_fused_kernel(FusedPrepParams f) {
  pdl_wait();  // pdl.cuh
  cg::grid_group grid = cg::this_grid();
  const PrepParams& p = f.p;
  const int64_t block = blockIdx.x, blocks = gridDim.x;
  const int64_t thread = block * kFusedThreads + threadIdx.x, threads = blocks * kFusedThreads;
  const bool paged = f.paged.page_table != nullptr;

  if (f.check.valid_per_head)
    for (int64_t h = thread; h < p.num_kv_heads; h += threads) f.check.valid_per_head[h] = 0;
  if (thread == 0) {
    *f.first = kNoOffence;
    if (p.k2q_first) *p.k2q_first = ~0ull;
  }
  if constexpr (kBuildCsr)  // the CSR tiles' counts, [Hkv, total_rows, tiles_per_head]
    for (int64_t i = thread; i < p.num_kv_heads * p.total_rows * f.tiles_per_head; i += threads)
      f.tile_counts[i] = 0;
  if (paged && block == 0) paged_lengths_body<kFusedThreads>(f.paged);
  grid.sync();

  if (paged) page_check_body(f.paged, thread, threads);
  for (int64_t i = thread; i <= p.batch; i += threads) check_cu_seqlens_entry(f.check, i, f.first);
  if (p.num_kv_heads * p.total_q > 0 && p.topk > 0 && p.batch > 0)
    check_q2k_staged_body(f.check, f.first, block, blocks);
  if (block == blocks - 1) row_start_body<kFusedThreads>(p);
  if (!kBuildCsr && f.built_schedule && block == (blocks > 1 ? blocks - 2 : 0))
    schedule_from_row_ptr_body<kFusedThreads>(p, f.built_schedule);
  grid.sync();

  if (thread == 0) {  // the chain's order: paged offences, then the q2k check's
    if (paged) report_paged_offence(f.paged, *f.paged.offence);
    report_q2k_offence(f.check, *f.first, p.status);
  }
  uniform_detect_body(p, block, blocks);
  if constexpr (kBuildCsr) {
    csr_tiles_body(f, block, blocks, /*scatter=*/false);
    grid.sync();
    csr_tile_prefix_body(f, thread / 32, threads / 32);
    grid.sync();
    csr_row_ptr_body(f, block, blocks);
    grid.sync();
    csr_tiles_body(f, block, blocks, /*scatter=*/true);
    if (block == blocks - 1) schedule_from_row_ptr_body<kFusedThreads>(p, f.built_schedule);
  }
  grid.sync();

  if (block == 0) unit_scan_body<kFusedThreads>(p);
  if (block == (blocks > 1 ? 1 : 0)) schedule_check_body<kFusedThreads>(p);
  if (f.merge_count != nullptr) {  // the blocks the two scans leave idle, if any
    const int64_t first = blocks > 2 ? 2 : 0, wpb = kFusedThreads / 32;
    if (block >= first) {
      merge_counts_body(f, (block - first) * wpb + threadIdx.x / 32, (blocks - first) * wpb,
                        int(threadIdx.x % 32));
      const int64_t n = f.p.num_kv_heads * f.p.total_q;
      for (int64_t i = (block - first) * kFusedThreads + threadIdx.x; i < n;
           i += (blocks - first) * kFusedThreads)
        f.merge_list[i] = 0;
      if (block == first && threadIdx.x < 3) f.merge_ctr[threadIdx.x] = 0;
    }
  }
  grid.sync();

  unit_table_body(p, thread, threads);
  chunk_table_body(p, thread, threads, /*fill_capacity=*/false);
  grid.sync();

  // The walk order: a stable counting sort of the chunks by window, as the chain's radix sort
  // (a window's chunks of one kv row stay together, so the CTAs running them share its K / V
  // in L2). CTA b takes the contiguous chunks [c0, c1).
  const int32_t n_chunks = *p.num_chunks;
  const int64_t per_block = (int64_t(n_chunks) + blocks - 1) / blocks;
  const int64_t c0 = min(int64_t(n_chunks), block * per_block);
  const int64_t c1 = min(int64_t(n_chunks), c0 + per_block);
  uint32_t* hist = f.window_hist + block * p.window_keys;
  if (block == 0 && threadIdx.x == 0) report_k2q_mismatch(p);
  for (int64_t k = threadIdx.x; k < p.window_keys; k += kFusedThreads) hist[k] = 0;
  __syncthreads();
  for (int64_t c = c0 + threadIdx.x; c < c1; c += kFusedThreads) atomicAdd(&hist[p.chunk_keys[c]], 1u);
  grid.sync();

  window_prefix_body(f, thread / 32, threads / 32, blocks);
  grid.sync();

  if (block == 0) {  // each window's first place
    using Scan = cub::BlockScan<uint32_t, kFusedThreads>;
    __shared__ typename Scan::TempStorage tmp;
    uint32_t carry = 0;
    for (int64_t base = 0; base < p.window_keys; base += kFusedThreads) {
      const int64_t k = base + threadIdx.x;
      const uint32_t n = k < p.window_keys ? f.window_count[k] : 0u;
      uint32_t excl = 0, agg = 0;
      Scan(tmp).ExclusiveSum(n, excl, agg);
      if (k < p.window_keys) f.window_count[k] = carry + excl;
      carry += agg;
      __syncthreads();
    }
  }
  grid.sync();
  pdl_trigger();

  if (threadIdx.x < 32) {  // warp 0 places the CTA's chunks in order, 32 at a time
    const int lane = threadIdx.x;
    for (int64_t c_base = c0; c_base < c1; c_base += 32) {
      const int64_t c = c_base + lane;
      const bool live = c < c1;
      const uint32_t key = live ? p.chunk_keys[c] : ~0u;
      const unsigned peers = __match_any_sync(0xffffffffu, key);
      if (live) {
        const uint32_t at = f.window_count[key] + hist[key] + __popc(peers & ((1u << lane) - 1));
        const int4* src = static_cast<const int4*>(p.chunks_by_row) + 2 * c;
        int4* dst = static_cast<int4*>(p.chunks) + 2 * int64_t(at);
        dst[0] = src[0];
        dst[1] = src[1];
      }
      __syncwarp();
      if (live && lane == 31 - __clz(peers)) hist[key] += __popc(peers);  // the peers' last lane
      __syncwarp();
    }
  }
}

// Blocks of the fused grid: all co-resident (a cooperative launch), at most 4 an SM (enough
// warps for the latency-bound chunk table; more blocks make each grid barrier slower). The
// occupancy is asked once per device and variant.
template <bool kBuildCsr>
int fused_prep_blocks() {
  static std::atomic<int> per_sm_cache[64] = {};
  int device = 0;
  MSA_CUDA_CHECK(cudaGetDevice(&device));
  std::atomic<int>& slot = per_sm_cache[device & 63];
  int per_sm = slot.load(std::memory_order_relaxed);
  if (per_sm == 0) {
    MSA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, prep_fused_kernel<kBuildCsr>, kFusedThreads, 0));
    MSA_CHECK(per_sm > 0, "attention_forward: the fused prep kernel does not fit an SM");
    slot.store(per_sm, std::memory_order_relaxed);
  }
  return int(std::min<int64_t>(int64_t(current_sm_count()) * std::min(per_sm, kFusedBlocksPerSm),
                              kFusedMaxBlocks));
}

PrepParams launch_prep_fused(const AttentionArgs& a, const ProblemShape& s, const AttnPlan& w,
                             uint8_t* ws, cudaStream_t stream) {
  FusedPrepParams f;
  const bool paged = a.kv.layout != KVLayout::flat;
  if (paged) f.paged = paged_check_params(a, s, w, ws, a.status.ptr<int32_t>());
  const KeyLengthsSource keys = key_lengths(a, s, f.paged.key_offsets);
  f.p = prep_params(a, s, w, ws, keys.cu_k, keys.has_keys);
  f.check = q2k_check_params(s, f.p, keys.total_k);
  f.first = reinterpret_cast<unsigned long long*>(ws + w.check);
  f.window_count = reinterpret_cast<uint32_t*>(ws + w.window_count);
  f.window_hist = reinterpret_cast<uint32_t*>(ws + w.window_hist);
  auto at = [ws](size_t offset) { return reinterpret_cast<int32_t*>(ws + offset); };
  if (w.build_csr) {
    f.row_ptr = at(w.row_ptr);
    f.q_idx = at(w.q_idx);
    f.built_schedule = at(w.schedule);
    f.tile_rows = w.csr_tile_rows;
    f.tiles_per_head = w.csr_tiles_per_head;
    f.tile_cap = w.csr_tile_cap;
    f.tile_keys = reinterpret_cast<uint32_t*>(ws + w.csr_tile_keys);
    f.tile_counts = at(w.csr_tile_counts);
    f.row_totals = at(w.csr_row_totals);
    f.p.row_ptr = f.row_ptr;
    f.p.q_idx = f.q_idx;
    f.p.schedule = f.built_schedule;
    f.p.check_rows = 0;  // rows past the real total are empty by construction
  } else {
    use_callers_k2q(a, w, ws, f.p, f.check);
    if (w.build_schedule) f.built_schedule = at(w.schedule);
  }
  if (w.merge) {
    f.merge_count = reinterpret_cast<uint32_t*>(ws + w.merge_count);
    f.merge_list = reinterpret_cast<unsigned long long*>(ws + w.merge_list);
    f.merge_ctr = reinterpret_cast<uint32_t*>(ws + w.merge_ctr);
    f.out = a.out.data;
    f.out_stride_t = a.out.strides[0];
    f.out_stride_h = a.out.strides[1];
    f.lse = a.lse.defined() ? a.lse.ptr<float>() : nullptr;
  }
  if (w.build_csr)
    launch_cooperative_pdl(prep_fused_kernel<true>, fused_prep_blocks<true>(), kFusedThreads, stream, f);
  else
    launch_cooperative_pdl(prep_fused_kernel<false>, fused_prep_blocks<false>(), kFusedThreads, stream, f);
  return f.p;
}

// Dense attention over a page pool: the paged checks and the dense unit table in one cooperative
// grid (one CTA of kPrepThreads an SM), the chain's order: the checked lengths (block 0), the page
// ids (grid), then the paged report and the unit table (block 0). One launch instead of four.
__global__ void __launch_bounds__(kPrepThreads) dense_paged_prep_kernel(PagedCheckParams c,
                                                                        PrepParams p) {
  pdl_wait();  // pdl.cuh
  cg::grid_group grid = cg::this_grid();
  if (blockIdx.x == 0) paged_lengths_body<kPrepThreads>(c);
  grid.sync();
  page_check_body(c, int64_t(blockIdx.x) * kPrepThreads + threadIdx.x,
                  int64_t(gridDim.x) * kPrepThreads);
  grid.sync();
  pdl_trigger();
  if (blockIdx.x != 0) return;
  if (threadIdx.x == 0) report_paged_offence(c, *c.offence);
  __syncthreads();  // the status's first offence before the unit table's
  dense_units_body<kPrepThreads>(p, /*total_k=*/-1);
}

void launch_dense_paged_prep(const PagedCheckParams& c, const PrepParams& p, cudaStream_t stream) {
  // One CTA an SM: co-resident.
  launch_cooperative_pdl(dense_paged_prep_kernel, current_sm_count(), kPrepThreads, stream, c, p);
}

}  // namespace

PrepParams launch_prep(const AttentionArgs& a, const ProblemShape& s, const AttnPlan& w,
                       uint8_t* ws, cudaStream_t stream) {
  if (!w.dense && w.fused_prep) return launch_prep_fused(a, s, w, ws, stream);
  if (w.dense && a.kv.layout != KVLayout::flat) {
    const PagedCheckParams c = paged_check_params(a, s, w, ws, a.status.ptr<int32_t>());
    const KeyLengthsSource keys = key_lengths(a, s, c.key_offsets);
    const PrepParams pp = prep_params(a, s, w, ws, keys.cu_k, keys.has_keys);
    launch_dense_paged_prep(c, pp, stream);
    return pp;
  }
  // Paged: the checked, clamped lengths as a flat cu_seqlens_k, so the CSR build, the q2k check,
  // the prep kernels and the combine treat paged batches like flat ones.
  const int32_t* key_offsets =
      a.kv.layout != KVLayout::flat
          ? launch_paged_checks(a, s, w, ws, a.status.ptr<int32_t>(), stream) : nullptr;
  const KeyLengthsSource keys = key_lengths(a, s, key_offsets);
  PrepParams pp = prep_params(a, s, w, ws, keys.cu_k, keys.has_keys);
  if (w.dense) {
    launch_pdl(dense_units_kernel, 1, kPrepThreads, 0, stream, pp, keys.total_k);
    return pp;
  }
  launch_csr(a, s, w, ws, keys.total_k, pp, stream);

  const int sms = current_sm_count();
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
  return pp;
}

}  // namespace msa::cuda::sparse_fwd
