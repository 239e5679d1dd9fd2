"""msa's public ops for Python: block scores, top-K selection (alone or fused with the
indexer), the k2q CSR index, sparse/dense attention (flat or paged KV), quantization. Each takes
any DLPack array (torch, numpy, cupy) and allocates its outputs with the caller's framework;
torch tensors go through the torch custom ops (torch.ops.msa.*) so torch.compile and CUDA
graphs see them."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Sequence

from . import _C, _impl
from ._arrays import Typed, _torch, as_arg, empty, is_torch, stream_handle

if _torch() is not None:
    from . import _torch_ops as _tops
else:
    _tops = None

#: The exception every msa check raises; its message names the argument and the rule broken.
MsaError = _C.MsaError


class QTensor(NamedTuple):
    """A quantized tensor: values, scale (None for bf16/f16), NVFP4 global scale, and the
    format it came from (None when unknown). Returned by `quantize`; accepted wherever q or k
    may be quantized (`block_scores`) and by `dequantize`."""

    values: Any
    scale: Any = None
    global_scale: float = 1.0
    format: Optional[str] = None


class K2QIndex(NamedTuple):
    """The key-block -> queries CSR index: row_ptr [Hkv, total_rows + 1], q_idx
    [Hkv, total_q * topk] and the opaque int32 work schedule (None if not requested)."""

    row_ptr: Any
    q_idx: Any
    schedule: Any = None


def _unpack(x: Any, scale: Any, global_scale: float) -> tuple:
    """(values, scale, global_scale) of a plain array or a QTensor (typed by its format)."""
    if not isinstance(x, QTensor):
        return x, scale, global_scale
    values, qscale = x.values, x.scale
    if x.format is not None:
        values = _impl._tag(values, _impl.VALUE_DTYPES[x.format])
        qscale = _impl._tag(qscale, _impl.SCALE_DTYPES[x.format])
    return values, qscale, x.global_scale


def _kv(k: Any, v: Any = None, *, cu_seqlens_k: Any = None, page_table: Any = None,
        seqused_k: Any = None, kv_layout: Optional[str] = None, k_scale: Any = None,
        v_scale: Any = None) -> dict:
    """The KV cache as the dict _impl passes to msa._C."""
    layout = _impl.layout_name(kv_layout, page_table)
    k, k_scale, k_global = _unpack(k, k_scale, 1.0)
    kv = {"kv_layout": layout, "k": k, "k_scale": k_scale, "k_global_scale": k_global,
          "cu_seqlens_k": cu_seqlens_k, "page_table": page_table, "seqused_k": seqused_k}
    if v is not None:
        v, v_scale, v_global = _unpack(v, v_scale, 1.0)
        kv.update(v=v, v_scale=v_scale, v_global_scale=v_global)
    if layout == "flat" and cu_seqlens_k is None:
        raise ValueError("cu_seqlens_k: required for a flat KV cache (or pass page_table)")
    return kv


def _torch_path(*arrays: Any) -> bool:
    """True when the call can go through a torch custom op: torch inputs, none of them Typed
    (custom ops take plain tensors). Outputs passed by the caller use the direct path."""
    if _tops is None or not is_torch(arrays[0]):
        return False
    return not any(isinstance(a, Typed) for a in arrays)


def _indexer_inputs(q: Any, q_scale: Any, q_global_scale: float, k: Any, k_scale: Any,
                    k_global_scale: float, **kv_args: Any) -> tuple:
    """(q values, q scale, q global scale, key cache dict) of the indexer ops. A QTensor k
    keeps its own global scale unless that is the default 1.0, so the keyword can set it."""
    q, q_scale, q_global_scale = _unpack(q, q_scale, q_global_scale)
    kv = _kv(k, k_scale=k_scale, **kv_args)
    if kv["k_global_scale"] == 1.0:
        kv["k_global_scale"] = k_global_scale
    return q, q_scale, q_global_scale, kv


def block_scores(q: Any, k: Any, cu_seqlens_q: Any, *, cu_seqlens_k: Any = None,
                 page_table: Any = None, seqused_k: Any = None,
                 kv_layout: Optional[str] = None, causal: bool = True,
                 kv_block_size: int = 128, q_scale: Any = None, q_global_scale: float = 1.0,
                 k_scale: Any = None, k_global_scale: float = 1.0,
                 max_seqlen_k: Optional[int] = None, out: Any = None, stream: Any = None,
                 check: bool = True) -> Any:
    """Indexer block scores (DESIGN.md section 2).

    ``scores[hq, kb, t] = max over the keys j of block kb visible to query t of
    dot(q[t, hq], k[j, hq // G])`` (dequantized inputs, no softmax scale), ``-inf`` where the
    block has no visible key. Returns f32 ``[Hq, nblk_max, total_q]``.

    q: ``[total_q, Hq, D]`` bf16/f16/fp8_e4m3 (fp4x2 ``[total_q, Hq, D/2]``) or a `QTensor`;
    k: flat ``[total_k, Hkv, D]`` with ``cu_seqlens_k``, or a page pool (``page_table``,
    optional ``seqused_k``, ``kv_layout`` "paged_nhd"/"paged_hnd"); same value dtype as q.
    q_scale/k_scale: FP8 per-token (or per-tensor) f32 scales, NVFP4/MXFP4 block scales; a page
    pool's per-token scales are per slot, ``[num_pages * page_size]`` (slot s of page P at
    P * page_size + s), or ``[num_pages * page_size, Hkv]``.
    nblk_max is ``ceil(max_seqlen_k / kv_block_size)``; without max_seqlen_k it is the longest
    batch of a flat cache (read from cu_seqlens_k: a host sync for GPU arrays) or the page
    table's capacity for a paged one.
    """
    q, q_scale, q_global_scale, kv = _indexer_inputs(
        q, q_scale, q_global_scale, k, k_scale, k_global_scale, cu_seqlens_k=cu_seqlens_k,
        page_table=page_table, seqused_k=seqused_k, kv_layout=kv_layout)
    nblk_max = _impl.max_blocks(kv, kv_block_size, max_seqlen_k)
    if out is None and _torch_path(q, q_scale, kv["k"], kv["k_scale"]):
        return _tops.block_scores(q, q_scale, kv["k"], kv["k_scale"], cu_seqlens_q, cu_seqlens_k,
                                  page_table, seqused_k, kv["kv_layout"], float(q_global_scale),
                                  float(kv["k_global_scale"]), causal, kv_block_size, nblk_max,
                                  check, _stream_int(stream))
    return _impl.block_scores(q, q_scale, q_global_scale, kv, cu_seqlens_q, causal=causal,
                              kv_block_size=kv_block_size, nblk_max=nblk_max, out=out,
                              stream=stream, check=check)


def block_topk(q: Any, k: Any, cu_seqlens_q: Any, *, cu_seqlens_k: Any = None,
               page_table: Any = None, seqused_k: Any = None, kv_layout: Optional[str] = None,
               topk: int = 16, sink_blocks: int = 1, local_blocks: int = 1, causal: bool = True,
               kv_block_size: int = 128, q_scale: Any = None, q_global_scale: float = 1.0,
               k_scale: Any = None, k_global_scale: float = 1.0, out: Any = None,
               stream: Any = None, check: bool = True) -> Any:
    """The indexer fused with top-K selection (DESIGN.md sections 2 and 3):
    ``q2k [Hkv, total_q, topk]`` int32.

    Equals ``select_topk(block_scores(q, k, ...), ...)`` with the same options, without
    materializing the ``[Hq, nblk, total_q]`` f32 scores (2.1 GB at 32K tokens and 64 heads).
    Inputs as in `block_scores` (q/k values, a `QTensor`, scales, flat or paged keys); selection
    as in `select_topk` (sink and local blocks forced, then the highest group scores, ties
    toward the lower id; rows ascending, -1 padded). The kv heads come from k, and no block
    count is needed, so nothing is read on the host. CUDA so far: bf16/f16, flat keys,
    D = 128, ``kv_block_size`` 128, ``topk <= 64``; other inputs raise `MsaError` naming the
    feature. ``out``: a preallocated q2k.
    """
    q, q_scale, q_global_scale, kv = _indexer_inputs(
        q, q_scale, q_global_scale, k, k_scale, k_global_scale, cu_seqlens_k=cu_seqlens_k,
        page_table=page_table, seqused_k=seqused_k, kv_layout=kv_layout)
    if out is None and _torch_path(q, q_scale, kv["k"], kv["k_scale"]):
        return _tops.block_topk(q, q_scale, kv["k"], kv["k_scale"], cu_seqlens_q, cu_seqlens_k,
                                page_table, seqused_k, kv["kv_layout"], float(q_global_scale),
                                float(kv["k_global_scale"]), topk, sink_blocks, local_blocks,
                                causal, kv_block_size, check, _stream_int(stream))
    return _impl.block_topk(q, q_scale, q_global_scale, kv, cu_seqlens_q, causal=causal,
                            kv_block_size=kv_block_size, topk=topk, sink_blocks=sink_blocks,
                            local_blocks=local_blocks, out=out, stream=stream, check=check)


def select_topk(scores: Any, cu_seqlens_q: Any, *, num_kv_heads: int, topk: int = 16,
                sink_blocks: int = 1, local_blocks: int = 1, causal: bool = True,
                kv_block_size: int = 128, cu_seqlens_k: Any = None, page_table: Any = None,
                seqused_k: Any = None, k: Any = None, kv_layout: Optional[str] = None,
                out: Any = None, stream: Any = None, check: bool = True) -> Any:
    """Top-K block selection (DESIGN.md section 3): ``q2k [Hkv, total_q, topk]`` int32.

    Per (kv head, query): the first ``sink_blocks`` blocks and the ``local_blocks`` blocks
    ending at the query's last visible key (each if visible), then the visible blocks with the
    highest group score (max over the G query heads), ties toward the lower id; each row in
    ascending block id, padded with -1. The KV lengths come from ``cu_seqlens_k`` (flat) or
    ``page_table``/``seqused_k`` plus ``k`` (its shape gives the page size).
    """
    kv = _kv(k, cu_seqlens_k=cu_seqlens_k, page_table=page_table,
             seqused_k=seqused_k, kv_layout=kv_layout)
    if out is None and _torch_path(scores):
        return _tops.select_topk(scores, cu_seqlens_q, kv["k"], cu_seqlens_k, page_table,
                                 seqused_k, kv["kv_layout"], num_kv_heads, topk, sink_blocks,
                                 local_blocks, causal, kv_block_size, check, _stream_int(stream))
    return _impl.select_topk(scores, cu_seqlens_q, kv, num_kv_heads=num_kv_heads, topk=topk,
                             sink_blocks=sink_blocks, local_blocks=local_blocks, causal=causal,
                             kv_block_size=kv_block_size, out=out, stream=stream, check=check)


def build_k2q_csr(q2k: Any, cu_seqlens_q: Any, *, cu_seqlens_k: Any = None,
                  page_table: Any = None, seqused_k: Any = None, k: Any = None,
                  kv_layout: Optional[str] = None, kv_block_size: int = 128,
                  return_schedule: bool = True, total_rows: Optional[int] = None,
                  out: Optional[Sequence[Any]] = None, stream: Any = None,
                  check: bool = True) -> K2QIndex:
    """The k2q CSR index of a q2k selection (DESIGN.md section 4), as a `K2QIndex`.

    Rows are (batch, kv block) pairs, ``total_rows = sum_b ceil(Lk_b / kv_block_size)``; pass
    ``total_rows`` to skip reading the lengths on the host (a sync for GPU arrays). With
    ``return_schedule`` the work schedule for attention_forward is built too. Invalid ids in
    q2k (outside ``[-1, nblk_b)`` or repeated in a row) raise `MsaError` naming the first
    offending (head, token, slot). ``out``: preallocated (row_ptr, q_idx[, schedule]).
    """
    kv = _kv(k, cu_seqlens_k=cu_seqlens_k, page_table=page_table, seqused_k=seqused_k,
             kv_layout=kv_layout)
    if kv["kv_layout"] != "flat" and kv["k"] is None:
        raise ValueError("k: required for a paged KV cache (its shape gives the page size)")
    rows = total_rows
    if out is None and rows is None:
        rows = _impl.total_rows(kv, kv_block_size)
    if out is None and _torch_path(q2k):
        row_ptr, q_idx, schedule = _tops.build_k2q_csr(
            q2k, cu_seqlens_q, kv["k"], cu_seqlens_k, page_table, seqused_k, kv["kv_layout"],
            kv_block_size, int(rows), return_schedule, check, _stream_int(stream))
        return K2QIndex(row_ptr, q_idx, schedule if return_schedule else None)
    return K2QIndex(*_impl.build_k2q_csr(q2k, cu_seqlens_q, kv, kv_block_size=kv_block_size,
                                         rows=rows or 0, return_schedule=return_schedule,
                                         out=None if out is None else tuple(out),
                                         stream=stream, check=check))


def attention_forward(q: Any, k: Any, v: Any, cu_seqlens_q: Any, *, cu_seqlens_k: Any = None,
                      page_table: Any = None, seqused_k: Any = None,
                      kv_layout: Optional[str] = None, q2k: Any = None,
                      k2q: Optional[Sequence[Any]] = None,
                      softmax_scale: Optional[float] = None, causal: bool = True,
                      kv_block_size: int = 128, temperature: Optional[float] = None,
                      partial_dtype: str = "f32", k_scale: Any = None, v_scale: Any = None,
                      out: Any = None, lse: Any = None, tlse: Any = None, stream: Any = None,
                      check: bool = True) -> tuple:
    """Sparse (with ``q2k``) or dense (without) attention, flat or paged KV (DESIGN.md 5, 6).

    Returns ``(out, lse)``, or ``(out, lse, tlse)`` when ``temperature`` is set:
    out ``[total_q, Hq, D]`` in q's dtype (bf16/f16), 0 for a query with no key;
    lse ``[Hq, total_q]`` f32 natural-log ``log sum_j exp(s_j)``, ``-inf`` with no key;
    tlse ``[Hq, total_q]`` f32 ``log sum_j exp(s_j / temperature)``.
    ``s_j = softmax_scale * dot(q, k_j)``, softmax_scale defaulting to ``1/sqrt(D)``.
    q2k ``[Hkv, total_q, topk]`` int32 selects kv blocks per (kv head, query); ``k2q`` (from
    build_k2q_csr for the same q2k) lets the GPU kernel skip rebuilding the index. k/v may be
    fp8_e4m3 with f32 scales (``k_scale``/``v_scale``). ``out``/``lse``/``tlse``: preallocated
    outputs. GPU calls run on ``stream`` or the caller's current stream; with ``check`` the call
    waits for the stream and raises `MsaError` for invalid block/page ids (skipped while the
    stream is captured into a CUDA graph).
    """
    kv = _kv(k, v, cu_seqlens_k=cu_seqlens_k, page_table=page_table, seqused_k=seqused_k,
             kv_layout=kv_layout, k_scale=k_scale, v_scale=v_scale)
    k2q = tuple(k2q) if k2q is not None else None
    if out is None and lse is None and tlse is None and _torch_path(
            q, kv["k"], kv["v"], kv["k_scale"], kv["v_scale"], q2k):
        row_ptr, q_idx, schedule = (k2q + (None,))[:3] if k2q is not None else (None,) * 3
        out, lse, tlse = _tops.attention_forward(
            q, kv["k"], kv["v"], cu_seqlens_q, cu_seqlens_k, page_table, seqused_k,
            kv["k_scale"], kv["v_scale"], q2k, row_ptr, q_idx, schedule, kv["kv_layout"],
            float(softmax_scale or 0.0), causal, kv_block_size, float(temperature or 0.0),
            partial_dtype, check, _stream_int(stream))
    else:
        out, lse, tlse = _impl.attention_forward(
            q, kv, cu_seqlens_q, q2k=q2k, k2q=k2q, softmax_scale=softmax_scale, causal=causal,
            kv_block_size=kv_block_size, temperature=temperature, partial_dtype=partial_dtype,
            out=out, lse=lse, tlse=tlse, stream=stream, check=check)
    return (out, lse, tlse) if temperature else (out, lse)


def quantize(x: Any, format: str, *, global_scale: float = 1.0,
             out: Optional[Sequence[Any]] = None, stream: Any = None) -> QTensor:
    """Quantizes ``x [T, H, D]`` (f32/bf16/f16) to `format` (DESIGN.md section 8):

    - "fp8_per_tensor" / "fp8_per_token" / "fp8_per_token_head": fp8_e4m3 values ``[T, H, D]``,
      f32 scale ``[1]`` / ``[T]`` / ``[T, H]`` = amax / 448;
    - "nvfp4": fp4x2 values ``[T, H, D/2]``, fp8_e4m3 scale ``[T, H, D/16]`` (times
      ``global_scale``);
    - "mxfp4": fp4x2 values ``[T, H, D/2]``, e8m0 scale ``[T, H, D/32]``.

    Returns a `QTensor`. numpy without ml_dtypes holds fp8/e8m0 as uint8; fp4x2 is uint8 in
    numpy (two e2m1 values a byte, element 2i in the low nibble).
    """
    if format not in _impl.VALUE_DTYPES:
        raise ValueError(f"format: must be one of {sorted(_impl.VALUE_DTYPES)}, got {format!r}")
    if out is None and _torch_path(x):
        values, scale = _tops.quantize(x, format, float(global_scale), _stream_int(stream))
    else:
        values, scale = _impl.quantize(x, format, global_scale=global_scale,
                                       out=None if out is None else tuple(out), stream=stream)
    return QTensor(values, scale, float(global_scale), format)


def dequantize(x: Any, scale: Any = None, *, format: Optional[str] = None,
               global_scale: float = 1.0, dtype: str = "f32", out: Any = None,
               stream: Any = None) -> Any:
    """The exact dequantized values of `x` (a `QTensor`, or values plus ``scale``), rounded
    once to `dtype` ("f32", "bf16" or "f16"): ``[T, H, D]``. ``format`` types uint8 storage
    arrays (numpy without ml_dtypes); a QTensor carries its own."""
    if isinstance(x, QTensor):
        x, scale, global_scale, format = x.values, x.scale, x.global_scale, x.format
    if out is None and _torch_path(x, scale):
        return _tops.dequantize(x, scale, format, float(global_scale), dtype, _stream_int(stream))
    return _impl.dequantize(x, scale, format, global_scale=global_scale, dtype=dtype, out=out,
                            stream=stream)


def check_status(status: Any, stream: Any = None) -> None:
    """Waits for the stream, then raises `MsaError` if a status buffer (int32[4]) passed to
    GPU ops recorded an invalid index."""
    _C.check_status(status=as_arg(status), stream=stream_handle(status, stream))


def q2k_to_k2q(q2k: Any, cu_seqlens_q: Any, *, cu_seqlens_k: Any = None,
               page_table: Any = None, seqused_k: Any = None, k: Any = None,
               kv_layout: Optional[str] = None, kv_block_size: int = 128) -> K2QIndex:
    """CPU reference converter q2k -> (row_ptr, q_idx), for tests (host arrays only)."""
    kv = _kv(k, cu_seqlens_k=cu_seqlens_k, page_table=page_table, seqused_k=seqused_k,
             kv_layout=kv_layout)
    hkv, total_q, topk = (int(s) for s in q2k.shape)
    row_ptr = empty(q2k, (hkv, _impl.total_rows(kv, kv_block_size) + 1), "i32")
    q_idx = empty(q2k, (hkv, total_q * topk), "i32")
    _C.q2k_to_k2q_cpu(q2k=as_arg(q2k), cu_seqlens_q=as_arg(cu_seqlens_q), **_impl.kv_kwargs(kv),
                      kv_block_size=kv_block_size, row_ptr=as_arg(row_ptr), q_idx=as_arg(q_idx))
    return K2QIndex(row_ptr, q_idx)


def k2q_to_q2k(k2q: Sequence[Any], cu_seqlens_q: Any, *, topk: int, cu_seqlens_k: Any = None,
               page_table: Any = None, seqused_k: Any = None, k: Any = None,
               kv_layout: Optional[str] = None, kv_block_size: int = 128) -> Any:
    """CPU reference converter (row_ptr, q_idx) -> q2k ``[Hkv, total_q, topk]``, each query's
    blocks ascending and -1 padded (host arrays only)."""
    kv = _kv(k, cu_seqlens_k=cu_seqlens_k, page_table=page_table, seqused_k=seqused_k,
             kv_layout=kv_layout)
    row_ptr, q_idx = k2q[0], k2q[1]
    hkv = int(row_ptr.shape[0])
    total_q = int(cu_seqlens_q[-1])
    q2k = empty(row_ptr, (hkv, total_q, topk), "i32")
    _C.k2q_to_q2k_cpu(row_ptr=as_arg(row_ptr), q_idx=as_arg(q_idx),
                      cu_seqlens_q=as_arg(cu_seqlens_q), **_impl.kv_kwargs(kv),
                      kv_block_size=kv_block_size, q2k=as_arg(q2k))
    return q2k


def _stream_int(stream: Any) -> Optional[int]:
    """A stream argument as the int a torch custom op takes (None: the current stream)."""
    return None if stream is None else stream_handle(None, stream)


__all__ = ["MsaError", "QTensor", "K2QIndex", "block_scores", "block_topk", "select_topk",
           "build_k2q_csr", "attention_forward", "quantize", "dequantize", "check_status",
           "q2k_to_k2q", "k2q_to_q2k"]
