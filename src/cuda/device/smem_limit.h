// A kernel's dynamic shared-memory limit (cudaFuncAttributeMaxDynamicSharedMemorySize), raised
// once per device and kernel instead of on every launch: cudaFuncSetAttribute costs ~2 us of host
// time a call and made the kernel's next launch ~5 us slower (H200, CUPTI trace of LAT-8K's
// pipeline: block_scores' launch 8.9 us against 4-5 us for the others). The attribute belongs to
// the device's context, so a once-per-process flag left every device but the first without it.
#pragma once

#include <cstddef>

namespace msa::cuda {

// Lets `kernel` launch on the current device with `bytes` of dynamic shared memory. The first
// call for a (device, kernel) raises its limit to the most the device allows beside the kernel's
// static shared memory (each launch's own size still sets its occupancy), with the preferred
// carveout at its maximum when `max_carveout` (kernels that need two CTAs' worth of an SM).
// Later calls are a lookup. A `bytes` past that most is an msa::Error naming `op`.
void allow_dynamic_smem(const void* kernel, size_t bytes, const char* op, bool max_carveout = false);
// That most, raising the limit on the first call as allow_dynamic_smem does.
size_t dynamic_smem_limit(const void* kernel, bool max_carveout = false);

template <typename Kernel>
void allow_dynamic_smem(Kernel* kernel, size_t bytes, const char* op, bool max_carveout = false) {
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), bytes, op, max_carveout);
}
template <typename Kernel>
size_t dynamic_smem_limit(Kernel* kernel, bool max_carveout = false) {
  return dynamic_smem_limit(reinterpret_cast<const void*>(kernel), max_carveout);
}

}  // namespace msa::cuda
