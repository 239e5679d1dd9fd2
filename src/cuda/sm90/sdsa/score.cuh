// The SDSA score on the GPU, one device function for indexer_scores and the threshold select, so
// the select ranks exactly what a sort of indexer_scores' rows ranks.
//
// Bitwise equal to the CPU reference (src/cpu/sdsa.cpp, IndexReader::score), which decodes the
// query and the key to doubles, then accumulates dot += q[d] * k[d] for d = 0, 1, ..., D-1 in
// fp64 and rounds the sum once to f32. The GPU performs the same IEEE operations in the same
// order: every decoded value is exact in fp64 (a bf16 / f16 value; an NVFP4 value is an e2m1 code
// (2 significant bits) times the e4m3 scale (4 bits) times the f32 global scale (24 bits), the
// two products exact in 53 bits and far from fp64's range limits), each product is rounded with
// __dmul_rn and each sum with __dadd_rn (no FMA contraction: the CPU build rounds the product
// and the sum separately, see src/cpu/CMakeLists.txt), and the final rounding is
// __double2float_rn. Same operands, same operations, same order, round-to-nearest-even on both:
// the same bits, infinities included; a NaN sum becomes the one quiet NaN 0x7fc00000 on both (the
// NaN an invalid operation makes differs between x86 and CUDA). Summing in another order would
// need every partial sum to be exact, which fp64 does not give for general bf16 inputs (their
// products span ~2^-266..2^256), so the order is kept.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/codecs.h"
#include "common/sdsa.h"
#include "cuda/device/status.cuh"
#include "cuda/sm90/sdsa/params.h"

namespace msa::cuda::sdsa_sm90 {

constexpr int kThreads = 128;      // threads of a scoring block
constexpr int kKeysPerThread = 2;  // independent dot products a thread interleaves

// The request and the key count of query row t; a value out of range is flagged (when `report`)
// and gives an empty row, so nothing is read through it.
struct RowInfo {
  int32_t request;  // -1 when row_requests[t] is out of range
  int64_t len;
};

__device__ __forceinline__ RowInfo resolve_row(const RowsView& r, const CacheView& c, int64_t t,
                                               int32_t* status, bool report) {
  const int32_t b = r.row_requests[t];
  if (b < 0 || b >= c.batch) {
    if (report) flag_status(status, int32_t(StatusCode::row_request_invalid), t, b, c.batch);
    return {-1, 0};
  }
  const int32_t seq = c.seq_lens[b];
  const int64_t table = int64_t(c.max_pages) * c.page_size;
  if (seq < 0 || seq > table) {
    if (report) flag_status(status, int32_t(StatusCode::seq_len_invalid), b, seq, table);
    return {b, 0};
  }
  if (r.row_lens == nullptr) return {b, seq};
  const int32_t len = r.row_lens[t];
  if (len < 0 || len > seq) {
    if (report) flag_status(status, int32_t(StatusCode::row_len_invalid), t, len, seq);
    return {b, 0};
  }
  return {b, len};
}

// Row t's query decoded as the CPU's RowDecoder does, into q[0, D) of shared memory; every thread
// of the block takes part, the caller synchronizes.
__device__ __forceinline__ void decode_query(const RowsView& r, int64_t t, int dim, double* q) {
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    double v;
    if (r.dtype == DType::fp4x2) {
      const uint8_t* row = static_cast<const uint8_t*>(r.query) + t * r.q_s0;
      const double step = __dmul_rn(double(codec::e4m3_to_float(r.scale[t * r.scale_s0 + d / 16])),
                                    double(r.global_scale));
      const uint32_t nib = (d & 1) ? uint32_t(row[d >> 1] >> 4) : uint32_t(row[d >> 1] & 0xfu);
      v = __dmul_rn(step, sdsa::e2m1_value(nib));
    } else {
      const uint16_t h = static_cast<const uint16_t*>(r.query)[t * r.q_s0 + d];
      v = double(r.dtype == DType::bf16 ? codec::bf16_to_float(h) : codec::f16_to_float(h));
    }
    q[d] = v;
  }
}

// Key j of request b: its page and slot (j < 2^31, as lengths are int32; a shift for page sizes
// that are powers of two, which saves a 64-bit division per key). A page id outside the pool is
// flagged and gives false.
__device__ __forceinline__ bool locate_key(const CacheView& c, int32_t b, int64_t j,
                                           int32_t* status, int32_t& page, int64_t& slot) {
  const uint32_t jj = uint32_t(j);
  const uint32_t col = c.page_shift >= 0 ? jj >> c.page_shift : jj / uint32_t(c.page_size);
  slot = int64_t(jj - col * uint32_t(c.page_size));
  page = c.block_table[int64_t(b) * c.bt_s0 + col];
  if (page >= 0 && page < c.num_pages) return true;
  flag_status(status, int32_t(StatusCode::page_id_out_of_range), b, col, page);
  return false;
}

// The rows (and NVFP4 scale rows) of keys j[0..N) of request b: live[n] where ok[n] and the page
// is in the pool; out[n] starts -inf, or NaN for a page outside the pool (flagged).
template <KeyFormat F, int N>
__device__ __forceinline__ void locate_keys(const CacheView& c, int32_t b, const int64_t (&j)[N],
                                            const bool (&ok)[N], int32_t* status,
                                            const uint8_t* (&rowp)[N], const uint8_t* (&scalep)[N],
                                            bool (&live)[N], float (&out)[N]) {
#pragma unroll
  for (int n = 0; n < N; ++n) {
    live[n] = false;
    rowp[n] = scalep[n] = nullptr;
    out[n] = codec::bits_float(0xff800000u);
    if (!ok[n]) continue;
    int32_t page;
    int64_t slot;
    if (!locate_key(c, b, j[n], status, page, slot)) {
      out[n] = codec::bits_float(0x7fc00000u);
      continue;
    }
    live[n] = true;
    if constexpr (F == KeyFormat::nvfp4) {
      rowp[n] = static_cast<const uint8_t*>(c.keys) + page * c.key_s0 + slot * c.key_s1;
      scalep[n] = c.scale + page * c.scale_s0 + slot * c.scale_s1;
    } else {
      rowp[n] = reinterpret_cast<const uint8_t*>(static_cast<const uint16_t*>(c.keys) +
                                                 page * c.key_s0 + slot * c.key_s1);
    }
  }
}

// The 8 code bytes of NVFP4 group g of a key row as two words (element 2i in the low nibble of
// byte i): one 8-byte load when the rows are 8-byte aligned (c.vec), else bytes.
__device__ __forceinline__ void load_group(const CacheView& c, const uint8_t* row, int g,
                                           uint32_t& lo, uint32_t& hi) {
  if (c.vec) {
    const uint2 w = *reinterpret_cast<const uint2*>(row + g * 8);
    lo = w.x;
    hi = w.y;
    return;
  }
  lo = hi = 0u;
  for (int i = 0; i < 4; ++i) {
    lo |= uint32_t(row[g * 8 + i]) << (8 * i);
    hi |= uint32_t(row[g * 8 + 4 + i]) << (8 * i);
  }
}

template <KeyFormat F>
__device__ __forceinline__ double key_value(uint16_t h) {
  return double(F == KeyFormat::bf16 ? codec::bf16_to_float(h) : codec::f16_to_float(h));
}

// The scores of keys j[0..N) of request b against the decoded query q (shared memory): N
// independent dot products in lockstep over d. Keys with ok[n] false are not read (their score is
// -inf); a key whose page id is out of the pool is flagged and scores NaN, as the CPU's reader
// gives for a table changed under it.
template <KeyFormat F, int N>
__device__ __forceinline__ void score_keys(const double* q, const CacheView& c, int32_t b,
                                           const int64_t (&j)[N], const bool (&ok)[N],
                                           int32_t* status, float (&out)[N]) {
  const uint8_t* rowp[N];
  const uint8_t* scalep[N];
  bool live[N];
  locate_keys<F>(c, b, j, ok, status, rowp, scalep, live, out);
  double dot[N];
#pragma unroll
  for (int n = 0; n < N; ++n) dot[n] = 0.0;
  const int dim = c.dim;
  if constexpr (F == KeyFormat::nvfp4) {
    for (int g = 0; g < dim / 16; ++g) {
      double step[N];
      uint32_t lo[N], hi[N];
#pragma unroll
      for (int n = 0; n < N; ++n) {
        step[n] = 0.0;
        lo[n] = hi[n] = 0;
        if (!live[n]) continue;
        step[n] = __dmul_rn(double(codec::e4m3_to_float(scalep[n][g])), double(c.global_scale));
        load_group(c, rowp[n], g, lo[n], hi[n]);
      }
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const double qd = q[g * 16 + i];
#pragma unroll
        for (int n = 0; n < N; ++n) {
          const uint32_t nib = ((i < 8 ? lo[n] : hi[n]) >> (4 * (i & 7))) & 0xfu;
          const double k = __dmul_rn(step[n], sdsa::e2m1_value(nib));
          dot[n] = __dadd_rn(dot[n], __dmul_rn(qd, k));
        }
      }
    }
  } else {
    int d = 0;
    if (c.vec) {
      for (; d + 8 <= dim; d += 8) {
        uint4 w[N];
#pragma unroll
        for (int n = 0; n < N; ++n)
          w[n] = live[n] ? *reinterpret_cast<const uint4*>(rowp[n] + 2 * d) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const double qd = q[d + i];
#pragma unroll
          for (int n = 0; n < N; ++n) {
            const uint32_t word = i < 2 ? w[n].x : i < 4 ? w[n].y : i < 6 ? w[n].z : w[n].w;
            const uint16_t h = uint16_t((i & 1) ? word >> 16 : word & 0xffffu);
            dot[n] = __dadd_rn(dot[n], __dmul_rn(qd, key_value<F>(h)));
          }
        }
      }
    }
    for (; d < dim; ++d) {
      const double qd = q[d];
#pragma unroll
      for (int n = 0; n < N; ++n) {
        const uint16_t h = live[n] ? reinterpret_cast<const uint16_t*>(rowp[n])[d] : uint16_t(0);
        dot[n] = __dadd_rn(dot[n], __dmul_rn(qd, key_value<F>(h)));
      }
    }
  }
#pragma unroll
  for (int n = 0; n < N; ++n)
    if (live[n]) out[n] = dot[n] != dot[n] ? codec::bits_float(0x7fc00000u) : __double2float_rn(dot[n]);
}

// Block-wide setup of a (row, key tile) block: resolves row t (thread 0 reports its offences)
// and decodes its query into q. Every thread gets the row.
__device__ __forceinline__ RowInfo begin_row(const RowsView& r, const CacheView& c, int64_t t,
                                             int32_t* status, double* q) {
  const RowInfo row = resolve_row(r, c, t, status, threadIdx.x == 0 && blockIdx.y == 0);
  if (row.len > 0) decode_query(r, t, c.dim, q);
  __syncthreads();
  return row;
}

}  // namespace msa::cuda::sdsa_sm90
