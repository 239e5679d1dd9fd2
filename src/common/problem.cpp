// Geometry helpers of common/problem.h.
#include "common/problem.h"

namespace msa {

std::vector<int64_t> host_key_lengths(const KVCache& kv, const ProblemShape& s) {
  std::vector<int64_t> lk(s.batch);
  for (int64_t b = 0; b < s.batch; ++b) {
    if (kv.layout == KVLayout::flat) {
      const int32_t* c = kv.cu_seqlens_k.ptr<int32_t>();
      lk[b] = c[b + 1] - c[b];
    } else {
      lk[b] = kv.seqused_k.defined() ? kv.seqused_k.ptr<int32_t>()[b] : s.max_pages * s.page_size;
    }
  }
  return lk;
}

void check_cuda_group(int64_t group, const char* op) {
  MSA_CHECK(group == 1 || group == 2 || group == 4 || group == 8 || group == 16, op,
            ": the CUDA kernels take a GQA group Hq/Hkv of 1, 2, 4, 8 or 16 so far, got ", group,
            "; other groups run on CPU tensors");
}

}  // namespace msa
