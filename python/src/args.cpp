// Keyword-argument unpacking for msa._C (args.h): torch tensors read through their attributes,
// other arrays through DLPack (nanobind's ndarray), and name parsing through msa's own *_name
// functions, so the spellings have one definition.
#include "args.h"

#include <nanobind/stl/string.h>

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace msa::py {

namespace {

// Looks `name` up among the values of an enum whose names `name_of` prints.
template <typename E, typename NameOf>
E parse_enum(const std::string& name, std::initializer_list<E> values, NameOf name_of,
             const char* what) {
  std::string known;
  for (E v : values) {
    if (name == name_of(v)) return v;
    known += known.empty() ? "" : ", ";
    known += name_of(v);
  }
  fail(what, ": unknown name '", name, "'; expected one of ", known);
}

}  // namespace

DType parse_dtype(const std::string& name) {
  return parse_enum(name,
                    {DType::f32, DType::f16, DType::bf16, DType::fp8_e4m3, DType::fp4x2,
                     DType::e8m0, DType::u8, DType::i32, DType::boolean},
                    dtype_name, "dtype");
}

KVLayout parse_layout(const std::string& name) {
  return parse_enum(name, {KVLayout::flat, KVLayout::paged_nhd, KVLayout::paged_hnd},
                    kv_layout_name, "kv_layout");
}

QuantFormat parse_quant_format(const std::string& name) {
  return parse_enum(name,
                    {QuantFormat::fp8_per_tensor, QuantFormat::fp8_per_token,
                     QuantFormat::fp8_per_token_head, QuantFormat::nvfp4, QuantFormat::mxfp4},
                    quant_format_name, "format");
}

namespace {

// torch.Tensor and the torch dtypes msa names, set once by register_torch (module lifetime).
struct TorchTypes {
  nb::object tensor_type;
  std::vector<std::pair<nb::object, DType>> dtypes;
};
TorchTypes& torch_types() {
  static TorchTypes* t = new TorchTypes();  // never destroyed: Python objects outlive exit order
  return *t;
}

// The attribute names torch_view reads, interned once: a lookup by an interned name builds no
// string, and a method is called without a bound-method object (a call's host time: each torch
// argument reads six of them).
struct TorchNames {
  PyObject *dtype, *element_size, *is_cuda, *is_cpu, *get_device, *device, *shape, *stride,
      *is_contiguous, *data_ptr;
};
const TorchNames& torch_names() {
  static const TorchNames n{
      PyUnicode_InternFromString("dtype"),         PyUnicode_InternFromString("element_size"),
      PyUnicode_InternFromString("is_cuda"),       PyUnicode_InternFromString("is_cpu"),
      PyUnicode_InternFromString("get_device"),    PyUnicode_InternFromString("device"),
      PyUnicode_InternFromString("shape"),         PyUnicode_InternFromString("stride"),
      PyUnicode_InternFromString("is_contiguous"), PyUnicode_InternFromString("data_ptr")};
  return n;
}
nb::object get_attr(nb::handle h, PyObject* name) {
  PyObject* r = PyObject_GetAttr(h.ptr(), name);
  if (r == nullptr) throw nb::python_error();
  return nb::steal(r);
}
nb::object call_method(nb::handle h, PyObject* name) {
  PyObject* r = PyObject_CallMethodNoArgs(h.ptr(), name);
  if (r == nullptr) throw nb::python_error();
  return nb::steal(r);
}

// A torch tensor's view from its attributes; false when `h` is no torch tensor. With
// `override_name` the element type is that name's (the storage element size must match), so
// any torch dtype of the right size may carry it (uint16/int16 holding bf16, ...).
bool torch_view(nb::handle h, const char* op, const char* key, const std::string& override_name,
                Tensor& out) {
  const TorchTypes& tt = torch_types();
  if (!tt.tensor_type.is_valid() ||
      !PyObject_TypeCheck(h.ptr(), reinterpret_cast<PyTypeObject*>(tt.tensor_type.ptr())))
    return false;
  const TorchNames& n = torch_names();
  const nb::object dtype = get_attr(h, n.dtype);
  bool known = false;
  for (const auto& [obj, dt] : tt.dtypes)
    if (obj.is(dtype)) {
      out.dtype = dt;
      known = true;
      break;
    }
  if (!override_name.empty()) {
    const DType want = parse_dtype(override_name);
    const size_t bytes = nb::cast<size_t>(call_method(h, n.element_size));
    MSA_CHECK(bytes == dtype_size(want), op, ": ", key, ": dtype '", override_name, "' needs ",
              dtype_size(want) * 8, "-bit storage elements, got ", bytes * 8, "-bit ones");
    out.dtype = want;
  } else if (!known) {
    fail(op, ": ", key, ": torch dtype ", nb::cast<std::string>(nb::str(dtype)),
         " has no msa element type (float32, float16, bfloat16, float8_e4m3fn, "
         "float4_e2m1fn_x2, float8_e8m0fnu, uint8, int32, bool)");
  }
  if (nb::cast<bool>(get_attr(h, n.is_cuda))) {
    out.device = Device{DeviceType::cuda, nb::cast<int>(call_method(h, n.get_device))};
  } else if (nb::cast<bool>(get_attr(h, n.is_cpu))) {
    out.device = Device{};
  } else {
    fail(op, ": ", key, ": tensors on ", nb::cast<std::string>(nb::str(get_attr(h, n.device))),
         " are not supported (cpu or cuda only)");
  }
  const nb::object shape_obj = get_attr(h, n.shape);
  const nb::tuple shape = nb::borrow<nb::tuple>(shape_obj);
  const size_t nd = shape.size();
  MSA_CHECK(nd <= size_t(Tensor::kMaxDims), op, ": ", key, ": at most ", Tensor::kMaxDims,
            " dimensions, got ", nd);
  out.ndim = int(nd);
  for (size_t d = 0; d < nd; ++d) out.shape[d] = nb::cast<int64_t>(shape[d]);
  // A contiguous tensor's strides are its shape's row-major ones (torch may report another stride
  // for a dim of size 1, which no index multiplies by anything but 0): is_contiguous() costs
  // about half of stride() and its tuple's reads.
  if (nb::cast<bool>(call_method(h, n.is_contiguous))) {
    int64_t stride = 1;
    for (size_t d = nd; d-- > 0;) {
      out.strides[d] = stride;
      stride *= std::max<int64_t>(out.shape[d], 1);
    }
  } else {
    const nb::object strides_obj = call_method(h, n.stride);
    const nb::tuple strides = nb::borrow<nb::tuple>(strides_obj);
    for (size_t d = 0; d < nd; ++d) out.strides[d] = nb::cast<int64_t>(strides[d]);
  }
  out.data = reinterpret_cast<void*>(nb::cast<uintptr_t>(call_method(h, n.data_ptr)));
  return true;
}

// The DLTensor of an imported array (the import keeps shape and strides alive).
template <typename Array>
DLTensor dl_tensor(const Array& a) {
  DLTensor t{};
  t.data = const_cast<void*>(static_cast<const void*>(a.data_handle()));
  t.byte_offset = a.byte_offset();
  t.device = {static_cast<DLDeviceType>(a.device_type()), a.device_id()};
  t.ndim = static_cast<int32_t>(a.ndim());
  t.shape = const_cast<int64_t*>(a.shape_ptr());
  t.strides = const_cast<int64_t*>(a.stride_ptr());
  const nb::dlpack::dtype dt = a.dtype();
  t.dtype = {dt.code, dt.bits, dt.lanes};
  return t;
}

// Imports `array` through DLPack (or the buffer protocol) into `keep`. For Access::write only a
// writable array is accepted: nanobind's writable import refuses a producer's read-only flag, so
// an array that imports read-only but not writable is a read-only one.
DLTensor import_dlpack(nb::handle array, const char* op, const char* key, Access access,
                       std::vector<nb::ndarray<nb::ro>>& keep) {
  if (access == Access::write) {
    nb::ndarray<> w;
    if (nb::try_cast(array, w, /*convert=*/false)) {
      keep.emplace_back(w);
      return dl_tensor(w);
    }
  }
  nb::ndarray<nb::ro> a;
  if (!nb::try_cast(array, a, /*convert=*/false))
    fail(op, ": ", key, ": expected a DLPack tensor (torch, numpy, cupy, ...), got ",
         nb::cast<std::string>(nb::str(array.type().attr("__name__"))));
  MSA_CHECK(access == Access::read, op, ": ", key,
            ": must be writable (a read-only array was given)");
  keep.push_back(a);
  return dl_tensor(a);
}

// Any other array through DLPack; `keep` holds the import until the call returns.
Tensor dlpack_view(nb::handle array, const char* op, const char* key,
                   const std::string& override_name, Access access,
                   std::vector<nb::ndarray<nb::ro>>& keep) {
  DLTensor t = import_dlpack(array, op, key, access, keep);
  if (override_name.empty()) {
    try {
      return from_dlpack(t);
    } catch (const Error& e) {
      fail(op, ": ", key, ": ", e.what());
    }
  }
  // A storage view: the element size must match; shape and strides (in elements) carry over.
  const DType want = parse_dtype(override_name);
  MSA_CHECK(size_t(t.dtype.bits) * t.dtype.lanes == dtype_size(want) * 8, op, ": ", key,
            ": dtype '", override_name, "' needs ", dtype_size(want) * 8,
            "-bit storage elements, got ", int(t.dtype.bits) * int(t.dtype.lanes), "-bit ones");
  t.dtype = {kDLUInt, 8, 1};
  Tensor out = from_dlpack(t);
  out.dtype = want;
  return out;
}

// One tensor argument: None -> undefined; (array, "dtype") -> a storage view; torch tensors
// through torch_view, anything else through DLPack.
Tensor import_tensor(nb::handle h, const char* op, const char* key, Access access,
                     std::vector<nb::ndarray<nb::ro>>& keep) {
  if (!h.is_valid() || h.is_none()) return {};
  nb::handle array = h;
  std::string override_name;
  if (nb::isinstance<nb::tuple>(h)) {
    nb::tuple t = nb::borrow<nb::tuple>(h);
    MSA_CHECK(t.size() == 2 && nb::isinstance<nb::str>(t[1]), op, ": ", key,
              ": a tuple must be (array, dtype name)");
    array = t[0];
    override_name = nb::cast<std::string>(t[1]);
  }
  if (Tensor view; torch_view(array, op, key, override_name, view)) return view;
  return dlpack_view(array, op, key, override_name, access, keep);
}

}  // namespace

void register_torch(nb::handle tensor_type, nb::dict dtypes) {
  TorchTypes& t = torch_types();
  t.tensor_type = nb::borrow(tensor_type);
  t.dtypes.clear();
  for (auto [obj, name] : dtypes)
    t.dtypes.emplace_back(nb::borrow(obj), parse_dtype(nb::cast<std::string>(name)));
}

namespace {

struct NameHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// The interned str of a keyword name, made once per name and kept for the process (its hash is
// cached in the object, and a dict finds an interned key by identity first): PyDict_GetItemString
// built, hashed and freed a str on every read, ~30 of them a pipeline call (the C entry of
// pipeline_workspace_bytes on LAT-CHUNK's arguments: 12.5 -> 10.4 us of host time). Called with
// the GIL held, which guards the table.
PyObject* key_object(const char* key) {
  static auto* table = new std::unordered_map<std::string, PyObject*, NameHash, std::equal_to<>>();
  const std::string_view name(key);
  if (const auto it = table->find(name); it != table->end()) return it->second;
  PyObject* s = PyUnicode_InternFromString(key);
  if (s == nullptr) throw nb::python_error();
  table->emplace(std::string(name), s);
  return s;
}

}  // namespace

nb::handle Args::take(const char* key) {
  PyObject* k = key_object(key);
  used_.push_back(k);
  PyObject* v = PyDict_GetItemWithError(kw_.ptr(), k);  // borrowed; null when absent
  if (v == nullptr && PyErr_Occurred()) throw nb::python_error();
  found_ += v != nullptr;
  return v;
}

Tensor Args::tensor(const char* key, Access access) {
  return import_tensor(take(key), op_, key, access, keep_);
}

QTensor Args::qtensor(const char* key, Access access) {
  const std::string k(key);
  QTensor q;
  q.values = tensor(key, access);
  q.scale = tensor((k + "_scale").c_str(), access);
  q.global_scale = static_cast<float>(real((k + "_global_scale").c_str(), 1.0));
  return q;
}

KVCache Args::kv(bool with_v) {
  KVCache kv;
  kv.k = qtensor("k");
  if (with_v) kv.v = qtensor("v");
  kv.layout = parse_layout(text("kv_layout", "flat"));
  kv.cu_seqlens_k = tensor("cu_seqlens_k");
  kv.page_table = tensor("page_table");
  kv.seqused_k = tensor("seqused_k");
  return kv;
}

K2QIndex Args::k2q(const char* prefix, Access access) {
  const std::string p(prefix);
  K2QIndex k;
  k.row_ptr = tensor((p + "row_ptr").c_str(), access);
  k.q_idx = tensor((p + "q_idx").c_str(), access);
  k.schedule = tensor((p + "schedule").c_str(), access);
  return k;
}

// Reads an optional scalar keyword as T; a value of the wrong type is an msa::Error naming it.
template <typename T>
T Args::scalar(const char* key, T dflt, const char* what) {
  nb::handle h = take(key);
  if (!h.is_valid() || h.is_none()) return dflt;
  T value;
  if (!nb::try_cast(h, value))
    fail(op_, ": ", key, ": expected ", what, ", got ",
         nb::cast<std::string>(nb::str(h.type().attr("__name__"))));
  return value;
}

// Reads an optional int keyword (a Python int or any object with __index__, e.g. a numpy integer)
// that must fit `bits` bits as a signed value; out of range is an msa::Error naming it, never a
// truncated value.
int64_t Args::ranged(const char* key, int64_t dflt, int bits) {
  nb::handle h = take(key);
  if (!h.is_valid() || h.is_none()) return dflt;
  const nb::object i = nb::steal(PyNumber_Index(h.ptr()));
  if (!i.is_valid()) {
    PyErr_Clear();
    fail(op_, ": ", key, ": expected an int, got ",
         nb::cast<std::string>(nb::str(h.type().attr("__name__"))));
  }
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  const bool fits = overflow == 0 && (bits >= 64 || (v >= -(1LL << (bits - 1)) &&
                                                      v < (1LL << (bits - 1))));
  MSA_CHECK(fits, op_, ": ", key, ": ", nb::cast<std::string>(nb::str(i)), " does not fit a ",
            bits, "-bit int");
  return v;
}

AttentionParams Args::attention_params() {
  AttentionParams p;
  p.softmax_scale = static_cast<float>(real("softmax_scale", 0.0));
  p.causal = flag("causal", true);
  p.kv_block_size = int32("kv_block_size", 128);
  p.temperature = static_cast<float>(real("temperature", 0.0));
  p.soft_cap = static_cast<float>(real("soft_cap", 0.0));
  const std::string partial = text("partial_dtype", "");
  if (!partial.empty()) p.partial_dtype = py::parse_dtype(partial);
  return p;
}

AttentionArgs Args::attention() {
  AttentionArgs x;
  x.q = tensor("q");
  x.q_scale = tensor("q_scale");
  x.kv = kv(/*with_v=*/true);
  x.cu_seqlens_q = tensor("cu_seqlens_q");
  x.q2k = tensor("q2k");
  x.out = tensor("out", Access::write);
  x.lse = tensor("lse", Access::write);
  x.tlse = tensor("tlse", Access::write);
  x.causal_offset = tensor("causal_offset");
  x.key_mask = tensor("key_mask");
  const std::string rows = text("key_mask_rows", "");
  MSA_CHECK(rows.empty() || rows == "batch" || rows == "query", op_,
            ": key_mask_rows: must be 'batch', 'query' or None (from key_mask's shape), got '",
            rows, "'");
  x.key_mask_rows = rows.empty()        ? KeyMaskRows::from_shape
                    : rows == "batch" ? KeyMaskRows::per_batch
                                      : KeyMaskRows::per_query;
  x.params = attention_params();
  return x;
}

int64_t Args::integer(const char* key, int64_t dflt) { return ranged(key, dflt, 64); }
int Args::int32(const char* key, int dflt) { return int(ranged(key, dflt, 32)); }
double Args::real(const char* key, double dflt) { return scalar(key, dflt, "a float"); }
bool Args::flag(const char* key, bool dflt) { return scalar(key, dflt, "a bool"); }
std::string Args::text(const char* key, const char* dflt) {
  return scalar(key, std::string(dflt), "a str");
}

cudaStream_t Args::stream() {
  const int64_t s = integer("stream", 0);
  return reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(s));
}

void Args::allocator() { alloc_ = take("alloc"); }

Tensor Args::allocate(size_t bytes) {
  if (bytes == 0) return {};
  MSA_CHECK(alloc_.is_valid() && !alloc_.is_none(), op_, ": needs ", bytes,
            " bytes of workspace: pass workspace=");
  scratch_.push_back(alloc_(bytes));
  const Tensor ws = import_tensor(scratch_.back(), op_, "workspace", Access::write, keep_);
  MSA_CHECK(ws.dtype == DType::u8 && ws.numel() >= int64_t(bytes), op_, ": alloc must return >= ",
            bytes, " bytes of u8, got ", ws.describe());
  return ws;
}

nb::dict call_arguments(const nb::args& args, nb::kwargs kw, const char* op) {
  if (args.size() == 0) return std::move(kw);
  MSA_CHECK(args.size() == 1 && kw.size() == 0 && nb::isinstance<nb::dict>(args[0]), op,
            ": takes keyword arguments, or one dict of them");
  return nb::borrow<nb::dict>(args[0]);
}

void Args::finish() const {
  if (found_ == PyDict_Size(kw_.ptr())) return;  // every given key was read
  std::string unknown;
  for (auto [key, value] : kw_) {
    const bool read = std::any_of(used_.begin(), used_.end(), [&](PyObject* k) {
      return k == key.ptr() || PyObject_RichCompareBool(k, key.ptr(), Py_EQ) == 1;
    });
    if (!read) unknown += (unknown.empty() ? "" : ", ") + nb::cast<std::string>(key);
  }
  MSA_CHECK(unknown.empty(), op_, ": unknown keyword argument(s): ", unknown);
}

}  // namespace msa::py
