"""The indexer and the block selection (docs/semantics.md, Block scores and Top-K selection):
`block_scores`, `select_topk`, and `block_topk` (the two fused, without materializing scores).
Each takes any DLPack array (torch, numpy, cupy) and allocates its outputs with the caller's
framework; GPU calls run on the caller's stream without waiting for it."""

from __future__ import annotations

from typing import Any, Optional

from . import _C
from ._kv import kv_args, kv_heads_of, key_lengths, layout_name, page_size_of, page_table_shape
from ._runtime import (arg, check_arrays, check_pending, compiling, count, dims, finish,
                       new_output, status_for, stream_of)
from .quant import unpack


def _check_inputs(q: Any, k: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, page_table: Any,
                  seqused_k: Any, q_scale: Any, k_scale: Any, out: Any) -> None:
    """The array arguments of block_scores and block_topk, and q's dims."""
    check_arrays(q=q, k=k, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                 page_table=page_table, seqused_k=seqused_k, q_scale=q_scale, k_scale=k_scale,
                 out=out)
    dims(unpack(q)[0], "q", 3, "[total_q, Hq, D]")


def _max_blocks(layout: str, k: Any, cu_seqlens_k: Any, page_table: Any, seqused_k: Any,
                kv_block_size: int, max_seqlen_k: Optional[int]) -> tuple:
    """(nblk_max, waited): nblk_max from max_seqlen_k when given, else the page table's capacity
    (paged) or the longest batch (flat: a host read of cu_seqlens_k, which waits)."""
    waited = False
    if max_seqlen_k is None:
        if layout == "flat":
            max_seqlen_k = max(key_lengths(layout, k, cu_seqlens_k, page_table, seqused_k),
                               default=0)
            waited = True
        else:
            max_seqlen_k = page_table_shape(page_table)[1] * page_size_of(k, layout)
    else:
        max_seqlen_k = count(max_seqlen_k, "max_seqlen_k")
    return (max_seqlen_k + kv_block_size - 1) // kv_block_size, waited


def block_scores(q: Any, k: Any, cu_seqlens_q: Any, *, cu_seqlens_k: Any = None,
                 page_table: Any = None, seqused_k: Any = None,
                 kv_layout: Optional[str] = None, causal: bool = True,
                 kv_block_size: int = 128, q_scale: Any = None, q_global_scale: float = 1.0,
                 k_scale: Any = None, k_global_scale: float = 1.0,
                 max_seqlen_k: Optional[int] = None, out: Any = None, stream: Any = None,
                 check: Optional[bool] = None) -> Any:
    """Indexer block scores: f32 ``[Hq, nblk_max, total_q]``.

    ``scores[hq, kb, t] = max over the keys j of block kb visible to query t of
    dot(q[t, hq], k[j, hq // G])`` (dequantized inputs, no softmax scale), ``-inf`` where the
    block has no visible key.

    q: ``[total_q, Hq, D]`` bf16/f16/fp8_e4m3 (fp4x2 ``[total_q, Hq, D/2]``) or a `QTensor`;
    k: flat ``[total_k, Hkv, D]`` with ``cu_seqlens_k``, or a page pool (``page_table``,
    optional ``seqused_k``, ``kv_layout`` "paged_nhd"/"paged_hnd"); same value dtype as q.
    q_scale/k_scale: FP8 per-token (or per-tensor) f32 scales, NVFP4/MXFP4 block scales; a page
    pool's per-token scales are per slot, ``[num_pages * page_size]`` (slot s of page P at
    P * page_size + s), or ``[num_pages * page_size, Hkv]``; an FP4 pool's scales are a pool of
    its values' layout. FP4 scales may also come preordered (6-D, `msa.reorder_fp4_scales`; a
    pool's with page size 128), which gives the same scores.
    nblk_max is ``ceil(max_seqlen_k / kv_block_size)``; without max_seqlen_k it is the page
    table's capacity for a paged cache, or the longest batch of a flat one (read from
    cu_seqlens_k: for GPU arrays that waits for the stream; pass max_seqlen_k to avoid it).
    ``check``: wait for the stream and raise for invalid indices the device found (default:
    the MSA_CHECK_SYNC environment switch; see `msa.check_status`).
    """
    layout = layout_name(kv_layout, page_table)
    _check_inputs(q, k, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, q_scale, k_scale, out)
    kv_block_size = count(kv_block_size, "kv_block_size", lo=1)
    nblk, waited = _max_blocks(layout, k, cu_seqlens_k, page_table, seqused_k, kv_block_size,
                               max_seqlen_k)
    if out is None and compiling():
        from . import _torch_ops
        qv, qs, qg = unpack(q, q_scale, q_global_scale)
        kv_, ks, kg = unpack(k, k_scale, k_global_scale)
        return _torch_ops.block_scores(qv, qs, kv_, ks, cu_seqlens_q, cu_seqlens_k, page_table,
                                       seqused_k, layout, float(qg), float(kg), causal,
                                       kv_block_size, nblk, check, stream)
    return block_scores_eager(q, q_scale, q_global_scale, k, k_scale, k_global_scale,
                              cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, layout, causal,
                              kv_block_size, nblk, out, stream, check, waited)


def block_scores_eager(q, q_scale, q_global_scale, k, k_scale, k_global_scale, cu_seqlens_q,
                       cu_seqlens_k, page_table, seqused_k, layout, causal, kv_block_size,
                       nblk_max, out, stream, check, waited=False) -> Any:
    q, q_scale, q_global_scale = unpack(q, q_scale, q_global_scale)
    total_q, hq = dims(q, "q", 3, "[total_q, Hq, D]")[:2]
    if out is None:
        out = new_output(q, (hq, nblk_max, total_q), "f32", "scores",
                         f"nblk_max = {nblk_max} (from max_seqlen_k and kv_block_size)")
    st = stream_of(q, stream)
    if waited:
        check_pending(q, st)
    status = status_for(q)
    _C.block_scores(q=arg(q), q_scale=arg(q_scale), q_global_scale=float(q_global_scale),
                    **kv_args(k, layout=layout, cu_seqlens_k=cu_seqlens_k, page_table=page_table,
                              seqused_k=seqused_k, k_scale=k_scale,
                              k_global_scale=k_global_scale),
                    cu_seqlens_q=arg(cu_seqlens_q), scores=arg(out), causal=causal,
                    kv_block_size=kv_block_size, status=status, stream=st)
    finish(status, st, check)
    return out


def block_topk(q: Any, k: Any, cu_seqlens_q: Any, *, cu_seqlens_k: Any = None,
               page_table: Any = None, seqused_k: Any = None, kv_layout: Optional[str] = None,
               topk: int = 16, sink_blocks: int = 1, local_blocks: int = 1, causal: bool = True,
               kv_block_size: int = 128, q_scale: Any = None, q_global_scale: float = 1.0,
               k_scale: Any = None, k_global_scale: float = 1.0,
               num_kv_heads: Optional[int] = None, out: Any = None,
               stream: Any = None, check: Optional[bool] = None) -> Any:
    """The indexer fused with top-K selection: ``q2k [Hkv, total_q, topk]`` int32.

    Equals ``select_topk(block_scores(q, k, ...), ...)`` with the same options, without
    materializing the ``[Hq, nblk, total_q]`` f32 scores (2.1 GB at 32K tokens and 64 heads).
    Inputs as in `block_scores` (q/k values, a `QTensor`, scales, flat or paged keys); selection
    as in `select_topk` (sink and local blocks forced, then the highest group scores, ties
    toward the lower id; rows ascending, -1 padded). Nothing is read on the host. CUDA:
    bf16/f16/fp8_e4m3/fp4x2 at D = 128, bf16/f16 at D = 64, fp8_e4m3 at D = 256,
    ``kv_block_size`` 64 or 128, ``topk <= 64``; other
    inputs raise `MsaError` naming the feature. ``out``: a preallocated q2k.
    ``num_kv_heads``: the selection heads (q2k's first dim), default k's heads; a count
    dividing Hq (groups of 1-16) selects by groups of Hq / num_kv_heads consecutive query heads (e.g. 4
    index heads on 1 key head with ``num_kv_heads=4``: each head its own selection), the ids of
    `select_topk` with that ``num_kv_heads`` on `block_scores`' output. CUDA fuses it when
    ``num_kv_heads`` is a multiple of k's heads and ``topk - sink_blocks - local_blocks`` fits a
    list (16 for one list per head at G >= 4; `msa/indexer.h` has the rule); else `MsaError`.
    """
    layout = layout_name(kv_layout, page_table)
    _check_inputs(q, k, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, q_scale, k_scale, out)
    topk = count(topk, "topk", lo=1)
    num_kv_heads = 0 if num_kv_heads is None else count(num_kv_heads, "num_kv_heads", lo=1)
    if out is None and compiling():
        from . import _torch_ops
        qv, qs, qg = unpack(q, q_scale, q_global_scale)
        kv_, ks, kg = unpack(k, k_scale, k_global_scale)
        return _torch_ops.block_topk(qv, qs, kv_, ks, cu_seqlens_q, cu_seqlens_k, page_table,
                                     seqused_k, layout, float(qg), float(kg), topk, sink_blocks,
                                     local_blocks, causal, kv_block_size, num_kv_heads, check,
                                     stream)
    return block_topk_eager(q, q_scale, q_global_scale, k, k_scale, k_global_scale, cu_seqlens_q,
                            cu_seqlens_k, page_table, seqused_k, layout, topk, sink_blocks,
                            local_blocks, causal, kv_block_size, out, stream, check,
                            num_kv_heads)


def block_topk_eager(q, q_scale, q_global_scale, k, k_scale, k_global_scale, cu_seqlens_q,
                     cu_seqlens_k, page_table, seqused_k, layout, topk, sink_blocks,
                     local_blocks, causal, kv_block_size, out, stream, check,
                     num_kv_heads=0) -> Any:
    q, q_scale, q_global_scale = unpack(q, q_scale, q_global_scale)
    total_q = dims(q, "q", 3, "[total_q, Hq, D]")[0]
    if out is None:
        rows = num_kv_heads or kv_heads_of(k, layout)
        out = new_output(q, (rows, total_q, topk), "i32", "q2k", f"topk = {topk}")
    st = stream_of(q, stream)
    status = status_for(q)
    _C.block_topk(q=arg(q), q_scale=arg(q_scale), q_global_scale=float(q_global_scale),
                  **kv_args(k, layout=layout, cu_seqlens_k=cu_seqlens_k, page_table=page_table,
                            seqused_k=seqused_k, k_scale=k_scale, k_global_scale=k_global_scale),
                  cu_seqlens_q=arg(cu_seqlens_q), causal=causal, kv_block_size=kv_block_size,
                  topk=topk, sink_blocks=sink_blocks, local_blocks=local_blocks, q2k=arg(out),
                  status=status, stream=st)
    finish(status, st, check)
    return out


def select_topk(scores: Any, cu_seqlens_q: Any, *, num_kv_heads: int, topk: int = 16,
                sink_blocks: int = 1, local_blocks: int = 1, causal: bool = True,
                kv_block_size: int = 128, cu_seqlens_k: Any = None, page_table: Any = None,
                seqused_k: Any = None, k: Any = None, kv_layout: Optional[str] = None,
                out: Any = None, stream: Any = None, check: Optional[bool] = None) -> Any:
    """Top-K block selection: ``q2k [Hkv, total_q, topk]`` int32.

    Per (kv head, query): the first ``sink_blocks`` blocks and the ``local_blocks`` blocks
    ending at the query's last visible key (each if visible), then the visible blocks with the
    highest group score (max over the G query heads), ties toward the lower id; each row in
    ascending block id, padded with -1. The KV lengths come from ``cu_seqlens_k`` (flat) or
    ``page_table``/``seqused_k`` plus ``k`` (its shape gives the page size).
    """
    layout = layout_name(kv_layout, page_table)
    check_arrays(scores=scores, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                 page_table=page_table, seqused_k=seqused_k, k=k, out=out)
    dims(scores, "scores", 3, "[Hq, nblk_max, total_q]")
    num_kv_heads = count(num_kv_heads, "num_kv_heads", lo=1)
    topk = count(topk, "topk", lo=1)
    if out is None and compiling():
        from . import _torch_ops
        return _torch_ops.select_topk(scores, cu_seqlens_q, unpack(k)[0], cu_seqlens_k,
                                      page_table, seqused_k, layout, num_kv_heads, topk,
                                      sink_blocks, local_blocks, causal, kv_block_size, check,
                                      stream)
    return select_topk_eager(scores, cu_seqlens_q, k, cu_seqlens_k, page_table, seqused_k,
                             layout, num_kv_heads, topk, sink_blocks, local_blocks, causal,
                             kv_block_size, out, stream, check)


def select_topk_eager(scores, cu_seqlens_q, k, cu_seqlens_k, page_table, seqused_k, layout,
                      num_kv_heads, topk, sink_blocks, local_blocks, causal, kv_block_size, out,
                      stream, check) -> Any:
    if out is None:
        total_q = dims(scores, "scores", 3, "[Hq, nblk_max, total_q]")[2]
        out = new_output(scores, (num_kv_heads, total_q, topk), "i32", "q2k",
                         f"num_kv_heads = {num_kv_heads}, topk = {topk}")
    st = stream_of(scores, stream)
    status = status_for(scores)
    _C.select_topk(scores=arg(scores), cu_seqlens_q=arg(cu_seqlens_q),
                   **kv_args(k, layout=layout, cu_seqlens_k=cu_seqlens_k, page_table=page_table,
                             seqused_k=seqused_k),
                   num_kv_heads=num_kv_heads, topk=topk, sink_blocks=sink_blocks,
                   local_blocks=local_blocks, causal=causal, kv_block_size=kv_block_size,
                   q2k=arg(out), status=status, stream=st)
    finish(status, st, check)
    return out


__all__ = ["block_scores", "block_topk", "select_topk"]
