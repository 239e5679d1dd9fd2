// Split-KV combine of the decode, inside the main kernel: every split CTA of a (request, query
// chunk) writes its f32 partial, and the last of them to finish (a per-(job, kv head) counter,
// the threadfence-reduction pattern) merges all of them in split order, exactly in fp32 and
// without atomics on the data, into out / lse. run() thus launches one kernel (measured at the
// two-kernel version's time). Without a main kernel (no items),
// status_kernel finalizes the status instead. Included by kernel.cuh and launch_kernels.cuh.
#pragma once

#include "cuda/sm90/decode/epilogue.cuh"
#include "cuda/device/sm90.cuh"

namespace msa::cuda::decode {

// Merges the job's num_splits partials of the `rows` rows of kv head h (queries from token t0;
// row r is row hbase + r of query_of, as in load_q) into out / lse. kThreads threads, this one
// number tid of them; the partials were written by other CTAs of this grid, so they are read
// through L2 (ld.global.cg), never from a stale L1 line.
template <typename TQ, int kD, int kThreads>
__device__ __forceinline__ void combine_job(const DecodeParams& p, const CombineJob& job, int h,
                                            int rows, int hbase, int64_t t0, int tid) {
  constexpr int kQuads = kD / 4, kQuadShift = kD == 64 ? 4 : kD == 128 ? 5 : 6;  // 4-dim slots
  const int64_t split_stride = int64_t(p.num_kv_heads) * p.rows_max;  // rows between splits
  const int64_t first = (int64_t(job.first_partial) * p.num_kv_heads + h) * p.rows_max;
  for (int idx = tid; idx < rows * kQuads; idx += kThreads) {
    const int r = idx >> kQuadShift, d = (idx & (kQuads - 1)) * 4;
    float m = -INFINITY;
    for (int s = 0; s < job.num_splits; ++s)
      m = fmaxf(m, __ldcg(p.part_lse + first + s * split_stride + r));
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    float l = 0.f;
    if (m != -INFINITY) {
      for (int s = 0; s < job.num_splits; ++s) {
        const int64_t row = first + s * split_stride + r;
        const float wgt = exp2f(__ldcg(p.part_lse + row) - m);  // 0 for a split without keys
        const float4 o = __ldcg(reinterpret_cast<const float4*>(p.part_o + row * kD + d));
        l += wgt;
        acc.x += wgt * o.x;
        acc.y += wgt * o.y;
        acc.z += wgt * o.z;
        acc.w += wgt * o.w;
      }
    }
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int qi = query_of(p, hbase + r);
    const int64_t t = t0 + qi;
    const int hq = h * p.group + (hbase + r - qi * p.group);
    write_out4<TQ>(p, t, hq, d, make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv));
    if (d == 0 && p.lse) p.lse[int64_t(hq) * p.total_q + t] = l > 0.f ? (m + log2f(l)) * kLn2 : -INFINITY;
  }
}

// After a split CTA's kThreads consumer threads (this one tid; named barrier `bar`) wrote its
// partial: counts it, and the job's last split merges the job and re-arms the counter for the
// next run. Every split of a job sees the same request, so either all of them arrive or (a
// request that fails its checks) none does. `flag`: a shared int for the broadcast.
template <typename TQ, int kD, int kThreads>
__device__ __forceinline__ void finish_split(const DecodeParams& p, int job_index, int h, int rows,
                                             int hbase, int64_t t0, int tid, uint32_t bar,
                                             int* flag) {
  __threadfence();  // this CTA's partial is visible device-wide before it is counted
  sm90::named_sync(bar, kThreads);
  if (tid == 0) {
    unsigned int* count = p.job_done + int64_t(job_index) * p.num_kv_heads + h;
    const bool last = atomicAdd(count, 1u) == unsigned(p.jobs[job_index].num_splits) - 1;
    if (last) *count = 0;
    *flag = last;
  }
  sm90::named_sync(bar, kThreads);
  if (!*flag) return;
  __threadfence();  // the other splits' partials, counted before ours, are read after this
  combine_job<TQ, kD, kThreads>(p, p.jobs[job_index], h, rows, hbase, t0, tid);
}

// No main-kernel CTA ran (no items): one thread writes the status a main kernel would have.
template <typename TQ>  // one per instantiation TU (TQ unused)
__global__ void status_kernel(const __grid_constant__ DecodeParams p) {
  if (threadIdx.x == 0) finalize_status(p);
}

}  // namespace msa::cuda::decode
