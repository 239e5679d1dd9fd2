// The sparse-attention pipeline as the CLI runs it: random bf16 inputs for a varlen prefill
// (Lq = Lk per request) and the four stages block_scores -> select_topk -> build_k2q_csr ->
// attention_forward on one device, each timed on the wall clock. Used by demo and bench.
#pragma once

#include <cstdint>
#include <vector>

#include "workloads/patterns.h"
#include "options.h"
#include "tensors.h"

namespace msa::cli {

// index_topk is block_topk (the indexer fused with top-K) on the index branch, or on q and k
// when the shape has none: it replaces block_scores + select_topk in a serving pipeline.
enum class Stage { block_scores, select_topk, build_k2q_csr, attention_forward, index_topk };
inline constexpr Stage kStages[] = {Stage::block_scores, Stage::select_topk,
                                    Stage::build_k2q_csr, Stage::attention_forward};
inline constexpr Stage kServingStages[] = {Stage::index_topk, Stage::build_k2q_csr,
                                           Stage::attention_forward};
const char* stage_name(Stage s);

// Host copies of the inputs (bf16 bits), kept for the reference check.
struct HostInputs {
  std::vector<uint16_t> q;        // [total, Hq, D]
  std::vector<uint16_t> k, v;     // [total, Hkv, D]
  std::vector<uint16_t> index_q;  // [total, Hi, D] (index branch only)
  std::vector<uint16_t> index_k;  // [total, Hkv, D] (index branch only)
  std::vector<int32_t> cu_seqlens;  // [B+1], shared by queries and keys (Lq = Lk)
};
HostInputs make_inputs(const Shape& s);
int64_t total_tokens(const Shape& s);
bench::SelectionShape selection_shape(const Shape& s);

// Device buffers for one problem plus the argument structs of the four stages.
class Pipeline {
 public:
  Pipeline(const Shape& shape, const HostInputs& in, Device device);
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // Runs one stage, waits for the device, then checks the status buffer (GPU). Returns the
  // stage's wall time in ms (launch to completion; the status check is not timed).
  double run(Stage s);
  // Replaces the top-K output by a given selection [Hkv, total, topk] (tok/blk patterns).
  void set_q2k(const std::vector<int32_t>& q2k);
  std::vector<int32_t> q2k() const;
  // One output row out[t, hq, :] (bf16 bits) and lse[hq, t].
  std::vector<uint16_t> out_row(int64_t t, int64_t hq) const;
  float lse(int64_t t, int64_t hq) const;
  Device device() const { return device_; }

 private:
  void call(Stage s);
  void attention(const Tensor& q, const Tensor& q2k, const K2QIndex& k2q, const Tensor& status);

  Shape shape_;
  Device device_;
  int64_t total_ = 0, nblk_max_ = 0, total_rows_ = 0;
  Buffer q_, k_, v_, cu_, scores_, q2k_, row_ptr_, q_idx_, schedule_, csr_ws_, out_, lse_;
  Buffer attn_ws_, status_, index_q_, index_k_;
  KVCache kv_;
  cudaStream_t stream_ = nullptr;  // a non-blocking stream on the GPU; null (unused) on the CPU
};

}  // namespace msa::cli
