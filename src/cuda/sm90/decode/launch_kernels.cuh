// Launchers of the decode kernels for one (q type, KV kind): the main kernel over items x Hkv
// CTAs, which also combines split requests and finalizes the status; with no items, a one-thread
// status kernel instead.
// Included by instantiate_native.cu and instantiate_fp8.cu; declared in launch_kernels.h.
#pragma once

#include <algorithm>
#ifdef MSA_DECODE_TRACE
#include <cstdio>
#include <cstdlib>
#include <vector>
#endif

#include "cuda/sm90/decode/kernel.cuh"
#include "cuda/sm90/decode/launch_kernels.h"
#include "cuda/device/check.h"

namespace msa::cuda::decode {

// The largest plan's need, so a later plan never lowers the limit under an earlier one's.
template <typename TQ, bool kFp8, int kW, bool kSlotScales>
void set_smem_limit_of() {
  static_assert(smem_bytes<kFp8, kW>(kMaxBitmapWords) <= 227 * 1024,
                "decode: shared memory of the largest sparse plan exceeds 227 KB");
  MSA_CUDA_CHECK(cudaFuncSetAttribute(decode_kernel<TQ, kFp8, kW, kSlotScales>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      int(smem_bytes<kFp8, kW>(kMaxBitmapWords))));
}

template <typename TQ, bool kFp8>
void set_smem_limit() {
  set_smem_limit_of<TQ, kFp8, 4, false>();
  set_smem_limit_of<TQ, kFp8, 8, false>();
  if constexpr (kFp8) {
    set_smem_limit_of<TQ, kFp8, 4, true>();
    set_smem_limit_of<TQ, kFp8, 8, true>();
  }
}

// The main kernel of one CTA width, with or without per-slot FP8 scales (FP8 only).
template <typename TQ, bool kFp8, int kW>
void launch_main(const DecodeParams& p, const CUtensorMap& tm_k, const CUtensorMap& tm_v,
                 unsigned grid, cudaStream_t stream) {
  const size_t smem = smem_bytes<kFp8, kW>(p.bitmap_words);
  if constexpr (kFp8) {
    if (p.slot_scales) {
      decode_kernel<TQ, kFp8, kW, true>
          <<<grid, Traits<kFp8, kW>::kThreads, smem, stream>>>(p, tm_k, tm_v);
      return;
    }
  }
  decode_kernel<TQ, kFp8, kW, false><<<grid, Traits<kFp8, kW>::kThreads, smem, stream>>>(p, tm_k, tm_v);
}

#ifdef MSA_DECODE_TRACE
// The trace build's report of one launch (trace.cuh): per phase, the spread over the CTAs of the
// time from each CTA's entry (us); CTAs that never reached a phase are left out of it. Internal
// linkage: each instantiation TU reads its own table (an inline function would be merged across
// the two TUs, and the FP8 launches would print the bf16 kernels' table).
static void print_trace(unsigned grid, int warps, cudaStream_t stream) {
  MSA_CUDA_CHECK(cudaStreamSynchronize(stream));
  const int n = int(std::min<unsigned>(grid, kTraceCtas));
  std::vector<unsigned long long> t(size_t(n) * kTracePoints);
  MSA_CUDA_CHECK(cudaMemcpyFromSymbol(t.data(), decode_trace, t.size() * sizeof(t[0])));
  const char* names[kTracePoints] = {"entry", "request", "union", "first issue", "first landed",
                                     "loop end", "merged"};
  unsigned long long first = ~0ull, last = 0;
  for (int i = 0; i < n; ++i) {
    first = std::min(first, t[size_t(i) * kTracePoints]);
    last = std::max(last, t[size_t(i) * kTracePoints + kTraceMerged]);
  }
  std::printf("decode trace: %u CTAs of %d consumer warps (%d traced), first entry to last merge "
              "%.2f us\n",
              grid, warps, n, last > first ? double(last - first) * 1e-3 : 0.0);
  for (int k = 0; k < kTracePoints; ++k) {
    std::vector<double> v;
    for (int i = 0; i < n; ++i) {
      const unsigned long long e = t[size_t(i) * kTracePoints];
      const unsigned long long at = t[size_t(i) * kTracePoints + k];
      if (at >= e && e != 0) v.push_back(double(at - (k == kTraceEntry ? first : e)) * 1e-3);
    }
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    std::printf("  %-13s %s min %8.2f p10 %8.2f p50 %8.2f p90 %8.2f max %8.2f us\n", names[k],
                k == kTraceEntry ? "(from the first)" : "(from entry)    ", v.front(),
                v[v.size() / 10], v[v.size() / 2], v[v.size() * 9 / 10], v.back());
  }
}
#endif

template <typename TQ, bool kFp8>
void launch(const DecodeParams& p, const CUtensorMap& tm_k, const CUtensorMap& tm_v,
            cudaStream_t stream) {
  const unsigned grid = unsigned(p.num_items * p.num_kv_heads);
#ifdef MSA_DECODE_TRACE
  const bool trace = grid > 0 && std::getenv("MSA_DECODE_TRACE") != nullptr;
  if (trace) {
    void* table = nullptr;
    MSA_CUDA_CHECK(cudaGetSymbolAddress(&table, decode_trace));
    MSA_CUDA_CHECK(cudaMemsetAsync(table, 0, sizeof(decode_trace), stream));
  }
#endif
  if (grid == 0)
    status_kernel<TQ><<<1, 32, 0, stream>>>(p);
  else if (p.warps == 4)
    launch_main<TQ, kFp8, 4>(p, tm_k, tm_v, grid, stream);
  else
    launch_main<TQ, kFp8, 8>(p, tm_k, tm_v, grid, stream);
  MSA_CUDA_CHECK_LAUNCH();
#ifdef MSA_DECODE_TRACE
  if (trace) print_trace(grid, p.warps, stream);
#endif
}

}  // namespace msa::cuda::decode
