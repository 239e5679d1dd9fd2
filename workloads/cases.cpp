// The case table of bench/CASES.md (see cases.h). Defaults of every case: Hq=64, Hkv=4 (G=16),
// D=128, blk_kv=128, topK=16, bf16, causal; a case overrides only what the table says.
#include "workloads/cases.h"

#include <algorithm>
#include <sstream>

namespace msa::bench {
namespace {

const char* kNeedsPrefill = "the CUDA sparse prefill (attention_forward)";
const char* kNeedsTokenPrefill = "the CUDA token-sparse prefill (attention_forward, kv_block_size 1)";
const char* kNeedsDensePrefill = "the CUDA dense prefill (attention_forward without q2k)";
const char* kNeedsCsr = "the CUDA CSR builder (build_k2q_csr)";
const char* kNeedsIndexer = "the CUDA indexer (block_scores, select_topk)";
const char* kNeedsE2e = "the CUDA indexer, top-K, CSR builder and sparse prefill";
const char* kNeedsDecode = "the CUDA sparse decode (DecodePlan)";
const char* kNeedsDenseDecode = "the CUDA dense paged decode (DecodePlan)";
const char* kNeedsLatency = "the CUDA indexer, top-K, CSR builder and prefill (the pipeline)";

BenchCase prefill(std::string name, CaseKind kind, std::string timed, int64_t seq, Pattern p,
                  const char* needs) {
  BenchCase c;
  c.name = std::move(name);
  c.kind = kind;
  c.timed = std::move(timed);
  c.seqlens_q = c.seqlens_k = {seq};
  c.pattern = p;
  c.needs = needs;
  return c;
}

BenchCase decode(std::string name, std::string timed, int64_t batch, int64_t queries,
                 std::vector<int64_t> keys, const char* needs) {
  BenchCase c;
  c.name = std::move(name);
  c.kind = CaseKind::decode;
  c.timed = std::move(timed);
  c.seqlens_q.assign(batch, queries);
  c.seqlens_k = keys.size() == 1 ? std::vector<int64_t>(batch, keys[0]) : std::move(keys);
  c.page_size = 128;
  c.needs = needs;
  return c;
}

std::vector<BenchCase> make_cases() {
  const CaseKind fwd = CaseKind::sparse_prefill;
  std::vector<BenchCase> v;
  v.push_back(prefill("P8K-tok", fwd, "sparse attention forward", 8192, Pattern::tok, kNeedsPrefill));
  v.push_back(prefill("P32K-tok", fwd, "sparse attention forward", 32768, Pattern::tok, kNeedsPrefill));
  v.push_back(prefill("P32K-blk", fwd, "sparse attention forward", 32768, Pattern::blk, kNeedsPrefill));
  v.push_back(prefill("P48K-tok", fwd, "sparse attention forward", 49152, Pattern::tok, kNeedsPrefill));
  for (const Pattern pat : {Pattern::tok, Pattern::blk}) {  // 64-key blocks, the same keys per row
    BenchCase c = prefill(pat == Pattern::tok ? "P32K-tok64" : "P32K-blk64", fwd,
                          "sparse attention forward", 32768, pat, kNeedsPrefill);
    c.kv_block_size = 64;
    c.topk = 32;
    v.push_back(c);
  }
  // BSR-108K's problem through attention_forward: 64-query rows, each of its diagonal 64-key block
  // and random earlier ones (with block 0 and the one before), topK 64, Hq 32 over Hkv 8.
  BenchCase bsr = prefill("P108K-bsr64", fwd, "sparse attention forward", 110592, Pattern::blk,
                          kNeedsPrefill);
  bsr.num_q_heads = 32;
  bsr.num_kv_heads = 8;
  bsr.kv_block_size = 64;
  bsr.topk = 64;
  bsr.blk_queries = 64;
  v.push_back(bsr);
  for (const Pattern pat : {Pattern::tok, Pattern::blk}) {  // bf16 q over FP8 K/V
    BenchCase c = prefill(pat == Pattern::tok ? "P32K-tok-fp8kv" : "P32K-blk-fp8kv", fwd,
                          "sparse attention forward, FP8 K/V", 32768, pat, kNeedsPrefill);
    c.kv_dtypes = "fp8";
    v.push_back(c);
  }
  // Mixed FP8: q, K and V e4m3 with per-token-and-head scales, QK^T in FP8, P V in bf16.
  BenchCase fp8qk = prefill("P32K-blk-fp8qk", fwd, "sparse attention forward, FP8 q/K/V (QK in FP8)",
                            32768, Pattern::blk, kNeedsPrefill);
  fp8qk.kv_dtypes = "fp8qk";
  v.push_back(fp8qk);
  fp8qk.name = "P32K-blk-fp8qk-tensor";  // one scale per tensor for each of q, K and V
  fp8qk.kv_dtypes = "fp8qk-tensor";
  v.push_back(fp8qk);
  BenchCase nvfp4 = prefill("P32K-blk-nvfp4kv", fwd, "sparse attention forward, NVFP4 K/V", 32768,
                            Pattern::blk, kNeedsPrefill);
  nvfp4.kv_dtypes = "nvfp4";
  v.push_back(nvfp4);
  // The other head dims (DENSE-16K-D64 / -D256's shapes, topK 16): the KV-major and uniform
  // kernels at D = 64 and 256, against the dense kernel of the same shape.
  for (const Pattern pat : {Pattern::tok, Pattern::blk})
    for (const int d : {64, 256}) {
      BenchCase c = prefill(std::string(pat == Pattern::tok ? "P16K-tok-D" : "P16K-blk-D") +
                                std::to_string(d),
                            fwd, "sparse attention forward", 16384, pat, kNeedsPrefill);
      c.head_dim = d;
      if (d == 64) c.num_kv_heads = 8;
      else c.num_q_heads = 32;
      v.push_back(c);
    }
  BenchCase varlen = prefill("VARLEN-tok", fwd, "sparse attention forward", 0, Pattern::tok, kNeedsPrefill);
  varlen.seqlens_q = varlen.seqlens_k = {1024, 2048, 3072, 5120, 8192, 12288, 16384, 17408};
  v.push_back(varlen);
  // Dense attention (no q2k). The benchmark's reference and pair counts read a selection of every
  // visible block: the tok pattern with topK >= the blocks of the longest request.
  auto dense_prefill = [&](std::string name, std::vector<int64_t> lens) {
    BenchCase c = prefill(std::move(name), fwd, "dense attention forward", 0, Pattern::tok,
                          kNeedsDensePrefill);
    c.seqlens_q = c.seqlens_k = lens;
    c.topk = int(*std::max_element(lens.begin(), lens.end()) + 127) / 128;
    c.dense = true;
    return c;
  };
  v.push_back(dense_prefill("DENSE-8K", {8192}));
  v.push_back(dense_prefill("DENSE-32K", {32768}));
  v.push_back(dense_prefill("DENSE-VARLEN", varlen.seqlens_q));
  BenchCase d64 = dense_prefill("DENSE-16K-D64", {16384});
  d64.num_kv_heads = 8;
  d64.head_dim = 64;
  v.push_back(d64);
  BenchCase d256 = dense_prefill("DENSE-16K-D256", {16384});
  d256.num_q_heads = 32;
  d256.head_dim = 256;
  v.push_back(d256);
  // 2048 new queries of each of 4 requests over their 32768 cached keys and themselves
  // (bottom-right causal), K / V in a pool of 64-slot pages.
  BenchCase dense_chunk = dense_prefill("DENSE-CHUNK", std::vector<int64_t>(4, 2048));
  dense_chunk.seqlens_k.assign(4, 32768 + 2048);
  dense_chunk.topk = (32768 + 2048) / 128;
  dense_chunk.page_size = 64;
  v.push_back(dense_chunk);
  // Token-sparse attention (DESIGN.md 17): 2048 key ids per (kv head, query), the 128 most recent
  // visible keys and random earlier ones, over one shared kv head as DeepSeek's indexer-selected
  // attention has it (G = 64), or over 4 (G = 16) with ids drawn per kv head. 8K is the length at
  // which the FlexAttention peer (bench/peers_toksparse.py) still builds its mask.
  auto token_prefill = [&](std::string name, int64_t seq, int hkv) {
    BenchCase c = prefill(std::move(name), fwd, "token-sparse attention forward", seq, Pattern::ids,
                          kNeedsTokenPrefill);
    c.num_kv_heads = hkv;
    c.kv_block_size = 1;
    c.topk = 2048;
    return c;
  };
  v.push_back(token_prefill("TOKSPARSE-8K", 8192, 1));
  v.push_back(token_prefill("TOKSPARSE-32K", 32768, 1));
  v.push_back(token_prefill("TOKSPARSE-32K-G16", 32768, 4));
  v.push_back(prefill("CSR-32K", CaseKind::csr_build, "q2k -> k2q CSR + schedule build", 32768,
                      Pattern::tok, kNeedsCsr));
  v.push_back(prefill("IDX-32K-bf16", CaseKind::block_scores, "block scores (and fused top-K)",
                      32768, Pattern::idx, kNeedsIndexer));
  BenchCase idx8 = prefill("IDX-32K-fp8", CaseKind::block_scores, "block scores (and fused top-K)",
                           32768, Pattern::idx, kNeedsIndexer);
  idx8.kv_dtypes = "fp8";
  v.push_back(idx8);
  v.push_back(prefill("E2E-32K", CaseKind::end_to_end, "indexer + top-K + CSR + attention, end to end",
                      32768, Pattern::idx, kNeedsE2e));
  // The index branch of MiniMax-M3 (4 FP8 index heads on 1 index key head; attention 64/4): the
  // indexer stage is IDX-32K-M3-fp8.
  v.push_back(prefill("E2E-32K-M3", CaseKind::end_to_end,
                      "indexer (4 FP8 index heads on 1 key head) + top-K + CSR + attention", 32768,
                      Pattern::idx, kNeedsE2e));
  v.push_back(decode("DEC-B32", "sparse decode", 32, 1, {16384}, kNeedsDecode));
  BenchCase dense = decode("DEC-B32-dense", "dense paged decode", 32, 1, {16384}, kNeedsDenseDecode);
  dense.dense = true;
  v.push_back(dense);
  for (const int dim : {64, 256}) {  // the same decode at the other head dims CUDA decode takes
    BenchCase other = dense;
    other.name = "DEC-B32-dense-D" + std::to_string(dim);
    other.head_dim = dim;
    v.push_back(other);
  }
  BenchCase mtp = decode("DEC-MTP", "sparse decode, bf16 and fp8 KV", 30, 8, {67584}, kNeedsDecode);
  mtp.kv_dtypes = "bf16,fp8";
  v.push_back(mtp);
  BenchCase mtp8 = decode("DEC-MTP-fp8q", "sparse decode, FP8 q and KV", 30, 8, {67584}, kNeedsDecode);
  mtp8.kv_dtypes = "fp8q";
  v.push_back(mtp8);
  BenchCase mtp4 = decode("DEC-MTP-nvfp4", "sparse decode, NVFP4 KV", 30, 8, {67584}, kNeedsDecode);
  mtp4.kv_dtypes = "nvfp4";
  v.push_back(mtp4);
  std::vector<int64_t> skew(30, 60592);
  skew[0] = 270336;
  v.push_back(decode("DEC-SKEW", "sparse decode", 30, 8, skew, kNeedsDecode));
  v.push_back(decode("DEC-B2048", "sparse decode past the 1024-request limit", 2048, 1, {4096},
                     kNeedsDecode));
  // Latency: the pipeline (index branch of E2E-32K-M3: 4 FP8 index heads on 1 index key head),
  // attention_forward with its selection, dense attention; per call.
  const char* lat_timed = "time per call: pipeline, attention_forward, dense";
  for (const auto& [name, seq] : {std::pair{"LAT-256", 256}, {"LAT-2K", 2048}, {"LAT-8K", 8192}}) {
    BenchCase c = prefill(name, CaseKind::latency, lat_timed, seq, Pattern::idx, kNeedsLatency);
    if (seq == 256) c.num_q_heads = 8, c.num_kv_heads = 2;
    v.push_back(c);
  }
  // 8 requests of 512 new tokens appended to 8192 cached keys each (8704 keys), pages of 64.
  BenchCase chunk = prefill("LAT-CHUNK", CaseKind::latency, lat_timed, 0, Pattern::idx, kNeedsLatency);
  chunk.seqlens_q.assign(8, 512);
  chunk.seqlens_k.assign(8, 8192 + 512);
  chunk.page_size = 64;
  v.push_back(chunk);
  return v;
}

// "S=8192" for one length, "S=1024..17408" for a spread, "keys=16384" for decode.
std::string lengths(const char* label, const std::vector<int64_t>& v) {
  if (v.empty()) return std::string(label) + "=0";
  int64_t lo = v[0], hi = v[0];
  for (int64_t x : v) lo = std::min(lo, x), hi = std::max(hi, x);
  std::ostringstream os;
  os << label << "=" << lo;
  if (hi != lo) os << ".." << hi;
  return os.str();
}

}  // namespace

bool has_dtype(std::string_view list, std::string_view name) {
  for (size_t start = 0; start <= list.size();) {
    const size_t end = std::min(list.find(',', start), list.size());
    if (list.substr(start, end - start) == name) return true;
    start = end + 1;
  }
  return false;
}

const char* case_kind_name(CaseKind k) {
  switch (k) {
    case CaseKind::sparse_prefill: return "sparse_prefill";
    case CaseKind::csr_build: return "csr_build";
    case CaseKind::block_scores: return "block_scores";
    case CaseKind::end_to_end: return "end_to_end";
    case CaseKind::decode: return "decode";
    case CaseKind::latency: return "latency";
  }
  return "?";
}

const std::vector<BenchCase>& bench_cases() {
  static const std::vector<BenchCase> cases = make_cases();
  return cases;
}

const BenchCase* find_case(std::string_view name) {
  for (const BenchCase& c : bench_cases())
    if (c.name == name) return &c;
  return nullptr;
}

std::string describe_shape(const BenchCase& c) {
  std::ostringstream os;
  os << "B=" << c.seqlens_q.size() << " ";
  if (c.kind == CaseKind::decode || c.seqlens_q != c.seqlens_k) {
    os << lengths("q", c.seqlens_q) << " " << lengths("keys", c.seqlens_k);
    if (c.page_size > 0) os << " page=" << c.page_size;
  } else {
    os << lengths("S", c.seqlens_q);
  }
  os << " Hq=" << c.num_q_heads << " Hkv=" << c.num_kv_heads << " D=" << c.head_dim
     << " blk=" << c.kv_block_size;
  if (c.dense) {
    os << " dense";
  } else {
    os << " topK=" << c.topk << " " << pattern_name(c.pattern);
  }
  os << (c.causal ? " causal " : " non-causal ") << c.kv_dtypes;
  return os.str();
}

}  // namespace msa::bench
