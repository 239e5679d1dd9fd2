// wgmma m64n128 with fp32 accumulators, the forms msa's Hopper kernels use: A and B from shared
// memory, both K-major (S = Q K^T: bf16 / f16 k16, e4m3 k32), and A from registers with an
// MN-major B (O += P V, bf16 / f16). One asm statement per form and type; the 64 accumulator
// operands are spelled once, in the macros below.
#pragma once

#include <cstdint>

// "{%0, ..., %63}": the accumulator fragment of one m64n128 wgmma (64 fp32 per thread).
#define MSA_WGMMA_D64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
// The matching read-write operand list for `float (&d)[64]`.
#define MSA_WGMMA_D64_OPERANDS \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

namespace msa::cuda::sm90 {

// D (+)= A B, A [64 x 16] and B [16 x 128] K-major in shared memory (descriptors).
#define MSA_WGMMA_SS(name, shape_types, transpose)                                               \
  __device__ __forceinline__ void name(float (&d)[64], uint64_t desc_a, uint64_t desc_b,        \
                                       uint32_t scale_d) {                                      \
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %66, 0;\n\t"                           \
                 "wgmma.mma_async.sync.aligned." shape_types " " MSA_WGMMA_D64 "%64, %65, p, 1, 1" \
                 transpose ";\n\t}"                                                            \
                 : MSA_WGMMA_D64_OPERANDS                                                       \
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d));                                     \
  }

// 16-bit forms take the two transpose immediates (0, 0: both K-major); 8-bit forms have none.
MSA_WGMMA_SS(wgmma_ss_bf16, "m64n128k16.f32.bf16.bf16", ", 0, 0")
MSA_WGMMA_SS(wgmma_ss_f16, "m64n128k16.f32.f16.f16", ", 0, 0")
MSA_WGMMA_SS(wgmma_ss_e4m3, "m64n128k32.f32.e4m3.e4m3", "")
#undef MSA_WGMMA_SS

// D (+)= A B, A [64 x 16] from registers (four 32-bit regs per thread), B [16 x 128] MN-major
// in shared memory.
#define MSA_WGMMA_RS_TB(name, types)                                                             \
  __device__ __forceinline__ void name(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b,  \
                                       uint32_t scale_d) {                                       \
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %69, 0;\n\t"                            \
                 "wgmma.mma_async.sync.aligned.m64n128k16." types " " MSA_WGMMA_D64               \
                 "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n\t}"                                   \
                 : MSA_WGMMA_D64_OPERANDS                                                        \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));        \
  }

MSA_WGMMA_RS_TB(wgmma_rs_tb_bf16, "f32.bf16.bf16")
MSA_WGMMA_RS_TB(wgmma_rs_tb_f16, "f32.f16.f16")
#undef MSA_WGMMA_RS_TB

// Dispatch on the element type (T is __nv_bfloat16 or __half).
template <bool kIsF16>
__device__ __forceinline__ void wgmma_ss(float (&d)[64], uint64_t da, uint64_t db, uint32_t sd) {
  if constexpr (kIsF16) wgmma_ss_f16(d, da, db, sd); else wgmma_ss_bf16(d, da, db, sd);
}
template <bool kIsF16>
__device__ __forceinline__ void wgmma_rs_tb(float (&d)[64], const uint32_t (&a)[4], uint64_t db,
                                            uint32_t sd) {
  if constexpr (kIsF16) wgmma_rs_tb_f16(d, a, db, sd); else wgmma_rs_tb_bf16(d, a, db, sd);
}

}  // namespace msa::cuda::sm90
