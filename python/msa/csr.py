"""The key-block -> queries (k2q) CSR index of a q2k selection and its work schedule
(docs/semantics.md, k2q CSR): `build_k2q_csr` on the CPU or the GPU, and the CPU reference
converters `q2k_to_k2q` / `k2q_to_q2k` for tests."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Sequence

from . import _C
from ._arrays import empty, to_host_list
from ._kv import kv_args, key_lengths, layout_name, rows_bound
from ._runtime import (MsaError, allocator, arg, check_arrays, check_pending, check_sequence, compiling,
                       count, dims, finish, new_output, status_for, stream_of)


def _rows(lengths: list, kv_block_size: int) -> int:
    """sum_b ceil(Lk_b / kv_block_size)."""
    return sum((lk + kv_block_size - 1) // kv_block_size for lk in lengths)


class K2QIndex(NamedTuple):
    """The key-block -> queries CSR index: row_ptr [Hkv, total_rows + 1], q_idx
    [Hkv, total_q * topk] and the opaque int32 work schedule (None if not requested)."""

    row_ptr: Any
    q_idx: Any
    schedule: Any = None


def build_k2q_csr(q2k: Any, cu_seqlens_q: Any, *, cu_seqlens_k: Any = None,
                  page_table: Any = None, seqused_k: Any = None, k: Any = None,
                  kv_layout: Optional[str] = None, kv_block_size: int = 128,
                  return_schedule: bool = True, total_rows: Optional[int] = None,
                  out: Optional[Sequence[Any]] = None, stream: Any = None,
                  check: Optional[bool] = None) -> K2QIndex:
    """The k2q CSR index of a q2k selection, as a `K2QIndex`.

    Rows are (batch, kv block) pairs, ``sum_b ceil(Lk_b / kv_block_size)`` of them. row_ptr has
    ``total_rows + 1`` columns: ``total_rows`` defaults to an upper bound taken from shapes,
    ``total_k // kv_block_size + B`` for a flat cache (pass ``k`` for total_k; without ``k`` the
    lengths are read from cu_seqlens_k, which waits for the stream on the GPU) or the page
    table's capacity for a paged one; rows past the batches' blocks are empty. With
    ``return_schedule`` the work schedule for `attention_forward` is built too. Invalid ids in
    q2k (outside ``[-1, nblk_b)`` or repeated in a row) raise `MsaError` naming the first
    offending (head, token, slot) (on the GPU when checked: see `msa.check_status`). ``out``:
    preallocated (row_ptr, q_idx[, schedule]).
    """
    layout = layout_name(kv_layout, page_table)
    if layout != "flat" and k is None:
        raise MsaError("k: required for a paged KV cache (its shape gives the page size)")
    check_arrays(q2k=q2k, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                 page_table=page_table, seqused_k=seqused_k, k=k)
    check_sequence(out, "out", "(row_ptr, q_idx[, schedule])", (2, 3))
    dims(q2k, "q2k", 3, "[Hkv, total_q, topk]")
    kv_block_size = count(kv_block_size, "kv_block_size", lo=1)
    waited = False
    if total_rows is not None:
        total_rows = count(total_rows, "total_rows")
    elif out is None:
        total_rows = rows_bound(layout, k, cu_seqlens_k, page_table, kv_block_size)
        if total_rows is None:
            total_rows = _rows(key_lengths(layout, k, cu_seqlens_k, page_table, seqused_k),
                               kv_block_size)
            waited = True
    if out is None and compiling():
        from . import _torch_ops
        from .quant import unpack
        row_ptr, q_idx, schedule = _torch_ops.build_k2q_csr(
            q2k, cu_seqlens_q, unpack(k)[0], cu_seqlens_k, page_table, seqused_k, layout,
            kv_block_size, int(total_rows), return_schedule, check, stream)
        return K2QIndex(row_ptr, q_idx, schedule if return_schedule else None)
    return K2QIndex(*build_k2q_csr_eager(q2k, cu_seqlens_q, k, cu_seqlens_k, page_table,
                                         seqused_k, layout, kv_block_size, total_rows,
                                         return_schedule, out, stream, check, waited))


def build_k2q_csr_eager(q2k, cu_seqlens_q, k, cu_seqlens_k, page_table, seqused_k, layout,
                        kv_block_size, total_rows, return_schedule, out, stream, check,
                        waited=False) -> tuple:
    if out is not None:
        row_ptr, q_idx = out[0], out[1]
        schedule = out[2] if len(out) > 2 else None
    else:
        hkv, total_q, topk = dims(q2k, "q2k", 3, "[Hkv, total_q, topk]")
        row_ptr = new_output(q2k, (hkv, total_rows + 1), "i32", "row_ptr",
                             f"total_rows = {total_rows}")
        q_idx = empty(q2k, (hkv, total_q * topk), "i32")
        schedule = empty(q2k, (_C.k2q_schedule_size(hkv, total_rows, total_q, topk),), "i32") \
            if return_schedule else None
    st = stream_of(q2k, stream)
    if waited:
        check_pending(q2k, st)
    status = status_for(q2k)
    _C.build_k2q_csr(q2k=arg(q2k), cu_seqlens_q=arg(cu_seqlens_q),
                     **kv_args(k, layout=layout, cu_seqlens_k=cu_seqlens_k,
                               page_table=page_table, seqused_k=seqused_k),
                     kv_block_size=kv_block_size, row_ptr=arg(row_ptr), q_idx=arg(q_idx),
                     schedule=arg(schedule), alloc=allocator(q2k, stream), status=status, stream=st)
    finish(status, st, check)
    return row_ptr, q_idx, schedule


def q2k_to_k2q(q2k: Any, cu_seqlens_q: Any, *, cu_seqlens_k: Any = None,
               page_table: Any = None, seqused_k: Any = None, k: Any = None,
               kv_layout: Optional[str] = None, kv_block_size: int = 128) -> K2QIndex:
    """CPU reference converter q2k -> (row_ptr, q_idx) with exactly
    ``sum_b ceil(Lk_b / kv_block_size)`` rows, for tests (host arrays only)."""
    layout = layout_name(kv_layout, page_table)
    check_arrays(q2k=q2k, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                 page_table=page_table, seqused_k=seqused_k, k=k)
    hkv, total_q, topk = dims(q2k, "q2k", 3, "[Hkv, total_q, topk]")
    kv_block_size = count(kv_block_size, "kv_block_size", lo=1)
    rows = _rows(key_lengths(layout, k, cu_seqlens_k, page_table, seqused_k), kv_block_size)
    row_ptr = empty(q2k, (hkv, rows + 1), "i32")
    q_idx = empty(q2k, (hkv, total_q * topk), "i32")
    _C.q2k_to_k2q_cpu(q2k=arg(q2k), cu_seqlens_q=arg(cu_seqlens_q),
                      **kv_args(k, layout=layout, cu_seqlens_k=cu_seqlens_k,
                                page_table=page_table, seqused_k=seqused_k),
                      kv_block_size=kv_block_size, row_ptr=arg(row_ptr), q_idx=arg(q_idx))
    return K2QIndex(row_ptr, q_idx)


def k2q_to_q2k(k2q: Sequence[Any], cu_seqlens_q: Any, *, topk: int, cu_seqlens_k: Any = None,
               page_table: Any = None, seqused_k: Any = None, k: Any = None,
               kv_layout: Optional[str] = None, kv_block_size: int = 128) -> Any:
    """CPU reference converter (row_ptr, q_idx) -> q2k ``[Hkv, total_q, topk]``, each query's
    blocks ascending and -1 padded (host arrays only)."""
    layout = layout_name(kv_layout, page_table)
    check_sequence(k2q, "k2q", "(row_ptr, q_idx[, schedule])", (2, 3))
    check_arrays(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, page_table=page_table,
                 seqused_k=seqused_k, k=k)
    row_ptr, q_idx = k2q[0], k2q[1]
    hkv = dims(row_ptr, "row_ptr", 2, "[Hkv, total_rows + 1]")[0]
    topk = count(topk, "topk", lo=1)
    dims(cu_seqlens_q, "cu_seqlens_q", 1, "[B+1]")
    total_q = (to_host_list(cu_seqlens_q) or [0])[-1]  # an empty one is msa._C's to report
    q2k = new_output(row_ptr, (hkv, max(total_q, 0), topk), "i32", "q2k", f"topk = {topk}")
    _C.k2q_to_q2k_cpu(row_ptr=arg(row_ptr), q_idx=arg(q_idx), cu_seqlens_q=arg(cu_seqlens_q),
                      **kv_args(k, layout=layout, cu_seqlens_k=cu_seqlens_k,
                                page_table=page_table, seqused_k=seqused_k),
                      kv_block_size=kv_block_size, q2k=arg(q2k))
    return q2k


__all__ = ["K2QIndex", "build_k2q_csr", "q2k_to_k2q", "k2q_to_q2k"]
