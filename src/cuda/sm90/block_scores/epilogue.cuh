// Epilogue of the sm_90a indexer's consumers: the masked row max of an S tile, then either the
// score store or (fused) the group max over the G heads, written to the selector ring; plus the
// selectors' list insertion (offer) and setup, and the unfused -inf tail. Called from mma.cuh.
#pragma once

#include <cfloat>

#include <climits>

#include "cuda/sm90/block_scores/work.cuh"

namespace msa::cuda::indexer_sm90 {

// max that propagates NaN (PTX max.NaN, sm_80+): one instruction, as the CPU's NaN rule needs.
__device__ __forceinline__ float nan_max(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// This thread's key scales of one block (FP8 with per-key scales): one float2 per column pair
// n*8 + 2 (lane & 3) + {0, 1}, read from the stage's staged copy once per block and shared by
// both rows of both row groups (ks: the stage's 128 scales; its K stage must be full).
__device__ __forceinline__ void load_key_scales(const float* ks, int lane, float2 (&k)[16]) {
  const float2* ks2 = reinterpret_cast<const float2*>(ks) + (lane & 3);
#pragma unroll
  for (int n = 0; n < 16; ++n) k[n] = ks2[n * 4];
}

// Max over this thread's columns of its two accumulator rows (u = 0: row lane/4, elements
// n*4 + {0, 1}; u = 1: row lane/4 + 8, elements n*4 + {2, 3}), each reduced over the quad that
// shares the row; every lane of the quad ends with both row maxima, out[i][u] for block i of the
// tile (kBlk = 64: columns 0-63 are groups n < 8, block 0, and 64-127 block 1; each block's
// chains are its own, so its maximum is the one a 64-wide tile would give). kScaled (FP8 with
// per-key scales): each value is first multiplied by its column's key scale (k: load_key_scales).
// kMasked: only columns <= lim[u] (in [-1, 127], tile columns) count; the caller takes the
// unmasked form when the tile is wholly visible to every row of the warp (all tiles but the
// diagonal and the batch tail).
// The reduction order is the previous per-row epilogue's, so the maxima are the same bits: a
// wholly visible row folds max(v0, v1) pairs into 4 chains over n & 3, a partly visible row
// folds one masked element at a time (-inf past lim), then both combine the chains and the
// quad the same way. (A chain's first fold with its -inf start is dropped: max.NaN(-inf, x) is
// x, or the canonical NaN when x is NaN, which the next max.NaN returns anyway.)
// This runs for every S element: instruction issue, not the tensor cores, bounds the kernel
// (ncu: issue slots 36-44% busy, ALU the busiest pipe), so nothing here is per-tile setup.
// Where the key scales come from (kScaled): kKeep, k as loaded (load_key_scales); kRefill, the
// same, and once a column pair's scale has served both rows k[n] is reloaded from `next` (the
// next block's staged scales): the next block's scales arrive during this epilogue in the same
// registers, instead of by a load whose shared-memory latency sits on the warpgroup's chain
// between its two epilogues; kSmem, each pair read from `next` (this block's
// staged scales) where it is used, k untouched (the wide consumers, Cfg: no scale registers).
enum ScaleSrc { kKeep, kRefill, kSmem };
template <int kBlk, bool kMasked, bool kScaled, int kSrc = kKeep>
__device__ __forceinline__ void row_max2(const float (&s)[64], float2 (&k)[16], int lane,
                                         const int (&lim)[2],
                                         float (&out)[kBlocksPerTile<kBlk>][2],
                                         const float* next = nullptr) {
  constexpr int kB = kBlocksPerTile<kBlk>, kGroups = 16 / kB;  // 8-column groups per block
  const int c0 = 2 * (lane & 3);
  const float2* next2 = reinterpret_cast<const float2*>(next) + (lane & 3);
  // Independent chains for ILP, pair-wise and element-wise folds, 4 per row and block.
  float pair[kB][2][4], elem[kB][2][4];
#pragma unroll
  for (int n = 0; n < 16; ++n) {
    const int i = n / kGroups;               // the column group's block
    const bool first = n % kGroups < 4;      // its chain's first fold
    float2 kn{1.f, 1.f};
    if constexpr (kScaled) kn = kSrc == kSmem ? next2[n * 4] : k[n];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      float v0 = s[n * 4 + 2 * u], v1 = s[n * 4 + 2 * u + 1];
      if constexpr (kScaled) {
        v0 *= kn.x;
        v1 *= kn.y;
      }
      const float p = nan_max(v0, v1);
      pair[i][u][n & 3] = first ? p : nan_max(pair[i][u][n & 3], p);
      if constexpr (kMasked) {
        v0 = n * 8 + c0 <= lim[u] ? v0 : -INFINITY;
        v1 = n * 8 + c0 + 1 <= lim[u] ? v1 : -INFINITY;
        elem[i][u][n & 3] = nan_max(first ? v0 : nan_max(elem[i][u][n & 3], v0), v1);
      }
    }
    if constexpr (kSrc == kRefill) k[n] = next2[n * 4];
  }
#pragma unroll
  for (int i = 0; i < kB; ++i)
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      float m[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        m[c] = pair[i][u][c];
        // Block i is wholly visible to the row iff its last column is.
        if constexpr (kMasked) m[c] = lim[u] < (i + 1) * kBlk - 1 ? elem[i][u][c] : m[c];
      }
      float r = nan_max(nan_max(m[0], m[1]), nan_max(m[2], m[3]));
      r = nan_max(r, __shfl_xor_sync(0xffffffffu, r, 1));
      out[i][u] = nan_max(r, __shfl_xor_sync(0xffffffffu, r, 2));
    }
}

// FP8 scales (Params: 0 none, 1 per tensor, 2 per token, 3 per token and head).
__device__ __forceinline__ float scale_at(const float* scale, int kind, int64_t token, int64_t head,
                                          int64_t heads) {
  switch (kind) {
    case 1: return scale[0];
    case 2: return scale[token];
    case 3: return scale[token * heads + head];
    default: return 1.f;
  }
}

// Group max over the G heads of each token (rows tok*G .. tok*G+G-1 are adjacent) of this
// thread's two rows (m: rows lane/4 and lane/4 + 8; lane bits 2-4 index rows within an 8-row
// half); every lane of a token's rows ends with it. NaN heads are skipped (CPU: fmax), like
// top-K's rule. G = 16: one token spans both halves, so the halves merge first and one chain of
// three shuffle rounds follows. Otherwise both halves' chains run interleaved, a round past the
// group's size keeping its value (a uniform select, no branch): the two chains behind per-round
// branches were six dependent shuffle rounds per tile (ncu).
// kNan (an ICP shard's lists): NaN if any head is NaN instead, so that the selector sees a NaN
// in any of a list's heads (the op reports it, as the CPU reference does).
template <bool kNan>
__device__ __forceinline__ float head_max(float a, float b) {
  if constexpr (kNan) return nan_max(a, b);
  else return fmaxf(a, b);
}
template <bool kNan = false>
__device__ __forceinline__ void group_max(const float (&m)[2], int group, float (&g)[2]) {
  if (group == 16) {
    float x = head_max<kNan>(m[0], m[1]);
#pragma unroll
    for (int step = 4; step <= 16; step *= 2) x = head_max<kNan>(x, __shfl_xor_sync(0xffffffffu, x, step));
    g[0] = g[1] = x;
    return;
  }
  g[0] = m[0];
  g[1] = m[1];
#pragma unroll
  for (int step = 4; step <= 16; step *= 2) {  // rows lane/4 ^ step/4 join when G >= step/2
    const float o0 = __shfl_xor_sync(0xffffffffu, g[0], step);
    const float o1 = __shfl_xor_sync(0xffffffffu, g[1], step);
    g[0] = group >= step / 2 ? head_max<kNan>(g[0], o0) : g[0];
    g[1] = group >= step / 2 ? head_max<kNan>(g[1], o1) : g[1];
  }
}

// The same for a 64-key tile's two blocks (m[2 i], m[2 i + 1]: block i's two rows), their
// chains sharing the shuffle rounds rather than running one after the other. (The two-row form
// above stays as it is: written as this loop for one block, the 128-key kernels' SASS changed,
// a select turned into a branch.)
template <bool kNan = false>
__device__ __forceinline__ void group_max(const float (&m)[4], int group, float (&g)[4]) {
  if (group == 16) {
    float x[2] = {head_max<kNan>(m[0], m[1]), head_max<kNan>(m[2], m[3])};
#pragma unroll
    for (int step = 4; step <= 16; step *= 2)
#pragma unroll
      for (int i = 0; i < 2; ++i) x[i] = head_max<kNan>(x[i], __shfl_xor_sync(0xffffffffu, x[i], step));
    g[0] = g[1] = x[0];
    g[2] = g[3] = x[1];
    return;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) g[i] = m[i];
#pragma unroll
  for (int step = 4; step <= 16; step *= 2) {
    float o[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) o[i] = __shfl_xor_sync(0xffffffffu, g[i], step);
#pragma unroll
    for (int i = 0; i < 4; ++i) g[i] = group >= step / 2 ? head_max<kNan>(g[i], o[i]) : g[i];
  }
}

// A full list is a binary min-heap of its keys (key j at keys[j * stride], the least at 0), so
// that a replacement costs a sift down of log2(want) levels instead of a scan of all `want` keys:
// the scan was the selectors' bound where a selector serves four lists (MiniMax-M3's lists per
// index head, 16 keys each), nearly every offer replacing in some lane of the warp: IDX-32K-M3-fp8
// fused 1.86 ms against 1.11 ms for block scores + select_topk. Writing a row ranks its keys
// (write_q2k_row, write_ranked_row), so the heap order is never seen. Keys are distinct (the
// block id is in the key).
__device__ __forceinline__ void sift_down(uint64_t* keys, int stride, int n, int i, uint64_t key) {
  for (int c = 2 * i + 1; c < n; c = 2 * i + 1) {
    uint64_t kc = keys[c * stride];
    if (c + 1 < n) {
      const uint64_t kr = keys[(c + 1) * stride];
      if (kr < kc) {
        kc = kr;
        ++c;
      }
    }
    if (key < kc) break;
    keys[i * stride] = kc;
    i = c;
  }
  keys[i * stride] = key;
}

// The filter value of a full list whose least key is `key` (ListState::thr): its score, -inf
// for a NaN (any number then goes on to the exact test).
__device__ __forceinline__ float list_threshold(uint64_t key) {
  const float s = key_score(key);
  return s != s ? -INFINITY : s;
}

// Streams candidate block kb into a best-`want` list (the selector lane that took the list from
// its warp's queue, run_selector): ls the list's state, keys its first key. The list fills
// unordered and becomes a heap when full; thr follows its least key.
__device__ __forceinline__ void offer(ListState& ls, uint64_t* keys, int stride,
                                      const SelectRule& rule, int64_t kb, float v) {
  const int nvis = ls.nvis, n = ls.want, count = ls.count;
  if (kb >= nvis || is_forced(rule, kb, nvis) || n <= 0) return;
  const uint64_t key = rank_key(v, kb);
  if (count < n) {
    keys[count * stride] = key;
    ls.count = int16_t(count + 1);
    if (count + 1 < n) return;
    for (int i = n / 2 - 1; i >= 0; --i) sift_down(keys, stride, n, i, keys[i * stride]);
  } else {
    if (key <= keys[0]) return;
    sift_down(keys, stride, n, 0, key);
  }
  ls.thr = list_threshold(keys[0]);
}

struct RowInfo {  // one accumulator row of a row group
  int64_t t;      // global token
  int g;          // head within the group
  int cta_tok;    // token index within the CTA
};

__device__ __forceinline__ RowInfo row_info(const Params& p, int64_t t0, int r, int row) {
  const int tok = row / p.group;
  return RowInfo{t0 + r * (kTileM / p.group) + tok, row - tok * p.group, r * (kTileM / p.group) + tok};
}

// What the epilogue needs of this thread's two rows of one row group in the current batch
// segment, computed once per segment (segment_rows), never per block.
struct SegRows {
  int last[2];    // batch-local index of the row's last visible key, clamped to [-1, lk - 1]
  int full_last;  // min of `last` over the warp's rows in the segment (INT_MAX if none): K tile
                  // kb is wholly visible to all of them iff kb * 128 + 127 <= full_last (warp-uniform)
  float qk[2];    // FP8: q scale * per-tensor key scale (per-key scales apply per column); FP4:
                  // the NVFP4 global scales' product
  float* out[2];  // unfused: &scores[hq, 0, t], null for rows outside the segment
  int pick[2];    // fused: the row in the CTA (r * 64 + its row: cta_tok * G + g), plus
                  // kMaxLists when the token is outside the segment; the first row of each list
                  // (traits.h: the row over sel_group) reports the list's group max, or that it
                  // has none this block. (The list itself is found in the epilogue: computed
                  // here, once a segment, it spilled the FP8 consumers' loop bound.)
};

// Rows of row group r held by this thread in segment `seg` (row lane/4 + 8 u of the warp's 16).
// Also reports negative and non-finite FP8 scales, with the arguments the per-block check used
// to give.
template <Elem kElem, bool kShard = false>  // kShard: work.cuh, next_segment
__device__ __forceinline__ SegRows segment_rows(const Params& p, const SegBounds& seg, int64_t h,
                                                int64_t t0, int r, int warp, int lane) {
  SegRows sr;
  int vis_last = INT_MAX;
  const float k_const =
      per_key_scales<kElem>(p) ? 1.f : scale_at(p.k_scale, p.k_scale_kind, 0, 0, 0);
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const RowInfo ri = row_info(p, t0, r, warp * 16 + (lane >> 2) + 8 * u);
    const int64_t hq = h * p.group + ri.g;
    // The block's keys past lk belong to the next batch (or are TMA zeros): never visible.
    int64_t last = p.causal ? ri.t - seg.q0 + seg.lk - seg.lq : seg.lk - 1;
    last = last < seg.lk - 1 ? last : seg.lk - 1;
    if constexpr (kShard) last = shard_keys(p.shard, last + 1) - 1;  // the shard's keys below it
    sr.last[u] = int(last < -1 ? -1 : last);  // lk < 2^31 (launch.cu)
    const bool in = ri.t >= seg.t_begin && ri.t < seg.t_end;
    if (in && sr.last[u] < vis_last) vis_last = sr.last[u];
    sr.out[u] = in && p.scores != nullptr ? p.scores + hq * p.nblk_max * p.total_q + ri.t : nullptr;
    sr.pick[u] = r * kTileM + warp * 16 + (lane >> 2) + 8 * u + (in ? 0 : kMaxLists);
    sr.qk[u] = 1.f;
    if constexpr (kElem == Elem::e4m3) {
      const int64_t t = ri.t < p.total_q ? ri.t : 0;  // rows past total_q are never stored
      const float qs = scale_at(p.q_scale, p.q_scale_kind, t, hq, p.num_q_heads);
      if (!(qs >= 0.f && qs <= FLT_MAX) || !(k_const >= 0.f && k_const <= FLT_MAX))
        flag_status(p.status, int32_t(StatusCode::negative_scale), 0, t, hq);
      sr.qk[u] = qs * k_const;
    } else if constexpr (kElem == Elem::fp4) {
      sr.qk[u] = p.fp4.global;
    }
  }
  sr.full_last = __reduce_min_sync(0xffffffffu, vis_last);
  return sr;
}

// Epilogue of one row group's S tile for K tile kb, blocks kb (kBlk = 128) or 2 kb and 2 kb + 1
// (kBlk = 64): kb_off = the scores offset of the tile's first block (its id * total_q); k: the
// thread's key scales of the tile (read only with kPerKey). FP8: score =
// qs * max_j(dot_j * ks_j) for scales >= 0; per-key scales multiply each value, a per-tensor key
// scale joins the query scale after the max.
// kFused (p.scores == nullptr) is the caller's loop flag: a runtime test here kept the other
// path's code and branches in each loop, ~10 instructions per tile on the unfused FP8 loop.
// kSrc (with kPerKey): where the key scales come from (row_max2; k_next: the next block's
// staged scales for kRefill, this block's for kSmem).
// kShard (fused): an ICP rank's lists: the group max propagates NaN (group_max), and a list's
// ring flag holds which of the tile's blocks the rank holds a key of visible to the token (bit
// i: block i; the selector offers only those, as the reference lists only them).
template <Elem kElem, int kBlk, bool kPerKey, bool kFused, int kSrc = kKeep, bool kShard = false>
__device__ __forceinline__ void epilogue(const Params& p, SharedStorage& sh, const float (&s)[64],
                                         const SegRows& sr, int kb, int64_t kb_off, int lane,
                                         float2 (&k)[16], int sel_slot,
                                         const float* k_next = nullptr) {
  constexpr int kB = kBlocksPerTile<kBlk>;
  const int key0 = kb * kBlockN;
  float m[kB][2];
  if (key0 + (kBlockN - 1) <= sr.full_last) {
    row_max2<kBlk, false, kPerKey, kSrc>(s, k, lane, sr.last, m, k_next);
  } else {
    // Diagonal or tail tile: per-row limits in this tile's columns, in [-1, 127].
    int lim[2];
#pragma unroll
    for (int u = 0; u < 2; ++u) lim[u] = max(-1, min(kBlockN - 1, sr.last[u] - key0));
    row_max2<kBlk, true, kPerKey, kSrc>(s, k, lane, lim, m, k_next);
  }
  if constexpr (kElem == Elem::e4m3 || kElem == Elem::fp4) {
#pragma unroll
    for (int i = 0; i < kB; ++i)
#pragma unroll
      for (int u = 0; u < 2; ++u)
        if (m[i][u] != -INFINITY) m[i][u] *= sr.qk[u];  // no visible key stays -inf, even at scale 0
  }
  // Lane 0 of the quad writes both rows: its maxima are the ones the previous epilogue stored.
  // 64-key blocks: the tile's second block is stored while it is inside the scores (a last tile
  // may hold one block past nblk_max), as -inf when no row sees a key in it (blocks_written).
  if constexpr (!kFused) {
    if ((lane & 3) == 0) {
      if (sr.out[0] != nullptr) sr.out[0][kb_off] = m[0][0];
      if (sr.out[1] != nullptr) sr.out[1][kb_off] = m[0][1];
      if constexpr (kB == 2) {
        if (int64_t(kb) * 2 + 1 < p.nblk_max) {
          if (sr.out[0] != nullptr) sr.out[0][kb_off + p.total_q] = m[1][0];
          if (sr.out[1] != nullptr) sr.out[1][kb_off + p.total_q] = m[1][1];
        }
      }
    }
    return;
  }
  // The group max over each list's heads (sel_group: all G heads of the token when one list
  // serves them, 1 when each head selects alone).
  float g[kB][2];
  if constexpr (kB == 1) {
    group_max<kShard>(m[0], p.sel_group, g[0]);
  } else {  // both blocks through one chain of rounds
    const float m4[4] = {m[0][0], m[0][1], m[1][0], m[1][1]};
    float g4[4];
    group_max<kShard>(m4, p.sel_group, g4);
    g[0][0] = g4[0], g[0][1] = g4[1], g[1][0] = g4[2], g[1][1] = g4[3];
  }
  if ((lane & 3) == 0) {  // into the selector ring (run_selector); the caller holds the slot
    SelSlot& slot = sh.sel[sel_slot];
    const int first = p.sel_group - 1;  // a list's first row: its row bits below sel_group clear
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      if ((sr.pick[u] & first) == 0) {
        const int l = (sr.pick[u] % kMaxLists) >> p.sel_shift;
        slot.val[l] = g[0][u];
        if constexpr (kB == 2) sh.sel_hi[sel_slot][l] = g[1][u];
        if constexpr (kShard) {  // the blocks holding a shard key <= the row's last visible one
          const int held = (key0 <= sr.last[u] ? 1 : 0) | (kB == 2 && key0 + kBlk <= sr.last[u] ? 2 : 0);
          slot.ok[l] = uint8_t(sr.pick[u] < kMaxLists ? held : 0);
        } else {
          slot.ok[l] = sr.pick[u] < kMaxLists;
        }
      }
    }
  }
}

// Fused top-K: a list of token t, its visibility (in blocks of kBlk keys) and pick budget,
// before its first offer. The budget is at most the list's size (p.list_cap; launch.cu refuses
// a topk whose picks could pass it, so the cap never binds).
// kShard: nvis counts the unsharded pool's 128-key blocks (an ICP rank selects among global
// blocks; its kernel blocks are shard pages, shard_page_block).
template <int kBlk, bool kShard = false>
__device__ inline void init_list(const Params& p, ListState& ls, int64_t t) {
  const int64_t b = find_batch(p.cu_seqlens_q, p.batch, t);
  Segment seg;
  int64_t cursor = b;
  constexpr int kVisBlk = kShard ? kBlockN : kBlk;
  ls.nvis = next_segment<kBlk>(p, t, t + 1, cursor, seg) ? int32_t(token_blocks<kVisBlk>(p, seg, t)) : 0;
  const int want = p.rule.topk - int(forced_count(p.rule, ls.nvis));
  ls.want = int8_t(want < p.list_cap ? want : p.list_cap);
  ls.count = 0;
  ls.thr = ls.want > 0 ? __int_as_float(0x7fc00000) : INFINITY;  // NaN: every value goes on
}

// Unfused: -inf for the blocks past those each segment's items write (blocks_written: no row of
// the segment sees a key in them). Run by the producer warpgroup's warps 1-3, idle otherwise in the unfused kernel,
// while the consumers run their block loop: as the consumers' epilogue after the loop it held
// the SM with the tensor cores idle (ncu: 15% of the FP8 kernel's warp samples,
// uncoalesced stores). Rows (head g, block kb), kb fastest, are dealt to the warps in turn; a
// row's [t_begin, t_end) is one coalesced run, written by L lanes (the power of two >= its
// stores, at most 32) in 16-byte stores when the row and its length allow, else 4-byte ones, so
// a warp writes 32 / L rows per step (a 16-token row: 4 lanes, 8 rows); warps walk to their
// next rows by adding, not by division. Each store instruction is the fill warps' issue cost
// taken from the consumers on their schedulers (35 instructions per 16-token row, then ~20 per
// two rows, 10% of the FP8 kernel's warp samples).
template <int kBlk, bool kShard = false>
__device__ inline void fill_tail(const Params& p, int64_t h, int64_t t0, int64_t t1, int warp, int warps,
                          int lane) {
  Segment seg;
  int64_t b = p.batch > 0 ? find_batch(p.cu_seqlens_q, p.batch, t0) : 0;
  while (next_segment<kBlk, kShard>(p, t0, t1, b, seg)) {
    // 32-bit counters (this runs at the producer's 40 registers): blocks < 2^25, tile tokens <= 64.
    const int tokens = int(seg.t_end - seg.t_begin), nblk = int(p.nblk_max);
    const int first = int(blocks_written<kBlk>(p, seg.nblocks)), tail = nblk - first;
    if (tail <= 0) continue;
    float* const base = p.scores + seg.t_begin;
    // 16-byte stores when every row start is 16-byte aligned and the length is whole float4s.
    const bool vec = (p.total_q & 3) == 0 && (tokens & 3) == 0 &&
                     (reinterpret_cast<uintptr_t>(base) & 15) == 0;
    const int n = vec ? tokens / 4 : tokens;  // stores per row
    int L = 1;
    while (L < n && L < 32) L *= 2;
    const int rows = 32 / L, t_lane = lane % L;  // rows per warp step, this lane's first store
    const int step = warps * rows;
    int g = 0, kb = first + warp * rows + lane / L;
    while (kb >= nblk) {
      kb -= tail;
      ++g;
    }
    while (g < p.group) {
      float* row = base + ((h * p.group + g) * p.nblk_max + kb) * p.total_q;
      if (vec) {
        const float4 ninf = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
        for (int t = t_lane; t < n; t += L) reinterpret_cast<float4*>(row)[t] = ninf;
      } else {
        for (int t = t_lane; t < n; t += L) row[t] = -INFINITY;
      }
      kb += step;
      while (kb >= nblk) {
        kb -= tail;
        ++g;
      }
    }
  }
}

}  // namespace msa::cuda::indexer_sm90
