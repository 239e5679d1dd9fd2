"""Input builders of token-sparse attention (seed 002's ``token_sparse_kv_indices`` and
``group_union_masks``; docs/python.md, Token-sparse inputs): from each query row's selected key
positions (a DeepSeek-style indexer's ``token_topk`` output, ``-1`` padded), the K/V cache slots
of those keys, or a group of consecutive query rows' union of keys with each row's mask over it
(the inputs of masked dense attention over the gathered union).

int32 arrays on a CUDA device run the CUDA op (src/cuda/common/token_sparse_slots.cu,
group_union.cu) on the caller's stream: no host copy, no wait; value errors go to the device
status (``check=True`` waits and raises, else `msa.check_status`). Everything else runs on the
host with numpy, like the converters (sparse_convert.py): arrays on a GPU of another dtype are
copied to the host first (which waits for their stream), and the results are arrays of the
input's framework on its device."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from . import _C
from ._arrays import dtype_of, empty, framework, is_cuda, shape_of
from ._runtime import MsaError, arg, compiling, count, finish, status_for, stream_of
from .sparse_convert import _cdiv, _check_ids, _check_offsets, _host, _like, _np


class GroupUnion(NamedTuple):
    """`group_union_masks`' result. ``union`` int32 ``[..., num_groups, U]``: each group's
    distinct key positions, ascending, ``-1`` padded; ``union_lens`` int32 ``[...,
    num_groups]``; ``group_rows`` int32 ``[num_groups + 1]``: group g is query rows
    ``[group_rows[g], group_rows[g + 1])``; ``mask`` ``[..., rows, U]`` bool (or uint8
    ``[..., rows, ceil(U / 8)]``, bit ``i % 8`` of byte ``i // 8``, with ``packed=True``): row
    t's entry i is set iff row t selected ``union[group of t, i]``."""

    union: Any
    union_lens: Any
    group_rows: Any
    mask: Any


def _on_cuda(*arrays: Any) -> bool:
    """True when every array given (None skipped) is int32 on a CUDA device: the CUDA op's
    inputs. Other dtypes (which the CUDA op does not take) and host arrays keep the numpy path."""
    given = [x for x in arrays if x is not None]
    try:  # a non-array (a list) is not on a device: the host path names it
        return all(is_cuda(x) and dtype_of(x) == "i32" for x in given)
    except (AttributeError, TypeError, BufferError):
        return False


def _contiguous(x: Any) -> Any:
    """torch tensors made contiguous (the C++ op takes contiguous index arrays); others as they
    are (a strided one is then an MsaError naming it)."""
    return x.contiguous() if x is not None and framework(x) == "torch" else x


def _positions(positions: Any, n: int, unit: str) -> Any:
    """positions as host int64 [..., rows, K] (2 or 3 dims), each row -1 or distinct positions in
    [0, n) (`unit` names the bound)."""
    p = _host(positions, "positions", (2, 3), "[rows, K] or [Hkv, rows, K]")
    _check_ids(p, n, "positions", lambda i: f"positions{list(i[:-1])}" + (
        "" if i[-1] < 0 else f" entry {i[-1]}"), unit)
    return p


def token_sparse_kv_indices(positions: Any, requests: Any, block_table: Any, page_size: int, *,
                            seq_lens: Any = None, stream: Any = None,
                            check: Optional[bool] = None) -> Any:
    """The paged K/V cache slots of the keys each query row selected.

    ``positions`` int ``[rows, K]`` (or ``[Hkv, rows, K]``): key positions in the row's request,
    ``-1`` for an unused entry, in any order, none repeated in a row; ``requests`` int
    ``[rows]``: row t's request; ``block_table`` int ``[B, W]``: the pages of each request, as
    paged attention takes it; ``seq_lens`` int ``[B]`` (optional): positions must be below their
    request's length, else below ``W * page_size``. Returns int32 of positions' shape:
    ``block_table[b, p // page_size] * page_size + p % page_size`` for each position p of a row of
    request b (the key's slot in a pool of ``num_pages * page_size`` slots), ``-1`` where p is
    ``-1``. A position out of range, a repeat, a request outside ``[0, B)`` or a negative page id
    under a used position is an `MsaError` naming it: at once on the host; for int32 arrays on a
    CUDA device (the CUDA op, on `stream` or the current stream) through the device status, the
    first offence in that order (``check=True`` waits and raises)."""
    if _on_cuda(positions, requests, block_table, seq_lens):
        if compiling():  # an opaque node for torch.compile (its fake gives the shape)
            from . import _torch_ops
            return _torch_ops.token_sparse_kv_indices(positions, requests, block_table,
                                                      page_size, seq_lens, check, stream)
        return _kv_indices_cuda(positions, requests, block_table, page_size, seq_lens, stream,
                                check)
    np = _np()
    ps = count(page_size, "page_size", lo=1)
    table = _host(block_table, "block_table", (2,), "[B, W]")
    batch, width = table.shape
    p = _positions(positions, width * ps, f"block_table's {width} pages of {ps} slots")
    req = _host(requests, "requests", (1,), "[rows]")
    rows = p.shape[-2]
    if req.shape[0] != rows:
        raise MsaError(f"requests: must have one entry per row of positions ({rows}), "
                       f"got {req.shape[0]}")
    if rows and (req.min() < 0 or req.max() >= batch):
        t = int(np.argmax((req < 0) | (req >= batch)))
        raise MsaError(f"requests[{t}] = {int(req[t])}: must be in [0, {batch}) (the requests "
                       "of block_table)")
    if seq_lens is not None:
        lens = _host(seq_lens, "seq_lens", (1,), "[B]")
        if lens.shape[0] != batch:
            raise MsaError(f"seq_lens: must have one entry per request of block_table ({batch}), "
                           f"got {lens.shape[0]}")
        if batch and (lens.min() < 0 or lens.max() > width * ps):
            b = int(np.argmax((lens < 0) | (lens > width * ps)))
            raise MsaError(f"seq_lens[{b}] = {int(lens[b])}: must be in [0, {width * ps}] "
                           f"(block_table's {width} pages of {ps})")
        past = p >= lens[req][:, None]
        if past.any():
            i = tuple(int(x) for x in np.argwhere(past)[0])
            b = int(req[i[-2]])
            raise MsaError(f"positions{list(i)} = {int(p[i])}: at or past seq_lens[{b}] = "
                           f"{int(lens[b])}, the length of the row's request")
    used = p >= 0
    q = np.where(used, p, 0)
    page = table[np.broadcast_to(req[:, None], p.shape), q // ps]
    if (used & (page < 0)).any():
        i = tuple(int(x) for x in np.argwhere(used & (page < 0))[0])
        b, col = int(req[i[-2]]), int(q[i] // ps)
        raise MsaError(f"block_table[{b}, {col}] = {int(page[i])}: the page of positions"
                       f"{list(i)} = {int(p[i])} must be a page id >= 0")
    too_big = used & (page > (np.iinfo(np.int32).max - (ps - 1)) // ps)
    if too_big.any():
        i = tuple(int(x) for x in np.argwhere(too_big)[0])
        raise MsaError(f"block_table: page id {int(page[i])} x page_size {ps} does not fit an "
                       f"int32 slot index (positions{list(i)})")
    slots = np.where(used, page * ps + q % ps, -1)
    return _like(positions, slots.astype(np.int32))


def _kv_indices_cuda(positions, requests, block_table, page_size, seq_lens, stream, check) -> Any:
    ps = count(page_size, "page_size", lo=1)
    positions, requests, block_table, seq_lens = (_contiguous(x) for x in (
        positions, requests, block_table, seq_lens))
    out = empty(positions, shape_of(positions), "i32")
    st = stream_of(positions, stream)
    status = status_for(positions)
    _C.token_sparse_kv_indices(positions=arg(positions), requests=arg(requests),
                               block_table=arg(block_table), page_size=ps,
                               seq_lens=arg(seq_lens), slots=arg(out), status=status, stream=st)
    finish(status, st, check)
    return out


def group_union_masks(positions: Any, cu_seqlens_q: Any, group_size: int, *,
                      max_union: Optional[int] = None, packed: bool = False, stream: Any = None,
                      check: Optional[bool] = None) -> GroupUnion:
    """Groups of consecutive query rows, the union of the key positions each group selected, and
    each row's mask over its group's union: masked dense attention of a group's rows over the
    gathered union keys computes the token-sparse attention of ``positions``.

    ``positions`` int ``[rows, K]`` (or ``[Hkv, rows, K]``, one union per kv head): each row's
    key positions in its request, ``-1`` for unused entries, in any order, none repeated in a
    row; ``cu_seqlens_q`` int ``[B + 1]``: the requests' rows (``cu_seqlens_q[-1] = rows``);
    ``group_size`` >= 1: a request's rows form groups of ``group_size`` from its first row (its
    last group may be shorter; a group never spans two requests). U is the largest union, or
    ``max_union`` when given (at most ``group_size * K``; a larger union is then an
    `MsaError`). Returns a `GroupUnion`.

    int32 arrays on a CUDA device run the CUDA op (on `stream` or the current stream) without a
    host sync, so the sizes are capacities fixed from shapes: ``max_union`` is required (U), and
    the groups are ``G = min(rows, (rows + B * (group_size - 1)) // group_size)``, at least the
    groups there are (exact for g = 1, or rows a multiple of g per request); the groups past
    the last hold no row (``group_rows`` = rows, ``union_lens`` 0). Value errors (positions,
    cu_seqlens_q, a union larger than U: that group is written empty) go to the device status
    (``check=True`` waits and raises)."""
    if _on_cuda(positions, cu_seqlens_q):
        if compiling():
            from . import _torch_ops
            return GroupUnion(*_torch_ops.group_union_masks(
                positions, cu_seqlens_q, group_size, max_union, packed, check, stream))
        return _group_union_cuda(positions, cu_seqlens_q, group_size, max_union, packed, stream,
                                 check)
    np = _np()
    g = count(group_size, "group_size", lo=1)
    p = _positions(positions, np.iinfo(np.int32).max, "int32 key positions")
    cu = _host(cu_seqlens_q, "cu_seqlens_q", (1,), "[B + 1]")
    rows = p.shape[-2]
    if cu.shape[0] < 1:
        raise MsaError("cu_seqlens_q: must have B + 1 >= 1 entries")
    _check_offsets(cu, "cu_seqlens_q", lambda i: f"cu_seqlens_q[{i}]")
    if int(cu[-1]) != rows:
        raise MsaError(f"cu_seqlens_q[-1] = {int(cu[-1])}: must equal the rows of positions "
                       f"({rows})")
    starts = [s for b in range(cu.shape[0] - 1) for s in range(int(cu[b]), int(cu[b + 1]), g)]
    group_rows = np.array(starts + [rows], dtype=np.int64)
    heads = p.reshape((int(np.prod(p.shape[:-2])), rows, p.shape[-1]))
    unions = [[np.unique(x[x >= 0]) for x in (h[group_rows[i]:group_rows[i + 1]]
                                               for i in range(len(starts)))] for h in heads]
    largest = max((len(u) for hu in unions for u in hu), default=0)
    if max_union is not None:
        cap = count(max_union, "max_union", lo=0)
        if cap > g * p.shape[-1]:
            raise MsaError(f"max_union = {cap}: at most group_size x K = {g * p.shape[-1]}, "
                           "the largest union a group can have")
        if largest > cap:
            raise MsaError(f"max_union = {cap}: a group's union has {largest} keys")
        width = cap
    else:
        width = largest
    union = np.full((len(heads), len(starts), width), -1, dtype=np.int64)
    lens = np.zeros((len(heads), len(starts)), dtype=np.int64)
    mask = np.zeros((len(heads), rows, width), dtype=bool)
    for h, hu in enumerate(unions):
        for i, u in enumerate(hu):
            union[h, i, :len(u)] = u
            lens[h, i] = len(u)
            r0, r1 = int(group_rows[i]), int(group_rows[i + 1])
            if len(u):
                sel = heads[h, r0:r1]
                where = np.searchsorted(u, np.where(sel >= 0, sel, 0))
                rr = np.broadcast_to(np.arange(r1 - r0)[:, None], sel.shape)
                mask[h, r0 + rr[sel >= 0], where[sel >= 0]] = True
    lead = p.shape[:-2]
    union = union.reshape(lead + union.shape[1:]).astype(np.int32)
    lens = lens.reshape(lead + lens.shape[1:]).astype(np.int32)
    mask = mask.reshape(lead + mask.shape[1:])
    if packed:  # [..., rows, ceil(U / 8)]
        mask = np.packbits(mask, axis=-1, bitorder="little") if width else \
            np.zeros(mask.shape[:-1] + (_cdiv(width, 8),), dtype=np.uint8)
    return GroupUnion(_like(positions, union), _like(positions, lens),
                      _like(positions, group_rows.astype(np.int32)), _like(positions, mask))


def union_groups(rows: int, batch: int, g: int) -> int:
    """The CUDA op's group capacity: each request's last group may be short, so at most
    (rows + B (g - 1)) / g groups, and never more than rows."""
    return min(rows, (rows + batch * (g - 1)) // g)


def _group_union_cuda(positions, cu_seqlens_q, group_size, max_union, packed, stream,
                      check) -> GroupUnion:
    g = count(group_size, "group_size", lo=1)
    if max_union is None:
        raise MsaError("max_union: required for arrays on a CUDA device (U, the unions' width, "
                       "fixed without a host sync); at most group_size x K")
    cap = count(max_union, "max_union", lo=0)
    shape, cu_shape = shape_of(positions), shape_of(cu_seqlens_q)
    if len(shape) not in (2, 3):
        raise MsaError(f"positions: must be [rows, K] or [Hkv, rows, K], got {len(shape)} dims "
                       f"{list(shape)}")
    if len(cu_shape) != 1 or cu_shape[0] < 1:
        raise MsaError(f"cu_seqlens_q: must be [B + 1] with B + 1 >= 1 entries, got shape "
                       f"{list(cu_shape)}")
    lead, rows, k = shape[:-2], shape[-2], shape[-1]
    if cap > g * k:
        raise MsaError(f"max_union = {cap}: at most group_size x K = {g * k}, the largest union "
                       "a group can have")
    groups = union_groups(rows, cu_shape[0] - 1, g)
    positions, cu_seqlens_q = _contiguous(positions), _contiguous(cu_seqlens_q)
    union = empty(positions, lead + (groups, cap), "i32")
    lens = empty(positions, lead + (groups,), "i32")
    group_rows = empty(positions, (groups + 1,), "i32")
    mask = empty(positions, lead + (rows, _cdiv(cap, 8) if packed else cap),
                 "u8" if packed else "bool")
    st = stream_of(positions, stream)
    status = status_for(positions)
    _C.group_union_masks(positions=arg(positions), cu_seqlens_q=arg(cu_seqlens_q), group_size=g,
                         union_keys=arg(union), union_lens=arg(lens), group_rows=arg(group_rows),
                         mask=arg(mask), status=status, stream=st)
    finish(status, st, check)
    return GroupUnion(union, lens, group_rows, mask)
