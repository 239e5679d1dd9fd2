// wgmma m64n8 with fp32 accumulators: tf32 k8 with A from registers and a K-major B in shared
// memory without swizzle (the MQA logits' head sum, mqa_logits/kernel.cuh: relu(S^T) times the
// weight tile).
#pragma once

#include <cstdint>

#include "cuda/device/sm90.cuh"

namespace msa::cuda::sm90 {

// Descriptor of a K-major tile without swizzle (layout type 0) at shared byte address `addr`:
// 8-row x 16-byte core matrices, `k_stride` bytes apart along K. With N = 8 there is one group of
// 8 rows, so the stride between row groups is never used: both offset fields take k_stride, which
// reads the same whichever of them the hardware takes for K.
__device__ __forceinline__ uint64_t wgmma_desc_plain(uint32_t addr, uint32_t k_stride) {
  return wgmma_desc(addr, k_stride, k_stride, 0);
}

// D (+)= A B, tf32 A [64 x 8] from registers (per warp as mma.sync m16n8k8's: lane 4 g + t holds
// rows g and g + 8 at k = t and t + 4, in the order (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4))
// and B [8 x 8] K-major in shared memory. The tensor cores read the f32 bits' top 19.
__device__ __forceinline__ void wgmma_rs_tf32_n8(float (&d)[4], const uint32_t (&a)[4],
                                                 uint64_t desc_b, uint32_t scale_d) {
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %9, 0;\n\t"
               "wgmma.mma_async.sync.aligned.m64n8k8.f32.tf32.tf32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, %8, p, 1, 1;\n\t}"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

}  // namespace msa::cuda::sm90
