// Shared helpers of the GPU tests: skip without a device, the owning device buffer (with its NaN
// poisoning), a test stream (never the legacy default stream), the status-word check, the small-run switch.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <vector>

#include "cuda/device/check.h"
#include "msa/msa.h"
#include "workloads/device_buffer.h"
#include "workloads/gpu_timing.h"

namespace msa::test {

// Use at the top of every GPU test body.
#define MSA_REQUIRE_GPU()                                                  \
  do {                                                                     \
    if (::msa::cuda_device_count() == 0)                                   \
      GTEST_SKIP() << "no CUDA device: skipping GPU test";                 \
  } while (0)

// The owning device buffer the benchmark runners and the CLI use too (library entry points never
// allocate).
using bench::DeviceBuffer;

// The nodes of a captured graph (kernels, memsets, others): the launch budgets of the calls are
// asserted on them (a prefill call at most 4 kernels, the pipeline 6, decode run() 2, no memset).
using bench::graph_nodes;
using bench::GraphNodes;

// A captured call within its launch budget: at most `max_kernels` kernel nodes and no memset or
// other node.
inline void expect_launch_budget(cudaGraph_t graph, int max_kernels) {
  const GraphNodes nodes = graph_nodes(graph);
  EXPECT_LE(nodes.kernels, max_kernels);
  EXPECT_EQ(nodes.memsets + nodes.others, 0) << "memset or other graph nodes";
}

// A non-blocking stream for each test.
class TestStream {
 public:
  TestStream() { MSA_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~TestStream() { cudaStreamDestroy(s_); }
  operator cudaStream_t() const { return s_; }  // NOLINT

 private:
  cudaStream_t s_{};
};

inline Device gpu0() { return {DeviceType::cuda, 0}; }

// The status words {code, a, b, c} a device check wrote: offence `code` at (a, b, c).
inline void expect_status(const std::vector<int32_t>& st, StatusCode code, int32_t a, int32_t b,
                          int32_t c) {
  EXPECT_EQ(st[0], int32_t(code)) << describe_status(st.data());
  EXPECT_EQ(std::make_tuple(st[1], st[2], st[3]), std::make_tuple(a, b, c));
}

// MSA_TEST_SMALL=1: small sizes and few configurations (for compute-sanitizer runs).
inline bool small_tests() {
  const char* e = std::getenv("MSA_TEST_SMALL");
  return e != nullptr && e[0] == '1';
}

}  // namespace msa::test
