// The one-call pipeline on the GPU, captured once into a CUDA graph and replayed with new inputs:
// every replay matches the CPU pipeline on the same inputs (identical q2k: integer-valued q and
// k make every block score exact on both sides; out within the tolerances of docs/semantics.md,
// Numerics).
#include <cmath>
#include <initializer_list>
#include <numeric>
#include <random>

#include "common/codecs.h"
#include "support/attention_problem.h"
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

// The GPU's out and lse (downloaded) against the CPU pipeline's: no NaN, no unwritten row or
// misplaced -inf, out within the bf16 tolerance of docs/semantics.md (Numerics).
void expect_outputs_match(const DeviceBuffer& dout, const DeviceBuffer& dlse, const HostTensor& out,
                          const HostTensor& lse, cudaStream_t stream) {
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

// One run of the pipeline outside a capture (driver entry points; its status checked), then a
// capture of it within the pipeline's launch budget: the indexer and top-K (one fused kernel, or
// block_scores and select_topk; paged, the page check left to attention's prep), then attention's
// fused prep, main kernels and combine, at most 6 kernels and no memset. Returns the instantiated
// graph.
cudaGraphExec_t capture_within_budget(const PipelineArgs& a, cudaStream_t stream) {
  clear_status(a.status, stream);
  sparse_attention_pipeline(a, stream);
  check_status(a.status, stream);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  MSA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  sparse_attention_pipeline(a, stream);
  MSA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  expect_launch_budget(graph, 6);
  MSA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaGraphDestroy(graph);
  return exec;
}

// One replay of `exec` with its outputs and workspace poisoned (0xff: NaN, -1) first, so a read
// of anything the call did not write this run shows; its status checked.
void replay_poisoned(cudaGraphExec_t exec, std::initializer_list<DeviceBuffer*> poisoned,
                     const Tensor& status, cudaStream_t stream) {
  for (DeviceBuffer* b : poisoned) b->poison(stream);
  MSA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  check_status(status, stream);
}

// The CPU pipeline on `c` (the GPU call's arguments with host inputs): the GPU's q2k (at the
// start of its workspace `ws`) identical, its out and lse within the tolerances.
void expect_matches_cpu_pipeline(PipelineArgs c, const DeviceBuffer& ws, const DeviceBuffer& dout,
                                 const DeviceBuffer& dlse, cudaStream_t stream) {
  const int64_t tq = c.q.shape[0];
  HostTensor out(DType::bf16, {tq, kHq, kD}), lse(DType::f32, {kHq, tq});
  c.out = out.t;
  c.lse = lse.t;
  c.status = Tensor();
  HostTensor cws(DType::u8, {int64_t(pipeline_workspace_bytes(c))});
  c.workspace = cws.t;
  sparse_attention_pipeline(c);
  const auto q2k = ws.download<int32_t>(size_t(kHkv * tq * c.topk), stream);
  EXPECT_EQ(0, std::memcmp(q2k.data(), cws.data<int32_t>(), q2k.size() * 4)) << "q2k differs";
  expect_outputs_match(dout, dlse, out, lse, stream);
}

// Replays of one captured pipeline against the CPU pipeline on the same inputs. index_heads:
// separate indexer inputs in the serving geometry of DESIGN section 13 (4 index heads on 1 index
// key head for the 2 kv heads: block scores, then select_topk); topk: the selection's width.
void expect_graph_replays_match_cpu(const std::vector<int32_t>& lq, const std::vector<int32_t>& lk,
                                    bool index_heads = false, int topk = kTopK) {
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
  a.topk = topk;
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
  const cudaGraphExec_t exec = capture_within_budget(a, stream);

  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    upload_inputs();
    replay_poisoned(exec, {&dout, &dlse, &ws}, a.status, stream);
    PipelineArgs c = a;
    c.q = q.t;
    c.kv.k = k.t;
    c.kv.v = v.t;
    c.kv.cu_seqlens_k = cu_k.t;
    c.cu_seqlens_q = cu_q.t;
    if (index_heads) {
      c.index_q = iq.t;
      c.index_k = ik.t;
    }
    expect_matches_cpu_pipeline(c, ws, dout, dlse, stream);
  }
  cudaGraphExecDestroy(exec);
}

TEST(PipelineGpu, GraphReplaysWithNewInputs) {
  MSA_REQUIRE_GPU();
  expect_graph_replays_match_cpu({300, 200}, {700, 500});
}

TEST(PipelineGpu, IndexHeadsOfTheServingGeometry) {
  MSA_REQUIRE_GPU();
  expect_graph_replays_match_cpu({300, 200}, {700, 500}, true);
}

// The same with top-40 over requests long enough (47 blocks) that the selection leaves blocks out.
TEST(PipelineGpu, IndexHeadsTopK40OverLongRequests) {
  MSA_REQUIRE_GPU();
  expect_graph_replays_match_cpu({300, 70}, {6000, 70}, true, 40);
}

// topK x 128 >= total_k: the pipeline's attention is dense (every visible block is selected),
// captured and replayed the same way; the selection is still written.
TEST(PipelineGpu, ShortRequestsRunDense) {
  MSA_REQUIRE_GPU();
  expect_graph_replays_match_cpu({100, 60, 0}, {300, 60, 152});
  expect_graph_replays_match_cpu({100, 60, 0}, {300, 60, 152}, true);  // 4 index heads on 1
  // topK 3 (3 blocks cover 300 keys): rows of 12 bytes, written id by id instead of 16 at once.
  expect_graph_replays_match_cpu({100, 60, 0}, {300, 60, 152}, false, 3);
}

// Paged KV in the serving geometry: the index keys in a pool of their own under k's page table.
// With as many pages as k's pool, the indexer leaves the page check to attention's prep: the call
// is 6 launches, matches the CPU pipeline, and a bad page id is reported (once, as the first
// offence). An index pool with fewer pages keeps the indexer's own check, which reports the id
// that k's pool holds and the index pool does not.
TEST(PipelineGpu, PagedServingGeometry) {
  MSA_REQUIRE_GPU();
  const std::vector<int32_t> lq = {300, 200}, lk = {700, 500};
  const KVLayout layout = KVLayout::paged_nhd;
  const int64_t page = 64;
  const Problem p = make_problem(lq, lk, kHq, kHkv, kD, 21);
  const PagedKV pk = make_paged(p, layout, page, 22);
  const int64_t pages = pk.k.t.shape[0], max_pages = pk.page_table.t.shape[1];
  const int64_t tq = p.total_q();
  HostTensor iq(DType::bf16, {tq, 4, kD}), ik(DType::bf16, {p.total_k(), 1, kD});
  std::mt19937 rng(23);
  fill(iq, rng, true);  // integer-valued: every block score exact on both sides
  fill(ik, rng, true);
  int32_t top_id = -1;  // the largest page id in use, and its entry
  int64_t top_b = 0, top_c = 0;
  // The index keys in a pool of `n` pages under k's page table (ids past n left out).
  const auto index_pool = [&](int64_t n) {
    HostTensor pool = make_pool(DType::bf16, layout, n, page, 1, kD, 0);
    for (int64_t b = 0; b < p.batch(); ++b)
      for (int64_t j = 0; j < lk[size_t(b)]; ++j) {
        const int32_t id = pk.page_table.data<int32_t>()[b * max_pages + j / page];
        if (id > top_id) top_id = id, top_b = b, top_c = j / page;
        if (id < n) copy_row(ik, p.k_start(b) + j, 0, pool, layout, id, j % page);
      }
    return pool;
  };
  const HostTensor ipool = index_pool(pages);

  TestStream stream;
  const DeviceTensor dq = to_device(p.q, stream), dk = to_device(pk.k, stream),
                     dv = to_device(pk.v, stream), dtab = to_device(pk.page_table, stream),
                     dused = to_device(pk.seqused_k, stream), dcq = to_device(p.cu_q, stream),
                     diq = to_device(iq, stream), dik = to_device(ipool, stream);
  DeviceBuffer dout(size_t(tq) * kHq * kD * 2), dlse(size_t(kHq) * tq * 4), dst(16);
  PipelineArgs a;
  a.q = dq.t;
  a.kv = pk.cache();
  a.kv.k = dk.t;
  a.kv.v = dv.t;
  a.kv.page_table = dtab.t;
  a.kv.seqused_k = dused.t;
  a.cu_seqlens_q = dcq.t;
  a.index_q = diq.t;
  a.index_k = dik.t;
  a.topk = kTopK;
  a.out = Tensor(dout.get(), DType::bf16, {tq, kHq, kD}, gpu0());
  a.lse = Tensor(dlse.get(), DType::f32, {kHq, tq}, gpu0());
  a.status = Tensor(dst.get(), DType::i32, {4}, gpu0());
  DeviceBuffer ws(pipeline_workspace_bytes(a));
  a.workspace = Tensor(ws.get(), DType::u8, {int64_t(ws.bytes())}, gpu0());
  ws.poison(stream);
  const cudaGraphExec_t exec = capture_within_budget(a, stream);
  replay_poisoned(exec, {&dout, &dlse, &ws}, a.status, stream);
  cudaGraphExecDestroy(exec);
  PipelineArgs c = a;
  c.q = p.q.t;
  c.kv = pk.cache();
  c.cu_seqlens_q = p.cu_q.t;
  c.index_q = iq.t;
  c.index_k = ipool.t;
  expect_matches_cpu_pipeline(c, ws, dout, dlse, stream);

  // A page id past both pools: attention's prep reports it.
  {
    HostTensor bad(DType::i32, {p.batch(), max_pages});
    std::memcpy(bad.data<int32_t>(), pk.page_table.data<int32_t>(), bad.bytes());
    bad.data<int32_t>()[1] = int32_t(pages);  // batch 0, column 1 (in use: 700 keys)
    const DeviceTensor dbad = to_device(bad, stream);
    PipelineArgs b = a;
    b.kv.page_table = dbad.t;
    clear_status(a.status, stream);
    sparse_attention_pipeline(b, stream);
    expect_status(dst.download<int32_t>(4, stream), StatusCode::page_id_out_of_range, 0, 1,
                  int32_t(pages));
  }
  // An index pool without the largest id in use: the indexer's check reports it.
  {
    const HostTensor small = index_pool(top_id);
    const DeviceTensor dsmall = to_device(small, stream);
    PipelineArgs b = a;
    b.index_k = dsmall.t;
    clear_status(a.status, stream);
    sparse_attention_pipeline(b, stream);
    expect_status(dst.download<int32_t>(4, stream), StatusCode::page_id_out_of_range,
                  int32_t(top_b), int32_t(top_c), top_id);
  }
  clear_status(a.status, stream);
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
