// msa_icp_driver: the ICP indexer's collective step in C++ over NCCL, one process per GPU (the
// Python driver is msa.icp_select). The parent makes the NCCL id and forks `world` ranks; each
// rank holds every index query and only its shard of the index keys, and runs its lists
// (icp_rank_lists), the exchange (grouped ncclSend / ncclRecv: each owner gets every rank's rows
// of its heads, or every head when the world does not divide them) and the merge (icp_merge),
// eagerly and as one captured CUDA graph; it checks its q2k rows against the unsharded selection
// on its own GPU (block_scores, then select_topk) and prints the step's time.
//   msa_icp_driver --world 2 [--layout p128|p256] [--keys N] [--queries N] [--topk K]
//                  [--heads H] [--iters N]
// Exit status 0 when every rank's q2k equals the unsharded selection. NCCL comes from the
// nvidia-nccl wheel (tools/icp_driver/CMakeLists.txt); on another machine put that wheel's lib/ on
// LD_LIBRARY_PATH (bench/device_session.sh, step icp).
#include <cuda_runtime.h>
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/codecs.h"
#include "msa/msa.h"
#include "workloads/device_buffer.h"

namespace {

using msa::DType;
using msa::Tensor;
using msa::bench::DeviceBuffer;

constexpr int64_t kD = 128, kHi = 4;  // the M3 index geometry: 4 index heads on 1 key head

struct Options {
  int world = 2, topk = 16, iters = 20, heads = 4;  // heads: selection heads (Hsel)
  msa::IcpLayout layout = msa::IcpLayout::p128;
  int64_t keys = 32768, queries = 2048;
};

#define DRIVER_CHECK(call, what)                                                             \
  do {                                                                                       \
    if (!(call)) {                                                                           \
      std::fprintf(stderr, "rank %d: %s failed (%s:%d)\n", rank, what, __FILE__, __LINE__); \
      return 1;                                                                              \
    }                                                                                        \
  } while (0)

int g_device = 0;  // this rank's GPU

Tensor on_gpu(const DeviceBuffer& b, DType dt, std::vector<int64_t> shape) {
  return Tensor(b.get(), dt, shape, {msa::DeviceType::cuda, g_device});
}

DeviceBuffer upload(const void* src, size_t bytes) {
  DeviceBuffer b(std::max<size_t>(bytes, 16));
  b.upload(src, bytes, nullptr);
  return b;
}

// One rank's whole run; 0 when its q2k rows equal the unsharded selection.
int run_rank(const Options& o, int rank, const ncclUniqueId& id) {
  int devices = 0;
  DRIVER_CHECK(cudaGetDeviceCount(&devices) == cudaSuccess && devices >= o.world, "one GPU a rank");
  DRIVER_CHECK(cudaSetDevice(rank) == cudaSuccess, "cudaSetDevice");
  g_device = rank;
  ncclComm_t comm;
  DRIVER_CHECK(ncclCommInitRank(&comm, o.world, id, rank) == ncclSuccess, "ncclCommInitRank");
  cudaStream_t s;
  DRIVER_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");

  // The same inputs on every rank (one seed): q [T, 4, D] and the unsharded pool [pages, P, 1, D]
  // (bf16, normal draws), pages in a shuffled order, one request of `keys` keys.
  const int P = msa::icp_page_rows(o.layout), rows = msa::icp_rows_per_rank(o.layout, o.world);
  const int64_t T = o.queries, pages = (o.keys + P - 1) / P;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<uint16_t> q(static_cast<size_t>(T * kHi * kD)), pool(static_cast<size_t>(pages * P * kD));
  for (auto& x : q) x = msa::codec::float_to_bf16(nd(rng));
  for (auto& x : pool) x = msa::codec::float_to_bf16(nd(rng));
  std::vector<int32_t> table(static_cast<size_t>(pages)), used{int32_t(o.keys)}, cu{0, int32_t(T)};
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  // This rank's shard [pages, rows, 1, D] (msa/icp.h: p128 rows interleaved, p256 contiguous).
  std::vector<uint16_t> shard(static_cast<size_t>(pages * rows * kD));
  for (int64_t p = 0; p < pages; ++p)
    for (int r = 0; r < rows; ++r) {
      const int64_t row = o.layout == msa::IcpLayout::p128 ? int64_t(r) * o.world + rank : int64_t(rank) * rows + r;
      std::memcpy(&shard[size_t((p * rows + r) * kD)], &pool[size_t((p * P + row) * kD)], kD * 2);
    }

  const DeviceBuffer dq = upload(q.data(), q.size() * 2), dshard = upload(shard.data(), shard.size() * 2),
                     dtable = upload(table.data(), table.size() * 4), dused = upload(used.data(), 4),
                     dcu = upload(cu.data(), 8);
  const int64_t H = o.heads, own = H % o.world ? H : H / o.world, K = o.topk, row = T * K;
  DeviceBuffer ids(static_cast<size_t>(H * row) * 4), scores(static_cast<size_t>(H * row) * 4),
      rids(static_cast<size_t>(o.world * own * row) * 4), rscores(static_cast<size_t>(o.world * own * row) * 4),
      q2k(static_cast<size_t>(own * row) * 4), status(16);
  const Tensor st = on_gpu(status, DType::i32, {4});
  msa::clear_status(st, s);

  msa::IcpRankListsArgs a;
  a.layout = o.layout;
  a.world = o.world;
  a.rank = rank;
  a.index_q = msa::QTensor(on_gpu(dq, DType::bf16, {T, kHi, kD}));
  a.shard = msa::QTensor(on_gpu(dshard, DType::bf16, {pages, rows, 1, kD}));
  a.page_table = on_gpu(dtable, DType::i32, {1, pages});
  a.seqused_k = on_gpu(dused, DType::i32, {1});
  a.cu_seqlens_q = on_gpu(dcu, DType::i32, {2});
  a.topk = o.topk;
  a.ids = on_gpu(ids, DType::i32, {H, T, K});
  a.scores = on_gpu(scores, DType::f32, {H, T, K});
  a.status = st;
  DeviceBuffer ws(msa::icp_rank_lists_workspace_bytes(a));
  a.workspace = on_gpu(ws, DType::u8, {int64_t(ws.bytes())});
  msa::IcpMergeArgs m;
  m.layout = o.layout;
  m.ids = on_gpu(rids, DType::i32, {o.world, own, T, K});
  m.scores = on_gpu(rscores, DType::f32, {o.world, own, T, K});
  m.page_table = a.page_table;
  m.seqused_k = a.seqused_k;
  m.cu_seqlens_q = a.cu_seqlens_q;
  m.topk = o.topk;
  m.q2k = on_gpu(q2k, DType::i32, {own, T, K});
  m.status = st;

  // The step: lists, the exchange (rank p's heads [p own, (p + 1) own), or all of them), merge.
  const size_t chunk = size_t(own * row);
  auto step = [&]() -> bool {
    msa::icp_rank_lists(a, s);
    bool ok = ncclGroupStart() == ncclSuccess;
    for (int p = 0; p < o.world; ++p) {
      const size_t from = own == H ? 0 : size_t(p) * chunk;
      ok &= ncclSend(static_cast<char*>(ids.get()) + from * 4, chunk, ncclInt32, p, comm, s) == ncclSuccess;
      ok &= ncclSend(static_cast<char*>(scores.get()) + from * 4, chunk, ncclFloat32, p, comm, s) == ncclSuccess;
      ok &= ncclRecv(static_cast<char*>(rids.get()) + size_t(p) * chunk * 4, chunk, ncclInt32, p, comm, s) == ncclSuccess;
      ok &= ncclRecv(static_cast<char*>(rscores.get()) + size_t(p) * chunk * 4, chunk, ncclFloat32, p, comm, s) == ncclSuccess;
    }
    ok &= ncclGroupEnd() == ncclSuccess;
    msa::icp_merge(m, s);
    return ok;
  };

  // The unsharded selection of this rank's heads on its own GPU: block_scores, then select_topk.
  const DeviceBuffer dpool = upload(pool.data(), pool.size() * 2);
  const int64_t nblk = pages * P / 128;
  DeviceBuffer plane(static_cast<size_t>(kHi * nblk * T) * 4), want(static_cast<size_t>(H * row) * 4);
  msa::BlockScoresArgs b;
  b.q = a.index_q;
  b.kv.k = msa::QTensor(on_gpu(dpool, DType::bf16, {pages, P, 1, kD}));
  b.kv.layout = msa::KVLayout::paged_nhd;
  b.kv.page_table = a.page_table;
  b.kv.seqused_k = a.seqused_k;
  b.cu_seqlens_q = a.cu_seqlens_q;
  b.scores = on_gpu(plane, DType::f32, {kHi, nblk, T});
  b.status = st;
  msa::block_scores(b, s);
  msa::TopKArgs t;
  t.scores = b.scores;
  t.cu_seqlens_q = b.cu_seqlens_q;
  t.kv = b.kv;
  t.num_kv_heads = int(H);
  t.topk = o.topk;
  t.q2k = on_gpu(want, DType::i32, {H, T, K});
  t.status = st;
  msa::select_topk(t, s);
  const int64_t first = own == H ? 0 : rank * own;
  const std::vector<int32_t> expect = want.download<int32_t>(size_t(H * row), s);
  auto matches = [&]() {
    const std::vector<int32_t> got = q2k.download<int32_t>(size_t(own * row), s);
    return std::equal(got.begin(), got.end(), expect.begin() + first * row);
  };

  try {
    DRIVER_CHECK(step(), "the eager step's NCCL calls");
    msa::check_status(st, s);
    const bool eager = matches();
    // The step as one CUDA graph, replayed and timed.
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    DRIVER_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess, "capture");
    const bool captured = step();
    DRIVER_CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess && captured, "the captured step");
    DRIVER_CHECK(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess, "cudaGraphInstantiate");
    q2k.poison(s);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    DRIVER_CHECK(cudaGraphLaunch(exec, s) == cudaSuccess, "cudaGraphLaunch");
    const bool replayed = matches();
    cudaEventRecord(e0, s);
    for (int i = 0; i < o.iters; ++i) cudaGraphLaunch(exec, s);
    cudaEventRecord(e1, s);
    DRIVER_CHECK(cudaEventSynchronize(e1) == cudaSuccess, "the replays");
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    msa::check_status(st, s);
    std::printf("rank %d: heads [%lld, %lld), q2k %s (eager) / %s (graph), %.3f ms a step (graph, %d "
                "replays back to back)\n", rank, (long long)first, (long long)(first + own),
                eager ? "equal" : "DIFFERENT", replayed ? "equal" : "DIFFERENT", ms / o.iters, o.iters);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    ncclCommDestroy(comm);
    return eager && replayed ? 0 : 1;
  } catch (const msa::Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return 1;
  }
}

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--world") o.world = std::atoi(v.c_str());
    else if (k == "--layout" && (v == "p128" || v == "p256"))
      o.layout = v == "p128" ? msa::IcpLayout::p128 : msa::IcpLayout::p256;
    else if (k == "--keys") o.keys = std::atoll(v.c_str());
    else if (k == "--queries") o.queries = std::atoll(v.c_str());
    else if (k == "--topk") o.topk = std::atoi(v.c_str());
    else if (k == "--heads") o.heads = std::atoi(v.c_str());
    else if (k == "--iters") o.iters = std::atoi(v.c_str());
    else return false;
  }
  return argc % 2 == 1 && (o.world == 2 || o.world == 4) && o.keys > 0 && o.queries > 0 &&
         o.queries <= o.keys && o.topk > 0 && (o.heads == 1 || o.heads == 2 || o.heads == 4) &&
         o.iters > 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, o)) {
    std::fprintf(stderr, "usage: %s --world 2|4 [--layout p128|p256] [--keys N] [--queries N<=keys] "
                 "[--topk K] [--heads 1|2|4] [--iters N]\n", argv[0]);
    return 2;
  }
  // NVLink multicast (NVLS) off unless the caller sets it: the H200 machines' NCCL notes.
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  // The id before the fork (no CUDA in the parent, whose bootstrap root the ranks reach).
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) {
    std::fprintf(stderr, "ncclGetUniqueId failed\n");
    return 1;
  }
  std::vector<pid_t> kids;
  for (int r = 0; r < o.world; ++r) {
    const pid_t pid = fork();
    if (pid == 0) std::_Exit(run_rank(o, r, id));
    kids.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : kids) {
    int st = 0;
    waitpid(pid, &st, 0);
    failed += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  std::printf("%s: %d of %d ranks failed\n", failed ? "FAIL" : "PASS", failed, o.world);
  return failed ? 1 : 0;
}
