// The device status buffer (common.h): the description of an offence. Checking and resetting a
// buffer are entry points of src/api/status.cpp (CUDA buffers go through the backend).
#include "msa/common.h"

namespace msa {

std::string describe_status(const int32_t s[4]) {
  switch (static_cast<StatusCode>(s[0])) {
    case StatusCode::ok: return "ok";
    case StatusCode::block_id_out_of_range:
      return detail::concat("q2k: block id out of range at (head ", s[1], ", token ", s[2],
                            ", slot ", s[3], ")");
    case StatusCode::block_id_repeated:
      return detail::concat("q2k: block id repeated within a row at (head ", s[1], ", token ",
                            s[2], ", slot ", s[3], ")");
    case StatusCode::page_id_out_of_range:
      return detail::concat("page_table: page id ", s[3], " out of range [0, num_pages) at (batch ",
                            s[1], ", column ", s[2], ")");
    case StatusCode::bad_cu_seqlens:
      return detail::concat(s[1] == 0 ? "cu_seqlens_q" : "cu_seqlens_k",
                            ": must start at 0 and be non-decreasing; broken at batch ", s[2]);
    case StatusCode::schedule_incomplete:
      return detail::concat("schedule: incomplete, ", s[2], " of ", s[1], " work items present");
    case StatusCode::negative_scale:
      return detail::concat(s[1] == 0 ? "q.scale" : "k.scale",
                            ": FP8 scales must be finite and >= 0; negative or not finite at (token ",
                            s[2], ", head ", s[3], ")");
    case StatusCode::k2q_mismatch:
      if (s[2] < 0)
        return detail::concat("k2q: does not match q2k for kv head ", s[1],
                              " (its entry count differs from the q2k ids in range); build it with "
                              "build_k2q_csr from the same q2k");
      return detail::concat("k2q: does not match q2k at (head ", s[1], ", row ", s[2],
                            "); build it with build_k2q_csr from the same q2k");
    case StatusCode::kv_length_past_plan:
      return detail::concat("seqused_k: request ", s[1], " has ", s[2],
                            " keys, past the planned capacity ", s[3],
                            "; the keys past it were not attended (call plan() again with the new "
                            "lengths)");
    case StatusCode::queries_past_plan:
      return detail::concat("cu_seqlens_q: request ", s[1], " has ", s[2],
                            " queries, more than the planned max_queries_per_request = ", s[3],
                            "; the queries past it were not computed (call plan() again)");
    case StatusCode::csr_rows_short:
      return detail::concat("row_ptr: has ", s[2], " rows, fewer than the ", s[1],
                            " kv blocks of the batches (sum_b ceil(Lk_b / kv_block_size)); size it "
                            "for an upper bound such as total_k / kv_block_size + B");
    case StatusCode::key_range_invalid:
      return detail::concat("ks, ke: row ", s[1], " must satisfy 0 <= ks <= ke <= S, got [", s[2],
                            ", ", s[3], "); the row was taken as empty (mqa_logits: -inf when "
                            "clean, else unwritten; token_topk: ids all -1)");
    case StatusCode::seq_len_invalid:
      return detail::concat("seq_lens: entry ", s[1], " = ", s[2], " must be in [0, max_seq_len = ",
                            s[3], "]; its rows were computed as empty");
    case StatusCode::block_table_narrow:
      return detail::concat("block_tables: ", s[3], " columns cannot hold batch ", s[1], "'s keys (",
                            s[2], " blocks needed); the keys past the table were not read");
    case StatusCode::kv_length_past_table:
      return detail::concat("seqused_k: batch ", s[1], " has ", s[2], " keys, more than its page "
                            "table holds (max_pages * page_size = ", s[3], "); the keys past the "
                            "table were not read");
    case StatusCode::row_request_invalid:
      return detail::concat("row_requests: row ", s[1], " names request ", s[2], ", outside [0, B = ",
                            s[3], "); the row was computed as empty");
    case StatusCode::row_len_invalid:
      return detail::concat("row_lens: row ", s[1], " = ", s[2], " must be in [0, seq_lens of its "
                            "request = ", s[3], "]; the row was computed as empty");
    case StatusCode::row_past_scores:
      return detail::concat("scores: row ", s[1], " sees ", s[2], " keys, more than the ", s[3],
                            " columns; the keys past them were not scored");
    case StatusCode::sample_offset_invalid:
      return detail::concat("offsets: entry ", s[1], " = ", s[2], " must be in [0, stride = ", s[3],
                            "); the request's sample is empty");
    case StatusCode::sample_past_capacity:
      return detail::concat("sample: request ", s[1], " has ", s[2], " samples, more than S = ", s[3],
                            "; its sample is empty");
    case StatusCode::slot_out_of_range:
      return detail::concat("slots: entry ", s[1], " = ", s[2], " is past the cache's ", s[3],
                            " slots (num_pages * page_size); the key was not written");
    case StatusCode::key_mask_short:
      return detail::concat("key_mask: Lk_max = ", s[3], " (its last dim) is less than the ", s[2],
                            " keys of batch ", s[1], "; the keys past it were masked");
    case StatusCode::offence_pending:
      return "an op found an invalid index but its last kernel, which locates it, has not run";
    case StatusCode::position_out_of_range:
      return detail::concat("positions: id ", s[3], " at row ", s[1], " (kv head * rows + row) entry ",
                            s[2], " is outside [-1, the keys: W * page_size, or 2^31 - 1 for "
                            "group_union_masks)");
    case StatusCode::position_repeated:
      return detail::concat("positions: id ", s[2], " is repeated in row ", s[1],
                            " (kv head * rows + row), again at entry ", s[3]);
    case StatusCode::request_out_of_range:
      return detail::concat("requests[", s[1], "] = ", s[2], ": must be in [0, ", s[3],
                            ") (the requests of block_table)");
    case StatusCode::seq_len_out_of_range:
      return detail::concat("seq_lens[", s[1], "] = ", s[2], ": must be in [0, ", s[3],
                            "] (block_table's W pages of page_size)");
    case StatusCode::position_past_seq_len:
      return detail::concat("positions: id ", s[3], " at row ", s[1], " (kv head * rows + row) entry ",
                            s[2], " is at or past seq_lens of the row's request");
    case StatusCode::page_id_invalid:
      return detail::concat("block_table[", s[1], ", ", s[2], "] = ", s[3], ": the page of a used "
                            "position must be a page id >= 0 whose slots (id * page_size + "
                            "page_size - 1) fit int32");
    case StatusCode::groups_past_capacity:
      return detail::concat("group_rows: the requests form ", s[1], " groups, more than the ", s[2],
                            " the outputs hold (union_keys' groups); size them for an upper bound "
                            "such as min(rows, (rows + B * (group_size - 1)) / group_size)");
    case StatusCode::union_past_capacity:
      return detail::concat("max_union = ", s[3], ": the union of group ", s[2], " (kv head ", s[1],
                            ") has more keys; its outputs were written empty");
    case StatusCode::icp_nan_score:
      return detail::concat("icp_rank_lists: the group score of block ", s[3], " for token ", s[1],
                            " (selection head ", s[2], ") is NaN (a NaN in index_q or in a key): "
                            "the sharded selection cannot equal block_topk's");
    case StatusCode::icp_list_invalid:
      return detail::concat("icp_merge: ids[", s[1], "] row ", s[2], " entry ", s[3],
                            " is not a list entry (rows list distinct visible, not forced blocks "
                            "with non-NaN scores within the quota, then -1); it was skipped");
    case StatusCode::shape_mismatch:
      return detail::concat("shape mismatch detected on device (", s[1], ", ", s[2], ", ", s[3], ")");
  }
  return detail::concat("unknown status code ", s[0]);
}

}  // namespace msa
