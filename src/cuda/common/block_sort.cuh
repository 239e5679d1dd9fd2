// Ascending bitonic sort of a power-of-two count of values in shared memory by the whole CTA:
// the q2k check's (id, slot) keys of a long row (index_checks.cu) and the token-sparse builders'
// unions (token_sparse.cuh, group_union.cu).
#pragma once

namespace msa::cuda {

// s[0, n) sorted ascending, n a power of two; each thread takes compare-exchange pairs (a, a +
// stride), a being i with a zero bit inserted at `stride`. Starts and ends synchronized.
template <typename T>
__device__ __forceinline__ void block_bitonic_sort(T* s, int n) {
  __syncthreads();
  for (int size = 2; size <= n; size <<= 1)
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = int(threadIdx.x); i < n / 2; i += int(blockDim.x)) {
        const int a = 2 * i - (i & (stride - 1)), b = a + stride;
        const T x = s[a], y = s[b];
        if ((x > y) == ((a & size) == 0)) {
          s[a] = y;
          s[b] = x;
        }
      }
      __syncthreads();
    }
}

}  // namespace msa::cuda
