"""The SDSA indexer (docs/semantics.md, SDSA indexer): one query head, no head weights. Scores are
dot products of query rows with their request's paged index keys (bf16/f16, or NVFP4 written by
`quantize_write_index_qk_nvfp4`); a row's exact top-K comes from one threshold pass
(`indexer_threshold_select`) over its keys and `top_k_from_candidates`, the thresholds from the
scores of a strided key sample (`gather_key_sample`, `indexer_scores`, `thresholds_from_sample`).
CPU and CUDA give the same bits."""

from __future__ import annotations

from typing import Any, Optional

from . import _C
from ._arrays import empty
from ._runtime import (MsaError, arg, check_arrays, compiling, count, dims, finish, new_output,
                       status_for, stream_of)
from .quant import QTensor, tag, unpack


def _unpack(x: Any, scale: Any, global_scale: float, name: str) -> tuple:
    """(values, scale, global scale) of an index query or key argument: a plain bf16/f16 array,
    a `QTensor`, or NVFP4 values with `scale`."""
    check_arrays(**{name: x, name + "_scale": scale})
    values, scale, global_scale = unpack(x, scale, global_scale)
    return values, scale, float(global_scale)


def _typed(values: Any, scale: Any) -> tuple:
    """NVFP4 storage typed for msa._C: uint8 values as fp4x2, uint8 scales as e4m3."""
    if scale is None:
        return values, None
    return tag(values, "fp4x2"), tag(scale, "fp8_e4m3")


def _rows_cache(query, query_scale, key_cache, key_scale, block_table, seq_lens, row_requests,
                row_lens, query_global_scale, key_global_scale) -> dict:
    """The keywords of msa._C for query rows and the key cache."""
    q, qs = _typed(query, query_scale)
    k, ks = _typed(key_cache, key_scale)
    return dict(query=arg(q), query_scale=arg(qs), query_global_scale=query_global_scale,
                key_cache=arg(k), key_cache_scale=arg(ks),
                key_cache_global_scale=key_global_scale, block_table=arg(block_table),
                seq_lens=arg(seq_lens), row_requests=arg(row_requests), row_lens=arg(row_lens))


def _rows(row_requests: Any) -> int:
    return dims(row_requests, "row_requests", 1, "[T]")[0]


def indexer_scores(query: Any, key_cache: Any, block_table: Any, seq_lens: Any,
                   row_requests: Any, *, max_len: Optional[int] = None, row_lens: Any = None,
                   query_scale: Any = None, key_scale: Any = None,
                   query_global_scale: float = 1.0, key_global_scale: float = 1.0,
                   out: Any = None, stream: Any = None, check: Optional[bool] = None) -> Any:
    """``scores [T, max_len]`` f32: ``scores[t, j] = query[t] . key j`` of request
    ``row_requests[t]`` for ``j < L_t`` (``row_lens[t]``, else the request's ``seq_lens``),
    ``-inf`` beyond, from the decoded values and rounded once to f32 (an NVFP4 query over NVFP4
    keys: the exact sum of the codes times the scales, then times both global scales, rounded
    once to fp64 and once to f32; docs/semantics.md, SDSA indexer).

    ``query [T, D]`` bf16/f16 or NVFP4 (fp4x2 ``[T, D/2]`` with ``query_scale [T, D/16]`` e4m3,
    or a `QTensor`); ``key_cache [num_pages, page_size, D]`` likewise (``key_scale
    [num_pages, page_size, D/16]``); ``block_table [B, W]``, ``seq_lens [B]``, ``row_requests
    [T]`` and ``row_lens [T]`` int32. `max_len` sizes the output when `out` is not given."""
    q, qs, qg = _unpack(query, query_scale, query_global_scale, "query")
    k, ks, kg = _unpack(key_cache, key_scale, key_global_scale, "key_cache")
    check_arrays(block_table=block_table, seq_lens=seq_lens, row_requests=row_requests,
                 row_lens=row_lens, out=out)
    _rows(row_requests)
    if out is None:
        if max_len is None:
            raise MsaError("max_len: required without out= (the scores' width, at least every "
                           "row's length)")
        max_len = count(max_len, "max_len", bits=64)
        if compiling():
            from . import _torch_ops
            return _torch_ops.indexer_scores(q, qs, k, ks, block_table, seq_lens, row_requests,
                                             row_lens, qg, kg, max_len, check, stream)
    return indexer_scores_eager(q, qs, k, ks, block_table, seq_lens, row_requests, row_lens, qg,
                                kg, max_len, out, stream, check)


def indexer_scores_eager(q, qs, k, ks, block_table, seq_lens, row_requests, row_lens, qg, kg,
                         max_len, out, stream, check) -> Any:
    if out is None:
        out = new_output(row_requests, (_rows(row_requests), max_len), "f32", "scores",
                         f"max_len = {max_len}")
    st = stream_of(row_requests, stream)
    status = status_for(row_requests)
    _C.indexer_scores(**_rows_cache(q, qs, k, ks, block_table, seq_lens, row_requests, row_lens,
                                    qg, kg),
                      scores=arg(out), status=status, stream=st)
    finish(status, st, check)
    return out


def indexer_threshold_select(query: Any, key_cache: Any, block_table: Any, seq_lens: Any,
                             row_requests: Any, thresholds: Any, counts: Any, *,
                             capacity: Optional[int] = None, tie_capacity: Optional[int] = None,
                             candidates: Any = None, ties: Any = None, row_lens: Any = None,
                             query_scale: Any = None, key_scale: Any = None,
                             query_global_scale: float = 1.0, key_global_scale: float = 1.0,
                             stream: Any = None, check: Optional[bool] = None) -> tuple:
    """One pass over each row's keys (the rows and keys of `indexer_scores`): a key ranked above
    ``thresholds[t]`` is stored in ``candidates [T, capacity, 2]`` int32 as (position, f32 score
    bits), one ranked equal (not -inf) in ``ties [T, tie_capacity]`` int32 as its position;
    ``counts [T, 3]`` int32 (zero on entry: `thresholds_from_sample` zeroes it; updated in place)
    counts (candidates, ties, keys ranked below but not -inf), past the capacities where a store
    overflows (never written past its end). Ranking: higher first, -0 == +0, NaN below every
    other value, -inf never. Returns ``(candidates, ties, counts)``."""
    check_arrays(thresholds=thresholds, counts=counts, candidates=candidates, ties=ties,
                 row_requests=row_requests)
    t_rows = _rows(row_requests)
    if candidates is None:
        if capacity is None:
            raise MsaError("capacity: required without candidates= (candidate slots per row)")
        capacity = count(capacity, "capacity", lo=1)
        candidates = new_output(row_requests, (t_rows, capacity, 2), "i32", "candidates",
                                f"capacity = {capacity}")
    if ties is None:
        if tie_capacity is None:
            raise MsaError("tie_capacity: required without ties= (tie slots per row)")
        tie_capacity = count(tie_capacity, "tie_capacity")
        ties = new_output(row_requests, (t_rows, tie_capacity), "i32", "ties",
                          f"tie_capacity = {tie_capacity}")
    q, qs, qg = _unpack(query, query_scale, query_global_scale, "query")
    k, ks, kg = _unpack(key_cache, key_scale, key_global_scale, "key_cache")
    check_arrays(block_table=block_table, seq_lens=seq_lens, row_lens=row_lens)
    st = stream_of(row_requests, stream)
    status = status_for(row_requests)
    kw = _rows_cache(q, qs, k, ks, block_table, seq_lens, row_requests, row_lens, qg, kg)
    _C.indexer_threshold_select(**kw, thresholds=arg(thresholds), candidates=arg(candidates),
                                ties=arg(ties), counts=arg(counts), status=status, stream=st)
    finish(status, st, check)
    return candidates, ties, counts


def top_k_from_candidates(candidates: Any, ties: Any, counts: Any, topk: int, *,
                          out: Any = None, row_status: Any = None, stream: Any = None) -> tuple:
    """``(ids [T, topk], row_status [T])`` int32 from `indexer_threshold_select`'s stores: per row
    the `topk` best stored keys (candidates by their stored scores, then the lowest tie
    positions), ascending, -1 padded. ``row_status``: 0 exact (the top-K of a full sort of the
    row's scores), 1 the candidate store overflowed, 2 the tie store overflowed while ties were
    needed (both: ids all -1), 3 the threshold was too high (fewer stored than `topk` while keys
    ranked below exist: ids hold those stored, the row's true best)."""
    check_arrays(candidates=candidates, ties=ties, counts=counts, out=out, row_status=row_status)
    dims(candidates, "candidates", 3, "[T, C, 2]")
    topk = count(topk, "topk", lo=1)
    if compiling() and out is None and row_status is None:
        from . import _torch_ops
        return _torch_ops.top_k_from_candidates(candidates, ties, counts, topk, stream)
    return top_k_from_candidates_eager(candidates, ties, counts, topk, out, row_status, stream)


def top_k_from_candidates_eager(candidates, ties, counts, topk, out, row_status, stream) -> tuple:
    t_rows = dims(candidates, "candidates", 3, "[T, C, 2]")[0]
    if out is None:
        out = new_output(candidates, (t_rows, topk), "i32", "ids", f"topk = {topk}")
    if row_status is None:
        row_status = empty(candidates, (t_rows,), "i32")
    _C.top_k_from_candidates(candidates=arg(candidates), ties=arg(ties), counts=arg(counts),
                             topk=topk, ids=arg(out), row_status=arg(row_status),
                             stream=stream_of(candidates, stream))
    return out, row_status


def gather_key_sample(key_cache: Any, block_table: Any, seq_lens: Any, stride: int, *,
                      max_samples: Optional[int] = None, offsets: Any = None,
                      key_scale: Any = None, key_global_scale: float = 1.0, out: Any = None,
                      sample_lens: Any = None, stream: Any = None,
                      check: Optional[bool] = None) -> tuple:
    """``(sample, sample_lens)``: ``sample[b, i]`` = key ``offsets[b] + i * stride`` of request b
    (``offsets [B]`` int32 in ``[0, stride)``, default 0) for ``i < sample_lens[b] =
    ceil((seq_lens[b] - offsets[b]) / stride)``; later slots are not written. ``sample [B,
    max_samples, D]`` in the keys' dtype, or for NVFP4 keys a `QTensor` (values, scales, the
    keys' global scale). The sample is a page pool of one page a request: `indexer_scores` scores
    it with ``block_table = arange(B)[:, None]`` and ``seq_lens = sample_lens``. `out`: the
    sample's values, or ``(values, scale)`` for NVFP4."""
    k, ks, kg = _unpack(key_cache, key_scale, key_global_scale, "key_cache")
    k, ks = _typed(k, ks)
    check_arrays(block_table=block_table, seq_lens=seq_lens, offsets=offsets,
                 sample_lens=sample_lens)
    stride = count(stride, "stride", lo=1)
    batch = dims(seq_lens, "seq_lens", 1, "[B]")[0]
    shape = dims(k.array if hasattr(k, "array") else k, "key_cache", 3,
                 "[num_pages, page_size, D]")
    if out is None:
        if max_samples is None:
            raise MsaError("max_samples: required without out= (sample slots per request, at "
                           "least every request's sample count)")
        max_samples = count(max_samples, "max_samples")
        values = new_output(seq_lens, (batch, max_samples, shape[2]),
                            "fp4x2" if ks is not None else _value_dtype(k), "sample",
                            f"max_samples = {max_samples}")
        scale = empty(seq_lens, (batch, max_samples, shape[2] // 8), "fp8_e4m3") \
            if ks is not None else None
    else:
        if ks is not None and not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise MsaError("out: with key scales (NVFP4 keys) the sample is (values, scale), got "
                           f"{type(out).__name__}")
        values, scale = out if ks is not None else (out, None)
        check_arrays(out=values, out_scale=scale)
    if sample_lens is None:
        sample_lens = empty(seq_lens, (batch,), "i32")
    st = stream_of(seq_lens, stream)
    status = status_for(seq_lens)
    _C.gather_key_sample(key_cache=arg(k), key_cache_scale=arg(ks), key_cache_global_scale=kg,
                         block_table=arg(block_table), seq_lens=arg(seq_lens), stride=stride,
                         offsets=arg(offsets),
                         sample=arg(values, "fp4x2" if ks is not None else None),
                         sample_scale=arg(scale, "fp8_e4m3" if scale is not None else None),
                         sample_lens=arg(sample_lens), status=status, stream=st)
    finish(status, st, check)
    sample = QTensor(values, scale, kg, "nvfp4") if ks is not None else values
    return sample, sample_lens


def _value_dtype(x: Any) -> str:
    from ._arrays import Typed, dtype_of
    return x.dtype if isinstance(x, Typed) else (dtype_of(x) or "bf16")


def thresholds_from_sample(sample_scores: Any, topk: int, sample_stride: int, *,
                           oversample: float = 2.0, thresholds: Any = None, counts: Any = None,
                           stream: Any = None) -> tuple:
    """``(thresholds [T] f32, counts [T, 3] int32 zeroed)``: per row of ``sample_scores [T, S]``
    f32 (`indexer_scores` on a `gather_key_sample` sample; -inf marks no sample) the r-th best
    score, ``r = max(1, ceil(oversample * topk / sample_stride))``, so that about ``oversample *
    topk`` of the row's keys rank above it; -inf when the row has fewer than r samples."""
    check_arrays(sample_scores=sample_scores, thresholds=thresholds, counts=counts)
    dims(sample_scores, "sample_scores", 2, "[T, S]")
    topk = count(topk, "topk", lo=1)
    sample_stride = count(sample_stride, "sample_stride", lo=1)
    if compiling() and thresholds is None and counts is None:
        from . import _torch_ops
        return _torch_ops.thresholds_from_sample(sample_scores, topk, sample_stride,
                                                 float(oversample), stream)
    return thresholds_from_sample_eager(sample_scores, topk, sample_stride, float(oversample),
                                        thresholds, counts, stream)


def thresholds_from_sample_eager(sample_scores, topk, sample_stride, oversample, thresholds,
                                 counts, stream) -> tuple:
    t_rows = dims(sample_scores, "sample_scores", 2, "[T, S]")[0]
    if thresholds is None:
        thresholds = empty(sample_scores, (t_rows,), "f32")
    if counts is None:
        counts = empty(sample_scores, (t_rows, 3), "i32")
    _C.thresholds_from_sample(sample_scores=arg(sample_scores), topk=topk,
                              sample_stride=sample_stride, oversample=oversample,
                              thresholds=arg(thresholds), counts=arg(counts),
                              stream=stream_of(sample_scores, stream))
    return thresholds, counts


def quantize_write_index_qk_nvfp4(key: Any = None, slots: Any = None, key_cache: Any = None,
                                  query: Any = None, *, key_scale: Any = None,
                                  key_global_scale: float = 1.0,
                                  query_global_scale: float = 1.0, query_out: Any = None,
                                  stream: Any = None, check: Optional[bool] = None) -> Any:
    """NVFP4 (msa's rule, as `quantize` "nvfp4") of ``key [N, D]`` (f32/bf16/f16) into
    ``key_cache`` (a `QTensor`, or fp4x2 values ``[num_pages, page_size, D/2]`` with
    ``key_scale [num_pages, page_size, D/16]`` e4m3; written in place) at ``slots [N]`` int32
    (page ``slots[n] // page_size``, slot ``slots[n] % page_size``; negative slots are skipped,
    the others given once) and of ``query [T, D]`` into rows. Returns the queries as a `QTensor`
    (``query_out``: ``(values, scale)`` to write into), or None without `query`."""
    check_arrays(key=key, slots=slots, query=query)
    kw: dict = dict(key=arg(key), slots=arg(slots))
    if key_cache is not None:
        k, ks, kg = _unpack(key_cache, key_scale, key_global_scale, "key_cache")
        kw.update(key_cache=arg(tag(k, "fp4x2")), key_cache_scale=arg(tag(ks, "fp8_e4m3")),
                  key_cache_global_scale=kg)
    result = None
    if query is not None:
        t_rows, d = dims(query, "query", 2, "[T, D]")
        if query_out is None:
            qv = empty(query, (t_rows, d // 2), "fp4x2")
            qs = empty(query, (t_rows, d // 16), "fp8_e4m3")
        else:
            if not isinstance(query_out, (tuple, list)) or len(query_out) != 2:
                raise MsaError("query_out: must be a sequence (values, scale)")
            qv, qs = query_out
            check_arrays(query_out=qv, query_out_scale=qs)
        kw.update(query=arg(query), query_out=arg(tag(qv, "fp4x2")),
                  query_out_scale=arg(tag(qs, "fp8_e4m3")),
                  query_out_global_scale=float(query_global_scale))
        result = QTensor(qv, qs, float(query_global_scale), "nvfp4")
    like = key if key is not None else query
    st = stream_of(like, stream) if like is not None else 0
    status = status_for(like) if like is not None else None
    _C.quantize_write_index_qk_nvfp4(**kw, status=status, stream=st)
    finish(status, st, check)
    return result


__all__ = ["gather_key_sample", "indexer_scores", "indexer_threshold_select",
           "quantize_write_index_qk_nvfp4", "thresholds_from_sample", "top_k_from_candidates"]
