// Host side of the sm_90a indexer: capability checks, TMA descriptors, the paged-K check and the
// launch of the block scores kernel (launch_kernels.h), materialized (cuda::block_scores) or
// fused with top-K (cuda::block_topk).
#include <algorithm>
#include <bit>
#include <limits>

#include "backend.h"
#include "cuda/common/paged_checks.cuh"
#include "cuda/device/check.h"
#include "cuda/device/info.h"
#include "cuda/device/tma_map.h"
#include "cuda/sm90/block_scores/launch_kernels.h"
#include "cuda/device/smem_limit.h"

namespace msa::cuda {
namespace {

using namespace indexer_sm90;

// FP4 (fp4.cuh): value rows are copied and read 16 bytes at a time, scale rows 4 bytes at a time.
void check_fp4_rows(const QTensor& x, const char* name, const char* op) {
  const Tensor& v = x.values;
  const Tensor& sc = x.scale;
  const std::string sn = std::string(name) + ".scale";
  bool ok = reinterpret_cast<uintptr_t>(v.data) % 16 == 0;
  for (int d = 0; d + 1 < v.ndim; ++d) ok = ok && v.strides[d] % 16 == 0;
  MSA_CHECK(ok, op, ": ", name, ": FP4 rows must be 16-byte aligned on CUDA (data pointer and "
            "strides multiples of 16 bytes), got ", v.describe());
  ok = reinterpret_cast<uintptr_t>(sc.data) % 4 == 0;
  for (int d = 0; d + 1 < sc.ndim; ++d) ok = ok && sc.strides[d] % 4 == 0;
  MSA_CHECK(ok, op, ": ", sn, ": FP4 scale rows must be 4-byte aligned on CUDA (data pointer and "
            "strides multiples of 4 bytes), got ", sc.describe());
}

void check_fp4_alignment(const QTensor& q, const KVCache& kv, const char* op) {
  check_fp4_rows(q, "q", op);
  check_fp4_rows(kv.k, "k", op);
}

// Fp4Rows of q or flat K ([T, H, 64]: token, 0, head) or a page pool (page, slot, head: nhd
// [pages, slots, H, 64], hnd [pages, H, slots, 64]).
Fp4Rows fp4_rows(const QTensor& x, KVLayout layout) {
  Fp4Rows r{};
  r.values = static_cast<const uint8_t*>(x.values.data);
  r.scales = static_cast<const uint8_t*>(x.scale.data);
  r.nvfp4 = x.scale.dtype == DType::fp8_e4m3;
  r.pool = layout != KVLayout::flat;
  if (x.scale.ndim == 6) {  // preordered [L, rest_m, rest_g, 32, 4, 4] (validated by the api)
    r.preordered = 1;
    r.heads = int32_t(layout == KVLayout::paged_nhd ? x.values.shape[2] : x.values.shape[1]);
    r.rest_m = x.scale.shape[1];
    r.rest_g = int32_t(x.scale.shape[2]);
  }
  const int64_t* vs = x.values.strides;
  const int64_t* ss = x.scale.strides;
  switch (layout) {
    case KVLayout::flat:
      r.v_stride[0] = vs[0], r.v_stride[2] = vs[1];
      r.s_stride[0] = ss[0], r.s_stride[2] = ss[1];
      break;
    case KVLayout::paged_nhd:
      r.v_stride[0] = vs[0], r.v_stride[1] = vs[1], r.v_stride[2] = vs[2];
      r.s_stride[0] = ss[0], r.s_stride[1] = ss[1], r.s_stride[2] = ss[2];
      break;
    case KVLayout::paged_hnd:
      r.v_stride[0] = vs[0], r.v_stride[1] = vs[2], r.v_stride[2] = vs[1];
      r.s_stride[0] = ss[0], r.s_stride[1] = ss[2], r.s_stride[2] = ss[1];
      break;
  }
  return r;
}

// What this kernel supports; anything else is an msa::Error naming the feature.
void check_supported(const QTensor& q, const KVCache& kv, const ProblemShape& s, int blk, const char* op) {
  MSA_CHECK(q.values.dtype == DType::bf16 || q.values.dtype == DType::f16 ||
                q.values.dtype == DType::fp8_e4m3 || q.values.dtype == DType::fp4x2,
            op, ": CUDA supports bf16, f16, fp8_e4m3 and fp4x2 inputs, got ", dtype_name(q.values.dtype));
  // Head dims (traits.h kHeadDimOk): 128 for every input; 64 for bf16 / f16, 256 for FP8 e4m3.
  const DType dt = q.values.dtype;
  const bool sixteen = dt == DType::bf16 || dt == DType::f16;
  MSA_CHECK(s.head_dim == kHeadDim || (s.head_dim == 64 && sixteen) ||
                (s.head_dim == 256 && dt == DType::fp8_e4m3),
            op, ": head_dim must be 128 on CUDA (or 64 with bf16 / f16 inputs, 256 with "
            "fp8_e4m3), got ", s.head_dim, " with ", dtype_name(dt));
  // The kernels walk 128-key K tiles; 64-key blocks are a tile's halves (traits.h).
  MSA_CHECK(blk == 128 || blk == 64, op, ": kv_block_size must be 64 or 128 on CUDA, got ", blk);
  // Row tiles hold 64 / G whole tokens and the group max is a butterfly over G lanes.
  check_cuda_group(s.group, op);
  MSA_CHECK(s.total_q < std::numeric_limits<int32_t>::max() &&
                kv.k.values.shape[0] < std::numeric_limits<int32_t>::max(),
            op, ": token counts must be below 2^31 on CUDA (TMA coordinates are int32)");
  if (q.values.dtype == DType::fp4x2) check_fp4_alignment(q, kv, op);
  if (kv.layout == KVLayout::flat) return;
  // Paged: the kernel reads batch-local key indices as int32.
  MSA_CHECK(s.max_pages * s.page_size < std::numeric_limits<int32_t>::max(), op,
            ": page_table: max_pages * page_size (", s.max_pages, " * ", s.page_size,
            ") must be below 2^31 on CUDA (key indices are int32)");
}

// The fused lists (traits.h, Params) for `per_head` q2k rows on each of k's heads: each list
// selects by group / per_head heads. Both are powers of two (check_cuda_group, block_topk).
void set_lists(Params& p, int per_head) {
  p.sel_group = p.group / per_head;
  p.sel_shift = std::countr_zero(unsigned(p.sel_group));
  p.list_shift = std::countr_zero(unsigned(per_head));
  p.cta_lists = p.tokens_per_cta * per_head;
  p.list_cap = std::min(kMaxPicks, kPickKeys / p.cta_lists);
}

Params make_params(const QTensor& q, const KVCache& kv, const Tensor& cu_q, const ProblemShape& s,
                   bool causal, const Tensor& status) {
  Params p{};
  p.q_scale = q.scale.defined() ? q.scale.ptr<float>() : nullptr;
  p.k_scale = kv.k.scale.defined() ? kv.k.scale.ptr<float>() : nullptr;
  p.q_scale_kind = fp8_scale_kind(q.scale);
  p.k_scale_kind = fp8_scale_kind(kv.k.scale);
  p.cu_seqlens_q = cu_q.ptr<int32_t>();
  if (q.values.dtype == DType::fp4x2) {
    p.q_scale = p.k_scale = nullptr;
    p.q_scale_kind = p.k_scale_kind = 0;
    p.fp4.q = fp4_rows(q, KVLayout::flat);
    p.fp4.k = fp4_rows(kv.k, kv.layout);
    p.fp4.global = (p.fp4.q.nvfp4 ? q.global_scale : 1.f) * (p.fp4.k.nvfp4 ? kv.k.global_scale : 1.f);
  }
  if (kv.layout == KVLayout::flat) {
    p.keys.cu_seqlens_k = kv.cu_seqlens_k.ptr<int32_t>();
    p.keys.total_k = p.total_k = kv.k.values.shape[0];
  } else {
    p.keys.seqused_k = kv.seqused_k.defined() ? kv.seqused_k.ptr<int32_t>() : nullptr;
    p.keys.max_keys = s.max_pages * s.page_size;
    p.paged = make_paged_kv(kv.page_table.ptr<int32_t>(), kv.page_table.strides[0], s.num_pages,
                            s.page_size, kv.layout == KVLayout::paged_hnd);
  }
  p.status = status.ptr<int32_t>();
  p.total_q = s.total_q;
  p.batch = s.batch;
  p.num_q_heads = int(s.num_q_heads);
  p.num_kv_heads = int(s.num_kv_heads);
  p.group = int(s.group);
  p.row_groups = p.group < kMaxRowGroups ? p.group : kMaxRowGroups;
  p.tokens_per_cta = p.row_groups * kTileM / p.group;
  p.causal = causal;
  set_lists(p, 1);
  return p;
}

// The instantiation for an input type, block size and head dim (check_supported), row-group count
// (R = 4 for G >= 4, 2 for G = 2, 1) and the fused flag: fused runs the wide kernel (Cfg).
template <int kBlk>
KernelFn pick_kernel(DType dt, int64_t head_dim, int row_groups, bool fused) {
  if (head_dim == 64)
    return dt == DType::f16 ? kernel_for<Elem::f16, kBlk, 64>(row_groups, fused)
                            : kernel_for<Elem::bf16, kBlk, 64>(row_groups, fused);
  if (head_dim == 256) return kernel_for<Elem::e4m3, kBlk, 256>(row_groups, fused);
  switch (dt) {
    case DType::f16: return kernel_for<Elem::f16, kBlk, 128>(row_groups, fused);
    case DType::fp8_e4m3: return kernel_for<Elem::e4m3, kBlk, 128>(row_groups, fused);
    case DType::fp4x2: return kernel_for<Elem::fp4, kBlk, 128>(row_groups, fused);
    default: return kernel_for<Elem::bf16, kBlk, 128>(row_groups, fused);
  }
}

// The ICP shard kernel (launch_kernels.h) for an input type and block size.
KernelFn pick_shard_kernel(DType dt, int blk, bool wide) {
  switch (dt) {
    case DType::f16: return blk == 64 ? shard_kernel_for<Elem::f16, 64>(wide) : shard_kernel_for<Elem::f16, 128>(wide);
    case DType::fp8_e4m3: return blk == 64 ? shard_kernel_for<Elem::e4m3, 64>(wide) : shard_kernel_for<Elem::e4m3, 128>(wide);
    default: return blk == 64 ? shard_kernel_for<Elem::bf16, 64>(wide) : shard_kernel_for<Elem::bf16, 128>(wide);
  }
}

// Paged K: seqused_k and the page ids its lengths use, checked by one block before the main
// kernel (the indexer has no workspace for the sparse forward's multi-block form); the first
// offence lands in the status buffer, which check_status() turns into an msa::Error.
void launch_paged_check(const ProblemShape& s, const Params& p, cudaStream_t stream) {
  const PagedCheckParams c{.page_table = p.paged.page_table,
                                       .page_table_stride = p.paged.page_table_stride,
                                       .seqused_k = p.keys.seqused_k,
                                       .batch = s.batch,
                                       .max_pages = s.max_pages,
                                       .num_pages = s.num_pages,
                                       .page_size = int32_t(s.page_size),
                                       .max_keys = p.keys.max_keys,
                                       .status = p.status};
  launch_paged_check_block(c, stream);
}

// Splits of each CTA's items (cta_items, unfused only: the fused top-K needs every block of a
// token in one CTA). One CTA fills an SM (shared memory), so fewer CTAs than SMs leave SMs idle:
// IDX-DEC (30 requests of 8 queries over 67584 keys, G 16) is 60 CTAs of ~1000 blocks each. The
// split count is the smallest that gives at least two waves filling 90% of their SM slots
// (else the fullest), at most 32: IDX-DEC gets 4.
int item_splits(int64_t ctas) {
  const int64_t sms = current_sm_count();
  if (ctas >= 2 * sms) return 1;
  int best = 1;
  double best_fill = 0;
  for (int z = 1; z <= 32; ++z) {
    const int64_t n = ctas * z, waves = (n + sms - 1) / sms;
    const double fill = double(n) / double(waves * sms);
    if (waves >= 2 && fill >= 0.9) return z;
    if (fill > best_fill) best = z, best_fill = fill;
  }
  return best;
}

// Segment groups (Params::seg_groups): a tile packs up to tokens_per_cta consecutive tokens of
// any batches, and its CTA walks every batch's keys in turn, so a decode batch (64 requests of
// one query over 128K keys, ICP-DECODE-B64) was one CTA walking 64 requests' keys (138 ms fused).
// Where the CTAs leave SMs idle and the batches are shorter than a tile on average, each tile's
// batches are shared among up to 2 SMs / CTAs groups, at most about the batches a tile holds.
// Unfused kernels split a CTA's items instead (item_splits, up to 32 ways, balanced within a
// batch too), so they take groups only where the splits cannot fill the SMs: IDX-DEC (60 CTAs
// of two or three batches) keeps its 4 splits; the fused IDX-DEC gets 3 groups.
int seg_groups(const Params& p, int64_t ctas, bool fused) {
  const int64_t sms = current_sm_count(), fill = fused ? ctas : ctas * 32;
  if (fill >= 2 * sms || p.batch <= 1 || p.total_q >= p.batch * p.tokens_per_cta) return 1;
  const int64_t per_tile = p.tokens_per_cta * p.batch / (p.total_q > 0 ? p.total_q : 1) + 1;
  int64_t g = (2 * sms + fill - 1) / fill;
  g = g < per_tile ? g : per_tile;
  g = g < p.batch ? g : p.batch;
  return int(g < p.tokens_per_cta ? g : p.tokens_per_cta);
}

void launch(const QTensor& q, const KVCache& kv, const ProblemShape& s, const Params& p_in, int blk,
            bool check_pages, cudaStream_t stream) {
  Params p = p_in;
  const bool paged = kv.layout != KVLayout::flat;
  if (paged && check_pages && p.batch > 0) launch_paged_check(s, p, stream);  // even without queries
  if (p.total_q == 0 || p.batch == 0) return;
  const char* op = p.scores ? "block_scores" : "block_topk";
  const int tokens_per_group = kTileM / p.group;
  const DType dt = q.values.dtype;
  const bool fp4 = dt == DType::fp4x2;  // no TMA (fp4.cuh): the maps stand in for nothing
  const uint32_t cols = dt == DType::fp8_e4m3 ? 128 : 64;  // one 128-byte swizzle row per box row
  const CUtensorMap tm_q =
      fp4 ? CUtensorMap{} : make_tma_3d(q.values, cols, uint32_t(p.group), uint32_t(tokens_per_group), op);
  // Paged: boxes of 2^box_shift slots of one page (load.cuh). Without pages to read, no map over
  // an empty pool (a TMA map needs a non-empty extent): every length is 0 or every page id is bad,
  // so no K box is issued and tm_k stands in for nothing.
  const CUtensorMap tm_k =
      fp4 || (paged && (s.num_pages == 0 || s.max_pages == 0)) ? tm_q
      : !paged ? make_tma_3d(kv.k.values, cols, 1, kBlockN, op)
               : make_tma_paged(kv.k.values, kv.layout == KVLayout::paged_nhd, cols,
                                1u << p.paged.box_shift, "k", op);
  const bool wide = p.scores == nullptr;
  const int64_t tiles = (p.total_q + p.tokens_per_cta - 1) / p.tokens_per_cta;
  p.seg_groups = seg_groups(p, tiles * p.num_kv_heads, wide);
  p.item_splits = wide ? 1 : item_splits(tiles * p.num_kv_heads * p.seg_groups);
  const dim3 grid(unsigned(tiles), unsigned(p.num_kv_heads), unsigned(p.seg_groups * p.item_splits));
  const auto kernel = p.shard.world_shift != 0 ? pick_shard_kernel(dt, blk, wide)
                     : blk == 64 ? pick_kernel<64>(dt, s.head_dim, p.row_groups, wide)
                                 : pick_kernel<128>(dt, s.head_dim, p.row_groups, wide);
  const int threads = wide ? Cfg<true>::kThreads : Cfg<false>::kThreads;
  // Shared memory: FP4's raw ring only for FP4, the second blocks' selector values (sel_hi) only
  // for 64-key blocks.
  const int smem = fp4 ? kSmemBytes : blk == 64 ? kSmemBytesNoFp4 : kSmemBytesBlk128;
  allow_dynamic_smem(kernel, size_t(smem), op);
  kernel<<<grid, threads, smem, stream>>>(tm_q, tm_k, p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace

void block_scores(const BlockScoresArgs& a, const ProblemShape& s, cudaStream_t stream,
                  bool check_pages) {
  check_supported(a.q, a.kv, s, a.kv_block_size, "block_scores");
  Params p = make_params(a.q, a.kv, a.cu_seqlens_q, s, a.causal, a.status);
  p.scores = a.scores.ptr<float>();
  p.nblk_max = a.scores.shape[1];
  launch(a.q, a.kv, s, p, a.kv_block_size, check_pages, stream);
}

void check_indexer_supported(const BlockTopKArgs& a, const ProblemShape& s) {
  check_supported(a.q, a.kv, s, a.kv_block_size, "block_topk");
  MSA_CHECK(a.topk <= kMaxPicks, "topk: at most ", kMaxPicks, " on CUDA, got ", a.topk);
}

namespace {

// Whether block_topk fuses `rows` selection heads on k's `hkv` heads of `hq` query heads with
// this rule: the rows must split each of k's heads (a CTA scores one), and every list's picks
// must fit its share of the CTA's keys (traits.h: 16 a list for 256 lists; `cap`).
enum class ListFit { ok, rows, cap };
ListFit list_fit(int64_t hq, int64_t hkv, int64_t rows, int topk, int sink, int local, int& cap) {
  cap = 0;
  if (hkv <= 0 || rows <= 0 || hq % hkv != 0 || rows % hkv != 0) return ListFit::rows;
  const int64_t group = hq / hkv, per_head = rows / hkv;
  if (group > 16 || !std::has_single_bit(uint64_t(group)) || group % per_head != 0) return ListFit::rows;
  const int64_t lists = std::min<int64_t>(group, kMaxRowGroups) * kTileM / group * per_head;
  cap = int(std::min<int64_t>(kMaxPicks, kPickKeys / lists));
  return int64_t(topk) - sink - local > cap ? ListFit::cap : ListFit::ok;
}

}  // namespace

void block_topk(const BlockTopKArgs& a, const ProblemShape& s, cudaStream_t stream,
                bool check_pages) {
  check_indexer_supported(a, s);
  const int64_t rows = a.q2k.shape[0];
  int cap = 0;
  const ListFit fit = list_fit(s.num_q_heads, s.num_kv_heads, rows, a.topk, a.sink_blocks,
                               a.local_blocks, cap);
  MSA_CHECK(fit != ListFit::rows, "block_topk: ", rows, " selection heads on k's ",
            s.num_kv_heads, " heads are fused on CUDA only when they split each of k's heads (a "
            "multiple of ", s.num_kv_heads, "); run block_scores, then select_topk with "
            "num_kv_heads = ", rows);
  MSA_CHECK(fit == ListFit::ok, "block_topk: ", rows, " selection heads on k's ", s.num_kv_heads,
            " heads keep at most ", cap, " picks a row besides the forced blocks on CUDA, got topk ",
            a.topk, " with ", a.sink_blocks, " sink and ", a.local_blocks, " local blocks; run "
            "block_scores, then select_topk with num_kv_heads = ", rows);
  Params p = make_params(a.q, a.kv, a.cu_seqlens_q, s, a.causal, a.status);
  set_lists(p, int(rows / s.num_kv_heads));
  p.q2k = a.q2k.ptr<int32_t>();
  p.rule = SelectRule{a.topk, a.sink_blocks, a.local_blocks};
  p.nblk_max = std::numeric_limits<int32_t>::max();  // nothing materialized: no bound
  launch(a.q, a.kv, s, p, a.kv_block_size, check_pages, stream);
}

bool icp_lists_fuse(int64_t hi, int64_t hik, int64_t hsel, int topk, int sink, int local) {
  int cap = 0;
  return hik > 0 && hi / hik >= 4 && topk <= kMaxPicks &&
         list_fit(hi, hik, hsel, topk, sink, local, cap) == ListFit::ok;
}

// An ICP rank's scores (Params::shard): the shard [num_pages, rows, Hik, D] is a pool of
// `rows`-slot pages under the unsharded pool's table; the kernel walks shard keys in blocks of
// `rows` (one shard page: every supported layout's shard page lies in one 128-key block). With a
// plane, the partial scores [Hi, max_pages, total_q] (column i for table column i); without
// (icp_lists_fuse), the wide kernel keeps each (selection head, token)'s list as block_topk does
// and writes the rank's lists into a.ids / a.scores. Lengths and page ids are checked as the
// unsharded pool's (`s`: page_size = the page rows).
void icp_shard_scores(const IcpRankListsArgs& a, const ProblemShape& s, float* plane,
                      cudaStream_t stream) {
  constexpr const char* op = "icp_rank_lists";
  const int rows = int(a.shard.values.shape[1]);
  MSA_CHECK(rows == 64 || rows == 128, op, ": CUDA scores shard pages of 64 or 128 rows (every "
            "layout but p128 over 4 ranks, whose 32-row shard blocks the kernel's tiles do not "
            "split), got ", rows);
  KVCache kv;
  kv.k = a.shard;
  kv.layout = KVLayout::paged_nhd;
  kv.page_table = a.page_table;
  kv.seqused_k = a.seqused_k;
  ProblemShape shard_shape = s;
  shard_shape.page_size = rows;
  // Before check_supported, whose message names the head dims the other indexer kernels take.
  MSA_CHECK(s.head_dim == kHeadDim, op, ": CUDA scores shards of head dim 128, got ", s.head_dim);
  check_supported(a.index_q, kv, shard_shape, rows, op);
  MSA_CHECK(s.group >= 4, op, ": CUDA scores 4 or more index heads per key head (the shard kernel "
            "has 4 row groups), got ", s.num_q_heads, " on ", s.num_kv_heads);
  MSA_CHECK(s.max_pages * s.page_size < std::numeric_limits<int32_t>::max(), op,
            ": page_table: max_pages * page rows must be below 2^31 on CUDA (key indices are int32)");
  Params p = make_params(a.index_q, kv, a.cu_seqlens_q, shard_shape, a.causal, a.status);
  p.keys.max_keys = s.max_pages * s.page_size;  // global lengths: the unsharded pool's bound
  p.shard = make_shard_map(a.world, a.rank, rows, a.layout == IcpLayout::p128);
  if (plane != nullptr) {
    p.scores = plane;
    p.nblk_max = s.max_pages;
  } else {
    const int64_t hsel = a.ids.shape[0];
    MSA_CHECK(icp_lists_fuse(s.num_q_heads, s.num_kv_heads, hsel, a.topk, a.sink_blocks,
                             a.local_blocks),
              op, ": ", hsel, " selection heads with topk ", a.topk, " do not fit the fused lists");
    p.q2k = a.ids.ptr<int32_t>();
    p.list_scores = a.scores.ptr<float>();
    p.rule = SelectRule{a.topk, a.sink_blocks, a.local_blocks};
    set_lists(p, int(hsel / s.num_kv_heads));
    p.nblk_max = std::numeric_limits<int32_t>::max();  // nothing materialized: no bound
  }
  if (p.batch > 0) launch_paged_check(s, p, stream);
  launch(a.index_q, kv, shard_shape, p, rows, /*check_pages=*/false, stream);
}

}  // namespace msa::cuda
