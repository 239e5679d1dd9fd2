// The one-call pipeline on the GPU, captured once into a CUDA graph and replayed with new inputs:
// every replay matches the CPU pipeline on the same inputs (identical q2k: integer-valued q and
// k make every block score exact on both sides; out within the tolerances of docs/semantics.md,
// Numerics).
#include <cmath>
#include <numeric>
#include <random>

#include "common/codecs.h"
#include "support/device_tensor.h"

namespace msa::test {
namespace {

constexpr int64_t kD = 128, kHq = 16, kHkv = 2;
constexpr int kTopK = 4;

void fill(HostTensor& t, std::mt19937& rng, bool integer) {
  std::normal_distribution<float> nd;
  for (int64_t i = 0; i < t.t.numel(); ++i)
    t.data<uint16_t>()[i] = codec::float_to_bf16(integer ? float(int(rng() % 5) - 2) : nd(rng));
}

// Replays of one captured pipeline against the CPU pipeline on the same inputs. index_heads:
// separate indexer inputs in the serving geometry of DESIGN section 13 (4 index heads on 1 index
// key head for the 2 kv heads: block scores, then select_topk).
void expect_graph_replays_match_cpu(const std::vector<int32_t>& lq, const std::vector<int32_t>& lk,
                                    bool index_heads = false) {
  const int64_t tq = std::accumulate(lq.begin(), lq.end(), int64_t(0));
  const int64_t tk = std::accumulate(lk.begin(), lk.end(), int64_t(0));
  HostTensor q(DType::bf16, {tq, kHq, kD}), k(DType::bf16, {tk, kHkv, kD}), v(DType::bf16, {tk, kHkv, kD});
  const HostTensor cu_q = i32_tensor(cumulative(lq)), cu_k = i32_tensor(cumulative(lk));
  TestStream stream;
  DeviceBuffer dq(q.bytes()), dk(k.bytes()), dv(v.bytes()), dcq(cu_q.bytes()), dck(cu_k.bytes()),
      dout(size_t(tq) * kHq * kD * 2), dlse(size_t(kHq) * tq * 4), dst(16);
  copy_to_device(cu_q, dcq, stream);
  copy_to_device(cu_k, dck, stream);

  PipelineArgs a;
  a.q = on_device(q, dq);
  a.kv.k = on_device(k, dk);
  a.kv.v = on_device(v, dv);
  a.kv.cu_seqlens_k = on_device(cu_k, dck);
  a.cu_seqlens_q = on_device(cu_q, dcq);
  a.topk = kTopK;
  a.out = Tensor(dout.get(), DType::bf16, {tq, kHq, kD}, gpu0());
  a.lse = Tensor(dlse.get(), DType::f32, {kHq, tq}, gpu0());
  a.status = Tensor(dst.get(), DType::i32, {4}, gpu0());
  HostTensor iq(DType::bf16, {tq, 4, kD}), ik(DType::bf16, {tk, 1, kD});
  DeviceBuffer diq(iq.bytes()), dik(ik.bytes());
  if (index_heads) {
    a.index_q = on_device(iq, diq);
    a.index_k = on_device(ik, dik);
  }
  // The workspace is poisoned (0xff: NaN, -1) before every run, so a read of anything the call
  // did not write this run shows in the outputs. (It also makes initcheck see the workspace as
  // initialized: initcheck does not track TMA stores, CONTRIBUTING.md, Sanitizers.)
  DeviceBuffer ws(pipeline_workspace_bytes(a));
  a.workspace = Tensor(ws.get(), DType::u8, {int64_t(ws.bytes())}, gpu0());
  ws.poison(stream);

  std::mt19937 rng(9);
  auto upload_inputs = [&] {
    fill(q, rng, true);
    fill(k, rng, true);
    fill(v, rng, false);
    if (index_heads) {
      fill(iq, rng, true);
      fill(ik, rng, true);
      copy_to_device(iq, diq, stream);
      copy_to_device(ik, dik, stream);
    }
    copy_to_device(q, dq, stream);
    copy_to_device(k, dk, stream);
    copy_to_device(v, dv, stream);
  };
  upload_inputs();
  clear_status(a.status, stream);
  sparse_attention_pipeline(a, stream);  // warm-up outside the capture (driver entry points)
  check_status(a.status, stream);

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  MSA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  sparse_attention_pipeline(a, stream);
  MSA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  // The launch budget of the pipeline (flat KV): the indexer and top-K (one fused kernel, or
  // block_scores and select_topk), then attention's fused prep, main kernels and combine.
  expect_launch_budget(graph, 6);
  MSA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    upload_inputs();
    dout.poison(stream);
    dlse.poison(stream);
    ws.poison(stream);
    MSA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    check_status(a.status, stream);

    HostTensor out(DType::bf16, {tq, kHq, kD}), lse(DType::f32, {kHq, tq});
    PipelineArgs c = a;
    c.q = q.t;
    c.kv.k = k.t;
    c.kv.v = v.t;
    c.kv.cu_seqlens_k = cu_k.t;
    c.cu_seqlens_q = cu_q.t;
    c.out = out.t;
    c.lse = lse.t;
    c.status = Tensor();
    if (index_heads) {
      c.index_q = iq.t;
      c.index_k = ik.t;
    }
    HostTensor cws(DType::u8, {int64_t(pipeline_workspace_bytes(c))});
    c.workspace = cws.t;
    sparse_attention_pipeline(c);

    const auto q2k = ws.download<int32_t>(size_t(kHkv * tq * kTopK), stream);
    EXPECT_EQ(0, std::memcmp(q2k.data(), cws.data<int32_t>(), q2k.size() * 4)) << "q2k differs";
    const auto got = dout.download<uint16_t>(size_t(out.t.numel()), stream);
    const auto got_lse = dlse.download<float>(size_t(lse.t.numel()), stream);
    double num = 0, den = 0, lse_err = 0;
    int64_t bad = 0;
    for (int64_t i = 0; i < out.t.numel(); ++i) {
      const double x = codec::bf16_to_float(got[i]), r = codec::bf16_to_float(out.data<uint16_t>()[i]);
      bad += std::isnan(x);
      num += (x - r) * (x - r);
      den += r * r;
    }
    for (int64_t i = 0; i < lse.t.numel(); ++i) {
      const float x = got_lse[i], r = lse.data<float>()[i];
      if (std::isinf(r) || std::isinf(x)) bad += (x != r);
      else lse_err = std::max(lse_err, double(std::fabs(x - r)));
    }
    EXPECT_EQ(bad, 0) << "NaN, unwritten or misplaced -inf";
    EXPECT_LE(std::sqrt(num / std::max(den, 1e-30)), 1e-2);
    EXPECT_LE(lse_err, 2e-3);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST(PipelineGpu, GraphReplaysWithNewInputs) {
  MSA_REQUIRE_GPU();
  expect_graph_replays_match_cpu({300, 200}, {700, 500});
}

TEST(PipelineGpu, IndexHeadsOfTheServingGeometry) {
  MSA_REQUIRE_GPU();
  expect_graph_replays_match_cpu({300, 200}, {700, 500}, true);
}

// topK x 128 >= total_k: the pipeline's attention is dense (every visible block is selected),
// captured and replayed the same way; the selection is still written.
TEST(PipelineGpu, ShortRequestsRunDense) {
  MSA_REQUIRE_GPU();
  expect_graph_replays_match_cpu({100, 60, 0}, {300, 60, 152});
  expect_graph_replays_match_cpu({100, 60, 0}, {300, 60, 152}, true);  // 4 index heads on 1
}

// A short workspace is reported before any launch, naming the size function the caller used and
// its figure: the pipeline's for the pipeline (attention gets its remainder), attention's for a
// direct call. No query needs no workspace.
TEST(PipelineGpu, ShortWorkspaceNamesItsSizeFunction) {
  MSA_REQUIRE_GPU();
  const std::vector<int32_t> lq = {40}, lk = {300};
  HostTensor q(DType::bf16, {40, kHq, kD}), k(DType::bf16, {300, kHkv, kD}), v(DType::bf16, {300, kHkv, kD});
  const HostTensor cu_q = i32_tensor(cumulative(lq)), cu_k = i32_tensor(cumulative(lk));
  std::mt19937 rng(3);
  fill(q, rng, false);
  fill(k, rng, false);
  fill(v, rng, false);
  TestStream stream;
  const DeviceTensor dq = to_device(q, stream), dk = to_device(k, stream), dv = to_device(v, stream),
                     dcq = to_device(cu_q, stream), dck = to_device(cu_k, stream);
  DeviceBuffer dout(size_t(40) * kHq * kD * 2), dst(16), dq2k(size_t(kHkv) * 40 * kTopK * 4);
  PipelineArgs a;
  a.q = dq.t;
  a.kv.k = dk.t;
  a.kv.v = dv.t;
  a.kv.cu_seqlens_k = dck.t;
  a.cu_seqlens_q = dcq.t;
  a.topk = kTopK;
  a.out = Tensor(dout.get(), DType::bf16, {40, kHq, kD}, gpu0());
  a.status = Tensor(dst.get(), DType::i32, {4}, gpu0());
  clear_status(a.status, stream);
  auto expect_short = [](auto&& call, const std::string& want) {
    try {
      call();
      ADD_FAILURE() << "expected msa::Error: " << want;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  const size_t need = pipeline_workspace_bytes(a);
  DeviceBuffer ws(need);
  a.workspace = Tensor(ws.get(), DType::u8, {int64_t(need) - 1}, gpu0());
  expect_short([&] { sparse_attention_pipeline(a, stream); },
               "workspace: needs pipeline_workspace_bytes(args) = " + std::to_string(need));

  AttentionArgs f;
  f.q = a.q;
  f.kv = a.kv;
  f.cu_seqlens_q = a.cu_seqlens_q;
  f.q2k = Tensor(dq2k.get(), DType::i32, {kHkv, 40, kTopK}, gpu0());
  f.out = a.out;
  f.status = a.status;
  const size_t attn_need = attention_workspace_bytes(f);
  ASSERT_GT(attn_need, 1u);
  f.workspace = Tensor(ws.get(), DType::u8, {int64_t(attn_need) - 1}, gpu0());
  expect_short([&] { attention_forward(f, stream); },
               "workspace: needs attention_workspace_bytes(args) = " + std::to_string(attn_need));
  f.workspace = Tensor();
  expect_short([&] { attention_forward(f, stream); }, "got none");

  // No query: nothing to plan, no workspace needed.
  const HostTensor cu_empty = i32_tensor({0, 0});
  const DeviceTensor dce = to_device(cu_empty, stream);
  f.q = Tensor(dq.t.data, DType::bf16, {0, kHq, kD}, gpu0());
  f.cu_seqlens_q = dce.t;
  f.q2k = Tensor(dq2k.get(), DType::i32, {kHkv, 0, kTopK}, gpu0());
  f.out = Tensor(dout.get(), DType::bf16, {0, kHq, kD}, gpu0());
  EXPECT_NO_THROW(attention_forward(f, stream));
  check_status(a.status, stream);
}

}  // namespace
}  // namespace msa::test
