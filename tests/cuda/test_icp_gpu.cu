// The ICP indexer on the GPU (msa/icp.h; src/cuda/common/icp.cu and the indexer kernel's shard
// mode) with simulated ranks in one process: each rank's lists from its shard (the fused kernel's
// lists, or past their size the partial-score plane and the list kernel), the lists stacked as an
// all-to-all leaves them, the merge. Checked against
// - the unsharded GPU path (block_scores, then select_topk with the same selection heads): the
//   merged q2k identical, every case (a shard's partial maxima are the unsharded kernel's dot
//   products of the same rows, so the merge is exact on the GPU's own scores);
// - the CPU reference on integer-valued inputs (exact dot products, many ties): each rank's ids
//   and scores and the merged q2k identical.
// Layouts p128 over 2 ranks, p256 over 2 and 4; 4, 2 and 1 selection heads; bf16 and FP8 with
// per-slot scales; causal and not, with and without a local block; requests with no queries, a
// single key, lengths off the page size; poisoned outputs; a simulated group captured in a CUDA
// graph and replayed. A NaN key and a corrupt list are reported through the status; what CUDA
// does not run is an msa::Error.
// MSA_TEST_SMALL=1 shortens the sweep (compute-sanitizer runs).
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "support/device_tensor.h"
#include "support/expect_error.h"
#include "support/icp_case.h"

namespace msa::test {
namespace {

HostTensor cumulative(const std::vector<int32_t>& lengths) {
  HostTensor t(DType::i32, {int64_t(lengths.size()) + 1});
  t.data<int32_t>()[0] = 0;
  for (size_t i = 0; i < lengths.size(); ++i) t.data<int32_t>()[i + 1] = t.data<int32_t>()[i] + lengths[i];
  return t;
}

// A status buffer on the device, cleared.
struct DeviceStatus {
  DeviceBuffer buf{16};
  Tensor t;
  explicit DeviceStatus(cudaStream_t s) : t(buf.get(), DType::i32, {4}, gpu0()) { clear_status(t, s); }
  std::vector<int32_t> read(cudaStream_t s) const { return buf.download<int32_t>(4, s); }
};

struct Inputs {
  HostTensor q, cu_q;
  Pool pool;
};

Inputs make_inputs(const Case& c) {
  std::mt19937 rng(c.seed);
  const int64_t tq = std::accumulate(c.lq.begin(), c.lq.end(), int64_t(0));
  HostTensor q(c.fp8 ? DType::fp8_e4m3 : DType::bf16, {tq, kHi, kD});
  for (int64_t i = 0; i < q.t.numel(); ++i) put(q, i, value(rng, c.ties));
  Pool pool = make_pool(c, rng);
  return {std::move(q), cumulative(c.lq), std::move(pool)};
}

// The unsharded GPU selection: block_scores, then select_topk with c.hsel selection heads.
std::vector<int32_t> gpu_unsharded(const Case& c, const Inputs& in, cudaStream_t s) {
  const int64_t tq = in.q.t.shape[0];
  const int64_t nblk = in.pool.table.t.shape[1] * c.sharding.page_rows() / 128;
  const DeviceTensor q = to_device(in.q, s), cu = to_device(in.cu_q, s),
                     table = to_device(in.pool.table, s), used = to_device(in.pool.used, s);
  const DeviceQTensor k = to_device(in.pool.values, c.fp8 ? &in.pool.scale : nullptr, s);
  HostTensor scores(DType::f32, {kHi, nblk, tq}), q2k(DType::i32, {c.hsel, tq, c.topk});
  const DeviceTensor dscores = device_like(scores, s), dq2k = device_like(q2k, s);
  DeviceStatus st(s);
  BlockScoresArgs b;
  b.q = QTensor(q.t);
  b.kv.k = k.view();
  b.kv.layout = KVLayout::paged_nhd;
  b.kv.page_table = table.t;
  b.kv.seqused_k = used.t;
  b.cu_seqlens_q = cu.t;
  b.scores = dscores.t;
  b.causal = c.causal;
  b.status = st.t;
  block_scores(b, s);
  TopKArgs t;
  t.scores = dscores.t;
  t.cu_seqlens_q = cu.t;
  t.kv = b.kv;
  t.num_kv_heads = int(c.hsel);
  t.topk = c.topk;
  t.sink_blocks = c.sink;
  t.local_blocks = c.local;
  t.causal = c.causal;
  t.q2k = dq2k.t;
  t.status = st.t;
  select_topk(t, s);
  EXPECT_NO_THROW(check_status(st.t, s));
  return dq2k.buf.download<int32_t>(size_t(q2k.t.numel()), s);
}

struct Lists {
  HostTensor ids, scores;  // [world, Hsel, total_q, topk]
};

// Every rank's lists from its own shard on the GPU; with `check_reference`, each rank's ids and
// scores equal to the CPU reference's.
Lists gpu_lists(const Case& c, const Inputs& in, bool check_reference, cudaStream_t s) {
  const int64_t tq = in.q.t.shape[0], W = c.sharding.world, row = c.hsel * tq * c.topk;
  Lists out{HostTensor(DType::i32, {W, c.hsel, tq, c.topk}), HostTensor(DType::f32, {W, c.hsel, tq, c.topk})};
  const DeviceTensor q = to_device(in.q, s), cu = to_device(in.cu_q, s),
                     table = to_device(in.pool.table, s), used = to_device(in.pool.used, s);
  for (int rank = 0; rank < W; ++rank) {
    const Pool shard = shard_of(in.pool, c.sharding, rank);
    const DeviceQTensor k = to_device(shard.values, c.fp8 ? &shard.scale : nullptr, s);
    HostTensor ids(DType::i32, {c.hsel, tq, c.topk}), scores(DType::f32, {c.hsel, tq, c.topk});
    const DeviceTensor dids = device_like(ids, s), dscores = device_like(scores, s);
    DeviceStatus st(s);
    IcpRankListsArgs a = rank_args(c, rank, q.t, k.view(), {table.t, used.t, cu.t}, dids.t, dscores.t);
    a.status = st.t;
    DeviceBuffer ws(std::max<size_t>(icp_rank_lists_workspace_bytes(a), 16));
    ws.poison(s);
    a.workspace = Tensor(ws.get(), DType::u8, {int64_t(ws.bytes())}, gpu0());
    icp_rank_lists(a, s);
    EXPECT_NO_THROW(check_status(st.t, s)) << "rank " << rank;
    copy_to_host(dids, ids, s);
    copy_to_host(dscores, scores, s);
    if (check_reference) {
      cpu::icp::RankArgs r = reference_args(c, in.q, in.cu_q, in.pool);
      r.rank = rank;
      r.shard = keys_of(shard, c.fp8);
      expect_lists(cpu::icp::rank_candidates(r), ids.data<int32_t>(), scores.data<float>(), c.topk,
                   rank);
    }
    std::memcpy(out.ids.data<int32_t>() + rank * row, ids.data<int32_t>(), size_t(row) * 4);
    std::memcpy(out.scores.data<float>() + rank * row, scores.data<float>(), size_t(row) * 4);
  }
  return out;
}

// The GPU merge of stacked lists; `status` receives the merge's status words.
std::vector<int32_t> gpu_merge(const Case& c, const Inputs& in, const Lists& l, cudaStream_t s,
                               std::vector<int32_t>* status = nullptr) {
  const int64_t tq = in.q.t.shape[0];
  const DeviceTensor ids = to_device(l.ids, s), scores = to_device(l.scores, s),
                     cu = to_device(in.cu_q, s), table = to_device(in.pool.table, s),
                     used = to_device(in.pool.used, s);
  HostTensor q2k(DType::i32, {c.hsel, tq, c.topk});
  const DeviceTensor dq2k = device_like(q2k, s);
  DeviceStatus st(s);
  IcpMergeArgs m = merge_args(c, {table.t, used.t, cu.t}, ids.t, scores.t, dq2k.t);
  m.status = st.t;
  icp_merge(m, s);
  if (status) *status = st.read(s);
  else EXPECT_NO_THROW(check_status(st.t, s));
  return dq2k.buf.download<int32_t>(size_t(q2k.t.numel()), s);
}

std::string name(const Case& c) {
  return std::string(c.sharding.layout == cpu::icp::Layout::p128 ? "P128" : "P256") + " TP" +
         std::to_string(c.sharding.world) + " Hsel " + std::to_string(c.hsel) + (c.fp8 ? " fp8" : " bf16") +
         (c.causal ? " causal" : " non-causal") + " local " + std::to_string(c.local) +
         (c.ties ? " integer" : " random");
}

void run_case(const Case& c) {
  SCOPED_TRACE(name(c));
  TestStream s;
  const Inputs in = make_inputs(c);
  const Lists lists = gpu_lists(c, in, /*check_reference=*/c.ties, s);
  const std::vector<int32_t> got = gpu_merge(c, in, lists, s);
  EXPECT_EQ(got, gpu_unsharded(c, in, s)) << "sharded != unsharded on the GPU";
  if (c.ties)
    EXPECT_EQ(got, unsharded_selection(c, in.q, in.cu_q, in.pool)) << "sharded GPU != CPU block_topk";
}

using cpu::icp::Layout;

TEST(IcpGpu, ShardedEqualsUnsharded) {
  MSA_REQUIRE_GPU();
  const std::pair<Layout, int> groups[] = {{Layout::p128, 2}, {Layout::p256, 2}, {Layout::p256, 4}};
  int n = 0;
  for (const auto& [layout, world] : groups)
    for (const int64_t hsel : {4, 2, 1})
      for (const bool fp8 : {false, true})
        for (const bool ties : {true, false}) {
          if (small_tests() && n++ % 4 != 0) continue;
          // Requests: long, mid, one key, no queries, lengths off the page size.
          Case c{{40, 200, 1, 0, 3}, {2900, 1500, 1, 700, 129}, {layout, world}, hsel};
          c.topk = 6;
          c.local = hsel == 2 ? 0 : 1;  // without a local block the partial last block competes
          c.causal = hsel != 1;
          c.fp8 = fp8;
          c.ties = ties;
          c.seed = unsigned(100 + world * 10 + hsel + fp8 * 3 + ties * 7);
          run_case(c);
        }
}

TEST(IcpGpu, WideSelectionsAndSingleRequests) {
  MSA_REQUIRE_GPU();
  for (const Layout layout : {Layout::p128, Layout::p256}) {
    Case wide{{20, 3}, {600, 130}, {layout, 2}, 4, 16, 1, 1};  // topk past the visible blocks
    wide.ties = true;
    run_case(wide);
    Case one{{64}, {5000}, {layout, 2}, 4, 16, 2, 2};  // topk 16, the serving knobs
    one.seed = 5;
    run_case(one);
  }
}

// The whole simulated group (every rank's lists into its slice of the stacked lists, then the
// merge) captured in one CUDA graph: `per_rank` kernels a rank (the page check and the shard
// kernel keeping the lists: 2; past the fused lists' size, the page check, the shard scores and
// the list kernel: 3) and the merge, no memset; replays with poisoned outputs give the eager q2k.
void captured_group(Case c, int per_rank) {
  TestStream s;
  const Inputs in = make_inputs(c);
  const std::vector<int32_t> want = gpu_merge(c, in, gpu_lists(c, in, false, s), s);
  const int64_t tq = in.q.t.shape[0], W = c.sharding.world, row = c.hsel * tq * c.topk;
  const DeviceTensor q = to_device(in.q, s), cu = to_device(in.cu_q, s),
                     table = to_device(in.pool.table, s), used = to_device(in.pool.used, s);
  const PoolViews views{table.t, used.t, cu.t};
  DeviceBuffer ids(size_t(W * row) * 4), scores(size_t(W * row) * 4), q2k(size_t(row) * 4);
  DeviceStatus st(s);
  std::vector<DeviceQTensor> shards;
  std::vector<DeviceBuffer> workspaces;
  std::vector<IcpRankListsArgs> ranks;
  for (int rank = 0; rank < W; ++rank) {
    const Pool shard = shard_of(in.pool, c.sharding, rank);
    shards.push_back(to_device(shard.values, &shard.scale, s));
    const auto at = [&](const DeviceBuffer& b, DType dt) {
      return Tensor(static_cast<char*>(b.get()) + rank * row * 4, dt, {c.hsel, tq, c.topk}, gpu0());
    };
    IcpRankListsArgs a = rank_args(c, rank, q.t, shards.back().view(), views, at(ids, DType::i32),
                                   at(scores, DType::f32));
    a.status = st.t;
    workspaces.emplace_back(icp_rank_lists_workspace_bytes(a));
    a.workspace = Tensor(workspaces.back().get(), DType::u8, {int64_t(workspaces.back().bytes())}, gpu0());
    ranks.push_back(a);
  }
  IcpMergeArgs m = merge_args(c, views, Tensor(ids.get(), DType::i32, {W, c.hsel, tq, c.topk}, gpu0()),
                              Tensor(scores.get(), DType::f32, {W, c.hsel, tq, c.topk}, gpu0()),
                              Tensor(q2k.get(), DType::i32, {c.hsel, tq, c.topk}, gpu0()));
  m.status = st.t;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  MSA_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (const IcpRankListsArgs& a : ranks) icp_rank_lists(a, s);
  icp_merge(m, s);
  MSA_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  expect_launch_budget(graph, per_rank * int(W) + 1);
  MSA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaGraphDestroy(graph);
  for (int replay = 0; replay < 2; ++replay) {
    for (DeviceBuffer* b : {&ids, &scores, &q2k}) b->poison(s);
    MSA_CUDA_CHECK(cudaGraphLaunch(exec, s));
    EXPECT_NO_THROW(check_status(st.t, s));
    EXPECT_EQ(q2k.download<int32_t>(size_t(row), s), want) << "replay " << replay;
  }
  cudaGraphExecDestroy(exec);
}

TEST(IcpGpu, CapturedInAGraph) {
  MSA_REQUIRE_GPU();
  Case fused{{40, 3}, {1500, 300}, {Layout::p256, 2}, 4, 16, 1, 1};
  fused.fp8 = true;
  captured_group(fused, 2);
  Case planes = fused;  // 18 picks past the lists' 16: the plane and the list kernel
  planes.topk = 20;
  captured_group(planes, 3);
}

// A list per index head holds 16 picks in the fused kernel (block_topk's rule); past that a rank
// writes its partial scores into the workspace and the list kernel selects: the same lists (CPU
// reference on integer inputs) and the same merged q2k as the unsharded selection.
TEST(IcpGpu, ListsPastTheFusedSizeMatchToo) {
  MSA_REQUIRE_GPU();
  const std::pair<Layout, int> groups[] = {{Layout::p128, 2}, {Layout::p256, 2}, {Layout::p256, 4}};
  int n = 0;
  for (const auto& [layout, world] : groups)
    for (const bool ties : {true, false}) {
      if (small_tests() && n++ % 3 != 0) continue;
      Case c{{40, 200, 1, 0, 3}, {2900, 1500, 1, 700, 129}, {layout, world}, 4, 20, 1, 1};
      c.ties = ties;
      c.fp8 = !ties;
      c.seed = unsigned(300 + world * 10 + ties);
      run_case(c);
    }
}

TEST(IcpGpu, NanKeyAndCorruptListsAreReported) {
  MSA_REQUIRE_GPU();
  TestStream s;
  Case c{{8}, {600}, {Layout::p128, 2}, 4};
  Inputs in = make_inputs(c);
  // Key 300 (visible to every query), one NaN element: rank 0 holds it (row 44 of its page).
  const int64_t page = in.pool.table.data<int32_t>()[300 / 128];
  in.pool.values.data<uint16_t>()[(page * 128 + 300 % 128) * kD + 5] = 0x7fc0;
  const DeviceTensor q = to_device(in.q, s), cu = to_device(in.cu_q, s),
                     table = to_device(in.pool.table, s), used = to_device(in.pool.used, s);
  const Pool shard = shard_of(in.pool, c.sharding, 0);
  const DeviceQTensor k = to_device(shard.values, nullptr, s);
  HostTensor ids(DType::i32, {4, 8, 4});
  const DeviceTensor dids = device_like(ids, s), dscores = device_like(ids, s);
  DeviceStatus st(s);
  IcpRankListsArgs a = rank_args(c, 0, q.t, k.view(), {table.t, used.t, cu.t}, dids.t,
                                 Tensor(dscores.t.data, DType::f32, {4, 8, 4}, gpu0()));
  a.status = st.t;
  DeviceBuffer ws(icp_rank_lists_workspace_bytes(a));
  a.workspace = Tensor(ws.get(), DType::u8, {int64_t(ws.bytes())}, gpu0());
  icp_rank_lists(a, s);
  EXPECT_EQ(st.read(s)[0], int32_t(StatusCode::icp_nan_score));
  expect_error([&] { check_status(st.t, s); }, "is NaN");

  // A forced block in a rank's list: reported, skipped, the rest merged.
  Case ok{{8}, {600}, {Layout::p128, 2}, 4};
  ok.ties = true;
  const Inputs good = make_inputs(ok);
  Lists l = gpu_lists(ok, good, false, s);
  l.ids.data<int32_t>()[(1 * 4 * 8 + 5) * 4] = 0;  // rank 1, head 0, token 5, entry 0: the sink
  std::vector<int32_t> status;
  gpu_merge(ok, good, l, s, &status);
  expect_status(status, StatusCode::icp_list_invalid, 1, 5, 0);
}

TEST(IcpGpu, RefusesWhatCudaDoesNotRun) {
  MSA_REQUIRE_GPU();
  TestStream s;
  // The last field: the error with a 1-byte workspace (a layout CUDA does not run is refused
  // before the workspace is looked at).
  for (const auto& [layout, world, heads, needle, small_ws] :
       {std::tuple{Layout::p128, 4, 1, "64 or 128 rows", "64 or 128 rows"},
        std::tuple{Layout::p128, 2, 2, "4 or more index heads", "workspace: needs"}}) {
    Case c{{4}, {300}, {layout, world}, 1};
    const Inputs in = make_inputs(c);
    const Pool shard = shard_of(in.pool, c.sharding, 0);
    HostTensor kv(DType::bf16, {shard.values.t.shape[0], shard.values.t.shape[1], heads, kD});
    const DeviceTensor q = to_device(in.q, s), cu = to_device(in.cu_q, s),
                       table = to_device(in.pool.table, s), k = to_device(kv, s);
    HostTensor ids(DType::i32, {1, 4, 4});
    const DeviceTensor dids = device_like(ids, s), dsc = device_like(ids, s);
    DeviceStatus st(s);
    IcpRankListsArgs a = rank_args(c, 0, q.t, QTensor(k.t), {table.t, Tensor(), cu.t}, dids.t,
                                   Tensor(dsc.t.data, DType::f32, {1, 4, 4}, gpu0()));
    a.status = st.t;
    DeviceBuffer ws(std::max<size_t>(icp_rank_lists_workspace_bytes(a), 16));
    a.workspace = Tensor(ws.get(), DType::u8, {int64_t(ws.bytes())}, gpu0());
    expect_error([&] { icp_rank_lists(a, s); }, needle);
    a.workspace = Tensor(ws.get(), DType::u8, {1}, gpu0());
    expect_error([&] { icp_rank_lists(a, s); }, small_ws);
  }
}

}  // namespace
}  // namespace msa::test
