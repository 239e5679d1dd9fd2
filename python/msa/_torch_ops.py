"""msa's ops as torch custom ops (torch.ops.msa.*) with fake implementations, so torch.compile
traces them as opaque nodes and CUDA-graph capture records their kernels. Registered by
msa/__init__.py when torch is installed; the public functions in ops.py route torch tensors here
when no preallocated output is passed."""

from __future__ import annotations

import weakref
from typing import Optional

import torch
from torch import Tensor

from . import _C, _impl

#: Live decode plans by id: a custom op cannot take a C++ object, so run() passes the plan's id.
DECODE_PLANS: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()


def _kv(k, k_scale, v, v_scale, cu_seqlens_k, page_table, seqused_k, kv_layout) -> dict:
    kv = {"kv_layout": kv_layout, "k": k, "k_scale": k_scale, "cu_seqlens_k": cu_seqlens_k,
          "page_table": page_table, "seqused_k": seqused_k}
    if v is not None:
        kv.update(v=v, v_scale=v_scale)
    return kv


def _empty_f32(like: Tensor) -> Tensor:
    return like.new_empty((0,), dtype=torch.float32)


@torch.library.custom_op("msa::block_scores", mutates_args=())
def block_scores(q: Tensor, q_scale: Optional[Tensor], k: Tensor, k_scale: Optional[Tensor],
                 cu_seqlens_q: Tensor, cu_seqlens_k: Optional[Tensor],
                 page_table: Optional[Tensor], seqused_k: Optional[Tensor], kv_layout: str,
                 q_global_scale: float, k_global_scale: float, causal: bool, kv_block_size: int,
                 nblk_max: int, check: bool, stream: Optional[int]) -> Tensor:
    kv = _kv(k, k_scale, None, None, cu_seqlens_k, page_table, seqused_k, kv_layout)
    kv["k_global_scale"] = k_global_scale
    return _impl.block_scores(q, q_scale, q_global_scale, kv, cu_seqlens_q, causal=causal,
                              kv_block_size=kv_block_size, nblk_max=nblk_max, out=None,
                              stream=stream, check=check)


@block_scores.register_fake
def _(q, q_scale, k, k_scale, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, kv_layout,
      q_global_scale, k_global_scale, causal, kv_block_size, nblk_max, check, stream):
    return q.new_empty((q.shape[1], nblk_max, q.shape[0]), dtype=torch.float32)


@torch.library.custom_op("msa::block_topk", mutates_args=())
def block_topk(q: Tensor, q_scale: Optional[Tensor], k: Tensor, k_scale: Optional[Tensor],
               cu_seqlens_q: Tensor, cu_seqlens_k: Optional[Tensor], page_table: Optional[Tensor],
               seqused_k: Optional[Tensor], kv_layout: str, q_global_scale: float,
               k_global_scale: float, topk: int, sink_blocks: int, local_blocks: int,
               causal: bool, kv_block_size: int, check: bool, stream: Optional[int]) -> Tensor:
    kv = _kv(k, k_scale, None, None, cu_seqlens_k, page_table, seqused_k, kv_layout)
    kv["k_global_scale"] = k_global_scale
    return _impl.block_topk(q, q_scale, q_global_scale, kv, cu_seqlens_q, causal=causal,
                            kv_block_size=kv_block_size, topk=topk, sink_blocks=sink_blocks,
                            local_blocks=local_blocks, out=None, stream=stream, check=check)


@block_topk.register_fake
def _(q, q_scale, k, k_scale, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, kv_layout,
      q_global_scale, k_global_scale, topk, sink_blocks, local_blocks, causal, kv_block_size,
      check, stream):
    hkv = k.shape[_impl.kv_heads_dim(kv_layout)]
    return q.new_empty((hkv, q.shape[0], topk), dtype=torch.int32)


@torch.library.custom_op("msa::select_topk", mutates_args=())
def select_topk(scores: Tensor, cu_seqlens_q: Tensor, k: Optional[Tensor],
                cu_seqlens_k: Optional[Tensor], page_table: Optional[Tensor],
                seqused_k: Optional[Tensor], kv_layout: str, num_kv_heads: int, topk: int,
                sink_blocks: int, local_blocks: int, causal: bool, kv_block_size: int,
                check: bool, stream: Optional[int]) -> Tensor:
    kv = _kv(k, None, None, None, cu_seqlens_k, page_table, seqused_k, kv_layout)
    return _impl.select_topk(scores, cu_seqlens_q, kv, num_kv_heads=num_kv_heads, topk=topk,
                             sink_blocks=sink_blocks, local_blocks=local_blocks, causal=causal,
                             kv_block_size=kv_block_size, out=None, stream=stream, check=check)


@select_topk.register_fake
def _(scores, cu_seqlens_q, k, cu_seqlens_k, page_table, seqused_k, kv_layout, num_kv_heads,
      topk, sink_blocks, local_blocks, causal, kv_block_size, check, stream):
    return scores.new_empty((num_kv_heads, scores.shape[2], topk), dtype=torch.int32)


@torch.library.custom_op("msa::build_k2q_csr", mutates_args=())
def build_k2q_csr(q2k: Tensor, cu_seqlens_q: Tensor, k: Optional[Tensor],
                  cu_seqlens_k: Optional[Tensor], page_table: Optional[Tensor],
                  seqused_k: Optional[Tensor], kv_layout: str, kv_block_size: int,
                  total_rows: int, return_schedule: bool, check: bool,
                  stream: Optional[int]) -> tuple[Tensor, Tensor, Tensor]:
    kv = _kv(k, None, None, None, cu_seqlens_k, page_table, seqused_k, kv_layout)
    row_ptr, q_idx, schedule = _impl.build_k2q_csr(
        q2k, cu_seqlens_q, kv, kv_block_size=kv_block_size, rows=total_rows,
        return_schedule=return_schedule, out=None, stream=stream, check=check)
    return row_ptr, q_idx, schedule if schedule is not None else q2k.new_empty((0,))


@build_k2q_csr.register_fake
def _(q2k, cu_seqlens_q, k, cu_seqlens_k, page_table, seqused_k, kv_layout, kv_block_size,
      total_rows, return_schedule, check, stream):
    hkv, total_q, topk = q2k.shape
    n = _C.k2q_schedule_size(int(hkv), int(total_rows), int(total_q), int(topk)) \
        if return_schedule else 0
    return (q2k.new_empty((hkv, total_rows + 1)), q2k.new_empty((hkv, total_q * topk)),
            q2k.new_empty((n,)))


@torch.library.custom_op("msa::attention_forward", mutates_args=())
def attention_forward(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                      cu_seqlens_k: Optional[Tensor], page_table: Optional[Tensor],
                      seqused_k: Optional[Tensor], k_scale: Optional[Tensor],
                      v_scale: Optional[Tensor], q2k: Optional[Tensor],
                      k2q_row_ptr: Optional[Tensor], k2q_q_idx: Optional[Tensor],
                      k2q_schedule: Optional[Tensor], kv_layout: str, softmax_scale: float,
                      causal: bool, kv_block_size: int, temperature: float, partial_dtype: str,
                      check: bool, stream: Optional[int]) -> tuple[Tensor, Tensor, Tensor]:
    kv = _kv(k, k_scale, v, v_scale, cu_seqlens_k, page_table, seqused_k, kv_layout)
    k2q = None if k2q_row_ptr is None else (k2q_row_ptr, k2q_q_idx, k2q_schedule)
    out, lse, tlse = _impl.attention_forward(
        q, kv, cu_seqlens_q, q2k=q2k, k2q=k2q, softmax_scale=softmax_scale or None,
        causal=causal, kv_block_size=kv_block_size, temperature=temperature,
        partial_dtype=partial_dtype, out=None, lse=None, tlse=None, stream=stream, check=check)
    return out, lse, tlse if tlse is not None else _empty_f32(q)


@attention_forward.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, k_scale, v_scale, q2k,
      k2q_row_ptr, k2q_q_idx, k2q_schedule, kv_layout, softmax_scale, causal, kv_block_size,
      temperature, partial_dtype, check, stream):
    return _fake_attention(q, temperature)


def _fake_attention(q: Tensor, temperature: float):
    total_q, hq = q.shape[0], q.shape[1]
    lse = q.new_empty((hq, total_q), dtype=torch.float32)
    tlse = q.new_empty((hq, total_q), dtype=torch.float32) if temperature > 0 else _empty_f32(q)
    return q.new_empty(q.shape), lse, tlse


@torch.library.custom_op("msa::decode_run", mutates_args=())
def decode_run(plan_id: int, q: Tensor, k: Tensor, v: Tensor, page_table: Tensor,
               cu_seqlens_q: Tensor, seqused_k: Optional[Tensor], k_scale: Optional[Tensor],
               v_scale: Optional[Tensor], q2k: Optional[Tensor], softmax_scale: float,
               causal: bool, temperature: float, check: bool,
               stream: Optional[int]) -> tuple[Tensor, Tensor, Tensor]:
    plan = DECODE_PLANS[plan_id]
    out, lse, tlse = plan._run_impl(q, k, v, page_table, cu_seqlens_q, seqused_k, k_scale,
                                    v_scale, q2k, softmax_scale, causal, temperature, None,
                                    None, None, stream, check)
    return out, lse, tlse if tlse is not None else _empty_f32(q)


@decode_run.register_fake
def _(plan_id, q, k, v, page_table, cu_seqlens_q, seqused_k, k_scale, v_scale, q2k,
      softmax_scale, causal, temperature, check, stream):
    return _fake_attention(q, temperature)


@torch.library.custom_op("msa::quantize", mutates_args=())
def quantize(x: Tensor, format: str, global_scale: float,
             stream: Optional[int]) -> tuple[Tensor, Tensor]:
    return _impl.quantize(x, format, global_scale=global_scale, out=None, stream=stream)


@quantize.register_fake
def _(x, format, global_scale, stream):
    from ._arrays import torch_dtype
    t, h, d = x.shape
    fp8 = format.startswith("fp8")
    values = x.new_empty((t, h, d) if fp8 else (t, h, d // 2),
                         dtype=torch_dtype(_impl.VALUE_DTYPES[format]))
    scale = x.new_empty(_impl.SCALE_SHAPES[format](t, h, d),
                        dtype=torch_dtype(_impl.SCALE_DTYPES[format]))
    return values, scale


@torch.library.custom_op("msa::dequantize", mutates_args=())
def dequantize(values: Tensor, scale: Optional[Tensor], format: Optional[str],
               global_scale: float, dtype: str, stream: Optional[int]) -> Tensor:
    return _impl.dequantize(values, scale, format, global_scale=global_scale, dtype=dtype,
                            out=None, stream=stream)


@dequantize.register_fake
def _(values, scale, format, global_scale, dtype, stream):
    from ._arrays import dtype_of, torch_dtype
    shape = list(values.shape)
    packed = (format is not None and _impl.VALUE_DTYPES[format] == "fp4x2") or \
        dtype_of(values) == "fp4x2"
    if packed:
        shape[-1] *= 2
    return values.new_empty(shape, dtype=torch_dtype(dtype))
