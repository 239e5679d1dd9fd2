// Public check_status / clear_status (msa/common.h): validate the buffer, then read or reset it
// on the host (CPU buffers) or through the CUDA backend on the caller's stream.
#include <cstring>

#include "backend.h"

namespace msa {
namespace {

void check_status_tensor(const Tensor& status) {
  check_defined(status, "status");
  check_dtype(status, "status", {DType::i32});
  check_shape(status, "status", {4});
  check_contiguous(status, "status");
}

}  // namespace

void check_status(const Tensor& status, cudaStream_t stream) {
  check_status_tensor(status);
  int32_t s[4];
  if (status.is_cuda()) {
    cuda::read_status(status, stream, s);
  } else {
    std::memcpy(s, status.data, sizeof(s));
  }
  if (s[0] != 0) throw Error(describe_status(s));
}

void clear_status(const Tensor& status, cudaStream_t stream) {
  check_status_tensor(status);
  if (status.is_cuda()) {
    cuda::clear_status(status, stream);
  } else {
    std::memset(status.data, 0, 4 * sizeof(int32_t));
  }
}

}  // namespace msa
