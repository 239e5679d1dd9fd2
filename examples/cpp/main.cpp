// A minimal msa user on the CPU: sparse attention whose q2k selects every key block must equal
// dense attention (no q2k), and a bad argument must throw msa::Error naming it.
// Prints "msa consumer OK" and exits 0 on success, exits 1 otherwise.
#include <msa/msa.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

// bf16 is stored as the high 16 bits of an f32 (round to nearest even).
uint16_t to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// Deterministic values in [-1, 1).
std::vector<uint16_t> random_bf16(size_t n, uint32_t seed) {
  std::vector<uint16_t> v(n);
  for (auto& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = to_bf16(static_cast<float>(seed >> 8) / 8388608.f - 1.f);
  }
  return v;
}

int fail(const std::string& why) {
  std::fprintf(stderr, "msa consumer FAILED: %s\n", why.c_str());
  return 1;
}

}  // namespace

int main() {
  // One causal request of T tokens; GQA with 2 query heads per kv head; 2 key blocks of 128.
  const int64_t T = 256, Hq = 4, Hkv = 2, D = 64, nblk = 2;
  std::vector<uint16_t> q = random_bf16(T * Hq * D, 1), k = random_bf16(T * Hkv * D, 2),
                        v = random_bf16(T * Hkv * D, 3);
  std::vector<int32_t> cu = {0, static_cast<int32_t>(T)};  // cu_seqlens of queries and keys

  msa::AttentionArgs args;
  args.q = msa::Tensor(q.data(), msa::DType::bf16, {T, Hq, D});
  args.kv.k = msa::Tensor(k.data(), msa::DType::bf16, {T, Hkv, D});
  args.kv.v = msa::Tensor(v.data(), msa::DType::bf16, {T, Hkv, D});
  args.kv.cu_seqlens_k = msa::Tensor(cu.data(), msa::DType::i32, {2});
  args.cu_seqlens_q = args.kv.cu_seqlens_k;

  // Dense: no q2k, every visible key.
  std::vector<uint16_t> dense(T * Hq * D), sparse(T * Hq * D);
  args.out = msa::Tensor(dense.data(), msa::DType::bf16, {T, Hq, D});
  msa::attention_forward(args);

  // Sparse: every (kv head, query) selects both blocks; the causal mask still applies inside them.
  std::vector<int32_t> q2k(Hkv * T * nblk);
  for (size_t i = 0; i < q2k.size(); ++i) q2k[i] = static_cast<int32_t>(i % nblk);
  args.q2k = msa::Tensor(q2k.data(), msa::DType::i32, {Hkv, T, nblk});
  args.out = msa::Tensor(sparse.data(), msa::DType::bf16, {T, Hq, D});
  msa::attention_forward(args);

  double diff = 0, norm = 0;
  for (size_t i = 0; i < dense.size(); ++i) {
    const double a = from_bf16(sparse[i]), b = from_bf16(dense[i]);
    diff += (a - b) * (a - b);
    norm += b * b;
  }
  const double rel_l2 = std::sqrt(diff / norm);
  if (!(rel_l2 <= 1e-3)) return fail("sparse vs dense relative L2 error " + std::to_string(rel_l2));

  // A wrong shape is refused with an msa::Error whose message names the argument.
  std::vector<float> lse(Hq * (T + 1));
  args.lse = msa::Tensor(lse.data(), msa::DType::f32, {Hq, T + 1});
  try {
    msa::attention_forward(args);
    return fail("a bad lse shape was accepted");
  } catch (const msa::Error& e) {
    if (std::string(e.what()).find("lse:") == std::string::npos)
      return fail(std::string("the error does not name lse: ") + e.what());
  }

  std::printf("msa consumer OK (msa %s, sparse vs dense relative L2 %.2e)\n", msa::kVersion, rel_l2);
  return 0;
}
