// bench_latency: the host time of one C++ call on a small problem, each call started on an idle
// stream (so the figure is the host's cost to validate and enqueue, never a wait on the GPU), and
// the GPU time of the same calls back to back: attention_forward with its k2q index (as
// bench_sparse_fwd calls it) and sparse_attention_pipeline. bench/python_bench.py times the same
// calls through the Python API; the difference is the Python layer's cost. Also dense attention
// on the same inputs (no q2k), and each call's launches and memsets, counted on a CUDA graph
// capture of it.
//   bench_latency [--seq S] [--hq H] [--hkv H] [--topk K] [--calls N] [--json FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "workloads/cases.h"
#include "workloads/gpu_timing.h"
#include "workloads/record.h"
#include "workloads/single_shape.h"
#include "msa/msa.h"

namespace {

using msa::DType;
using msa::Tensor;
using namespace msa::bench;

struct Options {
  int64_t seq = 256, hq = 8, hkv = 2, topk = 2;
  int calls = 1000;
  std::string json;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    MSA_CHECK(i + 1 < argc, "bench_latency: ", a, " needs a value");
    const char* v = argv[++i];
    if (a == "--seq") o.seq = std::atoll(v);
    else if (a == "--hq") o.hq = std::atoll(v);
    else if (a == "--hkv") o.hkv = std::atoll(v);
    else if (a == "--topk") o.topk = std::atoll(v);
    else if (a == "--calls") o.calls = std::atoi(v);
    else if (a == "--json") o.json = v;
    else msa::fail("bench_latency: unknown option ", a);
  }
  MSA_CHECK(o.seq > 0 && o.hq > 0 && o.hkv > 0 && o.hq % o.hkv == 0 && o.topk > 0 && o.calls > 0,
            "bench_latency: sizes must be positive, with --hq a multiple of --hkv");
  return o;
}

struct HostTimes {
  double median_us = 0, min_us = 0, max_us = 0, gpu_us = 0;
};

// Host microseconds of `call`, each run alone after the stream drained; then the GPU time per
// call of `calls` calls back to back (CUDA events around the whole loop).
HostTimes time_calls(const std::function<void()>& call, int calls, cudaStream_t s) {
  for (int i = 0; i < 50; ++i) call();  // warm-up: module loads, first-launch setup
  std::vector<double> us(size_t(calls), 0.0);
  for (double& t : us) {
    MSA_BENCH_CUDA(cudaStreamSynchronize(s));
    const auto t0 = std::chrono::steady_clock::now();
    call();
    t = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }
  cudaEvent_t e0, e1;
  MSA_BENCH_CUDA(cudaEventCreate(&e0));
  MSA_BENCH_CUDA(cudaEventCreate(&e1));
  MSA_BENCH_CUDA(cudaEventRecord(e0, s));
  for (int i = 0; i < calls; ++i) call();
  MSA_BENCH_CUDA(cudaEventRecord(e1, s));
  MSA_BENCH_CUDA(cudaEventSynchronize(e1));
  float ms = 0;
  MSA_BENCH_CUDA(cudaEventElapsedTime(&ms, e0, e1));
  MSA_BENCH_CUDA(cudaEventDestroy(e0));
  MSA_BENCH_CUDA(cudaEventDestroy(e1));
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us.front(), us.back(), 1e3 * ms / calls};
}

// Work one call enqueues, counted on a CUDA graph capture of it: kernel nodes (launches),
// memset nodes, and any other node.
struct Launches {
  int kernels = 0, memsets = 0, other = 0;
};

Launches count_launches(const std::function<void()>& call, cudaStream_t s) {
  cudaGraph_t g;
  MSA_BENCH_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  call();
  MSA_BENCH_CUDA(cudaStreamEndCapture(s, &g));
  size_t n = 0;
  MSA_BENCH_CUDA(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  MSA_BENCH_CUDA(cudaGraphGetNodes(g, nodes.data(), &n));
  Launches l;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t;
    MSA_BENCH_CUDA(cudaGraphNodeGetType(node, &t));
    if (t == cudaGraphNodeTypeKernel) ++l.kernels;
    else if (t == cudaGraphNodeTypeMemset) ++l.memsets;
    else ++l.other;
  }
  MSA_BENCH_CUDA(cudaGraphDestroy(g));
  return l;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    const int64_t S = o.seq, D = SingleRequestInputs::kHeadDim;
    const int64_t rows = S / 128 + 1;  // total_k / blk + B: the bound the Python layer uses
    cudaStream_t s;
    MSA_BENCH_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const SingleRequestInputs in(S, o.hq, o.hkv, /*seed=*/11, /*with_v=*/true, s);
    DeviceBuffer out = gpu_buffer(in.q.size() * 2), q2k = gpu_buffer(size_t(o.hkv * S * o.topk) * 4),
                 row_ptr = gpu_buffer(size_t(o.hkv * (rows + 1)) * 4), q_idx = gpu_buffer(size_t(o.hkv * S * o.topk) * 4),
                 schedule = gpu_buffer(size_t(msa::k2q_schedule_size(o.hkv, rows, S, o.topk)) * 4),
                 status = gpu_buffer(16);
    status.fill(0, s);
    const Tensor st = gpu_view(status.get(), DType::i32, {4});

    const msa::KVCache kv = in.kv();
    const Tensor qt = in.q_view();

    // The selection and its CSR, built once (untimed), as a caller of attention_forward has them.
    msa::BlockTopKArgs sel;
    sel.q = qt;
    sel.kv = kv;
    sel.kv.v = msa::QTensor();
    sel.cu_seqlens_q = kv.cu_seqlens_k;
    sel.topk = int(o.topk);
    sel.q2k = gpu_view(q2k.get(), DType::i32, {o.hkv, S, o.topk});
    sel.status = st;
    msa::block_topk(sel, s);
    msa::CsrBuildArgs csr;
    csr.q2k = sel.q2k;
    csr.cu_seqlens_q = sel.cu_seqlens_q;
    csr.kv = kv;
    csr.out.row_ptr = gpu_view(row_ptr.get(), DType::i32, {o.hkv, rows + 1});
    csr.out.q_idx = gpu_view(q_idx.get(), DType::i32, {o.hkv, S * o.topk});
    csr.out.schedule = gpu_view(schedule.get(), DType::i32, {int64_t(schedule.bytes() / 4)});
    const DeviceBuffer csr_ws = gpu_buffer(msa::csr_workspace_bytes(o.hkv, rows, S, o.topk));
    csr.workspace = gpu_view(csr_ws.get(), DType::u8, {int64_t(csr_ws.bytes())});
    csr.status = st;
    msa::build_k2q_csr(csr, s);

    msa::AttentionArgs a;  // as msa.attention_forward(q, k, v, cu, q2k=q2k, k2q=k2q) calls it
    a.q = qt;
    a.kv = kv;
    a.cu_seqlens_q = kv.cu_seqlens_k;
    a.q2k = sel.q2k;
    a.k2q = csr.out;
    a.out = gpu_view(out.get(), DType::bf16, {S, o.hq, D});
    a.status = st;
    const DeviceBuffer attn_ws = gpu_buffer(msa::attention_workspace_bytes(a));
    a.workspace = gpu_view(attn_ws.get(), DType::u8, {int64_t(attn_ws.bytes())});

    msa::PipelineArgs p;  // as msa.sparse_attention(q, k, v, cu, topk=K) calls it
    p.q = qt;
    p.kv = kv;
    p.cu_seqlens_q = kv.cu_seqlens_k;
    p.topk = int(o.topk);
    p.out = a.out;
    p.status = st;
    const DeviceBuffer pipe_ws = gpu_buffer(msa::pipeline_workspace_bytes(p));
    p.workspace = gpu_view(pipe_ws.get(), DType::u8, {int64_t(pipe_ws.bytes())});

    msa::AttentionArgs dense = a;  // the same call without a selection: dense attention
    dense.q2k = Tensor();
    dense.k2q = msa::K2QIndex{};
    const DeviceBuffer dense_ws = gpu_buffer(std::max<size_t>(msa::attention_workspace_bytes(dense), 256));
    dense.workspace = gpu_view(dense_ws.get(), DType::u8, {int64_t(dense_ws.bytes())});

    const std::pair<const char*, std::function<void()>> ops[] = {
        {"attention_forward", [&] { msa::attention_forward(a, s); }},
        {"attention_forward_dense", [&] { msa::attention_forward(dense, s); }},
        {"pipeline", [&] { msa::sparse_attention_pipeline(p, s); }},
    };
    BenchCase shape;  // what the records state: one request of S tokens, the indexer's selection
    shape.seqlens_q = shape.seqlens_k = {S};
    shape.num_q_heads = int(o.hq);
    shape.num_kv_heads = int(o.hkv);
    shape.head_dim = int(D);
    shape.topk = int(o.topk);
    shape.pattern = Pattern::idx;
    for (const auto& [op, call] : ops) {
      const HostTimes t = time_calls(call, o.calls, s);
      msa::check_status(st, s);
      const Launches l = count_launches(call, s);
      std::printf("%-18s S=%lld Hq=%lld Hkv=%lld topk=%lld: host %.1f us per call (min %.1f, max "
                  "%.1f), GPU %.1f us per call, %d launches, %d memsets\n",
                  op, (long long)S, (long long)o.hq, (long long)o.hkv, (long long)o.topk,
                  t.median_us, t.min_us, t.max_us, t.gpu_us, l.kernels, l.memsets);
      if (o.json.empty()) continue;
      Json r = new_record("LAT-CPP", op);
      add_shape(r, shape);
      add_dtypes(r, "bf16", "bf16");
      r["host_us_median"] = t.median_us;
      r["host_us_min"] = t.min_us;
      r["host_us_max"] = t.max_us;
      r["gpu_us"] = t.gpu_us;
      r["launches"] = l.kernels;
      r["memsets"] = l.memsets;
      r["other_nodes"] = l.other;
      r["calls"] = o.calls;
      add_environment(r, /*on_gpu=*/true, "none");
      append_record(o.json, r);
    }
    MSA_BENCH_CUDA(cudaStreamDestroy(s));
    return 0;
  } catch (const msa::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 3;
  }
}
