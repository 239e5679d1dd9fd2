"""The whole sparse-attention path in one call, as a serving engine runs it for prefill:
block_topk (the indexer fused with top-K) -> build_k2q_csr -> attention_forward (DESIGN.md
sections 2-5)."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from . import _impl
from ._arrays import shape_of
from .ops import (K2QIndex, QTensor, attention_forward, block_scores, block_topk, build_k2q_csr,
                  select_topk)


class Selection(NamedTuple):
    """The blocks the pipeline attended: q2k ``[Hkv, total_q, topk]`` and its k2q index."""

    q2k: Any
    k2q: K2QIndex


def _kv_heads(k: Any, layout: str) -> int:
    values = k.values if isinstance(k, QTensor) else k
    return shape_of(values)[_impl.kv_heads_dim(layout)]


def sparse_attention(q: Any, k: Any, v: Any, cu_seqlens_q: Any, *, cu_seqlens_k: Any = None,
                     page_table: Any = None, seqused_k: Any = None,
                     kv_layout: Optional[str] = None, topk: int = 16, sink_blocks: int = 1,
                     local_blocks: int = 1, causal: bool = True, kv_block_size: int = 128,
                     index_q: Any = None, index_k: Any = None,
                     softmax_scale: Optional[float] = None, temperature: Optional[float] = None,
                     k_scale: Any = None, v_scale: Any = None,
                     max_seqlen_k: Optional[int] = None, total_rows: Optional[int] = None,
                     return_selection: bool = False, stream: Any = None,
                     check: bool = True) -> tuple:
    """Block-sparse attention with the block selection computed on the fly.

    Scores kv blocks with the indexer inputs (``index_q``/``index_k``: e.g. a low-precision
    `QTensor` copy of q and k; default q and k themselves) and keeps ``topk`` blocks per (kv
    head, query) with ``sink_blocks``/``local_blocks`` forced, builds the k2q index and runs
    `attention_forward`. Returns what attention_forward returns, plus a `Selection` when
    ``return_selection``. Pass ``total_rows`` to avoid a host read of the lengths (needed for
    CUDA-graph capture and torch.compile without graph breaks).

    The selection is one fused `block_topk` call, so the ``[Hq, nblk, total_q]`` scores are
    never allocated. Only an ``index_k`` with another kv-head count than ``k`` (its query heads
    then grouped by k's kv heads) takes `block_scores` + `select_topk`, which reads
    ``max_seqlen_k`` (pass it to avoid a host read there; the fused path ignores it).
    """
    kv_args = dict(cu_seqlens_k=cu_seqlens_k, page_table=page_table, seqused_k=seqused_k,
                   kv_layout=kv_layout)
    layout = _impl.layout_name(kv_layout, page_table)
    k_values = k.values if isinstance(k, QTensor) else k
    index_q = q if index_q is None else index_q
    index_k = k if index_k is None else index_k
    num_kv_heads = _kv_heads(k, layout)
    rule = dict(topk=topk, sink_blocks=sink_blocks, local_blocks=local_blocks, causal=causal,
                kv_block_size=kv_block_size, stream=stream, check=check)
    if _kv_heads(index_k, layout) == num_kv_heads:
        q2k = block_topk(index_q, index_k, cu_seqlens_q, **rule, **kv_args)
    else:
        scores = block_scores(index_q, index_k, cu_seqlens_q, causal=causal,
                              kv_block_size=kv_block_size, max_seqlen_k=max_seqlen_k,
                              stream=stream, check=check, **kv_args)
        q2k = select_topk(scores, cu_seqlens_q, num_kv_heads=num_kv_heads, k=k_values, **rule,
                          **kv_args)
    k2q = build_k2q_csr(q2k, cu_seqlens_q, k=k_values, kv_block_size=kv_block_size,
                        total_rows=total_rows, stream=stream, check=check, **kv_args)
    result = attention_forward(q, k, v, cu_seqlens_q, q2k=q2k, k2q=k2q,
                               softmax_scale=softmax_scale, causal=causal,
                               kv_block_size=kv_block_size, temperature=temperature,
                               k_scale=k_scale, v_scale=v_scale, stream=stream, check=check,
                               **kv_args)
    return result + (Selection(q2k, k2q),) if return_selection else result


__all__ = ["Selection", "sparse_attention"]
