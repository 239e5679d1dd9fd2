// Input generation, buffer setup and the four timed stages of the CLI pipeline (see pipeline.h).
#include "pipeline.h"

#include <algorithm>
#include <chrono>

#include "workloads/inputs.h"

namespace msa::cli {

const char* stage_name(Stage s) {
  switch (s) {
    case Stage::block_scores: return "block_scores";
    case Stage::select_topk: return "select_topk";
    case Stage::build_k2q_csr: return "build_k2q_csr";
    case Stage::attention_forward: return "attention_forward";
    case Stage::index_topk: return "block_topk";
  }
  return "?";
}

int64_t total_tokens(const Shape& s) {
  int64_t t = 0;
  for (int64_t l : s.seqlens) t += l;
  return t;
}

bench::SelectionShape selection_shape(const Shape& s) {
  bench::SelectionShape sel;
  sel.cu_seqlens_q.push_back(0);
  for (int64_t l : s.seqlens) sel.cu_seqlens_q.push_back(sel.cu_seqlens_q.back() + l);
  sel.cu_seqlens_k = sel.cu_seqlens_q;
  sel.num_kv_heads = s.num_kv_heads;
  sel.topk = s.topk;
  sel.kv_block_size = s.kv_block_size;
  sel.blk_queries = s.blk_queries;
  sel.causal = s.causal;
  sel.seed = s.seed;
  return sel;
}

HostInputs make_inputs(const Shape& s) {
  const int64_t total = total_tokens(s);
  HostInputs in;
  in.q.resize(static_cast<size_t>(total) * s.num_q_heads * s.head_dim);
  in.k.resize(static_cast<size_t>(total) * s.num_kv_heads * s.head_dim);
  in.v.resize(in.k.size());
  bench::fill_normal_bf16(in.q.data(), static_cast<int64_t>(in.q.size()), s.seed, 0);
  bench::fill_normal_bf16(in.k.data(), static_cast<int64_t>(in.k.size()), s.seed, 1);
  bench::fill_normal_bf16(in.v.data(), static_cast<int64_t>(in.v.size()), s.seed, 2);
  if (s.index_heads > 0) {
    in.index_q.resize(static_cast<size_t>(total) * s.index_heads * s.head_dim);
    in.index_k.resize(in.k.size());
    bench::fill_normal_bf16(in.index_q.data(), static_cast<int64_t>(in.index_q.size()), s.seed, 3);
    bench::fill_normal_bf16(in.index_k.data(), static_cast<int64_t>(in.index_k.size()), s.seed, 4);
  }
  in.cu_seqlens.push_back(0);
  for (int64_t l : s.seqlens) in.cu_seqlens.push_back(static_cast<int32_t>(in.cu_seqlens.back() + l));
  return in;
}

namespace {

// A stage's arguments with what the stages share already set: the query lengths (Lq = Lk), the KV
// cache, the block size, the mask where the stage has one, and the status buffer.
template <typename Args>
Args stage_args(const KVCache& kv, const Shape& s, const Tensor& status) {
  Args a;
  a.cu_seqlens_q = kv.cu_seqlens_k;
  a.kv = kv;
  a.kv_block_size = s.kv_block_size;
  if constexpr (requires { a.causal; }) a.causal = s.causal;
  a.status = status;
  return a;
}

}  // namespace

Pipeline::Pipeline(const Shape& shape, const HostInputs& in, Device device)
    : shape_(shape), device_(device), total_(total_tokens(shape)) {
  for (int64_t l : shape.seqlens) {
    const int64_t nblk = (l + shape.kv_block_size - 1) / shape.kv_block_size;
    nblk_max_ = std::max(nblk_max_, nblk);
    total_rows_ += nblk;
  }
  const int64_t hq = shape.num_q_heads, hkv = shape.num_kv_heads, d = shape.head_dim;
  const int64_t topk = shape.topk;
  q_ = Buffer::from_host(in.q, device);
  k_ = Buffer::from_host(in.k, device);
  v_ = Buffer::from_host(in.v, device);
  cu_ = Buffer::from_host(in.cu_seqlens, device);
  if (shape.index_heads > 0) {
    index_q_ = Buffer::from_host(in.index_q, device);
    index_k_ = Buffer::from_host(in.index_k, device);
  }
  scores_ = Buffer(static_cast<size_t>(hq * nblk_max_ * total_) * 4, device);
  q2k_ = Buffer(static_cast<size_t>(hkv * total_ * topk) * 4, device);
  row_ptr_ = Buffer(static_cast<size_t>(hkv * (total_rows_ + 1)) * 4, device);
  q_idx_ = Buffer(static_cast<size_t>(hkv * total_ * topk) * 4, device);
  schedule_ = Buffer(static_cast<size_t>(k2q_schedule_size(hkv, total_rows_, total_, topk)) * 4, device);
  if (device.type == DeviceType::cuda) {
    csr_ws_ = Buffer(csr_workspace_bytes(hkv, total_rows_, total_, topk), device);
    status_ = Buffer(4 * sizeof(int32_t), device);
    stream_ = stream_create();
  }
  out_ = Buffer(static_cast<size_t>(total_ * hq * d) * 2, device);
  lse_ = Buffer(static_cast<size_t>(hq * total_) * 4, device);
  // Poisoned with NaN so that a row the attention never writes fails the check.
  out_.fill(0xff);
  lse_.fill(0xff);
  kv_.k = k_.view(DType::bf16, {total_, hkv, d});
  kv_.v = v_.view(DType::bf16, {total_, hkv, d});
  kv_.layout = KVLayout::flat;
  kv_.cu_seqlens_k = cu_.view(DType::i32, {static_cast<int64_t>(in.cu_seqlens.size())});
}

Pipeline::~Pipeline() {
  if (stream_ != nullptr) stream_destroy(stream_);
}

double Pipeline::run(Stage s) {
  const bool gpu = device_.type == DeviceType::cuda;
  if (gpu) clear_status(status_.view(DType::i32, {4}), stream_);
  if (gpu) stream_synchronize(stream_);
  const auto t0 = std::chrono::steady_clock::now();
  call(s);
  if (gpu) stream_synchronize(stream_);
  const auto t1 = std::chrono::steady_clock::now();
  if (gpu) check_status(status_.view(DType::i32, {4}), stream_);
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

void Pipeline::call(Stage s) {
  const int64_t hq = shape_.num_q_heads, hkv = shape_.num_kv_heads, d = shape_.head_dim;
  const int64_t topk = shape_.topk;
  const Tensor q = q_.view(DType::bf16, {total_, hq, d});
  const Tensor q2k = q2k_.view(DType::i32, {hkv, total_, topk});
  const Tensor status = status_.data() ? status_.view(DType::i32, {4}) : Tensor();
  const Tensor scores = scores_.view(DType::f32, {hq, nblk_max_, total_});
  K2QIndex k2q;
  k2q.row_ptr = row_ptr_.view(DType::i32, {hkv, total_rows_ + 1});
  k2q.q_idx = q_idx_.view(DType::i32, {hkv, total_ * topk});
  if (schedule_.bytes() > 0)
    k2q.schedule = schedule_.view(DType::i32, {static_cast<int64_t>(schedule_.bytes() / 4)});
  switch (s) {
    case Stage::block_scores: {
      auto a = stage_args<BlockScoresArgs>(kv_, shape_, status);
      a.q = q;
      a.scores = scores;
      block_scores(a, stream_);
      return;
    }
    case Stage::select_topk: {
      auto a = stage_args<TopKArgs>(kv_, shape_, status);
      a.scores = scores;
      a.num_kv_heads = shape_.num_kv_heads;
      a.topk = shape_.topk;
      a.q2k = q2k;
      select_topk(a, stream_);
      return;
    }
    case Stage::build_k2q_csr: {
      auto a = stage_args<CsrBuildArgs>(kv_, shape_, status);
      a.q2k = q2k;
      a.out = k2q;
      if (csr_ws_.bytes() > 0) a.workspace = csr_ws_.view(DType::u8, {static_cast<int64_t>(csr_ws_.bytes())});
      build_k2q_csr(a, stream_);
      return;
    }
    case Stage::attention_forward:
      attention(q, q2k, k2q, status);
      return;
    case Stage::index_topk: {
      auto a = stage_args<BlockTopKArgs>(kv_, shape_, status);
      a.q = q;
      if (shape_.index_heads > 0) {
        a.q = index_q_.view(DType::bf16, {total_, shape_.index_heads, d});
        a.kv.k = index_k_.view(DType::bf16, {total_, hkv, d});
      }
      a.kv.v = QTensor();
      a.topk = shape_.topk;
      a.q2k = q2k;
      block_topk(a, stream_);
      return;
    }
  }
}

void Pipeline::attention(const Tensor& q, const Tensor& q2k, const K2QIndex& k2q, const Tensor& status) {
  AttentionArgs a;
  a.q = q;
  a.kv = kv_;
  a.cu_seqlens_q = kv_.cu_seqlens_k;
  a.q2k = q2k;
  a.k2q = k2q;
  a.out = out_.view(DType::bf16, {total_, shape_.num_q_heads, shape_.head_dim});
  a.lse = lse_.view(DType::f32, {shape_.num_q_heads, total_});
  a.params.causal = shape_.causal;
  a.params.kv_block_size = shape_.kv_block_size;
  a.status = status;
  // The workspace size depends on the args, so it is sized (once) right before the first run.
  const size_t need = attention_workspace_bytes(a);
  if (attn_ws_.bytes() < need) attn_ws_ = Buffer(need, device_);
  if (need > 0) a.workspace = attn_ws_.view(DType::u8, {static_cast<int64_t>(need)});
  attention_forward(a, stream_);
}

void Pipeline::set_q2k(const std::vector<int32_t>& q2k) {
  MSA_CHECK(q2k.size() * 4 == q2k_.bytes(), "msa cli: selection has ", q2k.size(),
            " entries, expected ", q2k_.bytes() / 4);
  q2k_.upload(q2k.data(), q2k_.bytes());
}

std::vector<int32_t> Pipeline::q2k() const {
  std::vector<int32_t> h(q2k_.bytes() / 4);
  q2k_.download(h.data(), q2k_.bytes());
  return h;
}

std::vector<uint16_t> Pipeline::out_row(int64_t t, int64_t hq) const {
  const int64_t d = shape_.head_dim;
  std::vector<uint16_t> row(static_cast<size_t>(d));
  out_.download(row.data(), row.size() * 2, static_cast<size_t>((t * shape_.num_q_heads + hq) * d) * 2);
  return row;
}

float Pipeline::lse(int64_t t, int64_t hq) const {
  float x;
  lse_.download(&x, 4, static_cast<size_t>(hq * total_ + t) * 4);
  return x;
}

}  // namespace msa::cli
