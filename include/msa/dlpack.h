// DLPack <-> msa::Tensor. Needs dlpack/dlpack.h (DLPack >= 1.1 for the fp8/fp4 codes): msa ships
// DLPack 1.3's (third_party/dlpack; installed as include/msa/third_party/dlpack/dlpack.h, on the
// include path of msa::msa).
#pragma once

#include <dlpack/dlpack.h>

#include "msa/tensor.h"

namespace msa {

// from_dlpack applies byte_offset and fills default (contiguous) strides when the producer gives
// none. Accepted dtypes: float 16/32, bfloat16, float8_e4m3fn, float8_e8m0fnu, float4_e2m1fn
// with lanes 2 (-> fp4x2), uint8, int32; devices: CPU, CUDA host, CUDA.
Tensor from_dlpack(const DLTensor& t);
// Points out->shape / out->strides into `t`, so `t` must outlive the DLTensor.
void to_dlpack(const Tensor& t, DLTensor* out);

}  // namespace msa
