// The demo's independent correctness check: dense attention restricted to the selected blocks,
// recomputed here in fp64 for a sample of (token, query head) rows and compared with the
// pipeline's out and lse; plus a check that the forced sink/local blocks were selected.
#pragma once

#include <cstdint>
#include <vector>

#include "pipeline.h"

namespace msa::cli {

struct CheckResult {
  int rows = 0;
  double out_rel_l2 = 0;    // ||out - ref|| / ||ref|| over the sampled rows
  double out_max_abs = 0;   // max |out - ref|
  double lse_max_abs = 0;   // max |lse - ref| over rows with a finite reference
  int special_mismatch = 0; // rows where -inf (no key) or NaN disagree with the reference
  int forced_missing = 0;   // sampled rows whose selection lacks a visible sink or diagonal block
  bool pass() const;
};

// The bounds of docs/semantics.md, Numerics, for bf16 outputs.
inline constexpr double kOutRelTol = 1e-2;
inline constexpr double kLseAbsTol = 2e-3;

// q2k: the selection the pipeline attended with, [Hkv, total, topk] on the host.
CheckResult check_sampled_rows(const Shape& s, const HostInputs& in, const std::vector<int32_t>& q2k,
                               const Pipeline& p, int rows);

}  // namespace msa::cli
