// Library version and build capabilities.
#pragma once

namespace msa {
// The project's only copy of its version: CMake and pyproject.toml read it from this line.
inline constexpr const char* kVersion = "0.1.0";
// True when this build contains the CUDA backend (the GPU may still be absent at run time).
bool built_with_cuda();
// Number of usable CUDA devices (0 without CUDA or without a GPU).
int cuda_device_count();
}  // namespace msa
