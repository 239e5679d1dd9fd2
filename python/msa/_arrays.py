"""Array plumbing for msa's Python layer: the framework an array belongs to (torch, numpy, cupy,
or any other DLPack producer), msa dtype names, allocation with the caller's framework, and the
CUDA stream an op runs on. Every op module goes through here; nothing here calls msa._C."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Sequence


def _msa_error() -> type:
    """msa.MsaError (the extension's, imported on first use: this module loads before it)."""
    from . import _C
    return _C.MsaError

#: msa's element types, spelt as the C++ library prints them (msa::dtype_name).
DTYPES = ("f32", "f16", "bf16", "fp8_e4m3", "fp4x2", "e8m0", "u8", "i32", "bool")

# Bits of one stored element, to check storage views ("uint16 holding bf16").
_BITS = {"f32": 32, "f16": 16, "bf16": 16, "fp8_e4m3": 8, "fp4x2": 8, "e8m0": 8, "u8": 8,
         "i32": 32, "bool": 8}
# numpy / ml_dtypes / cupy dtype names -> msa names (ml_dtypes registers these with numpy).
_NP_NAMES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16",
             "float8_e4m3fn": "fp8_e4m3", "float8_e8m0fnu": "e8m0", "uint8": "u8",
             "int32": "i32", "bool": "bool"}
# numpy storage types for views of dtypes numpy cannot name without ml_dtypes.
_NP_STORAGE = {8: "uint8", 16: "uint16"}
# DLPack device type of CUDA memory (kDLCUDA).
_DL_CUDA = 2


class Typed(NamedTuple):
    """An array plus the msa dtype its elements hold: how numpy (without ml_dtypes) or cupy
    pass bf16 (as uint16), FP8, FP4 pairs or E8M0 scales (as uint8). Made by `msa.typed`."""

    array: Any
    dtype: str


def typed(array: Any, dtype: str) -> Typed:
    """Tags `array` as holding `dtype` elements ("bf16", "fp8_e4m3", "fp4x2", "e8m0", ...).

    The storage element size must match: uint16/int16 for bf16 and f16, uint8/int8 for
    fp8_e4m3, fp4x2 (two e2m1 values per byte, element 2i in the low nibble) and e8m0.
    Example: ``msa.typed(q_bits.view(np.uint16), "bf16")``.
    """
    if dtype not in DTYPES:
        raise _msa_error()(f"msa.typed: unknown dtype {dtype!r}; expected one of {DTYPES}")
    return Typed(array, dtype)


try:
    # Imported up front when installed, so the torch custom ops exist before torch.compile traces
    # a caller, and so dispatch is a plain isinstance check that torch.compile can trace.
    import torch as _torch_module
except ImportError:
    _torch_module = None


def _torch():
    """The torch module, or None when torch is not installed."""
    return _torch_module


def framework(x: Any) -> str:
    """'torch', 'numpy', 'cupy' or 'dlpack' (any other producer) for an array or Typed."""
    if isinstance(x, Typed):
        x = x.array
    if _torch_module is not None and isinstance(x, _torch_module.Tensor):
        return "torch"
    root = type(x).__module__.split(".")[0]
    if root in ("torch", "numpy", "cupy"):
        return root
    return "dlpack"


def is_torch(x: Any) -> bool:
    return framework(x) == "torch"


def is_cuda(x: Any) -> bool:
    if isinstance(x, Typed):
        x = x.array
    if is_torch(x):
        return x.is_cuda
    return x.__dlpack_device__()[0] == _DL_CUDA


# msa dtype names -> torch dtypes, built once. Older torch lacks e8m0 and fp4x2; a uint8 tensor
# then stands in (typed by msa).
_TORCH_DTYPES = {} if _torch_module is None else {
    "f32": _torch_module.float32, "f16": _torch_module.float16, "bf16": _torch_module.bfloat16,
    "fp8_e4m3": _torch_module.float8_e4m3fn, "u8": _torch_module.uint8,
    "i32": _torch_module.int32, "bool": _torch_module.bool,
    "e8m0": getattr(_torch_module, "float8_e8m0fnu", _torch_module.uint8),
    "fp4x2": getattr(_torch_module, "float4_e2m1fn_x2", _torch_module.uint8)}


def torch_dtype(name: str):
    return _TORCH_DTYPES[name]


# torch dtype -> msa name, the first name of each dtype in _TORCH_DTYPES' order: on torch without
# float8_e8m0fnu / float4_e2m1fn_x2, uint8 means u8 only.
_TORCH_NAMES: dict = {}
for _name, _dt in _TORCH_DTYPES.items():
    _TORCH_NAMES.setdefault(_dt, _name)


def dtype_of(x: Any) -> Optional[str]:
    """msa dtype name of an array (None when msa has no name for it, e.g. float64)."""
    if isinstance(x, Typed):
        return x.dtype
    if is_torch(x):
        return _TORCH_NAMES.get(x.dtype)
    return _NP_NAMES.get(getattr(x.dtype, "name", str(x.dtype)))


def as_arg(x: Any, expect: Optional[str] = None) -> Any:
    """What msa._C takes for one tensor argument: the array, or (storage view, dtype name) for
    element types that DLPack producers cannot describe portably. `expect` (an output's known
    dtype) lets plain uint16/uint8 storage arrays stand for bf16/fp8/fp4x2/e8m0 outputs."""
    if x is None:
        return None
    if isinstance(x, Typed):
        return (_storage_view(x.array, _BITS[x.dtype]), x.dtype)
    fw = framework(x)
    if fw == "torch":
        # msa._C reads torch tensors (any dtype msa names, requires_grad or not) directly.
        if expect is not None and x.dtype in (_torch().uint8, _torch().int16) and \
                dtype_of(x) != expect and x.element_size() * 8 == _BITS[expect]:
            return (x, expect)
        return x
    name = dtype_of(x)
    if name in ("bf16", "fp8_e4m3", "e8m0"):
        # ml_dtypes arrays: numpy's DLPack export does not know these types.
        return (x.view(_NP_STORAGE[_BITS[name]]), name)
    if expect is not None and name != expect and str(x.dtype) in ("uint8", "uint16", "int16") \
            and x.dtype.itemsize * 8 == _BITS[expect]:
        return (x, expect)
    return x


def _storage_view(x: Any, bits: int) -> Any:
    """The same memory as integers of `bits` bits (a view, no copy); msa._C then reads the
    elements as the dtype named beside it."""
    if is_torch(x):
        t = _torch()
        x = x.detach()
        size = x.element_size() * 8
    else:
        size = x.dtype.itemsize * 8
    if size != bits:
        raise _msa_error()(f"msa.typed: a {bits}-bit dtype needs {bits}-bit storage elements, "
                         f"got {x.dtype}")
    if is_torch(x):
        return x.view({8: t.uint8, 16: t.int16, 32: t.int32}[bits])
    return x.view(f"uint{bits}")


def _numpy_dtype(name: str):
    import numpy as np
    try:
        import ml_dtypes
    except ImportError:
        ml_dtypes = None
    ml = {"bf16": "bfloat16", "fp8_e4m3": "float8_e4m3fn", "e8m0": "float8_e8m0fnu"}
    if name in ml:
        if ml_dtypes is not None and hasattr(ml_dtypes, ml[name]):
            return np.dtype(getattr(ml_dtypes, ml[name]))
        return np.dtype(_NP_STORAGE[_BITS[name]])
    return np.dtype({"f32": "float32", "f16": "float16", "fp4x2": "uint8", "u8": "uint8",
                     "i32": "int32", "bool": "bool"}[name])


def empty(like: Any, shape: Sequence[int], dtype: str, zero: bool = False) -> Any:
    """A new array of `shape` and msa `dtype` from `like`'s framework, on `like`'s device.

    numpy (and cupy) hold bf16/fp8/e8m0 as ml_dtypes types when ml_dtypes is installed, else as
    uint16/uint8 storage; fp4x2 is always uint8 there (ml_dtypes' float4 is one value a byte)."""
    if isinstance(like, Typed):
        like = like.array
    shape = tuple(int(s) for s in shape)
    fw = framework(like)
    if fw == "torch":
        t = _torch()
        make = t.zeros if zero else t.empty
        return make(shape, dtype=torch_dtype(dtype), device=like.device)
    if fw == "cupy":
        import cupy
        # cupy has no ml_dtypes types: those are held as uint storage.
        dt = _NP_STORAGE[_BITS[dtype]] if dtype in ("bf16", "fp8_e4m3", "e8m0") else \
            _numpy_dtype(dtype)
        with cupy.cuda.Device(like.device.id):
            return (cupy.zeros if zero else cupy.empty)(shape, dtype=dt)
    if fw == "dlpack" and is_cuda(like):
        raise _msa_error()("msa: cannot allocate outputs for a CUDA array of this framework; "
                         "pass preallocated outputs (out=...)")
    import numpy as np
    return (np.zeros if zero else np.empty)(shape, dtype=_numpy_dtype(dtype))


def empty_on(device: Any, shape: Sequence[int], dtype: str) -> Any:
    """Like `empty`, for a device given as 'cpu', 'cuda[:i]' or a torch.device: torch
    allocates when the caller uses torch (or for CUDA), numpy otherwise."""
    t = _torch()
    kind, _ = parse_device(device)
    if t is not None and (kind == "cuda" or isinstance(device, t.device)):
        return t.empty(tuple(shape), dtype=torch_dtype(dtype), device=t.device(str(device)))
    if kind == "cuda":
        import cupy
        with cupy.cuda.Device(parse_device(device)[1]):
            return cupy.empty(tuple(shape), dtype=_NP_STORAGE.get(_BITS[dtype], "uint8"))
    import numpy as np
    return np.empty(tuple(shape), dtype=_numpy_dtype(dtype))


def parse_device(device: Any) -> tuple:
    """('cpu' | 'cuda', index) from 'cpu', 'cuda', 'cuda:1', a torch.device or an array."""
    if device is None:
        return ("cpu", 0)
    if not isinstance(device, str) and hasattr(device, "__dlpack_device__"):
        kind, index = device.__dlpack_device__()
        return ("cuda", int(index)) if int(kind) == _DL_CUDA else ("cpu", 0)
    text = str(device)
    kind, _, index = text.partition(":")
    if kind not in ("cpu", "cuda"):
        raise _msa_error()(f"msa: device must be 'cpu' or 'cuda[:index]', got {text!r}")
    if kind == "cuda" and not index:
        t = _torch()
        index = str(t.cuda.current_device()) if t is not None else "0"
    return (kind, int(index or 0))


def stream_handle(like: Any, stream: Any = None) -> int:
    """The cudaStream_t (as an int) a GPU op runs on: `stream` if given (an int, a
    torch.cuda.Stream or a cupy Stream), else the caller's current stream (torch's or cupy's);
    0 for CPU arrays."""
    if stream is not None:
        if isinstance(stream, int):
            return stream
        for attr in ("cuda_stream", "ptr"):
            if hasattr(stream, attr):
                return int(getattr(stream, attr))
        raise TypeError(f"msa: stream must be an int handle, a torch.cuda.Stream or a cupy "
                        f"Stream, got {type(stream).__name__}")
    if isinstance(like, Typed):
        like = like.array
    if not is_cuda(like):
        return 0
    fw = framework(like)
    if fw == "torch":
        return _torch().cuda.current_stream(like.device).cuda_stream
    if fw == "cupy":
        import cupy
        return cupy.cuda.get_current_stream().ptr
    return 0


def to_host_list(x: Any) -> list:
    """A small integer array as a Python list (synchronizes when `x` lives on the GPU)."""
    if isinstance(x, Typed):
        x = x.array
    fw = framework(x)
    if fw == "torch":
        return x.tolist()
    if fw == "cupy":
        return x.get().tolist()
    import numpy as np
    return np.from_dlpack(x).tolist()


def shape_of(x: Any) -> tuple:
    if isinstance(x, Typed):
        x = x.array
    return tuple(int(s) for s in x.shape)
