// The exact score of an NVFP4 query over NVFP4 keys on the GPU (common/sdsa.h): each group's
// integer sum I_g by dp4a, over key codes turned into signed bytes by prmt, the scaled sum S in
// int64, then the one fp64 and one f32 rounding of sdsa::nvfp4_score. The CPU forms the same
// integers, so the scores are its bits. The fp64 chain of score.cuh costs three fp64 operations
// per element; this costs under two integer operations per element (11 per code word of 8), and
// the select is then bound by load latency (docs/kernels/sdsa.md has the figures).
//
// Also the scoring "modes" the scores and select kernels are instantiated for: the fp64 chain
// (kChain), and the exact NVFP4 path with byte loads (kNvfp4) or with 16-byte code loads and
// 4-byte scale loads (kNvfp4Vec: D a multiple of 64, code rows 16-byte and scale rows 4-byte
// aligned).
#pragma once

#include "cuda/device/sm90.cuh"
#include "cuda/sm90/sdsa/score.cuh"

namespace msa::cuda::sdsa_sm90 {

enum ScoreMode : int { kChain = 0, kNvfp4 = 1, kNvfp4Vec = 2, kNvfp4Pre = 3 };

// Keys a thread scores at once. The exact path waits on latency, not on registers: 1, 2 or 4 keys
// a thread ran within 4% of each other (315-327 us on SDSA-SELECT), so it takes one (72
// registers; 4 keys take 128).
constexpr int keys_per_thread(int mode) { return mode == kChain ? kKeysPerThread : 1; }

// Tiles a block walks: kNvfp4Pre (D = 128) loads its next tile's key while it scores this one.
// SDSA-SELECT: 308.6 us with 4, 310.0 with 2, 309.6 with 8, 323.4 with one tile a block
// (kNvfp4Vec).
constexpr int kPreTiles = 4;
constexpr int tiles_per_block(int mode) { return mode == kNvfp4Pre ? kPreTiles : 1; }

inline unsigned row_blocks(int mode, int64_t tiles) {
  const int64_t per = tiles_per_block(mode), y = (tiles + per - 1) / per;
  return unsigned(y < 1 ? 1 : y < 65535 ? y : 65535);
}

// Row t's NVFP4 query in shared memory: per 8 elements (one 32-bit word of codes) the h of
// elements 0-3 and 4-7 as int8 bytes, then their negations; per group E(scale); E of every e4m3
// byte (a table: 1 shared load a group instead of 8 integer operations on the ALU pipe, this
// path's busiest; NaN bytes are detected on the bytes); a NaN flag.
struct QueryNvfp4 {
  const uint4* chunks;   // [D / 8]
  const int32_t* units;  // [D / 16]
  const int32_t* table;  // [256]
  int32_t nan;           // a scale byte of the query is NaN
};

// Dynamic shared memory a scoring block of `mode` takes for head dim `dim`.
inline size_t query_smem_bytes(int mode, int dim) {
  if (mode == kChain) return size_t(dim) * sizeof(double);
  return 256 * 4 + size_t(dim / 8) * 16 + size_t(dim / 16) * 4;
}

// Bit 7 of each byte of the result is set where that byte of w is a NaN e4m3 (0x7f, 0xff): the
// low 7 bits plus 1 carry into bit 7 for 0x7f alone, and never into the next byte.
__device__ __forceinline__ uint32_t e4m3_nan_bytes(uint32_t w) {
  return ((w & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u;
}

// w >> 16 on the FMA pipe (the ALU pipe is this path's busiest).
__device__ __forceinline__ uint32_t high_half(uint32_t w) { return __umulhi(w, 0x10000u); }

using sm90::prmt;

// Decodes row t's query (every thread of the block takes part; the caller synchronizes after).
// Returns the NaN flag of the whole block (__syncthreads_or: every thread must call this).
__device__ __forceinline__ int decode_query_nvfp4(const RowsView& r, int64_t t, int dim,
                                                  unsigned char* smem) {
  const uint8_t* row = static_cast<const uint8_t*>(r.query) + t * r.q_s0;
  const uint8_t* sc = r.scale + t * r.scale_s0;
  int32_t* table = reinterpret_cast<int32_t*>(smem);
  uint4* chunks = reinterpret_cast<uint4*>(table + 256);
  int32_t* units = reinterpret_cast<int32_t*>(chunks + dim / 8);
  for (int b = threadIdx.x; b < 256; b += blockDim.x) {
    bool unused = false;  // a NaN byte's entry is never used: the score is NaN
    table[b] = sdsa::e4m3_units(uint32_t(b), unused);
  }
  for (int c = threadIdx.x; c < dim / 8; c += blockDim.x) {
    uint32_t pos[2] = {0u, 0u}, neg[2] = {0u, 0u};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int32_t h = sdsa::e2m1_halves((uint32_t(row[4 * c + i / 2]) >> (4 * (i & 1))) & 15u);
      pos[i / 4] |= uint32_t(uint8_t(h)) << (8 * (i & 3));
      neg[i / 4] |= uint32_t(uint8_t(-h)) << (8 * (i & 3));
    }
    chunks[c] = make_uint4(pos[0], pos[1], neg[0], neg[1]);
  }
  bool nan = false;
  for (int g = threadIdx.x; g < dim / 16; g += blockDim.x) units[g] = sdsa::e4m3_units(sc[g], nan);
  return __syncthreads_or(nan);
}

__device__ __forceinline__ QueryNvfp4 query_nvfp4(const unsigned char* smem, int dim, int nan) {
  const int32_t* table = reinterpret_cast<const int32_t*>(smem);
  const uint4* chunks = reinterpret_cast<const uint4*>(table + 256);
  return {chunks, reinterpret_cast<const int32_t*>(chunks + dim / 8), table, nan};
}

// acc + the products of 8 elements: the key's code word w against a query chunk. The table holds
// h of codes 0-7 (0 1 2 3 4 6 8 12); a selector nibble with bit 3 set copies the sign of its
// table byte instead, which is 0, so the first two lookups give the positive codes' h and 0 for
// the negative ones, and the two over w with bit 3 flipped the reverse, taken against -h(q).
__device__ __forceinline__ int32_t chunk_dot(uint32_t w, const uint4& q, int32_t acc) {
  constexpr uint32_t kLo = 0x03020100u, kHi = 0x0c080604u;
  const uint32_t n = w ^ 0x88888888u;
  acc = __dp4a(int(prmt(kLo, kHi, w)), int(q.x), acc);
  acc = __dp4a(int(prmt(kLo, kHi, high_half(w))), int(q.y), acc);
  acc = __dp4a(int(prmt(kLo, kHi, n)), int(q.z), acc);
  acc = __dp4a(int(prmt(kLo, kHi, high_half(n))), int(q.w), acc);
  return acc;
}

// S += I_g * E(q scale) * E(k scale) for group g with key code words lo, hi and key scale byte
// (the caller detects NaN bytes, which make the score NaN whatever S is).
__device__ __forceinline__ void add_group(const QueryNvfp4& q, int g, uint32_t lo, uint32_t hi,
                                          uint32_t kscale, int64_t& acc) {
  const int32_t i = chunk_dot(hi, q.chunks[2 * g + 1], chunk_dot(lo, q.chunks[2 * g], 0));
  acc += int64_t(i * q.units[g]) * q.table[kscale];  // |i * E| < 2^30
}

// The exact scores of keys j[0..N) of request b (score_keys' contract: -inf where !ok, NaN and a
// flag for a page id out of the pool).
template <bool kVec, int N>
__device__ __forceinline__ void score_keys_nvfp4(const QueryNvfp4& q, float global_q,
                                                 const CacheView& c, int32_t b,
                                                 const int64_t (&j)[N], const bool (&ok)[N],
                                                 int32_t* status, float (&out)[N]) {
  const uint8_t* rowp[N];
  const uint8_t* scalep[N];
  bool live[N];
  uint32_t nan[N];  // NaN scale bytes seen (bit 7 of a byte)
  int64_t acc[N];
  locate_keys<KeyFormat::nvfp4>(c, b, j, ok, status, rowp, scalep, live, out);
#pragma unroll
  for (int n = 0; n < N; ++n) {
    nan[n] = q.nan != 0 ? 0x80u : 0u;
    acc[n] = 0;
  }
  if constexpr (kVec) {
    // 64 elements a step: 32 code bytes and 4 scale bytes a key, loaded for all N keys first.
#pragma unroll 1
    for (int s = 0; s < c.dim / 64; ++s) {
      uint4 w0[N], w1[N];
      uint32_t sw[N];
#pragma unroll
      for (int n = 0; n < N; ++n) {
        w0[n] = w1[n] = make_uint4(0u, 0u, 0u, 0u);
        sw[n] = 0u;
        if (!live[n]) continue;
        w0[n] = __ldg(reinterpret_cast<const uint4*>(rowp[n] + 32 * s));
        w1[n] = __ldg(reinterpret_cast<const uint4*>(rowp[n] + 32 * s + 16));
        sw[n] = __ldg(reinterpret_cast<const uint32_t*>(scalep[n] + 4 * s));
      }
#pragma unroll
      for (int n = 0; n < N; ++n) {
        nan[n] |= e4m3_nan_bytes(sw[n]);
        add_group(q, 4 * s + 0, w0[n].x, w0[n].y, sw[n] & 0xffu, acc[n]);
        add_group(q, 4 * s + 1, w0[n].z, w0[n].w, (sw[n] >> 8) & 0xffu, acc[n]);
        add_group(q, 4 * s + 2, w1[n].x, w1[n].y, (sw[n] >> 16) & 0xffu, acc[n]);
        add_group(q, 4 * s + 3, w1[n].z, w1[n].w, sw[n] >> 24, acc[n]);
      }
    }
  } else {
    for (int g = 0; g < c.dim / 16; ++g) {
#pragma unroll
      for (int n = 0; n < N; ++n) {
        if (!live[n]) continue;
        uint32_t lo, hi;
        load_group(c, rowp[n], g, lo, hi);
        nan[n] |= e4m3_nan_bytes(scalep[n][g]);
        add_group(q, g, lo, hi, scalep[n][g], acc[n]);
      }
    }
  }
#pragma unroll
  for (int n = 0; n < N; ++n)
    if (live[n]) out[n] = sdsa::nvfp4_score(acc[n], nan[n] != 0u, global_q, c.global_scale);
}

// kNvfp4Pre: one D = 128 key's code and scale bytes in registers (zero when not live).
struct KeyRegs {
  uint4 w[4];
  uint32_t sw[2];
  bool live;
  float out;  // -inf, or NaN for a bad page, when not live
};

__device__ __forceinline__ KeyRegs load_key_regs(const CacheView& c, int32_t b, int64_t j,
                                                 bool ok, int32_t* status) {
  KeyRegs k;
  const int64_t jj[1] = {j};
  const bool oks[1] = {ok};
  const uint8_t* rowp[1];
  const uint8_t* scalep[1];
  bool live[1];
  float out[1];
  locate_keys<KeyFormat::nvfp4>(c, b, jj, oks, status, rowp, scalep, live, out);
  k.live = live[0];
  k.out = out[0];
#pragma unroll
  for (int i = 0; i < 4; ++i) k.w[i] = make_uint4(0u, 0u, 0u, 0u);
  k.sw[0] = k.sw[1] = 0u;
  if (k.live) {
#pragma unroll
    for (int i = 0; i < 4; ++i) k.w[i] = __ldg(reinterpret_cast<const uint4*>(rowp[0] + 16 * i));
    k.sw[0] = __ldg(reinterpret_cast<const uint32_t*>(scalep[0]));
    k.sw[1] = __ldg(reinterpret_cast<const uint32_t*>(scalep[0] + 4));
  }
  return k;
}

__device__ __forceinline__ float score_key_regs(const QueryNvfp4& q, float global_q,
                                                float global_k, const KeyRegs& k) {
  if (!k.live) return k.out;
  int64_t acc = 0;
  uint32_t nan = q.nan != 0 ? 0x80u : 0u;
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    const uint4 w0 = k.w[2 * s], w1 = k.w[2 * s + 1];
    const uint32_t sw = k.sw[s];
    nan |= e4m3_nan_bytes(sw);
    add_group(q, 4 * s + 0, w0.x, w0.y, sw & 0xffu, acc);
    add_group(q, 4 * s + 1, w0.z, w0.w, (sw >> 8) & 0xffu, acc);
    add_group(q, 4 * s + 2, w1.x, w1.y, (sw >> 16) & 0xffu, acc);
    add_group(q, 4 * s + 3, w1.z, w1.w, sw >> 24, acc);
  }
  return sdsa::nvfp4_score(acc, nan != 0u, global_q, global_k);
}

// The per-mode front of the scores and select kernels: the row's setup (the query decoded into
// shared memory) and the walk over this block's tiles of the row (tiles blockIdx.y, + gridDim.y,
// ...), scoring each thread's keys of a tile and handing them to the kernel.
template <KeyFormat F, int kMode>
struct RowScorer {
  static constexpr int kKeys = keys_per_thread(kMode);
  static constexpr int kTile = kThreads * kKeys;

  unsigned char* smem;
  int nan = 0;

  __device__ __forceinline__ RowInfo begin(const RowsView& r, const CacheView& c, int64_t t,
                                           int32_t* status) {
    if constexpr (kMode == kChain) {
      return begin_row(r, c, t, status, reinterpret_cast<double*>(smem));
    } else {
      const RowInfo row = resolve_row(r, c, t, status, threadIdx.x == 0 && blockIdx.y == 0);
      if (row.len > 0) nan = decode_query_nvfp4(r, t, c.dim, smem);  // uniform over the block
      __syncthreads();
      return row;
    }
  }

  // fn(j, s) for each of this block's tiles that start below `end`; keys at or past `len` (<= end)
  // score -inf without being read.
  template <class Fn>
  __device__ __forceinline__ void for_tiles(const RowsView& r, const CacheView& c, int32_t b,
                                            int64_t end, int64_t len, int32_t* status,
                                            Fn&& fn) const {
    if constexpr (kMode == kNvfp4Pre) {
      const QueryNvfp4 q = query_nvfp4(smem, 128, nan);
      int64_t tile = blockIdx.y;
      KeyRegs cur;
      if (tile * kTile < end) {
        const int64_t j = tile * kTile + threadIdx.x;
        cur = load_key_regs(c, b, j, j < len, status);
      }
      for (; tile * kTile < end; tile += gridDim.y) {
        const int64_t j[1] = {tile * kTile + threadIdx.x};
        const int64_t jn = j[0] + int64_t(gridDim.y) * kTile;
        const KeyRegs nxt = load_key_regs(c, b, jn, jn < len && jn - threadIdx.x < end, status);
        float s[1] = {score_key_regs(q, r.global_scale, c.global_scale, cur)};
        fn(j, s);
        cur = nxt;
      }
    } else {
      for (int64_t tile = blockIdx.y; tile * kTile < end; tile += gridDim.y) {
        int64_t j[kKeys];
        bool ok[kKeys];
#pragma unroll
        for (int n = 0; n < kKeys; ++n) {
          j[n] = tile * kTile + n * kThreads + threadIdx.x;
          ok[n] = j[n] < len;
        }
        float s[kKeys];
        if constexpr (kMode == kChain)
          score_keys<F, kKeys>(reinterpret_cast<const double*>(smem), c, b, j, ok, status, s);
        else
          score_keys_nvfp4<kMode == kNvfp4Vec, kKeys>(query_nvfp4(smem, c.dim, nan),
                                                      r.global_scale, c, b, j, ok, status, s);
        fn(j, s);
      }
    }
  }
};

// The mode of a call: the exact path when the query and the keys are NVFP4.
inline int score_mode(const RowsView& r, const CacheView& c, KeyFormat f) {
  if (f != KeyFormat::nvfp4 || r.dtype != DType::fp4x2) return kChain;
  if (c.vec16 && c.dim == 128) return kNvfp4Pre;
  return c.vec16 ? kNvfp4Vec : kNvfp4;
}

// The (key format, scoring mode) pair a kernel is instantiated for.
template <KeyFormat F, int M>
struct Variant {
  static constexpr KeyFormat kFormat = F;
  static constexpr int kMode = M;
};

// launch(Variant<format, mode>{}) for the call's key format and scoring mode: the dispatch of the
// scores and select launches.
template <class Launch>
void with_variant(const RowsView& r, const CacheView& c, KeyFormat f, Launch&& launch) {
  switch (score_mode(r, c, f)) {
    case kNvfp4: return launch(Variant<KeyFormat::nvfp4, kNvfp4>{});
    case kNvfp4Vec: return launch(Variant<KeyFormat::nvfp4, kNvfp4Vec>{});
    case kNvfp4Pre: return launch(Variant<KeyFormat::nvfp4, kNvfp4Pre>{});
    default: break;
  }
  switch (f) {
    case KeyFormat::bf16: return launch(Variant<KeyFormat::bf16, kChain>{});
    case KeyFormat::f16: return launch(Variant<KeyFormat::f16, kChain>{});
    case KeyFormat::nvfp4: return launch(Variant<KeyFormat::nvfp4, kChain>{});
  }
}

}  // namespace msa::cuda::sdsa_sm90
