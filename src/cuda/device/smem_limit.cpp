// dynamic_smem_limit / allow_dynamic_smem (smem_limit.h): one attribute call per (device,
// kernel), the limits kept in a process-wide table behind a mutex (a lookup costs well under a
// microsecond).
#include "cuda/device/smem_limit.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "cuda/device/check.h"
#include "msa/error.h"

namespace msa::cuda {

size_t dynamic_smem_limit(const void* kernel, bool max_carveout) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, size_t> limits;  // (device, kernel) -> bytes
  int device = 0;
  MSA_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  auto it = limits.find({device, kernel});
  if (it != limits.end()) return it->second;
  int optin = 0;
  MSA_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  cudaFuncAttributes attr{};
  MSA_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  const size_t most = size_t(optin) > attr.sharedSizeBytes ? size_t(optin) - attr.sharedSizeBytes : 0;
  MSA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(most)));
  if (max_carveout)
    MSA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        int(cudaSharedmemCarveoutMaxShared)));
  limits.emplace(std::make_pair(device, kernel), most);
  return most;
}

void allow_dynamic_smem(const void* kernel, size_t bytes, const char* op, bool max_carveout) {
  const size_t most = dynamic_smem_limit(kernel, max_carveout);
  MSA_CHECK(bytes <= most, op, ": a block needs ", bytes, " bytes of dynamic shared memory; the ",
            "device allows ", most, " beside the kernel's static shared memory");
}

}  // namespace msa::cuda
