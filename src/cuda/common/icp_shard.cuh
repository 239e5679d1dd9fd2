// The ICP shard map (msa/icp.h): which keys of an unsharded page pool one rank holds, in the
// order its shard stores them. Shared by the indexer kernel's shard mode (sm90/block_scores) and
// the ICP list kernel (common/icp.cu).
#pragma once

#include <bit>
#include <cstdint>

namespace msa::cuda {

// Rank `rank`'s shard of a pool of pages of rows * world keys split over `world` ranks (p128:
// page row j on rank j % world at shard row j / world; else contiguous parts of `rows`), a page
// pool of `rows`-slot pages under the unsharded pool's table. Sizes as shifts: the indexer kernel
// compiles this in every instantiation, where a 64-bit division is a call that costs its
// fused kernels a stack frame (40 bytes more, measured). world_shift = 0: not a shard.
struct ShardMap {
  int32_t world_shift;  // log2 world: 1 or 2
  int32_t rank;
  int32_t rows_shift;   // log2 rows: 5, 6 or 7
  int32_t p128;
};

// The map of a validated (world 2 or 4, rows a power of two) rank.
inline ShardMap make_shard_map(int world, int rank, int rows, bool p128) {
  return ShardMap{world == 4 ? 2 : 1, rank, std::countr_zero(unsigned(rows)), p128 ? 1 : 0};
}

// Shard keys among the global keys [0, end): a prefix of the shard, since the map keeps order
// (end itself without a shard, or for end <= 0).
__host__ __device__ __forceinline__ int64_t shard_keys(const ShardMap& m, int64_t end) {
  if (m.world_shift == 0 || end <= 0) return end;
  if (m.p128) return end <= m.rank ? 0 : (end - m.rank + (1 << m.world_shift) - 1) >> m.world_shift;
  const int page_shift = m.rows_shift + m.world_shift, rows = 1 << m.rows_shift;
  int64_t part = (end & ((int64_t(1) << page_shift) - 1)) - (int64_t(m.rank) << m.rows_shift);
  part = part < 0 ? 0 : (part > rows ? rows : part);
  return ((end >> page_shift) << m.rows_shift) + part;
}

// The logical 128-key block of shard page `i` (the table's column i): every supported layout's
// shard page lies in one block (p128: block i; p256: block 2 i + rank * rows / 128), and back.
__host__ __device__ __forceinline__ int64_t shard_page_block(const ShardMap& m, int64_t i) {
  return m.p128 ? i : 2 * i + ((int64_t(m.rank) << m.rows_shift) >> 7);
}
__host__ __device__ __forceinline__ int64_t block_shard_page(const ShardMap& m, int64_t kb) {
  return m.p128 ? kb : (kb - ((int64_t(m.rank) << m.rows_shift) >> 7)) >> 1;
}

}  // namespace msa::cuda
