"""DeepSeek-style indexer logits (docs/semantics.md, Indexer logits): `mqa_logits`, the ragged
prefill form (DeepGEMM's ``fp8_mqa_logits`` contract), `paged_mqa_logits` (seed 001's paged
form), and `token_topk` over their rows. The logits run on the CPU and on CUDA (FP8, D = 128,
H <= 128; on CUDA the ranges, lengths and block ids are checked on the device: `check=True`
or `msa.check_status` raises for them); `token_topk` on the CPU and on CUDA (f32 rows, any
topk; the same ids on both)."""

from __future__ import annotations

from typing import Any, Optional

from . import _C
from ._arrays import empty
from ._runtime import (allocator, arg, check_arrays, compiling, count, dims, finish,
                       new_output, status_for, stream_of)
from .quant import unpack


def mqa_logits(q: Any, k: Any, weights: Any, ks: Any, ke: Any, *, k_scale: Any = None,
               clean_logits: bool = True, out: Any = None, stream: Any = None,
               check: Optional[bool] = None) -> Any:
    """``logits [T, S]`` f32: for query row t and key s in ``[ks[t], ke[t])``,
    ``k_scale[s] * sum_h weights[t, h] * relu(q[t, h] . k[s])``; ``-inf`` elsewhere (with
    ``clean_logits``; else those columns of `out` are left as they are).

    ``q [T, H, D]`` fp8_e4m3 (or bf16) without a scale, ``k [S, D]`` of q's dtype (a `QTensor`
    or values plus ``k_scale [S]`` f32), ``weights [T, H]`` f32, ``ks``/``ke [T]`` int32 with
    ``0 <= ks <= ke <= S``. CUDA takes fp8_e4m3, D = 128, H <= 128; a bad range there is
    reported through the device status (``check=True`` waits and raises)."""
    check_arrays(q=q, k=k, weights=weights, ks=ks, ke=ke, k_scale=k_scale, out=out)
    kv, kscale, _ = unpack(k, k_scale)
    dims(q, "q", 3, "[T, H, D]")
    dims(kv, "k", 2, "[S, D]")
    if out is None and compiling():
        from . import _torch_ops
        return _torch_ops.mqa_logits(q, kv, kscale, weights, ks, ke, clean_logits, check, stream)
    return mqa_logits_eager(q, kv, kscale, weights, ks, ke, clean_logits, out, stream, check)


def mqa_logits_eager(q, k, k_scale, weights, ks, ke, clean_logits, out, stream, check) -> Any:
    t_rows = dims(q, "q", 3, "[T, H, D]")[0]
    s_keys = dims(k, "k", 2, "[S, D]")[0]
    if out is None:
        out = empty(weights, (t_rows, s_keys), "f32")
    st = stream_of(weights, stream)
    status = status_for(weights)
    _C.mqa_logits(q=arg(q), k=arg(k), k_scale=arg(k_scale), weights=arg(weights), ks=arg(ks),
                  ke=arg(ke), logits=arg(out), clean_logits=clean_logits, status=status,
                  stream=st)
    finish(status, st, check)
    return out


def paged_mqa_logits(q: Any, kv_fused: Any, weights: Any, block_tables: Any, seq_lens: Any,
                     max_seq_len: int, *, q_sf: Any = None, clean_logits: bool = True,
                     out: Any = None, stream: Any = None, check: Optional[bool] = None) -> Any:
    """``logits [B * next_n, max_seq_len]`` f32 (or `out`, at least that wide) over seed 001's
    fused pool ``kv_fused [num_blocks, block_size, 1, D + 4]`` uint8 (per block: the e4m3 values
    of its tokens, then their f32 scales): row ``b * next_n + t`` scores positions
    ``p <= seq_lens[b] - next_n + t`` as `mqa_logits` does, ``-inf`` beyond (with
    ``clean_logits``). ``q [B, next_n, H, D]`` e4m3, or MXFP4: ``q`` fp4x2 ``[B, next_n, H,
    D/2]`` with ``q_sf [B, next_n, H, D/32]`` UE8M0 bytes and a pool of ``D/2 + D/32`` bytes per
    token (values, then scales; no per-token factor). ``weights [B * next_n, H]`` f32,
    ``block_tables [B, W]`` and ``seq_lens [B]`` int32. A too-narrow table, a length above
    `max_seq_len` or a block id outside the pool raise `MsaError` (on CUDA through the device
    status: ``check=True`` waits and raises, else `msa.check_status`). CUDA takes FP8 or MXFP4,
    D = 128, H <= 128 and block sizes 32, 64 and 128."""
    check_arrays(q=q, kv_fused=kv_fused, weights=weights, block_tables=block_tables,
                 seq_lens=seq_lens, q_sf=q_sf, out=out)
    dims(q, "q", 4, "[B, next_n, H, D]")
    max_seq_len = count(max_seq_len, "max_seq_len", bits=64)
    if out is None and compiling():
        from . import _torch_ops
        return _torch_ops.paged_mqa_logits(q, q_sf, kv_fused, weights, block_tables, seq_lens,
                                           max_seq_len, clean_logits, check, stream)
    return paged_mqa_logits_eager(q, q_sf, kv_fused, weights, block_tables, seq_lens,
                                  max_seq_len, clean_logits, out, stream, check)


def paged_mqa_logits_eager(q, q_sf, kv_fused, weights, block_tables, seq_lens, max_seq_len,
                           clean_logits, out, stream, check) -> Any:
    b, next_n = dims(q, "q", 4, "[B, next_n, H, D]")[:2]
    if out is None:
        out = new_output(weights, (b * next_n, max_seq_len), "f32", "logits",
                         f"max_seq_len = {max_seq_len}")
    st = stream_of(weights, stream)
    status = status_for(weights)
    _C.paged_mqa_logits(q=arg(q), q_sf=arg(q_sf), kv_fused=arg(kv_fused, "u8"),
                        weights=arg(weights), block_tables=arg(block_tables),
                        seq_lens=arg(seq_lens),
                        max_seq_len=max_seq_len, logits=arg(out), clean_logits=clean_logits,
                        status=status, stream=st)
    finish(status, st, check)
    return out


def token_topk(logits: Any, topk: int, *, ks: Any = None, ke: Any = None, out: Any = None,
               stream: Any = None, check: Optional[bool] = None) -> Any:
    """``ids [R, topk]`` int32: per row of ``logits [R, S]`` f32, the `topk` highest positions
    among ``[ks[r], ke[r])`` (the whole row without ranges), ascending, -1 padded; ``-inf`` is
    never chosen, ties go to the lower position, NaN ranks below every finite value. CPU and
    CUDA give the same ids; on CUDA a bad range is reported through the device status (its row
    is all -1; ``check=True`` waits and raises)."""
    check_arrays(logits=logits, ks=ks, ke=ke, out=out)
    dims(logits, "logits", 2, "[R, S]")
    topk = count(topk, "topk", lo=1)
    if out is None and compiling():
        from . import _torch_ops
        return _torch_ops.token_topk(logits, ks, ke, topk, check, stream)
    return token_topk_eager(logits, ks, ke, topk, out, stream, check)


def token_topk_eager(logits, ks, ke, topk, out, stream, check) -> Any:
    rows = dims(logits, "logits", 2, "[R, S]")[0]
    if out is None:
        out = new_output(logits, (rows, topk), "i32", "ids", f"topk = {topk}")
    st = stream_of(logits, stream)
    status = status_for(logits)
    _C.token_topk(logits=arg(logits), ks=arg(ks), ke=arg(ke), topk=topk, ids=arg(out),
                  status=status, stream=st)
    finish(status, st, check)
    return out


def mqa_logits_topk(q: Any, k: Any, weights: Any, ks: Any, ke: Any, topk: int, *,
                    k_scale: Any = None, workspace: Any = None, out: Any = None,
                    stream: Any = None, check: Optional[bool] = None) -> Any:
    """``ids [T, topk]`` int32: `token_topk` of `mqa_logits`' rows (each row's range), without the
    ``[T, S]`` logits: the rows run in chunks whose logits live in `workspace` (CUDA: uint8 bytes,
    at least one row of S f32 logits padded to 16 bytes; ``mqa_logits_topk_workspace_bytes``
    gives the default, about 2048 rows; absent, it is allocated from q's framework). Arguments
    and errors as `mqa_logits` and `token_topk`; the ids equal theirs."""
    check_arrays(q=q, k=k, weights=weights, ks=ks, ke=ke, k_scale=k_scale, workspace=workspace,
                 out=out)
    kv, kscale, _ = unpack(k, k_scale)
    dims(q, "q", 3, "[T, H, D]")
    dims(kv, "k", 2, "[S, D]")
    topk = count(topk, "topk", lo=1)
    if out is None and workspace is None and compiling():
        from . import _torch_ops
        return _torch_ops.mqa_logits_topk(q, kv, kscale, weights, ks, ke, topk, check, stream)
    return mqa_logits_topk_eager(q, kv, kscale, weights, ks, ke, topk, workspace, out, stream,
                                 check)


def mqa_logits_topk_eager(q, k, k_scale, weights, ks, ke, topk, workspace, out, stream,
                          check) -> Any:
    t_rows = dims(q, "q", 3, "[T, H, D]")[0]
    if out is None:
        out = new_output(weights, (t_rows, topk), "i32", "ids", f"topk = {topk}")
    st = stream_of(weights, stream)
    status = status_for(weights)
    _C.mqa_logits_topk(q=arg(q), k=arg(k), k_scale=arg(k_scale), weights=arg(weights),
                       ks=arg(ks), ke=arg(ke), topk=topk, ids=arg(out),
                       workspace=arg(workspace, "u8"), alloc=allocator(weights, stream),
                       status=status, stream=st)
    finish(status, st, check)
    return out


def paged_mqa_logits_topk(q: Any, kv_fused: Any, weights: Any, block_tables: Any,
                          seq_lens: Any, max_seq_len: int, topk: int, *, q_sf: Any = None,
                          workspace: Any = None, out: Any = None, stream: Any = None,
                          check: Optional[bool] = None) -> Any:
    """``ids [B * next_n, topk]`` int32: `token_topk` of `paged_mqa_logits`' rows (clean: what
    a row does not see is ``-inf``), without the logits: whole batches at a time whose logits
    live in `workspace` (CUDA: uint8 bytes, at least next_n rows of max_seq_len f32 logits
    padded to 16 bytes; ``paged_mqa_logits_topk_workspace_bytes`` gives the default; absent, it
    is allocated from q's framework). Arguments and errors as `paged_mqa_logits` and
    `token_topk`; the ids equal theirs."""
    check_arrays(q=q, kv_fused=kv_fused, weights=weights, block_tables=block_tables,
                 seq_lens=seq_lens, q_sf=q_sf, workspace=workspace, out=out)
    dims(q, "q", 4, "[B, next_n, H, D]")
    max_seq_len = count(max_seq_len, "max_seq_len", bits=64)
    topk = count(topk, "topk", lo=1)
    if out is None and workspace is None and compiling():
        from . import _torch_ops
        return _torch_ops.paged_mqa_logits_topk(q, q_sf, kv_fused, weights, block_tables,
                                                seq_lens, max_seq_len, topk, check, stream)
    return paged_mqa_logits_topk_eager(q, q_sf, kv_fused, weights, block_tables, seq_lens,
                                       max_seq_len, topk, workspace, out, stream, check)


def paged_mqa_logits_topk_eager(q, q_sf, kv_fused, weights, block_tables, seq_lens, max_seq_len,
                                topk, workspace, out, stream, check) -> Any:
    b, next_n = dims(q, "q", 4, "[B, next_n, H, D]")[:2]
    if out is None:
        out = new_output(weights, (b * next_n, topk), "i32", "ids", f"topk = {topk}")
    st = stream_of(weights, stream)
    status = status_for(weights)
    _C.paged_mqa_logits_topk(q=arg(q), q_sf=arg(q_sf), kv_fused=arg(kv_fused, "u8"),
                             weights=arg(weights), block_tables=arg(block_tables),
                             seq_lens=arg(seq_lens), max_seq_len=max_seq_len, topk=topk,
                             ids=arg(out), workspace=arg(workspace, "u8"),
                             alloc=allocator(weights, stream), status=status, stream=st)
    finish(status, st, check)
    return out


def mqa_logits_topk_workspace_bytes(rows: int, keys: int) -> int:
    """Workspace bytes `mqa_logits_topk` takes on CUDA by default (its chunks of rows)."""
    return int(_C.mqa_logits_topk_workspace_bytes(count(rows, "rows", bits=64),
                                                  count(keys, "keys", bits=64)))


def paged_mqa_logits_topk_workspace_bytes(batch: int, next_n: int, max_seq_len: int) -> int:
    """Workspace bytes `paged_mqa_logits_topk` takes on CUDA by default (chunks of batches)."""
    return int(_C.paged_mqa_logits_topk_workspace_bytes(
        count(batch, "batch", bits=64), count(next_n, "next_n", lo=1, bits=64),
        count(max_seq_len, "max_seq_len", bits=64)))


__all__ = ["mqa_logits", "mqa_logits_topk", "mqa_logits_topk_workspace_bytes",
           "paged_mqa_logits", "paged_mqa_logits_topk", "paged_mqa_logits_topk_workspace_bytes",
           "token_topk"]
