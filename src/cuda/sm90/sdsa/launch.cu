// The SDSA indexer's CUDA entry points (msa/sdsa.h). The kernels are not written yet: each entry
// raises msa::Error naming the op, so a CUDA call never falls back to another path silently.
#include "backend.h"

namespace msa::cuda {
namespace {
[[noreturn]] void not_yet(const char* op) {
  fail(op, ": not yet on CUDA (the SDSA indexer runs on the CPU only so far); pass CPU tensors");
}
}  // namespace

void indexer_scores(const IndexerScoresArgs&, const ProblemShape&, cudaStream_t) {
  not_yet("indexer_scores");
}
void indexer_threshold_select(const ThresholdSelectArgs&, const ProblemShape&, cudaStream_t) {
  not_yet("indexer_threshold_select");
}
void top_k_from_candidates(const TopKFromCandidatesArgs&, cudaStream_t) {
  not_yet("top_k_from_candidates");
}
void gather_key_sample(const GatherKeySampleArgs&, const ProblemShape&, cudaStream_t) {
  not_yet("gather_key_sample");
}
void thresholds_from_sample(const ThresholdsFromSampleArgs&, cudaStream_t) {
  not_yet("thresholds_from_sample");
}
void quantize_write_index_qk_nvfp4(const QuantizeIndexQKArgs&, cudaStream_t) {
  not_yet("quantize_write_index_qk_nvfp4");
}

}  // namespace msa::cuda
