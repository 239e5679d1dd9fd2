// Producer warpgroup of the sparse forward: TMA loads of each chunk's K/V block (warp 0) and the
// CSR-gather of Q tiles. D = 64 (three consumers, KVMajorTraits::kSplitV): warp 1 + c gathers
// consumer c's two Q buffers. D = 128: warps 0-3, one (consumer, stage) buffer each; D = 256:
// warps 0-1, one Q buffer a consumer.
// Called from kernel.cuh.
//
// Barrier protocol. Tile T (counted over this CTA's chunks) goes to consumer T % C (C consumers),
// Q stage (T / C) % kQSt; with three consumers warp 1 + T % 3 owns both of that consumer's
// buffers, with two warp T % (2 kQSt) owns the buffer, and the warp waits only on its q_empty. A
// tile's q_full phase completes after (1) the lanes that own token slots arrive, each releasing
// the TileMeta entries it wrote, and (2) all TMA bytes announced by lane 0's expect_tx have
// landed. Consumers release a buffer (q_empty) by the lanes that read its metadata (staged bf16
// partials: every thread, after the TMA stores read the tile), and a K/V stage (kv_empty) by lane
// 0 of each warp, which read its ChunkInfo: every read precedes its release.
// K/V: warp 0 waits kv_empty (every consumer done with the stage), lane 0 writes ChunkInfo, then
// the warp loads the block (kv_load.cuh: lane 0's arrive.expect_tx with the exact bytes of the
// flat or paged boxes, then the TMA loads). With three consumers K (and the stage's ChunkInfo and
// key scales) publish on kv_full of a two-stage ring and V on v_full of its one stage, loaded once
// v_empty says every consumer has released the previous chunk's V; a consumer releases V only
// after it landed (mma.cuh run_consumer). After the last chunk warp 0 publishes n_tiles = -1.
#pragma once

#include "cuda/device/sm90.cuh"
#include "cuda/sm90/sparse_fwd/kv_load.cuh"
#include "cuda/sm90/sparse_fwd/params.h"
#include "cuda/sm90/sparse_fwd/traits.h"

namespace msa::cuda::sparse_fwd {

struct ChunkView {  // a ChunkDesc plus what every role derives from it
  ChunkDesc d;
  int32_t n_tiles;
  int32_t valid_keys;  // keys of the block inside the batch (1..kBlk)
};
// ChunkDesc::k_start is the batch's first key row for flat KV and the batch index (its
// page-table row) for paged KV (scheduler.cuh); k_len is the batch's key count either way.

// kBlk: keys per kv block (128 or 64).
template <int kBlk>
__device__ __forceinline__ ChunkView load_chunk(const MainParams& p, int32_t chunk) {
  ChunkView v;
  const int4* src = static_cast<const int4*>(p.chunks) + 2 * int64_t(chunk);
  const int4 a = src[0], b = src[1];
  v.d = ChunkDesc{a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  const int32_t n_tok = v.d.e_end - v.d.e_begin;
  v.n_tiles = (n_tok + p.tokens_per_tile - 1) / p.tokens_per_tile;
  v.valid_keys = max(0, min(kBlk, v.d.k_len - v.d.kb * kBlk));
  return v;
}

// The first chunk at or after `chunk` (this CTA's stride) with entries left after compaction, or
// one >= n_chunks. The warp tests 32 of the CTA's chunks per round trip: under block-uniform
// selections every chunk is empty (its entries went to the uniform path), and a one-by-one walk
// would be a chain of dependent loads.
__device__ __forceinline__ int32_t next_busy_chunk(const MainParams& p, int64_t chunk,
                                                   int32_t n_chunks, int lane) {
  for (; chunk < n_chunks; chunk += 32 * int64_t(gridDim.x)) {
    const int64_t mine = chunk + int64_t(lane) * gridDim.x;
    bool busy = false;
    if (mine < n_chunks) {
      const int4 a = static_cast<const int4*>(p.chunks)[2 * mine];
      busy = a.w > a.z;  // e_end > e_begin
    }
    const unsigned any = __ballot_sync(0xffffffffu, busy);
    if (any) return int32_t(chunk + (__ffs(any) - 1) * int64_t(gridDim.x));
  }
  return n_chunks;
}

// CSR entries of one Q tile as this lane sees them: tokens lane and lane + 32 (a tile holds at
// most 64 tokens, G = 1). Loaded one tile ahead, before the buffer wait, to hide their latency.
struct TileIdx {
  int32_t local[2];  // batch-local query id, -1: none
  int32_t slot[2];   // q2k slot of (token, kb), -1: none
};

__device__ __forceinline__ TileIdx load_tile_idx(const MainParams& p, const ChunkView& c, int j,
                                                 int lane) {
  TileIdx x{{-1, -1}, {-1, -1}};
  const int64_t head_off = int64_t(c.d.head) * p.q_idx_stride;
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const int i = lane + 32 * u;
    const int32_t e = c.d.e_begin + j * p.tokens_per_tile + i;
    if (i < p.tokens_per_tile && e < c.d.e_end) {
      x.local[u] = p.work_local[head_off + e];
      x.slot[u] = p.work_slot[head_off + e];
    }
  }
  return x;
}

// Fills Q tile `j` of chunk `c` into buffer (consumer, stage) and arms its q_full barrier.
// Each lane that owns a token slot (lane < min(32, tokens per tile), the q_full count) arrives
// once after writing its metadata, so every write is released by its writer; lane 0 announces
// the TMA bytes before any copy is issued.
// tile_head (the merging kernel, merge.cuh): the tile's kv head for its store warp, written with
// the metadata by lane 0.
template <bool kFp8, int kBlk, int kD, bool kMerge = false>
__device__ __forceinline__ void produce_q_tile(const MainParams& p, const CUtensorMap* tm_q,
                                               KVMajorStorage<kBlk, kD>& sh, const ChunkView& c,
                                               const TileIdx& x, int consumer, int stage,
                                               int lane, int32_t* tile_head = nullptr) {
  TileMeta& meta = sh.meta[consumer][stage];
  if constexpr (kMerge) {
    if (lane == 0) tile_head[consumer * kQStages + stage] = c.d.head;
  }
  const int tpt = p.tokens_per_tile;
  int32_t tok[2] = {-1, -1};
  int valid = 0;
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const int i = lane + 32 * u;
    if (i >= tpt) break;
    const int32_t tl = x.local[u];
    int32_t slot = -1, limit = -1;
    // (the chunk table kept only entries with 0 <= tl < Lq: tl >= 0 marks a used lane)
    if (tl >= 0 && x.slot[u] >= 0 && int64_t(c.d.q_start) + tl < p.total_q) {
      tok[u] = c.d.q_start + tl;
      slot = x.slot[u];
      // Last visible key of the batch for this query (the causal diagonal), then in block
      // coordinates, clipped to the keys that exist in the block.
      const int32_t last = causal_last(p.causal, tl, c.d.diag, c.d.k_len);
      limit = max(-1, min(last - c.d.kb * kBlk, c.valid_keys - 1));
      ++valid;
    }
    meta.token[i] = tok[u];
    meta.slot[i] = slot;
    meta.limit[i] = limit;
  }
  const int n_valid = __reduce_add_sync(0xffffffffu, valid);
  if (lane == 0)
    sm90::mbar_expect_tx(&sh.q_full[consumer][stage],
                         uint32_t(n_valid) * uint32_t(p.group) * q_bytes_per_row<kFp8, kD / 64>());
  __syncwarp();
  const int32_t head_row = c.d.head * p.group;  // first query head of kv head h
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    if (tok[u] < 0) continue;
    const int i = lane + 32 * u;
    const int row_bytes = i * p.group * 128;  // G rows of 128 B per token in each half
    load_q_token<kFp8>(sh.q[consumer][stage], row_bytes, tm_q, &sh.q_full[consumer][stage],
                       head_row, tok[u]);
  }
  if (lane < tpt) sm90::mbar_arrive(&sh.q_full[consumer][stage]);
}

// The end marker after a K/V warp's last chunk: consumers stop at n_tiles < 0.
template <bool kFp8, class Storage, class KVRingT>
__device__ __forceinline__ void publish_end(const MainParams& p, Storage& sh, int32_t kv_iter,
                                            int lane) {
  const int s = KVRingT::stage(kv_iter);
  sm90::mbar_wait(&sh.kv_empty[s], KVRingT::empty_parity(kv_iter));
  if (lane == 0) {
    sh.info[s] = ChunkInfo{-1, 0, 0, 0};
    sm90::mbar_arrive(&sh.kv_full[s]);
  }
  if constexpr (kFp8) load_key_scales<kBlockN>(p, false, 0, 0, 0, nullptr, &sh.kv_full[s], lane);
}

// Three consumers (KVMajorTraits::kSplitV): warp 0 loads each chunk's K (two stages) and V (one),
// warp 1 + c the Q tiles of consumer c (tiles T with T % 3 == c, into its two buffers in turn).
template <bool kFp8, int kBlk, int kD>
__device__ __forceinline__ void run_producer_split(const MainParams& p, const CUtensorMap* tm_q,
                                                   const CUtensorMap* tm_k,
                                                   const CUtensorMap* tm_v,
                                                   KVMajorStorage<kBlk, kD>& sh, int warp,
                                                   int lane) {
  using KT = KVMajorTraits<kBlk, kD>;
  using KVRingT = sm90::Ring<KT::kKVSt>;
  using QRingT = sm90::Ring<KT::kQSt>;
  constexpr int kCons = KT::kCons;
  const int32_t n_chunks = *p.num_chunks;
  if (warp == 0) {  // run_producer_pairs' warp-0 steps, V on its own ring (load_kv_block); a
                    // helper shared with it moved the measured kernels' register allocation
    int32_t kv_iter = 0;
    for (int32_t chunk = next_busy_chunk(p, blockIdx.x, n_chunks, lane); chunk < n_chunks;
         chunk = next_busy_chunk(p, int64_t(chunk) + gridDim.x, n_chunks, lane)) {
      const ChunkView c = load_chunk<kBlk>(p, chunk);
      const int s = KVRingT::stage(kv_iter);
      sm90::mbar_wait(&sh.kv_empty[s], KVRingT::empty_parity(kv_iter));
      if (lane == 0) sh.info[s] = ChunkInfo{c.n_tiles, c.valid_keys, c.d.head, c.d.kb};
      load_kv_block<kFp8, kBlk, kD>(p, tm_k, tm_v, sh, s, c.d.head, c.d.k_start, c.d.kb,
                                    c.d.k_len, lane, sm90::Ring<1>::empty_parity(kv_iter));
      ++kv_iter;
    }
    publish_end<kFp8, typename KT::Storage, KVRingT>(p, sh, kv_iter, lane);
    return;
  }
  const int consumer = warp - 1;
  if (consumer >= kCons) return;
  uint32_t q_uses = 0;  // tiles this warp has produced into its consumer's buffers
  int rot = 0;          // tiles of this CTA's earlier chunks, mod kCons
  for (int32_t chunk = next_busy_chunk(p, blockIdx.x, n_chunks, lane); chunk < n_chunks;
       chunk = next_busy_chunk(p, int64_t(chunk) + gridDim.x, n_chunks, lane)) {
    const ChunkView c = load_chunk<kBlk>(p, chunk);
    int j = consumer - rot;  // tiles j of this chunk with (rot + j) % kCons == consumer
    if (j < 0) j += kCons;
    TileIdx next = j < c.n_tiles ? load_tile_idx(p, c, j, lane) : TileIdx{};
    for (; j < c.n_tiles; j += kCons) {
      const TileIdx cur = next;
      if (j + kCons < c.n_tiles) next = load_tile_idx(p, c, j + kCons, lane);
      const int stage = QRingT::stage(q_uses);
      sm90::mbar_wait(&sh.q_empty[consumer][stage], QRingT::empty_parity(q_uses));
      ++q_uses;
      produce_q_tile<kFp8, kBlk, kD>(p, tm_q, sh, c, cur, consumer, stage, lane);
    }
    rot = (rot + c.n_tiles) % kCons;
  }
}

// Two consumers: warp 0 loads each chunk's K/V (both on kv_full), and every warp gathers the Q
// tiles of its one (consumer, stage) buffer.
template <bool kFp8, int kBlk, int kD, bool kMerge = false>
__device__ __forceinline__ void run_producer_pairs(const MainParams& p, const CUtensorMap* tm_q,
                                                   const CUtensorMap* tm_k,
                                                   const CUtensorMap* tm_v,
                                                   KVMajorStorage<kBlk, kD>& sh, int warp,
                                                   int lane, int32_t* tile_head = nullptr) {
  using KT = KVMajorTraits<kBlk, kD>;
  using KVRingT = sm90::Ring<KT::kKVSt>;
  constexpr int kQWarps = KT::kQBufferWarps;  // warps past them (D = 256: 2 and 3) gather nothing
  if constexpr (kQWarps < kProducerWarps) {
    if (warp >= kQWarps) return;
  }
  const int consumer = warp & 1, stage = warp >> 1;  // this warp's Q buffer
  const int32_t n_chunks = *p.num_chunks;
  uint32_t q_uses = 0;  // tiles this warp has produced into its one buffer (a ring of one)
  int32_t kv_iter = 0;
  int64_t tile_base = 0;  // global tile counter T at the start of the chunk
  for (int32_t chunk = next_busy_chunk(p, blockIdx.x, n_chunks, lane); chunk < n_chunks;
       chunk = next_busy_chunk(p, int64_t(chunk) + gridDim.x, n_chunks, lane)) {
    const ChunkView c = load_chunk<kBlk>(p, chunk);  // n_tiles > 0: empty chunks are skipped
    if (warp == 0) {
      const int s = KVRingT::stage(kv_iter);
      sm90::mbar_wait(&sh.kv_empty[s], KVRingT::empty_parity(kv_iter));
      if (lane == 0) sh.info[s] = ChunkInfo{c.n_tiles, c.valid_keys, c.d.head, c.d.kb};
      load_kv_block<kFp8, kBlk, kD>(p, tm_k, tm_v, sh, s, c.d.head, c.d.k_start, c.d.kb,
                                    c.d.k_len, lane, 0u);
      ++kv_iter;
    }
    // Tiles j of this chunk with (tile_base + j) % kQWarps == warp; indices one tile ahead.
    int j = int((warp - tile_base) & (kQWarps - 1));
    TileIdx next = j < c.n_tiles ? load_tile_idx(p, c, j, lane) : TileIdx{};
    for (; j < c.n_tiles; j += kQWarps) {
      const TileIdx cur = next;
      if (j + kQWarps < c.n_tiles) next = load_tile_idx(p, c, j + kQWarps, lane);
      sm90::mbar_wait(&sh.q_empty[consumer][stage], sm90::Ring<1>::empty_parity(q_uses));
      ++q_uses;
      produce_q_tile<kFp8, kBlk, kD, kMerge>(p, tm_q, sh, c, cur, consumer, stage, lane,
                                             tile_head);
    }
    tile_base += c.n_tiles;
  }
  if (warp == 0) publish_end<kFp8, typename KT::Storage, KVRingT>(p, sh, kv_iter, lane);
}

template <bool kFp8, int kBlk, int kD>
__device__ __forceinline__ void run_producer(const MainParams& p, const CUtensorMap* tm_q,
                                             const CUtensorMap* tm_k, const CUtensorMap* tm_v,
                                             KVMajorStorage<kBlk, kD>& sh, int warp, int lane) {
  if constexpr (KVMajorTraits<kBlk, kD>::kSplitV)
    run_producer_split<kFp8, kBlk, kD>(p, tm_q, tm_k, tm_v, sh, warp, lane);
  else
    run_producer_pairs<kFp8, kBlk, kD>(p, tm_q, tm_k, tm_v, sh, warp, lane);
}

}  // namespace msa::cuda::sparse_fwd
