// The one place that defines the k2q work-schedule format (the `schedule` tensor of K2QIndex,
// msa/csr.h). Written by build_k2q_csr, read (and checked for completeness) by attention.
#pragma once

#include <cstdint>

namespace msa::sched {

// Layout of the int32 buffer (the CPU backend's format; a GPU backend may redefine the item
// contents, keeping the header and the completeness rule):
//   [0] kMagic   [1] n_items   then n_items items of kItemInts int32 each:
//   {kv head, CSR row, q_begin, q_end}   with [q_begin, q_end) = that row's slice of q_idx.
// One item per non-empty (kv head, row), in (head, row) order. A schedule is complete when it
// covers every non-empty row exactly once with that row's exact slice; anything else is an
// error for its reader, never a silent fallback.
constexpr int32_t kMagic = 0x4d534131;  // "MSA1"
constexpr int64_t kHeaderInts = 2;
constexpr int64_t kItemInts = 4;

struct WorkItem {
  int32_t head;     // kv head
  int32_t row;      // CSR row r = rowoff_b + kb
  int32_t q_begin;  // row_ptr[head, row]
  int32_t q_end;    // row_ptr[head, row + 1]
};
static_assert(sizeof(WorkItem) == kItemInts * sizeof(int32_t), "WorkItem must be 4 packed int32");

// Upper bound on the buffer's int32 elements: every (head, row) non-empty.
inline int64_t max_schedule_ints(int64_t num_kv_heads, int64_t total_rows) {
  return kHeaderInts + kItemInts * num_kv_heads * total_rows;
}

}  // namespace msa::sched
