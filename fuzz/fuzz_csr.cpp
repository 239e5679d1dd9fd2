// Fuzz target over the k2q CSR family on the CPU: build_k2q_csr, q2k_to_k2q_cpu and
// k2q_to_q2k_cpu, and the k2q index attention_forward accepts. For a valid q2k (distinct ids in
// [-1, nblk_b) per row) the build must succeed, its CSR must hold every id once with each row's
// query ids ascending, both converters must agree, and k2q_to_q2k_cpu must give back each row's
// ids ascending and -1 padded. Then one element of the CSR or its schedule is changed: the
// converter and attention must either run or throw msa::Error.
#include <algorithm>
#include <cstdio>

#include "fuzz_input.h"

namespace msa::fuzz {
namespace {

// A property of a valid case failed: a finding, reported as a crash with its input.
#define FUZZ_ASSERT(cond)                                                        \
  do {                                                                           \
    if (!(cond)) {                                                               \
      std::fprintf(stderr, "fuzz_csr: %s failed at line %d\n", #cond, __LINE__); \
      std::abort();                                                              \
    }                                                                            \
  } while (0)

// Row-major contiguous view holding `v`.
Tensor held(Arena& arena, Rng& rng, DType dtype, const std::vector<int64_t>& shape,
            const void* v = nullptr) {
  return arena.view(dtype, shape, Layout{row_major(shape), 0}, v, rng);
}

void run(Input& in) {
  Arena arena;
  Rng rng(in.u32());
  const int64_t batch = in.below(4), hkv = in.range(1, 3), topk = in.range(1, 6);
  const int kbs = in.pick({64, 128});
  const bool paged = in.flag();
  const int64_t page_size = in.pick<int64_t>({16, 64, 128, 256}), max_pages = in.range(0, 4);
  std::vector<int32_t> lq, lk;
  for (int64_t b = 0; b < batch; ++b) {
    lq.push_back(int32_t(in.below(6)));
    lk.push_back(int32_t(paged ? in.range(0, max_pages * page_size) : in.range(0, 700)));
  }
  const std::vector<int32_t> cu_q = cumulative(lq), cu_k = cumulative(lk);
  const int64_t total_q = cu_q.back();
  std::vector<int64_t> nblk(static_cast<size_t>(batch)),
      row_start(static_cast<size_t>(batch) + 1, 0);
  for (int64_t b = 0; b < batch; ++b) {
    nblk[size_t(b)] = (lk[size_t(b)] + kbs - 1) / kbs;
    row_start[size_t(b) + 1] = row_start[size_t(b)] + nblk[size_t(b)];
  }
  const int64_t rows = row_start.back() + in.below(3);

  // q2k: per row distinct ids of the token's batch in the slots the input picks.
  std::vector<int32_t> ids(size_t(hkv * total_q * topk), -1);
  for (int64_t h = 0; h < hkv; ++h)
    for (int64_t b = 0, t = cu_q[0]; b < batch; ++b)
      for (; t < cu_q[size_t(b) + 1]; ++t) {
        int32_t* row = &ids[size_t((h * total_q + t) * topk)];
        for (int64_t s = 0; s < topk; ++s) {
          if (nblk[size_t(b)] == 0 || in.u8() < 64) continue;
          const int32_t id = int32_t(in.below(nblk[size_t(b)]));
          if (std::find(row, row + topk, id) == row + topk) row[s] = id;
        }
      }

  KVCache kv;
  const Tensor cu = held(arena, rng, DType::i32, {batch + 1}, cu_q.data());
  if (paged) {
    kv.layout = KVLayout::paged_nhd;
    // Only the shape of k is read (the page size); its values never are.
    kv.k = QTensor(held(arena, rng, DType::bf16, {1, page_size, hkv, 8}));
    std::vector<int32_t> table(size_t(batch * max_pages), 0);
    kv.page_table = held(arena, rng, DType::i32, {batch, max_pages}, table.data());
    kv.seqused_k = held(arena, rng, DType::i32, {batch}, lk.data());
  } else {
    kv.cu_seqlens_k = held(arena, rng, DType::i32, {batch + 1}, cu_k.data());
  }
  const Tensor q2k = held(arena, rng, DType::i32, {hkv, total_q, topk}, ids.data());
  K2QIndex k2q;
  k2q.row_ptr = held(arena, rng, DType::i32, {hkv, rows + 1});
  k2q.q_idx = held(arena, rng, DType::i32, {hkv, total_q * topk});
  k2q.schedule = held(arena, rng, DType::i32, {k2q_schedule_size(hkv, rows, total_q, topk)});
  if (!arena.ok()) return;

  CsrBuildArgs args;
  args.q2k = q2k;
  args.cu_seqlens_q = cu;
  args.kv = kv;
  args.kv_block_size = kbs;
  args.out = k2q;
  build_k2q_csr(args);  // valid: must not throw

  // The CSR holds every id once, each row's queries ascending, the spare rows empty.
  const int32_t* rp = k2q.row_ptr.ptr<int32_t>();
  const int32_t* qi = k2q.q_idx.ptr<int32_t>();
  for (int64_t h = 0; h < hkv; ++h) {
    const int32_t* r = rp + h * (rows + 1);
    int64_t count = 0;
    for (int64_t t = 0; t < total_q * topk; ++t) count += ids[size_t(h * total_q * topk + t)] >= 0;
    FUZZ_ASSERT(r[0] == 0 && r[rows] == count);
    for (int64_t i = 0; i < rows; ++i) {
      FUZZ_ASSERT(r[i] <= r[i + 1]);
      for (int64_t j = r[i] + 1; j < r[i + 1]; ++j)
        FUZZ_ASSERT(qi[h * total_q * topk + j - 1] < qi[h * total_q * topk + j]);
    }
    for (int64_t i = row_start.back(); i < rows; ++i) FUZZ_ASSERT(r[i] == r[i + 1]);
  }

  // The public converter writes the same CSR.
  const Tensor rp2 = held(arena, rng, DType::i32, {hkv, rows + 1});
  const Tensor qi2 = held(arena, rng, DType::i32, {hkv, total_q * topk});
  if (!arena.ok()) return;
  q2k_to_k2q_cpu(q2k, cu, kv, kbs, rp2, qi2);
  FUZZ_ASSERT(std::equal(rp, rp + hkv * (rows + 1), rp2.ptr<int32_t>()));
  FUZZ_ASSERT(std::equal(qi, qi + hkv * total_q * topk, qi2.ptr<int32_t>()));

  // And back: each row's ids ascending, -1 padded.
  const Tensor back = held(arena, rng, DType::i32, {hkv, total_q, topk});
  if (!arena.ok()) return;
  k2q_to_q2k_cpu(k2q.row_ptr, k2q.q_idx, cu, kv, kbs, back);
  for (int64_t row = 0; row < hkv * total_q; ++row) {
    std::vector<int32_t> want(ids.begin() + row * topk, ids.begin() + (row + 1) * topk);
    std::sort(want.begin(), want.end(),
              [](int32_t x, int32_t y) { return (x < 0) == (y < 0) ? x < y : y < 0; });
    FUZZ_ASSERT(std::equal(want.begin(), want.end(), back.ptr<int32_t>() + row * topk));
  }

  // One element of the CSR or the schedule changed: the converter and attention must either run
  // or throw msa::Error.
  const int64_t which = in.below(3);
  const Tensor& victim = which == 0 ? k2q.row_ptr : which == 1 ? k2q.q_idx : k2q.schedule;
  if (victim.numel() == 0) return;
  const int32_t v = in.pick<int32_t>({-1, 0, 1, 2, 5, INT32_MAX, INT32_MIN, 0x4d534131});
  victim.ptr<int32_t>()[in.below(victim.numel())] = in.flag() ? v : int32_t(in.u32());
  try {
    k2q_to_q2k_cpu(k2q.row_ptr, k2q.q_idx, cu, kv, kbs, back);
  } catch (const Error&) {
  }
  if (paged || in.flag()) return;
  // Flat attention over one head dim of 8 with that index (q2k as above): tiny tensors.
  const int64_t dim = 8;
  AttentionArgs att;
  att.q = held(arena, rng, DType::bf16, {total_q, hkv, dim});
  att.kv = kv;
  att.kv.k = QTensor(held(arena, rng, DType::bf16, {cu_k.back(), hkv, dim}));
  att.kv.v = QTensor(held(arena, rng, DType::bf16, {cu_k.back(), hkv, dim}));
  att.cu_seqlens_q = cu;
  att.q2k = q2k;
  att.k2q = k2q;
  att.params.kv_block_size = kbs;
  att.out = held(arena, rng, DType::bf16, {total_q, hkv, dim});
  if (!arena.ok()) return;
  try {
    attention_forward(att);
  } catch (const Error&) {
  }
}

}  // namespace
}  // namespace msa::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  msa::fuzz::Input in(data, size);
  msa::fuzz::run(in);
  return 0;
}
