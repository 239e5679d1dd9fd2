// The CUDA backend's capability table: ops (or variants) that have no GPU kernel yet raise
// msa::Error naming the missing feature. Entries move to their own folders as kernels land.
#include "backend.h"

namespace msa::cuda {
namespace {
[[noreturn]] void missing(const char* what) {
  fail(what, ": not supported on CUDA yet (run it on CPU tensors, or see the README status table)");
}
}  // namespace

void block_scores(const BlockScoresArgs&, const ProblemShape&, cudaStream_t) { missing("block_scores"); }

}  // namespace msa::cuda
