"""msa.VariableBlockSparseAttention: FlashInfer-style variable-block sparse attention (per kv
head, block row sizes, block column sizes and a block mask; docs/python.md, Variable-block
sparse attention) with a plan()/run() split, mapped onto msa's engine: plan() turns the block
mask into a q2k selection (and, for block ids, its k2q CSR index); run() is `attention_forward`
over one request with them.

plan() with CUDA torch inputs, ``topk``, ``qo_len`` and ``kv_len`` builds the selection with
torch ops whose shapes come from host sizes only, so it never waits for the GPU; run() can be
captured in a CUDA graph."""

from __future__ import annotations

import math
from typing import Any, Optional

from ._arrays import _torch, framework, parse_device
from ._runtime import MsaError, check_arrays, count
from .bsr import (_CUDA_BLOCKS, _LAYOUTS, _SparsePlan, _offsets, _on_stream, _placed,
                  _plan_sizes, _refuse, _soft_cap)
from .csr import build_k2q_csr
from .sparse_convert import _block_size, _cdiv, _host, _np


def _cuda_columns(s: int) -> None:
    """The device-built selection's block sizes (key ids take the host-built path)."""
    if s not in _CUDA_BLOCKS:
        raise MsaError("kv_block_size: CUDA block_mask_map takes 64 or 128 (column blocks "
                       "starting at multiples of that many keys and ending at one or at kv_len), "
                       f"got {s}; other column sizes run as key ids from host arrays")


def _host_mask(x: Any) -> Any:
    """block_mask_map on the host as int64 (bool or integer; nonzero = attend)."""
    if x is not None and framework(x) in ("numpy", "torch", "cupy") and \
            str(x.dtype).endswith("bool"):
        x = x.astype("uint8") if framework(x) != "torch" else x.to(_torch().uint8)
    return _host(x, "block_mask_map", (3,), "[Hkv, MB, NB]")


def _heads(a: Any, name: str, hkv: int) -> Any:
    """a with its leading (head) dim broadcast from 1 to hkv."""
    if a.shape[0] not in (1, hkv):
        raise MsaError(f"{name}: its first dim is the kv head, 1 or num_kv_heads = {hkv}, got "
                       f"shape {list(a.shape)}")
    return _np().broadcast_to(a, (hkv,) + a.shape[1:])


def varblock_to_q2k(block_mask_map: Any, block_row_sz: Any, block_col_sz: Any, *,
                    num_kv_heads: int, kv_block_size: Optional[int] = None,
                    topk: Optional[int] = None, qo_len: Optional[int] = None,
                    kv_len: Optional[int] = None) -> tuple:
    """The q2k of a variable-block mask, read and checked on the host: returns
    ``(q2k int32 [Hkv, qo_len, width], kv_block_size, qo_len, kv_len)``.

    Head h cuts the queries into blocks of ``block_row_sz[h]`` and the keys into blocks of
    ``block_col_sz[h]`` (non-negative, the same sums for every head); query t of row block i
    selects the keys of every column block c with ``block_mask_map[h, i, c]``, as ids in blocks
    of kv_block_size, ascending, -1 padded. kv_block_size: default 128 or 64 when every column
    boundary of every head is a multiple of it or kv_len (each column block is then whole msa
    blocks, the last one possibly short), else 1 (key ids); given, the boundaries must allow
    it. width: topk (not less than the most ids a query row selects), default that most."""
    np = _np()
    hkv = count(num_kv_heads, "num_kv_heads", lo=1)
    mask = _heads(_host_mask(block_mask_map), "block_mask_map", hkv) != 0
    rows = _heads(_host(block_row_sz, "block_row_sz", (2,), "[Hkv, MB]"), "block_row_sz", hkv)
    cols = _heads(_host(block_col_sz, "block_col_sz", (2,), "[Hkv, NB]"), "block_col_sz", hkv)
    mb, nb = mask.shape[1:]
    if rows.shape[1] != mb or cols.shape[1] != nb:
        raise MsaError(f"block_row_sz / block_col_sz: must be [Hkv, MB] and [Hkv, NB] with "
                       f"block_mask_map [Hkv, MB, NB] = {list(mask.shape)}, got "
                       f"{list(rows.shape)} and {list(cols.shape)}")
    lens = {}
    for name, sz, given in (("block_row_sz", rows, qo_len), ("block_col_sz", cols, kv_len)):
        if sz.size and sz.min() < 0:
            h, i = np.argwhere(sz < 0)[0]
            raise MsaError(f"{name}: sizes must be >= 0, got {int(sz[h, i])} at [{h}, {i}]")
        sums = sz.sum(1)
        if (sums != sums[0]).any():
            h = int(np.flatnonzero(sums != sums[0])[0])
            raise MsaError(f"{name}: every kv head must cover the same length; head 0 sums to "
                           f"{int(sums[0])}, head {h} to {int(sums[h])}")
        what = "qo_len" if name == "block_row_sz" else "kv_len"
        if sums[0] < 1:
            raise MsaError(f"{name}: the sizes sum to {what} = {int(sums[0])}, must be >= 1")
        if given is not None and count(given, what, lo=1) != sums[0]:
            raise MsaError(f"{what}: {given} given, but {name} sums to {int(sums[0])}")
        lens[what] = int(sums[0])
    qo_len, kv_len = lens["qo_len"], lens["kv_len"]
    bounds = np.cumsum(cols, 1)
    whole = [v for v in (128, 64) if ((bounds % v == 0) | (bounds == kv_len)).all()]
    if kv_block_size is None:
        s = whole[0] if whole else 1
    else:
        s = _block_size(kv_block_size, 1)
        if s > 1 and s not in whole:
            raise MsaError(f"block_col_sz: kv_block_size {s} needs every column block to start "
                           f"at a multiple of {s} keys and end at one or at kv_len = {kv_len}; "
                           "use kv_block_size=1 (key ids)")
    nblk = _cdiv(kv_len, s)
    firsts = np.arange(nblk) * s                    # the first key of each id
    sel = np.stack([mask[h][:, np.searchsorted(bounds[h], firsts, side="right")]
                    for h in range(hkv)])            # [Hkv, MB, nblk]
    widths = sel.sum(-1) * (rows > 0)
    widest = int(widths.max())
    if topk is not None:
        topk = count(topk, "topk", lo=1)
        if topk < widest:
            raise MsaError(f"topk: {topk} is less than the {widest} "
                           f"{'keys' if s == 1 else 'blocks'} the widest query row selects")
    width = topk if topk is not None else max(widest, 1)
    q2k = np.full((hkv, qo_len, width), -1, np.int32)
    starts = np.cumsum(rows, 1) - rows
    for h in range(hkv):
        for i in np.flatnonzero(rows[h]):
            ids = np.flatnonzero(sel[h, i])
            q2k[h, starts[h, i]:starts[h, i] + rows[h, i], :len(ids)] = ids
    return q2k, s, qo_len, kv_len


def q2k_from_varblock_torch(block_mask_map: Any, block_row_sz: Any, block_col_sz: Any, *,
                            qo_len: int, kv_len: int, num_kv_heads: int, topk: int,
                            kv_block_size: int) -> Any:
    """The q2k of a variable-block mask, int32 ``[Hkv, qo_len, topk]``, built with torch ops on
    the mask's device whose shapes depend on the sizes only (no host read, no sync).

    The same selection as `varblock_to_q2k` with ids in blocks of kv_block_size (1, 64 or 128;
    given, not inferred). What the host cannot see is left to msa's q2k checks at run: a query
    whose row selects more than topk ids, and every query of a kv head whose sizes break a rule
    (a negative size; row sizes not summing to qo_len or column sizes to kv_len; with
    kv_block_size > 1, a column boundary that is neither a multiple of it nor kv_len, so an id
    would not be one column block's keys), gets the out-of-range id ``ceil(kv_len /
    kv_block_size)`` in slot 0 and -1 after it."""
    torch = _torch()
    dev = block_mask_map.device
    s, h = kv_block_size, num_kv_heads
    mb, nb = block_mask_map.shape[-2:]
    nblk = _cdiv(kv_len, s)
    mask = (block_mask_map != 0).expand(h, mb, nb)
    rows = block_row_sz.to(torch.int64).expand(h, mb)
    cols = block_col_sz.to(torch.int64).expand(h, nb)
    rb, cb = rows.cumsum(1), cols.cumsum(1)                     # block ends
    bad = (rows < 0).any(1) | (cols < 0).any(1) | (rb[:, -1] != qo_len) | (cb[:, -1] != kv_len)
    if s > 1:
        bad |= ((cb % s != 0) & (cb != kv_len)).any(1)
    firsts = (torch.arange(nblk, device=dev) * s).expand(h, nblk).contiguous()
    col = torch.searchsorted(cb.contiguous(), firsts, right=True).clamp(max=nb - 1)
    sel = torch.gather(mask, 2, col[:, None, :].expand(h, mb, nblk))     # [Hkv, MB, nblk]
    over = sel.sum(-1) > topk                                   # [Hkv, MB]
    big = torch.iinfo(torch.int64).max
    ids = torch.where(sel, torch.arange(nblk, device=dev), big).sort(-1).values[..., :topk]
    if nblk < topk:
        ids = torch.cat([ids, ids.new_full((h, mb, topk - nblk), big)], -1)
    ids = torch.where(ids == big, -1, ids)                      # [Hkv, MB, topk]
    t = torch.arange(qo_len, device=dev).expand(h, qo_len).contiguous()
    row = torch.searchsorted(rb.contiguous(), t, right=True)    # [Hkv, qo_len]
    past = row >= mb
    row = row.clamp(max=mb - 1)
    q2k = torch.gather(ids, 1, row[..., None].expand(h, qo_len, topk))
    poison = bad[:, None] | past | torch.gather(over, 1, row)
    slot0 = torch.where(torch.arange(topk, device=dev) == 0, nblk, -1)
    q2k = torch.where(poison[..., None], slot0, q2k)
    return q2k.to(torch.int32).contiguous()


def _check_device_inputs(mask: Any, rows: Any, cols: Any, hkv: int) -> None:
    """What can be checked of device inputs without reading them."""
    torch = _torch()
    for name, x, nd, what in (("block_mask_map", mask, 3, "[Hkv, MB, NB]"),
                              ("block_row_sz", rows, 2, "[Hkv, MB]"),
                              ("block_col_sz", cols, 2, "[Hkv, NB]")):
        if not isinstance(x, torch.Tensor):
            raise MsaError(f"{name}: must be a torch tensor like block_mask_map")
        if x.dtype.is_floating_point or x.dtype.is_complex or \
                (x.dtype == torch.bool and x is not mask):
            raise MsaError(f"{name}: must be an integer tensor"
                           f"{' (or bool)' if x is mask else ''}, got {x.dtype}")
        if x.device != mask.device:
            raise MsaError(f"{name}: on {x.device}, block_mask_map on {mask.device}")
        if x.dim() != nd:
            raise MsaError(f"{name}: must be {what}, got shape {list(x.shape)}")
        if x.shape[0] not in (1, hkv):
            raise MsaError(f"{name}: its first dim is the kv head, 1 or num_kv_heads = {hkv}, "
                           f"got shape {list(x.shape)}")
    mb, nb = mask.shape[1:]
    if rows.shape[1] != mb or cols.shape[1] != nb or mb < 1 or nb < 1:
        raise MsaError(f"block_row_sz / block_col_sz: must be [Hkv, MB] and [Hkv, NB] with "
                       f"block_mask_map [Hkv, MB, NB] = {list(mask.shape)} (MB, NB >= 1), got "
                       f"{list(rows.shape)} and {list(cols.shape)}")


class VariableBlockSparseAttention(_SparsePlan):
    """Sparse attention over variable-size blocks, per kv head (FlashInfer's
    ``VariableBlockSparseAttentionWrapper``), planned once and run many times.

    ::

        vsa = msa.VariableBlockSparseAttention().plan(
            block_mask_map, block_row_sz, block_col_sz, num_qo_heads, num_kv_heads, head_dim)
        out = vsa.run(q, k, v)     # q [Hq, qo_len, D], k / v [Hkv, kv_len, D] ("HND")

    For kv head h, query t in row block i (of the blocks of sizes ``block_row_sz[h]``) attends
    key j in column block c (of sizes ``block_col_sz[h]``) iff ``block_mask_map[h, i, c]`` (and
    the causal rule with ``causal=True``). plan() maps that to msa's q2k selection; run() is
    `attention_forward` over one request with it. See plan() for what runs where.
    """

    def plan(self, block_mask_map: Any, block_row_sz: Any, block_col_sz: Any,
             num_qo_heads: int, num_kv_heads: int, head_dim: int, causal: bool = False, *,
             topk: Optional[int] = None, qo_len: Optional[int] = None,
             kv_len: Optional[int] = None, sm_scale: Optional[float] = None,
             kv_block_size: Optional[int] = None, layout: str = "HND", device: Any = None,
             stream: Any = None, pos_encoding_mode: str = "NONE",
             use_fp16_qk_reduction: bool = False, logits_soft_cap: Optional[float] = None,
             rope_scale: Optional[float] = None, rope_theta: Optional[float] = None,
             non_blocking: bool = True, q_data_type: Any = None, kv_data_type: Any = None,
             q_scale: Any = None, k_scale: Any = None,
             v_scale: Any = None) -> "VariableBlockSparseAttention":
        """Plans attention over the variable-block mask (FlashInfer's
        ``VariableBlockSparseAttentionWrapper.plan`` arguments). Returns self.

        - block_mask_map ``[Hkv, MB, NB]`` (bool or integer, nonzero = attend), block_row_sz
          ``[Hkv, MB]``, block_col_sz ``[Hkv, NB]`` (integer sizes >= 0; zero-size blocks hold
          no query or key); a leading dim of 1 stands for every kv head. Every head's row sizes
          sum to qo_len and column sizes to kv_len. Query head hq reads kv head
          ``hq // (num_qo_heads / num_kv_heads)``.
        - causal: msa's rule, bottom-right aligned (query t sees key j iff
          ``j <= t + kv_len - qo_len``; the usual mask when qo_len = kv_len). sm_scale:
          default ``1 / sqrt(head_dim)``.
        - topk: the most ids a query row selects (keys with key ids, msa blocks with block ids).
        - kv_block_size: the block size of the q2k ids. Host inputs: default 128 or 64 when
          every column boundary of every head is a multiple of it or kv_len, else 1 (key ids,
          which only the CPU attends). CUDA takes 128 only: columns whose boundaries are
          multiples of 128 (or kv_len), e.g. every column 128 keys (the last one may be short)
          or 256, 384, ...; anything else is an `MsaError` naming ``block_col_sz`` (host
          inputs) or ``kv_block_size``.
        - layout: "HND" (FlashInfer's: q ``[Hq, qo_len, D]``, k, v ``[Hkv, kv_len, D]``, out
          like q, read and written as strided views of msa's token-major arrays) or "NHD"
          (``[qo_len, Hq, D]``, ``[kv_len, Hkv, D]``).
        - device: where run() runs ('cpu', 'cuda[:i]', a torch.device or an array on it);
          default block_mask_map's device.

        Where the selection is built:

        - CUDA torch inputs on the plan's device, with ``topk``, ``qo_len`` and ``kv_len``
          (host ints; reading the sizes' sums would wait for the GPU): on the device with torch
          ops, on ``stream`` (default the current one), reading nothing on the host, ids in
          blocks of 128 (the caller asserts the columns allow it). Shapes and dtypes are
          checked here; what only the values show is reported by msa's q2k checks at run
          (``check=True`` or `msa.check_status`): every query of a kv head with a negative
          size, sums other than qo_len / kv_len, or a column boundary that is neither a
          multiple of 128 nor kv_len gets an out-of-range id, and so does a query whose row
          selects more than topk blocks. Without topk, qo_len or kv_len: `MsaError`.
        - Anything else (numpy, CPU torch, cupy, or a device other than the inputs'): read
          and checked on the host (a GPU array's stream is waited for), then copied to the
          device.

        With block ids plan() also builds the k2q CSR index. Planning again makes new arrays
        (a CUDA graph captured over run() keeps reading the old ones: capture again).
        ``logits_soft_cap`` c > 0 caps the scores, ``c * tanh(s / c)`` after sm_scale, on
        either backend.
        Refused (`MsaError` naming the argument): position encodings
        (``pos_encoding_mode`` other than "NONE", ``rope_scale``, ``rope_theta``),
        ``use_fp16_qk_reduction=True``, and the plan-time ``q_scale`` / ``k_scale`` /
        ``v_scale`` of FlashInfer's Sage FP8 backend (FP8 K/V take msa's per-token scales in
        run()). ``non_blocking``, ``q_data_type`` and ``kv_data_type`` are taken and unused
        (run() reads the dtypes from its arrays).
        """
        for name, value, default in (("pos_encoding_mode", pos_encoding_mode, "NONE"),
                                     ("rope_scale", rope_scale, None),
                                     ("rope_theta", rope_theta, None),
                                     ("use_fp16_qk_reduction", use_fp16_qk_reduction, False),
                                     ("q_scale", q_scale, None), ("k_scale", k_scale, None),
                                     ("v_scale", v_scale, None)):
            _refuse(name, value, default)
        check_arrays(block_mask_map=block_mask_map, block_row_sz=block_row_sz,
                     block_col_sz=block_col_sz)
        hq, hkv, d, sm_scale, topk = _plan_sizes(num_qo_heads, num_kv_heads, head_dim, causal,
                                                 layout, sm_scale, topk)
        torch = _torch()
        kind, index = parse_device(device if device is not None else block_mask_map)
        cap = _soft_cap(logits_soft_cap)
        arrays = (block_mask_map, block_row_sz, block_col_sz)
        on_device = (kind == "cuda" and torch is not None
                     and all(isinstance(x, torch.Tensor) and x.is_cuda for x in arrays)
                     and parse_device(block_mask_map) == (kind, index))
        if on_device:
            for name, value in (("topk", topk), ("qo_len", qo_len), ("kv_len", kv_len)):
                if value is None:
                    raise MsaError(f"{name}: required with CUDA block_mask_map / block_row_sz "
                                   "/ block_col_sz (a host int): plan() builds the selection "
                                   "on the device without reading the sizes on the host")
            qo_len, kv_len = count(qo_len, "qo_len", lo=1), count(kv_len, "kv_len", lo=1)
            s = _block_size(kv_block_size, 128)
            _cuda_columns(s)
            _check_device_inputs(block_mask_map, block_row_sz, block_col_sz, hkv)
            with _on_stream(stream, block_mask_map.device):
                q2k = q2k_from_varblock_torch(block_mask_map, block_row_sz, block_col_sz,
                                              qo_len=qo_len, kv_len=kv_len, num_kv_heads=hkv,
                                              topk=topk, kv_block_size=s)
        else:
            q2k_np, s, qo_len, kv_len = varblock_to_q2k(
                block_mask_map, block_row_sz, block_col_sz, num_kv_heads=hkv,
                kv_block_size=kv_block_size, topk=topk, qo_len=qo_len, kv_len=kv_len)
            q2k = _placed(q2k_np, block_mask_map, kind, index)
        use_torch = torch is not None and isinstance(q2k, torch.Tensor)
        with _on_stream(stream if on_device else None, q2k.device if use_torch else None):
            cu_q = _offsets(q2k, qo_len, use_torch)
            cu_k = _offsets(q2k, kv_len, use_torch)
        k2q = None
        if s in (64, 128):
            k2q = build_k2q_csr(q2k, cu_q, cu_seqlens_k=cu_k, kv_block_size=s,
                                total_rows=_cdiv(kv_len, s), stream=stream)
        self._plan = dict(q2k=q2k, k2q=k2q, cu_q=cu_q, cu_k=cu_k, kv_block_size=s, M=qo_len,
                          N=kv_len, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d,
                          causal=causal, sm_scale=sm_scale, soft_cap=cap, layout=layout,
                          q_hnd=True,
                          names=("qo_len", "kv_len"), device=(kind, index))
        return self

    @property
    def qo_len(self) -> Optional[int]:
        return None if self._plan is None else self._plan["M"]

    @property
    def kv_len(self) -> Optional[int]:
        return None if self._plan is None else self._plan["N"]

    def run(self, q: Any, k: Any, v: Any, *, out: Any = None, lse: Any = None,
            return_lse: bool = False, k_scale: Any = None, v_scale: Any = None,
            workspace: Any = None, stream: Any = None, check: Optional[bool] = None) -> Any:
        """Attention over the planned blocks: returns out (q's layout and dtype), or
        ``(out, lse)`` with ``return_lse`` (lse ``[Hq, qo_len]`` f32), as `attention_forward`.

        Layout "HND": q ``[Hq, qo_len, D]``, k, v ``[Hkv, kv_len, D]``, out ``[Hq, qo_len, D]``
        (allocated contiguous by q's framework, or the given ``out``; written through a
        strided view). Layout "NHD": ``[qo_len, Hq, D]``, ``[kv_len, Hkv, D]``. q bf16 or f16
        (NHD also FP8 as in `attention_forward`); k, v of q's dtype or FP8 e4m3 with f32
        ``k_scale`` / ``v_scale`` (or `QTensor` k / v, NHD only). ``workspace``: u8 scratch of
        at least `attention_workspace_bytes` (CUDA); by default the plan keeps one from its
        first eager run, so calls on one stream at a time. On CUDA run() neither waits (with
        the default ``check``) nor reads anything on the host and can be captured in a CUDA
        graph after one eager run. Shapes, heads or a device that disagree with the plan raise
        `MsaError`."""
        return super().run(q, k, v, out=out, lse=lse, return_lse=return_lse, k_scale=k_scale,
                           v_scale=v_scale, workspace=workspace, stream=stream, check=check)


__all__ = ["VariableBlockSparseAttention"]
