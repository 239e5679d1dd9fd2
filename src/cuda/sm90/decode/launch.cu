// Host side of the CUDA decode (backend.h: decode_workspace_bytes / decode_plan / decode_run):
// plan() builds the work list (plan.cpp) and copies it into the caller's workspace; run() fills
// the kernel parameters from the arguments and dispatches to one of the instantiations.
// run() neither allocates nor synchronizes, so it can be captured in a CUDA graph.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend.h"
#include "cuda/sm90/decode/launch_kernels.h"
#include "cuda/sm90/decode/plan.h"
#include "cuda/sm90/decode/traits.h"
#include "cuda/device/check.h"
#include "cuda/device/tma_map.h"

namespace msa::cuda {
namespace {

using decode::DecodeParams;
using decode::Geometry;

int sm_count(const Device& d) {
  int n = 0;
  MSA_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, d.index));
  return n;
}

decode::DeviceLimits device_limits(const Device& d, int sms) {
  int per_sm = 0, reserved = 0;
  MSA_CUDA_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, d.index));
  MSA_CUDA_CHECK(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, d.index));
  return {sms, size_t(per_sm), size_t(reserved)};
}

int log2_exact(int64_t x) {
  int s = 0;
  while ((int64_t(1) << s) < x) ++s;
  return s;
}

// Key slots of a pipeline stage of the shape's KV kind, head dim and CTA width (traits.h).
template <int kD>
int stage_keys(bool fp8, int warps) {
  using decode::KV;
  using decode::Traits;
  if constexpr (kD != 64) {  // FP8 KV needs D >= 128 (plan.h has_kernels)
    if (fp8)
      return warps == 4 ? Traits<KV::fp8, 4, kD>::kStageKeys : Traits<KV::fp8, 8, kD>::kStageKeys;
  }
  return warps == 4 ? Traits<KV::native, 4, kD>::kStageKeys : Traits<KV::native, 8, kD>::kStageKeys;
}

DecodeParams make_params(const AttentionArgs& a, const DecodeShape& s, const Geometry& g,
                         const DecodeWork& w, const Tensor& workspace) {
  DecodeParams p;
  p.q = a.q.data;
  p.q_stride_t = a.q.strides[0];
  p.q_stride_h = a.q.strides[1];
  p.q_scale = a.q_scale.defined() ? a.q_scale.ptr<float>() : nullptr;
  p.q_scale_kind = a.q_scale.defined() ? fp8_scale_kind(a.q_scale) : 0;
  p.num_q_heads = s.num_q_heads;
  const Tensor& k = a.kv.k.values;
  const Tensor& v = a.kv.v.values;
  const bool nhd = s.layout == KVLayout::paged_nhd;
  p.k = k.data;
  p.v = v.data;
  p.k_stride_page = k.strides[0];
  p.k_stride_slot = nhd ? k.strides[1] : k.strides[2];
  p.k_stride_head = nhd ? k.strides[2] : k.strides[1];
  p.v_stride_page = v.strides[0];
  p.v_stride_slot = nhd ? v.strides[1] : v.strides[2];
  p.v_stride_head = nhd ? v.strides[2] : v.strides[1];
  if (s.kv_dtype == DType::fp4x2) {
    // NVFP4: the e4m3 scale pools in the values' layout (checked by the api), and the global
    // scales.
    const Tensor& ks = a.kv.k.scale;
    const Tensor& vs = a.kv.v.scale;
    p.k_sf = ks.ptr<uint8_t>();
    p.v_sf = vs.ptr<uint8_t>();
    p.k_sf_stride_page = ks.strides[0];
    p.k_sf_stride_slot = nhd ? ks.strides[1] : ks.strides[2];
    p.k_sf_stride_head = nhd ? ks.strides[2] : ks.strides[1];
    p.v_sf_stride_page = vs.strides[0];
    p.v_sf_stride_slot = nhd ? vs.strides[1] : vs.strides[2];
    p.v_sf_stride_head = nhd ? vs.strides[2] : vs.strides[1];
    p.k_global = a.kv.k.global_scale;
    p.v_global = a.kv.v.global_scale;
  } else {
    p.k_scale = a.kv.k.scale.defined() ? a.kv.k.scale.ptr<float>() : nullptr;
    p.v_scale = a.kv.v.scale.defined() ? a.kv.v.scale.ptr<float>() : nullptr;
    // Scale kinds (params.h) from the validated shapes: [1], [pool slots] or [pool slots, Hkv].
    p.k_scale_kind = fp8_scale_kind(a.kv.k.scale);
    p.v_scale_kind = fp8_scale_kind(a.kv.v.scale);
    p.slot_scales = p.k_scale_kind >= 2 || p.v_scale_kind >= 2 ? 1 : 0;
  }
  p.page_table = a.kv.page_table.ptr<int32_t>();
  p.page_table_stride = a.kv.page_table.strides[0];
  p.seqused_k = a.kv.seqused_k.defined() ? a.kv.seqused_k.ptr<int32_t>() : nullptr;
  p.cu_seqlens_q = a.cu_seqlens_q.ptr<int32_t>();
  p.q2k = a.q2k.defined() ? a.q2k.ptr<int32_t>() : nullptr;
  p.out = a.out.data;
  p.out_stride_t = a.out.strides[0];
  p.out_stride_h = a.out.strides[1];
  p.lse = a.lse.defined() ? a.lse.ptr<float>() : nullptr;

  auto* base = static_cast<uint8_t*>(workspace.data);
  p.items = reinterpret_cast<const decode::DecodeItem*>(base + g.off_items);
  p.jobs = reinterpret_cast<const decode::CombineJob*>(base + g.off_jobs);
  p.key_cap = reinterpret_cast<const int32_t*>(base + g.off_caps);
  p.part_o = reinterpret_cast<float*>(base + g.off_part_o);
  p.part_lse = reinterpret_cast<float*>(base + g.off_part_lse);
  p.offence = reinterpret_cast<unsigned long long*>(base + g.off_offence);
  p.done = reinterpret_cast<unsigned int*>(base + g.off_offence + sizeof(unsigned long long));
  p.job_done = reinterpret_cast<unsigned int*>(base + g.off_job_done);
  p.status = a.status.ptr<int32_t>();

  p.num_items = w.items;
  p.batch = s.batch;
  p.total_q = int32_t(a.q.shape[0]);
  p.num_kv_heads = s.num_kv_heads;
  p.group = g.group;
  p.group_shift = (g.group & (g.group - 1)) == 0 ? log2_exact(g.group) : -1;
  p.topk = s.topk;
  p.kv_block_size = s.kv_block_size;
  p.block_shift = log2_exact(s.kv_block_size);
  p.page_size = s.page_size;
  p.page_shift = log2_exact(s.page_size);
  p.max_pages = s.max_pages;
  p.num_pages = int32_t(k.shape[0]);
  p.head_major = nhd ? 0 : 1;
  // TMA boxes (load.cuh): the largest power of two of slots that divides the page, the sparse kv
  // block and the stage, so that a box's keys are consecutive and lie in one page.
  const bool fp8 = s.kv_dtype == DType::fp8_e4m3;
  const int keys = s.head_dim == 64    ? stage_keys<64>(fp8, g.warps)
                   : s.head_dim == 256 ? stage_keys<256>(fp8, g.warps)
                                       : stage_keys<128>(fp8, g.warps);
  // At most 128 slots: boxes of 256 (FP8's dense stage over pages of 256 slots) loaded wrong data
  // (DecodeGpu.Pages256: rel L2 ~0.3 against the CPU; the same stages in two 128-slot boxes
  // match), cause not found; the second box is one more TMA instruction per 256 slots.
  int box = std::min({s.page_size, keys, 128});
  if (g.sparse) box = std::min(box, s.kv_block_size);  // token ids: 1, unused (no TMA boxes)
  p.box_shift = log2_exact(box);
  p.max_queries = s.max_queries_per_request;
  p.queries_per_chunk = g.queries_per_chunk;
  p.head_chunks = g.head_chunks;
  p.heads_per_chunk = g.heads_per_chunk;
  p.rows_max = g.rows_max;
  p.bitmap_words = g.bitmap_words;
  p.warps = g.warps;
  p.identity_tiles = w.identity_tiles;
  p.chunks = g.chunks;
  p.causal = a.params.causal ? 1 : 0;
  p.kv_evict_first = decode::kv_evict_first(g, w.items, s.num_kv_heads) ? 1 : 0;
  // The scale as callers pass it, a float (the default 1/sqrt(D) rounded to float, as the CPU
  // reference does), then into log2 units for exp2.
  const float scale = a.params.softmax_scale != 0.f ? a.params.softmax_scale
                                                    : float(1.0 / std::sqrt(double(s.head_dim)));
  p.scale_log2 = float(double(scale) * 1.4426950408889634);
  return p;
}

// Raises the shared-memory limits of the kernels of head dim kD for every q type the KV kind
// takes (run() learns q's type from its arguments). geometry() has refused the kinds without
// kernels at kD (plan.h has_kernels).
template <int kD>
void set_smem_limits(DType kv) {
  using decode::KV;
  if (kv == DType::fp8_e4m3) {
    if constexpr (kD != 64) {
      decode::set_smem_limit<__nv_bfloat16, KV::fp8, kD>();
      decode::set_smem_limit<__half, KV::fp8, kD>();
      decode::set_smem_limit<__nv_fp8_e4m3, KV::fp8, kD>();
    }
  } else if (kv == DType::fp4x2) {
    if constexpr (kD == 128) {
      decode::set_smem_limit<__nv_bfloat16, KV::nvfp4, kD>();
      decode::set_smem_limit<__half, KV::nvfp4, kD>();
      decode::set_smem_limit<__nv_fp8_e4m3, KV::nvfp4, kD>();
    }
  } else if (kv == DType::f16) {
    decode::set_smem_limit<__half, KV::native, kD>();
  } else {
    decode::set_smem_limit<__nv_bfloat16, KV::native, kD>();
    decode::set_smem_limit<__nv_fp8_e4m3, KV::native, kD>();
  }
}

// The kernel of q's type and the KV kind at head dim kD (kinds without kernels at kD: as above).
template <int kD>
void launch_kernels(const DecodeParams& p, DType q, DType kv, const CUtensorMap& tm_k,
                    const CUtensorMap& tm_v, cudaStream_t stream) {
  using decode::KV;
  // geometry() refused these already; a kind without kernels must never launch nothing.
  MSA_CHECK(decode::has_kernels(kv, kD), "decode: no CUDA kernel for ", dtype_name(kv),
            " KV at head_dim ", kD);
  const bool f16 = q == DType::f16, q8 = q == DType::fp8_e4m3;
  if (kv == DType::fp8_e4m3) {
    if constexpr (kD != 64) {
      if (q8) decode::launch<__nv_fp8_e4m3, KV::fp8, kD>(p, tm_k, tm_v, stream);
      else if (f16) decode::launch<__half, KV::fp8, kD>(p, tm_k, tm_v, stream);
      else decode::launch<__nv_bfloat16, KV::fp8, kD>(p, tm_k, tm_v, stream);
    }
  } else if (kv == DType::fp4x2) {
    if constexpr (kD == 128) {
      if (q8) decode::launch<__nv_fp8_e4m3, KV::nvfp4, kD>(p, tm_k, tm_v, stream);
      else if (f16) decode::launch<__half, KV::nvfp4, kD>(p, tm_k, tm_v, stream);
      else decode::launch<__nv_bfloat16, KV::nvfp4, kD>(p, tm_k, tm_v, stream);
    }
  } else {
    if (q8) decode::launch<__nv_fp8_e4m3, KV::native, kD>(p, tm_k, tm_v, stream);  // bf16 KV
    else if (f16) decode::launch<__half, KV::native, kD>(p, tm_k, tm_v, stream);
    else decode::launch<__nv_bfloat16, KV::native, kD>(p, tm_k, tm_v, stream);
  }
}

}  // namespace

size_t decode_workspace_bytes(const DecodeShape& s) {
  return decode::workspace_bytes(s, device_limits(s.device, sm_count(s.device)));
}

DecodeWork decode_plan(const DecodeShape& s, const int32_t* seqused_k_host, const Tensor& workspace,
                       cudaStream_t stream, int warps) {
  DecodeWork w;
  w.sm_count = sm_count(s.device);
  const Geometry g = decode::geometry(s, device_limits(s.device, w.sm_count), warps);
  w.warps = g.warps;
  std::vector<int64_t> lengths(s.batch, int64_t(s.max_pages) * s.page_size);
  if (seqused_k_host)
    for (int b = 0; b < s.batch; ++b) lengths[b] = seqused_k_host[b];
  const decode::WorkList list = decode::build_work_list(s, g, lengths);
  MSA_CHECK(int64_t(list.items.size()) * s.num_kv_heads < INT32_MAX,
            "decode: ", list.items.size(), " work items x ", s.num_kv_heads,
            " kv heads exceed the grid limit of 2^31 - 1 CTAs");
  if (s.head_dim == 64) set_smem_limits<64>(s.kv_dtype);
  else if (s.head_dim == 256) set_smem_limits<256>(s.kv_dtype);
  else set_smem_limits<128>(s.kv_dtype);
  auto* base = static_cast<uint8_t*>(workspace.data);
  MSA_CUDA_CHECK(cudaMemsetAsync(base + g.off_offence, 0xff, sizeof(unsigned long long), stream));
  MSA_CUDA_CHECK(cudaMemsetAsync(base + g.off_offence + sizeof(unsigned long long), 0,
                                 sizeof(unsigned long long), stream));
  MSA_CUDA_CHECK(cudaMemsetAsync(base + g.off_job_done, 0,
                                 size_t(g.max_jobs) * s.num_kv_heads * sizeof(uint32_t), stream));
  auto upload = [&](size_t off, const void* src, size_t bytes) {
    if (bytes) MSA_CUDA_CHECK(cudaMemcpyAsync(base + off, src, bytes, cudaMemcpyHostToDevice, stream));
  };
  upload(g.off_items, list.items.data(), list.items.size() * sizeof(decode::DecodeItem));
  upload(g.off_jobs, list.jobs.data(), list.jobs.size() * sizeof(decode::CombineJob));
  upload(g.off_caps, list.key_cap.data(), list.key_cap.size() * sizeof(int32_t));
  // The host vectors die with this call; plan() may synchronize.
  MSA_CUDA_CHECK(cudaStreamSynchronize(stream));
  w.items = int64_t(list.items.size());
  w.identity_tiles = list.identity_tiles;
  return w;
}

void decode_run(const AttentionArgs& a, const DecodeShape& s, const DecodeWork& w,
                const Tensor& workspace, cudaStream_t stream) {
  const Geometry g = decode::geometry(s, device_limits(s.device, w.sm_count), w.warps);
  const DecodeParams p = make_params(a, s, g, w, workspace);
  const bool fp8 = s.kv_dtype == DType::fp8_e4m3, fp4 = s.kv_dtype == DType::fp4x2;
  // Boxes of one 128-byte line: 128 fp8 columns, or 64 of bf16 / f16 (a row is D / 128 or D / 64
  // lines). A 128-byte L2 fetch per line: fp8 NHD rows at D = 128 are one line, and with 256
  // bytes every row pulled in a line of the next head, which the per-head sparse selections
  // rarely read (measured on DEC-MTP fp8). An empty pool gets no map (every page id is out of
  // range, so no box is ever loaded by TMA). NVFP4 rows (load_fp4.cuh) and the rows of token ids
  // (kv_block_size 1, load.cuh issue_token_stage) are copied by cp.async and get no map.
  CUtensorMap tm_k{}, tm_v{};
  const bool tokens = g.sparse && s.kv_block_size == 1;
  if (p.num_pages > 0 && !fp4 && !tokens) {
    const bool nhd = s.layout == KVLayout::paged_nhd;
    const uint32_t cols = fp8 ? 128u : 64u, keys = 1u << p.box_shift;
    tm_k = make_tma_paged(a.kv.k.values, nhd, cols, keys, "k", "decode", 128);
    tm_v = make_tma_paged(a.kv.v.values, nhd, cols, keys, "v", "decode", 128);
  }
  if (s.head_dim == 64) launch_kernels<64>(p, a.q.dtype, s.kv_dtype, tm_k, tm_v, stream);
  else if (s.head_dim == 256) launch_kernels<256>(p, a.q.dtype, s.kv_dtype, tm_k, tm_v, stream);
  else launch_kernels<128>(p, a.q.dtype, s.kv_dtype, tm_k, tm_v, stream);
}

}  // namespace msa::cuda
