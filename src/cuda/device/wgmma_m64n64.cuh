// wgmma m64n64 with fp32 accumulators: bf16 / f16 k16 with A from registers and an MN-major B in
// shared memory (O (+)= P V of the head-dim-64 tiles), and both from shared memory, K-major (S =
// Q K^T of the 64-key tiles: head dim 256 and 64-key blocks; e4m3 k32 for FP8 Q K^T). Companion
// of wgmma_m64n128.cuh; the overloads below take a 32-float accumulator, so callers templated on
// the tile pick the instruction by the array they pass.
#pragma once

#include <cstdint>

// "{%0, ..., %31}": the accumulator fragment of one m64n64 wgmma (32 fp32 per thread).
#define MSA_WGMMA_D32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
#define MSA_WGMMA_D32_OPERANDS \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

namespace msa::cuda::sm90 {

// D (+)= A B, A [64 x 16] from registers (four 32-bit regs per thread), B [16 x 64] MN-major
// in shared memory.
#define MSA_WGMMA_RS_TB_N64(name, types)                                                         \
  __device__ __forceinline__ void name(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b,  \
                                       uint32_t scale_d) {                                       \
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %37, 0;\n\t"                            \
                 "wgmma.mma_async.sync.aligned.m64n64k16." types " " MSA_WGMMA_D32                \
                 "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n\t}"                                   \
                 : MSA_WGMMA_D32_OPERANDS                                                        \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));        \
  }

MSA_WGMMA_RS_TB_N64(wgmma_rs_tb_n64_bf16, "f32.bf16.bf16")
MSA_WGMMA_RS_TB_N64(wgmma_rs_tb_n64_f16, "f32.f16.f16")
#undef MSA_WGMMA_RS_TB_N64

// D (+)= A B, A [64 x 16] and B [16 x 64] K-major in shared memory (S = Q K^T of a 64-key tile).
#define MSA_WGMMA_SS_N64(name, types)                                                            \
  __device__ __forceinline__ void name(float (&d)[32], uint64_t desc_a, uint64_t desc_b,        \
                                       uint32_t scale_d) {                                      \
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %34, 0;\n\t"                           \
                 "wgmma.mma_async.sync.aligned.m64n64k16." types " " MSA_WGMMA_D32               \
                 "%32, %33, p, 1, 1, 0, 0;\n\t}"                                               \
                 : MSA_WGMMA_D32_OPERANDS                                                       \
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d));                                     \
  }

MSA_WGMMA_SS_N64(wgmma_ss_n64_bf16, "f32.bf16.bf16")
MSA_WGMMA_SS_N64(wgmma_ss_n64_f16, "f32.f16.f16")
#undef MSA_WGMMA_SS_N64

// D (+)= A B, e4m3 A [64 x 32] and B [32 x 64] K-major in shared memory (FP8 S = Q K^T of a 64-key
// tile); 8-bit forms take no transpose immediates. Overloads wgmma_m64n128.cuh's by the
// accumulator.
__device__ __forceinline__ void wgmma_ss_e4m3(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                              uint32_t scale_d) {
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %34, 0;\n\t"
               "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " MSA_WGMMA_D32
               "%32, %33, p, 1, 1;\n\t}"
               : MSA_WGMMA_D32_OPERANDS
               : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

template <bool kIsF16>
__device__ __forceinline__ void wgmma_ss(float (&d)[32], uint64_t da, uint64_t db, uint32_t sd) {
  if constexpr (kIsF16) wgmma_ss_n64_f16(d, da, db, sd); else wgmma_ss_n64_bf16(d, da, db, sd);
}

template <bool kIsF16>
__device__ __forceinline__ void wgmma_rs_tb(float (&d)[32], const uint32_t (&a)[4], uint64_t db,
                                            uint32_t sd) {
  if constexpr (kIsF16) wgmma_rs_tb_n64_f16(d, a, db, sd); else wgmma_rs_tb_n64_bf16(d, a, db, sd);
}

}  // namespace msa::cuda::sm90
