"""msa.DecodePlan: decode attention over a paged KV cache with a plan()/run() split (DESIGN.md
section 7). plan() sizes the work list once per batch shape (may allocate and synchronize);
run() allocates nothing in C++, never synchronizes with check=False, and is CUDA-graph safe."""

from __future__ import annotations

import itertools
from typing import Any, Optional

from . import _C, _impl
from ._arrays import _torch, as_arg, empty_on, parse_device, stream_handle, \
    to_host_list, torch_dtype
from .ops import _kv, _stream_int, _torch_path

if _torch() is not None:
    from . import _torch_ops as _tops
else:
    _tops = None

_ids = itertools.count(1)


def _dtype_name(dtype: Any) -> str:
    if isinstance(dtype, str):
        return dtype
    t = _torch()
    if t is not None and isinstance(dtype, t.dtype):
        for name in ("bf16", "f16", "fp8_e4m3"):
            if torch_dtype(name) == dtype:
                return name
    raise ValueError(f"kv_dtype: must be 'bf16', 'f16' or 'fp8_e4m3' (or the torch dtype), "
                     f"got {dtype!r}")


def _host_int32(values: list) -> Any:
    """Host int32 array for plan()'s lengths: numpy when present, else a torch CPU tensor."""
    try:
        import numpy as np
        return np.ascontiguousarray(values, dtype=np.int32)
    except ImportError:
        t = _torch()
        return t.tensor(values, dtype=t.int32)


class DecodePlan:
    """Plans and runs decode attention (few queries per request, long paged KV).

    Typical serving loop::

        plan = msa.DecodePlan().plan(batch=B, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D,
                                     page_size=P, max_pages=M, kv_dtype=torch.bfloat16,
                                     device="cuda")
        for step in ...:
            out, lse = plan.run(q, k_cache, v_cache, page_table, cu_seqlens_q,
                                seqused_k=seqused_k)

    ``run`` accepts new ``seqused_k`` values within the planned shape (at most
    ``max_pages * page_size`` keys each, at most ``max_queries_per_request`` queries per
    request). Sparse decode: plan with ``topk > 0`` and pass ``q2k [Hkv, total_q, topk]``.
    """

    def __init__(self) -> None:
        self._plan = _C.DecodePlan()
        self._workspace: Any = None
        self._shape: Optional[dict] = None
        self._id = next(_ids)
        if _tops is not None:
            _tops.DECODE_PLANS[self._id] = self

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
             kv_block_size: int = 128, device: Any = "cpu", seqused_k: Any = None,
             stream: Any = None) -> "DecodePlan":
        """Validates and records the batch shape and allocates the workspace on `device`
        ('cpu', 'cuda[:i]', a torch.device or an array on it). ``seqused_k``: the current
        lengths, read on the host. Returns self."""
        kind, index = parse_device(device)
        layout = _impl.layout_name(kv_layout, page_table=True)
        shape = dict(batch=batch, max_queries_per_request=max_queries_per_request,
                     num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                     page_size=page_size, max_pages=max_pages, kv_layout=layout,
                     kv_dtype=_dtype_name(kv_dtype), topk=topk, kv_block_size=kv_block_size,
                     device_type=kind, device_index=index)
        nbytes = _C.DecodePlan.workspace_bytes(**shape)
        workspace = empty_on(device if kind == "cpu" else f"cuda:{index}", (nbytes,), "u8") \
            if nbytes > 0 else None
        lengths = None if seqused_k is None else _host_int32(to_host_list(seqused_k))
        handle = stream_handle(None, stream) if stream is not None else (
            _torch().cuda.current_stream(index).cuda_stream
            if kind == "cuda" and _torch() is not None else 0)
        self._plan.plan(**shape, seqused_k=lengths, workspace=as_arg(workspace), stream=handle)
        self._workspace, self._shape = workspace, shape
        return self

    def run(self, q: Any, k_cache: Any, v_cache: Any, page_table: Any, cu_seqlens_q: Any, *,
            seqused_k: Any = None, q2k: Any = None, k_scale: Any = None, v_scale: Any = None,
            softmax_scale: Optional[float] = None, causal: bool = True,
            temperature: Optional[float] = None, out: Any = None, lse: Any = None,
            tlse: Any = None, stream: Any = None, check: bool = True) -> tuple:
        """Decode attention for the planned shape: returns ``(out, lse)`` or
        ``(out, lse, tlse)`` as `msa.attention_forward` does. q ``[total_q, Hq, D]``,
        k_cache/v_cache page pools in the planned layout, page_table ``[B, max_pages]`` int32,
        cu_seqlens_q ``[B+1]``, seqused_k ``[B]`` int32 (default: full pages). FP8 e4m3 caches
        take f32 ``k_scale``/``v_scale`` of ``[1]`` (per tensor), ``[num_pages * page_size]``
        (per pool slot: slot s of page P at P * page_size + s) or
        ``[num_pages * page_size, Hkv]`` (per slot and kv head)."""
        if out is None and lse is None and tlse is None and _torch_path(
                q, k_cache, v_cache, k_scale, v_scale, q2k):
            out, lse, tlse = _tops.decode_run(
                self._id, q, k_cache, v_cache, page_table, cu_seqlens_q, seqused_k, k_scale,
                v_scale, q2k, float(softmax_scale or 0.0), causal, float(temperature or 0.0),
                check, _stream_int(stream))
        else:
            out, lse, tlse = self._run_impl(q, k_cache, v_cache, page_table, cu_seqlens_q,
                                            seqused_k, k_scale, v_scale, q2k, softmax_scale,
                                            causal, temperature, out, lse, tlse, stream, check)
        return (out, lse, tlse) if temperature else (out, lse)

    def _run_impl(self, q, k_cache, v_cache, page_table, cu_seqlens_q, seqused_k, k_scale,
                  v_scale, q2k, softmax_scale, causal, temperature, out, lse, tlse, stream,
                  check) -> tuple:
        if self._shape is None:
            raise _C.MsaError("decode: run() called before a successful plan()")
        kv = _kv(k_cache, v_cache, page_table=page_table, seqused_k=seqused_k,
                 kv_layout=self._shape["kv_layout"], k_scale=k_scale, v_scale=v_scale)
        return _impl.attention_forward(
            q, kv, cu_seqlens_q, q2k=q2k, k2q=None, softmax_scale=softmax_scale or None,
            causal=causal, kv_block_size=self._shape["kv_block_size"], temperature=temperature,
            partial_dtype="f32", out=out, lse=lse, tlse=tlse, stream=stream, check=check,
            decode_plan=self._plan)


__all__ = ["DecodePlan"]
