// CUDA runtime facts for the library (built_with_cuda, device count) and the error check macro
// users of the CUDA backend share (device/check.h).
#include <cuda_runtime.h>

#include "msa/version.h"

namespace msa {

bool built_with_cuda() { return true; }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error so later calls start clean
    return 0;
  }
  return n;
}

}  // namespace msa
