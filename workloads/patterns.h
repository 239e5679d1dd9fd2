// Synthetic top-K selections for benchmarks (bench/CASES.md, Selection patterns) and the
// attended-pair counts that the FLOP rules need. Shared by the CLI and the GPU benchmarks.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace msa::bench {

// tok: per-token selection; blk: one selection per 128-query block; idx: the project's own
// indexer + top-K (not generated here: the caller runs block_scores and select_topk); ids: token
// ids (kv_block_size 1) per (kv head, query): the kRecentKeys most recent visible keys plus random
// visible ones (the TOKSPARSE-* cases).
enum class Pattern { tok, blk, idx, ids };
const char* pattern_name(Pattern p);
// The block-selection patterns tok, blk and idx, the ones a custom shape of the CLI may take
// (ids runs only as the named TOKSPARSE-* cases); returns false for any other name.
bool parse_pattern(std::string_view name, Pattern* out);

// Pattern::ids: the most recent visible keys every query keeps (a local window), before the
// random ones.
constexpr int kRecentKeys = 128;

// A varlen prefill problem as far as the selection is concerned (host values).
struct SelectionShape {
  std::vector<int64_t> cu_seqlens_q;  // [B+1]
  std::vector<int64_t> cu_seqlens_k;  // [B+1]
  int num_kv_heads = 0;
  int topk = 0;
  int kv_block_size = 128;
  int blk_queries = 128;  // Pattern::blk: consecutive queries of a request sharing one selection
  bool causal = true;
  uint64_t seed = 0;
};

// q2k [Hkv, total_q, topk] int32 for Pattern::tok or Pattern::blk: block 0, the query's diagonal
// block (the one holding its last visible key), the block before it, then distinct random
// visible blocks until topk are chosen (all visible blocks when fewer); ascending, -1 padded.
// Each (kv head, query) row (tok) or (kv head, query block) row (blk) draws from its own
// counter-based random stream, so the result depends only on the shape and the seed.
// Pattern::ids (s.kv_block_size must be 1, else std::invalid_argument): batch-local key ids, the
// kRecentKeys most recent visible keys, then distinct random visible keys until topk (every
// visible key when there are fewer); ascending, -1 padded. Row (h, t) draws key x = next() % m
// from the earlier keys [0, m), m = visible - kRecentKeys, of the same stream as tok and keeps
// the first topk - kRecentKeys distinct draws; bench/peers_toksparse.py repeats this in numpy.
std::vector<int32_t> make_selection(Pattern p, const SelectionShape& s);

// Pair counts of a selection, in (query head, key) pairs: `attended` counts the causally
// visible keys of the selected blocks (the attention FLOP rule of bench/CASES.md: 4 * D *
// attended), `visible` every causally visible key (dense attention). Both are multiplied by
// `group` (G = Hq / Hkv) because the G query heads of a kv head share its selection.
// `selected_keys` counts the (kv head, key) pairs of the blocks that any query of a request
// selected: the K and V rows an attention over the selection must read at least once.
struct PairCounts {
  int64_t attended = 0;
  int64_t visible = 0;
  int64_t selected_keys = 0;
};
PairCounts count_pairs(const std::vector<int32_t>& q2k, const SelectionShape& s, int group);

// A "sparse" benchmark of a selection that covers >= 90% of the causally visible pairs, or whose
// topK reaches the key blocks of the longest request, times dense attention: a warning that
// says so and names the density; empty for a sparse selection.
std::string dense_selection_warning(const PairCounts& p, const SelectionShape& s);

// Exclusive end of the batch-local keys visible to batch-local query i (bottom-right causal
// alignment: docs/semantics.md, Visibility).
int64_t visible_key_end(int64_t i, int64_t lq, int64_t lk, bool causal);

}  // namespace msa::bench
