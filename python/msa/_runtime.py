"""Per-call plumbing shared by every op: the argument of msa._C for an array, the stream an op
runs on, scratch allocation, the per-device status buffers of the device-side index checks and
when they are read (the check policy), and whether torch.compile is tracing."""

from __future__ import annotations

import operator
import os
from typing import Any, Callable, Optional

from . import _C
from ._arrays import Typed, _torch, as_arg, empty, framework, is_cuda, stream_handle

#: The exception every msa check raises; its message names the argument and the rule broken.
MsaError = _C.MsaError

torch = _torch()
_TorchTensor = torch.Tensor if torch is not None else None
if torch is not None:
    # msa._C then reads torch tensors through their attributes instead of a DLPack capsule.
    _names = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16",
              torch.float8_e4m3fn: "fp8_e4m3", torch.uint8: "u8", torch.int32: "i32",
              torch.bool: "bool"}
    for _attr, _name in (("float8_e8m0fnu", "e8m0"), ("float4_e2m1fn_x2", "fp4x2")):
        if hasattr(torch, _attr):
            _names[getattr(torch, _attr)] = _name
    _C.register_torch(tensor_type=torch.Tensor, dtypes=_names)
    _raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    compiling: Callable[[], bool] = torch.compiler.is_compiling
else:
    _raw_stream = None

    def compiling() -> bool:
        return False

# What a framework raises for an array it cannot allocate: numpy's MemoryError (ValueError for a
# size past its index range), cupy's OutOfMemoryError (a MemoryError) and torch's OutOfMemoryError.
_ALLOC_ERRORS: tuple = (MemoryError, ValueError) + (
    (torch.OutOfMemoryError,) if torch is not None and hasattr(torch, "OutOfMemoryError") else ())

#: MSA_CHECK_SYNC=1 (read at import) makes every GPU op wait for its stream and raise at once for
#: the invalid indices the device recorded; by default no op waits.
CHECK_SYNC = os.environ.get("MSA_CHECK_SYNC", "0") not in ("", "0")


def arg(x: Any, expect: Optional[str] = None) -> Any:
    """What msa._C takes for one array argument (a torch tensor as it is)."""
    if x is None or (type(x) is _TorchTensor and expect is None):
        return x
    return as_arg(x, expect)


def dims(x: Any, name: str, n: int, what: str) -> tuple:
    """x's shape, which must have `n` dims (`what` spells them); an MsaError naming `name` else."""
    shape = getattr(x.array if isinstance(x, Typed) else x, "shape", None)
    if shape is None:
        raise MsaError(f"{name}: expected an array, got {type(x).__name__}")
    shape = tuple(shape)
    if len(shape) != n:
        raise MsaError(f"{name}: must be {what} ({n} dims), got {len(shape)} dims {list(shape)}")
    return shape


# The Python layer checks what it computes with itself (sizes, divisors, array-ness) before it
# sizes or allocates anything, so a malformed argument is an MsaError naming it, never a numpy,
# arithmetic or attribute error, and never truncated (msa's C++ sizes are mostly 32-bit ints).

def count(value: Any, name: str, lo: int = 0, bits: int = 32) -> int:
    """`value` as an int in [lo, 2^(bits-1) - 1]; an MsaError naming `name` else."""
    try:
        v = operator.index(value)
    except TypeError:
        raise MsaError(f"{name}: expected an int, got {type(value).__name__}") from None
    if v < lo:
        raise MsaError(f"{name}: must be >= {lo}, got {v}")
    if v >= 1 << (bits - 1):
        raise MsaError(f"{name}: {v} does not fit a {bits}-bit int")
    return v


_QTensor: Any = None  # msa.quant.QTensor, imported on first use (quant imports this module)


def _qtensor_type() -> Any:
    global _QTensor
    if _QTensor is None:
        from .quant import QTensor
        _QTensor = QTensor
    return _QTensor


def check_arrays(**named: Any) -> None:
    """Raises MsaError naming the first argument that is neither None nor an array (a DLPack
    producer: torch, numpy, cupy, ...; or a Typed or QTensor of one), e.g. a Python list. None
    and torch tensors, the common arguments, cost one test each (a call's host time: issue 31's
    budget)."""
    qtensor = _qtensor_type()
    for name, x in named.items():
        if x is None or type(x) is _TorchTensor:
            continue
        if isinstance(x, qtensor):
            _check_array(name, x.values)
            _check_array(name, x.scale, ".scale")
        else:
            _check_array(name, x)


def plain_arrays(*xs: Any) -> bool:
    """Whether every x is None, a torch tensor, or a QTensor of them: what check_arrays accepts
    without a closer look, tested without building its keywords (a call's host time)."""
    qtensor = _qtensor_type()
    for x in xs:
        if x is None or type(x) is _TorchTensor:
            continue
        if type(x) is not qtensor:
            return False
        s = x.scale
        if type(x.values) is not _TorchTensor or not (s is None or type(s) is _TorchTensor):
            return False
    return True


def _check_array(name: str, a: Any, suffix: str = "") -> None:
    if a is None or type(a) is _TorchTensor:
        return
    if isinstance(a, Typed):
        a = a.array
    if a is not None and not hasattr(a, "__dlpack__"):
        raise MsaError(f"{name}{suffix}: expected an array (torch, numpy, cupy or another DLPack "
                       f"producer), got {type(a).__name__}")


def check_sequence(x: Any, name: str, what: str, sizes: tuple) -> None:
    """x, when given, is a tuple or list of len(sizes) arrays (`what` names them)."""
    if x is None:
        return
    if not isinstance(x, (tuple, list)) or len(x) not in sizes:
        raise MsaError(f"{name}: must be a sequence {what}, got {type(x).__name__}"
                       + (f" of {len(x)}" if isinstance(x, (tuple, list)) else ""))
    if not plain_arrays(*x):  # names only for a closer look (formatting them costs ~1 us)
        check_arrays(**{f"{name}[{i}]": a for i, a in enumerate(x)})


def new_output(like: Any, shape: tuple, dtype: str, name: str, sized_by: str) -> Any:
    """empty(like, shape, dtype) for output `name`, whose size the arguments `sized_by` (e.g.
    "topk = 1000000000") set: an allocation the framework refuses is an MsaError naming them."""
    try:
        return empty(like, shape, dtype)
    except _ALLOC_ERRORS as e:
        raise MsaError(f"{name}: cannot allocate {dtype}{list(shape)} for {sized_by} "
                       f"({type(e).__name__}: {e})") from None


def stream_of(like: Any, stream: Any) -> int:
    """The cudaStream_t (an int) an op on `like` runs on: `stream`, else the caller's current
    stream of like's device; 0 for CPU arrays."""
    if stream is None and type(like) is _TorchTensor:
        if not like.is_cuda:
            return 0
        if _raw_stream is not None:
            return _raw_stream(like.get_device())
    return stream_handle(like, stream)


def allocator(like: Any, stream: Any = None) -> Callable[[int], Any]:
    """The alloc= callable of msa._C: `n` bytes of u8 scratch on like's device, from like's
    framework (torch's caching allocator for torch tensors: stream-ordered, capturable), for an op
    on `stream` (the op's stream= argument; None: the caller's current stream).

    Scratch is dropped when the call returns, while the op's kernels may still run on its stream.
    The frameworks' pools reuse a freed block at once, in order, on the stream it was allocated
    on: the current one. For an op on another stream the block is therefore recorded on the op's
    stream (torch's record_stream: reused only once that stream's work so far is done) or, with
    cupy, allocated under it; otherwise the next allocation on the current stream could take the
    block while the op still writes it."""
    if type(like) is _TorchTensor:
        device = like.device
        if stream is not None and like.is_cuda:
            handle = stream_handle(like, stream)
            if handle != stream_of(like, None):  # not the current stream
                side = (torch.cuda.default_stream(device) if handle == 0 else
                        torch.cuda.ExternalStream(handle, device=device))

                def recorded(n: int) -> Any:
                    t = torch.empty(n, dtype=torch.uint8, device=device)
                    t.record_stream(side)
                    return t
                return recorded
        return lambda n: torch.empty(n, dtype=torch.uint8, device=device)
    if stream is not None and framework(like) == "cupy" and is_cuda(like):
        handle = stream_handle(like, stream)
        if handle != stream_of(like, None):
            import cupy

            def under(n: int) -> Any:
                with (cupy.cuda.Stream.null if handle == 0 else cupy.cuda.ExternalStream(handle)):
                    return empty(like, (n,), "u8")
            return under
    return lambda n: empty(like, (n,), "u8")


# Status buffers (int32[4], zero = ok) by (framework, device index): the device-side checks of
# every op on that device record their first offence there until a check reads and clears it.
_status: dict = {}


def status_for(like: Any) -> Any:
    """The status buffer of like's device (None for CPU arrays: the CPU backend raises)."""
    if type(like) is _TorchTensor:
        if not like.is_cuda:
            return None
        key = ("torch", like.get_device())
    else:
        if not is_cuda(like):
            return None
        arr = like.array if isinstance(like, Typed) else like
        key = (framework(arr), int(arr.__dlpack_device__()[1]))
    buf = _status.get(key)
    if buf is None:
        if key[0] == "torch" and torch.cuda.is_current_stream_capturing():
            # A buffer made now would live in the graph's memory pool, zeroed only on replay.
            raise MsaError(f"msa: no status buffer yet for cuda:{key[1]}; call any msa op on this "
                           "device once before capturing a CUDA graph (as a warm-up)")
        buf = _status[key] = empty(like, (4,), "i32", zero=True)
    return buf


def _capturing(status: Any) -> bool:
    return type(status) is _TorchTensor and torch.cuda.is_current_stream_capturing()


def _read(status: Any, stream: int) -> None:
    """Waits for `stream`, then raises MsaError for a recorded offence, clearing the buffer."""
    try:
        _C.check_status(status=arg(status), stream=stream)
    except MsaError:
        _C.clear_status(status=arg(status), stream=stream)
        raise


def finish(status: Any, stream: int, check: Optional[bool]) -> None:
    """After a GPU op: with check (default: MSA_CHECK_SYNC) wait for the stream and raise for the
    offences its device recorded. Skipped while the stream is captured into a CUDA graph, which
    cannot wait."""
    if status is None or not (CHECK_SYNC if check is None else check) or _capturing(status):
        return
    _read(status, stream)


def check_pending(like: Any, stream: int) -> None:
    """Reads like's status buffer after a call that waited for the stream anyway (a host read of
    lengths), so an offence recorded by earlier ops surfaces at no extra wait."""
    status = _status.get(("torch", like.get_device())) if type(like) is _TorchTensor else None
    if status is not None and not _capturing(status):
        _read(status, stream)


def check_status(status: Any = None, stream: Any = None) -> None:
    """Raises `MsaError` for the first invalid index (block id, page id, cu_seqlens entry, a
    length past a decode plan) that GPU ops recorded since the last check, and clears it.

    Without arguments: the status buffers msa keeps per device; waits for each device's current
    stream (or `stream`). With `status`: a caller's int32[4] buffer, on `stream` or the current
    stream of its device. Ops never wait by default; call this where a sync is affordable (e.g.
    once per step), or set MSA_CHECK_SYNC=1 to check after every op."""
    if status is not None:
        check_arrays(status=status)
        _C.check_status(status=arg(status), stream=stream_handle(status, stream))
        return
    for buf in list(_status.values()):
        _read(buf, stream_of(buf, stream))
