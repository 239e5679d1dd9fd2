// The decode main kernel: one CTA per (work item, kv head). It checks its request and builds the
// sparse union (union.cuh, all threads); then the producer warpgroup streams the item's key slots
// into a ring of stages (load.cuh: page lookups, TMA boxes and cp.async rows, or cp.async rows
// alone for token ids; each stage's arrival on its `full` mbarrier), while the consumer warps
// attend their (row tile, key partition) share of every stage (attend.cuh) and free it by arriving
// at its named barrier; the consumers merge (epilogue.cuh), the last split of a request merges the
// splits (combine.cuh) and the last CTA whose producers are done writes the status (status.cuh).
// Included by launch_kernels.cuh only.
//
// Consumer roles: rows = queries x G (<= 16 kW / parts, parts = plan.h dim_parts: 2 at D = 256,
// else 1) form nrt 16-row tiles; the kW consumer warps split as parts x nrt row tiles x kp key
// partitions (kp the largest power of two <= kW / (parts nrt)), warp w = dp nrt kp + kpi nrt + rt
// taking row tile rt, keys [kpi * S / kp, ...) of every stage of S slots, and the O of head dims
// [dp D / parts, ...).
#pragma once

#include "cuda/device/pipeline.cuh"
#include "cuda/device/sm90.cuh"
#include "cuda/sm90/decode/combine.cuh"
#include "cuda/sm90/decode/load_fp4.cuh"
#include "cuda/sm90/decode/union.cuh"

namespace msa::cuda::decode {

// Stage s is freed through named barrier NamedBarrier::kStageEmpty0 + s (traits.h): every
// consumer thread arrives (bar.arrive: release, no wait) after its reads of the stage, and the
// producer threads sync there (acquire, kSync) before copying into it again. One hardware barrier
// per stage instead of an mbarrier that 128-256 threads arrive at one by one (DEC-B32-dense
// 271 -> 328 us with per-thread mbarrier arrivals), and unlike lane 0 arriving after __syncwarp
// each reader's own release orders its reads (racecheck).
//
// Named-barrier ids must be constants for ptxas to count 3 + kStages barriers, not all 16: one
// predicated barrier op per stage (the stage is warp-uniform), which a switch would compile to an
// indirect branch through a jump table at every step.
template <bool kSync>
__device__ __forceinline__ void empty_barrier(int stage, uint32_t threads) {
  constexpr uint32_t b0 = uint32_t(NamedBarrier::kStageEmpty0);
  constexpr uint32_t b1 = uint32_t(NamedBarrier::kStageEmpty1);
  constexpr uint32_t b2 = uint32_t(NamedBarrier::kStageEmpty2);
  if constexpr (kSync)
    asm volatile("{\n\t.reg .pred p;\n\t"
                 "setp.eq.s32 p, %0, 0;\n\t@p bar.sync %1, %4;\n\t"
                 "setp.eq.s32 p, %0, 1;\n\t@p bar.sync %2, %4;\n\t"
                 "setp.eq.s32 p, %0, 2;\n\t@p bar.sync %3, %4;\n\t}"
                 ::"r"(stage), "n"(b0), "n"(b1), "n"(b2), "r"(threads)
                 : "memory");
  else
    asm volatile("{\n\t.reg .pred p;\n\t"
                 "setp.eq.s32 p, %0, 0;\n\t@p bar.arrive %1, %4;\n\t"
                 "setp.eq.s32 p, %0, 1;\n\t@p bar.arrive %2, %4;\n\t"
                 "setp.eq.s32 p, %0, 2;\n\t@p bar.arrive %3, %4;\n\t}"
                 ::"r"(stage), "n"(b0), "n"(b1), "n"(b2), "r"(threads)
                 : "memory");
}

// The consumer warps' stage loop (kernel below): per-warp constants fixed before the loop, the
// stage and phase stepped instead of divided. Every instruction between a stage's arrival and its
// first ldmatrix delays the warp: that bookkeeping was once ~40% of the FP8 consumers' sampled
// time (ncu).
struct ConsumerLoop {
  uint32_t full = 0, pipe = 0;       // shared addresses: the stages' full barriers, the pipeline
  const int* slot_key = nullptr;
  const float* slot_scale = nullptr;  // FP8 per-slot scales (K then V per stage), or null
  int steps = 0, s0 = 0, e0 = 0;
  const uint32_t* masks = nullptr;   // union masks; null when every row selected every entry
  int kb0 = 0;                       // the warp's first slot in each stage
  int warp_climit = 0;               // the lowest causal limit of the warp's rows
  uint32_t v_part = 0;               // bytes from a stage's V region to the warp's dim part
  bool active = false;
};

// kKw: keys per warp per stage when known at compile time, else 0 (kw_rt at run time).
// kSlotScales: FP8 K and V scales per slot (attend).
template <int kKw, int kS, typename Tr, bool kSlotScales, typename TQ, KV kKV, int kD>
__device__ __forceinline__ void consume(const DecodeParams& p, WarpTile<TQ, kKV, kD>& w,
                                        const ConsumerLoop& lp, int kw_rt) {
  constexpr int kWin = Tr::kWindowKeys, kTiles = kWin / 8;
  const int kw = kKw > 0 ? kKw : kw_rt;
  const uint32_t v_part = Tr::kDimParts > 1 ? lp.v_part : 0u;
  const int nn = kKw > 0 ? (kKw / 8 < kTiles ? kKw / 8 : kTiles) : min(kTiles, kw / 8);
  const int lane = threadIdx.x & 31;
  const bool in0 = lane < 8 * nn, in1 = lane + 32 < 8 * nn;
  sm90::RingState<Tr::kStages> ring;
  // Counting the steps down keeps one loop register; slots past the item (a last, partial stage)
  // hold key -1 (lookup_stage), so their windows end at the jmax test without a bound. ptxas
  // spills the counters' start values before the role split (under the launch bound's 128
  // registers): reg_copy starts the loop from fresh registers.
  for (int left = sm90::reg_copy(lp.steps), slot0 = sm90::reg_copy(lp.s0); left > 0; --left, slot0 += kS) {
    sm90::mbar_wait(lp.full + uint32_t(ring.stage) * 8u, ring.phase);
    if (lp.active) {
      const uint32_t k_stage = lp.pipe + uint32_t(ring.stage) * Tr::kStageBytes;
      const int* sk = lp.slot_key + ring.stage * kS;
      for (int kb = lp.kb0; kb < lp.kb0 + kw; kb += kWin) {
        const int j0 = in0 ? sk[kb + lane] : -1, j1 = in1 ? sk[kb + lane + 32] : -1;
        const int jmax = __reduce_max_sync(0xffffffffu, max(j0, j1));
        if (jmax < 0) continue;  // no key in the window
        bool sel0 = true, sel1 = true, all_sel = true;
        if (lp.masks) {  // the union entry of the window's slots
          const uint32_t m = lp.masks[((slot0 + kb) >> p.block_shift) - lp.e0];
          sel0 = (m & w.qbit[0]) != 0;
          sel1 = (m & w.qbit[1]) != 0;
          if (!__any_sync(0xffffffffu, sel0 || sel1)) continue;
          all_sel = __all_sync(0xffffffffu, sel0 && sel1);
        }
        // Whole window: no empty slot, every key at or below every row's causal limit, every
        // row selected the block.
        const int jmin = __reduce_min_sync(0xffffffffu, min(in0 ? j0 : INT_MAX, in1 ? j1 : INT_MAX));
        const bool whole = jmin >= 0 && jmax <= lp.warp_climit && all_sel;
        attend<kS, kTiles, kSlotScales>(w, k_stage, k_stage + Tr::kStageKBytes + v_part, sk,
                                        kSlotScales ? lp.slot_scale + ring.stage * 2 * kS : nullptr,
                                        kb, nn, sel0, sel1, whole);
      }
    }
    // Released only while more than kStages steps remain (this one included): the producer syncs
    // only before refilling, and the last stages' arrivals would leave a barrier generation open.
    if (left > Tr::kStages) empty_barrier<false>(ring.stage, Tr::kThreads);
    ring.advance();
  }
}

// The NVFP4 producers' loop (load_fp4.cuh): every thread copies its slot of the stage
// kRawStages - 1 steps ahead, then converts the landed one into the pipeline stage once the
// consumers freed it, and arrives on the stage's full barrier (its stores released by the arrive).
template <int kW>
__device__ __forceinline__ void produce_fp4(const DecodeParams& p, const TileSource& src, int s0,
                                            int steps, uint32_t pipe, uint64_t* full,
                                            int* slot_key) {
  using R = Fp4Ring<kW>;
  using Tr = typename R::Tr;
  constexpr int kS = Tr::kStageKeys, kRS = Tr::kRawStages;
  constexpr uint32_t kRawBytes = uint32_t(Tr::kRawStageBytes);
  const uint32_t raw0 = pipe + uint32_t(Tr::kPipeBytes);
  const int row = threadIdx.x / R::kThreadsPerRow;
  const bool row_writer = threadIdx.x % R::kThreadsPerRow == 0;
#pragma unroll
  for (int i = 0; i < kRS - 1; ++i) {
    if (i < steps) issue_fp4<kW>(p, src, lookup_row(p, src, s0 + i * kS + row), raw0 + i * kRawBytes);
    sm90::cp_async_commit();
  }
  // The slot of step `it + kRS - 1`, looked up while step it converts.
  RowSource next;
  if (kRS - 1 < steps) next = lookup_row(p, src, s0 + (kRS - 1) * kS + row);
  sm90::RingState<Tr::kStages> ring;
  int rs = 0;  // packed slot of step it
  for (int it = 0; it < steps; ++it) {
    const int ahead = it + kRS - 1;
    // Its packed slot was converted at step it - 1, by this thread (its own rows only).
    if (ahead < steps) issue_fp4<kW>(p, src, next, raw0 + uint32_t((rs + kRS - 1) % kRS) * kRawBytes);
    sm90::cp_async_commit();
    if (ahead + 1 < steps) next = lookup_row(p, src, s0 + (ahead + 1) * kS + row);
    sm90::cp_async_wait<kRS - 1>();  // step it's copies have landed
    if (it >= Tr::kStages) empty_barrier<true>(ring.stage, Tr::kThreads);
    const uint32_t raw = raw0 + uint32_t(rs) * kRawBytes;
    const uint32_t dst = pipe + uint32_t(ring.stage) * Tr::kStageBytes;
    convert_fp4_rows<kW>(raw, raw + R::kKSfOff, dst);
    convert_fp4_rows<kW>(raw + R::kVOff, raw + R::kVSfOff, dst + Tr::kStageKBytes);
    if (row_writer)
      slot_key[ring.stage * kS + row] = int(sm90::ld_shared_u32(raw + R::kKeyOff + uint32_t(row) * 4u));
    sm90::mbar_arrive(&full[ring.stage]);
    rs = rs + 1 == kRS ? 0 : rs + 1;
    ring.advance();
  }
}

// The producers' loop over token ids (kv_block_size 1, load.cuh issue_token_stage): every row of
// every stage by cp.async, each thread's rows looked up a stage ahead; each producer thread
// arrives twice per fill as in the block loop (no TMA bytes to announce).
template <KV kKV, int kW, int kD>
__device__ __forceinline__ void produce_tokens(const DecodeParams& p, const TileSource& src,
                                               int s0, int steps, uint32_t pipe, uint64_t* full,
                                               int* slot_key, float* slot_scale) {
  using Tr = Traits<kKV, kW, kD>;
  constexpr int kS = Tr::kStageKeys;
  TokenRows<kKV, kW, kD> cur, next;
  if (steps > 0) cur = lookup_token_rows<kKV, kW, kD>(p, src, s0);
  for (int it = 0; it < steps; ++it) {
    const int stage = it % Tr::kStages;
    if (it + 1 < steps) next = lookup_token_rows<kKV, kW, kD>(p, src, s0 + (it + 1) * kS);
    if (it >= Tr::kStages) empty_barrier<true>(stage, Tr::kThreads);
    issue_token_stage<kKV, kW, kD>(p, src, cur, pipe + stage * Tr::kStageBytes,
                                   slot_key + stage * kS,
                                   slot_scale ? slot_scale + stage * 2 * kS : nullptr);
    sm90::mbar_arrive(&full[stage]);
    sm90::cp_async_mbar_arrive(&full[stage]);
    cur = next;
  }
}

// tm_k / tm_v: the K and V pools as 4-D TMA maps with boxes of 2^p.box_shift slots x one 128-byte
// line (launch.cu; unused by NVFP4 and token kernels). kSlotScales: FP8 with per-slot scales
// (p.slot_scales), a kernel of its own so that the per-tensor kernels keep their code (one runtime
// branch cost them 1.6% on DEC-MTP). kTokens: sparse plans of token ids (kv_block_size 1), whose
// producers copy every row by cp.async (produce_tokens), also kernels of their own: a runtime
// branch to that loop changed the block kernels' register allocation and spills (ptxas). NVFP4
// producers copy per slot already, so NVFP4 runs token ids in its block kernels.
template <typename TQ, KV kKV, int kW, int kD, bool kSlotScales, bool kTokens>
__global__ void __launch_bounds__(Traits<kKV, kW, kD>::kThreads, kW == 4 ? 2 : 1)
    decode_kernel(const __grid_constant__ DecodeParams p, const __grid_constant__ CUtensorMap tm_k,
                  const __grid_constant__ CUtensorMap tm_v) {
  static_assert(kKV == KV::fp8 || !kSlotScales, "decode_kernel: only FP8 KV takes per-slot scales");
  static_assert(kKV != KV::nvfp4 || !kTokens,
                "decode_kernel: NVFP4 runs token ids in its block kernels (per-slot copies)");
  using Tr = Traits<kKV, kW, kD>;
  constexpr int kDP = Tr::kDimParts;
  static_assert(Tr::kStages == 2 || Tr::kStages == 3,
                "decode_kernel: empty_barrier has one case per stage, up to 3");
  extern __shared__ uint8_t smem_raw[];
  // TMA's 128-byte swizzle repeats every 1024 bytes: the pipeline starts on such a boundary
  // (smem_bytes has the slack).
  uint8_t* smem = smem_raw + ((1024 - (sm90::smem_addr(smem_raw) & 1023)) & 1023);
  const int hkv = p.num_kv_heads;
  const int64_t item_index = blockIdx.x / hkv;
  const int h = int(blockIdx.x % hkv);
  DecodeItem item;
  if (p.identity_tiles > 0) {  // the identity list (plan.h): the item follows from the CTA index
    item.batch = int32_t(item_index / p.chunks);
    item.chunk = int32_t(item_index % p.chunks);
    item.tile_end = p.identity_tiles;
  } else {
    item = p.items[item_index];
  }
  // Dense: the page-table line of the item's first keys heads for L2 beside the request loads.
  if (p.q2k == nullptr && threadIdx.x == 0)
    sm90::prefetch_l2(p.page_table + int64_t(item.batch) * p.page_table_stride +
                      ((int64_t(item.tile_begin) * kTileKeys) >> p.page_shift));
  const Request rq = load_request(p, item.batch, threadIdx.x == 0);
  // A chunk is queries_per_chunk whole queries, or (head_chunks > 1, only where a query's G rows
  // exceed the CTA's: D = 256, plan.h) heads [hbase, hbase + heads_per_chunk) of one query.
  int q0 = item.chunk * p.queries_per_chunk, hbase = 0;
  if constexpr (Tr::kHeadChunks) {
    q0 = item.chunk / p.head_chunks;
    hbase = (item.chunk - q0 * p.head_chunks) * p.heads_per_chunk;
    q0 *= p.queries_per_chunk;
  }
  const int nq = min(p.queries_per_chunk, rq.lq - q0);
  if (!rq.ok || nq <= 0) {  // bad cu_seqlens (reported), or fewer queries than this chunk
    arrive_and_finalize(p);
    return;
  }
  const int rows = Tr::kHeadChunks ? nq * min(p.heads_per_chunk, p.group - hbase) : nq * p.group;
  const int64_t t0 = rq.q_begin + q0;

  const uint32_t pipe = sm90::smem_addr(smem);
  uint8_t* const tail = smem + Tr::kPipeBytes + Tr::kRawBytes;  // NVFP4's packed ring before it
  int* slot_key = reinterpret_cast<int*>(tail);
  uint64_t* full = reinterpret_cast<uint64_t*>(tail + Tr::kSlotKeyBytes);
  float* slot_scale =  // FP8 per-slot scales of each stage (kSlotScales only; traits.h)
      kSlotScales ? reinterpret_cast<float*>(tail + Tr::kSlotKeyBytes + Tr::kBarrierBytes +
                                             union_bytes<kW>(p.bitmap_words))
                  : nullptr;
  if (threadIdx.x == 0) {
    for (int s = 0; s < Tr::kStages; ++s) {
      // Each producer thread arrives twice per fill: once plainly after its slot-key stores
      // (release), once by cp.async.mbarrier.arrive when its copies land. The TMA boxes add
      // their bytes (announced by lane 0 of warp 0 before its plain arrival). NVFP4 producers
      // arrive once, after writing the converted stage.
      sm90::mbar_init(&full[s], (kKV == KV::nvfp4 ? 1 : 2) * Tr::kProducerThreads);
    }
    sm90::fence_barrier_init();
  }
  TileSource src;
  src.b = item.batch;
  src.h = h;
  src.lk = rq.lk;
  const uint32_t* masks = nullptr;
  const int epb = kTileKeys >> p.block_shift;  // sparse: union entries per tile
  int last_tile;                               // tiles at or past it hold no key
  if (p.q2k) {
    const UnionSmem u = union_smem<kW>(tail + Tr::kSlotKeyBytes + Tr::kBarrierBytes, p.bitmap_words);
    src.e0 = item.tile_begin * epb;
    const bool with_pages = union_has_pages<kW>(p, nq);  // the blocks' pages, read with the union
    src.union_size = build_union<Tr::kThreads / 32>(p, u, item.batch, h, t0, nq, rq.lk, src.e0,
                                                    item.tile_end * epb, with_pages);
    src.ids = u.ids;
    if (with_pages) src.pages = u.pages;
    masks = u.masks;
    last_tile = (src.union_size + epb - 1) / epb;
  } else {
    __syncthreads();  // the barrier init
    last_tile = (rq.lk + kTileKeys - 1) / kTileKeys;
  }
  const int tiles = max(0, min(item.tile_end, last_tile) - item.tile_begin);
  const int s0 = item.tile_begin * kTileKeys;  // the item's first slot
  src.slot_end = s0 + tiles * kTileKeys;
  // Steps: one stage of kStageKeys consecutive slots each; the slots of a last stage past the
  // item are zero-filled with key -1 (lookup_stage) and skipped by the math.
  constexpr int kS = Tr::kStageKeys;
  const int steps = (tiles * kTileKeys + kS - 1) / kS;

  if (threadIdx.x < Tr::kProducerThreads) {
    sm90::regs_dealloc<Tr::kProducerRegs>();
    if constexpr (kKV == KV::nvfp4) {
      produce_fp4<kW>(p, src, s0, steps, pipe, full, slot_key);
    } else if constexpr (kTokens) {
      produce_tokens<kKV, kW, kD>(p, src, s0, steps, pipe, full, slot_key, slot_scale);
    } else {
      // The next stage's page-table reads are in flight while this one waits for its slot.
      if (threadIdx.x < 32) {
        sm90::prefetch_tensor_map(&tm_k);
        sm90::prefetch_tensor_map(&tm_v);
      }
      const bool evict_first = p.kv_evict_first != 0;
      const uint64_t policy = evict_first ? sm90::l2_evict_first_policy() : 0;
      StageBox cur, next;
      if (steps > 0) cur = lookup_stage<kKV, kW, kD>(p, src, s0);
      for (int it = 0; it < steps; ++it) {
        const int stage = it % Tr::kStages;
        if (it + 1 < steps) next = lookup_stage<kKV, kW, kD>(p, src, s0 + (it + 1) * kS);
        if (it >= Tr::kStages) empty_barrier<true>(stage, Tr::kThreads);
        issue_stage<kKV, kW, kD>(p, src, cur, &tm_k, &tm_v, &full[stage],
                                 pipe + stage * Tr::kStageBytes, slot_key + stage * kS,
                                 slot_scale ? slot_scale + stage * 2 * kS : nullptr, evict_first,
                                 policy);
        sm90::mbar_arrive(&full[stage]);
        sm90::cp_async_mbar_arrive(&full[stage]);
        cur = next;
      }
    }
    producers_arrive(p, uint32_t(NamedBarrier::kProducersExit), Tr::kProducerThreads);
    return;
  }

  sm90::regs_alloc<Tr::kConsumerRegs>();
  const int tid = threadIdx.x - Tr::kProducerThreads;  // consumer thread index
  const int nrt = (rows + 15) >> 4;
  const int kp_max = kW / kDP / nrt;
  const int kp = kp_max >= 8 ? 8 : kp_max >= 4 ? 4 : kp_max >= 2 ? 2 : 1;
  const int kw = kS / kp;  // keys per warp per stage: 16..256
  const int warp = tid >> 5, lane = tid & 31;
  const bool active = warp < nrt * kp * kDP;
  const int dp = kDP > 1 ? warp / (nrt * kp) : 0;  // the warp's dim part
  const int wp = warp - dp * nrt * kp;             // its index within the part
  const int rt = wp % nrt, kpi = wp / nrt;
  // Per-tensor scales apply to S and O (FP8's scale, NVFP4's global scale); with per-slot ones
  // every scale is staged per slot.
  float k_mult = 1.f, v_mult = 1.f;
  if constexpr (kKV == KV::fp8 && !kSlotScales) {
    if (p.k_scale) k_mult = *p.k_scale;
    if (p.v_scale) v_mult = *p.v_scale;
  } else if constexpr (kKV == KV::nvfp4) {
    k_mult = p.k_global;
    v_mult = p.v_global;
  }
  WarpTile<TQ, kKV, kD> w;
  load_q(w, p, active ? rt : 0, active ? rows : 0, hbase, t0, h, q0, rq.lq, rq.lk, k_mult);
  // The lowest causal limit of the warp's rows (padding rows: -1), for the whole-window test.
  const int warp_climit = __reduce_min_sync(0xffffffffu, min(w.climit[0], w.climit[1]));

  ConsumerLoop lp;
  lp.full = sm90::smem_addr(full);
  lp.pipe = pipe;
  lp.slot_key = slot_key;
  if constexpr (kSlotScales) {
    lp.slot_scale = slot_scale;
    w.vref = w.vinv = 0.f;
  }
  lp.steps = steps;
  lp.s0 = s0;
  lp.e0 = src.e0;
  // A one-query union holds only its query's blocks; token plans have one query per CTA (plan.cpp).
  lp.masks = !kTokens && nq > 1 ? masks : nullptr;
  lp.kb0 = kpi * kw;
  lp.warp_climit = warp_climit;
  if constexpr (kDP > 1) lp.v_part = uint32_t(dp) * (Tr::kLines / kDP) * (kS * 128);
  lp.active = active;
  // One row tile (every sparse CTA, single-query dense): the warps split each stage's keys
  // kW / kDP ways, a width known at compile time, so the window's loops and registers shrink to it.
  if (nrt == 1) consume<kS * kDP / kW, kS, Tr, kSlotScales>(p, w, lp, kw);
  else consume<0, kS, Tr, kSlotScales>(p, w, lp, kw);
  if constexpr (kSlotScales) {
#pragma unroll
    for (int nt = 0; nt < w.kOutTiles; ++nt)  // O back from the V-scale reference (attend)
#pragma unroll
      for (int k = 0; k < 4; ++k) w.o[nt][k] *= w.vref;
  }
  // Every stage was waited for, so every copy has landed: the pipeline smem becomes the merge
  // scratch once all consumers are past their last step.
  sm90::named_sync(uint32_t(NamedBarrier::kConsumers), Tr::kConsumerThreads);
  const MergeSmem ms = merge_smem<kD>(smem, Tr::kMaxRows);
  if (active)
    store_warp(w, ms, kpi * 16 * nrt + rt * 16 + (lane >> 2), dp * Tr::kOutDims, dp == 0);
  sm90::named_sync(uint32_t(NamedBarrier::kConsumers), Tr::kConsumerThreads);
  constexpr uint32_t kBar = uint32_t(NamedBarrier::kConsumers);
  if (nrt == 1)  // one row tile: kW / kDP key partitions (consume's compile-time width)
    merge_and_write<TQ, kD, Tr::kConsumerThreads, kW / kDP>(p, ms, rows, hbase, nrt, kp,
                                                            item.partial, h, t0, v_mult, tid, kBar);
  else
    merge_and_write<TQ, kD, Tr::kConsumerThreads>(p, ms, rows, hbase, nrt, kp, item.partial, h, t0,
                                                  v_mult, tid, kBar);
  if (item.partial >= 0)
    finish_split<TQ, kD, Tr::kConsumerThreads>(p, item.job, h, rows, hbase, t0, tid, kBar,
                                               slot_key);
}

}  // namespace msa::cuda::decode
