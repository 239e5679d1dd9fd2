// The named benchmark cases of bench/CASES.md as data: shape, selection pattern, what is timed
// and which GPU op they need. Shared by `msa bench` and the GPU benchmark programs.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "workloads/patterns.h"

namespace msa::bench {

enum class CaseKind {
  sparse_prefill,  // sparse attention forward on flat KV
  csr_build,       // q2k -> k2q CSR + schedule
  block_scores,    // indexer (and fused top-K)
  end_to_end,      // indexer + top-K + CSR + attention
  decode,          // sparse or dense paged decode
  latency,         // host and GPU time per call of small problems, launches per call
};
const char* case_kind_name(CaseKind k);

// A case's problem besides its lengths: heads, head dim, selection and seed. The CLI's shape
// (tools/cli/options.h) shares it, so that a case and a shape convert in one assignment.
struct CaseShape {
  int num_q_heads = 64, num_kv_heads = 4, head_dim = 128;
  int topk = 16, kv_block_size = 128;
  bool causal = true;
  Pattern pattern = Pattern::tok;
  int blk_queries = 128;             // Pattern::blk: consecutive queries sharing one selection
  uint64_t seed = 1;                 // inputs and selection (fixed: every run selects the same)
  bool operator==(const CaseShape&) const = default;
};

struct BenchCase : CaseShape {
  std::string name;
  CaseKind kind = CaseKind::sparse_prefill;
  std::string timed;                 // the timed op, as bench/CASES.md says it
  std::vector<int64_t> seqlens_q;    // per request
  std::vector<int64_t> seqlens_k;    // per request
  bool dense = false;                // decode or prefill over every key (no selection)
  int page_size = 0;                 // > 0: paged KV (decode cases, LAT-CHUNK)
  std::string kv_dtypes = "bf16";    // comma list of variants: "bf16", "fp8", "bf16,fp8", "fp8q", "nvfp4"
  std::string needs;                 // the GPU op the case needs, for "no backend" messages
};

// Every case of bench/CASES.md, in its table order.
const std::vector<BenchCase>& bench_cases();
// nullptr when no case has that name (exact match).
const BenchCase* find_case(std::string_view name);
// Whether the comma list `list` (BenchCase::kv_dtypes) holds `name` as one entry.
bool has_dtype(std::string_view list, std::string_view name);
// One line, e.g. "B=1 S=32768 Hq=64 Hkv=4 D=128 blk=128 topK=16 tok causal bf16".
std::string describe_shape(const BenchCase& c);

}  // namespace msa::bench
