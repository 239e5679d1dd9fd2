// Token-sparse attention forward (kv_block_size = 1; docs/semantics.md, Token-sparse attention):
// tiles, stages, shared memory and parameters of the token kernel (token_kernel.cuh), launched by
// token_launch.cu.
//
// Work unit: one (query token t, kv head h, row tile) with up to 64 rows = query heads of h's
// group (G <= 64: one tile, rows past G idle; G up to 128: two tiles, each its own CTA). The
// query's q2k row [K] lists key positions; the CTA gathers them 64 a stage (16-byte cp.async rows:
// a stage has no run of consecutive keys for a TMA box, and sm_90's TMA has no gather) and runs
// S = Q K^T, the online softmax and O += P V with wgmma (M = the 64 rows).
//
// Byte / FLOP budget at TOKSPARSE-32K (S = 32768, Hq = 64 on one kv head, K = 2048, D = 128, bf16):
// per (query, selected key) 512 bytes of K and V gathered for 64 x 128 x 4 = 32768 FLOP, i.e. 64
// FLOP per byte. 2.2e12 FLOP over ~34 GB of gathers (the 16 MB of K / V live in L2): 300
// effective TFLOP/s needs ~4.7 TB/s of L2 -> SM traffic; the math alone is ~3.1 ms at 716 TFLOP/s.
// The kernel is therefore built for bytes in flight: two CTAs per SM, three 32 KB stages each.
#pragma once

#include <cstdint>

#include "cuda/common/paged_kv.cuh"
#include "cuda/device/pipeline.cuh"

namespace msa::cuda::sparse_fwd {

constexpr int kTokKeys = 64;       // keys per stage (S = m64n64, P V k64)
constexpr int kTokThreads = 256;   // one producer warpgroup, one consumer warpgroup
constexpr int kTokHalfBytes = kTokKeys * 128;  // one 64-column half of a stage's K or V: 8 KB
// Head dims (kD): a row is kD / 64 halves of 128 bytes. K/V stages a CTA: 3 at every D (3 x 32 KB
// + Q 16 KB at 128: two CTAs per SM; Q 32 KB + 3 x 64 KB = 225 KB at 256: one CTA per SM). The
// consumer holds two stages at a time (this block's K for S, the last block's V for P V, until
// its release), so the third is the one that loads under the math: with two at D = 256 each
// stage's gather would wait for a release.
template <int kD>
constexpr int kTokStagesOf = 3;
template <int kD>
constexpr int kTokCtasPerSm = kD == 256 ? 1 : 2;
// setmaxnreg: 256 threads at two CTAs per SM start with 128 registers each; the producer gives
// 72 to the consumer (its S, O and P of two stages in flight: ~150 live).
constexpr int kTokProducerRegs = 56;
constexpr int kTokConsumerRegs = 200;
static_assert(kTokProducerRegs + kTokConsumerRegs <= 2 * 128, "registers of two CTAs per SM");
// D = 256 (one CTA per SM: 240 registers a thread at launch): O alone is 128 floats, so the
// consumer takes 240 (at 200 ptxas spilled 88 bytes), and the producer, whose 16 copy steps a
// stage hold more addresses, 96.
template <int kD>
constexpr int kTokConsumerRegsOf = kD == 256 ? 240 : kTokConsumerRegs;
template <int kD>
constexpr int kTokProducerRegsOf = kD == 256 ? 96 : kTokProducerRegs;
static_assert(kTokProducerRegsOf<256> + kTokConsumerRegsOf<256> <= 2 * 240,
              "registers of one CTA per SM");


// Parameters of the token kernel. Keys of batch b: flat, rows cu_k[b] .. cu_k[b + 1] of k / v;
// paged, slots of page_table row b (lengths from cu_k as the paged check clamped them).
struct TokenParams {
  const void* q = nullptr;        // [total_q, Hq, D], row strides below (elements)
  int64_t q_stride_t = 0, q_stride_h = 0;
  const void* k = nullptr;        // flat [total_k, Hkv, D]; paged the pool
  const void* v = nullptr;
  // Element strides of a key row: flat (token, head); paged (page, slot, head).
  int64_t k_stride_page = 0, k_stride_row = 0, k_stride_head = 0;
  int64_t v_stride_page = 0, v_stride_row = 0, v_stride_head = 0;
  PagedKV paged;                        // page_table null: flat (its box fields unused)
  int64_t total_k = 0;                  // flat: rows of k / v (a corrupt cu_seqlens_k cannot
                                        // send a read past them)
  const int32_t* q2k = nullptr;   // [Hkv, total_q, topk] key positions, -1 unused
  int32_t topk = 0;
  const int32_t* cu_seqlens_q = nullptr;  // [B + 1]
  const int32_t* cu_k = nullptr;          // [B + 1]: flat cu_seqlens_k or the paged key offsets
  const int32_t* causal_offset = nullptr; // [B] or null
  int32_t batch = 0;
  int64_t total_q = 0;
  int32_t num_q_heads = 0, group = 1, row_tiles = 1;
  int32_t causal = 1;
  float scale_log2 = 0.f, inv_temperature = 0.f, soft_cap_log2 = 0.f;
  void* out = nullptr;                  // [total_q, Hq, D]
  int64_t out_stride_t = 0, out_stride_h = 0;
  float* lse = nullptr;                 // [Hq, total_q] or null
  float* tlse = nullptr;                // [Hq, total_q] or null
  // Key mask (key_mask.h, packed by launch_key_mask): bits [rows, mask_words], row = the token
  // (per query) or mask_token_row[token] (per batch); null: none. A selected key whose bit is 0
  // is left out as an invisible one is.
  const uint32_t* mask_bits = nullptr;
  const int32_t* mask_token_row = nullptr;
  int32_t mask_words = 0;
};

template <int kD>
struct alignas(1024) TokenStorage {
  static constexpr int kHalves = kD / 64, kStages = kTokStagesOf<kD>;
  uint8_t q[kHalves][kTokHalfBytes];           // 64 rows x D columns, D / 64 128-byte halves
  uint8_t k[kStages][kHalves][kTokHalfBytes];
  uint8_t v[kStages][kHalves][kTokHalfBytes];
  // Per producer warp w, bit 2 i + e: key 8 i + 2 w + e of the stage is selected and visible.
  alignas(16) uint32_t mask[kStages][4];
  uint64_t full[kStages], empty[kStages], q_full;
  int32_t stages;                              // the unit's stage count (producer's row scan)
  int32_t last_slot;                           // scratch of that scan
};
// No alignment slack: two CTAs of 113 KB (D = 128) fill the SM's 228 KB with the 1 KB each
// reserves, and dynamic shared memory of a kernel without static shared memory starts 1024-byte
// aligned (the kernel checks it and traps otherwise: an internal invariant, not an input error).
template <int kD>
constexpr int kTokSmemBytes = int(sizeof(TokenStorage<kD>));
static_assert(2 * (kTokSmemBytes<128> + 1024) <= 228 * 1024 &&
                  2 * (kTokSmemBytes<64> + 1024) <= 228 * 1024 &&
                  kTokSmemBytes<256> + 1024 <= 228 * 1024,
              "token CTAs per SM (kTokCtasPerSm)");

}  // namespace msa::cuda::sparse_fwd
