// Keyword-argument unpacking for the private extension msa._C: turns torch tensors (read
// directly, see tensor()) and other DLPack producers (numpy, cupy, ...) into msa::Tensor views,
// reads the scalar options of an op by name, and allocates scratch through a Python callback.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <string>
#include <vector>

#include "msa/msa.h"

namespace msa::py {

namespace nb = nanobind;

// Parses a name ("bf16", "paged_nhd", "nvfp4", ...) as printed by msa's *_name functions.
DType parse_dtype(const std::string& name);
KVLayout parse_layout(const std::string& name);
QuantFormat parse_quant_format(const std::string& name);

// Registers torch.Tensor and the torch dtypes msa names ({torch.bfloat16: "bf16", ...}), so
// tensor() reads torch tensors without a DLPack capsule (torch's __dlpack__ is a Python method
// that costs several microseconds a tensor). Called once by msa/_arrays.py when torch imports.
void register_torch(nb::handle tensor_type, nb::dict dtypes);

// Whether an op only reads a tensor argument or writes into it. An output must be writable: a
// read-only array (numpy's writeable=False, DLPack's read-only flag) is an error naming it, never
// written through.
enum class Access { read, write };

// An op's arguments as one dict: its keywords, or a single positional dict (the Python layer's
// hot paths build their arguments as a dict and pass it so: unpacking 30 keywords into a call
// cost ~1.4 us of host time against ~0.1 us for one positional dict). Anything else is an
// msa::Error naming the op.
nb::dict call_arguments(const nb::args& args, nb::kwargs kw, const char* op);

// One op call's keyword arguments. Every key given must be read (finish() names the unknown
// ones), so a misspelt keyword in the Python layer is an error, not a silent default. The
// imported arrays and allocated scratch are kept alive until the call returns.
class Args {
 public:
  Args(nb::dict kw, const char* op) : kw_(std::move(kw)), op_(op) {}

  // A tensor argument: None or absent -> an undefined view. A tuple (array, "dtype") overrides
  // the element type for storage-only views (uint16 holding bf16, uint8 holding fp8/fp4/e8m0).
  Tensor tensor(const char* key, Access access = Access::read);
  // values key, "<key>_scale" and "<key>_global_scale".
  QTensor qtensor(const char* key, Access access = Access::read);
  // k, v (when with_v), kv_layout, cu_seqlens_k, page_table, seqused_k and the k/v scales.
  KVCache kv(bool with_v);
  // The outputs of a CSR build / the optional k2q input of attention: <prefix>row_ptr, ...
  K2QIndex k2q(const char* prefix, Access access = Access::read);

  // softmax_scale, causal, kv_block_size, temperature, soft_cap and partial_dtype (absent: the
  // default).
  AttentionParams attention_params();
  // What every attention call reads (attention_forward, DecodePlan.run): q, the KV cache with v,
  // cu_seqlens_q, q2k, out, lse, tlse, causal_offset, key_mask, key_mask_rows ("batch", "query"
  // or absent) and attention_params().
  AttentionArgs attention();

  // An int argument that must fit 64 bits / a C++ int (a larger Python int is an error naming
  // it, never truncated).
  int64_t integer(const char* key, int64_t dflt);
  int int32(const char* key, int dflt);
  double real(const char* key, double dflt);
  bool flag(const char* key, bool dflt);
  std::string text(const char* key, const char* dflt);
  // "stream": a cudaStream_t as an integer handle (0 = the legacy default stream).
  cudaStream_t stream();

  // Reads the "alloc" keyword: a Python callable (nbytes) -> u8 array on the op's device, or None.
  void allocator();
  // `bytes` of u8 scratch from that callable (an undefined view when bytes is 0). Called with the
  // GIL held, before the op runs; the array stays alive until the call returns.
  Tensor allocate(size_t bytes);

  // Throws msa::Error naming any keyword that no accessor read.
  void finish() const;

 private:
  nb::handle take(const char* key);
  template <typename T>
  T scalar(const char* key, T dflt, const char* what);
  int64_t ranged(const char* key, int64_t dflt, int bits);

  nb::dict kw_;
  const char* op_;
  Py_ssize_t found_ = 0;  // keys read that were present
  nb::handle alloc_;
  std::vector<PyObject*> used_;  // the interned names read (take's table keeps them alive)
  std::vector<nb::ndarray<nb::ro>> keep_;
  std::vector<nb::object> scratch_;
};

}  // namespace msa::py
