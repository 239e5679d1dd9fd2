// The single-shape benchmarks' options, inputs, case and main() (single_shape.h).
#include "workloads/single_shape.h"

#include <cstdio>
#include <cstdlib>

#include "workloads/gpu_timing.h"
#include "workloads/inputs.h"

namespace msa::bench {

RunOptions parse_run_options(int argc, char** argv, const char* program, bool fp8_allowed,
                             bool partial_allowed) {
  RunOptions o;
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    MSA_CHECK(i + 1 < argc, program, ": option ", k, " needs a value");
    const char* v = argv[i + 1];
    if (k == "--seq") o.seq = std::atoll(v);
    else if (k == "--hq") o.hq = std::atoll(v);
    else if (k == "--hkv") o.hkv = std::atoll(v);
    else if (k == "--topk") o.topk = std::atoll(v);
    else if (k == "--iters") o.iters = std::atoi(v);
    else if (k == "--warmup") o.warmup = std::atoi(v);
    else if (k == "--json") o.json = v;
    else if (k == "--fp8" && fp8_allowed) o.fp8 = std::atoi(v) != 0;
    else if (k == "--fp8-scales" && fp8_allowed) {
      const std::string sv = v;
      MSA_CHECK(sv == "token" || sv == "tensor", program, ": --fp8-scales must be token or tensor, got ", sv);
      o.fp8_per_tensor = sv == "tensor";
    }
    else if (k == "--index" && partial_allowed) {
      const std::string sv = v;
      MSA_CHECK(sv == "m3" || sv == "shared", program, ": --index must be m3 or shared, got ", sv);
      o.m3 = sv == "m3";
    }
    else if (k == "--partial" && partial_allowed) {
      const std::string sv = v;
      MSA_CHECK(sv == "bf16" || sv == "f32", program, ": --partial must be bf16 or f32, got ", sv);
      o.partial = sv == "bf16" ? DType::bf16 : DType::f32;
    }
    else fail(program, ": unknown option ", k);
  }
  MSA_CHECK(o.seq > 0 && o.hkv > 0 && o.hq % o.hkv == 0 && o.iters > 0, program,
            ": need --seq > 0, --hkv > 0 dividing --hq, --iters > 0");
  return o;
}

int single_shape_main(int argc, char** argv, const char* program, int (*run)(const RunOptions&),
                      bool fp8_allowed, bool partial_allowed) {
  try {
    return run(parse_run_options(argc, argv, program, fp8_allowed, partial_allowed));
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 3;
  }
}

BenchCase case_as_run(std::string_view name, const RunOptions& o) {
  const BenchCase* named = find_case(name);
  MSA_CHECK(named != nullptr, "bench: no case named ", name);
  BenchCase c = *named;
  c.seqlens_q = c.seqlens_k = {o.seq};
  c.num_q_heads = int(o.hq);
  c.num_kv_heads = int(o.hkv);
  c.topk = int(o.topk);
  return c;
}

SingleRequestInputs::SingleRequestInputs(int64_t seq, int64_t hq, int64_t hkv, uint64_t seed,
                                         bool with_v, cudaStream_t s)
    : seq(seq), hq(hq), hkv(hkv), q(size_t(seq * hq * kHeadDim)), k(size_t(seq * hkv * kHeadDim)),
      v(with_v ? k.size() : 0), dq(gpu_buffer(q.size() * 2)), dk(gpu_buffer(k.size() * 2)),
      dcu(gpu_buffer(8)) {
  fill_normal_bf16(q.data(), int64_t(q.size()), seed, 0);
  fill_normal_bf16(k.data(), int64_t(k.size()), seed, 1);
  dq.upload(q, s);
  dk.upload(k, s);
  dcu.upload(std::vector<int32_t>{0, int32_t(seq)}, s);
  if (!with_v) return;
  fill_normal_bf16(v.data(), int64_t(v.size()), seed, 2);
  dv = gpu_buffer(v.size() * 2);
  dv.upload(v, s);
}

Tensor SingleRequestInputs::q_view() const { return gpu_view(dq.get(), DType::bf16, {seq, hq, kHeadDim}); }

Tensor SingleRequestInputs::cu_seqlens() const { return gpu_view(dcu.get(), DType::i32, {2}); }

KVCache SingleRequestInputs::kv() const {
  KVCache kv;
  kv.k = gpu_view(dk.get(), DType::bf16, {seq, hkv, kHeadDim});
  if (!v.empty()) kv.v = gpu_view(dv.get(), DType::bf16, {seq, hkv, kHeadDim});
  kv.cu_seqlens_k = cu_seqlens();
  return kv;
}

}  // namespace msa::bench
