// Split-KV combine of the decode (the third small kernel, after the plan and the main kernel):
// one CTA per (combine job, kv head) merges a (request, query chunk)'s partials in split order,
// exactly in fp32 and without atomics, into out / lse. Without a main kernel (no items), block 0
// finalizes the status instead. Its own small kernel rather than common/combine: decode
// partials are per split of a union, not per selected block. Included by launch.cu only.
#pragma once

#include "cuda/decode/epilogue.cuh"

namespace msa::cuda::decode {

constexpr int kCombineThreads = 256;

template <typename TQ>
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(const __grid_constant__ DecodeParams p) {
  if (p.num_items == 0 && blockIdx.x == 0 && threadIdx.x == 0) finalize_status(p);
  const int hkv = p.num_kv_heads;
  const int64_t job_index = blockIdx.x / hkv;
  const int h = int(blockIdx.x % hkv);
  if (job_index >= p.num_jobs) return;
  const CombineJob job = p.jobs[job_index];
  const Request rq = load_request(p, job.batch, false);
  if (!rq.ok) return;
  const int q0 = job.chunk * p.queries_per_chunk;
  const int nq = min(p.queries_per_chunk, rq.lq - q0);
  if (nq <= 0) return;
  const int rows = nq << p.group_shift;
  const int64_t t0 = rq.q_begin + q0;
  const int64_t split_stride = int64_t(hkv) * p.rows_max;  // rows between consecutive splits
  const int64_t first = (int64_t(job.first_partial) * hkv + h) * p.rows_max;
  for (int idx = threadIdx.x; idx < rows * 32; idx += kCombineThreads) {
    const int r = idx >> 5, d = (idx & 31) * 4;
    float m = -INFINITY;
    for (int s = 0; s < job.num_splits; ++s) m = fmaxf(m, p.part_lse[first + s * split_stride + r]);
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    float l = 0.f;
    if (m != -INFINITY) {
      for (int s = 0; s < job.num_splits; ++s) {
        const int64_t row = first + s * split_stride + r;
        const float wgt = exp2f(p.part_lse[row] - m);  // 0 for a split without keys
        const float4 o = *reinterpret_cast<const float4*>(p.part_o + row * kHeadDim + d);
        l += wgt;
        acc.x += wgt * o.x;
        acc.y += wgt * o.y;
        acc.z += wgt * o.z;
        acc.w += wgt * o.w;
      }
    }
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int64_t t = t0 + (r >> p.group_shift);
    const int hq = h * p.group + (r & (p.group - 1));
    write_out4<TQ>(p, t, hq, d, make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv));
    if (d == 0 && p.lse) p.lse[int64_t(hq) * p.total_q + t] = l > 0.f ? (m + log2f(l)) * kLn2 : -INFINITY;
  }
}

}  // namespace msa::cuda::decode
