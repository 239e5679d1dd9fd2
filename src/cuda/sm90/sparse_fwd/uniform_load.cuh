// Producer of the uniform (Q-major) path: per unit, its 64-row Q tiles (one per consumer: two, or
// three at D = 32 / 64; double-buffered across units) and then the unit's selected K/V blocks, one
// K/V stage each.
// One warp does it all: a unit streams up to top-K blocks, so its loads are few. kernel.cuh.
// The dense kernel at D = 128 (kDenseQ) splits it: a Q warp claims the units and loads their Q
// tiles, handing each unit's descriptor to the K/V warp through unit_desc / unit_full.
//
// Barrier protocol: Q buffer (consumer c, stage unit_iter % 2) is refilled after q_empty (the
// consumer's one arrive at the end of the unit that used it); q_full counts the lanes that own
// token slots, each arriving after its metadata (token, last visible key, head) is written.
// Each K stage is published as UniformInfo {kb, valid keys, first, last} by lane 0 with
// arrive.expect_tx (32 KB at D = 128, 16 KB a 64-key block, or the bytes of the pages a paged
// block has: kv_load.cuh; FP8 QK: half of that in e4m3 K, and every lane's arrival after its
// cp.async of the key scales) or, for a unit without a usable block, a plain arrive (kb = -1); a
// block's V follows on the V ring (v_full, the 16-bit byte count).
#pragma once

#include <type_traits>

#include "cuda/common/pdl.cuh"
#include "cuda/device/sm90.cuh"
#include "cuda/sm90/sparse_fwd/kv_load.cuh"
#include "cuda/sm90/sparse_fwd/params.h"
#include "cuda/sm90/sparse_fwd/traits.h"

namespace msa::cuda::sparse_fwd {

__device__ __forceinline__ UnitDesc load_unit(const UniformParams& p, int32_t unit) {
  const int4* src = static_cast<const int4*>(p.units) + 2 * int64_t(unit);
  const int4 a = src[0], b = src[1];
  return UnitDesc{a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
}

// Q tile of consumer c: unit tokens [c * tpt, c * tpt + tpt), tpt = 64 / G.
template <bool kFp8, class Storage>
__device__ __forceinline__ void produce_unit_q(const UniformParams& p, const CUtensorMap* tm_q,
                                               Storage& sh, const UnitDesc& u, int c,
                                               int stage, int lane) {
  TileMeta& meta = sh.meta[c][stage];
  const int tpt = p.tokens_per_tile;
  int32_t tok[2] = {-1, -1};
  int valid = 0;
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int i = lane + 32 * k;
    if (i >= tpt) break;
    const int32_t ut = c * tpt + i;
    int32_t last = -1;
    if (ut < u.n_tok) {
      tok[k] = u.q_first + ut;
      const int32_t local = u.q_local0 + ut;
      last = causal_last(p.causal, local, u.diag, u.k_len);  // batch-local, may be -1
      ++valid;
    }
    meta.token[i] = tok[k];
    meta.limit[i] = last;
    meta.slot[i] = u.head;
  }
  const int n_valid = __reduce_add_sync(0xffffffffu, valid);
  if (lane == 0)
    sm90::mbar_expect_tx(&sh.q_full[c][stage],
                         uint32_t(n_valid) * uint32_t(p.group) *
                             q_bytes_per_row<kFp8, std::extent_v<decltype(Storage::q), 2>>());
  __syncwarp();
  const int32_t head_row = u.head * p.group;
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    if (tok[k] < 0) continue;
    const int row_bytes = (lane + 32 * k) * p.group * 128;
    load_q_token<kFp8>(sh.q[c][stage], row_bytes, tm_q, &sh.q_full[c][stage], head_row, tok[k]);
  }
  if (lane < tpt) sm90::mbar_arrive(&sh.q_full[c][stage]);
}

// Units are claimed from a cursor (unit_cursor, zeroed by the prep with the count) as a CTA
// reaches them: CTAs that start late (this kernel fills the KV-major kernel's tail, one CTA
// an SM as that kernel's CTAs exit) or that drew costly units take fewer, and the table lists
// the costliest first, so the claims form a greedy longest-first schedule. A static stride gave
// every CTA the same share however late it started: P8K-tok's uniform units (its first 2048
// tokens see every block) ran ~150 us past the KV-major kernel. Which CTA runs a unit does not
// change its rows' bits. The claiming warp runs a unit ahead of the consumers (Q buffers are
// double-buffered across units), so the atomic's latency is off their path.
// 64-key blocks (sparse units of one cost) keep a plain stride and head dims 32 and 64 the
// reversed rounds (CTA i takes i, 2 grid - 1 - i, ...: the table lists the costliest first):
// the claim loop moved ptxas's register allocation of their consumers (64-key spills 4 -> 8 and
// 16 -> 20 bytes; D = 64 0 -> 4 bytes, DENSE-16K-D64 +1.3%).
template <int kD, int kBlk>
__device__ __forceinline__ int32_t claim_unit(const UniformParams& p, int32_t unit_iter,
                                              int32_t& stride_unit, int lane) {
  int32_t unit;
  if constexpr (kBlk == 64 || kD <= 64) {
    unit = stride_unit;
    if (kD <= 64 && (unit_iter & 1)) unit += int32_t(gridDim.x) - 1 - 2 * int32_t(blockIdx.x);
    stride_unit += int32_t(gridDim.x);
  } else {
    if (lane == 0) unit = atomicAdd(p.unit_cursor, 1);
    unit = __shfl_sync(0xffffffffu, unit, 0);
  }
  return unit;
}

// Dense calls: once a CTA has claimed past the last unit, the stream's next kernel may launch
// under its last units (the claiming warp waited for the unit table, kernel.cuh; the next kernel
// waits for this grid, pdl.cuh). LAT-2K dense -1.5% (H100, measured with the Q warp).
__device__ __forceinline__ void units_claimed(const UniformParams& p) {
  if (p.dense) pdl_trigger();
}

// The Q warp of the dense kernel at D = 128 (kDenseQ, kernel.cuh): once the consumers have freed
// a Q buffer stage it claims a unit, loads the unit's Q tiles (a unit ahead of the K/V warp, which
// the Q buffers' two stages allow) and hands the unit's descriptor to warp 0 through unit_desc /
// unit_full (head -1 once the units are done). Where one warp does both, the next unit's claim,
// descriptor load and Q wait for this unit's last K/V stage, about two block steps before the
// consumers need them. Against that (H100, flat K/V): LAT-256 dense -4%, LAT-2K pipeline -3%,
// DENSE-8K -1%. In the kernel shared with sparse calls its code made the producer spill
// (P32K-blk +1-2%, D = 64 +5%); paged K/V stays there too (launch.cu). Claiming before the wait
// (a unit earlier) measured the same.
template <bool kFp8, int kD, int kBlk>
__device__ __forceinline__ void run_uniform_q_warp(const UniformParams& p, const CUtensorMap* tm_q,
                                                   typename HeadDimTraits<kD, kBlk>::Storage& sh,
                                                   int lane) {
  using HT = HeadDimTraits<kD, kBlk>;
  using QR = sm90::Ring<HT::kQSt>;
  const int32_t n_units = *p.num_units;
  int32_t stride_unit = int32_t(blockIdx.x);
  for (int32_t unit_iter = 0;; ++unit_iter) {
    const int qs = QR::stage(unit_iter);
    for (int c = 0; c < HT::kCons; ++c)
      sm90::mbar_wait(&sh.q_empty[c][qs], QR::empty_parity(unit_iter));
    const int32_t unit = claim_unit<kD, kBlk>(p, unit_iter, stride_unit, lane);
    UnitDesc u{-1};  // head -1: no more units
    if (unit < n_units) u = load_unit(p, unit);
    if (lane == 0) {
      sh.unit_desc[qs] = u;
      sm90::mbar_arrive(&sh.unit_full[qs]);
    }
    if (unit >= n_units) {
      units_claimed(p);
      return;
    }
#pragma unroll 1
    for (int c = 0; c < HT::kCons; ++c) produce_unit_q<kFp8>(p, tm_q, sh, u, c, qs, lane);
  }
}

// kD, kBlk: the head dim and keys per kv block (traits.h HeadDimTraits): stages of kKeys keys
// (kBlk; 64 at D = 256: a 128-key block is two stages), kQSt Q buffers per consumer.
// kDenseQ: the dense kernel with a Q warp (kernel.cuh): this warp takes each unit's descriptor
// from the Q warp and publishes its K/V stages only.
template <bool kFp8, int kD, int kBlk, bool kParts, bool kDenseQ = false>
__device__ __forceinline__ void run_uniform_producer(const UniformParams& p,
                                                     const CUtensorMap* tm_q,
                                                     const CUtensorMap* tm_k,
                                                     const CUtensorMap* tm_v,
                                                     typename HeadDimTraits<kD, kBlk>::Storage& sh,
                                                     int warp, int lane) {
  using HT = HeadDimTraits<kD, kBlk>;
  using QR = sm90::Ring<HT::kQSt>;
  constexpr int kKeys = HT::kKeys;
  constexpr int kBoxKeys = HT::kBlockPairs ? kBlk : kKeys;  // keys of one located block
  constexpr int kStageHalf = HT::Storage::kKVStageHalfBytes;
  if (warp != 0) return;
  const int32_t n_units = kDenseQ ? 0 : *p.num_units;
  // Two rings over the same stage buffers: K (with the stage's info) on kv_full / kv_empty,
  // counting every published stage; V on v_full / v_empty, counting real blocks only. Consumers
  // hold K of block j and V of block j - 1 at once, so K of j + 1 loads while j is in flight.
  int32_t kv_iter = 0, v_iter = 0, unit_iter = 0;
  // Block info.kb of unit u (u.k_start: the batch's first key row, or its batch index for paged
  // KV; kv_load.cuh gives each barrier the exact bytes of the flat or paged boxes).
  // A 64-key pair (HT::kBlockPairs) locates its second block info.kb2 too, into rows 64-127.
  auto publish = [&](UniformInfo info, const UnitDesc& u) {
    const int s = KVRing::stage(kv_iter);
    const int32_t kv_head = p.kv_split == 1 ? u.head : u.head / p.kv_split;  // AttnProblem
    sm90::mbar_wait(&sh.kv_empty[s], KVRing::empty_parity(kv_iter));
    KVBlockSource src{}, src2{};
    if (info.kb >= 0)
      src = locate_kv_block<kBoxKeys>(p.paged, kv_head, u.k_start, info.kb, u.k_len, HT::kHalves,
                                      lane);
    if constexpr (HT::kBlockPairs) {
      if (info.kb2 >= 0) {
        src2 = locate_kv_block<kBoxKeys>(p.paged, kv_head, u.k_start, info.kb2, u.k_len,
                                         HT::kHalves, lane);
        src2.row_bytes += kBoxKeys * 128;
      }
    }
    if constexpr (kFp8) {  // a pair's second block: its own first key's scales in rows 64-127
      const int32_t key0_hi = HT::kBlockPairs && info.kb2 >= 0 ? src2.c2 : src.c2 + kKeys / 2;
      load_key_scales<kKeys>(p, info.kb >= 0, kv_head, src.c2, key0_hi, sh.kscale[s],
                             &sh.kv_full[s], lane);
    }
    if (lane == 0) {
      if constexpr (kLastInKeys<kD>) info.valid_keys |= info.last ? kLastStageBit : 0;
      sh.uinfo[s] = info;
      if (info.kb >= 0)
        sm90::mbar_arrive_expect_tx(&sh.kv_full[s],
                                    k_tile_bytes<kFp8>(src) + k_tile_bytes<kFp8>(src2));
      else sm90::mbar_arrive(&sh.kv_full[s]);
    }
    __syncwarp();
    if (info.kb >= 0) {
      load_k_tile<kFp8>(src, tm_k, sh.k[s], &sh.kv_full[s]);
      if constexpr (HT::kBlockPairs) load_k_tile<kFp8, true>(src2, tm_k, sh.k[s], &sh.kv_full[s]);
    }
    ++kv_iter;
    if (info.kb >= 0) {
      const int vs = KVRing::stage(v_iter);
      sm90::mbar_wait(&sh.v_empty[vs], KVRing::empty_parity(v_iter));
      if (lane == 0) sm90::mbar_arrive_expect_tx(&sh.v_full[vs], src.bytes + src2.bytes);
      __syncwarp();
      load_kv_tile(src, tm_v, sh.v[vs], &sh.v_full[vs]);
      if constexpr (HT::kBlockPairs)
        load_kv_tile<HT::kHalves, kStageHalf, true>(src2, tm_v, sh.v[vs], &sh.v_full[vs]);
      ++v_iter;
    }
    __syncwarp();
  };
  // Dense units: every stage of kKeys keys up to the last key any row of the unit sees (dense
  // attention runs the 128-key kernels: plan.cpp).
  auto publish_dense = [&](const UnitDesc& u) {
    if constexpr (!HT::kBlockPairs) {
      const int32_t last_max = causal_last(p.causal, u.q_local0 + u.n_tok - 1, u.diag, u.k_len);
      const int32_t nblk = (u.k_len + kKeys - 1) / kKeys;
      const int32_t n_blocks = last_max < 0 ? 0 : min(nblk, last_max / kKeys + 1);
      if (n_blocks == 0) publish(UniformInfo{-1, 0, -1, 1}, u);
      for (int32_t kb = 0; kb < n_blocks; ++kb)
        publish(UniformInfo{kb, min(kKeys, u.k_len - kb * kKeys), -1, kb == n_blocks - 1 ? 1 : 0},
                u);
    }
  };
  int32_t stride_unit = int32_t(blockIdx.x);
  for (;; ++unit_iter) {
    const int qs = QR::stage(unit_iter);
    if constexpr (kDenseQ) {
      sm90::mbar_wait(&sh.unit_full[qs], QR::full_parity(unit_iter));
      const UnitDesc& u = sh.unit_desc[qs];  // read where used: fewer registers held a unit
      if (u.head < 0) break;
      publish_dense(u);
      continue;
    }
    const int32_t unit = claim_unit<kD, kBlk>(p, unit_iter, stride_unit, lane);
    if (unit >= n_units) {
      if constexpr (!HT::kBlockPairs) units_claimed(p);  // 64-key kernels never run dense calls
      break;
    }
    const UnitDesc u = load_unit(p, unit);
    for (int c = 0; c < HT::kCons; ++c) {
      sm90::mbar_wait(&sh.q_empty[c][qs], QR::empty_parity(unit_iter));
      produce_unit_q<kFp8>(p, tm_q, sh, u, c, qs, lane);
    }
    if (p.dense) {
      publish_dense(u);
      continue;
    }
    const int32_t last_max = causal_last(p.causal, u.q_local0 + u.n_tok - 1, u.diag, u.k_len);
    if constexpr (kBoxKeys < kBlk && !kParts) continue;  // the dense kernel of this shape
    const int32_t nblk = (u.k_len + kBlk - 1) / kBlk;
    // Selected blocks in slot order, skipping ids outside [0, nblk) and blocks past the last
    // key any row of the unit sees (they would be fully masked).
    const int32_t* sel = p.q2k + (int64_t(u.head) * p.total_q + u.sel_token) * p.topk;
    int32_t n_blocks = 0;
    for (int32_t base = 0; base < p.topk; base += 32) {
      const int32_t kb = base + lane < p.topk ? sel[base + lane] : -1;
      n_blocks += __popc(__ballot_sync(0xffffffffu, kb >= 0 && kb < nblk && kb * kBlk <= last_max));
    }
    if (n_blocks == 0) {
      publish(UniformInfo{-1, 0, -1, 1}, u);
      continue;
    }
    // f(kb) for each of those blocks, in slot order (kb warp-uniform).
    auto for_each_block = [&](auto&& f) {
      for (int32_t base = 0; base < p.topk; base += 32) {
        const int32_t mine = base + lane < p.topk ? sel[base + lane] : -1;
        unsigned use = __ballot_sync(0xffffffffu,
                                     mine >= 0 && mine < nblk && mine * kBlk <= last_max);
        while (use) {
          const int src = __ffs(use) - 1;
          use &= use - 1;
          f(__shfl_sync(0xffffffffu, mine, src));
        }
      }
    };
    if constexpr (kBoxKeys < kBlk) {
      // D = 256 over 128-key blocks: each block's 64-key parts as stages (in 64-key units, as
      // dense attention's), those holding keys the unit sees. One stage is held back, so the
      // last goes out with its flag (a selected block's first part always holds such keys).
      UniformInfo held{-1, 0, -1, 0};
      for_each_block([&](int32_t kb) {
        for (int32_t k0 = kb * kBlk; k0 < (kb + 1) * kBlk; k0 += kBoxKeys) {
          if (k0 >= u.k_len || k0 > last_max) break;
          if (held.kb >= 0) publish(held, u);
          held = UniformInfo{k0 / kBoxKeys, min(kBoxKeys, u.k_len - k0), -1, 0};
        }
      });
      held.last = 1;
      publish(held, u);
      continue;
    }
    if constexpr (HT::kBlockPairs) {
      // Two selected blocks a stage, in slot order. A partial block (the batch's last, k_len % 64
      // keys) never takes rows 0-63 of a pair: the V rows past a stage's keys are then its tail
      // (zero_v_tail). One stage is held back, so the last goes out with its flag.
      UniformInfo held{-1, 0, -1, 0};
      int32_t open = -1;  // a whole block waiting for its pair
      auto put = [&](const UniformInfo& info) {
        if (held.kb >= 0) publish(held, u);
        held = info;
      };
      for_each_block([&](int32_t kb) {
        const int32_t valid = min(kBlk, u.k_len - kb * kBlk);
        if (open >= 0) {
          put(UniformInfo{open, kBlk + valid, kb, 0});
          open = -1;
        } else if (valid == kBlk) {
          open = kb;
        } else {
          put(UniformInfo{kb, valid, -1, 0});
        }
      });
      if (open >= 0) put(UniformInfo{open, kBlk, -1, 0});
      held.last = 1;
      publish(held, u);
      continue;
    }
    int32_t done = 0;
    for_each_block([&](int32_t kb) {
      publish(UniformInfo{kb, min(kBlk, u.k_len - kb * kBlk), -1, done == n_blocks - 1 ? 1 : 0},
              u);
      ++done;
    });
  }
  publish(UniformInfo{-2, 0, -1, 0}, UnitDesc{});  // end marker
}

}  // namespace msa::cuda::sparse_fwd
