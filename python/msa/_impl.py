"""Framework-neutral op bodies: allocate what the caller did not pass (with the caller's
framework), call msa._C, check the device status. Called by the public functions in ops.py and,
for torch tensors, by the torch custom ops in _torch_ops.py (which must not re-enter dispatch)."""

from __future__ import annotations

from typing import Any, Optional

from . import _C
from ._arrays import (Typed, _torch, as_arg, dtype_of, empty, is_cuda, is_torch, shape_of,
                      stream_handle, to_host_list)

LAYOUTS = {"flat": "flat", "paged_nhd": "paged_nhd", "paged_hnd": "paged_hnd",
           "nhd": "paged_nhd", "hnd": "paged_hnd"}


def layout_name(kv_layout: Optional[str], page_table: Any) -> str:
    """kv_layout, defaulting to flat without a page table and paged_nhd with one."""
    if kv_layout is None:
        return "flat" if page_table is None else "paged_nhd"
    if kv_layout not in LAYOUTS:
        raise ValueError(f"kv_layout: must be one of {sorted(LAYOUTS)}, got {kv_layout!r}")
    return LAYOUTS[kv_layout]


def page_size_of(k: Any, layout: str) -> int:
    shape = shape_of(k)
    return shape[1] if layout == "paged_nhd" else shape[2]


def key_lengths(kv: dict) -> list:
    """Lk_b of every batch, on the host (synchronizes for GPU cu_seqlens_k / seqused_k)."""
    if kv["kv_layout"] == "flat":
        cu = to_host_list(kv["cu_seqlens_k"])
        return [cu[b + 1] - cu[b] for b in range(len(cu) - 1)]
    batch, max_pages = shape_of(kv["page_table"])
    if kv.get("seqused_k") is not None:
        return to_host_list(kv["seqused_k"])
    return [max_pages * page_size_of(kv["k"], kv["kv_layout"])] * batch


def kv_heads_dim(layout: str) -> int:
    """The dim of k that counts the kv heads: [total_k, Hkv, D], [pages, page, Hkv, D] or
    [pages, Hkv, page, D] (fp4x2 halves only the last dim)."""
    return 2 if layout == "paged_nhd" else 1


def max_blocks(kv: dict, kv_block_size: int, max_seqlen_k: Optional[int]) -> int:
    """nblk_max for block scores: from max_seqlen_k when given; for paged KV the page-table
    capacity (static, so CUDA graphs and torch.compile need no host read); for flat KV the
    longest batch (a host read of cu_seqlens_k)."""
    if max_seqlen_k is None:
        if kv["kv_layout"] == "flat":
            max_seqlen_k = max(key_lengths(kv), default=0)
        else:
            max_seqlen_k = shape_of(kv["page_table"])[1] * page_size_of(kv["k"], kv["kv_layout"])
    return (int(max_seqlen_k) + kv_block_size - 1) // kv_block_size


def total_rows(kv: dict, kv_block_size: int) -> int:
    """sum_b ceil(Lk_b / kv_block_size), the CSR row count (host read of the lengths)."""
    return sum((lk + kv_block_size - 1) // kv_block_size for lk in key_lengths(kv))


def kv_kwargs(kv: dict) -> dict:
    """The KV-cache keywords of msa._C from a dict of arrays (see ops._kv)."""
    out = {"kv_layout": kv["kv_layout"]}
    for key in ("k", "k_scale", "v", "v_scale", "cu_seqlens_k", "page_table", "seqused_k"):
        if key in kv:
            out[key] = as_arg(kv[key])
    for key in ("k_global_scale", "v_global_scale"):
        if key in kv:
            out[key] = float(kv[key])
    return out


def _status(like: Any, status: Any) -> Any:
    """The status buffer for a CUDA call: the caller's, or a fresh zeroed int32[4]."""
    if not is_cuda(like):
        return status
    return status if status is not None else empty(like, (4,), "i32", zero=True)


def _finish(like: Any, status: Any, stream: int, check: bool) -> None:
    # Device-side index checks report through `status`; reading it waits for the stream, which
    # a stream being captured into a CUDA graph cannot do, so capture skips the check.
    if not check or status is None or not is_cuda(like):
        return
    if is_torch(like) and _torch().cuda.is_current_stream_capturing():
        return
    _C.check_status(status=as_arg(status), stream=stream)


def block_scores(q: Any, q_scale: Any, q_global_scale: float, kv: dict, cu_seqlens_q: Any, *,
                 causal: bool, kv_block_size: int, nblk_max: int, out: Any, stream: Any,
                 check: bool, status: Any = None) -> Any:
    total_q, hq = shape_of(q)[0], shape_of(q)[1]
    if out is None:
        out = empty(q, (hq, nblk_max, total_q), "f32")
    st = stream_handle(q, stream)
    status = _status(q, status)
    _C.block_scores(q=as_arg(q), q_scale=as_arg(q_scale), q_global_scale=float(q_global_scale),
                    **kv_kwargs(kv), cu_seqlens_q=as_arg(cu_seqlens_q), scores=as_arg(out),
                    causal=causal, kv_block_size=kv_block_size, status=as_arg(status), stream=st)
    _finish(q, status, st, check)
    return out


def block_topk(q: Any, q_scale: Any, q_global_scale: float, kv: dict, cu_seqlens_q: Any, *,
               causal: bool, kv_block_size: int, topk: int, sink_blocks: int,
               local_blocks: int, out: Any, stream: Any, check: bool, status: Any = None) -> Any:
    if out is None:
        hkv = shape_of(kv["k"])[kv_heads_dim(kv["kv_layout"])]
        out = empty(q, (hkv, shape_of(q)[0], topk), "i32")
    st = stream_handle(q, stream)
    status = _status(q, status)
    _C.block_topk(q=as_arg(q), q_scale=as_arg(q_scale), q_global_scale=float(q_global_scale),
                  **kv_kwargs(kv), cu_seqlens_q=as_arg(cu_seqlens_q), causal=causal,
                  kv_block_size=kv_block_size, topk=topk, sink_blocks=sink_blocks,
                  local_blocks=local_blocks, q2k=as_arg(out), status=as_arg(status), stream=st)
    _finish(q, status, st, check)
    return out


def select_topk(scores: Any, cu_seqlens_q: Any, kv: dict, *, num_kv_heads: int, topk: int,
                sink_blocks: int, local_blocks: int, causal: bool, kv_block_size: int,
                out: Any, stream: Any, check: bool, status: Any = None) -> Any:
    total_q = shape_of(scores)[2]
    if out is None:
        out = empty(scores, (num_kv_heads, total_q, topk), "i32")
    st = stream_handle(scores, stream)
    status = _status(scores, status)
    _C.select_topk(scores=as_arg(scores), cu_seqlens_q=as_arg(cu_seqlens_q), **kv_kwargs(kv),
                   num_kv_heads=num_kv_heads, topk=topk, sink_blocks=sink_blocks,
                   local_blocks=local_blocks, causal=causal, kv_block_size=kv_block_size,
                   q2k=as_arg(out), status=as_arg(status), stream=st)
    _finish(scores, status, st, check)
    return out


def build_k2q_csr(q2k: Any, cu_seqlens_q: Any, kv: dict, *, kv_block_size: int, rows: int,
                  return_schedule: bool, out: Optional[tuple], stream: Any, check: bool,
                  status: Any = None) -> tuple:
    hkv, total_q, topk = shape_of(q2k)
    if out is not None:
        row_ptr, q_idx = out[0], out[1]
        schedule = out[2] if len(out) > 2 else None
    else:
        row_ptr = empty(q2k, (hkv, rows + 1), "i32")
        q_idx = empty(q2k, (hkv, total_q * topk), "i32")
        schedule = empty(q2k, (_C.k2q_schedule_size(hkv, rows, total_q, topk),), "i32") \
            if return_schedule else None
    rows = shape_of(row_ptr)[1] - 1
    st = stream_handle(q2k, stream)
    status = _status(q2k, status)
    workspace = None
    if is_cuda(q2k):
        nbytes = _C.csr_workspace_bytes(hkv, rows, total_q, topk)
        workspace = empty(q2k, (nbytes,), "u8") if nbytes > 0 else None
    _C.build_k2q_csr(q2k=as_arg(q2k), cu_seqlens_q=as_arg(cu_seqlens_q), **kv_kwargs(kv),
                     kv_block_size=kv_block_size, row_ptr=as_arg(row_ptr), q_idx=as_arg(q_idx),
                     schedule=as_arg(schedule), workspace=as_arg(workspace),
                     status=as_arg(status), stream=st)
    _finish(q2k, status, st, check)
    return row_ptr, q_idx, schedule


def attention_forward(q: Any, kv: dict, cu_seqlens_q: Any, *, q2k: Any, k2q: Optional[tuple],
                      softmax_scale: Optional[float], causal: bool, kv_block_size: int,
                      temperature: Optional[float], partial_dtype: str, out: Any, lse: Any,
                      tlse: Any, stream: Any, check: bool, status: Any = None,
                      decode_plan: Any = None) -> tuple:
    total_q, hq, d = shape_of(q)
    # out takes q's dtype; for a q msa cannot name, any placeholder does: _C rejects q first.
    qdtype = q.dtype if isinstance(q, Typed) else dtype_of(q) or "f32"
    if out is None:
        out = empty(q, (total_q, hq, d), qdtype)
    if lse is None:
        lse = empty(q, (hq, total_q), "f32")
    if temperature and tlse is None:
        tlse = empty(q, (hq, total_q), "f32")
    st = stream_handle(q, stream)
    status = _status(q, status)
    args = dict(q=as_arg(q), **kv_kwargs(kv), cu_seqlens_q=as_arg(cu_seqlens_q),
                q2k=as_arg(q2k), out=as_arg(out, expect=qdtype),
                lse=as_arg(lse), tlse=as_arg(tlse),
                softmax_scale=0.0 if softmax_scale is None else float(softmax_scale),
                causal=causal, temperature=float(temperature or 0.0), status=as_arg(status),
                stream=st)
    if decode_plan is not None:
        decode_plan.run(**args)
    else:
        if k2q is not None:
            args.update(k2q_row_ptr=as_arg(k2q[0]), k2q_q_idx=as_arg(k2q[1]),
                        k2q_schedule=as_arg(k2q[2] if len(k2q) > 2 else None))
        args.update(kv_block_size=kv_block_size, partial_dtype=partial_dtype)
        if is_cuda(q):
            nbytes = _C.attention_workspace_bytes(**args)
            if nbytes > 0:
                args["workspace"] = as_arg(empty(q, (nbytes,), "u8"))
        _C.attention_forward(**args)
    _finish(q, status, st, check)
    return out, lse, tlse


def quantize(x: Any, format: str, *, global_scale: float, out: Optional[tuple],
             stream: Any) -> tuple:
    t, h, d = shape_of(x)
    if out is None:
        values = empty(x, (t, h, d) if format.startswith("fp8") else (t, h, d // 2),
                       "fp8_e4m3" if format.startswith("fp8") else "fp4x2")
        scale = empty(x, SCALE_SHAPES[format](t, h, d), SCALE_DTYPES[format])
    else:
        values, scale = out
    _C.quantize(x=as_arg(x), format=format, out=as_arg(values, expect=VALUE_DTYPES[format]),
                out_scale=as_arg(scale, expect=SCALE_DTYPES[format]),
                out_global_scale=float(global_scale), stream=stream_handle(x, stream))
    return values, scale


def dequantize(values: Any, scale: Any, format: Optional[str], *, global_scale: float,
               dtype: str, out: Any, stream: Any) -> Any:
    if format is not None:
        values = _tag(values, VALUE_DTYPES[format])
        scale = _tag(scale, SCALE_DTYPES[format])
    shape = list(shape_of(values))
    vdtype = values.dtype if isinstance(values, Typed) else dtype_of(values)
    if vdtype == "fp4x2":
        shape[-1] *= 2
    if out is None:
        out = empty(values, shape, dtype)
    _C.dequantize(x=as_arg(values), x_scale=as_arg(scale), x_global_scale=float(global_scale),
                  out=as_arg(out, expect=dtype), stream=stream_handle(values, stream))
    return out


def _tag(x: Any, dtype: str) -> Any:
    """Types a uint storage array as `dtype`; arrays whose own type msa can name stay as they
    are (a mismatch is then reported by the C++ checks)."""
    if x is None or isinstance(x, Typed):
        return x
    return Typed(x, dtype) if dtype_of(x) in ("u8", None) else x


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

