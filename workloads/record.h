// The benchmark record of bench/SCHEMA.md: one JSON object per timed op, appended as one line
// to a JSON Lines file by the benchmark programs and `msa bench --json` (the peers' scripts write
// the same fields through bench/records.py). Every field that records share is written here,
// so that a record means the same whichever program wrote it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace msa::bench {

struct BenchCase;
struct PairCounts;

// Insertion-ordered, so a record reads in the order SCHEMA.md lists its fields.
using Json = nlohmann::ordered_json;

// SCHEMA.md's version; a change of a field's name, type or meaning bumps it.
inline constexpr int kRecordSchema = 1;

// schema, case, impl ("msa" or the peer's name), op (what is timed, e.g. attention_forward).
Json new_record(std::string_view case_name, std::string_view op, std::string_view impl = "msa");

// The shape of a case: batch, seq_q, seq_k (per request; the longest when they differ, and then
// seqlens_q and seqlens_k too), hq, hkv, d, blk, topk (0: dense), pattern ("dense" for a dense
// case), causal, and page_size for paged KV.
void add_shape(Json& r, const BenchCase& c);

// dtypes: {"q", "kv"} (msa::dtype_name spellings) plus "scales" (token, tensor, slot) when
// quantized.
void add_dtypes(Json& r, std::string_view q, std::string_view kv, std::string_view scales = {});

struct Times {
  double median_ms = 0, min_ms = 0, max_ms = 0;
};
// Which rate a reader should look at first: compute-bound ops in TFLOP/s, bandwidth-bound ones
// (top-K, CSR, decode) in TB/s.
enum class Metric { tflops, tbps };

// median_ms, min_ms, max_ms, iters, warmup, flop, bytes, tflops, tbps and metric. A count of 0
// means "not counted": it and its rate are null.
void add_timing(Json& r, const Times& t, int iters, int warmup, double flop, double bytes,
                Metric headline);

// pairs: {attended, visible, selected_keys} (patterns.h, PairCounts) and density, attended
// over visible: what the FLOP counts of a selection rest on.
void add_pairs(Json& r, const PairCounts& p);

enum class Check { passed, failed, skipped };
inline Check check_result(bool ran, bool ok) {
  return !ran ? Check::skipped : ok ? Check::passed : Check::failed;
}
// check, and the measured errors behind it ("errors": {name: value}) when given.
void add_check(Json& r, Check c, const Json& errors = Json());

// The run's environment, last in every record: flush (memset, read or none), commit, device
// (gpu or cpu), gpu (name), driver ({"cuda": "13.0", "nvidia": "570.86.15"}), cuda (runtime
// version) and date (UTC ISO 8601). A CPU run has null gpu, driver and cuda.
void add_environment(Json& r, bool on_gpu, std::string_view flush);

// The git commit this program was built from ("<hash>", "<hash>-dirty" or "unknown"), or the
// environment variable MSA_COMMIT when set: binaries carried to another machine keep their
// build's hash, and a caller that knows better can say so.
std::string build_commit();

// Appends r as one line of the JSON Lines file at path; msa::Error when it cannot be written.
void append_record(const std::string& path, const Json& r);

}  // namespace msa::bench
