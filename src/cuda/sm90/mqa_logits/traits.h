// Tiles, shared-memory plan and barrier protocol of the sm_90a MQA logits kernels (ragged and
// paged, docs/semantics.md, Indexer logits). Included by kernel.cuh and launch.cu.
//
// Work unit: one CTA per (tile of query rows, range of key columns). A query row ("token": one
// logits row) has H heads; each token's heads take hp = H rounded up to a power of two >= 32 of
// the CTA's up to 256 query rows, in groups of 128 (wgmma N). Keys stream through shared memory
// in 128-key blocks; per block, four consumer warpgroups each take one 64-key half (wgmma M) and
// one group of 128 query rows: S^T = K Q^T (e4m3, fp32 accumulate), so that a thread's
// accumulators are two keys x 32 rows and a token's weighted relu sum needs only the thread's
// own columns and its quad's 4 lanes. With one row group, the two halves of a block take two
// warpgroups and the other two take the next block (column lanes).
// Budget, MQAL-PAGED-B64 (B 64, next_n 2, 32768 keys, H 64, D 128): K bytes 64 x 32768 x 132 =
//   277 MB (64 us at 4.3 TB/s); FLOP 2 x 64 x 128 x 128 rows x 32768 keys = 68.7 GFLOP (55 us
//   at 1238 TFLOP/s): the pool read bounds it, with the math close behind. The epilogue, ~200
//   instructions a thread per block, must stay under both.
#pragma once

#include <cstdint>

namespace msa::cuda::mqa_logits_sm90 {

constexpr int kHeadDim = 128;                       // D: one 128-byte swizzle row of e4m3
constexpr int kBlockN = 128;                        // keys per block: one wgmma N
constexpr int kTileM = 64;                          // query rows of a Q tile row group
constexpr int kMaxRowGroups = 4;                    // 256 query rows per CTA
constexpr int kMaxTokens = kMaxRowGroups * kTileM / 32;  // hp >= 32
constexpr int kProducerWarps = 4;                  // warps issuing key blocks, in turn
// K block pipeline depth: with four producer warps, MQAL-PAGED-B64 ran 131.6 / 108.8 / 111.6 us
// at 4 / 8 / 10 stages (one producer warp: 155.6 us at 4, 8 and 10 alike).
constexpr int kStages = 8;
// MXFP4 producers copy their keys' packed bytes kFp4Ahead blocks ahead into a ring of kFp4Raw
// slots (fp4_load.cuh): with one block of loads in flight a thread, each block cost a global
// round trip and MQAL-PAGED-B64-fp4 ran 188 us (1.47 us a block) against FP8's 91.
constexpr int kFp4Ahead = 2;
constexpr int kFp4Raw = kFp4Ahead + 1;
constexpr int kCtaCostBlocks = 4;                   // a CTA's fixed cost in blocks (launch.cu)
constexpr int kRowBytes = 128;
constexpr int kKBlockBytes = kBlockN * kRowBytes;   // 16 KB

// Four consumer warpgroups after the producer warpgroup (whose warp 0 issues every load).
struct Cfg {
  static constexpr int kConsumerThreads = 128 * 4;
  static constexpr int kThreads = 128 + kConsumerThreads;
  // One resident CTA per SM and the setmaxnreg budgets within the 65536 / 640 = 96 registers a
  // thread (ptxas compiles the whole kernel under that share; a wgmma's 64 accumulators leave no
  // room for a second set, so the four warpgroups overlap one another's wgmma and epilogue
  // instead: with two row groups holding two accumulator sets each, one CTA of 384 threads per
  // SM, MQAL-PAGED-B64 ran 216 us).
  static constexpr int kCtasPerSm = 1;
  static constexpr uint32_t kProducerRegs = 32;
  static constexpr uint32_t kConsumerRegs = 112;
  // MXFP4 (fp4_load.cuh): the whole producer warpgroup converts keys, holding a token's 64 bytes
  // (ptxas: 56 / 104 spilled 8 bytes, 32 / 112 168; 64 / 104 none). ptxas allocates the
  // consumers' region by its setmaxnreg: at 96 it serialized the head sum's 16 wgmmas (C7512).
  static constexpr uint32_t kFp4ProducerRegs = 64;
  static constexpr uint32_t kFp4ConsumerRegs = 104;
  static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <=
                    (65536 / (kThreads * kCtasPerSm)) / 8 * 8 * kThreads,
                "Cfg: setmaxnreg budgets exceed the launch's registers");
  static_assert(128 * kFp4ProducerRegs + kConsumerThreads * kFp4ConsumerRegs <=
                    (65536 / (kThreads * kCtasPerSm)) / 8 * 8 * kThreads,
                "Cfg: FP4 setmaxnreg budgets exceed the launch's registers");
};

struct alignas(1024) SharedStorage {
  uint8_t q[kMaxRowGroups * kTileM * kRowBytes];  // token i's heads at rows [i hp, i hp + H), zero to hp
  uint8_t k[kStages][kKBlockBytes];
  float scale[kStages][kBlockN];       // each stage's key scales (0 where no key was copied)
  float wt[kMaxRowGroups * kTileM];               // each query row's head weight (0 past H)
  // Each 128-row group's weights as the head-sum product's B (kernel.cuh): per k-step of 8 query
  // rows, two 8 x 16-byte core matrices (k 0-3, 4-7) of 8 token columns, K-major, no swizzle.
  alignas(256) float wtile[kMaxRowGroups * kTileM / kBlockN][16][2][8][4];
  int32_t lo[kMaxTokens], hi[kMaxTokens];  // token i sees columns [lo, hi)
  // MXFP4 (fp4_load.cuh): each producer thread's packed key (64 value bytes, 16-byte chunks
  // swizzled by the thread index) and scale word for kFp4Raw blocks, kFp4Ahead blocks ahead.
  uint8_t raw[kFp4Raw][kBlockN][64];
  uint32_t raw_sf[kFp4Raw][kBlockN];
  uint64_t q_full;
  uint64_t full[kStages];   // producer lane 0 (+ TMA bytes) and its 32 lanes' scale copies
  uint64_t empty[kStages];  // every consumer thread, after its last read of the stage
};
constexpr int kSmemBytes = int(sizeof(SharedStorage)) + 1024;
static_assert(kSmemBytes <= 227 * 1024, "MQA logits: shared memory over 227 KB");

// Named barriers (bar.sync ids; 0 is __syncthreads).

}  // namespace msa::cuda::mqa_logits_sm90
