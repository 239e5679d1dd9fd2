"""msa.DecodePlan: decode attention over a paged KV cache with a plan()/run() split
(docs/semantics.md, Decode). plan() sizes the split-KV work list once per batch shape (it may
allocate and wait for the stream); run() allocates nothing in C++, never waits unless asked to
(``check``), and is CUDA-graph safe."""

from __future__ import annotations

import itertools
from typing import Any, Optional

from . import _C
from ._arrays import (_torch, dtype_of, empty_on, parse_device, stream_handle, to_host_list,
                      torch_dtype)
from ._kv import layout_name
from ._runtime import MsaError, arg, check_arrays, check_pending, compiling
from .attention import _results, _visibility, attention_eager, check_attention_arrays
from .quant import unpack

_ids = itertools.count(1)

#: The arrays DecodePlan.run passes to check_attention_arrays, in its order.
_RUN_ARRAYS = ("k_cache", "v_cache", "page_table", "cu_seqlens_q", "seqused_k", "q2k", "q_scale",
               "k_scale", "v_scale", "out", "lse", "tlse", "causal_offset", "key_mask")


def _dtype_name(dtype: Any) -> str:
    if isinstance(dtype, str):
        return dtype
    t = _torch()
    if t is not None and isinstance(dtype, t.dtype):
        for name in ("bf16", "f16", "fp8_e4m3", "fp4x2"):
            if torch_dtype(name) == dtype:
                return name
    raise MsaError(f"kv_dtype: must be 'bf16', 'f16', 'fp8_e4m3' or 'fp4x2' (or the torch dtype), "
                     f"got {dtype!r}")


def _host_int32(values: list) -> Any:
    """Host int32 array for plan()'s lengths: numpy when present, else a torch CPU tensor."""
    try:
        import numpy as np
        return np.ascontiguousarray(values, dtype=np.int32)
    except ImportError:
        t = _torch()
        return t.tensor(values, dtype=t.int32)


def _nbytes(workspace: Any) -> int:
    return 0 if workspace is None else int(workspace.shape[0])


class DecodePlan:
    """Plans and runs decode attention (few queries per request, long paged KV).

    Typical serving loop::

        plan = msa.DecodePlan().plan(batch=B, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D,
                                     page_size=P, max_pages=M, kv_dtype=torch.bfloat16,
                                     seqused_k=seqused_k)  # the device is seqused_k's
        for step in ...:
            out = plan.run(q, k_cache, v_cache, page_table, cu_seqlens_q, seqused_k=seqused_k)

    Each request's planned capacity is its length at plan() rounded up to 128 keys (all of
    ``max_pages * page_size`` without ``seqused_k``). ``run`` accepts new ``seqused_k`` values
    up to that capacity and up to ``max_queries_per_request`` queries per request; a longer
    request is reported (`MsaError` "seqused_k: request b has n keys, past the planned
    capacity c", raised by `msa.check_status`, or at once with ``check=True``) and its keys
    past the capacity are not attended: plan() again when lengths grow. Re-planning reuses the
    workspace when it is large enough, so a CUDA graph that captured run() stays valid.
    Sparse decode: plan with ``topk > 0`` and pass ``q2k [Hkv, total_q, topk]``.
    """

    def __init__(self) -> None:
        self._plan = _C.DecodePlan()
        self._workspace: Any = None
        self._shape: Optional[dict] = None
        self._id = next(_ids)
        if _torch() is not None:
            from . import _torch_ops
            _torch_ops.DECODE_PLANS[self._id] = self

    @property
    def planned(self) -> bool:
        return self._plan.planned

    @property
    def shape(self) -> Optional[dict]:
        """The planned shape as keywords (None before plan())."""
        return None if self._shape is None else dict(self._shape)

    def plan(self, *, batch: int, num_q_heads: int, num_kv_heads: int, page_size: int,
             max_pages: int, head_dim: int = 128, max_queries_per_request: int = 1,
             kv_layout: str = "paged_nhd", kv_dtype: Any = "bf16", topk: int = 0,
             kv_block_size: int = 128, seqused_k: Any = None, device: Any = None,
             stream: Any = None) -> "DecodePlan":
        """Validates and records the batch shape, sizes the split-KV work list and writes it into
        the workspace. ``seqused_k``: the current lengths (an array on any device: read on the
        host, which waits for a GPU array's stream). The device is ``device`` ('cpu',
        'cuda[:i]', a torch.device or an array on it), else seqused_k's, else the CPU. Returns
        self."""
        check_arrays(seqused_k=seqused_k)
        if seqused_k is not None and dtype_of(seqused_k) != "i32":
            # Read on the host below: other element types would be cast, and silently truncated.
            raise MsaError("seqused_k: dtype must be i32, got "
                           f"{dtype_of(seqused_k) or seqused_k.dtype}")
        where = device if device is not None else seqused_k
        kind, index = parse_device(where)
        layout = layout_name(kv_layout, page_table=True)
        shape = dict(batch=batch, max_queries_per_request=max_queries_per_request,
                     num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                     page_size=page_size, max_pages=max_pages, kv_layout=layout,
                     kv_dtype=_dtype_name(kv_dtype), topk=topk, kv_block_size=kv_block_size,
                     device_type=kind, device_index=index)
        nbytes = _C.DecodePlan.workspace_bytes(**shape)
        same_device = self._shape is not None and (self._shape["device_type"],
                                                   self._shape["device_index"]) == (kind, index)
        workspace = self._workspace
        if nbytes > 0 and not (same_device and _nbytes(workspace) >= nbytes):
            workspace = empty_on("cpu" if kind == "cpu" else f"cuda:{index}", (nbytes,), "u8")
        lengths = None
        if seqused_k is not None:
            lengths = _host_int32(to_host_list(seqused_k))
        handle = stream_handle(None, stream) if stream is not None else (
            _torch().cuda.current_stream(index).cuda_stream
            if kind == "cuda" and _torch() is not None else 0)
        if seqused_k is not None and kind == "cuda" and _torch() is not None and \
                isinstance(seqused_k, _torch().Tensor) and seqused_k.is_cuda:
            check_pending(seqused_k, handle)  # the read above waited for the stream anyway
        self._plan.plan(**shape, seqused_k=lengths, workspace=arg(workspace), stream=handle)
        self._workspace, self._shape = workspace, shape
        return self

    def run(self, q: Any, k_cache: Any, v_cache: Any, page_table: Any, cu_seqlens_q: Any, *,
            seqused_k: Any = None, q2k: Any = None, q_scale: Any = None, k_scale: Any = None,
            v_scale: Any = None, softmax_scale: Optional[float] = None, causal: bool = True,
            temperature: Optional[float] = None, out: Any = None, lse: Any = None,
            tlse: Any = None, return_lse: bool = False, stream: Any = None,
            check: Optional[bool] = None, causal_offset: Any = None, key_mask: Any = None,
            key_mask_rows: Optional[str] = None, soft_cap: Optional[float] = None) -> Any:
        """Decode attention for the planned shape: returns ``out``, or ``(out, lse)`` with
        ``return_lse`` (``tlse`` last with a temperature), as `msa.attention_forward` does.
        q ``[total_q, Hq, D]``, k_cache/v_cache page pools in the planned layout, page_table
        ``[B, max_pages]`` int32, cu_seqlens_q ``[B+1]``, seqused_k ``[B]`` int32 (default: full
        pages). FP8 e4m3 caches take f32 ``k_scale``/``v_scale`` of ``[1]`` (per tensor),
        ``[num_pages * page_size]`` (per pool slot: slot s of page P at P * page_size + s) or
        ``[num_pages * page_size, Hkv]`` (per slot and kv head); k_cache and v_cache may
        also be a `QTensor` each.

        FP8 queries: q may be fp8_e4m3 (a `QTensor` from `quantize`, or values plus
        ``q_scale``), f32 ``q_scale`` of ``[1]`` (per tensor), ``[total_q]`` (per token) or
        ``[total_q, Hq]`` (per token and head), contiguous, absent meaning 1; q's values are
        q * q_scale. The caches may then be bf16, fp8_e4m3 or fp4x2 (not f16) and out is bf16.
        On the CPU and on CUDA alike.

        ``causal_offset``, ``key_mask`` (with ``key_mask_rows``) and ``soft_cap`` as in
        `msa.attention_forward`: on the CPU (with any planned head_dim); CUDA decode raises
        `MsaError` naming them."""
        if self._shape is None:
            raise MsaError("decode: run() called before a successful plan()")
        check_attention_arrays(q, None, _RUN_ARRAYS, k_cache, v_cache, page_table,
                               cu_seqlens_q, seqused_k, q2k, q_scale, k_scale, v_scale, out, lse,
                               tlse, causal_offset, key_mask)
        vis = _visibility(causal_offset, key_mask, key_mask_rows, soft_cap)
        q, q_scale, _ = unpack(q, q_scale)
        if out is None and lse is None and tlse is None and compiling():
            from . import _torch_ops
            k_cache, k_scale, _ = unpack(k_cache, k_scale)
            v_cache, v_scale, _ = unpack(v_cache, v_scale)
            out, lse, tlse = _torch_ops.decode_run(
                self._id, q, q_scale, k_cache, v_cache, page_table, cu_seqlens_q, seqused_k,
                k_scale, v_scale, q2k, float(softmax_scale or 0.0), causal,
                float(temperature or 0.0), check, *vis.op_args(), stream)
        else:
            out, lse, tlse = self.run_eager(q, k_cache, v_cache, page_table, cu_seqlens_q,
                                            seqused_k, k_scale, v_scale, q2k, softmax_scale,
                                            causal, temperature, out, lse, tlse, return_lse,
                                            stream, check, q_scale, vis)
        return _results(out, lse, tlse, return_lse, temperature)

    def run_eager(self, q, k_cache, v_cache, page_table, cu_seqlens_q, seqused_k, k_scale,
                  v_scale, q2k, softmax_scale, causal, temperature, out, lse, tlse, want_lse,
                  stream, check, q_scale=None, vis=None) -> tuple:
        q, q_scale, _ = unpack(q, q_scale)
        return attention_eager(
            q, k_cache, v_cache, cu_seqlens_q, None, page_table, seqused_k,
            self._shape["kv_layout"], q2k, None, softmax_scale, causal,
            self._shape["kv_block_size"], temperature, "", k_scale, v_scale, out, lse, tlse,
            want_lse, None, stream, check, decode_plan=self._plan, q_scale=q_scale, vis=vis)


__all__ = ["DecodePlan"]
