// Warp-level PTX wrappers for kernels whose tiles are too small for wgmma (decode's 16-row
// tiles): 16-byte cp.async with zero fill, ldmatrix, mma.sync m16n8k16 (bf16 / f16 in, f32
// accumulate), the float -> bf16x2 / f16x2 pack, all from sm_80 on, and sm_89's FP8
// e4m3x2 -> f16x2 conversion. Included by kernel bodies (sm90/decode/load.cuh, attend.cuh,
// epilogue.cuh); each wrapper is one instruction or a few bit operations. Shared-memory
// addresses come from sm90::smem_addr (device/sm90.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace msa::cuda::sm80 {

// 16-byte global -> shared copy through L2 only; src_bytes = 0 writes 16 zero bytes and reads
// nothing (how decode keeps slots without a key free of NaN garbage).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d += a * b for one m16n8k16 tile; T = __nv_bfloat16 or __half operands.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>,
                "mma_16816: operands must be bf16 or f16");
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats -> one packed pair (x in the low half), rounded to nearest even.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float x, float y) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(x, y);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

// Four e4m3 bytes to two f16x2, exactly (every e4m3 value is an f16; NaN stays NaN): bytes (0, 1)
// into p01 (byte 0 in the low half), bytes (2, 3) into p23. One F2FP.F16.E4M3.UNPACK_B per pair on
// sm_90a, reading either 16-bit half of the register, so no shift.
__device__ __forceinline__ void e4m3x4_pairs_01_23(uint32_t x, uint32_t& p01, uint32_t& p23) {
  asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %2;\ncvt.rn.f16x2.e4m3x2 %0, lo;\n"
      "cvt.rn.f16x2.e4m3x2 %1, hi;\n}"
      : "=r"(p01), "=r"(p23)
      : "r"(x));
}
// Four e4m3 bytes as two f16x2: bytes (0, 2) and (1, 3), with one byte permute for both.
__device__ __forceinline__ void e4m3x4_pairs_02_13(uint32_t x, uint32_t& p02, uint32_t& p13) {
  e4m3x4_pairs_01_23(__byte_perm(x, 0u, 0x3120), p02, p13);  // bytes 0, 2, 1, 3
}

// Two e4m3 bytes (byte 0 in the low half) as one f16x2, exactly (every e4m3 value is an f16).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint16_t x) {
  uint32_t h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(x));
  return h;
}
// The same as one bf16x2, exactly: every e4m3 value (at most 448, at least 2^-9 apart from 0)
// is a bf16.
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint16_t x) {
  const uint32_t h = e4m3x2_to_f16x2(x);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  return pack2<__nv_bfloat16>(f.x, f.y);
}

}  // namespace msa::cuda::sm80
