// Device-side checks of the decode kernels (docs/semantics.md, Errors): a request's cu_seqlens_q
// entries and lengths against the plan, q2k ids and page ids. Offences are folded into one 64-bit
// key with atomicMin, so the reported offence is the first in a fixed order whatever the CTA
// timing; finalize_status (the grid's last CTA, or status_kernel) turns the key into the status
// buffer and re-arms it.
#pragma once

#include <climits>
#include <cstdint>

#include "cuda/device/sm90.cuh"
#include "cuda/device/status.cuh"
#include "cuda/sm90/decode/params.h"
#include "msa/common.h"

namespace msa::cuda::decode {

// Offence classes, earliest first: a request's queries (cu_seqlens_q), its keys (seqused_k),
// then q2k ids by (head, token, slot), then page ids by (batch, column).
enum class Offence : uint64_t { queries = 0, keys = 1, q2k = 2, page = 3 };

constexpr unsigned long long kNoOffence = ~0ull;

__device__ __forceinline__ void report(const DecodeParams& p, Offence cls, uint64_t index,
                                       StatusCode code) {
  const uint64_t key = (uint64_t(cls) << 60) | ((index & ((1ull << 56) - 1)) << 4) | uint64_t(code);
  atomicMin(p.offence, static_cast<unsigned long long>(key));
  // Visible device-wide before this thread's next step, so any barrier it passes later orders the
  // report before its CTA's arrival (count_cta_done). Reports are rare; in exchange no thread
  // fences at exit (producers_arrive).
  __threadfence();
}

// A request as the kernels see it: checked lengths, never used to read out of bounds.
struct Request {
  int64_t q_begin = 0;  // first token of the request
  int lq = 0;           // queries, at most max_queries
  int lk = 0;           // keys, in [0, key_cap[b]]
  bool ok = false;      // cu_seqlens_q entries of b are sane
};

// `report_offences`: one thread per CTA reports (all compute the same request).
__device__ __forceinline__ Request load_request(const DecodeParams& p, int b, bool report_offences) {
  Request r;
  const int32_t c0 = p.cu_seqlens_q[b], c1 = p.cu_seqlens_q[b + 1];
  const bool bad = c0 < 0 || c1 < c0 || c1 > p.total_q || (b == 0 && c0 != 0) ||
                   (b == p.batch - 1 && c1 != p.total_q);
  if (bad) {
    if (report_offences) report(p, Offence::queries, uint64_t(b), StatusCode::bad_cu_seqlens);
    return r;
  }
  r.ok = true;
  r.q_begin = c0;
  r.lq = c1 - c0;
  if (r.lq > p.max_queries) {
    if (report_offences) report(p, Offence::queries, uint64_t(b), StatusCode::queries_past_plan);
    r.lq = p.max_queries;
  }
  const int64_t all = int64_t(p.max_pages) * p.page_size;
  int64_t lk = p.seqused_k ? int64_t(p.seqused_k[b]) : (all < INT_MAX ? all : INT_MAX);
  if (lk < 0) {
    if (report_offences) report(p, Offence::keys, uint64_t(b), StatusCode::bad_cu_seqlens);
    lk = 0;
  }
  const int32_t cap = p.key_cap[b];
  if (lk > cap) {  // longer than the plan covered: report, never drop keys silently
    if (report_offences) report(p, Offence::keys, uint64_t(b), StatusCode::kv_length_past_plan);
    lk = cap;
  }
  r.lk = int(lk);
  return r;
}

// Writes the first offence into the status buffer (unless it already holds one) and re-arms the
// key for the next run. One thread, once every main-kernel CTA has arrived (arrive_and_finalize),
// or status_kernel when there is no main kernel.
__device__ __forceinline__ void finalize_status(const DecodeParams& p) {
  unsigned long long key = *p.offence;
  if (key == kNoOffence && p.batch == 0 && (p.cu_seqlens_q[0] != 0 || p.total_q != 0))
    key = (uint64_t(Offence::queries) << 60) | uint64_t(StatusCode::bad_cu_seqlens);
  if (key == kNoOffence) return;
  *p.offence = kNoOffence;
  const auto cls = Offence(key >> 60);
  const int64_t index = int64_t((key >> 4) & ((1ull << 56) - 1));
  const int32_t code = int32_t(key & 0xf);
  int32_t s[4] = {code, 0, 0, 0};
  switch (cls) {
    case Offence::queries:  // bad_cu_seqlens {which = 0, batch} or {batch, queries, planned}
      if (code == int32_t(StatusCode::bad_cu_seqlens)) {
        s[1] = 0;
        s[2] = int32_t(index);
      } else {
        s[1] = int32_t(index);
        s[2] = p.cu_seqlens_q[index + 1] - p.cu_seqlens_q[index];
        s[3] = p.max_queries;
      }
      break;
    case Offence::keys:  // bad_cu_seqlens {which = 1, batch} or {batch, keys, planned}
      if (code == int32_t(StatusCode::bad_cu_seqlens)) {
        s[1] = 1;
        s[2] = int32_t(index);
      } else {
        s[1] = int32_t(index);
        const int64_t all = int64_t(p.max_pages) * p.page_size;
        s[2] = p.seqused_k ? p.seqused_k[index] : int32_t(all < INT_MAX ? all : INT_MAX);
        s[3] = p.key_cap[index];
      }
      break;
    case Offence::q2k: {  // index = (h * total_q + t) * topk + slot
      const int64_t row = index / p.topk;
      s[1] = int32_t(row / p.total_q);
      s[2] = int32_t(row % p.total_q);
      s[3] = int32_t(index % p.topk);
      break;
    }
    case Offence::page: {  // index = b * max_pages + column
      const int64_t b = index / p.max_pages, col = index % p.max_pages;
      s[1] = int32_t(b);
      s[2] = int32_t(col);
      s[3] = p.page_table[b * p.page_table_stride + col];
      break;
    }
  }
  flag_status(p.status, s[0], s[1], s[2], s[3]);
}

// One thread per main-kernel CTA, once the CTA is done: the last CTA of the grid to arrive
// finalizes the status and re-arms the counter (threadfence-reduction pattern), which saves run()
// a second launch.
__device__ __forceinline__ void count_cta_done(const DecodeParams& p) {
  if (atomicAdd(p.done, 1u) == gridDim.x - 1) {
    __threadfence();
    finalize_status(p);
    *p.done = 0;
  }
}
// Every thread of a main-kernel CTA, at its exit (before the role split).
__device__ __forceinline__ void arrive_and_finalize(const DecodeParams& p) {
  __syncthreads();  // every report of the CTA (fenced in report) precedes its arrival
  if (threadIdx.x == 0) count_cta_done(p);
}
// After the role split (kernel.cuh): the producer warpgroup, once it issued its last copy, meets
// at named barrier `bar` and thread 0 counts the CTA. The consumers report nothing after the
// union build (a CTA-wide barrier before the split), so they leave without a fence or barrier:
// their output stores need not be acknowledged before the CTA frees its slot.
__device__ __forceinline__ void producers_arrive(const DecodeParams& p, uint32_t bar,
                                                 uint32_t producers) {
  sm90::named_sync(bar, producers);
  if (threadIdx.x == 0) count_cta_done(p);
}

}  // namespace msa::cuda::decode
