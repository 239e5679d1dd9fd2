// Host tensors on the device for the GPU tests: the one upload path (to_device, also for values
// with optional scales, copy_to_device), poisoned outputs shaped like a host tensor (device_like),
// and the copy back (copy_to_host).
#pragma once

#include <algorithm>
#include <optional>

#include "support/gpu_test_util.h"
#include "support/host_tensor.h"

namespace msa::test {

// h's view (dtype, shape, strides) over the device memory of `d`.
inline Tensor on_device(const HostTensor& h, const DeviceBuffer& d) {
  Tensor t = h.t;
  t.data = d.get();
  t.device = gpu0();
  return t;
}

// Copies h's bytes into `d` (which holds at least as many).
inline void copy_to_device(const HostTensor& h, DeviceBuffer& d, cudaStream_t s) {
  d.upload(h.t.data, h.bytes(), s);
}

// A device buffer and h's view over it.
struct DeviceTensor {
  DeviceBuffer buf;
  Tensor t;
};

// A device copy of h. The buffer holds at least 16 bytes, so that an empty tensor still gets a
// real pointer, and no more than that past the copy.
inline DeviceTensor to_device(const HostTensor& h, cudaStream_t s) {
  DeviceTensor d{DeviceBuffer(std::max<size_t>(h.bytes(), 16)), Tensor()};
  copy_to_device(h, d.buf, s);
  d.t = on_device(h, d.buf);
  return d;
}

// A poisoned (0xff: NaN / -1) device tensor shaped like h.
inline DeviceTensor device_like(const HostTensor& h, cudaStream_t s) {
  DeviceTensor d{DeviceBuffer(std::max<size_t>(h.bytes(), 16)), Tensor()};
  d.buf.poison(s);
  d.t = on_device(h, d.buf);
  return d;
}

// Device copies of quantized values and, when given, their scales.
struct DeviceQTensor {
  DeviceTensor values;
  std::optional<DeviceTensor> scale;
  QTensor view() const { return scale ? QTensor(values.t, scale->t) : QTensor(values.t); }
};

inline DeviceQTensor to_device(const HostTensor& values, const HostTensor* scale, cudaStream_t s) {
  DeviceQTensor d{to_device(values, s), std::nullopt};
  if (scale) d.scale = to_device(*scale, s);
  return d;
}
inline DeviceQTensor to_device(const HostTensor& values, const std::optional<HostTensor>& scale,
                               cudaStream_t s) {
  return to_device(values, scale ? &*scale : nullptr, s);
}

// Copies d back into h and waits for the stream.
inline void copy_to_host(const DeviceTensor& d, const HostTensor& h, cudaStream_t s) {
  d.buf.download(h.t.data, h.bytes(), s);
}

}  // namespace msa::test
