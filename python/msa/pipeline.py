"""The whole sparse-attention path in one call, as a serving engine runs it for prefill:
block_scores -> select_topk -> build_k2q_csr -> attention_forward (DESIGN.md sections 2-5)."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from . import _impl
from ._arrays import shape_of
from .ops import K2QIndex, QTensor, attention_forward, block_scores, build_k2q_csr, select_topk


class Selection(NamedTuple):
    """The blocks the pipeline attended: q2k ``[Hkv, total_q, topk]`` and its k2q index."""

    q2k: Any
    k2q: K2QIndex


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
    `QTensor` copy of q and k; default q and k themselves), keeps ``topk`` blocks per (kv head,
    query) with ``sink_blocks``/``local_blocks`` forced, builds the k2q index and runs
    `attention_forward`. Returns what attention_forward returns, plus a `Selection` when
    ``return_selection``. Pass ``max_seqlen_k`` and ``total_rows`` to avoid host reads of the
    lengths (needed for CUDA-graph capture and torch.compile without graph breaks).
    """
    kv_args = dict(cu_seqlens_k=cu_seqlens_k, page_table=page_table, seqused_k=seqused_k,
                   kv_layout=kv_layout)
    layout = _impl.layout_name(kv_layout, page_table)
    k_values = k.values if isinstance(k, QTensor) else k
    kshape = shape_of(k_values)
    num_kv_heads = kshape[2] if layout == "paged_nhd" else kshape[1]
    scores = block_scores(q if index_q is None else index_q, k if index_k is None else index_k,
                          cu_seqlens_q, causal=causal, kv_block_size=kv_block_size,
                          max_seqlen_k=max_seqlen_k, stream=stream, check=check, **kv_args)
    q2k = select_topk(scores, cu_seqlens_q, num_kv_heads=num_kv_heads, topk=topk,
                      sink_blocks=sink_blocks, local_blocks=local_blocks, causal=causal,
                      kv_block_size=kv_block_size, k=k_values, stream=stream, check=check,
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
