// top_k_from_candidates and thresholds_from_sample on CUDA: one block per row. Both find an r-th
// best value with a block-wide radix select (most significant byte first, a 256-bin histogram in
// shared memory a pass), so they are exact and deterministic for any store or sample size; the
// selected ids are then sorted ascending by a block bitonic sort, in shared memory when topk
// fits, else in place in the row of ids.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/codecs.h"
#include "common/sdsa.h"
#include "cuda/device/check.h"
#include "cuda/sm90/sdsa/launch_kernels.h"
#include "msa/sdsa.h"

namespace msa::cuda::sdsa_sm90 {
namespace {

constexpr int kRowThreads = 512;
constexpr int kSmemIds = 12288;  // ids sorted in shared memory up to this topk (48 KB)

struct SelectState {
  uint32_t hist[256];
  unsigned long long value;
  long long remaining;
  int n, eq;
};

// The r-th largest (1 <= r <= n) of n unsigned values of `bits` bits (a multiple of 8) that
// get(i) returns; also st.remaining = how many values equal to it are among the r largest.
// Every thread calls it; values are read once a pass.
template <typename Get>
__device__ unsigned long long radix_select(int64_t n, long long r, int bits, Get get, SelectState& st) {
  unsigned long long prefix = 0, mask = 0;
  long long remaining = r;
  for (int shift = bits - 8; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) st.hist[i] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const unsigned long long v = get(i);
      if ((v & mask) == prefix) atomicAdd(&st.hist[(v >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      long long above = 0;
      int digit = 255;
      for (; digit > 0; --digit) {
        if (above + st.hist[digit] >= remaining) break;
        above += st.hist[digit];
      }
      st.value = (unsigned long long)digit;
      st.remaining = remaining - above;
    }
    __syncthreads();
    prefix |= st.value << shift;
    mask |= 255ull << shift;
    remaining = st.remaining;
    __syncthreads();
  }
  if (threadIdx.x == 0) st.value = prefix;
  __syncthreads();
  return prefix;
}

// Sorts buf[0, n) ascending (signed), block-wide: a bitonic network over the next power of two
// whose first step of each merge compares mirrored pairs, so that the missing elements past n
// act as +infinity and every compare with one of them is skipped.
__device__ void block_sort(int32_t* buf, int n) {
  for (int k = 2; k / 2 < n; k <<= 1) {
    for (int j = k / 2; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int partner = j == k / 2 ? i ^ (k - 1) : i ^ j;
        if (partner > i && partner < n) {
          const int32_t a = buf[i], b = buf[partner];
          if (a > b) {
            buf[i] = b;
            buf[partner] = a;
          }
        }
      }
      __syncthreads();
    }
  }
}

// A candidate's place in the row order as one unsigned 64-bit value, larger = first: the score's
// rank key, then the lower position (signed, as the CPU compares them).
__device__ __forceinline__ unsigned long long candidate_order(const int32_t* cand, int64_t i) {
  const uint32_t key = sdsa::rank_key(codec::bits_float(uint32_t(cand[2 * i + 1])));
  const uint32_t pos = ~(uint32_t(cand[2 * i]) ^ 0x80000000u);
  return (static_cast<unsigned long long>(key) << 32) | pos;
}
// A tie's place, larger = first: the lower position.
__device__ __forceinline__ unsigned long long tie_order(const int32_t* ties, int64_t i) {
  return ~(uint32_t(ties[i]) ^ 0x80000000u);
}

// Appends to buf[st.n, ...) the ids (id(i)) of the `need` best of n entries by order(i) (larger
// first; all of them when n <= need): those ordered above the need-th best and as many equal to
// it as the need leaves (equal orders are equal (score, position) pairs, so which copies are kept
// does not change the ids). Every thread calls it; st.n counts the ids written.
template <typename Order, typename Id>
__device__ void collect_best(int64_t n, int64_t need, int bits, Order order, Id id, int32_t* buf,
                             SelectState& st) {
  const int base = st.n;
  if (n <= need) {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) buf[base + i] = id(i);
    __syncthreads();
    if (threadIdx.x == 0) st.n = base + int(n);
    __syncthreads();
    return;
  }
  const unsigned long long v = radix_select(n, need, bits, order, st);
  const long long eq_need = st.remaining;
  if (threadIdx.x == 0) st.eq = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const unsigned long long o = order(i);
    if (o > v || (o == v && atomicAdd(&st.eq, 1) < eq_need)) buf[atomicAdd(&st.n, 1)] = id(i);
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kRowThreads) top_k_kernel(TopKParams p) {
  extern __shared__ int32_t sbuf[];
  __shared__ SelectState st;
  const int64_t t = blockIdx.x;
  const int32_t c0 = p.counts[3 * t], c1 = p.counts[3 * t + 1], c2 = p.counts[3 * t + 2];
  const int64_t k = p.topk;
  CandidateStatus state = CandidateStatus::exact;  // the CPU's row_state, plus invalid counts
  if (c0 < 0 || c1 < 0 || c2 < 0) state = CandidateStatus::counts_invalid;
  else if (c0 > p.cap) state = CandidateStatus::candidates_overflow;
  else if (c0 < k && c1 > p.tie_cap) state = CandidateStatus::ties_overflow;
  else if (int64_t(c0) + c1 < k && c2 > 0) state = CandidateStatus::threshold_too_high;
  int32_t* out = p.ids + t * k;
  if (threadIdx.x == 0) p.row_status[t] = int32_t(state);
  if (state != CandidateStatus::exact && state != CandidateStatus::threshold_too_high) {
    for (int64_t i = threadIdx.x; i < k; i += blockDim.x) out[i] = -1;
    return;
  }
  int32_t* buf = k <= kSmemIds ? sbuf : out;
  const int32_t* cand = p.candidates + t * p.cap * 2;
  const int32_t* ties = p.ties + t * p.tie_cap;
  if (threadIdx.x == 0) st.n = 0;
  __syncthreads();
  // The best min(topk, c0) candidates, then the lowest tie positions (every candidate ranks
  // above every tie).
  const int64_t take = c0 < k ? c0 : k;
  collect_best(c0, take, 64, [cand](int64_t i) { return candidate_order(cand, i); },
               [cand](int64_t i) { return cand[2 * i]; }, buf, st);
  if (take < k)
    collect_best(c1, k - take, 32, [ties](int64_t i) { return tie_order(ties, i); },
                 [ties](int64_t i) { return ties[i]; }, buf, st);
  const int n = st.n;
  block_sort(buf, n);
  for (int64_t i = threadIdx.x; i < k; i += blockDim.x)
    if (buf != out || i >= n) out[i] = i < n ? buf[i] : -1;
}

__global__ void __launch_bounds__(kRowThreads) thresholds_kernel(ThresholdParams p) {
  __shared__ SelectState st;
  const int64_t t = blockIdx.x;
  const float* row = p.scores + t * p.s0;
  if (threadIdx.x == 0) st.n = 0;
  __syncthreads();
  int mine = 0;  // scores that are not -inf (rank key 0 marks no sample)
  for (int64_t i = threadIdx.x; i < p.width; i += blockDim.x) mine += sdsa::rank_key(row[i]) != 0;
  atomicAdd(&st.n, mine);
  __syncthreads();
  uint32_t bar = 0;  // fewer samples than the rank: -inf, every key a candidate
  if (st.n >= p.rank) {
    const auto get = [row](int64_t i) { return (unsigned long long)sdsa::rank_key(row[i]); };
    bar = uint32_t(radix_select(p.width, p.rank, 32, get, st));
  }
  if (threadIdx.x == 0) {
    p.thresholds[t] = sdsa::rank_value(bar);
    p.counts[3 * t] = p.counts[3 * t + 1] = p.counts[3 * t + 2] = 0;
  }
}

}  // namespace

void launch_top_k(const TopKParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  const size_t smem = p.topk <= kSmemIds ? size_t(p.topk) * sizeof(int32_t) : 0;
  top_k_kernel<<<unsigned(p.rows), kRowThreads, smem, stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

void launch_thresholds(const ThresholdParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  thresholds_kernel<<<unsigned(p.rows), kRowThreads, 0, stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda::sdsa_sm90
