// Warp-level PTX wrappers of the decode kernel: cp.async with zero fill, ldmatrix, mma.sync
// m16n8k16 (bf16 / f16 in, f32 accumulate) and the FP8 e4m3 -> f16 bit conversion.
// Included by load.cuh and attend.cuh; each wrapper is one instruction or a few bit operations.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace msa::cuda::decode {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy through L2 only; src_bytes = 0 writes 16 zero bytes and reads
// nothing (how slots without a key are kept free of NaN garbage).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
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

// Two e4m3 bytes, placed as the high bytes of the two 16-bit halves of z ([0, b0, 0, b1]), to
// f16x2 holding exactly value / 256: the sign stays in bit 15 and the 7 exponent-mantissa bits
// move to bits 13..7, so the e4m3 exponent (bias 7) reads as an f16 exponent (bias 15): a factor
// 2^-8 for normals and subnormals alike. The 256 is folded into the K and V scales. The NaN
// codes 0x7f / 0xff read as +-480 / 256 (slots without a key are zero-filled, never converted).
__device__ __forceinline__ uint32_t e4m3x2_hi_bytes_to_f16x2(uint32_t z) {
  return (z & 0x80008000u) | ((z >> 1) & 0x3f803f80u);
}
// Bytes i and j of x (i in the low half) as f16x2 value / 256.
template <int kSelector>
__device__ __forceinline__ uint32_t e4m3_pair(uint32_t x) {
  return e4m3x2_hi_bytes_to_f16x2(__byte_perm(x, 0u, kSelector));
}
constexpr int kBytes01 = 0x1404;  // [0, b0, 0, b1]
constexpr int kBytes23 = 0x3424;  // [0, b2, 0, b3]
constexpr int kBytes02 = 0x2404;  // [0, b0, 0, b2]
constexpr int kBytes13 = 0x3414;  // [0, b1, 0, b3]

}  // namespace msa::cuda::decode
