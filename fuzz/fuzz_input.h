// Shared by the fuzz targets of fuzz/: decodes a libFuzzer input into choices (sizes, flags,
// dtypes, strides) and builds host tensors whose memory is exactly what their views address, so
// AddressSanitizer reports any access outside a view.
#pragma once

#include <sanitizer/asan_interface.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <vector>

#include "msa/msa.h"

namespace msa::fuzz {

// The fuzzer's bytes, read front to back. Past the end every read returns 0, so any prefix of
// an input still decodes to a complete case (mostly the first choice of each pick).
class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), n_(size) {}

  uint8_t u8() { return i_ < n_ ? p_[i_++] : 0; }
  uint16_t u16() { return uint16_t(u8() | (uint16_t(u8()) << 8)); }
  uint32_t u32() { return uint32_t(u16()) | (uint32_t(u16()) << 16); }
  uint64_t u64() { return uint64_t(u32()) | (uint64_t(u32()) << 32); }
  bool flag() { return u8() & 1; }
  // True for about 1 byte value in 16: the rare branches (a broken argument, an odd layout).
  bool rare() { return u8() >= 240; }
  // An integer in [0, n).
  int64_t below(int64_t n) { return n <= 1 ? 0 : int64_t(u8() % uint64_t(n)); }
  // An integer in [lo, hi].
  int64_t range(int64_t lo, int64_t hi) { return lo + int64_t(u16() % uint64_t(hi - lo + 1)); }
  template <typename T>
  T pick(std::initializer_list<T> v) {
    return v.begin()[below(int64_t(v.size()))];
  }
  // A size for a dimension the case does not fix: usually small, rarely one that only an
  // empty view can have (any other dim 0) or that overflows products of sizes.
  int64_t odd_size() {
    return pick<int64_t>({0, 1, 2, 3, 5, 16, 17, 127, 128, 129, int64_t(1) << 31,
                          (int64_t(1) << 31) - 1, int64_t(1) << 40, int64_t(1) << 62, INT64_MAX});
  }

 private:
  const uint8_t* p_;
  size_t n_, i_ = 0;
};

// splitmix64: bulk tensor contents from a seed the input gives (cheap, deterministic).
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  __attribute__((no_sanitize("coverage"))) uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

 private:
  uint64_t s_;
};

// The strides of a view and how its data pointer sits: row-major, rows padded, a dim reversed
// (negative stride), a dim broadcast (stride 0), two dims transposed, or the base misaligned.
struct Layout {
  std::vector<int64_t> strides;  // elements
  int misalign = 0;              // bytes added to a 64-byte aligned base
};

// stride * size (a size of 0 counts as 1), saturating: a view whose strides saturate has no
// elements or is too large for the Arena.
inline int64_t sat_mul(int64_t stride, int64_t size) {
  int64_t r;
  return __builtin_mul_overflow(stride, std::max<int64_t>(size, 1), &r) ? INT64_MAX : r;
}

inline std::vector<int64_t> row_major(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int d = int(shape.size()) - 2; d >= 0; --d) s[d] = sat_mul(s[d + 1], shape[d + 1]);
  return s;
}

// Mostly row-major; in one case of eight, one of the odd layouts above.
inline Layout pick_layout(Input& in, const std::vector<int64_t>& shape) {
  Layout l{row_major(shape), 0};
  const int nd = int(shape.size());
  if (nd == 0 || in.u8() < 224) return l;
  const int d = int(in.below(nd));
  switch (in.below(6)) {
    case 0: {  // rows padded by a few elements, outer dims recomputed
      const int64_t pad = in.range(1, 9);
      if (d + 1 < nd) {
        if (l.strides[d] < INT64_MAX - pad) l.strides[d] += pad;
        for (int o = d - 1; o >= 0; --o) l.strides[o] = sat_mul(l.strides[o + 1], shape[o + 1]);
      }
      break;
    }
    case 1:
      l.strides[d] = -l.strides[d];
      break;
    case 2:
      l.strides[d] = 0;
      break;
    case 3:
      std::swap(l.strides[d], l.strides[in.below(nd)]);
      break;
    case 4:
      l.misalign = int(in.pick<int64_t>({1, 2, 4, 8}));
      break;
    default:
      l.strides[d] = in.range(-300, 300);
      break;
  }
  return l;
}

// Host memory for the views of one input. Each allocation holds exactly the bytes between the
// lowest and the highest element a view addresses; the 8-byte granules between them that hold no
// element (padded rows) are poisoned, so ASan reports a read through a wrong stride as well as a
// read past either end. Views on "cuda" point at poisoned memory: the host must never touch it.
class Arena {
 public:
  // Views over more than this many bytes or elements are not built (the case is skipped): the
  // targets stay fast, and no size check of msa is needed to keep them in memory.
  static constexpr int64_t kMaxBytes = 1 << 20;
  static constexpr int64_t kMaxElements = 1 << 18;

  ~Arena() {
    for (const Block& b : blocks_) {
      ASAN_UNPOISON_MEMORY_REGION(b.base, b.size);
      std::free(b.base);
    }
  }

  // False once a view was too large to build; the case should then be abandoned.
  bool ok() const { return ok_; }

  // A view of `dtype` over `shape` laid out as `layout`, its elements filled from `logical`
  // (row-major, numel * element size bytes) or, when null, with bytes from `rng`.
  // Not instrumented for coverage: its per-element loops are the harness's, and with libFuzzer's
  // comparison tracing they took most of each run's time.
  __attribute__((no_sanitize("coverage"))) Tensor view(DType dtype,
                                                       const std::vector<int64_t>& shape,
                                                       const Layout& layout, const void* logical,
                                                       Rng& rng, Device device = {}) {
    const int64_t es = int64_t(dtype_size(dtype));
    const int nd = int(shape.size());
    int64_t numel = 1, lo = 0, hi = 0;
    bool empty = false;
    for (int d = 0; d < nd; ++d) empty |= shape[d] == 0;
    if (!empty) {
      for (int d = 0; d < nd; ++d) {
        int64_t reach;
        // The extent is the sum of every dim's |reach|, so bounding each keeps the sums small.
        if (__builtin_mul_overflow(shape[d] - 1, layout.strides[d], &reach) || reach > kMaxBytes ||
            reach < -kMaxBytes || __builtin_mul_overflow(numel, shape[d], &numel) ||
            numel > kMaxElements)
          return too_big();
        (reach < 0 ? lo : hi) += reach;
        if (hi - lo > kMaxBytes) return too_big();
      }
    }
    const int64_t bytes = empty ? 0 : (hi - lo + 1) * es;
    if (bytes > kMaxBytes) return too_big();
    static const bool verbose = std::getenv("FUZZ_VERBOSE") != nullptr;
    if (verbose) {  // FUZZ_VERBOSE=1 when replaying a finding: the views the case built
      std::fprintf(stderr, "view %zu: %s", blocks_.size(), dtype_name(dtype));
      for (int d = 0; d < nd; ++d)
        std::fprintf(stderr, "%s%lld/%lld", d ? ", " : " [", (long long)shape[d],
                     (long long)layout.strides[d]);
      std::fprintf(stderr, "%s (size/stride) misalign %d%s\n", nd ? "]" : " []", layout.misalign,
                   device.type == DeviceType::cuda ? " on cuda" : "");
    }
    Block b;
    b.size = size_t(bytes + layout.misalign);
    if (posix_memalign(&b.base, 64, b.size == 0 ? 1 : b.size) != 0) return too_big();
    blocks_.push_back(b);
    uint8_t* first = static_cast<uint8_t*>(b.base) + layout.misalign;
    uint8_t* data = first - lo * es;
    Tensor t(data, dtype, shape, layout.strides, device);
    if (empty) {  // no byte of it may be read
      ASAN_POISON_MEMORY_REGION(b.base, 1);
      return t;
    }
    if (layout.strides == row_major(shape)) {  // dense: no gap to poison
      fill(first, logical, size_t(bytes), rng);
      ASAN_POISON_MEMORY_REGION(b.base, layout.misalign);
      if (device.type == DeviceType::cuda) ASAN_POISON_MEMORY_REGION(b.base, b.size);
      return t;
    }
    // Fill the elements in logical order and mark the bytes they cover.
    std::vector<uint8_t> used(size_t(bytes), 0);
    std::vector<int64_t> idx(nd, 0);
    const uint8_t* src = static_cast<const uint8_t*>(logical);
    for (int64_t i = 0; i < numel; ++i) {
      int64_t off = -lo;
      for (int d = 0; d < nd; ++d) off += idx[d] * layout.strides[d];
      for (int64_t k = 0; k < es; ++k) {
        first[off * es + k] = src ? src[i * es + k] : uint8_t(rng.next());
        used[size_t(off * es + k)] = 1;
      }
      for (int d = nd - 1; d >= 0 && ++idx[d] == shape[d]; --d) idx[d] = 0;
    }
    ASAN_POISON_MEMORY_REGION(b.base, layout.misalign);
    for (int64_t g = 0; g + 8 <= bytes; g += 8) {
      bool hole = true;
      for (int64_t k = 0; k < 8 && hole; ++k) hole = !used[size_t(g + k)];
      if (hole && (reinterpret_cast<uintptr_t>(first + g) % 8) == 0)
        ASAN_POISON_MEMORY_REGION(first + g, 8);
    }
    if (device.type == DeviceType::cuda) ASAN_POISON_MEMORY_REGION(b.base, b.size);
    return t;
  }

 private:
  struct Block {
    void* base = nullptr;
    size_t size = 0;
  };
  __attribute__((no_sanitize("coverage"))) static void fill(uint8_t* dst, const void* src, size_t n,
                                                            Rng& rng) {
    if (src) {
      std::memcpy(dst, src, n);
      return;
    }
    for (size_t i = 0; i < n; i += 8) {
      const uint64_t r = rng.next();
      std::memcpy(dst + i, &r, std::min<size_t>(8, n - i));
    }
  }
  Tensor too_big() {
    ok_ = false;
    return Tensor();
  }
  std::vector<Block> blocks_;
  bool ok_ = true;
};

// Builds the tensor arguments of one call: each is the view the case asks for, except that
// rarely (Input::rare) one is broken the way a caller could break it: left out, another dtype, a
// dim more or less, a dim of another size, on another device, or one element of an index tensor
// set to a value outside its rule. The layout comes from pick_layout.
class Args {
 public:
  Args(Input& in, Arena& arena, Rng& rng) : in_(in), arena_(arena), rng_(rng) {}

  // `logical`: row-major contents (numel * element size bytes), or null for random bytes.
  Tensor tensor(DType dtype, std::vector<int64_t> shape, const void* logical = nullptr) {
    Device device{};
    if (in_.rare()) {
      logical = nullptr;
      switch (in_.below(6)) {
        case 0:
          return Tensor();
        case 1:
          dtype = in_.pick({DType::f32, DType::f16, DType::bf16, DType::fp8_e4m3, DType::fp4x2,
                            DType::e8m0, DType::u8, DType::i32, DType::boolean});
          break;
        case 2:
          if (in_.flag() && !shape.empty())
            shape.pop_back();
          else
            shape.push_back(in_.range(0, 3));
          break;
        case 3:
          if (!shape.empty()) {
            int64_t& d = shape[size_t(in_.below(int64_t(shape.size())))];
            d = in_.flag() ? in_.odd_size() : std::max<int64_t>(0, d + (in_.flag() ? 1 : -1));
          }
          break;
        case 4:
          device = Device{DeviceType::cuda, 0};
          break;
        default:
          break;  // contents only: random bytes
      }
    }
    return arena_.view(dtype, shape, pick_layout(in_, shape), logical, rng_, device);
  }

  // An int32 tensor holding `v` (shape [v.size()] unless given), one element rarely replaced by
  // an odd value.
  Tensor i32(std::vector<int32_t> v, std::vector<int64_t> shape = {}) {
    if (shape.empty()) shape = {int64_t(v.size())};
    if (!v.empty() && in_.rare())
      v[size_t(in_.below(int64_t(v.size())))] =
          in_.pick<int32_t>({-2, -1, 0, 1, 2, 7, 128, 1 << 20, INT32_MAX, INT32_MIN});
    return tensor(DType::i32, shape, v.data());
  }

  Input& in() { return in_; }
  Rng& rng() { return rng_; }
  bool ok() const { return arena_.ok(); }

 private:
  Input& in_;
  Arena& arena_;
  Rng& rng_;
};

// [0, l0, l0 + l1, ...]
inline std::vector<int32_t> cumulative(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> c(lengths.size() + 1, 0);
  for (size_t b = 0; b < lengths.size(); ++b) c[b + 1] = c[b] + lengths[b];
  return c;
}

}  // namespace msa::fuzz
