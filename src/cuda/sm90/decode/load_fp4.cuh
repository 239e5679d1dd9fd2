// Producer side of the NVFP4 decode kernel (KV::nvfp4, traits.h). Per stage of kS key slots, each
// producer thread copies the packed rows of its own slot (8 warps: one slot per thread; 4 warps:
// half a slot), 64 bytes of e2m1 values and 8 e4m3 scales per K and V row, by cp.async into a
// ring of packed stages (Fp4Ring), kRawStages - 1 stages ahead. When its copies of a stage have
// landed (cp.async.wait_group: a thread's own copies are visible to it, so no barrier between
// copy and conversion), the same thread writes value * scale in f16 into the pipeline stage at the
// native layout (load.cuh tile_offset), which the consumers read as they read bf16 stages.
//
// value * scale is exact in f16: an e2m1 value has at most 2 significant bits and an e4m3 scale 4,
// so their product has at most 6 and lies in [2^-10, 2688] (or is 0, or NaN from a NaN scale).
// The per-tensor global scales apply in f32 to S and O (kernel.cuh k_mult / v_mult). Slots
// without a key (past the length, the union or the item; a bad page id, reported) are copied as
// zeros and keep key -1, as load.cuh does for the other kinds.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/sm90/decode/load.cuh"

namespace msa::cuda::decode {

// One packed stage: K values [kS][64], V values [kS][64], K scales [kS][8], V scales [kS][8], the
// logical key of every slot [kS] (int, -1: none). A value row's four 16-byte chunks are stored
// XOR-swizzled by (row / 2) % 4, so the 8 threads of a shared-memory phase, each reading the same
// chunk of its own row, hit 8 different 16-byte bank groups.
template <int kW>
struct Fp4Ring {
  static constexpr int kD = 128;                                     // NVFP4 KV: D = 128 only
  using Tr = Traits<KV::nvfp4, kW, kD>;
  static constexpr int kS = Tr::kStageKeys;                          // 128 or 64 slots
  static constexpr int kValBytes = kD / 2;                           // 64
  static constexpr int kSfBytes = kD / 16;                           // 8
  static constexpr int kThreadsPerRow = Tr::kProducerThreads / kS;   // 1 or 2
  static constexpr int kChunks = kValBytes / 16 / kThreadsPerRow;    // a thread's value chunks
  static constexpr int kSfPerThread = kSfBytes / kThreadsPerRow;     // its scale bytes: 8 or 4
  static constexpr uint32_t kVOff = uint32_t(kS) * kValBytes;
  static constexpr uint32_t kKSfOff = 2u * kS * kValBytes;
  static constexpr uint32_t kVSfOff = kKSfOff + uint32_t(kS) * kSfBytes;
  static constexpr uint32_t kKeyOff = kVSfOff + uint32_t(kS) * kSfBytes;
  static_assert(kKeyOff + kS * sizeof(int) == Tr::kRawStageBytes, "Fp4Ring: Traits::kRawStageBytes");
  static_assert(Tr::kProducerThreads % kS == 0 && (kThreadsPerRow == 1 || kThreadsPerRow == 2),
                "Fp4Ring: one or two producer threads per slot");
  static_assert(Tr::kRawStageBytes % 16 == 0, "Fp4Ring: 16-byte aligned packed stages");

  __device__ __forceinline__ static uint32_t chunk_offset(int row, int chunk) {
    return uint32_t(row * kValBytes + ((chunk ^ ((row >> 1) & 3)) << 4));
  }
};

// Copies this thread's share of slot rs (its row of the stage) into the packed stage at shared
// address `raw`; the caller commits the group.
template <int kW>
__device__ __forceinline__ void issue_fp4(const DecodeParams& p, const TileSource& src,
                                          RowSource rs, uint32_t raw) {
  using R = Fp4Ring<kW>;
  const int row = threadIdx.x / R::kThreadsPerRow, part = threadIdx.x % R::kThreadsPerRow;
  int j = rs.key;
  if (j >= 0 && (rs.page < 0 || rs.page >= p.num_pages)) {
    if (part == 0)
      report(p, Offence::page, uint64_t(src.b) * uint64_t(p.max_pages) + uint64_t(j >> p.page_shift),
             StatusCode::page_id_out_of_range);
    j = -1;
  }
  const int64_t page = j >= 0 ? rs.page : 0, slot = j >= 0 ? (j & (p.page_size - 1)) : 0;
  const auto* kv = static_cast<const uint8_t*>(p.k) + page * p.k_stride_page +
                   slot * p.k_stride_slot + src.h * p.k_stride_head;
  const auto* vv = static_cast<const uint8_t*>(p.v) + page * p.v_stride_page +
                   slot * p.v_stride_slot + src.h * p.v_stride_head;
  const uint8_t* ks = p.k_sf + page * p.k_sf_stride_page + slot * p.k_sf_stride_slot +
                      src.h * p.k_sf_stride_head + part * R::kSfPerThread;
  const uint8_t* vs = p.v_sf + page * p.v_sf_stride_page + slot * p.v_sf_stride_slot +
                      src.h * p.v_sf_stride_head + part * R::kSfPerThread;
  const uint32_t bytes = j >= 0 ? 16u : 0u;
#pragma unroll
  for (int c = 0; c < R::kChunks; ++c) {
    const int chunk = part * R::kChunks + c;
    const uint32_t off = R::chunk_offset(row, chunk);
    sm80::cp_async_16(raw + off, kv + 16 * chunk, bytes);
    sm80::cp_async_16(raw + R::kVOff + off, vv + 16 * chunk, bytes);
  }
  const uint32_t sf = uint32_t(row * R::kSfBytes + part * R::kSfPerThread);
  const uint32_t sf_bytes = j >= 0 ? uint32_t(R::kSfPerThread) : 0u;
  if constexpr (R::kSfPerThread == 8) {
    sm90::cp_async_8(raw + R::kKSfOff + sf, ks, sf_bytes);
    sm90::cp_async_8(raw + R::kVSfOff + sf, vs, sf_bytes);
  } else {
    sm90::cp_async_4(raw + R::kKSfOff + sf, ks, sf_bytes);
    sm90::cp_async_4(raw + R::kVSfOff + sf, vs, sf_bytes);
  }
  if (part == 0) sm90::st_shared_s32(raw + R::kKeyOff + uint32_t(row) * 4u, j);
}

// Eight packed e2m1 values (a 32-bit word, value 2i in the low nibble of byte i) times the f16x2
// `scale64` (the group's e4m3 scale times 2^6), as four f16x2 in value order. Each nibble becomes
// an e4m3 byte: sign to bit 7, its exponent and mantissa bits (e1 e0 m) to bits 4-2, which reads as
// the value times 2^-6 for every code (e2m1's subnormal 0.5 lands on e4m3's subnormal 2^-7); the
// exact e4m3 -> f16 conversion and one multiply by scale * 2^6 give value * scale.
__device__ __forceinline__ void e2m1x8_times(uint32_t w, uint32_t scale64, uint32_t (&out)[4]) {
  const uint32_t hi = w >> 4;
  const uint32_t a = __byte_perm(w, hi, 0x5140);  // low nibbles: values 0, 1, 2, 3
  const uint32_t b = __byte_perm(w, hi, 0x7362);  // values 4, 5, 6, 7
  const uint32_t ea = ((a << 4) & 0x80808080u) | ((a << 2) & 0x1c1c1c1cu);
  const uint32_t eb = ((b << 4) & 0x80808080u) | ((b << 2) & 0x1c1c1c1cu);
  sm80::e4m3x4_pairs_01_23(ea, out[0], out[1]);
  sm80::e4m3x4_pairs_01_23(eb, out[2], out[3]);
  const __half2 s = *reinterpret_cast<const __half2*>(&scale64);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __half2 x = __hmul2(*reinterpret_cast<const __half2*>(&out[i]), s);
    out[i] = *reinterpret_cast<const uint32_t*>(&x);
  }
}

// An e4m3 scale byte times 2^6 as f16x2 (both halves): exact, at most 448 * 64 = 28672.
__device__ __forceinline__ uint32_t scale64_of(uint32_t byte) {
  const uint32_t s = sm80::e4m3x2_to_f16x2(uint16_t(byte | (byte << 8)));
  const __half2 x = __hmul2(*reinterpret_cast<const __half2*>(&s), __float2half2_rn(64.f));
  return *reinterpret_cast<const uint32_t*>(&x);
}

// Converts this thread's share of one tensor (K or V) of a landed packed stage: its value chunks
// (32 values each, two scale groups) into the pipeline stage at `dst` (K or V region of kS rows,
// tile_offset's layout: f16 row chunk c holds head dims 8c .. 8c + 7).
template <int kW>
__device__ __forceinline__ void convert_fp4_rows(uint32_t raw_vals, uint32_t raw_sf, uint32_t dst) {
  using R = Fp4Ring<kW>;
  const int row = threadIdx.x / R::kThreadsPerRow, part = threadIdx.x % R::kThreadsPerRow;
  uint32_t sf[2];  // this thread's scale bytes, 4 per word
  if constexpr (R::kSfPerThread == 8) {
    const uint2 x = sm90::ld_shared_u32x2(raw_sf + uint32_t(row * R::kSfBytes));
    sf[0] = x.x;
    sf[1] = x.y;
  } else {
    sf[0] = sm90::ld_shared_u32(raw_sf + uint32_t(row * R::kSfBytes + part * 4));
    sf[1] = 0;
  }
#pragma unroll
  for (int c = 0; c < R::kChunks; ++c) {
    const int chunk = part * R::kChunks + c;  // 32 head dims from 32 * chunk
    const uint4 x = sm90::ld_shared_u32x4(raw_vals + R::chunk_offset(row, chunk));
    const uint32_t words[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int g = 0; g < 2; ++g) {  // scale group: 16 head dims, two words
      const int local = 2 * c + g;  // the thread's g-th scale byte
      const uint32_t s64 = scale64_of((sf[local >> 2] >> (8 * (local & 3))) & 0xffu);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t o[4];
        e2m1x8_times(words[2 * g + h], s64, o);
        // head dims 32 chunk + 16 g + 8 h: f16 chunk 4 chunk + 2 g + h of the row
        sm90::st_shared_u32x4(dst + tile_offset<R::Tr::kLines, R::kS>(row, 4 * chunk + 2 * g + h),
                              make_uint4(o[0], o[1], o[2], o[3]));
      }
    }
  }
}

}  // namespace msa::cuda::decode
