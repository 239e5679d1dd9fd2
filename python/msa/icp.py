"""The ICP (index-context-parallel) indexer (docs/semantics.md, ICP indexer): the index keys of a
page pool sharded by context over ``world`` ranks. `icp_shard` cuts a rank's shard from an
unsharded pool; `icp_rank_lists` lists, per (selection head, token), a rank's best blocks from
its shard; the caller moves each owner the lists of its heads (an all-to-all over the ranks);
`icp_merge` turns the ranks' lists into the q2k rows `block_topk` gives on the unsharded pool.
`icp_exchange` is that all-to-all over ``torch.distributed`` and `icp_select` the three steps of
one rank."""

from __future__ import annotations

from typing import Any, Optional

from . import _C
from ._arrays import Typed
from ._kv import kv_heads_of
from ._runtime import (MsaError, allocator, arg, check_arrays, count, dims, finish, new_output,
                       status_for, stream_of)
from .quant import unpack

_PAGE_ROWS = {"p128": 128, "p256": 256}


def _rows(layout: str, world: int) -> int:
    if layout not in _PAGE_ROWS:
        raise MsaError(f'layout: must be "p128" or "p256", got {layout!r}')
    if world not in (2, 4):
        raise MsaError(f"world: must be 2 or 4, got {world!r}")
    return _PAGE_ROWS[layout] // world


def icp_shard(k: Any, *, layout: str = "p128", world: int = 2, rank: int = 0,
              k_scale: Any = None) -> tuple:
    """Rank ``rank``'s shard of an unsharded index key pool: ``(shard, shard_scale)``.

    ``k [num_pages, P, Hik, D]`` (paged_nhd, P = 128 for "p128", 256 for "p256"; an array or a
    `msa.typed` one). "p128": page row j goes to rank ``j % world`` at shard row ``j // world``;
    "p256": rank ``j // (256 // world)`` at row ``j % (256 // world)``. The shard is a new
    contiguous ``[num_pages, P // world, Hik, D]`` array of the same framework. ``k_scale``: FP8
    per-slot scales ``[num_pages * P]`` (or ``[.., Hik]``) move with their rows; a per-tensor
    scale is returned as it is, None stays None.
    """
    rows = _rows(layout, world)
    rank = count(rank, "rank")
    if rank >= world:
        raise MsaError(f"rank: must be in [0, world = {world}), got {rank}")
    values = k.array if isinstance(k, Typed) else k
    shape = dims(values, "k", 4, "[num_pages, P, Hik, D]")
    if shape[1] != _PAGE_ROWS[layout]:
        raise MsaError(f"k: page rows (dim 1) must be {_PAGE_ROWS[layout]} for layout "
                       f"{layout!r}, got {list(shape)}")
    pick = slice(rank, None, world) if layout == "p128" else slice(rank * rows, (rank + 1) * rows)
    shard = _contiguous(values[:, pick])
    if isinstance(k, Typed):
        shard = Typed(shard, k.dtype)
    scale = k_scale
    if k_scale is not None and tuple(k_scale.shape)[0] == shape[0] * shape[1]:
        per_page = k_scale.reshape((shape[0], shape[1]) + tuple(k_scale.shape)[1:])
        scale = _contiguous(per_page[:, pick]).reshape((shape[0] * rows,) + tuple(k_scale.shape)[1:])
    return shard, scale


def _contiguous(x: Any) -> Any:
    if hasattr(x, "contiguous"):  # torch
        return x.contiguous()
    import numpy as np
    return np.ascontiguousarray(x)


def icp_rank_lists(index_q: Any, shard: Any, page_table: Any, cu_seqlens_q: Any, *,
                   layout: str = "p128", world: int = 2, rank: int = 0, seqused_k: Any = None,
                   topk: int = 16, sink_blocks: int = 1, local_blocks: int = 1,
                   causal: bool = True, num_kv_heads: Optional[int] = None,
                   index_q_scale: Any = None, shard_scale: Any = None, ids: Any = None,
                   scores: Any = None, workspace: Any = None, stream: Any = None,
                   check: Optional[bool] = None) -> tuple:
    """One rank's candidate lists: ``(ids, scores)``, each ``[Hsel, total_q, topk]``.

    ``index_q [total_q, Hi, D]`` (every index head, on every rank; bf16/f16/fp8_e4m3 or a
    `QTensor`), ``shard [num_pages, P // world, Hik, D]`` (this rank's rows, `icp_shard`; q's
    dtype), ``page_table [B, max_pages]`` and ``seqused_k [B]`` of the unsharded pool (the same on
    every rank), ``cu_seqlens_q [B+1]``. ``num_kv_heads``: the selection heads Hsel (dividing Hi;
    default the shard's key heads), as in `block_topk`. Row ``(h, t)``: the visible blocks (of
    128 keys) that are not forced (sink, local) and that this rank holds keys of, by this rank's
    group score (highest first, ties toward the lower id), at most ``topk`` minus the token's
    forced blocks; ``ids`` int32, -1 after the list; ``scores`` f32, -inf after it. A NaN score
    of a visible block raises `MsaError` (the sharded selection could not equal `block_topk`'s).
    CUDA: D = 128, 4 or more index heads per key head, every layout but "p128" over 4 ranks,
    ``topk <= 64``. Where the indexer kernel keeps the lists itself (`block_topk`'s list rule:
    e.g. a list per index head with ``topk - sink_blocks - local_blocks <= 16``) it needs no
    workspace; otherwise ``workspace`` (u8, at least ``Hi * max_pages * total_q * 4`` bytes: the
    rank's partial block scores) is allocated per call by q's framework unless given. A listed
    zero score may come back as +0.0 where the CPU gives -0.0 (the same rank).
    """
    check_arrays(index_q=index_q, shard=shard, page_table=page_table, cu_seqlens_q=cu_seqlens_q,
                 seqused_k=seqused_k, index_q_scale=index_q_scale, shard_scale=shard_scale,
                 ids=ids, scores=scores, workspace=workspace)
    qv, qs, qg = unpack(index_q, index_q_scale)
    kv_, ks, kg = unpack(shard, shard_scale)
    total_q = dims(qv, "index_q", 3, "[total_q, Hi, D]")[0]
    topk = count(topk, "topk", lo=1)
    hsel = (kv_heads_of(kv_, "paged_nhd") if num_kv_heads is None
            else count(num_kv_heads, "num_kv_heads", lo=1))
    if ids is None:
        ids = new_output(qv, (hsel, total_q, topk), "i32", "ids", f"topk = {topk}")
    if scores is None:
        scores = new_output(qv, (hsel, total_q, topk), "f32", "scores", f"topk = {topk}")
    st = stream_of(qv, stream)
    status = status_for(qv)
    _C.icp_rank_lists(layout=layout, world=world, rank=rank, index_q=arg(qv),
                      index_q_scale=arg(qs), index_q_global_scale=float(qg), shard=arg(kv_),
                      shard_scale=arg(ks), shard_global_scale=float(kg),
                      page_table=arg(page_table), seqused_k=arg(seqused_k),
                      cu_seqlens_q=arg(cu_seqlens_q), topk=topk, sink_blocks=sink_blocks,
                      local_blocks=local_blocks, causal=causal, ids=arg(ids),
                      scores=arg(scores), workspace=arg(workspace),
                      alloc=allocator(qv, stream) if workspace is None else None, status=status,
                      stream=st)
    finish(status, st, check)
    return ids, scores


def icp_merge(ids: Any, scores: Any, page_table: Any, cu_seqlens_q: Any, *,
              layout: str = "p128", seqused_k: Any = None, topk: Optional[int] = None,
              sink_blocks: int = 1,
              local_blocks: int = 1, causal: bool = True, out: Any = None, stream: Any = None,
              check: Optional[bool] = None) -> Any:
    """The owner's merge: ``q2k [Hsel, total_q, topk]`` int32, ascending, -1 padded.

    ``ids``, ``scores``: ``[world, Hsel, total_q, topk]``, rank r's `icp_rank_lists` rows of the
    heads this owner merges at ``[r]``; ``page_table``, ``seqused_k``, ``cu_seqlens_q``, the
    layout and the selection options as given to `icp_rank_lists` (``topk``, if given, must be
    the lists' last dim). Per row: the forced blocks, then the listed blocks by their best score
    over the ranks (ties toward the lower id) up to topk. Lists that are not a rank's lists (a
    forced, invisible or repeated block, an entry after -1 or past the quota, a NaN score) raise
    `MsaError`.
    """
    check_arrays(ids=ids, scores=scores, page_table=page_table, cu_seqlens_q=cu_seqlens_q,
                 seqused_k=seqused_k, out=out)
    shape = dims(ids, "ids", 4, "[world, Hsel, total_q, topk]")
    if topk is not None and count(topk, "topk") != shape[3]:
        raise MsaError(f"topk: must equal the lists' last dim ({shape[3]}), got {topk}")
    if out is None:
        out = new_output(ids, shape[1:], "i32", "q2k", f"ids {list(shape)}")
    st = stream_of(ids, stream)
    status = status_for(ids)
    _C.icp_merge(layout=layout, ids=arg(ids), scores=arg(scores), page_table=arg(page_table),
                 seqused_k=arg(seqused_k), cu_seqlens_q=arg(cu_seqlens_q), topk=shape[3],
                 sink_blocks=sink_blocks, local_blocks=local_blocks, causal=causal,
                 q2k=arg(out), status=status, stream=st)
    finish(status, st, check)
    return out


def icp_owned_heads(num_heads: int, world: int, rank: int) -> range:
    """The selection heads rank ``rank`` of ``world`` merges: an equal contiguous share when
    ``world`` divides ``num_heads`` (a TP group splitting the heads), else every head (each rank
    then needs the whole q2k)."""
    num_heads, world, rank = (count(num_heads, "num_heads", lo=1), count(world, "world", lo=1),
                              count(rank, "rank"))
    if rank >= world:
        raise MsaError(f"rank: must be in [0, world = {world}), got {rank}")
    if num_heads % world:
        return range(num_heads)
    share = num_heads // world
    return range(rank * share, (rank + 1) * share)


def icp_exchange(ids: Any, scores: Any, *, group: Any = None) -> tuple:
    """The lists' collective step over ``torch.distributed`` (NCCL for CUDA tensors, gloo for
    CPU ones): each rank sends every owner the rows of the heads `icp_owned_heads` gives it and
    returns the rows it receives, ``[world, len(owned), total_q, topk]`` (rank r's at ``[r]``),
    ready for `icp_merge`. An all-to-all when the world divides the heads, else an all-gather.
    Every rank calls it with lists of one shape; nothing is read on the host."""
    import torch
    import torch.distributed as dist
    if not (isinstance(ids, torch.Tensor) and isinstance(scores, torch.Tensor)):
        raise MsaError("icp_exchange: ids and scores must be torch tensors (torch.distributed)")
    world = dist.get_world_size(group)
    hsel = dims(ids, "ids", 3, "[Hsel, total_q, topk]")[0]
    if tuple(scores.shape) != tuple(ids.shape):
        raise MsaError(f"scores: shape must equal ids' {list(ids.shape)}, got {list(scores.shape)}")
    owned = len(icp_owned_heads(hsel, world, dist.get_rank(group)))
    out = []
    for x in (ids, scores):
        x = x.contiguous()
        got = torch.empty((world * owned,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
        if owned == hsel:
            dist.all_gather_into_tensor(got, x, group=group)
        else:
            dist.all_to_all_single(got, x, group=group)
        out.append(got.view((world, owned) + tuple(x.shape[1:])))
    return out[0], out[1]


def icp_select(index_q: Any, shard: Any, page_table: Any, cu_seqlens_q: Any, *,
               group: Any = None, layout: str = "p128", seqused_k: Any = None, topk: int = 16,
               sink_blocks: int = 1, local_blocks: int = 1, causal: bool = True,
               num_kv_heads: Optional[int] = None, index_q_scale: Any = None,
               shard_scale: Any = None) -> Any:
    """One rank's whole ICP selection in a ``torch.distributed`` group: `icp_rank_lists` on this
    rank's shard (world and rank from the group), `icp_exchange`, `icp_merge`. Returns q2k
    ``[len(owned), total_q, topk]`` of the heads `icp_owned_heads` gives this rank, equal to
    those rows of `block_topk` on the unsharded pool. Every rank of the group calls it."""
    import torch.distributed as dist
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    opts = dict(layout=layout, seqused_k=seqused_k, sink_blocks=sink_blocks,
                local_blocks=local_blocks, causal=causal)
    ids, scores = icp_rank_lists(index_q, shard, page_table, cu_seqlens_q, world=world,
                                 rank=rank, topk=topk, num_kv_heads=num_kv_heads,
                                 index_q_scale=index_q_scale, shard_scale=shard_scale, **opts)
    ids, scores = icp_exchange(ids, scores, group=group)
    return icp_merge(ids, scores, page_table, cu_seqlens_q, **opts)


__all__ = ["icp_exchange", "icp_merge", "icp_owned_heads", "icp_rank_lists", "icp_select",
           "icp_shard"]
