// Tiles, shared-memory plan and barrier protocol of the sm_90a MQA logits kernels (ragged and
// paged, docs/semantics.md, Indexer logits). Included by kernel.cuh and launch.cu.
//
// Work unit: one CTA per (tile of query rows, range of key columns). A query row ("token": one
// logits row) has H heads; each token's heads take hp = H rounded up to 16 rows of the CTA's
// R x 64 rows (R row groups, one consumer warpgroup each, wgmma M = 64), so every warp's 16 rows
// belong to one token. Keys stream through shared memory in 128-key blocks (wgmma N = 128); per
// block and row group S = Q K^T (e4m3, fp32 accumulate), then relu, the head weights and the sum
// over a token's heads: within a warp by shuffles, across the token's warps through shared
// memory, times the key's scale.
// Budget, MQAL-PAGED-B64 (B 64, next_n 2, 32768 keys, H 64, D 128): K bytes 64 x 32768 x 132 =
//   277 MB (64 us at 4.3 TB/s); FLOP 2 x 128 rows x 64 x 32768 x 128 x ... = 68.7 GFLOP (55 us at
//   1238 TFLOP/s): the pool read bounds it, with the math close behind.
#pragma once

#include <cstdint>

namespace msa::cuda::mqa_logits_sm90 {

constexpr int kHeadDim = 128;                       // D: one 128-byte swizzle row of e4m3
constexpr int kBlockN = 128;                        // keys per block: one wgmma N
constexpr int kTileM = 64;                          // rows per row group (wgmma M)
constexpr int kMaxRowGroups = 4;                    // 256 rows per CTA
constexpr int kMaxTokens = kMaxRowGroups * kTileM / 16;  // hp >= 16
constexpr int kStages = 4;                          // K block pipeline depth
constexpr int kRowBytes = 128;
constexpr int kKBlockBytes = kBlockN * kRowBytes;   // 16 KB

// R consumer warpgroups after the producer warpgroup (whose warp 0 issues every load).
template <int kR>
struct Cfg {
  static_assert(kR == 1 || kR == 2 || kR == 4, "Cfg: 1, 2 or 4 row groups");
  static constexpr int kConsumerThreads = 128 * kR;
  static constexpr int kThreads = 128 + kConsumerThreads;
  static constexpr int kWarps = 4 * kR;  // consumer warps: 16 rows each
  // setmaxnreg budgets within the launch's 65536 / kThreads registers (rounded down to 8):
  // 256 threads 255, 384 threads 168, 640 threads 96 per thread.
  static constexpr uint32_t kProducerRegs = kR == 4 ? 32 : 40;
  static constexpr uint32_t kConsumerRegs = kR == 4 ? 112 : 232;
  static_assert(128 * (kProducerRegs + kR * kConsumerRegs) <=
                    (65536 / kThreads) / 8 * 8 * kThreads,
                "Cfg: setmaxnreg budgets exceed the launch's registers");
};

template <int kR>
struct alignas(1024) SharedStorage {
  uint8_t q[kR * kTileM * kRowBytes];  // token i's heads at rows [i hp, i hp + H), zero to hp
  uint8_t k[kStages][kKBlockBytes];
  float scale[kStages][kBlockN];       // each stage's key scales (0 where no key was copied)
  float red[2][4 * kR][kBlockN];       // per consumer warp, its 16 rows' sum per key (2 blocks)
  int32_t lo[kMaxTokens], hi[kMaxTokens];  // token i sees columns [lo, hi)
  uint64_t q_full;
  uint64_t full[kStages];   // producer lane 0 (+ TMA bytes) and its 32 lanes' scale copies
  uint64_t empty[kStages];  // every consumer thread, after its last read of the stage
};
template <int kR>
constexpr int smem_bytes() {
  return int(sizeof(SharedStorage<kR>)) + 1024;
}
static_assert(smem_bytes<kMaxRowGroups>() <= 227 * 1024, "MQA logits: shared memory over 227 KB");

// Named barriers (bar.sync ids; 0 is __syncthreads).
enum class NamedBarrier : uint32_t {
  kConsumers = 1,  // the consumer warpgroups: a block's per-warp sums are in red
};

}  // namespace msa::cuda::mqa_logits_sm90
