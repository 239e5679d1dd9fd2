// Random benchmark inputs (bench/CASES.md: random normal bf16), the hash behind them, and the bf16
// bit conversions the host side of a benchmark needs. Shared by the CLI and the GPU benchmarks.
#pragma once

#include <cstdint>
#include <cstring>

namespace msa::bench {

// Round-to-nearest-even float -> bf16 bits (NaN stays NaN) and back. Kept here rather than
// borrowed from src/common so that tools depend only on the public API.
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_float(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// SplitMix64's finalizer: the counter-based hash of the inputs, the selection patterns and the
// decode benchmark's device fills (constexpr, so device code may call it too).
constexpr uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// dst[e] = bf16(N(0, 1)) for e in [0, n). Element e depends only on (seed, stream, e), so the
// fill is parallel and reproducible; `stream` tells apart the tensors drawn from one seed.
void fill_normal_bf16(uint16_t* dst, int64_t n, uint64_t seed, uint64_t stream);

}  // namespace msa::bench
