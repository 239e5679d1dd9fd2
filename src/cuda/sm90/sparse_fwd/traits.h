// Tiles, stages, shared-memory plan and named-barrier ids of the sm_90a sparse attention forward
// (KV-major over the k2q CSR). Included by every role file of this folder and by launch.cu.
//
// Work unit: a *chunk* = (kv head h, kv block kb of batch b, up to kChunkTiles Q tiles of that
// CSR row). The CTA loads the 128x128 K and V block once per chunk and streams the row's query
// tokens through it, each Q tile holding 64 rows = 64/G tokens x G heads of kv head h.
//
// Byte / FLOP budget (counted before building; bench/CASES.md shapes, G = 16; H200: 716 TFLOP/s
// bf16 matmul, 4.27 TB/s copy):
//   per (token, kv head, selected block): Q gather 4 KB, partial O out 4 KB (bf16), partial O
//   re-read by the combine 4 KB, 64 B of LSE; FLOP = 4 * 128 * 128 * 16 = 1.05 MFLOP.
//   P32K-tok: 32768 tokens x 4 heads x 16 slots = 2.10 M entries -> 2.2e12 FLOP (3.1 ms at
//     716 TFLOP/s); bytes: 8.6 GB Q + 8.6 GB partial write (main kernel, 4.0 ms at 4.27 TB/s)
//     + 8.6 GB partial read + 0.27 GB out (combine, 2.1 ms); K/V: 4 x 256 blocks x 64 KB
//     = 67 MB (chunks re-read a row's block from L2). Memory-bound: ~6.1 ms floor for this
//     design with bf16 partials (~4.0 ms if the main kernel's traffic hid the math fully), i.e.
//     ~360 effective TFLOP/s; fp32 partials add 8.6 GB more (~8 ms).
//   P32K-blk: same entry count and FLOP (2.07e12 counted by attended pairs: the causal diagonal
//     block is half used). Every query block's 128 tokens share one selection, so it runs on the
//     uniform (Q-major) path instead: Q read once (0.54 GB), out written once (0.54 GB), K/V
//     64 KB per (unit, block) = 17 GB of L2 reads but 67 MB from DRAM (the 16 units of a (head,
//     query block) run side by side), no partials, no combine. Floor: the math, 2.2e12 MMA FLOP
//     issued ~ 3.1 ms at 716 TFLOP/s.
//   Measured (H200): P32K-tok 6.60 ms (main kernel ~4.43 ms, bound by its consumers'
//     instruction chain, not by these bytes: with every partial kept in L2 it gained ~1%;
//     combine ~2.10 ms at ~4.5 TB/s of partial reads). P32K-blk 3.48 ms for the whole call
//     (the uniform kernel ~3.53 ms of 3.67 when last taken alone: ~605 TF/s issued).
#pragma once

#include <cstdint>

#include "cuda/device/pipeline.cuh"

namespace msa::cuda::sparse_fwd {

constexpr int kHeadDim = 128;      // D of FP8 QK, token ids and the partials' default
constexpr int kBlockN = 128;       // keys per kv block (kv_block_size); 64 through kBlk below
constexpr int kTileM = 64;         // wgmma M: rows (token x head) per Q tile
constexpr int kChunkTiles = 16;    // Q tiles per chunk: K/V (64 KB) amortised over 16 x 16 KB Q
constexpr int kKVStages = 2;       // K/V double buffer so the next chunk's block loads early
constexpr int kConsumers = 2;      // consumer warpgroups, alternating Q tiles
constexpr int kQStages = 2;        // Q buffers per consumer; one producer warp per buffer
constexpr int kProducerWarps = kConsumers * kQStages;
constexpr int kThreads = 128 * (1 + kConsumers);
constexpr int kProducerRegs = 56;  // setmaxnreg budgets: see kRegBudget
constexpr int kConsumerRegs = 224;
// The uniform path's consumers hold S, O and P of two blocks' products at once (intra-warpgroup
// overlap): 240 registers; its one producer warp does with 24 (ptxas: no spills either way).
constexpr int kUniformProducerRegs = 24;
constexpr int kUniformConsumerRegs = 240;
// Three consumer warpgroups (D = 32 and 64, HeadDimTraits::kCons): 512 threads start with 128 registers
// each, 24 + 3 x 160 of them.
constexpr int kUniform3ConsumerRegs = 160;
static_assert(kUniformProducerRegs + 3 * kUniform3ConsumerRegs <= 4 * 128,
              "setmaxnreg budgets of the three-consumer uniform kernel");
// FP8 QK: the producer also copies the key scales (ptxas: 24 registers spilled, 56 none; the
// consumer needs no more than 224).
constexpr int kUniformFp8ProducerRegs = 56;
constexpr int kUniformFp8ConsumerRegs = 224;
// setmaxnreg.inc takes registers only from those the CTA's own warps released: 384 threads start
// with 168 each (65536 / 384, rounded down to 8), so producer + 2 consumers <= 3 x 168 = 504.
// (48 + 2 x 232 = 512 left the consumers waiting in setmaxnreg.inc forever.)
constexpr int kRegBudget = 3 * 168;

// FP8 QK (DESIGN.md section 15's mixed FP8: e4m3 q and K, bf16 P V): the kernels instantiated
// with kFp8 read q and K as e4m3, one 128-byte swizzle row per token (half 0 of each buffer; a
// k32 wgmma step is 32 bytes of it), multiply S by the per-key K scales (SharedStorageT::kscale)
// and run P V in bf16 over the bf16 V copy.

// Bytes of one 64-column (128-byte swizzle atom wide) half of each tile.
constexpr int kHalfCols = 64;
constexpr int kKVHalfBytes = kBlockN * kHalfCols * 2;  // 16 KB
constexpr int kQHalfBytes = kTileM * kHalfCols * 2;    // 8 KB

static_assert(kProducerWarps == 4, "one producer warp per (consumer, Q stage) buffer: the "
              "producer warpgroup has exactly four warps");
static_assert(kHeadDim == 2 * kHalfCols, "D = 128 is two 128-byte swizzle atoms per row");
static_assert(kProducerRegs + kConsumers * kConsumerRegs <= kRegBudget &&
                  kConsumerRegs % 8 == 0 && kProducerRegs % 8 == 0 &&
                  kUniformProducerRegs + kConsumers * kUniformConsumerRegs <= kRegBudget &&
                  kUniformConsumerRegs % 8 == 0 && kUniformProducerRegs % 8 == 0 &&
                  kUniformFp8ProducerRegs + kConsumers * kUniformFp8ConsumerRegs <= kRegBudget &&
                  kUniformFp8ConsumerRegs % 8 == 0 && kUniformFp8ProducerRegs % 8 == 0,
              "setmaxnreg budgets must fit kRegBudget and be multiples of 8");

// Per-token metadata of one Q tile, written by its producer warp before the tile's barrier.
struct TileMeta {
  int32_t token[kTileM];  // global query token, -1 for padding / skipped rows
  int32_t slot[kTileM];   // q2k slot of (token, kb): where the partial goes
  int32_t limit[kTileM];  // last visible key column of the block (-1: none visible)
};

// One chunk as the prep kernel lays it out (32 bytes, read once per chunk by every role).
struct ChunkDesc {
  int32_t head, kb, e_begin, e_end;      // CSR slice [e_begin, e_end) of row (head, b, kb)
  int32_t q_start, diag, k_start, k_len;  // batch b's offsets, its diagonal, its key count
};
static_assert(sizeof(ChunkDesc) == 32, "ChunkDesc is two int4 loads");

struct ChunkInfo {  // what consumers need from the producer for a K/V stage
  int32_t n_tiles;     // -1: no more chunks
  int32_t valid_keys;  // keys of the block inside its batch; rows past it are zeroed in V
  int32_t head;        // kv head
  int32_t kb;          // the block (its key mask words)
};

// Uniform path (uniform_*.cuh): a query block (64, 128 or 512 tokens: qblock_shift_of) whose q2k
// rows (for kv head h) are all equal is done Q-major: a *unit* = up to 128 rows (two 64-row tiles;
// 192 rows, three tiles, on 64-column tiles: unit_tiles_of) of that block streams its selected K/V blocks with an online softmax and writes out / lse directly
// (no partials).
struct UnitDesc {
  int32_t head, q_first, n_tok, q_local0;  // global first token, tokens in the unit, its local id
  int32_t diag, k_start, k_len, sel_token;  // batch diagonal and keys; the token whose q2k row is read
};
static_assert(sizeof(UnitDesc) == 32, "UnitDesc is two int4 loads");

// diag (ChunkDesc, UnitDesc): under the causal rule, batch-local query i sees keys j <= i + diag:
// Lk - Lq (bottom-right), or the call's causal_offset[b] (params.h causal_last).

struct UniformInfo {  // one published K/V stage of the uniform path
  int32_t kb;         // block id; -1: the unit has no block (zeros / -inf out); -2: no more units
  int32_t valid_keys;  // rows of the stage holding keys (a pair: 64 + the second block's)
  int32_t kb2;        // 64-key blocks: the block in rows 64-127 (HeadDimTraits::kPair), or -1
  int32_t last;       // the last stage of its unit
};
// At D <= 64 (160-register consumers) a stage's last flag travels in bit 30 of valid_keys, one
// value fewer for the consumers to hold across a block (uniform_mma.cuh); D = 128 reads `last`
// (unpacking it there, where nothing spills, measured +0.5%).
template <int kD>
constexpr bool kLastInKeys = kD <= 64;
constexpr int32_t kLastStageBit = 1 << 30;

// Shared memory plan (D = 128: ~197 KB of the 227 KB opt-in): K/V 2 stages x 64 KB, Q 4 x 16
// KB, metadata. A tile row of D columns is kHalves = D / 64 halves of one 128-byte swizzle row;
// a K/V stage holds kKeys keys, each consumer kQSt Q buffers (HeadDimTraits, KVMajorTraits), the
// ring kKVSt K/V stages. Every tile buffer is 1024-byte aligned: the 128-byte swizzle repeats
// every 8 rows of 128 B and wgmma descriptors assume atoms start on that boundary.
// kVSt: V stages when V has a ring of its own that is shallower than K's (the three-consumer
// KV-major kernel: KVMajorTraits), else kKVSt.
template <int kHalves, int kKeys = kBlockN, int kQSt = kQStages, int kKVSt = kKVStages,
          int kCons = kConsumers, int kVSt = kKVSt>
struct alignas(1024) SharedStorageT {
  static constexpr int kKVStageHalfBytes = kKeys * kHalfCols * 2;
  static constexpr int kStagesKV = kKVSt, kQBuffers = kQSt, kConsumerGroups = kCons;
  uint8_t k[kKVSt][kHalves][kKVStageHalfBytes];
  uint8_t v[kVSt][kHalves][kKVStageHalfBytes];
  uint8_t q[kCons][kQSt][kHalves][kQHalfBytes];
  // FP8 QK (kFp8 kernels): each stage's per-key K scales, copied with its blocks (kv_load.cuh;
  // a 64-key block of the KV-major kernel fills the first 64).
  alignas(16) float kscale[kKVSt][kBlockN];
  TileMeta meta[kCons][kQSt];
  ChunkInfo info[kKVSt];
  UniformInfo uinfo[kKVSt];
  uint64_t kv_full[kKVSt];   // KV-major: K and V of a stage; uniform path: K (and info) only
  uint64_t kv_empty[kKVSt];
  uint64_t v_full[kKVSt];    // uniform path: V of a stage, its own ring so K runs ahead
  uint64_t v_empty[kKVSt];
  uint64_t q_full[kCons][kQSt];
  uint64_t q_empty[kCons][kQSt];
  // The dense D = 128 kernel (kDenseQ) only: the unit whose Q its Q warp loads into buffer stage
  // s (head -1: no more units), published on unit_full[s] for the K/V warp (uniform_load.cuh).
  uint64_t unit_full[kQSt];
  UnitDesc unit_desc[kQSt];
};
// The KV-major kernel over kv blocks of kBlk keys, 128 or 64 (one block per K/V stage), at head
// dim kD (D / 64 halves per tile row). D = 128 (16-bit or FP8 Q K^T): two consumer warpgroups
// taking alternate tiles, two Q buffers each, K/V in two stages; bf16 partials staged in the
// tile's Q buffer and stored by TMA (kStagedPartials, D = 128 and 64).
// D = 64: three consumer warpgroups (tile T to consumer T % 3), two Q buffers each, K in two
// stages and V in one on its own barriers (kSplitV), so the next chunk's K loads ahead and its V
// once every consumer is done with this chunk's. A third warpgroup is one more independent tile
// chain per scheduler (the two-consumer kernel: tensor pipe 51% busy at 0.42 eligible warps per
// scheduler, ncu P8K-tok); warp 0 of the producer loads K/V and warp 1 + c gathers consumer c's Q;
// setmaxnreg 48 / 152 (512 threads start at 128). P16K-tok-D64 2.53 -> 2.34 ms (H100); at D = 128
// the same plan (~197 KB) measured -1.3% to +2.6% across the per-token cases, not kept
// (docs/kernels/sparse_fwd.md, Three consumer warpgroups).
// D = 256: a 128-key block's K and V are 128 KB, so one stage (64-key blocks keep two of 64 KB),
// two consumers with one Q buffer of 32 KB each (Q 64 KB + K/V 128 KB: ~196 KB); the Q buffer is
// freed as soon as S is done so that the next tile's Q loads under this one's softmax and P V,
// and bf16 partials are stored from registers (4-byte stores) instead of staged. With one K/V
// stage the next chunk's block loads only once both consumers are done with this one: the cost
// is that load's latency a chunk (up to 16 tiles of ~8.4 MFLOP each).
template <int kBlk, int kD>
struct KVMajorTraits {
  static_assert(kD == 64 || kD == 128 || kD == 256, "the KV-major tiles take D = 64, 128 or 256");
  static constexpr bool kSplitV = kD == 64;
  static constexpr int kCons = kSplitV ? 3 : kConsumers;
  static constexpr int kQSt = kD == 256 ? 1 : kQStages;
  static constexpr int kKVSt = kD == 256 && kBlk == 128 ? 1 : kKVStages;  // K stages (and V's)
  static constexpr int kVSt = kSplitV ? 1 : kKVSt;
  static constexpr bool kStagedPartials = kD != 256;
  static constexpr int kThreads = 128 * (1 + kCons);
  static constexpr int kProducerRegs = kSplitV ? 48 : sparse_fwd::kProducerRegs;
  static constexpr int kConsumerRegs = kSplitV ? 152 : sparse_fwd::kConsumerRegs;
  static_assert(kProducerRegs + kCons * kConsumerRegs <= (65536 / kThreads) / 8 * 8 * (1 + kCons),
                "setmaxnreg budgets of the KV-major kernel");
  // Two consumers: producer warp 2 s + c gathers consumer c's Q buffer s (D = 256: warps 0-1).
  static constexpr int kQBufferWarps = kConsumers * kQSt;
  using Storage = SharedStorageT<kD / 64, kBlk, kQSt, kKVSt, kCons, kVSt>;
};
template <int kBlk, int kD = 128>
using KVMajorStorage = typename KVMajorTraits<kBlk, kD>::Storage;
template <class Storage>
constexpr int smem_bytes() {  // + slack to align the base
  return int(sizeof(Storage)) + 1024;
}
static_assert(smem_bytes<KVMajorStorage<kBlockN>>() <= 227 * 1024 &&
                  smem_bytes<KVMajorStorage<kBlockN, 256>>() <= 227 * 1024 &&
                  smem_bytes<KVMajorStorage<64, 256>>() <= 227 * 1024,
              "shared memory plan exceeds the 227 KB opt-in limit");

// Head dims of the uniform kernel. D = 128 runs every kernel of this folder; D = 64 and 256 the
// 16-bit kernels of both paths (sparse and dense, 128- and 64-key blocks; the KV-major kernel's
// plan at 256: KVMajorTraits). D = 64: one half per tile, O m64n64 (32 floats per
// thread). D = 256: O m64n256 is 128 floats per thread, so S and P must shrink to fit the 240
// registers beside it and the next block's S (intra-warpgroup overlap): K/V stages of 64 keys
// (S m64n64, 32 floats; P 16 registers), and one Q buffer per consumer (64 KB of Q beside 128 KB
// of K/V stages: 192 KB). kBlk: keys per kv block of the call's selections (kv_block_size, 128 or
// 64; dense attention uses 128), a stage holding one block: S m64n64 and P V k64 for 64-key blocks,
// as at D = 256. D = 32 (dense only) runs D = 64's tiles: its q / k / v tensor maps are 32 columns
// wide under 64-column boxes, so TMA fills columns 32-63 with zeros (launch.cu); S takes two k16
// steps (columns 0-31), P V the m64n64 form, whose columns 32-63 (zero V) are never stored
// (kOutCols). A 32-column tile would need the 64-byte swizzle in every load, descriptor and
// epilogue; at D = 64 the consumers are softmax-bound (a block's MMAs take 0.39 us of its ~1.4), so
// halving the MMAs would gain little.
// The KV-major kernel with the combine inside it (merge.cuh; 16-bit q at D = 128 over 128-key
// blocks, bf16 partials, top-K <= kMergeMaxTopk): a fourth warpgroup stores each tile's staged
// partial (warp 12 + c for consumer c) and counts the arrivals of each (token, kv head); the last
// arrival publishes the pair on the call's merge list, and the merge warps (14-15) of every CTA
// claim pairs from it and fold their partials, read through a cp.async ring of kMergeDepth slots.
constexpr int kMergeMaxTopk = 16;   // a slot per lane of a row's 16-lane segment
constexpr int kMergeMaxGroup = 16;  // rows tid / 16 + 4 k (k < 4) of the 64 merge threads
// The shapes the merging kernel takes: G a power of 2 in [2, 16], top-K <= 16. plan.cpp
// (AttnPlan::merge) and its launch ask this.
constexpr bool merge_shape_fits(int64_t group, int64_t topk) {
  return group >= 2 && group <= kMergeMaxGroup && (group & (group - 1)) == 0 && topk >= 0 &&
         topk <= kMergeMaxTopk;
}
constexpr int kMergeDepth = 4;     // slots each merge thread has in flight
constexpr int kMergeThreads = 64;  // warps 14-15
constexpr int kMergeProducerRegs = 56, kMergeConsumerRegs = 184, kMergeEpilogueRegs = 80;
static_assert(kMergeProducerRegs + 2 * kMergeConsumerRegs + kMergeEpilogueRegs <= 4 * 128 &&
                  kMergeConsumerRegs % 8 == 0 && kMergeEpilogueRegs % 8 == 0,
              "setmaxnreg budgets of the merging KV-major kernel (512 threads)");
struct alignas(128) MergeArea {
  // Merge thread t's 16 bytes of row r0 + 4 k of the slot in ring stage d, at [d][k][t]: the 64
  // threads' copies and reads are consecutive 16-byte chunks (no bank conflicts).
  uint4 ring[kMergeDepth][4][kMergeThreads];
  unsigned long long cur[2];  // the pair being merged and the next: (mask << 32) | (pair + 1)
  uint64_t staged[kConsumers][kQStages];  // a consumer staged its tile's partial (128 arrivals)
  int32_t tile_head[kConsumers][kQStages];  // the kv head of buffer (c, s)'s tile (its producer)
  // Consumer c's end, set in the buffer its next tile would use: one flag a buffer, since the
  // store warp may read buffer s's flag for the last tile after the consumer set the other's.
  int32_t cons_done[kConsumers][kQStages];
};
template <class Storage>
constexpr int merge_smem_bytes() {
  return int(sizeof(Storage)) + int(sizeof(MergeArea)) + 1024;
}
static_assert(merge_smem_bytes<KVMajorStorage<kBlockN>>() <= 227 * 1024,
              "the merging KV-major kernel's shared memory exceeds the 227 KB opt-in limit");

template <int kD, int kBlk = kBlockN>
struct HeadDimTraits {
  static_assert(kD == 32 || kD == 64 || kD == 128 || kD == 256,
                "the sparse forward tiles take D = 32 (dense), 64, 128 or 256");
  static_assert(kBlk == 64 || kBlk == 128, "kv blocks of 64 or 128 keys");
  static constexpr int kTileD = kD < kHalfCols ? kHalfCols : kD;  // columns of a tile row
  static constexpr int kOutCols = kD;                              // columns of out written
  static constexpr int kHalves = kTileD / kHalfCols;
  // Keys per K/V stage. D = 128 over 64-key blocks: two blocks a stage (kBlockPairs), rows 0-63
  // and 64-127, so a key costs what it costs on the 128-key path (S, softmax, wgmma issue, the
  // stage handshakes): one block a stage ran P32K-blk64 in 4.40 ms, pairs in 3.85 ms (P32K-blk,
  // the same keys in 128-key blocks: 3.53 ms).
  static constexpr int kKeys = kD == 256 ? 64 : 128;
  static constexpr bool kBlockPairs = kBlk == 64 && kKeys == 128;
  static constexpr int kQSt = kD == 256 ? 1 : kQStages;
  static constexpr int kS = kKeys / 2;  // S floats per thread (m64n{kKeys})
  static constexpr int kO = kTileD / 2;  // O floats per thread (m64n{kTileD})
  // Consumer warpgroups, one 64-row tile of a unit each (unit_tiles). On 64-column tiles (D = 64,
  // and D = 32 on them) a block's MMAs (~0.39 us a warpgroup) are far shorter than its softmax
  // (~1.0 us): with n warpgroups taking turns the tensor cores are busy n m / max(n m, m + s), 56%
  // for two (DENSE-16K-D64 measured 59% of the bf16 ceiling), 84% for three by this model; three
  // measured -3.7% (tensor pipe 52% busy, ncu: the softmax's issue binds, docs/kernels/sparse_fwd.md,
  // Head dims). 512 threads then: setmaxnreg 24 / 160 (O, S and P of the intra-warpgroup overlap
  // are ~130 on 64-column tiles).
  static constexpr int kCons = kTileD == 64 ? 3 : kConsumers;
  static constexpr int kThreads = 128 * (1 + kCons);
  using Storage = SharedStorageT<kHalves, kKeys, kQSt, kKVStages, kCons>;
  static_assert(smem_bytes<Storage>() <= 227 * 1024, "shared memory plan exceeds 227 KB");
};
// Keys per K/V box (TMA) and per located block at head dim d and the kernels' kv block size blk
// (AttnPlan::blk): the 64-key stages of D = 256, else one kv block (a 64-key pair's two boxes).
constexpr int block_keys_of(int64_t d, int64_t blk) {
  return d == 256 ? HeadDimTraits<256>::kKeys : int(blk);
}

// Buffer rings (device/pipeline.cuh): K/V stages (the uniform path's V ring too), and each
// consumer's Q buffers.
using KVRing = sm90::Ring<kKVStages>;
using QRing = sm90::Ring<kQStages>;

// Named barriers (bar.sync ids; 0 is __syncthreads).
enum class NamedBarrier : uint32_t {
  kVTailStage0 = 1,  // every consumer warpgroup: V tail rows zeroed in K/V stage 0
  kVTailStage1 = 2,  // ... in stage 1
  kTurn0 = 3,        // uniform path: consumer 0's turn to issue its wgmma group
  kTurn1 = 4,        // ... consumer 1's turn
  kTurn2 = 5,        // ... consumer 2's (three consumer warpgroups, D = 32 and 64: HeadDimTraits)
  kLazy0 = 6,        // uniform path: consumer 0's vote on its block's lazy softmax (6 + consumer)
  kMerge = 9,        // the merging KV-major kernel's 64 merge threads (merge.cuh)
};

// Q tokens per tile for group size G (64 rows = tokens x G heads).
constexpr int tokens_per_tile(int group) { return kTileM / group; }
// A uniform unit is its consumers' tiles, `tiles` of them (HeadDimTraits::kCons: 3 at D = 32 and 64, 2
// otherwise; unit_tiles_of): 128 / G tokens for two tiles and G in {1, 2, 4, 8, 16}, and
// tiles floor(64 / G) for the other groups dense attention takes (up to 64; rows past them idle).
constexpr int unit_tokens(int group, int tiles) { return tiles * tokens_per_tile(group); }
constexpr int unit_tiles_of(int64_t head_dim) { return head_dim <= 64 ? 3 : 2; }
static_assert(unit_tiles_of(32) == HeadDimTraits<32>::kCons && unit_tiles_of(64) == HeadDimTraits<64>::kCons &&
                  unit_tiles_of(128) == HeadDimTraits<128>::kCons &&
                  unit_tiles_of(256) == HeadDimTraits<256>::kCons,
              "the host's unit size and the kernel's consumer count agree at every head dim");
// Units of a query block's n_tok tokens (<= its size); at most units_per_qblock(G, size) of them.
constexpr int units_of(int64_t n_tok, int group, int tiles) {
  return int((n_tok + unit_tokens(group, tiles) - 1) / unit_tokens(group, tiles));
}
constexpr int units_per_qblock(int group, int qblock_tokens, int tiles) {
  return units_of(qblock_tokens, group, tiles);
}
// Query block size of the uniform path (tokens whose q2k rows must be equal), as a shift: 64
// tokens for sparse calls with G >= 2, whose units (128 / G tokens) fit it whole, so selections
// shared by 64 queries (FlashInfer's R = 64 BSR rows) run Q-major too; 128 for G = 1 (a 64-token
// block would leave a unit's second tile empty) and for dense attention. Dense attention over
// three-tile units (`tiles` 3: 192 / G tokens, not a power of two) takes 512: a block's last unit
// is short, and its consumers with no rows still issue their MMAs, so the tiles that do work are
// 8 of 9 at G = 1 and 97% at G = 8 (128 tokens: 2 of 3 and 8 of 9). A dense call's units do not
// share anything but the block, so its size costs nothing else. Sparse calls keep their blocks
// (the selections a block shares are what the size decides).
constexpr int qblock_shift_of(bool dense, int group, int tiles) {
  return dense ? (tiles == 3 ? 9 : 7) : group >= 2 ? 6 : 7;
}

}  // namespace msa::cuda::sparse_fwd
