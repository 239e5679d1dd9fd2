"""Quantized tensors (FP8 e4m3, NVFP4, MXFP4; docs/semantics.md, Quantized formats): the
`QTensor` type the ops accept wherever an input may be quantized, `quantize` / `dequantize`
on the CPU or the GPU (bitwise equal results), and the FP4 scales' reorder into the preordered
layout the indexer also takes (`reorder_fp4_scales`) and back."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Sequence

from . import _C
from ._arrays import _TORCH_NAMES, Typed, dtype_of, empty, shape_of
from ._runtime import (_TorchTensor, MsaError, arg, check_arrays, check_sequence, compiling,
                       count, dims, stream_of)

# Per format: element types of values and scale, and the scale's shape for x [T, H, D].
VALUE_DTYPES = {"fp8_per_tensor": "fp8_e4m3", "fp8_per_token": "fp8_e4m3",
                "fp8_per_token_head": "fp8_e4m3", "nvfp4": "fp4x2", "mxfp4": "fp4x2"}
SCALE_DTYPES = {"fp8_per_tensor": "f32", "fp8_per_token": "f32", "fp8_per_token_head": "f32",
                "nvfp4": "fp8_e4m3", "mxfp4": "e8m0"}
SCALE_SHAPES = {"fp8_per_tensor": lambda t, h, d: (1,),
                "fp8_per_token": lambda t, h, d: (t,),
                "fp8_per_token_head": lambda t, h, d: (t, h),
                "nvfp4": lambda t, h, d: (t, h, d // 16),
                "mxfp4": lambda t, h, d: (t, h, d // 32)}
# The element types dequantize writes.
OUT_DTYPES = ("f32", "bf16", "f16")
# The public FP4 scale layouts reorder_fp4_scales takes, and the public shape each spells.
LAYOUTS = {"flat": "[T, H, G]", "paged_nhd": "[num_pages, 128, Hkv, G]",
           "paged_hnd": "[num_pages, Hkv, 128, G]"}


def _check_format(format: str) -> None:
    if format not in VALUE_DTYPES:
        raise MsaError(f"format: must be one of {sorted(VALUE_DTYPES)}, got {format!r}")


class QTensor(NamedTuple):
    """A quantized tensor: values, scale (None for bf16/f16), NVFP4 global scale, and the
    format it came from (None when unknown). Returned by `quantize`; accepted wherever q or k
    may be quantized (`block_scores`, `block_topk`, the index inputs of `sparse_attention`),
    as the k and v of `attention_forward` and `DecodePlan.run` (FP8 K/V; on CUDA with bf16 q
    or, in DecodePlan.run, FP8 q), as their q (FP8 formats: q_scale per tensor, token or token
    and head; out bf16) and by `dequantize`."""

    values: Any
    scale: Any = None
    global_scale: float = 1.0
    format: Optional[str] = None


def tag(x: Any, dtype: str) -> Any:
    """Types a uint storage array as `dtype`; arrays whose own type msa can name stay as they
    are (a mismatch is then reported by the C++ checks)."""
    if type(x) is _TorchTensor:  # the common case first, one dict lookup (a call's host time)
        return Typed(x, dtype) if _TORCH_NAMES.get(x.dtype, "u8") == "u8" else x
    if x is None or isinstance(x, Typed):
        return x
    return Typed(x, dtype) if dtype_of(x) in ("u8", None) else x


def unpack(x: Any, scale: Any = None, global_scale: float = 1.0) -> tuple:
    """(values, scale, global_scale) of a plain array or a QTensor (typed by its format). A
    QTensor's global scale wins unless it is the default 1.0, so the keyword can set it."""
    if type(x) is _TorchTensor or x is None or not isinstance(x, QTensor):
        return x, scale, global_scale
    values, qscale, qglobal, fmt = x  # one unpacking, not four attribute reads
    if fmt is not None:
        values = tag(values, VALUE_DTYPES[fmt])
        qscale = tag(qscale, SCALE_DTYPES[fmt])
    return values, qscale, qglobal if qglobal != 1.0 else global_scale


def quantize(x: Any, format: str, *, global_scale: float = 1.0,
             out: Optional[Sequence[Any]] = None, stream: Any = None) -> QTensor:
    """Quantizes ``x [T, H, D]`` (f32/bf16/f16) to `format`:

    - "fp8_per_tensor" / "fp8_per_token" / "fp8_per_token_head": fp8_e4m3 values ``[T, H, D]``,
      f32 scale ``[1]`` / ``[T]`` / ``[T, H]`` = amax / 448;
    - "nvfp4": fp4x2 values ``[T, H, D/2]``, fp8_e4m3 scale ``[T, H, D/16]`` (times
      ``global_scale``);
    - "mxfp4": fp4x2 values ``[T, H, D/2]``, e8m0 scale ``[T, H, D/32]``.

    Returns a `QTensor`. numpy without ml_dtypes holds fp8/e8m0 as uint8; fp4x2 is uint8 in
    numpy (two e2m1 values a byte, element 2i in the low nibble).
    """
    _check_format(format)
    check_arrays(x=x)
    check_sequence(out, "out", "(values, scale)", (2,))
    dims(x, "x", 3, "[T, H, D]")
    if out is None and compiling():
        from . import _torch_ops
        values, scale = _torch_ops.quantize(x, format, float(global_scale), stream)
    else:
        values, scale = quantize_eager(x, format, float(global_scale), out, stream)
    return QTensor(values, scale, float(global_scale), format)


def quantize_eager(x: Any, format: str, global_scale: float, out: Optional[Sequence[Any]],
                   stream: Any) -> tuple:
    t, h, d = dims(x, "x", 3, "[T, H, D]")
    if out is None:
        fp8 = format.startswith("fp8")
        values = empty(x, (t, h, d) if fp8 else (t, h, d // 2), VALUE_DTYPES[format])
        scale = empty(x, SCALE_SHAPES[format](t, h, d), SCALE_DTYPES[format])
    else:
        values, scale = out
    _C.quantize(x=arg(x), format=format, out=arg(values, VALUE_DTYPES[format]),
                out_scale=arg(scale, SCALE_DTYPES[format]), out_global_scale=global_scale,
                stream=stream_of(x, stream))
    return values, scale


def dequantize(x: Any, scale: Any = None, *, format: Optional[str] = None,
               global_scale: float = 1.0, dtype: Optional[str] = None, out: Any = None,
               stream: Any = None) -> Any:
    """The exact dequantized values of `x` (a `QTensor`, or values plus ``scale``), rounded
    once to `dtype` ("f32", "bf16" or "f16"; default: ``out``'s dtype, else "f32"):
    ``[T, H, D]``. A ``dtype`` that disagrees with ``out``'s is an error. ``format`` types uint8
    storage arrays (numpy without ml_dtypes); a QTensor carries its own."""
    if isinstance(x, QTensor):
        x, scale, global_scale, format = x.values, x.scale, x.global_scale, x.format
    if format is not None:
        _check_format(format)
    if dtype is not None and dtype not in OUT_DTYPES:
        # Checked here, before out is allocated in it; msa._C holds the same rule for out.
        raise MsaError(f"dtype: must be 'f32', 'bf16' or 'f16', got {dtype!r}")
    check_arrays(x=x, scale=scale, out=out)
    out_dtype = dtype_of(out) if out is not None else None
    if dtype is not None and out_dtype in OUT_DTYPES and out_dtype != dtype:
        raise MsaError(f"dtype: {dtype!r} disagrees with out's dtype {out_dtype!r}; pass one "
                       f"of them, or both alike")
    if dtype is None:
        dtype = out_dtype if out_dtype in OUT_DTYPES else "f32"
    dims(x, "x", 3, "[T, H, D]")
    if out is None and compiling():
        from . import _torch_ops
        return _torch_ops.dequantize(x, scale, format, float(global_scale), dtype, stream)
    return dequantize_eager(x, scale, format, float(global_scale), dtype, out, stream)


def dequantize_eager(values: Any, scale: Any, format: Optional[str], global_scale: float,
                     dtype: str, out: Any, stream: Any) -> Any:
    if format is not None:
        values = tag(values, VALUE_DTYPES[format])
        scale = tag(scale, SCALE_DTYPES[format])
    shape = list(shape_of(values))
    vdtype = values.dtype if isinstance(values, Typed) else dtype_of(values)
    if vdtype == "fp4x2":
        shape[-1] *= 2
    if out is None:
        out = empty(values, shape, dtype)
    _C.dequantize(x=arg(values), x_scale=arg(scale), x_global_scale=global_scale,
                  out=arg(out, dtype), stream=stream_of(values, stream))
    return out


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise MsaError(f"layout: must be one of {sorted(LAYOUTS)}, got {layout!r}")


def _fp4_scale(scale: Any, format: Optional[str], name: str) -> tuple:
    """(scale typed by `format` where it is uint8 storage, its msa dtype): fp8_e4m3 or e8m0."""
    if format is not None:
        if format not in ("nvfp4", "mxfp4"):
            raise MsaError(f"format: must be 'nvfp4' or 'mxfp4', got {format!r}")
        scale = tag(scale, SCALE_DTYPES[format])
    dtype = dtype_of(scale)
    if dtype not in ("fp8_e4m3", "e8m0"):
        raise MsaError(f"{name}: dtype must be fp8_e4m3 (NVFP4) or e8m0 (MXFP4), got {dtype}; "
                       f"pass format='nvfp4' or 'mxfp4' for uint8 storage")
    return scale, dtype


def _preordered_shape(shape: Sequence[int], layout: str) -> tuple:
    """The preordered shape of public FP4 scales of `shape` in `layout` (`reorder_fp4_scales`)."""
    rest_g = -(-shape[-1] // 4)
    if layout == "flat":
        return (shape[1], -(-shape[0] // 128), rest_g, 32, 4, 4)
    return (shape[0] * shape[2 if layout == "paged_nhd" else 1], 1, rest_g, 32, 4, 4)


def reorder_fp4_scales(scale: Any, layout: str = "flat", *, format: Optional[str] = None,
                       out: Any = None, stream: Any = None) -> Any:
    """FP4 scales in the preordered layout, which `block_scores` and `block_topk` take beside
    the public one (docs/semantics.md, Quantized formats): a contiguous
    ``[L, restM, restG, 32, 4, 4]`` array of the same dtype, ``restG = ceil(G / 4)``, where
    the scale of (matrix l, row m, group g) sits at ``l*512*restM*restG + (m//128)*512*restG
    + (g//4)*512 + (m%32)*16 + ((m//32)%4)*4 + g%4`` and padding holds zero bytes.

    - ``layout="flat"``: ``scale [T, H, G]`` (q's, or flat keys') ->
      ``[H, ceil(T / 128), restG, 32, 4, 4]`` (l = head, m = token);
    - ``"paged_nhd"`` / ``"paged_hnd"``: a page pool's ``[num_pages, 128, Hkv, G]`` /
      ``[num_pages, Hkv, 128, G]`` (page size 128 only) -> ``[num_pages * Hkv, 1, restG, 32, 4,
      4]`` (l = page * Hkv + h, m = slot).

    ``scale``: fp8_e4m3 (NVFP4) or e8m0 (MXFP4); ``format`` ("nvfp4" / "mxfp4") types uint8
    storage. A `QTensor` gives a `QTensor` with its scale reordered. ``out``: preallocated in
    the preordered shape. CPU or GPU (bitwise equal results).
    """
    if isinstance(scale, QTensor):
        reordered = reorder_fp4_scales(scale.scale, layout, format=format or scale.format,
                                       out=out, stream=stream)
        return QTensor(scale.values, reordered, scale.global_scale, scale.format)
    _check_layout(layout)
    check_arrays(scale=scale, out=out)
    shape = dims(scale, "scale", 3 if layout == "flat" else 4, LAYOUTS[layout])
    scale, dtype = _fp4_scale(scale, format, "scale")
    return _reorder(scale, dtype, layout, _preordered_shape(shape, layout), False, out, stream)


def reorder_fp4_scales_to_public(scale: Any, layout: str = "flat", *,
                                 shape: Optional[Sequence[int]] = None,
                                 format: Optional[str] = None, out: Any = None,
                                 stream: Any = None) -> Any:
    """The inverse of `reorder_fp4_scales`: preordered ``scale [L, restM, restG, 32, 4, 4]`` back
    to the public layout of `layout`, whose ``shape`` (or ``out``, preallocated) gives T (or
    num_pages and Hkv) and G; padding is not read."""
    _check_layout(layout)
    check_arrays(scale=scale, out=out)
    dims(scale, "scale", 6, "[L, restM, restG, 32, 4, 4]")
    scale, dtype = _fp4_scale(scale, format, "scale")
    if out is not None:
        shape = dims(out, "out", 3 if layout == "flat" else 4, LAYOUTS[layout])
    elif shape is None:
        raise MsaError(f"shape: the public shape {LAYOUTS[layout]} is required without out")
    else:
        n = 3 if layout == "flat" else 4
        if not isinstance(shape, (tuple, list)) or len(shape) != n:
            raise MsaError(f"shape: must be {LAYOUTS[layout]} ({n} ints), got {shape!r}")
        shape = tuple(count(d, "shape", bits=64) for d in shape)
    return _reorder(scale, dtype, layout, shape, True, out, stream)


def _reorder(scale: Any, dtype: str, layout: str, out_shape: tuple, to_public: bool, out: Any,
             stream: Any) -> Any:
    if out is None and compiling():
        from . import _torch_ops
        storage = scale.array if isinstance(scale, Typed) else scale
        return _torch_ops.reorder_fp4_scales(storage, dtype, layout, list(out_shape), to_public,
                                             stream)
    return reorder_eager(scale, dtype, layout, out_shape, to_public, out, stream)


def reorder_eager(scale: Any, dtype: str, layout: str, out_shape: Sequence[int],
                  to_public: bool, out: Any, stream: Any) -> Any:
    scale = tag(scale, dtype)
    if out is None:
        out = empty(scale, out_shape, dtype)
    _C.reorder_fp4_scales(scale=arg(scale), layout=layout, out=arg(out, dtype),
                          to_public=to_public, stream=stream_of(scale, stream))
    return out


__all__ = ["QTensor", "quantize", "dequantize", "reorder_fp4_scales",
           "reorder_fp4_scales_to_public"]
