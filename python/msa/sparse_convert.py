"""Converters between msa's block selections (q2k, the k2q CSR) and the block-sparse masks of
other libraries (docs/python.md, Converters): FlashInfer's BSR matrix (``indptr``, ``indices``;
query rows in blocks of R, keys in blocks of C) and PyTorch Flex attention's ``BlockMask``.

They run on the host with numpy. Arrays on a GPU are copied to the host first (which waits for
their stream); results are arrays of the input's framework on the input's device."""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Optional, Sequence

from ._arrays import Typed, _torch, framework
from ._runtime import MsaError, check_arrays, check_sequence, count
from .csr import K2QIndex, k2q_to_q2k, q2k_to_k2q

# msa's kv block sizes: 64 and 128 are block ids, 1 makes a q2k hold key (token) ids.
_KV_BLOCK_SIZES = (1, 64, 128)
# Elements of mask_mod evaluated per call when a Flex BlockMask's partial blocks are checked.
_EVAL_ELEMENTS = 1 << 22


class Q2KSelection(NamedTuple):
    """A converted selection: ``q2k`` int32 ``[Hkv, total_q, topk]`` (ascending ids, -1
    padded) and the ``kv_block_size`` its ids count in (64 or 128: block ids; 1: key ids), to
    pass on to `attention_forward` with it."""

    q2k: Any
    kv_block_size: int


def _np():
    try:
        import numpy
    except ImportError:
        raise MsaError("msa.sparse_convert: the converters need numpy (pip install numpy)") \
            from None
    return numpy


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _read(x: Any, name: str) -> Any:
    """x (torch, numpy, cupy or another DLPack producer) as a host numpy array."""
    np = _np()
    if x is None:
        raise MsaError(f"{name}: required")
    if isinstance(x, Typed):
        raise MsaError(f"{name}: expected an array, got msa.Typed")
    check_arrays(**{name: x})
    fw = framework(x)
    if fw == "torch":
        return x.detach().cpu().numpy()
    if fw == "cupy":
        return x.get()
    if fw == "numpy":
        return x
    try:
        return np.from_dlpack(x)
    except (TypeError, ValueError, RuntimeError, BufferError) as e:
        raise MsaError(f"{name}: cannot read it on the host ({type(e).__name__}: {e}); "
                       "pass a torch, numpy or cupy array") from None


def _host(x: Any, name: str, ndims: tuple, what: str, i32: bool = False) -> Any:
    """x as a host numpy int64 array with a rank in `ndims` (`what` spells the shape); i32: the
    input must be int32 (msa's index dtype), else any integer dtype."""
    np = _np()
    if isinstance(x, Typed):
        raise MsaError(f"{name}: expected an integer array, got msa.Typed")
    if framework(x) == "torch" and (x.dtype.is_floating_point or x.dtype.is_complex or
                                    x.dtype is _torch().bool):
        raise MsaError(f"{name}: must be an integer array{' (int32)' if i32 else ''}, "
                       f"got {x.dtype}")
    a = _read(x, name)
    if a.dtype.kind not in "iu":
        raise MsaError(f"{name}: must be an integer array{' (int32)' if i32 else ''}, "
                       f"got {a.dtype}")
    if i32 and a.dtype != np.int32:
        raise MsaError(f"{name}: must be int32, got {a.dtype}")
    if a.ndim not in ndims:
        raise MsaError(f"{name}: must be {what}, got {a.ndim} dims {list(a.shape)}")
    return a.astype(np.int64)


def _like(ref: Any, a: Any) -> Any:
    """The numpy array `a` as an array of ref's framework on ref's device (numpy for numpy and
    for other DLPack producers)."""
    np = _np()
    a = np.ascontiguousarray(a)
    fw = framework(ref)
    if fw == "torch":
        import torch
        return torch.from_numpy(a).to(ref.device)
    if fw == "cupy":
        import cupy
        with cupy.cuda.Device(ref.device.id):
            return cupy.asarray(a)
    return a


def _block_size(value: Optional[int], block_cols: int) -> int:
    """msa's kv block size for key blocks of `block_cols`: `value` when given (64, 128 or 1),
    else 128 or 64 when it divides block_cols, else 1 (key ids)."""
    if value is not None:
        v = count(value, "kv_block_size", lo=1)
        if v not in _KV_BLOCK_SIZES:
            raise MsaError(f"kv_block_size: must be 64, 128 or 1 (key ids), got {v}")
        return v
    for v in (128, 64):
        if block_cols % v == 0:
            return v
    return 1


def _known_block_size(value: Any) -> int:
    """A q2k's kv_block_size, which the caller must give: 64, 128 or 1."""
    if value is None:
        raise MsaError("kv_block_size: required (64, 128, or 1 for key ids)")
    return _block_size(value, 1)


def _check_offsets(p: Any, name: str, label: Callable[[int], str]) -> None:
    """A prefix-sum array (cu_seqlens, indptr) starts at 0 and never decreases; `label(i)`
    names entry i."""
    np = _np()
    if p[0] != 0:
        raise MsaError(f"{name}: must start at 0, got {label(0)} = {int(p[0])}")
    drop = np.flatnonzero(np.diff(p) < 0)
    if drop.size:
        i = int(drop[0])
        raise MsaError(f"{name}: must be non-decreasing, got {label(i)} = {int(p[i])} > "
                       f"{label(i + 1)} = {int(p[i + 1])}")


def _lengths(cu: Any, name: str, total: Optional[int] = None) -> list:
    """The per-request lengths of a cu_seqlens array [B+1] (starts at 0, non-decreasing, ends
    at `total` when given)."""
    np = _np()
    c = _host(cu, name, (1,), "[B+1] (1 dim)")
    if c.shape[0] < 1:
        raise MsaError(f"{name}: must have B+1 >= 1 entries, got 0")
    _check_offsets(c, name, lambda i: f"{name}[{i}]")
    if total is not None and c[-1] != total:
        raise MsaError(f"{name}: must end at total_q = {total}, got {int(c[-1])}")
    return [int(v) for v in np.diff(c)]


def _kv_heads(sel: Any, num_kv_heads: Optional[int], name: str,
              where: Callable[[tuple], str]) -> Any:
    """sel [H, ...] -> [Hkv, ...]: H = 1 broadcasts to num_kv_heads (default 1); otherwise H is
    a multiple of num_kv_heads (default H) and the heads of each group of G = H / Hkv must
    select the same blocks. `where` names the position of a difference."""
    np = _np()
    hs = sel.shape[0]
    if hs == 1:
        hkv = 1 if num_kv_heads is None else count(num_kv_heads, "num_kv_heads", lo=1)
        return np.broadcast_to(sel, (hkv,) + sel.shape[1:])
    hkv = hs if num_kv_heads is None else count(num_kv_heads, "num_kv_heads", lo=1)
    if hs % hkv:
        raise MsaError(f"num_kv_heads: {hkv} must divide the {hs} heads of {name}")
    g = hs // hkv
    grouped = sel.reshape((hkv, g) + sel.shape[1:])
    diff = grouped != grouped[:, :1]
    if diff.any():
        pos = tuple(int(i) for i in np.argwhere(diff)[0])
        raise MsaError(f"{name}: heads {pos[0] * g} and {pos[0] * g + pos[1]} share kv head "
                       f"{pos[0]} (groups of {g}) but select different blocks at "
                       f"{where(pos[2:])}; msa selects per kv head")
    return grouped[:, 0]


def _regrain(m: Any, a: int, b: int, n: int, fail: Callable[[tuple], None]) -> Any:
    """A selection of key blocks of `a` over `n` keys, m [..., ceil(n/a)] bool, as blocks of `b`
    [..., ceil(n/b)]. Every block of b must be wholly selected or not at all (the last block of
    each size ends at key n); `fail(position)` raises for the first block of b that is not."""
    np = _np()
    if a == b:
        return m
    g = math.gcd(a, b)
    units = _cdiv(n, g)
    u = np.repeat(m, a // g, axis=-1)[..., :units]
    nb, per = _cdiv(n, b), b // g
    pad = np.zeros(u.shape[:-1] + (nb * per - units,), dtype=bool)
    sel = np.concatenate([u, pad], axis=-1).reshape(u.shape[:-1] + (nb, per)).sum(-1)
    real = np.minimum(per, units - np.arange(nb) * per)
    partial = (sel > 0) & (sel < real)
    if partial.any():
        fail(tuple(int(i) for i in np.argwhere(partial)[0]))
    return sel > 0


def _mask_to_ids(m: Any, topk: Optional[int]) -> Any:
    """m [..., W] bool -> int32 [..., topk]: each row's selected columns ascending, -1 padded.
    topk defaults to the widest row (at least 1) and may not be less."""
    np = _np()
    n = m.sum(-1)
    widest = int(n.max(initial=0))
    k = max(1, widest) if topk is None else count(topk, "topk", lo=1)
    if k < widest:
        raise MsaError(f"topk: {k} is less than the {widest} ids of the widest row")
    order = np.argsort(~m, axis=-1, kind="stable")[..., :k]
    if order.shape[-1] < k:
        order = np.concatenate(
            [order, np.zeros(order.shape[:-1] + (k - order.shape[-1],), order.dtype)], -1)
    return np.where(np.arange(k) < n[..., None], order, -1).astype(np.int32)


def _check_ids(ids: Any, n: int, name: str, where: Callable[[tuple], str],
               unit: str = "ids") -> Any:
    """ids [..., K] (-1 or an id in [0, n), none repeated in a row) sorted ascending per row,
    with n in place of each -1 (so equal rows are equal arrays)."""
    np = _np()
    bad = (ids < -1) | (ids >= n)
    if bad.any():
        pos = tuple(int(i) for i in np.argwhere(bad)[0])
        raise MsaError(f"{name}: id {int(ids[pos])} at {where(pos)} is outside [-1, {n}) "
                       f"({n} {unit})")
    s = np.sort(np.where(ids >= 0, ids, n), axis=-1)
    dup = (s[..., 1:] == s[..., :-1]) & (s[..., 1:] < n)
    if dup.any():
        pos = tuple(int(i) for i in np.argwhere(dup)[0])
        raise MsaError(f"{name}: id {int(s[pos])} is repeated in the row at "
                       f"{where(pos[:-1] + (-1,))}")
    return s


def _rows_of_blocks(s: Any, rows: int, n: int, name: str,
                    where: Callable[[tuple], str]) -> Any:
    """Sorted ids s [H, T, K] (from _check_ids) whose queries, in blocks of `rows`, must select
    alike -> bool [H, ceil(T / rows), n], one row per block of queries."""
    np = _np()
    h, t, _ = s.shape
    rep = s[:, ::rows]
    diff = (s != np.repeat(rep, rows, axis=1)[:, :t]).any(-1)
    if diff.any():
        hh, tt = (int(i) for i in np.argwhere(diff)[0])
        raise MsaError(f"{name}: {where((hh, tt))} selects other ids than "
                       f"{where((hh, tt - tt % rows))}, the first query of its block of {rows}; "
                       "the block's queries must select alike")
    m = np.zeros((h, rep.shape[1], n + 1), dtype=bool)
    np.put_along_axis(m, rep, True, axis=-1)
    return m[..., :n]


# FlashInfer BSR.

def _bsr_blocks(indptr: Any, indices: Any, mb: int, nb: int) -> Any:
    """indptr [MB+1] or [H, MB+1], indices [nnz] or [H, L] -> bool [H, MB, NB] (H = 1 for a
    shared matrix)."""
    np = _np()
    ip = _host(indptr, "indptr", (1, 2), "[MB + 1] or [H, MB + 1]")
    per_head = ip.ndim == 2
    ix = _host(indices, "indices", (2,) if per_head else (1,),
               "[H, L] with a per-head indptr [H, MB + 1]" if per_head else "[nnz]")
    if ip.shape[-1] != mb + 1:
        raise MsaError(f"indptr: must have MB + 1 = {mb + 1} entries per row (MB = ceil(num_q / "
                       f"R)), got shape {list(ip.shape)}")
    if per_head and ix.shape[0] != ip.shape[0]:
        raise MsaError(f"indices: must have H = {ip.shape[0]} rows like indptr, got shape "
                       f"{list(ix.shape)}")
    ip2, ix2 = ip.reshape(-1, mb + 1), ix.reshape(ip.shape[0] if per_head else 1, -1)
    label = (lambda h, i: f"indptr[{h}, {i}]") if per_head else (lambda h, i: f"indptr[{i}]")
    sel = np.zeros((ip2.shape[0], mb, nb + 1), dtype=bool)
    for h in range(ip2.shape[0]):
        p, cols = ip2[h], ix2[h]
        _check_offsets(p, "indptr", lambda i, h=h: label(h, i))
        nnz = int(p[-1])
        if (nnz != cols.shape[0]) if not per_head else (nnz > cols.shape[0]):
            raise MsaError(f"indices: {label(h, mb)} = {nnz} entries are listed, but indices "
                           f"{'row ' + str(h) + ' ' if per_head else ''}has {cols.shape[0]}")
        cols = cols[:nnz]
        bad = np.flatnonzero((cols < 0) | (cols >= nb))
        if bad.size:
            i = int(bad[0])
            at = f"indices[{h}, {i}]" if per_head else f"indices[{i}]"
            raise MsaError(f"indices: {at} = {int(cols[i])} is outside [0, NB = {nb}) "
                           "(NB = ceil(num_kv / C))")
        row = np.repeat(np.arange(mb), np.diff(p))
        counts = np.bincount(row * (nb + 1) + cols, minlength=mb * (nb + 1))
        twice = np.flatnonzero(counts > 1)
        if twice.size:
            r, c = divmod(int(twice[0]), nb + 1)
            raise MsaError(f"indices: block row {r}{f' of head {h}' if per_head else ''} lists "
                           f"column block {c} twice")
        sel[h] = counts.reshape(mb, nb + 1) > 0
    return sel[..., :nb]


def _bsr_q2k(indptr, indices, R, C, num_q, num_kv, num_kv_heads, kv_block_size, kv_block_lens,
             topk) -> tuple:
    """The numpy work of bsr_to_q2k: (q2k int32 [Hkv, num_q, topk], kv_block_size)."""
    check_arrays(indptr=indptr, indices=indices, kv_block_lens=kv_block_lens)
    R, C = count(R, "R", lo=1), count(C, "C", lo=1)
    num_q, num_kv = count(num_q, "num_q"), count(num_kv, "num_kv")
    mb, nb = _cdiv(num_q, R), _cdiv(num_kv, C)
    sel = _kv_heads(_bsr_blocks(indptr, indices, mb, nb), num_kv_heads, "indptr",
                    lambda p: f"block row {p[0]}, column block {p[1]}")
    return _blocks_q2k(sel, R, C, num_q, num_kv, kv_block_size, kv_block_lens, topk)


def _blocks_q2k(sel, R, C, num_q, num_kv, kv_block_size, kv_block_lens, topk) -> tuple:
    """A checked block pattern sel bool [Hkv, MB, NB] (column blocks of C over num_kv keys) ->
    (q2k int32 [Hkv, num_q, topk], kv_block_size), each block row repeated for its R queries."""
    np = _np()
    nb = sel.shape[-1]
    valid = None
    if kv_block_lens is not None:
        lens = _host(kv_block_lens, "kv_block_lens", (1,), "[NB] (1 dim)")
        if lens.shape[0] != nb:
            raise MsaError(f"kv_block_lens: must have NB = ceil(num_kv / C) = {nb} entries, got "
                           f"{lens.shape[0]}")
        bad = np.flatnonzero((lens < 1) | (lens > C))
        if bad.size:
            i = int(bad[0])
            raise MsaError(f"kv_block_lens: kv_block_lens[{i}] = {int(lens[i])} is outside "
                           f"[1, C = {C}]")
        keys = np.arange(num_kv)
        valid = keys % C < lens[keys // C]
        if valid.all():
            valid = None
    s = _block_size(kv_block_size, C) if valid is None else \
        (1 if kv_block_size is None else _block_size(kv_block_size, C))

    def fail(pos):
        h, r, j = pos
        raise MsaError(f"kv_block_size: {s} cannot express the keys of block row {r} (kv head "
                       f"{h}): msa block {j} (keys {j * s}..{min((j + 1) * s, num_kv) - 1}) is "
                       "partly selected; key ids (kv_block_size=1, in a q2k) express it")

    if valid is None:
        sel_s = _regrain(sel, C, s, num_kv, fail)
    else:
        keys_sel = _regrain(sel, C, 1, num_kv, fail) & valid
        sel_s = _regrain(keys_sel, 1, s, num_kv, fail)
    rows = _mask_to_ids(sel_s, topk)
    return np.ascontiguousarray(np.repeat(rows, R, axis=1)[:, :num_q]), s


def bsr_to_q2k(indptr: Any, indices: Any, *, R: int, C: int, num_q: int, num_kv: int,
               num_kv_heads: Optional[int] = None, kv_block_size: Optional[int] = None,
               kv_block_lens: Any = None, topk: Optional[int] = None) -> Q2KSelection:
    """A FlashInfer BSR matrix as an msa selection for one request: a `Q2KSelection` (q2k int32
    ``[Hkv, num_q, topk]``, kv_block_size).

    The matrix is FlashInfer's (``BlockSparseAttentionWrapper.plan``): queries in blocks of R
    rows, keys in blocks of C, ``MB = ceil(num_q / R)`` block rows and ``NB = ceil(num_kv / C)``
    column blocks (the last ones may be short); block row r lists its column blocks in
    ``indices[indptr[r]:indptr[r+1]]``. Query t attends the keys of the blocks listed for block
    row ``t // R``, and (with kv_block_lens) only the first ``kv_block_lens[c]`` keys of block c.

    - indptr: ``[MB + 1]`` integers from 0, non-decreasing; indices ``[nnz]`` with ``nnz =
      indptr[MB]``, each in ``[0, NB)``, in any order, none repeated in a row. Per-head
      matrices: indptr ``[H, MB + 1]`` and indices ``[H, L]`` (head h's entries first).
    - num_kv_heads: a shared matrix serves every kv head (default 1); a per-head one has H =
      Hkv (the default), or H = Hq with Hkv dividing it, when the G = H / Hkv heads of each
      group list the same blocks.
    - kv_block_size: msa's block size for the ids. Default: 128 or 64 when it divides C (block
      ids), else 1 (key ids: every key of each listed block, up to num_kv); 1 too when
      kv_block_lens shortens a block that holds keys. An explicit value must express the
      selection exactly (each of its blocks wholly selected or not).
    - topk: the q2k width, default the widest row (at least 1). Rows are ascending, -1 padded.

    Pass the result to ``attention_forward(..., q2k=sel.q2k, kv_block_size=sel.kv_block_size)``
    with FlashInfer's ``causal``. Errors (wrong rank or dtype, ids out of range, a non-monotone
    indptr, R or C < 1, groups that differ) raise `MsaError` naming the argument.
    """
    q2k, s = _bsr_q2k(indptr, indices, R, C, num_q, num_kv, num_kv_heads, kv_block_size,
                      kv_block_lens, topk)
    return Q2KSelection(_like(indptr, q2k), s)


# FlashInfer's per-head block-sparse forms: a block mask, or direct per-head selections.

def _bsr_mask_blocks(block_mask: Any, mb: int, nb: int) -> Any:
    """block_mask bool [H, MB, NB] -> a host bool array of that shape."""
    a = _read(block_mask, "block_mask")
    if a.dtype.kind != "b":
        raise MsaError(f"block_mask: must be a bool array, got {a.dtype}")
    if a.ndim != 3 or a.shape[1:] != (mb, nb):
        raise MsaError(f"block_mask: must be [H, MB, NB] = [H, {mb}, {nb}] (MB = ceil(num_q / "
                       f"R), NB = ceil(num_kv / C)), got shape {list(a.shape)}")
    return a.astype(bool)


def _q2k_indices_blocks(q2k_indices: Any, q2k_num: Any, mb: int, nb: int) -> Any:
    """q2k_indices [H, MB, K] and q2k_num [H, MB] (or None: all K entries) -> bool
    [H, MB, NB]."""
    np = _np()
    ix = _host(q2k_indices, "q2k_indices", (3,), "[H, MB, K] (3 dims)")
    h, rows, k = ix.shape
    if rows != mb:
        raise MsaError(f"q2k_indices: must be [H, MB, K] with MB = ceil(num_q / R) = {mb}, got "
                       f"shape {list(ix.shape)}")
    if q2k_num is None:
        num = np.full((h, mb), k, np.int64)
    else:
        num = _host(q2k_num, "q2k_num", (2,), "[H, MB] (2 dims)")
        if num.shape != (h, mb):
            raise MsaError(f"q2k_num: must be [H, MB] = {[h, mb]} like q2k_indices, got shape "
                           f"{list(num.shape)}")
        bad = np.argwhere((num < 0) | (num > k))
        if bad.size:
            hh, r = (int(i) for i in bad[0])
            raise MsaError(f"q2k_num: q2k_num[{hh}, {r}] = {int(num[hh, r])} is outside "
                           f"[0, K = {k}] (K = q2k_indices.shape[2])")
    listed = np.arange(k) < num[..., None]
    bad = np.argwhere(listed & ((ix < 0) | (ix >= nb)))
    if bad.size:
        hh, r, j = (int(i) for i in bad[0])
        raise MsaError(f"q2k_indices: q2k_indices[{hh}, {r}, {j}] = {int(ix[hh, r, j])} is "
                       f"outside [0, NB = {nb}) (NB = ceil(num_kv / C)); entries at and past "
                       "q2k_num are ignored, so pad rows through q2k_num, not with -1")
    cols = np.where(listed, ix, nb)
    srt = np.sort(cols, axis=-1)
    twice = np.argwhere((srt[..., 1:] == srt[..., :-1]) & (srt[..., 1:] < nb))
    if twice.size:
        hh, r, j = (int(i) for i in twice[0])
        raise MsaError(f"q2k_indices: block row {r} of head {hh} lists column block "
                       f"{int(srt[hh, r, j])} twice")
    sel = np.zeros((h, mb, nb + 1), dtype=bool)
    np.put_along_axis(sel, cols, True, axis=-1)
    return sel[..., :nb]


def _per_head_q2k(blocks, name, R, C, num_q, num_kv, num_kv_heads, kv_block_size,
                  kv_block_lens, topk) -> tuple:
    """A per-head pattern `blocks(mb, nb)` -> bool [H, MB, NB] through its heads' rules to
    (q2k, kv_block_size)."""
    check_arrays(kv_block_lens=kv_block_lens)
    R, C = count(R, "R", lo=1), count(C, "C", lo=1)
    num_q, num_kv = count(num_q, "num_q"), count(num_kv, "num_kv")
    mb, nb = _cdiv(num_q, R), _cdiv(num_kv, C)
    sel = _kv_heads(blocks(mb, nb), num_kv_heads, name,
                    lambda p: f"block row {p[0]}, column block {p[1]}")
    return _blocks_q2k(sel, R, C, num_q, num_kv, kv_block_size, kv_block_lens, topk)


def bsr_mask_to_q2k(block_mask: Any, *, R: int, C: int, num_q: int, num_kv: int,
                    num_kv_heads: Optional[int] = None, kv_block_size: Optional[int] = None,
                    kv_block_lens: Any = None, topk: Optional[int] = None) -> Q2KSelection:
    """FlashInfer's per-head block mask (``BlockSparseAttentionWrapper.plan(block_mask=)``) as
    an msa selection for one request: a `Q2KSelection` (q2k int32 ``[Hkv, num_q, topk]``,
    kv_block_size). Not to be confused with `block_mask_to_q2k`, which takes a Flex
    ``BlockMask``.

    block_mask: bool ``[H, MB, NB]`` (MB = ceil(num_q / R) block rows of R queries, NB =
    ceil(num_kv / C) column blocks of C keys, the last ones may be short); ``block_mask[h, i,
    j]`` means block row i of head h attends column block j. H is 1 (one pattern for every kv
    head, num_kv_heads default 1), Hkv, or Hq with Hkv dividing it, when the G = H / Hkv query
    heads of each group have the same pattern (FlashInfer reads the group's first head; msa
    checks that they agree). kv_block_lens, kv_block_size and topk are as in `bsr_to_q2k`: the
    result equals ``bsr_to_q2k`` of the same pattern as indptr / indices. A non-bool mask, a
    wrong shape or groups that differ raise `MsaError` naming the argument.
    """
    return Q2KSelection(*_like_first(block_mask, _per_head_q2k(
        lambda mb, nb: _bsr_mask_blocks(block_mask, mb, nb), "block_mask", R, C, num_q, num_kv,
        num_kv_heads, kv_block_size, kv_block_lens, topk)))


def q2k_indices_to_q2k(q2k_indices: Any, q2k_num: Any = None, *, R: int, C: int, num_q: int,
                       num_kv: int, num_kv_heads: Optional[int] = None,
                       kv_block_size: Optional[int] = None, kv_block_lens: Any = None,
                       topk: Optional[int] = None) -> Q2KSelection:
    """FlashInfer's direct per-head selections (``BlockSparseAttentionWrapper.plan(
    q2k_indices=, q2k_num=)``) as an msa selection for one request: a `Q2KSelection` (q2k
    int32 ``[Hkv, num_q, topk]``, kv_block_size).

    q2k_indices: integers ``[H, MB, K]`` (MB = ceil(num_q / R) block rows of R queries): block
    row i of head h attends column blocks (of C keys, NB = ceil(num_kv / C)) ``q2k_indices[h,
    i, :q2k_num[h, i]]``, in any order, none repeated, each in ``[0, NB)``. q2k_num: integers
    ``[H, MB]`` in ``[0, K]``; entries at and past it are ignored (any value). Without q2k_num
    every row lists all K entries (so -1 is not padding: it is out of range). Heads as in
    `bsr_mask_to_q2k` (FlashInfer's H is Hq; groups must list the same set of blocks, in any
    order). kv_block_lens, kv_block_size and topk are as in `bsr_to_q2k`; the result equals
    ``bsr_to_q2k`` of the same pattern. Errors (wrong rank or dtype, an id out of range, a
    repeated id, a q2k_num entry outside [0, K], groups that differ) raise `MsaError` naming
    the argument.
    """
    check_arrays(q2k_num=q2k_num)
    return Q2KSelection(*_like_first(q2k_indices, _per_head_q2k(
        lambda mb, nb: _q2k_indices_blocks(q2k_indices, q2k_num, mb, nb), "q2k_indices", R, C,
        num_q, num_kv, num_kv_heads, kv_block_size, kv_block_lens, topk)))


def _like_first(ref: Any, res: tuple) -> tuple:
    return (_like(ref, res[0]),) + tuple(res[1:])


def _q2k_bsr(q2k_np: Any, R: int, kv_block_size: int, num_kv: int, C: Optional[int],
             per_head: bool, name: str) -> tuple:
    """The numpy work of q2k_to_bsr on a checked int64 q2k [Hkv, num_q, topk]."""
    np = _np()
    R = count(R, "R", lo=1)
    s = _known_block_size(kv_block_size)
    num_kv = count(num_kv, "num_kv")
    if C is None:
        if s == 1:
            raise MsaError("C: required with key ids (kv_block_size = 1)")
        C = s
    C = count(C, "C", lo=1)
    hkv, num_q, _ = q2k_np.shape
    n_s = _cdiv(num_kv, s)
    where = (lambda p: f"kv head {p[0]}, query {p[1]}" + (f", slot {p[2]}" if len(p) > 2 and
                                                          p[2] >= 0 else ""))
    srt = _check_ids(q2k_np, n_s, name, where, f"blocks of {s} keys" if s > 1 else "keys")
    sel = _rows_of_blocks(srt, R, n_s, name, where)

    def fail(pos):
        h, r, c = pos
        raise MsaError(f"{name}: the keys that block row {r} selects (kv head {h}) cover part of "
                       f"column block {c} (keys {c * C}..{min((c + 1) * C, num_kv) - 1}); a BSR "
                       f"row lists whole blocks of C = {C} keys")

    blocks = _regrain(sel, s, C, num_kv, fail)
    if not per_head:
        diff = np.argwhere(blocks != blocks[:1])
        if diff.size:
            h, r, c = (int(i) for i in diff[0])
            raise MsaError(f"{name}: kv heads 0 and {h} select different blocks in block row {r} "
                           f"(column block {c}); one BSR matrix serves every head alike: pass "
                           "per_head=True for one matrix per kv head")
        counts = blocks[0].sum(-1)
        indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        return indptr, np.nonzero(blocks[0])[1].astype(np.int32)
    counts = blocks.sum(-1)
    indptr = np.concatenate([np.zeros((hkv, 1), np.int64), np.cumsum(counts, -1)], -1)
    width = int(indptr[:, -1].max(initial=0))
    indices = np.full((hkv, width), -1, np.int32)
    for h in range(hkv):
        cols = np.nonzero(blocks[h])[1]
        indices[h, :cols.size] = cols
    return indptr.astype(np.int32), indices


def q2k_to_bsr(q2k: Any, *, R: int, kv_block_size: int, num_kv: int, C: Optional[int] = None,
               per_head: bool = False) -> tuple:
    """An msa selection of one request as a FlashInfer BSR matrix: ``(indptr, indices)`` int32.

    q2k: int32 ``[Hkv, num_q, topk]`` of ids in blocks of kv_block_size (64, 128, or 1 for key
    ids) over num_kv keys; -1 slots and any order are allowed, repeats are not. Queries are cut
    into block rows of R (``MB = ceil(num_q / R)``); every query of a block row must select the
    same ids. Keys are cut into column blocks of C (default kv_block_size; required for key
    ids): the keys a row selects must be whole column blocks (the last one ending at num_kv).

    Returns indptr ``[MB + 1]`` and indices ``[nnz]`` (each row ascending), which needs every kv
    head to select alike; with ``per_head=True``, indptr ``[Hkv, MB + 1]`` and indices
    ``[Hkv, max_nnz]`` (head h's entries first, -1 after). A block row, head or column block
    that breaks a rule raises `MsaError` naming it.
    """
    q = _host(q2k, "q2k", (3,), "[Hkv, num_q, topk] (3 dims)", i32=True)
    indptr, indices = _q2k_bsr(q, R, kv_block_size, num_kv, C, per_head, "q2k")
    return _like(q2k, indptr), _like(q2k, indices)


def _k2q_size(kv_block_size: Optional[int], C: int) -> int:
    """The kv block size of a k2q index for column blocks of C: 64 or 128."""
    if kv_block_size is not None:
        s = count(kv_block_size, "kv_block_size", lo=1)
        if s not in (64, 128):
            raise MsaError(f"kv_block_size: the k2q index takes 64 or 128, got {s}")
        return s
    s = _block_size(None, C)
    if s == 1:
        raise MsaError(f"C: the k2q index needs kv blocks of 64 or 128 keys, and C = {C} is not a "
                       "multiple of 64; bsr_to_q2k expresses such a matrix in key ids")
    return s


def bsr_to_k2q(indptr: Any, indices: Any, *, R: int, C: int, num_q: int, num_kv: int,
               num_kv_heads: Optional[int] = None, kv_block_size: Optional[int] = None,
               kv_block_lens: Any = None) -> K2QIndex:
    """A FlashInfer BSR matrix as msa's k2q CSR index of one request: ``K2QIndex(row_ptr
    [Hkv, nblk + 1], q_idx [Hkv, num_q * topk])`` without a schedule, as `msa.q2k_to_k2q`
    gives it for ``bsr_to_q2k``'s selection (same arguments and rules).

    The k2q index counts keys in blocks of 64 or 128: kv_block_size is one of them, by default
    128 or 64 when it divides C; any other C (and a kv_block_lens that shortens a block) is an
    error naming it.
    """
    s = _k2q_size(kv_block_size, count(C, "C", lo=1))
    q2k, s = _bsr_q2k(indptr, indices, R, C, num_q, num_kv, num_kv_heads, s, kv_block_lens, None)
    np = _np()
    k2q = q2k_to_k2q(q2k, np.array([0, num_q], np.int32),
                     cu_seqlens_k=np.array([0, num_kv], np.int32), kv_block_size=s)
    return K2QIndex(_like(indptr, k2q.row_ptr), _like(indptr, k2q.q_idx))


def k2q_to_bsr(k2q: Sequence[Any], *, R: int, kv_block_size: int, num_q: int, num_kv: int,
               C: Optional[int] = None, per_head: bool = False) -> tuple:
    """msa's k2q CSR index of one request (``(row_ptr, q_idx[, schedule])`` over num_q queries
    and num_kv keys in blocks of kv_block_size, 64 or 128) as a FlashInfer BSR matrix
    ``(indptr, indices)``, through `msa.k2q_to_q2k` and the rules of `q2k_to_bsr`."""
    np = _np()
    check_sequence(k2q, "k2q", "(row_ptr, q_idx[, schedule])", (2, 3))
    if kv_block_size is None:
        raise MsaError("kv_block_size: required (64 or 128)")
    s = _k2q_size(kv_block_size, 64)
    num_q, num_kv = count(num_q, "num_q"), count(num_kv, "num_kv")
    row_ptr = _host(k2q[0], "row_ptr", (2,), "[Hkv, total_rows + 1] (2 dims)", i32=True)
    q_idx = _host(k2q[1], "q_idx", (2,), "[Hkv, num_q * topk] (2 dims)", i32=True)
    # topk: the most blocks any query is listed in (k2q_to_q2k checks the index itself).
    widest = 1
    for h in range(min(row_ptr.shape[0], q_idx.shape[0])):
        used = q_idx[h, :max(0, min(int(row_ptr[h, -1]), q_idx.shape[1]))]
        used = used[(used >= 0) & (used < num_q)]
        widest = max(widest, int(np.bincount(used).max(initial=0)) if used.size else 0)
    q2k = k2q_to_q2k((row_ptr.astype(np.int32), q_idx.astype(np.int32)),
                     np.array([0, num_q], np.int32), topk=widest,
                     cu_seqlens_k=np.array([0, num_kv], np.int32), kv_block_size=s)
    indptr, indices = _q2k_bsr(q2k.astype(np.int64), R, s, num_kv, C, per_head, "k2q")
    return _like(k2q[0], indptr), _like(k2q[0], indices)


# PyTorch Flex attention BlockMask.

def _block_mask_class():
    try:
        from torch.nn.attention.flex_attention import BlockMask, noop_mask
    except ImportError as e:
        raise MsaError(f"block_mask: Flex attention's BlockMask needs torch >= 2.5 ({e})") \
            from None
    return BlockMask, noop_mask


def _ordered_blocks(num: Any, idx: Any, name: str, nb: int) -> Any:
    """A BlockMask's (num_blocks [B, H, QB], indices [B, H, QB, W]) -> bool [B, H, QB, NB]."""
    np = _np()
    n = _host(num, f"block_mask.{name}_num_blocks", (1, 2, 3), "[B, H, QB]")
    ind = _host(idx, f"block_mask.{name}_indices", (2, 3, 4), "[B, H, QB, KVB]")
    n = n.reshape((1,) * (3 - n.ndim) + n.shape)
    ind = ind.reshape((1,) * (4 - ind.ndim) + ind.shape)
    if n.shape != ind.shape[:3]:
        raise MsaError(f"block_mask: {name}_num_blocks {list(n.shape)} must match the first dims "
                       f"of {name}_indices {list(ind.shape)}")
    w = ind.shape[3]
    bad = np.argwhere((n < 0) | (n > w))
    if bad.size:
        p = tuple(int(i) for i in bad[0])
        raise MsaError(f"block_mask: {name}_num_blocks{list(p)} = {int(n[p])} is outside "
                       f"[0, {w}]")
    used = np.arange(w) < n[..., None]
    bad = np.argwhere(used & ((ind < 0) | (ind >= nb)))
    if bad.size:
        p = tuple(int(i) for i in bad[0])
        raise MsaError(f"block_mask: {name}_indices{list(p)} = {int(ind[p])} is outside "
                       f"[0, {nb}) (ceil(KV_LEN / KV_BLOCK_SIZE))")
    flat = np.where(used, ind, nb) + (nb + 1) * np.arange(n.size).reshape(n.shape)[..., None]
    counts = np.bincount(flat.ravel(), minlength=n.size * (nb + 1)).reshape(n.shape + (nb + 1,))
    twice = np.argwhere(counts[..., :nb] > 1)
    if twice.size:
        b, h, r, c = (int(i) for i in twice[0])
        raise MsaError(f"block_mask: {name}_indices lists kv block {c} twice for batch {b}, head "
                       f"{h}, q block {r}")
    return counts[..., :nb] > 0


class _Requests(NamedTuple):
    """How a BlockMask's batches map to msa's varlen requests."""

    lq: list   # queries per request
    lk: list   # keys per request
    batch: list  # the BlockMask batch each request reads (0 when it broadcasts)


def _requests(bmb: int, q_len: int, kv_len: int, cu_seqlens_q: Any,
              cu_seqlens_k: Any) -> _Requests:
    lq = [q_len] * bmb if cu_seqlens_q is None else _lengths(cu_seqlens_q, "cu_seqlens_q")
    nreq = len(lq)
    lk = [kv_len] * nreq if cu_seqlens_k is None else _lengths(cu_seqlens_k, "cu_seqlens_k")
    if len(lk) != nreq:
        raise MsaError(f"cu_seqlens_k: must have {nreq + 1} entries like cu_seqlens_q, got "
                       f"{len(lk) + 1}")
    if bmb not in (1, nreq):
        raise MsaError(f"block_mask: batch dim {bmb} must be 1 or the {nreq} requests of "
                       "cu_seqlens_q")
    for name, lengths, limit, what in (("cu_seqlens_q", lq, q_len, "Q_LEN"),
                                       ("cu_seqlens_k", lk, kv_len, "KV_LEN")):
        for b, n in enumerate(lengths):
            if n > limit:
                raise MsaError(f"{name}: request {b} has {n} tokens, past the BlockMask's "
                               f"{what} = {limit}")
    return _Requests(lq, lk, [b if bmb > 1 else 0 for b in range(nreq)])


def _check_elements(bm: Any, partial: Any, full: Any, reqs: _Requests, qbs: int, kbs: int,
                    causal: bool, noop: Any) -> None:
    """Raises MsaError unless msa's rule (whole blocks, cut by the causal rule when `causal`)
    attends exactly the elements the BlockMask attends: full blocks whole, partial blocks where
    mask_mod is True. Only queries and keys inside each request count."""
    np = _np()
    import torch
    first = {True: None, False: None}  # the first element each rule gets wrong
    device = bm.kv_indices.device
    for b, (lq, lk, bb) in enumerate(zip(reqs.lq, reqs.lk, reqs.batch)):
        qb, kb, off = _cdiv(lq, qbs), _cdiv(lk, kbs), lk - lq
        last_key = np.minimum((np.arange(kb) + 1) * kbs, lk) - 1
        hidden = last_key[None, :] > (np.arange(qb) * qbs)[:, None] + off  # [QB, KB]
        f = full[bb, :, :qb, :kb]
        bad = np.argwhere(f & hidden[None])
        if bad.size and first[True] is None:
            h, r, c = (int(i) for i in bad[0])
            first[True] = (f"full block (batch {bb}, head {h}, q block {r}, kv block {c}) of "
                           f"request {b} attends keys that causal=True hides (query {r * qbs} "
                           f"sees keys up to {r * qbs + off}; the block ends at key "
                           f"{last_key[c]})")
        coords = np.argwhere(partial[bb, :, :qb, :kb])
        if not coords.size:
            continue
        chunk = max(1, _EVAL_ELEMENTS // (qbs * kbs))
        for start in range(0, coords.shape[0], chunk):
            h, r, c = coords[start:start + chunk].T
            qi = r[:, None] * qbs + np.arange(qbs)
            ki = c[:, None] * kbs + np.arange(kbs)
            valid = (qi < lq)[:, :, None] & (ki < lk)[:, None, :]
            if bm.mask_mod is noop:
                got = np.ones(valid.shape, dtype=bool)
            else:
                t = (lambda a: torch.as_tensor(a, device=device))
                try:
                    # Flex calls mask_mod with the query's batch: request b.
                    res = bm.mask_mod(t(np.full((len(h), 1, 1), b)), t(h[:, None, None]),
                                      t(qi[:, :, None]), t(ki[:, None, :]))
                    got = torch.broadcast_to(torch.as_tensor(res, dtype=torch.bool),
                                             valid.shape).cpu().numpy()
                except Exception as e:  # noqa: BLE001 - any failure of the caller's function
                    raise MsaError(f"block_mask.mask_mod: evaluating it on the partial blocks "
                                   f"failed ({type(e).__name__}: {e}); msa calls it with "
                                   "broadcasting index tensors (b, h, q_idx, kv_idx)") from None
            vis = ki[:, None, :] <= qi[:, :, None] + off
            for rule, want in ((False, np.ones_like(vis)), (True, vis)):
                wrong = np.argwhere(valid & (got != want))
                if wrong.size and first[rule] is None:
                    p, i, j = (int(x) for x in wrong[0])
                    first[rule] = (
                        f"mask_mod {'masks' if want[p, i, j] else 'keeps'} query {qi[p, i]} / key "
                        f"{ki[p, j]} of request {b} (partial block: head {int(h[p])}, q block "
                        f"{int(r[p])}, kv block {int(c[p])}), which whole blocks with "
                        f"causal={rule} would {'attend' if want[p, i, j] else 'hide'}")
    if first[causal] is not None:
        hint = (f"; the mask matches causal={not causal}: pass that" if first[not causal] is None
                else "")
        raise MsaError(f"block_mask: msa attends whole blocks, cut only by the causal rule "
                       f"(bottom-right aligned per request), and cannot express this mask: "
                       f"{first[causal]}{hint}")


def block_mask_to_q2k(block_mask: Any, *, causal: bool, cu_seqlens_q: Any = None,
                      cu_seqlens_k: Any = None, num_kv_heads: Optional[int] = None,
                      kv_block_size: Optional[int] = None,
                      topk: Optional[int] = None) -> Q2KSelection:
    """A PyTorch Flex attention ``BlockMask`` as an msa selection: a `Q2KSelection` (q2k int32
    ``[Hkv, total_q, topk]`` on the mask's device, kv_block_size).

    A query's selection is the union of its q block's partial (``kv_num_blocks``,
    ``kv_indices``) and full (``full_kv_num_blocks``, ``full_kv_indices``) kv blocks. msa
    attends whole blocks, cut only by its causal rule, so the conversion is exact or refused:
    with ``causal=False`` every partial block's mask_mod must keep all its elements (as
    ``noop_mask`` does); with ``causal=True`` mask_mod must keep exactly the causal elements of
    each partial block (query i of a request sees key j iff ``j <= i + Lk - Lq``: Flex's
    ``q_idx >= kv_idx`` when Q_LEN = KV_LEN), and no full block may cross the diagonal. The
    mask_mod is evaluated on the partial blocks' elements (with broadcasting index tensors; a
    mask of head dim 1 at head 0); any other element mask (sliding window, documents, ...)
    raises `MsaError` naming the first element msa would get wrong. Pass the same ``causal``
    to `attention_forward`.

    - Batches: request b of msa's varlen layout is BlockMask batch b (or batch 0 when the mask's
      batch dim is 1), with its first ``Lq_b`` queries and ``Lk_b`` keys. cu_seqlens_q
      (default: one request of Q_LEN queries per batch) and cu_seqlens_k (default: KV_LEN keys
      each) give the lengths, at most Q_LEN and KV_LEN. Blocks past a request's keys or queries
      hold none of its tokens and are left out.
    - Heads: the mask's head dim H is 1 (broadcast to num_kv_heads, default 1) or Hq, a
      multiple of num_kv_heads (default H) whose groups of G = H / Hkv heads select alike.
    - kv_block_size: as in `bsr_to_q2k` with C = KV_BLOCK_SIZE (default 128 or 64 when it
      divides it, else 1: key ids). Q_BLOCK_SIZE may be anything.
    - topk: the q2k width, default the widest row (at least 1).
    """
    np = _np()
    BlockMask, noop = _block_mask_class()
    if not isinstance(block_mask, BlockMask):
        raise MsaError(f"block_mask: expected a torch.nn.attention.flex_attention.BlockMask, got "
                       f"{type(block_mask).__name__}")
    if not isinstance(causal, bool):
        raise MsaError(f"causal: must be True or False, got {causal!r}")
    check_arrays(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    qbs, kbs = (count(v, f"block_mask.BLOCK_SIZE[{i}]", lo=1)
                for i, v in enumerate(block_mask.BLOCK_SIZE))
    q_len, kv_len = (count(v, f"block_mask.seq_lengths[{i}]")
                     for i, v in enumerate(block_mask.seq_lengths))
    nb = _cdiv(kv_len, kbs)
    partial = _ordered_blocks(block_mask.kv_num_blocks, block_mask.kv_indices, "kv", nb)
    full = np.zeros_like(partial)
    if block_mask.full_kv_num_blocks is not None:
        full = _ordered_blocks(block_mask.full_kv_num_blocks, block_mask.full_kv_indices,
                               "full_kv", nb)
        if full.shape[:3] != partial.shape[:3]:
            raise MsaError(f"block_mask: full_kv_num_blocks {list(full.shape[:3])} must match "
                           f"kv_num_blocks {list(partial.shape[:3])}")
        both = np.argwhere(full & partial)
        if both.size:
            b, h, r, c = (int(i) for i in both[0])
            raise MsaError(f"block_mask: kv block {c} is both partial and full for batch {b}, "
                           f"head {h}, q block {r}")
    if partial.shape[2] < _cdiv(q_len, qbs):
        raise MsaError(f"block_mask: kv_num_blocks has {partial.shape[2]} q blocks, fewer than "
                       f"ceil(Q_LEN / Q_BLOCK_SIZE) = {_cdiv(q_len, qbs)}")
    reqs = _requests(partial.shape[0], q_len, kv_len, cu_seqlens_q, cu_seqlens_k)
    s = _block_size(kv_block_size, kbs)
    _check_elements(block_mask, partial, full, reqs, qbs, kbs, causal, noop)

    # The selection of each request, its rows and columns past the request's tokens cleared.
    sel = partial | full
    region = np.zeros(sel.shape[2:], dtype=bool)
    per_req = []
    for lq, lk, bb in zip(reqs.lq, reqs.lk, reqs.batch):
        region[:] = False
        region[:_cdiv(lq, qbs), :_cdiv(lk, kbs)] = True
        per_req.append(sel[bb] & region)
    if not per_req:
        hkv = 1 if num_kv_heads is None else count(num_kv_heads, "num_kv_heads", lo=1)
        k = 1 if topk is None else count(topk, "topk", lo=1)
        return Q2KSelection(_like(block_mask.kv_indices, np.full((hkv, 0, k), -1, np.int32)), s)
    stacked = _kv_heads(np.stack(per_req, axis=1), num_kv_heads, "block_mask",
                        lambda p: f"request {p[0]}, q block {p[1]}, kv block {p[2]}")
    pieces = []
    for b, (lq, lk) in enumerate(zip(reqs.lq, reqs.lk)):
        def fail(pos, b=b, lk=lk):
            h, r, j = pos
            raise MsaError(f"kv_block_size: {s} cannot express q block {r} of request {b} (kv "
                           f"head {h}): msa block {j} (keys {j * s}..{min((j + 1) * s, lk) - 1}) "
                           "is partly selected; pass kv_block_size=1 (key ids) or leave it None")
        blocks = stacked[:, b, :_cdiv(lq, qbs), :_cdiv(lk, kbs)]
        pieces.append((_regrain(blocks, kbs, s, lk, fail), lq))
    widest = max((int(m.sum(-1).max(initial=0)) for m, _ in pieces), default=0)
    k = max(1, widest) if topk is None else count(topk, "topk", lo=1)
    rows = [np.repeat(_mask_to_ids(m, k), qbs, axis=1)[:, :lq] for m, lq in pieces]
    return Q2KSelection(_like(block_mask.kv_indices, np.concatenate(rows, axis=1)), s)


def _causal_mask_mod(offsets: Any) -> Callable:
    """msa's causal rule as a Flex mask_mod: query q_idx of batch b sees key kv_idx iff
    kv_idx <= q_idx + Lk_b - Lq_b."""

    def msa_causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + offsets[b]

    return msa_causal


def q2k_to_block_mask(q2k: Any, *, cu_seqlens_q: Any, kv_block_size: int, causal: bool,
                      q_block_size: int = 128, mask_kv_block_size: Optional[int] = None,
                      num_q_heads: Optional[int] = None, seq_len_kv: Optional[int] = None,
                      cu_seqlens_k: Any = None) -> Any:
    """An msa selection as a PyTorch Flex attention ``BlockMask`` (on q2k's device for torch,
    else the CPU), which attends what ``attention_forward(..., q2k=q2k, causal=causal)`` does.

    - q2k: int32 ``[Hkv, total_q, topk]``, ids in blocks of kv_block_size (64, 128, or 1 for
      key ids), -1 slots and any order allowed; cu_seqlens_q ``[B+1]`` splits it into requests.
      Request b is Flex batch b: its query i is row i (Q_LEN = the longest request).
    - Keys: cu_seqlens_k gives each request's keys; without it every request has seq_len_kv
      keys. KV_LEN is seq_len_kv, default the longest request.
    - Blocks: Q_BLOCK_SIZE = q_block_size; the queries of each q block of a request must select
      alike (else `MsaError` naming the query). KV_BLOCK_SIZE = mask_kv_block_size, default
      kv_block_size (required for key ids); the keys each q block selects must be whole kv
      blocks of that size (the last one ending at the request's last key).
    - Heads: the mask has H = num_q_heads (default Hkv) heads, each kv head's selection repeated
      for its G = H / Hkv query heads.
    - causal=False: every selected block is a full block and mask_mod is ``noop_mask``.
      causal=True: blocks the causal rule leaves whole are full, the others (including blocks
      it hides entirely) partial, under a mask_mod with msa's rule, ``kv_idx <= q_idx + Lk_b -
      Lq_b`` (Flex's ``q_idx >= kv_idx`` when the lengths are equal).

    `block_mask_to_q2k` with the same causal, lengths and kv_block_size gives q2k back.
    """
    np = _np()
    BlockMask, _ = _block_mask_class()
    import torch
    if not isinstance(causal, bool):
        raise MsaError(f"causal: must be True or False, got {causal!r}")
    check_arrays(cu_seqlens_k=cu_seqlens_k)
    q = _host(q2k, "q2k", (3,), "[Hkv, total_q, topk] (3 dims)", i32=True)
    hkv, total_q, _ = q.shape
    s = _known_block_size(kv_block_size)
    if mask_kv_block_size is None and s == 1:
        raise MsaError("mask_kv_block_size: required with key ids (kv_block_size = 1)")
    kbs = s if mask_kv_block_size is None else count(mask_kv_block_size, "mask_kv_block_size",
                                                     lo=1)
    qbs = count(q_block_size, "q_block_size", lo=1)
    heads = hkv if num_q_heads is None else count(num_q_heads, "num_q_heads", lo=1)
    if heads % hkv:
        raise MsaError(f"num_q_heads: {heads} must be a multiple of q2k's {hkv} kv heads")
    lq = _lengths(cu_seqlens_q, "cu_seqlens_q", total_q)
    if cu_seqlens_k is not None:
        lk = _lengths(cu_seqlens_k, "cu_seqlens_k")
        if len(lk) != len(lq):
            raise MsaError(f"cu_seqlens_k: must have {len(lq) + 1} entries like cu_seqlens_q, "
                           f"got {len(lk) + 1}")
    elif seq_len_kv is None:
        raise MsaError("seq_len_kv: required without cu_seqlens_k (every request then has "
                       "seq_len_kv keys)")
    else:
        lk = [count(seq_len_kv, "seq_len_kv")] * len(lq)
    kv_len = max(lk, default=0) if seq_len_kv is None else count(seq_len_kv, "seq_len_kv")
    if lk and max(lk) > kv_len:
        raise MsaError(f"seq_len_kv: {kv_len} is less than the {max(lk)} keys of the longest "
                       "request")
    q_len = max(lq, default=0)
    nqb, nb = _cdiv(q_len, qbs), _cdiv(kv_len, kbs)
    dense = np.zeros((len(lq), hkv, nqb, nb), dtype=bool)
    start = 0
    for b, (nq, nk) in enumerate(zip(lq, lk)):
        n_s = _cdiv(nk, s)
        where = (lambda p, b=b, start=start: f"kv head {p[0]}, query {start + p[1]} (request {b}"
                 + (f", slot {p[2]})" if len(p) > 2 and p[2] >= 0 else ")"))
        srt = _check_ids(q[:, start:start + nq], n_s, "q2k", where,
                         f"blocks of {s} keys in request {b}" if s > 1 else
                         f"keys in request {b}")
        sel = _rows_of_blocks(srt, qbs, n_s, "q2k", where)

        def fail(pos, b=b, nk=nk):
            h, r, c = pos
            raise MsaError(f"q2k: the keys that q block {r} of request {b} selects (kv head {h}) "
                           f"cover part of kv block {c} (keys {c * kbs}.."
                           f"{min((c + 1) * kbs, nk) - 1}); a BlockMask lists whole blocks of "
                           f"{kbs} keys")
        blocks = _regrain(sel, s, kbs, nk, fail)
        dense[b, :, :blocks.shape[1], :blocks.shape[2]] = blocks
        start += nq
    dense = np.repeat(dense, heads // hkv, axis=1)
    if causal:
        off = np.array(lk, dtype=np.int64) - np.array(lq, dtype=np.int64)
        last_key = np.minimum((np.arange(nb) + 1) * kbs, np.array(lk)[:, None]) - 1  # [B, NB]
        whole = last_key[:, None, :] <= (np.arange(nqb) * qbs)[None, :, None] + \
            off[:, None, None]  # [B, QB, NB]
        full, partial = dense & whole[:, None], dense & ~whole[:, None]
    else:
        full, partial = dense, np.zeros_like(dense)
    device = q2k.device if framework(q2k) == "torch" else torch.device("cpu")

    def ordered(m):
        num = torch.from_numpy(m.sum(-1).astype(np.int32)).to(device)
        idx = np.argsort(~m, axis=-1, kind="stable").astype(np.int32)
        return num, torch.from_numpy(np.ascontiguousarray(idx)).to(device)

    kv_num, kv_idx = ordered(partial)
    full_num, full_idx = ordered(full)
    mask_mod = None
    if causal:
        mask_mod = _causal_mask_mod(torch.from_numpy(off).to(device))
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=(qbs, kbs),
                                    mask_mod=mask_mod, seq_lengths=(q_len, kv_len))


__all__ = ["Q2KSelection", "block_mask_to_q2k", "bsr_mask_to_q2k", "bsr_to_k2q", "bsr_to_q2k",
           "k2q_to_bsr", "q2k_indices_to_q2k", "q2k_to_block_mask", "q2k_to_bsr"]
