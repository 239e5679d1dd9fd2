// CUDA token_topk (src/cuda/common/token_topk.cu) against the CPU reference on the same rows, id
// for id: topk 1 to 2048 and past the row, rows shorter than topk, empty rows and ranges, rows
// past the kernel's shared-memory cache (16K keys with more rows than SMs, 48K with fewer) and
// its candidate buffer (long runs of equal scores),
// integer-valued scores (ties everywhere), -inf / NaN / -0.0 / +0.0 / +inf mixes, strided and
// misaligned rows, many short rows and few long ones; the device check of bad ranges; bitwise
// repeatability. Outputs are poisoned before each run. MSA_TEST_SMALL=1 shrinks the sweep.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "support/device_tensor.h"

namespace msa::test {
namespace {

constexpr int32_t kPoison = 0x5a5a5a5a;  // not -1, so missing padding shows

enum class Kind {
  normal,   // N(0, 1): few ties
  ints,     // integers in [0, 50): ties everywhere
  few,      // {0, 1, 2}: buckets far larger than the candidate buffer
  equal,    // one value: every key ties
  special,  // -inf, NaN, -0.0, +0.0, +inf and small integers
  sparse,   // mostly -inf: fewer candidates than topk
};

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::normal: return "normal";
    case Kind::ints: return "ints";
    case Kind::few: return "few";
    case Kind::equal: return "equal";
    case Kind::special: return "special";
    case Kind::sparse: return "sparse";
  }
  return "?";
}

float draw(Kind kind, std::mt19937& rng) {
  const float inf = std::numeric_limits<float>::infinity();
  switch (kind) {
    case Kind::normal: return std::normal_distribution<float>(0.f, 1.f)(rng);
    case Kind::ints: return float(int(rng() % 50));
    case Kind::few: return float(int(rng() % 3));
    case Kind::equal: return 3.5f;
    case Kind::special: {
      switch (rng() % 8) {
        case 0: return -inf;
        case 1: return std::nanf("");
        case 2: return -0.f;
        case 3: return 0.f;
        case 4: return rng() % 4 == 0 ? inf : -1.f;
        default: return float(int(rng() % 5)) - 2.f;
      }
    }
    case Kind::sparse: return rng() % 16 == 0 ? float(int(rng() % 8)) : -inf;
  }
  return 0.f;
}

struct Case {
  int64_t rows, cols;
  int topk;
  Kind kind;
  bool ranged;
  int64_t pad = 0;     // row stride cols + pad
  int64_t offset = 0;  // the view starts this many floats into its buffer (misaligned rows)
};

std::string describe(const Case& c) {
  std::ostringstream os;
  os << "rows=" << c.rows << " cols=" << c.cols << " topk=" << c.topk << " " << kind_name(c.kind)
     << (c.ranged ? " ranged" : "") << " pad=" << c.pad << " offset=" << c.offset;
  return os.str();
}

// The problem on the host: a buffer of rows * (cols + pad) + offset floats, ranges.
struct Problem {
  Case c;
  HostTensor buf, ks, ke;
  Tensor logits;  // view into buf
};

Problem make_problem(const Case& c, std::mt19937& rng) {
  const int64_t ld = c.cols + c.pad;
  Problem p{c, HostTensor(DType::f32, {c.rows * ld + c.offset + 1}), HostTensor(DType::i32, {c.rows}),
            HostTensor(DType::i32, {c.rows}), Tensor()};
  for (int64_t i = 0; i < p.buf.t.numel(); ++i) p.buf.data<float>()[i] = draw(c.kind, rng);
  p.logits = Tensor(p.buf.data<float>() + c.offset, DType::f32, std::vector<int64_t>{c.rows, c.cols},
                    std::vector<int64_t>{ld, 1});
  for (int64_t r = 0; r < c.rows; ++r) {
    int32_t lo = 0, hi = int32_t(c.cols);
    switch (r % 5) {
      case 0: hi = int32_t(std::min<int64_t>(c.cols, (r + 1) * c.cols / c.rows)); break;  // causal
      case 1: lo = c.cols ? int32_t(rng() % c.cols) : 0;
              hi = lo + int32_t(rng() % (c.cols - lo + 1)); break;
      case 2: lo = hi = int32_t(c.cols / 2); break;  // empty
      case 3: lo = int32_t(c.cols / 3); hi = int32_t(c.cols - c.cols / 7); break;
      default: break;  // the whole row
    }
    p.ks.data<int32_t>()[r] = lo;
    p.ke.data<int32_t>()[r] = hi;
  }
  return p;
}

std::vector<int32_t> run_cpu(const Problem& p) {
  HostTensor ids(DType::i32, {p.c.rows, p.c.topk});
  std::fill(ids.data<int32_t>(), ids.data<int32_t>() + ids.t.numel(), kPoison);
  TokenTopKArgs a;
  a.logits = p.logits;
  if (p.c.ranged) {
    a.ks = p.ks.t;
    a.ke = p.ke.t;
  }
  a.topk = p.c.topk;
  a.ids = ids.t;
  token_topk(a);
  return std::vector<int32_t>(ids.data<int32_t>(), ids.data<int32_t>() + ids.t.numel());
}

// The GPU's ids, and the status words in `st`.
std::vector<int32_t> run_gpu(const Problem& p, cudaStream_t stream, std::vector<int32_t>* st = nullptr) {
  const DeviceTensor dbuf = to_device(p.buf, stream), dks = to_device(p.ks, stream),
                     dke = to_device(p.ke, stream);
  HostTensor ids(DType::i32, {p.c.rows, p.c.topk});
  std::fill(ids.data<int32_t>(), ids.data<int32_t>() + ids.t.numel(), kPoison);
  DeviceTensor dids = to_device(ids, stream);
  DeviceBuffer status(16);
  const Tensor stt(status.get(), DType::i32, {4}, gpu0());
  clear_status(stt, stream);
  TokenTopKArgs a;
  a.logits = p.logits;
  a.logits.data = static_cast<float*>(dbuf.buf.get()) + p.c.offset;
  a.logits.device = gpu0();
  if (p.c.ranged) {
    a.ks = dks.t;
    a.ke = dke.t;
  }
  a.topk = p.c.topk;
  a.ids = dids.t;
  a.status = stt;
  token_topk(a, stream);
  copy_to_host(dids, ids, stream);
  const std::vector<int32_t> words = status.download<int32_t>(4, stream);
  if (st) *st = words;
  else EXPECT_EQ(words[0], 0) << describe_status(words.data());
  return std::vector<int32_t>(ids.data<int32_t>(), ids.data<int32_t>() + ids.t.numel());
}

void expect_same_ids(const std::vector<int32_t>& got, const std::vector<int32_t>& want, int topk,
                     const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i] && bad++ < 8)
      ADD_FAILURE() << "row " << i / topk << " slot " << i % topk << ": got " << got[i]
                    << ", want " << want[i];
  EXPECT_EQ(bad, 0) << "ids that differ";
}

TEST(TokenTopKGpu, MatchesCpu) {
  MSA_REQUIRE_GPU();
  std::vector<Case> cases = {
      {64, 300, 1, Kind::normal, false},
      {64, 300, 7, Kind::ints, true},
      {33, 1000, 64, Kind::special, true, 3, 1},
      {16, 5000, 512, Kind::ints, true},
      {12, 2049, 2048, Kind::ints, false, 0, 2},   // one more than topk
      {12, 2048, 2048, Kind::normal, false},        // exactly topk
      {10, 100, 512, Kind::normal, true},           // rows shorter than topk
      {40, 3001, 7, Kind::equal, true, 5, 3},       // every key ties
      {20, 4099, 64, Kind::sparse, true},           // fewer candidates than topk
      {3, 0, 5, Kind::normal, false},               // no columns
      {0, 17, 4, Kind::normal, true},               // no rows
      {2000, 64, 7, Kind::special, true},           // many short rows
      {8, 40000, 2048, Kind::normal, true, 7, 1},   // few rows: cached whole (48K keys)
      {300, 20000, 2048, Kind::ints, true, 1, 1},   // more rows than SMs: past the 16K cache
      {6, 30000, 2048, Kind::few, false},           // buckets past the buffer: refined on the row
      {6, 20001, 512, Kind::equal, false, 1, 0},    // all ties, past the cache
      {5, 12345, 2048, Kind::special, false, 0, 3},
      {4, 70001, 2048, Kind::ints, true, 2, 1},     // past the 48K cache
      {3, 9000, 5000, Kind::normal, true},          // topk past 2048 (no limit on CUDA)
      {2, 262144, 2048, Kind::normal, false},       // 256K columns, few rows
      {2, 262147, 2048, Kind::few, true, 1, 1},
      {512, 8192, 2048, Kind::normal, true},        // causal-like prefill rows
  };
  if (small_tests()) {
    cases = {{16, 300, 7, Kind::ints, true, 3, 1},   {8, 2049, 2048, Kind::special, false},
             {6, 5000, 64, Kind::normal, true},      {4, 20000, 512, Kind::few, false, 1, 2},
             {300, 17000, 2048, Kind::normal, true, 0, 1}, {3, 0, 5, Kind::normal, false},
             {2, 50001, 512, Kind::ints, false, 1, 3},
             {30, 64, 7, Kind::special, true},       {4, 3001, 7, Kind::equal, true, 5, 3}};
  }
  std::mt19937 rng(31);
  TestStream stream;
  for (const Case& c : cases) {
    const Problem p = make_problem(c, rng);
    expect_same_ids(run_gpu(p, stream), run_cpu(p), c.topk, describe(c));
  }
}

// Scores that differ only in their low bits, so that every radix digit decides, and -0.0 / +0.0
// runs at the boundary of the topk-th key.
TEST(TokenTopKGpu, LowBitsAndSignedZeros) {
  MSA_REQUIRE_GPU();
  std::mt19937 rng(32);
  TestStream stream;
  for (const int topk : {1, 7, 64, 512, 2048}) {
    Case c{4, small_tests() ? 6000 : 30000, topk, Kind::normal, false, 0, 0};
    Problem p = make_problem(c, rng);
    float* x = p.buf.data<float>();
    for (int64_t i = 0; i < p.buf.t.numel(); ++i) {
      const uint32_t pick = rng() % 10;
      if (pick < 6) {
        x[i] = 1.f + float(rng() % 4096) * 0x1.0p-23f;  // one exponent, low mantissa bits
      } else if (pick < 9) {
        x[i] = rng() % 2 ? 0.f : -0.f;
      } else {
        x[i] = -1.f;
      }
    }
    expect_same_ids(run_gpu(p, stream), run_cpu(p), topk, describe(c) + " low bits");
    // A few 2.0 (1 in 64) above runs of -0.0 and +0.0: for topk 512 and 2048 the boundary falls
    // among the zeros, so ties between -0.0 and +0.0 decide by position.
    for (int64_t i = 0; i < p.buf.t.numel(); ++i) x[i] = rng() % 64 == 0 ? 2.f : rng() % 2 ? 0.f : -0.f;
    const int64_t before = std::count_if(x, x + p.buf.t.numel(), [](float v) { return v == 2.f; });
    ASSERT_GT(before, 0);
    expect_same_ids(run_gpu(p, stream), run_cpu(p), topk, describe(c) + " signed zeros");
  }
}

// The threshold's level-0 bucket small enough for the candidate list but all in one or two warp
// segments (a run of close scores at one place in the row): the per-segment candidate shares
// overflow and the kernel refines over the row instead. Also a -inf tail longer than the row's
// other keys fill (the topk-th key would be -inf: every candidate taken).
TEST(TokenTopKGpu, ClusteredBucketAndInfTail) {
  MSA_REQUIRE_GPU();
  std::mt19937 rng(35);
  TestStream stream;
  for (const int64_t cols : {8192, 40000}) {
    const Case c{6, cols, 300, Kind::normal, false, 0, 1};
    Problem p = make_problem(c, rng);
    for (int64_t r = 0; r < c.rows; ++r) {
      float* row = p.buf.data<float>() + c.offset + r * cols;
      const int64_t at = (r * 977) % (cols - 700);
      for (int64_t i = 0; i < 600; ++i) row[at + i] = 100.f + float(rng() % 4096) * 0x1.0p-12f;
    }
    expect_same_ids(run_gpu(p, stream), run_cpu(p), c.topk, describe(c) + " clustered");
    for (int64_t r = 0; r < c.rows; ++r) {  // 200 numbers, the rest -inf or NaN
      float* row = p.buf.data<float>() + c.offset + r * cols;
      for (int64_t i = 0; i < cols; ++i)
        row[i] = i < 200 ? float(int(rng() % 50))
                         : (rng() % 97 == 0 ? std::nanf("") : -std::numeric_limits<float>::infinity());
    }
    expect_same_ids(run_gpu(p, stream), run_cpu(p), c.topk, describe(c) + " -inf tail");
  }
}

// Repeated runs give the same ids bit for bit (the select's shared-memory atomics never decide
// an id).
TEST(TokenTopKGpu, BitwiseRepeatable) {
  MSA_REQUIRE_GPU();
  std::mt19937 rng(33);
  TestStream stream;
  const Case c{16, small_tests() ? 5000 : 40000, 2048, Kind::ints, true, 1, 1};
  const Problem p = make_problem(c, rng);
  const std::vector<int32_t> first = run_gpu(p, stream);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(run_gpu(p, stream), first) << "run " << i + 1;
  expect_same_ids(first, run_cpu(p), c.topk, describe(c));
}

// A bad range is reported through the status buffer, its row written all -1, the others as on
// the CPU; nothing is read or written out of bounds (run under compute-sanitizer).
TEST(TokenTopKGpu, BadRangeReported) {
  MSA_REQUIRE_GPU();
  std::mt19937 rng(34);
  TestStream stream;
  for (const auto& [lo, hi] : {std::pair{30, 20}, std::pair{-5, 10}, std::pair{10, 5001}}) {
    const Case c{4, 5000, 64, Kind::normal, true};
    Problem p = make_problem(c, rng);
    std::vector<int32_t> want = run_cpu(p);  // with the good ranges
    p.ks.data<int32_t>()[2] = lo;
    p.ke.data<int32_t>()[2] = hi;
    std::fill(want.begin() + 2 * c.topk, want.begin() + 3 * c.topk, -1);
    std::vector<int32_t> st;
    const std::vector<int32_t> got = run_gpu(p, stream, &st);
    expect_status(st, StatusCode::key_range_invalid, 2, lo, hi);
    expect_same_ids(got, want, c.topk, describe(c) + " bad range");
  }
}

// Host-side rules of the CUDA path.
TEST(TokenTopKGpu, HostChecks) {
  MSA_REQUIRE_GPU();
  TestStream stream;
  std::mt19937 rng(35);
  const Problem p = make_problem({2, 100, 4, Kind::normal, false}, rng);
  const DeviceTensor dbuf = to_device(p.buf, stream);
  HostTensor ids(DType::i32, {2, 4});
  const DeviceTensor dids = to_device(ids, stream);
  TokenTopKArgs a;
  a.logits = p.logits;
  a.logits.data = dbuf.buf.get();
  a.logits.device = gpu0();
  a.topk = 4;
  a.ids = dids.t;
  try {
    token_topk(a, stream);
    ADD_FAILURE() << "CUDA token_topk without status accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("status (int32[4] on the GPU) is required"),
              std::string::npos) << e.what();
  }
  DeviceBuffer status(16);
  a.status = Tensor(status.get(), DType::i32, {4}, gpu0());
  a.logits.data = static_cast<char*>(dbuf.buf.get()) + 2;
  try {
    token_topk(a, stream);
    ADD_FAILURE() << "a logits pointer off 4-byte alignment accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be 4-byte aligned"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace msa::test
