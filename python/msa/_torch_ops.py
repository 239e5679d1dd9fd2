"""msa's ops as torch custom ops (torch.ops.msa.*) with fake implementations, so torch.compile
traces them as opaque nodes. The public functions route here only while torch.compile traces
(eager calls go straight to msa._C); each op's body is the public function's eager body."""

from __future__ import annotations

import weakref
from typing import Any, Optional

import torch
from torch import Tensor

from . import _C
from ._arrays import stream_handle, torch_dtype
from ._kv import kv_heads_dim
from .attention import Visibility, attention_eager, pipeline_eager
from .csr import build_k2q_csr_eager
from .indexer import block_scores_eager, block_topk_eager, select_topk_eager
from .logits import (mqa_logits_eager, mqa_logits_topk_eager, paged_mqa_logits_eager,
                     paged_mqa_logits_topk_eager, token_topk_eager)
from .quant import (SCALE_DTYPES, SCALE_SHAPES, VALUE_DTYPES, dequantize_eager, quantize_eager,
                    reorder_eager)
from .sdsa import (indexer_scores_eager, thresholds_from_sample_eager,
                   top_k_from_candidates_eager)
from .token_sparse import _group_union_cuda, _kv_indices_cuda, union_groups

#: Live decode plans by id: a custom op cannot take a C++ object, so run() passes the plan's id.
DECODE_PLANS: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()


def _sint(stream: Any) -> Optional[int]:
    """A stream argument as the int a custom op takes (None: the current stream)."""
    return None if stream is None else stream_handle(None, stream)


def _none_f32(like: Tensor) -> Tensor:
    return like.new_empty((0,), dtype=torch.float32)


@torch.library.custom_op("msa::block_scores", mutates_args=())
def _block_scores(q: Tensor, q_scale: Optional[Tensor], k: Tensor, k_scale: Optional[Tensor],
                  cu_seqlens_q: Tensor, cu_seqlens_k: Optional[Tensor],
                  page_table: Optional[Tensor], seqused_k: Optional[Tensor], kv_layout: str,
                  q_global_scale: float, k_global_scale: float, causal: bool, kv_block_size: int,
                  nblk_max: int, check: Optional[bool], stream: Optional[int]) -> Tensor:
    return block_scores_eager(q, q_scale, q_global_scale, k, k_scale, k_global_scale,
                              cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, kv_layout,
                              causal, kv_block_size, nblk_max, None, stream, check)


@_block_scores.register_fake
def _(q, q_scale, k, k_scale, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, kv_layout,
      q_global_scale, k_global_scale, causal, kv_block_size, nblk_max, check, stream):
    return q.new_empty((q.shape[1], nblk_max, q.shape[0]), dtype=torch.float32)


def block_scores(*args: Any) -> Tensor:
    return _block_scores(*args[:-1], _sint(args[-1]))


@torch.library.custom_op("msa::block_topk", mutates_args=())
def _block_topk(q: Tensor, q_scale: Optional[Tensor], k: Tensor, k_scale: Optional[Tensor],
                cu_seqlens_q: Tensor, cu_seqlens_k: Optional[Tensor],
                page_table: Optional[Tensor], seqused_k: Optional[Tensor], kv_layout: str,
                q_global_scale: float, k_global_scale: float, topk: int, sink_blocks: int,
                local_blocks: int, causal: bool, kv_block_size: int, num_kv_heads: int,
                check: Optional[bool], stream: Optional[int]) -> Tensor:
    return block_topk_eager(q, q_scale, q_global_scale, k, k_scale, k_global_scale,
                            cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, kv_layout, topk,
                            sink_blocks, local_blocks, causal, kv_block_size, None, stream, check,
                            num_kv_heads)


@_block_topk.register_fake
def _(q, q_scale, k, k_scale, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, kv_layout,
      q_global_scale, k_global_scale, topk, sink_blocks, local_blocks, causal, kv_block_size,
      num_kv_heads, check, stream):
    rows = num_kv_heads or k.shape[kv_heads_dim(kv_layout)]
    return q.new_empty((rows, q.shape[0], topk), dtype=torch.int32)


def block_topk(*args: Any) -> Tensor:
    return _block_topk(*args[:-1], _sint(args[-1]))


@torch.library.custom_op("msa::select_topk", mutates_args=())
def _select_topk(scores: Tensor, cu_seqlens_q: Tensor, k: Optional[Tensor],
                 cu_seqlens_k: Optional[Tensor], page_table: Optional[Tensor],
                 seqused_k: Optional[Tensor], kv_layout: str, num_kv_heads: int, topk: int,
                 sink_blocks: int, local_blocks: int, causal: bool, kv_block_size: int,
                 check: Optional[bool], stream: Optional[int]) -> Tensor:
    return select_topk_eager(scores, cu_seqlens_q, k, cu_seqlens_k, page_table, seqused_k,
                             kv_layout, num_kv_heads, topk, sink_blocks, local_blocks, causal,
                             kv_block_size, None, stream, check)


@_select_topk.register_fake
def _(scores, cu_seqlens_q, k, cu_seqlens_k, page_table, seqused_k, kv_layout, num_kv_heads,
      topk, sink_blocks, local_blocks, causal, kv_block_size, check, stream):
    return scores.new_empty((num_kv_heads, scores.shape[2], topk), dtype=torch.int32)


def select_topk(*args: Any) -> Tensor:
    return _select_topk(*args[:-1], _sint(args[-1]))


@torch.library.custom_op("msa::build_k2q_csr", mutates_args=())
def _build_k2q_csr(q2k: Tensor, cu_seqlens_q: Tensor, k: Optional[Tensor],
                   cu_seqlens_k: Optional[Tensor], page_table: Optional[Tensor],
                   seqused_k: Optional[Tensor], kv_layout: str, kv_block_size: int,
                   total_rows: int, return_schedule: bool, check: Optional[bool],
                   stream: Optional[int]) -> tuple[Tensor, Tensor, Tensor]:
    row_ptr, q_idx, schedule = build_k2q_csr_eager(
        q2k, cu_seqlens_q, k, cu_seqlens_k, page_table, seqused_k, kv_layout, kv_block_size,
        total_rows, return_schedule, None, stream, check)
    return row_ptr, q_idx, schedule if schedule is not None else q2k.new_empty((0,))


@_build_k2q_csr.register_fake
def _(q2k, cu_seqlens_q, k, cu_seqlens_k, page_table, seqused_k, kv_layout, kv_block_size,
      total_rows, return_schedule, check, stream):
    hkv, total_q, topk = q2k.shape
    n = _C.k2q_schedule_size(int(hkv), int(total_rows), int(total_q), int(topk)) \
        if return_schedule else 0
    return (q2k.new_empty((hkv, total_rows + 1)), q2k.new_empty((hkv, total_q * topk)),
            q2k.new_empty((n,)))


def build_k2q_csr(*args: Any) -> tuple:
    return _build_k2q_csr(*args[:-1], _sint(args[-1]))


@torch.library.custom_op("msa::mqa_logits", mutates_args=())
def _mqa_logits(q: Tensor, k: Tensor, k_scale: Optional[Tensor], weights: Tensor, ks: Tensor,
                ke: Tensor, clean_logits: bool, check: Optional[bool],
                stream: Optional[int]) -> Tensor:
    return mqa_logits_eager(q, k, k_scale, weights, ks, ke, clean_logits, None, stream, check)


@_mqa_logits.register_fake
def _(q, k, k_scale, weights, ks, ke, clean_logits, check, stream):
    return weights.new_empty((q.shape[0], k.shape[0]), dtype=torch.float32)


def mqa_logits(*args: Any) -> Tensor:
    return _mqa_logits(*args[:-1], _sint(args[-1]))


@torch.library.custom_op("msa::paged_mqa_logits", mutates_args=())
def _paged_mqa_logits(q: Tensor, q_sf: Optional[Tensor], kv_fused: Tensor, weights: Tensor,
                      block_tables: Tensor, seq_lens: Tensor, max_seq_len: int,
                      clean_logits: bool, check: Optional[bool],
                      stream: Optional[int]) -> Tensor:
    return paged_mqa_logits_eager(q, q_sf, kv_fused, weights, block_tables, seq_lens,
                                  max_seq_len, clean_logits, None, stream, check)


@_paged_mqa_logits.register_fake
def _(q, q_sf, kv_fused, weights, block_tables, seq_lens, max_seq_len, clean_logits, check,
      stream):
    return weights.new_empty((q.shape[0] * q.shape[1], max_seq_len), dtype=torch.float32)


def paged_mqa_logits(*args: Any) -> Tensor:
    return _paged_mqa_logits(*args[:-1], _sint(args[-1]))


@torch.library.custom_op("msa::token_topk", mutates_args=())
def _token_topk(logits: Tensor, ks: Optional[Tensor], ke: Optional[Tensor], topk: int,
                check: Optional[bool], stream: Optional[int]) -> Tensor:
    return token_topk_eager(logits, ks, ke, topk, None, stream, check)


@_token_topk.register_fake
def _(logits, ks, ke, topk, check, stream):
    return logits.new_empty((logits.shape[0], topk), dtype=torch.int32)


def token_topk(*args: Any) -> Tensor:
    return _token_topk(*args[:-1], _sint(args[-1]))


@torch.library.custom_op("msa::mqa_logits_topk", mutates_args=())
def _mqa_logits_topk(q: Tensor, k: Tensor, k_scale: Optional[Tensor], weights: Tensor,
                     ks: Tensor, ke: Tensor, topk: int, check: Optional[bool],
                     stream: Optional[int]) -> Tensor:
    return mqa_logits_topk_eager(q, k, k_scale, weights, ks, ke, topk, None, None, stream, check)


@_mqa_logits_topk.register_fake
def _(q, k, k_scale, weights, ks, ke, topk, check, stream):
    return weights.new_empty((q.shape[0], topk), dtype=torch.int32)


def mqa_logits_topk(*args: Any) -> Tensor:
    return _mqa_logits_topk(*args[:-1], _sint(args[-1]))


@torch.library.custom_op("msa::paged_mqa_logits_topk", mutates_args=())
def _paged_mqa_logits_topk(q: Tensor, q_sf: Optional[Tensor], kv_fused: Tensor, weights: Tensor,
                           block_tables: Tensor, seq_lens: Tensor, max_seq_len: int, topk: int,
                           check: Optional[bool], stream: Optional[int]) -> Tensor:
    return paged_mqa_logits_topk_eager(q, q_sf, kv_fused, weights, block_tables, seq_lens,
                                       max_seq_len, topk, None, None, stream, check)


@_paged_mqa_logits_topk.register_fake
def _(q, q_sf, kv_fused, weights, block_tables, seq_lens, max_seq_len, topk, check, stream):
    return weights.new_empty((q.shape[0] * q.shape[1], topk), dtype=torch.int32)


def paged_mqa_logits_topk(*args: Any) -> Tensor:
    return _paged_mqa_logits_topk(*args[:-1], _sint(args[-1]))


@torch.library.custom_op("msa::indexer_scores", mutates_args=())
def _indexer_scores(query: Tensor, query_scale: Optional[Tensor], key_cache: Tensor,
                    key_scale: Optional[Tensor], block_table: Tensor, seq_lens: Tensor,
                    row_requests: Tensor, row_lens: Optional[Tensor], query_global_scale: float,
                    key_global_scale: float, max_len: int, check: Optional[bool],
                    stream: Optional[int]) -> Tensor:
    return indexer_scores_eager(query, query_scale, key_cache, key_scale, block_table, seq_lens,
                                row_requests, row_lens, query_global_scale, key_global_scale,
                                max_len, None, stream, check)


@_indexer_scores.register_fake
def _(query, query_scale, key_cache, key_scale, block_table, seq_lens, row_requests, row_lens,
      query_global_scale, key_global_scale, max_len, check, stream):
    return row_requests.new_empty((row_requests.shape[0], max_len), dtype=torch.float32)


def indexer_scores(*args: Any) -> Tensor:
    return _indexer_scores(*args[:-1], _sint(args[-1]))


@torch.library.custom_op("msa::top_k_from_candidates", mutates_args=())
def _top_k_from_candidates(candidates: Tensor, ties: Tensor, counts: Tensor, topk: int,
                           stream: Optional[int]) -> tuple[Tensor, Tensor]:
    return top_k_from_candidates_eager(candidates, ties, counts, topk, None, None, stream)


@_top_k_from_candidates.register_fake
def _(candidates, ties, counts, topk, stream):
    rows = candidates.shape[0]
    return (candidates.new_empty((rows, topk), dtype=torch.int32),
            candidates.new_empty((rows,), dtype=torch.int32))


def top_k_from_candidates(*args: Any) -> tuple:
    return _top_k_from_candidates(*args[:-1], _sint(args[-1]))


@torch.library.custom_op("msa::thresholds_from_sample", mutates_args=())
def _thresholds_from_sample(sample_scores: Tensor, topk: int, sample_stride: int,
                            oversample: float, stream: Optional[int]) -> tuple[Tensor, Tensor]:
    return thresholds_from_sample_eager(sample_scores, topk, sample_stride, oversample, None, None,
                                        stream)


@_thresholds_from_sample.register_fake
def _(sample_scores, topk, sample_stride, oversample, stream):
    rows = sample_scores.shape[0]
    return (sample_scores.new_empty((rows,), dtype=torch.float32),
            sample_scores.new_empty((rows, 3), dtype=torch.int32))


def thresholds_from_sample(*args: Any) -> tuple:
    return _thresholds_from_sample(*args[:-1], _sint(args[-1]))


def _fake_attention(q: Tensor, temperature: float) -> tuple:
    """out (q's dtype; bf16 for fp8_e4m3 q), lse and tlse (empty without a temperature)."""
    total_q, hq = q.shape[0], q.shape[1]
    lse = q.new_empty((hq, total_q), dtype=torch.float32)
    tlse = q.new_empty((hq, total_q), dtype=torch.float32) if temperature > 0 else _none_f32(q)
    out_dtype = torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype
    return q.new_empty(q.shape, dtype=out_dtype), lse, tlse


@torch.library.custom_op("msa::attention_forward", mutates_args=())
def _attention_forward(q: Tensor, q_scale: Optional[Tensor], k: Tensor, v: Tensor,
                       cu_seqlens_q: Tensor, cu_seqlens_k: Optional[Tensor],
                       page_table: Optional[Tensor], seqused_k: Optional[Tensor],
                       k_scale: Optional[Tensor], v_scale: Optional[Tensor],
                       q2k: Optional[Tensor], k2q_row_ptr: Optional[Tensor],
                       k2q_q_idx: Optional[Tensor], k2q_schedule: Optional[Tensor],
                       kv_layout: str, softmax_scale: float, causal: bool, kv_block_size: int,
                       temperature: float, partial_dtype: str, check: Optional[bool],
                       causal_offset: Optional[Tensor], key_mask: Optional[Tensor],
                       key_mask_rows: str, soft_cap: float,
                       stream: Optional[int]) -> tuple[Tensor, Tensor, Tensor]:
    k2q = None if k2q_row_ptr is None else (k2q_row_ptr, k2q_q_idx, k2q_schedule)
    out, lse, tlse = attention_eager(
        q, k, v, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, kv_layout, q2k, k2q,
        softmax_scale or None, causal, kv_block_size, temperature or None, partial_dtype,
        k_scale, v_scale, None, None, None, True, None, stream, check, q_scale=q_scale,
        vis=Visibility(causal_offset, key_mask, key_mask_rows or None, soft_cap))
    return out, lse, tlse if tlse is not None else _none_f32(q)


@_attention_forward.register_fake
def _(q, q_scale, k, v, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, k_scale, v_scale,
      q2k, k2q_row_ptr, k2q_q_idx, k2q_schedule, kv_layout, softmax_scale, causal,
      kv_block_size, temperature, partial_dtype, check, causal_offset, key_mask, key_mask_rows,
      soft_cap, stream):
    return _fake_attention(q, temperature)


def attention_forward(*args: Any) -> tuple:
    return _attention_forward(*args[:-1], _sint(args[-1]))


@torch.library.custom_op("msa::sparse_attention", mutates_args=())
def _sparse_attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                      cu_seqlens_k: Optional[Tensor], page_table: Optional[Tensor],
                      seqused_k: Optional[Tensor], k_scale: Optional[Tensor],
                      v_scale: Optional[Tensor], kv_layout: str, topk: int, sink_blocks: int,
                      local_blocks: int, causal: bool, kv_block_size: int,
                      index_q: Optional[Tensor], index_k: Optional[Tensor],
                      softmax_scale: float, temperature: float, partial_dtype: str,
                      check: Optional[bool],
                      stream: Optional[int]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    out, lse, tlse, q2k = pipeline_eager(
        q, k, v, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, kv_layout, topk, sink_blocks,
        local_blocks, causal, kv_block_size, index_q, index_k, softmax_scale or None,
        temperature or None, partial_dtype, k_scale, v_scale, None, None, True, None, stream,
        check)
    # q2k is a view of the call's workspace; a custom op returns storage of its own.
    return out, lse, tlse if tlse is not None else _none_f32(q), q2k.clone()


@_sparse_attention.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, k_scale, v_scale, kv_layout,
      topk, sink_blocks, local_blocks, causal, kv_block_size, index_q, index_k, softmax_scale,
      temperature, partial_dtype, check, stream):
    out, lse, tlse = _fake_attention(q, temperature)
    q2k = q.new_empty((k.shape[kv_heads_dim(kv_layout)], q.shape[0], topk), dtype=torch.int32)
    return out, lse, tlse, q2k


def sparse_attention(*args: Any) -> tuple:
    return _sparse_attention(*args[:-1], _sint(args[-1]))


@torch.library.custom_op("msa::decode_run", mutates_args=())
def _decode_run(plan_id: int, q: Tensor, q_scale: Optional[Tensor], k: Tensor, v: Tensor,
                page_table: Tensor, cu_seqlens_q: Tensor, seqused_k: Optional[Tensor],
                k_scale: Optional[Tensor], v_scale: Optional[Tensor], q2k: Optional[Tensor],
                softmax_scale: float, causal: bool, temperature: float, check: Optional[bool],
                causal_offset: Optional[Tensor], key_mask: Optional[Tensor], key_mask_rows: str,
                soft_cap: float, stream: Optional[int]) -> tuple[Tensor, Tensor, Tensor]:
    plan = DECODE_PLANS[plan_id]
    out, lse, tlse = plan.run_eager(q, k, v, page_table, cu_seqlens_q, seqused_k, k_scale,
                                    v_scale, q2k, softmax_scale or None, causal,
                                    temperature or None, None, None, None, True, stream, check,
                                    q_scale, Visibility(causal_offset, key_mask,
                                                        key_mask_rows or None, soft_cap))
    return out, lse, tlse if tlse is not None else _none_f32(q)


@_decode_run.register_fake
def _(plan_id, q, q_scale, k, v, page_table, cu_seqlens_q, seqused_k, k_scale, v_scale, q2k,
      softmax_scale, causal, temperature, check, causal_offset, key_mask, key_mask_rows,
      soft_cap, stream):
    return _fake_attention(q, temperature)


def decode_run(*args: Any) -> tuple:
    return _decode_run(*args[:-1], _sint(args[-1]))


@torch.library.custom_op("msa::quantize", mutates_args=())
def _quantize(x: Tensor, format: str, global_scale: float,
              stream: Optional[int]) -> tuple[Tensor, Tensor]:
    return quantize_eager(x, format, global_scale, None, stream)


@_quantize.register_fake
def _(x, format, global_scale, stream):
    t, h, d = x.shape
    fp8 = format.startswith("fp8")
    values = x.new_empty((t, h, d) if fp8 else (t, h, d // 2),
                         dtype=torch_dtype(VALUE_DTYPES[format]))
    scale = x.new_empty(SCALE_SHAPES[format](t, h, d), dtype=torch_dtype(SCALE_DTYPES[format]))
    return values, scale


def quantize(*args: Any) -> tuple:
    return _quantize(*args[:-1], _sint(args[-1]))


@torch.library.custom_op("msa::dequantize", mutates_args=())
def _dequantize(values: Tensor, scale: Optional[Tensor], format: Optional[str],
                global_scale: float, dtype: str, stream: Optional[int]) -> Tensor:
    return dequantize_eager(values, scale, format, global_scale, dtype, None, stream)


@_dequantize.register_fake
def _(values, scale, format, global_scale, dtype, stream):
    from ._arrays import dtype_of
    shape = list(values.shape)
    packed = (format is not None and VALUE_DTYPES[format] == "fp4x2") or \
        dtype_of(values) == "fp4x2"
    if packed:
        shape[-1] *= 2
    return values.new_empty(shape, dtype=torch_dtype(dtype))


def dequantize(*args: Any) -> Tensor:
    return _dequantize(*args[:-1], _sint(args[-1]))


@torch.library.custom_op("msa::reorder_fp4_scales", mutates_args=())
def _reorder_fp4_scales(scale: Tensor, dtype: str, layout: str, shape: list[int],
                        to_public: bool, stream: Optional[int]) -> Tensor:
    return reorder_eager(scale, dtype, layout, shape, to_public, None, stream)


@_reorder_fp4_scales.register_fake
def _(scale, dtype, layout, shape, to_public, stream):
    return scale.new_empty(shape, dtype=torch_dtype(dtype))


def reorder_fp4_scales(*args: Any) -> Tensor:
    return _reorder_fp4_scales(*args[:-1], _sint(args[-1]))


@torch.library.custom_op("msa::token_sparse_kv_indices", mutates_args=())
def _token_sparse_kv_indices(positions: Tensor, requests: Tensor, block_table: Tensor,
                             page_size: int, seq_lens: Optional[Tensor], check: Optional[bool],
                             stream: Optional[int]) -> Tensor:
    return _kv_indices_cuda(positions, requests, block_table, page_size, seq_lens, stream, check)


@_token_sparse_kv_indices.register_fake
def _(positions, requests, block_table, page_size, seq_lens, check, stream):
    return positions.new_empty(positions.shape, dtype=torch.int32)


def token_sparse_kv_indices(*args: Any) -> Tensor:
    return _token_sparse_kv_indices(*args[:-1], _sint(args[-1]))


@torch.library.custom_op("msa::group_union_masks", mutates_args=())
def _group_union_masks(positions: Tensor, cu_seqlens_q: Tensor, group_size: int,
                       max_union: Optional[int], packed: bool, check: Optional[bool],
                       stream: Optional[int]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return tuple(_group_union_cuda(positions, cu_seqlens_q, group_size, max_union, packed, stream,
                                   check))


@_group_union_masks.register_fake
def _(positions, cu_seqlens_q, group_size, max_union, packed, check, stream):
    lead, rows = tuple(positions.shape[:-2]), positions.shape[-2]
    cap = 0 if max_union is None else max_union
    groups = union_groups(rows, cu_seqlens_q.shape[0] - 1, group_size)
    new = positions.new_empty
    return (new(lead + (groups, cap), dtype=torch.int32), new(lead + (groups,), dtype=torch.int32),
            new((groups + 1,), dtype=torch.int32),
            new(lead + (rows, (cap + 7) // 8 if packed else cap),
                dtype=torch.uint8 if packed else torch.bool))


def group_union_masks(*args: Any) -> tuple:
    return _group_union_masks(*args[:-1], _sint(args[-1]))
