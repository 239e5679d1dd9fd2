"""msa.BlockSparseAttention: FlashInfer-style block-sparse (BSR) attention with a plan()/run()
split (docs/python.md, Block-sparse (BSR) attention), mapped onto msa's engine: plan() turns the
BSR matrix into a q2k selection (and, for block ids, its k2q CSR index); run() is
`attention_forward` over one request with them.

plan() takes the matrix as ``indptr``/``indices``, a per-head ``block_mask`` or
``q2k_indices``/``q2k_num``. With CUDA torch inputs (and ``topk``, needed except for
q2k_indices) it builds the selection with torch ops whose shapes come from host sizes only, so
it never waits for the GPU (an element mask, built on the host, is the exception); run() neither
waits nor allocates outside the caller's framework (torch's caching allocator), and can be
captured in a CUDA graph."""

from __future__ import annotations

import math
from typing import Any, Optional

from ._arrays import Typed, _torch, dtype_of, empty, framework, parse_device
from ._runtime import MsaError, check_arrays, compiling, count, dims
from .attention import _out_dtype, attention_forward, attention_workspace_bytes
from .csr import build_k2q_csr
from .quant import QTensor, unpack
from .sparse_convert import (_block_size, _bsr_mask_blocks, _bsr_q2k, _cdiv, _host, _like, _np,
                             _per_head_q2k, _q2k_indices_blocks, _read)

# msa's CUDA prefill attends blocks of these many keys (docs/semantics.md, Attention).
_CUDA_BLOCKS = (128, 64)
_LAYOUTS = ("NHD", "HND")


def _refuse(name: str, value: Any, default: Any = None) -> None:
    """FlashInfer arguments msa's engine has no equivalent for: anything but the default is an
    MsaError naming the argument."""
    if value is None or value is default or (default is not None and value == default):
        return
    raise MsaError(f"{name}: not supported by msa's attention (it attends whole blocks with "
                   f"the causal rule, scores scaled by sm_scale only); got {_brief(value)}")


def _element_key_mask(mask: Any, packed_mask: Any, indptr: Any, indices: Any, *, M: int, N: int,
                      R: int, C: int, causal: bool, form: str) -> Any:
    """FlashInfer's element mask of the BSR's listed blocks (``mask`` bool ``[nnz, R, C]`` or
    flat, or ``packed_mask``: those bits packed little-endian, as FlashInfer's ``packbits``) as
    attention_forward's per-query ``key_mask``, a host numpy bool ``[M, N]``: key j of query t
    is kept iff block (t // R, j // C) is listed at entry e and ``mask[e, t % R, j % C]``. None
    without a mask. The single indptr / indices form only, causal=False (FlashInfer takes
    causal only without masks). Built on the host for either backend: indptr, indices and the
    mask are read there (a torch CUDA array waits for torch's current stream), so that run()
    only reads the placed key mask."""
    if mask is None and packed_mask is None:
        return None
    name = "mask" if mask is not None else "packed_mask"
    if mask is not None and packed_mask is not None:
        raise MsaError("mask, packed_mask: pass at most one (packed_mask is mask's bits packed)")
    if form != "indptr":
        raise MsaError(f"{name}: an element mask applies to the indptr / indices form (the "
                       f"blocks it lists, in entry order), not to {form}")
    if causal:
        raise MsaError(f"{name}: causal=True with an element mask; FlashInfer applies causal only "
                       "without masks: fold the causal rule into the mask")
    np = _np()
    ip = _host(indptr, "indptr", (1, 2), "[MB + 1]")
    if ip.ndim != 1:
        raise MsaError(f"{name}: an element mask goes with one matrix for every head (indptr "
                       f"[MB + 1]), got indptr of shape {list(ip.shape)}")
    ix = _host(indices, "indices", (1,), "[nnz]")
    nnz = int(ix.shape[0])
    size = nnz * R * C
    if mask is not None:
        m = _read(mask, "mask")
        if m.dtype != np.bool_ and m.dtype != np.uint8:
            raise MsaError(f"mask: must be bool or uint8, got {m.dtype}")
        if m.size != size or (m.ndim == 3 and m.shape != (nnz, R, C)):
            raise MsaError(f"mask: must be [nnz, R, C] = [{nnz}, {R}, {C}] (or that many values "
                           f"flat), got shape {list(m.shape)}")
        bits = m.reshape(nnz, R, C) != 0
    else:
        pk = _read(packed_mask, "packed_mask")
        if pk.dtype != np.uint8 or pk.shape != (_cdiv(size, 8),):
            raise MsaError(f"packed_mask: must be uint8 [ceil(nnz * R * C / 8)] = "
                           f"[{_cdiv(size, 8)}], got {pk.dtype} {list(pk.shape)}")
        bits = np.unpackbits(pk, bitorder="little")[:size].reshape(nnz, R, C) != 0
    key_mask = np.zeros((M, N), dtype=np.bool_)
    for row in range(ip.shape[0] - 1):
        r0, r1 = row * R, min(M, row * R + R)
        for e in range(int(ip[row]), int(ip[row + 1])):
            c0 = int(ix[e]) * C
            c1 = min(N, c0 + C)
            key_mask[r0:r1, c0:c1] = bits[e, :r1 - r0, :c1 - c0]
    return key_mask


def _soft_cap(value: Any) -> Optional[float]:
    """FlashInfer's ``logits_soft_cap`` as attention_forward's ``soft_cap`` (None or 0: off) for
    a plan on either backend."""
    if value is None or value == 0:
        return None
    cap = float(value)
    if not cap > 0 or math.isinf(cap):
        raise MsaError(f"logits_soft_cap: must be a finite number >= 0 (0 means none), got "
                       f"{value}")
    return cap


def _brief(value: Any) -> str:
    shape = getattr(value, "shape", None)
    return f"an array of shape {list(shape)}" if shape is not None else repr(value)


def check_cuda_plan(C: int, kv_block_size: int, kv_block_lens: Any) -> None:
    """What CUDA takes: ids in blocks of 128 or 64 keys (C a multiple of 64, no kv_block_lens),
    or key ids (kv_block_size 1: any C and kv_block_lens, run by the token-sparse kernel)."""
    if kv_block_size == 1 or kv_block_lens is not None:  # key ids (lens need them)
        return
    if C % 64:
        raise MsaError(f"C: CUDA attends blocks of 64 or 128 keys, and C = {C} is not a multiple "
                       "of 64; plan with kv_block_size=1 (key ids, any C) or use column blocks "
                       "of 64, 128, 192, ... keys")
    if kv_block_size not in _CUDA_BLOCKS:
        raise MsaError(f"kv_block_size: CUDA takes 1, 64 or 128, got {kv_block_size}")


def q2k_from_bsr_torch(indptr: Any, indices: Any, *, M: int, N: int, R: int, C: int,
                       num_kv_heads: int, topk: int, kv_block_size: int,
                       kv_block_lens: Any = None) -> Any:
    """The q2k of a BSR matrix, int32 ``[Hkv, M, topk * C / kv_block_size]``, built with torch
    ops on indptr's device whose shapes depend on the sizes only (no host read, no sync).

    indptr ``[MB + 1]`` or ``[Hkv, MB + 1]``, indices ``[nnz]`` or ``[Hkv, L]`` (integer
    tensors); kv_block_size divides C; kv_block_lens ``[NB]`` needs kv_block_size = 1. Each
    block row's first topk listed column blocks become ids in blocks of kv_block_size (those
    past key N dropped), ascending, -1 padded, repeated for the row's R queries (the last row
    clipped to M). A row that breaks a rule the host cannot see (indptr not starting at 0,
    decreasing, past indices or not ending at nnz; more than topk blocks; a column id outside
    [0, NB); a kv_block_lens entry outside [1, C]) gets the out-of-range id
    ``ceil(N / kv_block_size)`` in slot 0, which msa's q2k checks report at run; repeated
    column ids repeat ids, reported the same way."""
    torch = _torch()
    dev = indptr.device
    mb, nb = _cdiv(M, R), _cdiv(N, C)
    ip = indptr.reshape(-1, mb + 1).to(torch.int64)             # [H, MB + 1]
    h = ip.shape[0]
    ix = indices.reshape(h, -1).to(torch.int64)                 # [H, L]
    length = ix.shape[1]
    start, end = ip[:, :-1], ip[:, 1:]                          # [H, MB]
    slots = torch.arange(topk, device=dev)
    pos = start[..., None] + slots                              # [H, MB, topk]
    listed = pos < end[..., None]
    if length:
        cols = torch.gather(ix, 1, pos.clamp(0, length - 1).reshape(h, -1)).reshape(pos.shape)
    else:
        cols = torch.full_like(pos, -1)
    bad = (end - start < 0) | (end - start > topk) | (start < 0) | (end > length)
    if indptr.dim() == 1:                                       # one matrix: nnz = len(indices)
        bad[:, -1] |= ip[:, -1] != length
    bad[:, 0] |= ip[:, 0] != 0
    ids = _listed_ids(cols, listed, bad, N=N, C=C, kv_block_size=kv_block_size,
                      kv_block_lens=kv_block_lens)
    return _rows_q2k(ids, M=M, R=R, num_kv_heads=num_kv_heads)


def _listed_ids(cols: Any, listed: Any, bad: Any, *, N: int, C: int, kv_block_size: int,
                kv_block_lens: Any) -> Any:
    """Column blocks cols int64 [H, MB, K] (slots where ``listed``) -> ids int64 [H, MB,
    K * C / kv_block_size]: each listed block's ids in blocks of kv_block_size (those past key
    N dropped), ascending, -1 padded; a row marked ``bad`` [H, MB], or listing a column
    outside [0, NB) or one whose kv_block_lens entry is outside [1, C], gets the out-of-range
    id ``ceil(N / kv_block_size)`` in slot 0 and -1 after."""
    torch = _torch()
    dev = cols.device
    s = kv_block_size
    nb, nblk, m = _cdiv(N, C), _cdiv(N, s), C // s
    h, mb, k = cols.shape
    bad = bad | (listed & ((cols < 0) | (cols >= nb))).any(-1)
    safe = cols.clamp(0, max(nb - 1, 0))
    unit = torch.arange(m, device=dev)
    ids = safe[..., None] * m + unit                            # [H, MB, K, m]
    keep = listed[..., None] & (ids < nblk)
    if kv_block_lens is not None:
        lens = kv_block_lens.reshape(-1).to(device=dev, dtype=torch.int64)[safe]  # [H, MB, K]
        bad = bad | (listed & ((lens < 1) | (lens > C))).any(-1)
        keep &= unit < lens[..., None]
    big = torch.iinfo(torch.int64).max
    ids = torch.where(keep, ids, big).reshape(h, mb, k * m).sort(-1).values
    ids = torch.where(ids == big, -1, ids)
    width = torch.arange(k * m, device=dev)
    poison = torch.where(width == 0, nblk, -1)
    return torch.where(bad[..., None], poison, ids)


def _rows_q2k(ids: Any, *, M: int, R: int, num_kv_heads: int, poison: int = 0) -> Any:
    """Per-block-row ids int64 [H, MB, W] (H = 1, Hkv, or a multiple G * Hkv of query heads)
    -> q2k int32 [Hkv, M, W], each block row repeated for its R queries (the last clipped to
    M). With H = G * Hkv the first head of each group is taken, and a block row whose group
    heads differ gets the out-of-range id ``poison`` in slot 0 and -1 after."""
    torch = _torch()
    dev = ids.device
    h, mb, w = ids.shape
    if h not in (1, num_kv_heads):
        g = h // num_kv_heads
        grouped = ids.reshape(num_kv_heads, g, mb, w)
        differ = (grouped != grouped[:, :1]).any(-1).any(1)     # [Hkv, MB]
        ids = grouped[:, 0]
        first = torch.where(torch.arange(w, device=dev) == 0, poison, -1)
        ids = torch.where(differ[..., None], first, ids)
    rows = torch.div(torch.arange(M, device=dev), R, rounding_mode="floor")
    q2k = ids[:, rows]                                          # [H, M, W]
    return q2k.expand(num_kv_heads, M, w).to(torch.int32).contiguous()


def q2k_from_bsr_mask_torch(block_mask: Any, *, M: int, N: int, R: int, C: int,
                            num_kv_heads: int, topk: int, kv_block_size: int,
                            kv_block_lens: Any = None) -> Any:
    """The q2k of FlashInfer's per-head block mask, int32 ``[Hkv, M, topk * C /
    kv_block_size]``, built with torch ops on block_mask's device whose shapes depend on the
    sizes only (no host read, no sync), equal to `bsr_mask_to_q2k` with that width.

    block_mask bool ``[H, MB, NB]``, H = 1, Hkv or Hq (a multiple of Hkv). Each row's selected
    column blocks, ascending (a stable sort of the row's ``~mask``), fill its topk slots; a row
    that selects more than topk blocks, one whose kv_block_lens entry is outside [1, C], or
    (with H = Hq) one whose group heads differ gets the out-of-range id ``ceil(N /
    kv_block_size)`` in slot 0, which msa's q2k checks report at run."""
    torch = _torch()
    dev = block_mask.device
    h, mb, nb = block_mask.shape
    order = torch.sort((~block_mask).to(torch.int8), dim=-1, stable=True).indices
    n = block_mask.sum(-1)                                      # [H, MB]
    if topk > nb:
        order = torch.cat([order, order.new_zeros((h, mb, topk - nb))], -1)
    cols = order[..., :topk].to(torch.int64)
    listed = torch.arange(topk, device=dev) < n[..., None]
    ids = _listed_ids(cols, listed, n > topk, N=N, C=C, kv_block_size=kv_block_size,
                      kv_block_lens=kv_block_lens)
    return _rows_q2k(ids, M=M, R=R, num_kv_heads=num_kv_heads,
                     poison=_cdiv(N, kv_block_size))


def q2k_from_q2k_indices_torch(q2k_indices: Any, q2k_num: Any = None, *, M: int, N: int,
                               R: int, C: int, num_kv_heads: int, topk: Optional[int] = None,
                               kv_block_size: int, kv_block_lens: Any = None) -> Any:
    """The q2k of FlashInfer's direct per-head selections, int32 ``[Hkv, M, topk * C /
    kv_block_size]`` (topk default K), built with torch ops on q2k_indices' device whose
    shapes depend on the sizes only (no host read, no sync), equal to `q2k_indices_to_q2k`
    with that width.

    q2k_indices integers ``[H, MB, K]``, q2k_num ``[H, MB]`` (None: every row lists all K),
    H = 1, Hkv or Hq (a multiple of Hkv). Entries at and past q2k_num are dropped. A row with
    q2k_num outside [0, K] or above topk, a listed id outside [0, NB), a kv_block_lens entry
    outside [1, C], or (with H = Hq) group heads that list different sets gets the
    out-of-range id ``ceil(N / kv_block_size)`` in slot 0; a repeated id repeats ids. msa's
    q2k checks report both at run."""
    torch = _torch()
    dev = q2k_indices.device
    h, mb, k = q2k_indices.shape
    topk = max(1, k) if topk is None else topk
    ix = q2k_indices.to(torch.int64)
    if q2k_num is None:
        n = torch.full((h, mb), k, dtype=torch.int64, device=dev)
    else:
        n = q2k_num.reshape(h, mb).to(device=dev, dtype=torch.int64)
    bad = (n < 0) | (n > k) | (n > topk)
    if topk > k:
        ix = torch.cat([ix, ix.new_zeros((h, mb, topk - k))], -1)
    cols = ix[..., :topk]
    listed = torch.arange(topk, device=dev) < n[..., None]
    ids = _listed_ids(cols, listed, bad, N=N, C=C, kv_block_size=kv_block_size,
                      kv_block_lens=kv_block_lens)
    return _rows_q2k(ids, M=M, R=R, num_kv_heads=num_kv_heads,
                     poison=_cdiv(N, kv_block_size))


def _offsets(like: Any, n: int, on_device: bool) -> Any:
    """int32 [0, n] in like's framework on like's device (on a torch device without a copy
    from the host)."""
    if on_device:
        torch = _torch()
        return torch.arange(2, dtype=torch.int32, device=like.device) * n
    return _like(like, _np().array([0, n], dtype=_np().int32))


def _plan_sizes(num_qo_heads, num_kv_heads, head_dim, causal, layout, sm_scale, topk):
    """The checked head counts, head dim, sm_scale and topk of a sparse plan (both wrappers)."""
    hq = count(num_qo_heads, "num_qo_heads", lo=1)
    hkv = count(num_kv_heads, "num_kv_heads", lo=1)
    d = count(head_dim, "head_dim", lo=1)
    if hq % hkv:
        raise MsaError(f"num_qo_heads: {hq} must be a multiple of num_kv_heads = {hkv}")
    if not isinstance(causal, bool):
        raise MsaError(f"causal: must be True or False, got {causal!r}")
    if layout not in _LAYOUTS:
        raise MsaError(f"layout: must be 'NHD' or 'HND', got {layout!r}")
    if sm_scale is not None:
        sm_scale = float(sm_scale)
        if not sm_scale > 0 or math.isinf(sm_scale):
            raise MsaError(f"sm_scale: must be a finite number > 0, got {sm_scale}")
    if topk is not None:
        topk = count(topk, "topk", lo=1)
    return hq, hkv, d, sm_scale, topk


class _SparsePlan:
    """What BlockSparseAttention and VariableBlockSparseAttention share: the planned q2k (and
    k2q), run() as `attention_forward` over one request, the kept workspace. plan() stores a
    dict with q2k, k2q, cu_q, cu_k, kv_block_size, M, N (query and key counts, named by
    ``names``), num_qo_heads, num_kv_heads, head_dim, causal, sm_scale, soft_cap, layout,
    device, and optionally key_mask (a per-query ``[M, N]`` on the plan's device) and q_hnd (q
    and out follow an "HND" layout too)."""

    def __init__(self) -> None:
        self._plan: Optional[dict] = None
        self._workspace: Any = None

    @property
    def planned(self) -> bool:
        return self._plan is not None

    @property
    def q2k(self) -> Any:
        """The planned selection, int32 ``[Hkv, M, width]`` (None before plan())."""
        return None if self._plan is None else self._plan["q2k"]

    @property
    def kv_block_size(self) -> Optional[int]:
        """The kv block size of the planned q2k's ids (128 or 64: block ids; 1: key ids)."""
        return None if self._plan is None else self._plan["kv_block_size"]

    def run(self, q: Any, k: Any, v: Any, *, out: Any = None, lse: Any = None,
            return_lse: bool = False, k_scale: Any = None, v_scale: Any = None,
            workspace: Any = None, stream: Any = None, check: Optional[bool] = None) -> Any:
        """Attention over the planned matrix: returns ``out [M, Hq, D]`` (q's dtype), or
        ``(out, lse)`` with ``return_lse`` (lse ``[Hq, M]`` f32), as `attention_forward`.

        q ``[M, Hq, D]`` (bf16, f16, or FP8 as in `attention_forward`); k, v ``[N, Hkv, D]``
        (``[Hkv, N, D]`` when planned with layout "HND"), of q's dtype or FP8 e4m3 with f32
        ``k_scale`` / ``v_scale`` (or `QTensor` k / v, NHD only). ``workspace``: u8 scratch of
        at least `attention_workspace_bytes` (CUDA); by default the plan keeps one from its
        first eager run (allocated by q's framework), so calls on one stream at a time. On
        CUDA run() neither waits (with the default ``check``) nor reads anything on the host
        and can be captured in a CUDA graph after one eager run. Shapes, heads or a device
        that disagree with the plan raise `MsaError`."""
        p = self._plan
        if p is None:
            raise MsaError(f"{type(self).__name__}: run() called before a successful plan()")
        check_arrays(q=q, k=k, v=v, out=out, lse=lse, k_scale=k_scale, v_scale=v_scale,
                     workspace=workspace)
        hnd = p["layout"] == "HND"
        q_hnd = hnd and p.get("q_hnd", False)
        mname, _ = p.get("names", ("M", "N"))
        if q_hnd:
            qn = self._heads_major(q, "q", f"[Hq, {mname}, D]")
        else:
            qv = unpack(q)[0]
            qn = qv.array if isinstance(qv, Typed) else qv
        m, hq, d = dims(qn, "q", 3, f"[{mname}, Hq, D]")
        want = (p["M"], p["num_qo_heads"], p["head_dim"])
        if (m, hq, d) != want:
            if q_hnd:
                raise MsaError(f"q: must be [Hq, {mname}, D] = {[want[1], want[0], want[2]]} as "
                               f"planned, got {[hq, m, d]}")
            raise MsaError(f"q: must be [{mname}, Hq, D] = {list(want)} as planned, got "
                           f"{[m, hq, d]}")
        if parse_device(qn) != p["device"]:
            raise MsaError(f"q: on {_device_name(parse_device(qn))}, but the plan is for "
                           f"{_device_name(p['device'])}; plan() again with device=")
        k, v = (self._kv(x, name, hnd) for x, name in ((k, "k"), (v, "v")))
        out_hnd = None
        if q_hnd:
            out_hnd = out
            if out_hnd is None:
                out_hnd = empty(q, (hq, m, d), _out_dtype(q) or dtype_of(q) or "f32")
            out = self._heads_major(out_hnd, "out", f"[Hq, {mname}, D]")
            if tuple(out.shape) != (m, hq, d):
                raise MsaError(f"out: must be [Hq, {mname}, D] = {[hq, m, d]}, got "
                               f"{list(out_hnd.shape)}")
            q = qn
        if workspace is None and not compiling():
            workspace = self._scratch(q, k, v, k_scale, v_scale)
        res = attention_forward(q, k, v, p["cu_q"], cu_seqlens_k=p["cu_k"], q2k=p["q2k"],
                                k2q=p["k2q"], softmax_scale=p["sm_scale"], causal=p["causal"],
                                soft_cap=p["soft_cap"], kv_block_size=p["kv_block_size"],
                                k_scale=k_scale, v_scale=v_scale, out=out, lse=lse,
                                return_lse=return_lse, workspace=workspace, stream=stream,
                                check=check, **self._key_mask_kw())
        if out_hnd is None:
            return res
        return (out_hnd,) + tuple(res[1:]) if return_lse else out_hnd

    def _key_mask_kw(self) -> dict:
        """The planned per-query key mask ``[M, N]`` as attention_forward's keywords (the CUDA
        workspace holds its packed bits, so its size counts them too); none without a mask."""
        m = self._plan.get("key_mask")
        return dict(key_mask=m, key_mask_rows=None if m is None else "query")

    @staticmethod
    def _heads_major(x: Any, name: str, what: str) -> Any:
        """An HND array ``[H, T, D]`` as a ``[T, H, D]`` view (plain arrays only)."""
        if isinstance(x, (QTensor, Typed)):
            raise MsaError(f"{name}: a {type(x).__name__} is taken with layout 'NHD' only")
        dims(x, name, 3, what)
        return x.transpose(0, 1) if framework(x) == "torch" else x.swapaxes(0, 1)

    def _kv(self, x: Any, name: str, hnd: bool) -> Any:
        """k or v checked against the plan, as an [N, Hkv, ...] array (a view for HND)."""
        p = self._plan
        if hnd and isinstance(x, (QTensor, Typed)):
            raise MsaError(f"{name}: a {type(x).__name__} is taken with layout 'NHD' only")
        if isinstance(x, QTensor):
            vals = x.values
        else:
            vals = x.array if isinstance(x, Typed) else x
        n = p.get("names", ("M", "N"))[1]
        shape = dims(vals, name, 3, f"[Hkv, {n}, D]" if hnd else f"[{n}, Hkv, D]")
        if hnd:
            shape = (shape[1], shape[0], shape[2])
        want = (p["N"], p["num_kv_heads"])
        if shape[:2] != want:
            got = [shape[1], shape[0]] if hnd else list(shape[:2])
            what = f"[Hkv, {n}, ...]" if hnd else f"[{n}, Hkv, ...]"
            raise MsaError(f"{name}: must be {what} = "
                           f"{[want[1], want[0]] if hnd else list(want)} as planned, got {got}")
        if parse_device(vals) != p["device"]:
            raise MsaError(f"{name}: on {_device_name(parse_device(vals))}, but the plan is for "
                           f"{_device_name(p['device'])}")
        return self._heads_major(x, name, f"[Hkv, {n}, D]") if hnd else x

    def _scratch(self, q: Any, k: Any, v: Any, k_scale: Any, v_scale: Any) -> Any:
        """The plan's workspace for these inputs (None on the CPU): kept from an eager run,
        allocated by q's framework when too small (while a CUDA graph is captured, the call
        allocates its own from the graph's pool instead)."""
        p = self._plan
        if p["device"][0] != "cuda":
            return None
        n = attention_workspace_bytes(q, k, v, p["cu_q"], cu_seqlens_k=p["cu_k"], q2k=p["q2k"],
                                      k2q=p["k2q"], causal=p["causal"],
                                      kv_block_size=p["kv_block_size"], k_scale=k_scale,
                                      v_scale=v_scale, **self._key_mask_kw())
        ws = self._workspace
        if ws is not None and ws.shape[0] >= n:
            return ws
        torch = _torch()
        if torch is None or not isinstance(p["q2k"], torch.Tensor) or \
                torch.cuda.is_current_stream_capturing():
            return None
        self._workspace = torch.empty(n, dtype=torch.uint8, device=p["q2k"].device)
        return self._workspace


class BlockSparseAttention(_SparsePlan):
    """Block-sparse attention over a FlashInfer BSR matrix, planned once and run many times.

    ::

        bsa = msa.BlockSparseAttention().plan(indptr, indices, M=M, N=N, R=R, C=C,
                                               num_qo_heads=Hq, num_kv_heads=Hkv, head_dim=D)
        out = bsa.run(q, k, v)        # q [M, Hq, D], k / v [N, Hkv, D]

    Query t attends the keys of the column blocks listed for block row ``t // R`` (cut by the
    causal rule with ``causal=True``). plan() maps the matrix to msa's q2k selection exactly as
    `bsr_to_q2k` does; run() is `attention_forward` over one request with it. See plan() for
    where each case runs and what is refused.
    """

    def plan(self, indptr: Any = None, indices: Any = None, *, M: int, N: int, R: int, C: int,
             num_qo_heads: int, num_kv_heads: int, head_dim: int, topk: Optional[int] = None,
             causal: bool = False, sm_scale: Optional[float] = None, kv_block_lens: Any = None,
             kv_block_size: Optional[int] = None, layout: str = "NHD", device: Any = None,
             stream: Any = None, mask: Any = None, packed_mask: Any = None,
             logits_soft_cap: Optional[float] = None, pos_encoding_mode: str = "NONE",
             rope_scale: Optional[float] = None, rope_theta: Optional[float] = None,
             block_mask: Any = None, q2k_indices: Any = None,
             q2k_num: Any = None) -> "BlockSparseAttention":
        """Plans attention over the BSR matrix (FlashInfer's ``BlockSparseAttentionWrapper.plan``
        arguments, as keywords after indptr and indices). Returns self.

        The matrix, in exactly one of FlashInfer's forms (else `MsaError`):

        - indptr ``[MB + 1]`` and indices ``[nnz]`` (MB = ceil(M / R) block rows, column ids in
          ``[0, NB)``, NB = ceil(N / C); the last blocks may be short): one matrix for every
          head. Per kv head: indptr ``[Hkv, MB + 1]``, indices ``[Hkv, L]``; on the host also
          ``[Hq, ...]`` when each group of Hq / Hkv query heads lists the same blocks.
        - ``block_mask=`` bool ``[H, MB, NB]`` (as `bsr_mask_to_q2k`), or ``q2k_indices=``
          integers ``[H, MB, K]`` with ``q2k_num=`` ``[H, MB]`` (row i of head h lists
          ``q2k_indices[h, i, :q2k_num[h, i]]``; without q2k_num all K; as
          `q2k_indices_to_q2k`). H is 1, num_kv_heads, or num_qo_heads, whose groups of Hq /
          Hkv heads must select the same blocks (FlashInfer reads each group's first head).
        - causal: msa's rule, bottom-right aligned (query t sees key j iff ``j <= t + N - M``;
          the usual mask when M = N). sm_scale: default ``1 / sqrt(head_dim)``.
        - kv_block_lens ``[NB]``: keep the first ``kv_block_lens[c]`` keys of block c.
        - kv_block_size: the block size of the q2k ids (default 128 or 64 when it divides C,
          else 1: key ids). The CPU takes any R and C; CUDA takes C a multiple of 64 as block
          ids (each column block is C / 128 msa blocks of 128 keys when 128 divides C, else
          C / 64 of 64), and any C or kv_block_lens as key ids (the token-sparse kernel).
        - layout: "NHD" (k, v ``[N, Hkv, D]``) or "HND" (``[Hkv, N, D]``, read as a strided
          view); q and out are ``[M, Hq, D]``.
        - device: where run() runs ('cpu', 'cuda[:i]', a torch.device or an array on it);
          default indptr's device.

        Where the selection is built:

        - CUDA torch indptr / indices or block_mask with ``topk`` (the most column blocks any
          block row lists, a host int), or CUDA torch q2k_indices (and q2k_num) with topk
          default K: on the device with torch ops, on ``stream`` (default the current one),
          without reading anything on the host (an element mask aside: see below). Shapes,
          dtypes and sizes are checked here; invalid ids, a bad indptr or q2k_num, a row with
          more than topk blocks, or query-head groups that differ make invalid q2k entries that
          msa's q2k checks report at run (``check=True`` or `msa.check_status`). Without
          ``topk`` (indptr / indices, block_mask) this is an `MsaError` (finding it would need
          a sync).
        - Anything else (numpy, CPU torch, cupy, or a device other than the arrays'): read on
          the host (a GPU array's stream is waited for), checked fully as `bsr_to_q2k` does
          (or as `bsr_mask_to_q2k` / `q2k_indices_to_q2k` do), and copied to the device. topk,
          when given, must not be less than the widest row.

        With block ids (kv_block_size 64 or 128) plan() also builds the k2q CSR index, so run()
        skips that build. Planning again makes new arrays (a CUDA graph captured over run()
        keeps reading the old ones: capture again). ``logits_soft_cap`` c > 0 caps the scores,
        ``c * tanh(s / c)`` after sm_scale, on both backends.
        Element masks, on either backend, with the indptr / indices form and causal=False
        (FlashInfer takes causal only without masks): ``mask`` bool or uint8 ``[nnz, R, C]``
        (or flat) for the listed blocks in entry order, or ``packed_mask``, its bits packed
        little-endian (FlashInfer's ``packbits``). plan() builds from them, on the host, a
        per-query bool ``key_mask [M, N]`` (M * N bytes) and places it on the plan's device;
        run() passes it to `attention_forward`, so on CUDA run() still neither waits nor reads
        the host and can be captured. plan() reads indptr, indices and the mask on the host
        for this: CUDA arrays are copied there, which waits for the GPU (torch's current
        stream), so a plan with a mask syncs even where the selection is built on the device
        (CUDA indptr / indices, which still need ``topk``).
        Refused (`MsaError` naming the argument): position encodings (``pos_encoding_mode``,
        ``rope_scale``, ``rope_theta``).
        """
        for name, value, default in (("pos_encoding_mode", pos_encoding_mode, "NONE"),
                                     ("rope_scale", rope_scale, None),
                                     ("rope_theta", rope_theta, None)):
            _refuse(name, value, default)
        check_arrays(indptr=indptr, indices=indices, kv_block_lens=kv_block_lens,
                     block_mask=block_mask, q2k_indices=q2k_indices, q2k_num=q2k_num)
        form = _form(indptr, indices, block_mask, q2k_indices, q2k_num)
        src = {"indptr": indptr, "block_mask": block_mask, "q2k_indices": q2k_indices}[form]
        M, N = count(M, "M", lo=1), count(N, "N", lo=1)
        R, C = count(R, "R", lo=1), count(C, "C", lo=1)
        hq, hkv, d, sm_scale, topk = _plan_sizes(num_qo_heads, num_kv_heads, head_dim, causal,
                                                 layout, sm_scale, topk)
        torch = _torch()
        kind, index = parse_device(device if device is not None else src)
        cap = _soft_cap(logits_soft_cap)
        mb, nb = _cdiv(M, R), _cdiv(N, C)
        key_mask = _element_key_mask(mask, packed_mask, indptr, indices, M=M, N=N, R=R, C=C,
                                     causal=causal, form=form)
        arrays = {"indptr": (indptr, indices), "block_mask": (block_mask,),
                  "q2k_indices": (q2k_indices,)}[form]
        on_device = (kind == "cuda" and torch is not None
                     and all(isinstance(x, torch.Tensor) and x.is_cuda for x in arrays)
                     and parse_device(src) == (kind, index))
        if on_device and form == "q2k_indices" and q2k_num is not None:
            on_device = isinstance(q2k_num, torch.Tensor) and q2k_num.is_cuda
        if on_device:
            if topk is None and form != "q2k_indices":
                what = "indptr / indices" if form == "indptr" else form
                raise MsaError(f"topk: required with CUDA {what} (the most column blocks a "
                               "block row lists): plan() builds the "
                               "selection on the device without reading the matrix on the host")
            # kv_block_lens need key ids (as on the host path, bsr_to_q2k)
            s = 1 if kv_block_lens is not None and kv_block_size is None else \
                _block_size(kv_block_size, C)
            check_cuda_plan(C, s, kv_block_lens)
            kw = dict(M=M, N=N, R=R, C=C, num_kv_heads=hkv, topk=topk, kv_block_size=s,
                      kv_block_lens=kv_block_lens)
            with _on_stream(stream, src.device):
                if form == "indptr":
                    _check_device_matrix(indptr, indices, mb, hkv, kv_block_lens, nb)
                    q2k = q2k_from_bsr_torch(indptr, indices, **kw)
                elif form == "block_mask":
                    _check_device_per_head("block_mask", block_mask, None, mb, nb, hkv, hq)
                    q2k = q2k_from_bsr_mask_torch(block_mask, **kw)
                else:
                    _check_device_per_head("q2k_indices", q2k_indices, q2k_num, mb, nb, hkv, hq)
                    q2k = q2k_from_q2k_indices_torch(q2k_indices, q2k_num, **kw)
            ref = q2k
        else:
            if kind == "cuda":
                check_cuda_plan(C, _block_size(kv_block_size, C), kv_block_lens)
            if form == "indptr":
                ip = _host(indptr, "indptr", (1, 2), "[MB + 1] or [H, MB + 1]")
                if topk is not None and ip.shape[-1] == mb + 1 and ip.shape[-1] > 1:
                    _check_topk(topk, int(_np().diff(ip, axis=-1).max()))
                q2k_np, s = _bsr_q2k(indptr, indices, R, C, M, N, hkv, kv_block_size,
                                     kv_block_lens, None)
            else:
                def blocks(mb_: int, nb_: int) -> Any:
                    if form == "block_mask":
                        b = _bsr_mask_blocks(block_mask, mb_, nb_)
                    else:
                        b = _q2k_indices_blocks(q2k_indices, q2k_num, mb_, nb_)
                    _check_heads(form, b.shape[0], hkv, hq)
                    if topk is not None:
                        _check_topk(topk, int(b.sum(-1).max(initial=0)))
                    return b
                q2k_np, s = _per_head_q2k(blocks, form, R, C, M, N, hkv, kv_block_size,
                                          kv_block_lens, None)
            if kind == "cuda":  # an explicit kv_block_size, or kv_block_lens
                check_cuda_plan(C, s, None)
            q2k = ref = _placed(q2k_np, src, kind, index)
        use_torch = torch is not None and isinstance(ref, torch.Tensor)
        with _on_stream(stream if on_device else None, ref.device if use_torch else None):
            cu_q = _offsets(ref, M, use_torch)
            cu_k = _offsets(ref, N, use_torch)
            if key_mask is not None:
                key_mask = _placed(key_mask, src, kind, index)
        k2q = None
        if s in (64, 128):
            k2q = build_k2q_csr(q2k, cu_q, cu_seqlens_k=cu_k, kv_block_size=s,
                                total_rows=_cdiv(N, s), stream=stream)
        self._plan = dict(q2k=q2k, k2q=k2q, cu_q=cu_q, cu_k=cu_k, kv_block_size=s, M=M, N=N,
                          R=R, C=C, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d,
                          causal=causal, sm_scale=sm_scale, soft_cap=cap, layout=layout,
                          device=(kind, index), key_mask=key_mask)
        return self

def _form(indptr: Any, indices: Any, block_mask: Any, q2k_indices: Any, q2k_num: Any) -> str:
    """Which of FlashInfer's forms plan() got: "indptr" (with indices), "block_mask" or
    "q2k_indices" (with an optional q2k_num); exactly one, else an MsaError naming it."""
    if q2k_num is not None and q2k_indices is None:
        raise MsaError("q2k_num: given without q2k_indices (it counts the valid entries of each "
                       "q2k_indices row)")
    given = [name for name, there in (("indptr / indices",
                                       indptr is not None or indices is not None),
                                      ("block_mask", block_mask is not None),
                                      ("q2k_indices", q2k_indices is not None)) if there]
    if len(given) != 1:
        first = given[1] if len(given) > 1 else "indptr"
        raise MsaError(f"{first.split(' ')[0]}: pass exactly one block-sparse form: indptr and "
                       "indices, block_mask, or q2k_indices (with q2k_num); got "
                       f"{' and '.join(given) if given else 'none'}")
    if given[0] == "indptr / indices":
        if indptr is None:
            raise MsaError("indptr: required with indices")
        if indices is None:
            raise MsaError("indices: required with indptr")
        return "indptr"
    return given[0]


def _check_topk(topk: int, widest: int) -> None:
    if widest > topk:
        raise MsaError(f"topk: {topk} is less than the {widest} column blocks of the widest "
                       "block row")


def _check_heads(name: str, h: int, hkv: int, hq: int) -> None:
    if h not in (1, hkv, hq):
        raise MsaError(f"{name}: must have 1, num_kv_heads = {hkv} or num_qo_heads = {hq} "
                       f"heads, got {h}")


def _check_device_per_head(name: str, x: Any, num: Any, mb: int, nb: int, hkv: int,
                           hq: int) -> None:
    """What can be checked of a device block_mask or q2k_indices / q2k_num without reading
    them."""
    torch = _torch()
    if name == "block_mask":
        if x.dtype != torch.bool:
            raise MsaError(f"block_mask: must be a bool tensor, got {x.dtype}")
        if x.dim() != 3 or tuple(x.shape[1:]) != (mb, nb):
            raise MsaError(f"block_mask: must be [H, MB, NB] = [H, {mb}, {nb}] (MB = ceil(M / "
                           f"R), NB = ceil(N / C)), got shape {list(x.shape)}")
    else:
        for n_, a in (("q2k_indices", x), ("q2k_num", num)):
            if a is None:
                continue
            if a.dtype.is_floating_point or a.dtype.is_complex or a.dtype == torch.bool:
                raise MsaError(f"{n_}: must be an integer tensor, got {a.dtype}")
            if a.device != x.device:
                raise MsaError(f"{n_}: on {a.device}, q2k_indices on {x.device}")
        if x.dim() != 3 or x.shape[1] != mb:
            raise MsaError(f"q2k_indices: must be [H, MB, K] with MB = ceil(M / R) = {mb}, got "
                           f"shape {list(x.shape)}")
        if num is not None and tuple(num.shape) != tuple(x.shape[:2]):
            raise MsaError(f"q2k_num: must be [H, MB] = {list(x.shape[:2])} like q2k_indices, "
                           f"got shape {list(num.shape)}")
    _check_heads(name, x.shape[0], hkv, hq)


def _placed(a: Any, indptr: Any, kind: str, index: int) -> Any:
    """The host array `a` on the plan's device: a torch tensor for torch indptr or a CUDA plan,
    a cupy array for a cupy indptr on that device, else numpy."""
    torch = _torch()
    if framework(indptr) == "cupy" and parse_device(indptr) == (kind, index):
        return _like(indptr, a)
    if torch is not None and (kind == "cuda" or isinstance(indptr, torch.Tensor)):
        return torch.from_numpy(_np().ascontiguousarray(a)).to(
            "cpu" if kind == "cpu" else f"cuda:{index}")
    if kind == "cuda":
        raise MsaError("device: a CUDA plan from host arrays needs torch (or a cupy indptr on "
                       "that device)")
    return a


def _device_name(dev: tuple) -> str:
    return "cpu" if dev[0] == "cpu" else f"cuda:{dev[1]}"


def _check_device_matrix(indptr: Any, indices: Any, mb: int, hkv: int, kv_block_lens: Any,
                         nb: int) -> None:
    """What can be checked of device indptr / indices / kv_block_lens without reading them."""
    torch = _torch()
    for name, x in (("indptr", indptr), ("indices", indices), ("kv_block_lens", kv_block_lens)):
        if x is None:
            continue
        if not isinstance(x, torch.Tensor):
            raise MsaError(f"{name}: must be a torch tensor like indptr")
        if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
            raise MsaError(f"{name}: must be an integer tensor, got {x.dtype}")
        if x.device != indptr.device:
            raise MsaError(f"{name}: on {x.device}, indptr on {indptr.device}")
    if indptr.dim() not in (1, 2) or indptr.shape[-1] != mb + 1:
        raise MsaError(f"indptr: must be [MB + 1] or [Hkv, MB + 1] with MB + 1 = {mb + 1} "
                       f"(MB = ceil(M / R)), got shape {list(indptr.shape)}")
    if indptr.dim() == 2:
        if indptr.shape[0] not in (1, hkv):
            raise MsaError(f"indptr: a per-head matrix on the device has 1 or num_kv_heads = "
                           f"{hkv} rows, got {indptr.shape[0]} (query-head matrices are taken "
                           "from host arrays, where their groups are checked)")
        if indices.dim() != 2 or indices.shape[0] != indptr.shape[0]:
            raise MsaError(f"indices: must be [{indptr.shape[0]}, L] like indptr, got shape "
                           f"{list(indices.shape)}")
    elif indices.dim() != 1:
        raise MsaError(f"indices: must be [nnz] (1 dim), got shape {list(indices.shape)}")
    if kv_block_lens is not None and tuple(kv_block_lens.shape) != (nb,):
        raise MsaError(f"kv_block_lens: must be [NB] = [{nb}] (NB = ceil(N / C)), got shape "
                       f"{list(kv_block_lens.shape)}")


class _on_stream:
    """Runs torch ops on `stream` (a torch.cuda.Stream or an int handle) when given."""

    def __init__(self, stream: Any, device: Any) -> None:
        self._ctx = None
        torch = _torch()
        if stream is None or torch is None or device is None or device.type != "cuda":
            return
        if isinstance(stream, int):
            stream = torch.cuda.ExternalStream(stream, device=device)
        self._ctx = torch.cuda.stream(stream)

    def __enter__(self) -> None:
        if self._ctx is not None:
            self._ctx.__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self._ctx is not None:
            self._ctx.__exit__(*exc)


__all__ = ["BlockSparseAttention"]
