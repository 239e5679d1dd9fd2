// TMA descriptor builder (tma_map.h). The driver entry point is fetched once through the runtime,
// so msa links only cudart.
#include <cudaTypedefs.h>

#include "cuda/device/check.h"
#include "cuda/device/tma_map.h"

namespace msa::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    MSA_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                                    cudaEnableDefault, &q));
    MSA_CHECK(f != nullptr && q == cudaDriverEntryPointSuccess,
              "CUDA driver: cuTensorMapEncodeTiled not available (driver too old for TMA)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

CUtensorMapDataType tma_type(DType t) {
  switch (t) {
    case DType::bf16: return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    case DType::f16: return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    case DType::fp8_e4m3: return CU_TENSOR_MAP_DATA_TYPE_UINT8;
    default: fail("TMA: unsupported dtype ", dtype_name(t));
  }
}

}  // namespace

CUtensorMap make_tma_3d(const Tensor& t, uint32_t box_cols, uint32_t box_heads,
                        uint32_t box_tokens, const char* op) {
  CUtensorMap m;
  const size_t es = dtype_size(t.dtype);
  const cuuint64_t dims[3] = {cuuint64_t(t.shape[2]), cuuint64_t(t.shape[1]),
                              cuuint64_t(t.shape[0] > 0 ? t.shape[0] : 1)};
  const cuuint64_t strides[2] = {cuuint64_t(t.strides[1]) * es, cuuint64_t(t.strides[0]) * es};
  const cuuint32_t box[3] = {box_cols, box_heads, box_tokens};
  const cuuint32_t elem[3] = {1, 1, 1};
  const CUresult r = encode_fn()(&m, tma_type(t.dtype), 3, t.data, dims, strides, box, elem,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MSA_CHECK(r == CUDA_SUCCESS, op, ": cuTensorMapEncodeTiled failed (", int(r), ") for ",
            t.describe(), "; strides must be multiples of 16 bytes");
  return m;
}

CUtensorMap make_tma_paged(const Tensor& pool, bool slots_outer, uint32_t box_cols,
                           uint32_t box_keys, const char* name, const char* op,
                           uint32_t l2_promotion) {
  MSA_CHECK(l2_promotion == 128 || l2_promotion == 256, op,
            ": L2 promotion of 128 or 256 bytes, got ", l2_promotion);
  const size_t es = dtype_size(pool.dtype);
  cuuint64_t dims[4], strides[3];
  for (int i = 0; i < 4; ++i) dims[i] = cuuint64_t(pool.shape[3 - i]);
  for (int i = 0; i < 3; ++i) {
    const int d = 2 - i;  // tensor dim of map dim i + 1
    const int64_t bytes = pool.strides[d] * int64_t(es);
    MSA_CHECK(pool.shape[d] == 1 || (bytes > 0 && bytes % 16 == 0 && bytes < (int64_t(1) << 40)),
              op, ": ", name, ": stride of dim ", d, " (", pool.strides[d], " elements) must be "
              "positive, a multiple of 16 bytes and below 2^40 bytes for the CUDA paged loads, "
              "got ", pool.describe());
    strides[i] = pool.shape[d] == 1 ? cuuint64_t(pool.shape[3]) * es : cuuint64_t(bytes);
  }
  const cuuint32_t box[4] = {box_cols, slots_outer ? 1u : box_keys, slots_outer ? box_keys : 1u, 1};
  const cuuint32_t elem[4] = {1, 1, 1, 1};
  CUtensorMap m;
  const CUresult r = encode_fn()(&m, tma_type(pool.dtype), 4, pool.data, dims, strides, box, elem,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 l2_promotion == 128 ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B
                                                     : CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MSA_CHECK(r == CUDA_SUCCESS, op, ": cuTensorMapEncodeTiled failed (", int(r), ") for the paged ",
            name, " pool ", pool.describe());
  return m;
}

}  // namespace msa::cuda
