// Counter-based normal draws for benchmark inputs (see inputs.h): Box-Muller on two uniforms
// hashed from the element index, OpenMP over chunks.
#include "workloads/inputs.h"

#include <cmath>

namespace msa::bench {
namespace {

// Uniform in (0, 1]: the top 53 bits plus one ulp, so log() never sees 0.
double unit_open(uint64_t bits) { return (static_cast<double>(bits >> 11) + 1.0) * 0x1.0p-53; }

}  // namespace

void fill_normal_bf16(uint16_t* dst, int64_t n, uint64_t seed, uint64_t stream) {
  const uint64_t base = mix64(mix64(seed) ^ (stream * 0xd1342543de82ef95ull));
  const int64_t pairs = (n + 1) / 2;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < pairs; ++p) {
    const double u1 = unit_open(mix64(base + 2 * static_cast<uint64_t>(p)));
    const double u2 = unit_open(mix64(base + 2 * static_cast<uint64_t>(p) + 1));
    const double r = std::sqrt(-2.0 * std::log(u1)), a = 6.283185307179586 * u2;
    dst[2 * p] = float_to_bf16(static_cast<float>(r * std::cos(a)));
    if (2 * p + 1 < n) dst[2 * p + 1] = float_to_bf16(static_cast<float>(r * std::sin(a)));
  }
}

}  // namespace msa::bench
