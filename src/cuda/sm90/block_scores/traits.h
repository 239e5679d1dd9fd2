// Tiles, shared-memory plan and barrier protocol of the sm_90a indexer (block scores, optionally
// with fused top-K). Included by kernel.cuh and launch.cu.
//
// Work unit: one CTA per (kv head h, tile of consecutive query tokens). Its rows are the tile's
// tokens x all G query heads of h, in R row groups of 64 (wgmma M) with the heads of one token
// adjacent (one token's G heads are one contiguous row of q). The CTA streams the visible 128-key
// tiles of K (one block each, or two 64-key blocks: kBlk) through shared memory once and
// multiplies every row group by each.
//   R = min(4, G) row groups, tokens per CTA = 64 R / G (64 for G <= 4, 32 for G = 8, 16 for 16).
// Budget, IDX-32K (S = 32768, Hq 64, Hkv 4, D 128, causal): FLOP = 2 D Hq (visible pairs)
//   = 2 * 128 * 64 * 5.4e8 = 8.8e12 -> 12.3 ms at 716 TFLOP/s (bf16), 7.1 ms at 1238 (fp8).
//   Bytes: q 0.54 GB once; K per CTA ~avg 128 blocks x 32 KB, 8192 CTAs -> 34 GB from L2
//   (256 rows share each K block: 256 FLOP per L2 byte); scores written 2.1 GB (0.5 ms at
//   4.27 TB/s) unless the top-K is fused. Math-bound: the floor is the matmul rate.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/device/pipeline.cuh"

namespace msa::cuda::indexer_sm90 {

// Input element type; one kernel instantiation each (with the row-group count and width). fp4:
// NVFP4 or MXFP4 (Params::fp4), converted to bf16 in shared memory by the producer warpgroup
// (fp4.cuh) and multiplied as bf16.
enum class Elem { bf16, f16, e4m3, fp4 };

constexpr int kHeadDim = 128;
constexpr int kBlockN = 128;      // keys per K tile: one wgmma N
constexpr int kTileM = 64;        // rows per row group (wgmma M)
constexpr int kMaxRowGroups = 4;  // 256 rows per CTA share each K block
constexpr int kStages = 3;        // K block pipeline depth
constexpr int kMaxTokens = 64;    // tokens per CTA, any G
constexpr int kMaxPicks = 64;     // fused top-K: candidates kept per list, at most

// Score blocks (kv_block_size): the kernels' kBlk, 128 or 64 keys. Everything but the epilogue
// and the selectors walks 128-key K tiles either way (loads, stages, wgmma m64n128, the work
// items), so a 64-key tile is two blocks: the accumulator's columns 0-63 and 64-127, each with
// its own row max, causal limit, score store or selector candidate. A template parameter, not a
// runtime one, so that the 128-key kernels carry none of the second block's code.
template <int kBlk>
constexpr int kBlocksPerTile = kBlockN / kBlk;

// Consumer warpgroups per CTA (Cfg<kWide>). Narrow (unfused): 2, consumer c owning row groups c
// and c + 2, its two tiles pipelined under each other's epilogues (mma.cuh). Wide (fused, kWide):
// 4, consumer c owning row group c, one tile per block. The fused epilogue (row max, group max,
// selector ring; FP8: per-key scales) is long next to the wgmma, half a 16-bit one's time for
// FP8, so the consumers' instruction latency bounds it, and four warps per scheduler hide more of
// it than two: IDX-32K-fp8 fused 12.8 -> 11.6 ms, bf16 fused 13.3 -> 12.8 ms. Unfused
// stays narrow: there the wide loop's extra instructions per tile (its own loop overhead, the
// per-tile scale loads, spilled loop counters) cost more than the latency it hides (FP8 10.8 ->
// 11.6 ms). The wide consumers read the per-key scales from shared memory where they use them
// (no 32 scale registers), to fit 112 registers.
// Registers: the launch gives every thread 65536 / threads (rounded down to 8: 168 for 384
// threads, 96 for 640); setmaxnreg moves them from the producer warpgroup to the consumers, and
// the budgets must add up to no more than the launch's.
template <bool kWide>
struct Cfg {
  static constexpr int kConsumers = kWide ? 4 : 2;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kProducerRegs = kWide ? 32 : 40;
  static constexpr int kConsumerRegs = kWide ? 112 : 232;
  static constexpr bool kScalesFromSmem = kWide;
  // FP4 (fp4.cuh): the producer warpgroup converts, and its ILP is bounded by its registers: the
  // consumers give some up (they hold no per-key scales for bf16 operands).
  static constexpr int kFp4ProducerRegs = kWide ? 64 : 88;
  static constexpr int kFp4ConsumerRegs = kWide ? 104 : 208;
  static_assert(128 * (kProducerRegs + kConsumers * kConsumerRegs) <= (65536 / kThreads) / 8 * 8 * kThreads,
                "Cfg: setmaxnreg budgets exceed the launch's registers");
  static_assert(128 * (kFp4ProducerRegs + kConsumers * kFp4ConsumerRegs) <= (65536 / kThreads) / 8 * 8 * kThreads,
                "Cfg: FP4 setmaxnreg budgets exceed the launch's registers");
};
static_assert(Cfg<true>::kConsumers == kMaxRowGroups, "Cfg: a wide consumer owns one row group");
// A kernel runs wide exactly when it is fused (launch.cu picks it so): its loops use Cfg<kFused>.

// One 128-byte swizzle row holds 64 bf16/f16 or 128 fp8 values: D = 128 is two 64-wide halves
// for 16-bit inputs and one 128-wide half for fp8. The shared-memory plan is D = 128's; other head
// dims (kD, a template parameter of the kernels) use as many halves as fill the same buffers:
// 16-bit D = 64 (one half) and e4m3 D = 256 (two halves of 128 values, the bytes of 16-bit
// D = 128). 16-bit D = 256 would need 128 KB of Q for 256 rows and 64 KB a K stage; e4m3 D = 64
// rows are 64 bytes, which the 128-byte swizzle does not take; FP4 converts to bf16 rows of
// D = 128 (fp4.cuh).
constexpr int kRowBytes = 128;
// 128-byte rows per token or key at head dim kD, and the values one holds.
template <Elem kElem, int kD>
constexpr int kRowHalves = kD * (kElem == Elem::e4m3 ? 1 : 2) / kRowBytes;
template <Elem kElem>
constexpr int kRowValues = kElem == Elem::e4m3 ? kRowBytes : kRowBytes / 2;
template <Elem kElem, int kD>
constexpr bool kHeadDimOk = kD == kHeadDim || (kD == 64 && (kElem == Elem::bf16 || kElem == Elem::f16)) ||
                            (kD == 256 && kElem == Elem::e4m3);
constexpr int kQGroupBytes = kTileM * kHeadDim * 2;  // 16 KB (16-bit) / 8 KB used (fp8)
constexpr int kKBlockBytes = kBlockN * kHeadDim * 2; // 32 KB (16-bit) / 16 KB used (fp8)

// Fused top-K lists. A list belongs to a token and a selection head: one per token when the
// selection groups all of k's heads (q2k rows = Hkv), or one per (token, group of sel_group
// consecutive heads) when each kv head selects by its own index heads (MiniMax-M3: 4 index heads
// on 1 index key head, one list each; docs/semantics.md, Index heads). At most one list per row
// of the CTA (kMaxLists). The lists' keys share one pool of kPickKeys: a CTA of n lists keeps at
// most kPickKeys / n keys a list (64 for 64 lists, 16 for 256), key j of list l at
// pick_keys[j * n + l], so the selectors' lanes (consecutive lists) read consecutive words.
constexpr int kMaxLists = kMaxRowGroups * kTileM;  // 256
constexpr int kPickKeys = kMaxTokens * kMaxPicks;  // 4096
struct alignas(16) ListState {
  float thr;      // a value v can enter only if !(v <= thr) (run_selector's filter): NaN while the
                  // list fills, +inf with no picks to take, then the least key's score (-inf if
                  // it is NaN); the exact test is the key's against the heap's root (offer)
  int32_t nvis;   // the token's visible blocks
  int16_t count;  // keys held (0 = empty slot beyond)
  int8_t want;    // picks it may take (topk minus the forced blocks, at most the list size)
};

// Fused top-K: each block's per-list maxima (the group max over a list's heads) travel from the
// consumers to the selector threads (producer warps 1 and 2: thread i serves lists i, i + 64,
// ...) through a ring of kSelRing slots, so the list insertions run off the MMA warps' critical
// path.
constexpr int kSelRing = 4;
constexpr int kSelectors = 64;
static_assert(kSelectors == kMaxTokens, "selectors are producer warps 1-2");
constexpr int kListsPerSelector = kMaxLists / kSelectors;
struct SelSlot {
  float val[kMaxLists];    // the list's group max for the slot's block
  uint8_t ok[kMaxLists];   // 1: offer it (the list's token is in the block's batch segment)
  int32_t kb;              // the slot's K tile: block kb, or (64-key blocks) 2 kb and 2 kb + 1
};

// FP4: each K block's packed rows and scales land by cp.async in a ring of kFp4RawSlots raw
// slots, kFp4RawSlots - 1 blocks ahead of the one being converted (fp4.cuh). One slot: 256
// units (key, 64-value half), 32 bytes of values each, then 4 bytes of scales each.
constexpr int kFp4Units = kBlockN * 2;
constexpr int kFp4RawSlots = 2;
constexpr int kFp4RawBytes = kFp4Units * (32 + 4);

struct alignas(1024) SharedStorage {
  uint8_t q[kMaxRowGroups][kQGroupBytes];
  uint8_t k[kStages][kKBlockBytes];
  float k_scale[kStages][kBlockN];  // fp8 per-key scales of each stage's block (1 otherwise)
  uint64_t pick_keys[kPickKeys];
  ListState lists[kMaxLists];
  SelSlot sel[kSelRing];
  uint64_t sel_full[kSelRing];   // consumer threads that run epilogues, after their writes
  uint64_t sel_empty[kSelRing];  // the kSelectors selector threads, after their reads
  // Each selector warp's queue of its lists whose value passed the filter for the current block
  // (run_selector): one lane a list then runs the insertions.
  uint8_t sel_queue[kSelectors / 32][kMaxLists / (kSelectors / 32)];
  uint64_t q_full;
  uint64_t k_full[kStages];
  uint64_t k_empty[kStages];
  // Fused 64-key blocks only: each selector slot's second block (tile columns 64-127), whose
  // group maxima SelSlot::val cannot hold; the 128-key kernels without FP4 are launched without
  // it (kSmemBytesBlk128), so their shared-memory plan is the one they had before 64-key blocks.
  alignas(16) float sel_hi[kSelRing][kMaxLists];
  // FP4 only, and last: the other kernels are launched without it (kSmemBytesNoFp4), so that its
  // 18 KB go to the L1 cache there.
  alignas(16) uint8_t fp4_raw[kFp4RawSlots][kFp4RawBytes];
};
constexpr int kSmemBytes = int(sizeof(SharedStorage)) + 1024;
constexpr int kSmemBytesNoFp4 = int(offsetof(SharedStorage, fp4_raw)) + 1024;
constexpr int kSmemBytesBlk128 = int(offsetof(SharedStorage, sel_hi)) + 1024;
static_assert(kSmemBytes <= 227 * 1024, "shared memory plan exceeds the 227 KB opt-in limit");

// Buffer rings (device/pipeline.cuh): the K stages and the fused selector slots.
using KRing = sm90::Ring<kStages>;
using SelRing = sm90::Ring<kSelRing>;

// Named barriers (bar.sync ids; 0 is __syncthreads). The one id in use is arbitrary.
enum class NamedBarrier : uint32_t {
  kSelectorsDone = 4,  // fused: the consumers wait for the selectors' last offers
};

}  // namespace msa::cuda::indexer_sm90
