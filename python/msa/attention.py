"""Attention (docs/semantics.md, Attention and Paged KV): `attention_forward` (sparse with a
q2k selection, or dense) over a flat or paged KV cache, and `sparse_attention`, the whole
prefill path (fused indexer + top-K, k2q CSR, attention) as the C++ library's one-call pipeline.
GPU calls run on the caller's stream and never wait for it unless asked to (``check``)."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Sequence

from . import _C
from ._arrays import Typed, dtype_of, empty, framework
from ._kv import kv_args, kv_heads_of, kv_into, layout_name
from ._runtime import (_TorchTensor, MsaError, allocator, arg, check_arrays, check_sequence,
                       compiling, count, dims, finish, plain_arrays, status_for, stream_of, torch)
from .quant import unpack

_PARTIAL = {None: "", "f32": "f32", "bf16": "bf16"}


def _partial(partial_dtype: Optional[str]) -> str:
    if partial_dtype not in _PARTIAL:
        raise MsaError(f"partial_dtype: must be 'f32', 'bf16' or None (bf16 for bf16 q, f32 for "
                       f"f16 q), got {partial_dtype!r}")
    return _PARTIAL[partial_dtype]


class Visibility(NamedTuple):
    """Dense attention's keywords (`attention_forward`): per-request causal offsets, a key mask
    and its row kind, the soft-cap; None for each one not given."""

    causal_offset: Any = None
    key_mask: Any = None
    key_mask_rows: Optional[str] = None
    soft_cap: Optional[float] = None

    def kwargs(self) -> dict:
        """The keywords of msa._C's attention ops."""
        return dict(causal_offset=arg(self.causal_offset), key_mask=arg(self.key_mask),
                    key_mask_rows=self.key_mask_rows, soft_cap=float(self.soft_cap or 0.0))

    def op_args(self) -> tuple:
        """The positional arguments of the torch custom ops (_torch_ops)."""
        return (self.causal_offset, self.key_mask, self.key_mask_rows or "",
                float(self.soft_cap or 0.0))


_NO_VISIBILITY = Visibility()


def check_attention_arrays(q: Any, k2q: Any, names: Sequence[str], *arrays: Any) -> None:
    """The array arguments of an attention call (`arrays`, which `names` spells: positional,
    as keywords would cost a dict a call), k2q a sequence of them, and q's dims, before anything
    is allocated."""
    if not plain_arrays(q, *arrays):
        check_arrays(q=q, **dict(zip(names, arrays)))
    check_sequence(k2q, "k2q", "(row_ptr, q_idx[, schedule])", (2, 3))
    dims(unpack(q)[0], "q", 3, "[total_q, Hq, D]")


#: The arrays attention_forward passes to check_attention_arrays, in its order.
_ATTENTION_ARRAYS = ("k", "v", "cu_seqlens_q", "cu_seqlens_k", "page_table", "seqused_k", "q2k",
                     "q_scale", "k_scale", "v_scale", "causal_offset", "key_mask", "out", "lse",
                     "tlse", "workspace")


def _visibility(causal_offset: Any, key_mask: Any, key_mask_rows: Optional[str],
                soft_cap: Optional[float]) -> Visibility:
    if causal_offset is None and key_mask is None and key_mask_rows is None and soft_cap is None:
        return _NO_VISIBILITY
    return Visibility(causal_offset, key_mask, key_mask_rows, soft_cap)


def _results(out: Any, lse: Any, tlse: Any, return_lse: bool, temperature: Optional[float]):
    """out, (out, lse), with the tlse last when a temperature is set."""
    if not return_lse and not temperature:
        return out
    res = (out, lse) if return_lse else (out,)
    return res + (tlse,) if temperature else res


def attention_forward(q: Any, k: Any, v: Any, cu_seqlens_q: Any, *, cu_seqlens_k: Any = None,
                      page_table: Any = None, seqused_k: Any = None,
                      kv_layout: Optional[str] = None, q2k: Any = None,
                      k2q: Optional[Sequence[Any]] = None,
                      softmax_scale: Optional[float] = None, causal: bool = True,
                      kv_block_size: int = 128, temperature: Optional[float] = None,
                      partial_dtype: Optional[str] = None, q_scale: Any = None,
                      k_scale: Any = None, v_scale: Any = None, out: Any = None, lse: Any = None,
                      tlse: Any = None, return_lse: bool = False, workspace: Any = None,
                      stream: Any = None, check: Optional[bool] = None,
                      causal_offset: Any = None, key_mask: Any = None,
                      key_mask_rows: Optional[str] = None,
                      soft_cap: Optional[float] = None) -> Any:
    """Sparse (with ``q2k``) or dense (without) attention, flat or paged KV.

    Returns ``out`` ``[total_q, Hq, D]`` in q's dtype (bf16/f16; bf16 for fp8_e4m3 q; 0 for a
    query with no key), or ``(out, lse)`` with ``return_lse`` (lse ``[Hq, total_q]`` f32,
    natural log ``log sum_j exp(s_j)``, ``-inf`` with no key); with ``temperature`` the tlse
    ``[Hq, total_q]`` f32 ``log sum_j exp(s_j / temperature)`` comes last.
    ``s_j = softmax_scale * dot(q, k_j)``, softmax_scale defaulting to ``1/sqrt(D)``.

    q2k ``[Hkv, total_q, topk]`` int32 selects kv blocks per (kv head, query); ``k2q`` (from
    `build_k2q_csr` for the same q2k) lets the GPU kernel skip building the index. k/v may be
    fp8_e4m3 with f32 scales (``k_scale``/``v_scale``, or a `QTensor` each). q may be fp8_e4m3
    (a `QTensor` from `quantize`, or values plus ``q_scale``): f32 ``q_scale`` of ``[1]`` (per
    tensor), ``[total_q]`` (per token) or ``[total_q, Hq]`` (per token and head), contiguous,
    absent meaning 1; q's values are then q * q_scale, k/v may be bf16, fp8_e4m3 or fp4x2 (not
    f16) and out is bf16 (on CUDA q's values convert exactly and q_scale applies to the scores
    in f32). ``partial_dtype``: the precision of the
    per-block partial outputs, "f32" or "bf16" (default: bf16 for bf16 q, f32 for f16 q).
    ``out``/``lse``/``tlse``: preallocated outputs; ``workspace``: u8 scratch of at least
    ``attention_workspace_bytes`` (default: allocated per call by q's framework). GPU calls run
    on ``stream`` or the caller's current stream and do not wait for it; ``check=True`` (or the
    MSA_CHECK_SYNC=1 environment switch) waits and raises `MsaError` for invalid block or page
    ids, which are otherwise raised by `msa.check_status`.

    Dense attention's visibility and scores (docs/semantics.md, Dense attention; the CUDA
    prefill takes all three, with or without q2k, and raises `MsaError` naming what it does
    not take): ``causal_offset`` int32 ``[B]`` replaces
    the bottom-right causal rule (query i of request b sees key j iff
    ``j <= i + causal_offset[b]``; needs ``causal=True``); ``key_mask`` bool or uint8
    (nonzero = visible) ``[B, Lk_max]`` per key or ``[total_q, Lk_max]`` per query and key, ANDed
    with the causal rule and the q2k selection (``key_mask_rows`` "batch" or "query" says which
    when B == total_q; by default the shape decides); ``soft_cap`` c > 0 caps the scores,
    ``s = c * tanh(s / c)`` after the softmax scale. A query with no visible key gets out 0 and
    lse ``-inf``.
    """
    layout = layout_name(kv_layout, page_table)
    partial = _partial(partial_dtype)
    check_attention_arrays(q, k2q, _ATTENTION_ARRAYS, k, v, cu_seqlens_q, cu_seqlens_k,
                           page_table, seqused_k, q2k, q_scale, k_scale, v_scale, causal_offset,
                           key_mask, out, lse, tlse, workspace)
    vis = _visibility(causal_offset, key_mask, key_mask_rows, soft_cap)
    q, q_scale, _ = unpack(q, q_scale)
    if out is None and lse is None and tlse is None and workspace is None and compiling():
        from . import _torch_ops
        row_ptr, q_idx, schedule = (tuple(k2q) + (None,))[:3] if k2q is not None else (None,) * 3
        out, lse, tlse = _torch_ops.attention_forward(
            q, q_scale, unpack(k)[0], unpack(v)[0], cu_seqlens_q, cu_seqlens_k, page_table,
            seqused_k, unpack(k, k_scale)[1], unpack(v, v_scale)[1], q2k, row_ptr, q_idx,
            schedule, layout, float(softmax_scale or 0.0), causal, kv_block_size,
            float(temperature or 0.0), partial, check, *vis.op_args(), stream)
    else:
        out, lse, tlse = attention_eager(
            q, k, v, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, layout, q2k, k2q,
            softmax_scale, causal, kv_block_size, temperature, partial, k_scale, v_scale, out,
            lse, tlse, return_lse, workspace, stream, check, q_scale=q_scale, vis=vis)
    return _results(out, lse, tlse, return_lse, temperature)


def attention_workspace_bytes(q: Any, k: Any, v: Any, cu_seqlens_q: Any, *,
                              cu_seqlens_k: Any = None, page_table: Any = None,
                              seqused_k: Any = None, kv_layout: Optional[str] = None,
                              q2k: Any = None, k2q: Optional[Sequence[Any]] = None,
                              causal: bool = True, kv_block_size: int = 128,
                              temperature: Optional[float] = None,
                              partial_dtype: Optional[str] = None, q_scale: Any = None,
                              k_scale: Any = None, v_scale: Any = None,
                              causal_offset: Any = None, key_mask: Any = None,
                              key_mask_rows: Optional[str] = None,
                              soft_cap: Optional[float] = None) -> int:
    """Bytes of the ``workspace`` `attention_forward` needs for these arguments (0 on the
    CPU): the CUDA kernels' scratch (k2q index when not given, schedule, partial outputs).
    q may be fp8_e4m3 (a `QTensor`, or values plus ``q_scale``) as in `attention_forward`."""
    layout = layout_name(kv_layout, page_table)
    check_attention_arrays(q, k2q, _ATTENTION_ARRAYS, k, v, cu_seqlens_q, cu_seqlens_k,
                           page_table, seqused_k, q2k, q_scale, k_scale, v_scale, causal_offset,
                           key_mask)
    vis = _visibility(causal_offset, key_mask, key_mask_rows, soft_cap)
    q, q_scale, _ = unpack(q, q_scale)
    out, _, tlse = _outputs(q, None, None, None, False, temperature)
    k2q = tuple(k2q) + (None,) * (3 - len(k2q)) if k2q is not None else (None,) * 3
    return _C.attention_workspace_bytes(
        q=arg(q), q_scale=arg(q_scale),
        **kv_args(k, v, layout=layout, cu_seqlens_k=cu_seqlens_k, page_table=page_table,
                  seqused_k=seqused_k, k_scale=k_scale, v_scale=v_scale),
        cu_seqlens_q=arg(cu_seqlens_q), q2k=arg(q2k), k2q_row_ptr=arg(k2q[0]),
        k2q_q_idx=arg(k2q[1]), k2q_schedule=arg(k2q[2]), out=arg(out, _out_dtype(q)),
        tlse=arg(tlse), causal=causal, kv_block_size=kv_block_size,
        temperature=float(temperature or 0.0), partial_dtype=_partial(partial_dtype), stream=0,
        **vis.kwargs())


def _out_dtype(q: Any) -> Optional[str]:
    """The msa dtype of attention's out for q when msa must be told it (q a Typed, or fp8_e4m3
    q, whose out is bf16); None: the out array's own dtype (q's)."""
    if type(q) is _TorchTensor:
        return "bf16" if q.dtype == torch.float8_e4m3fn else None
    name = q.dtype if isinstance(q, Typed) else dtype_of(q)
    if name == "fp8_e4m3":
        return "bf16"
    return q.dtype if isinstance(q, Typed) else None


def _outputs(q: Any, out: Any, lse: Any, tlse: Any, want_lse: bool,
             temperature: Optional[float]) -> tuple:
    """The attention outputs the caller did not pass, allocated like q (out in q's dtype, bf16
    for fp8_e4m3 q)."""
    if out is None and type(q) is _TorchTensor and q.dtype != torch.float8_e4m3fn:
        # empty_like keeps a contiguous q's layout; the memory_format keyword costs ~0.8 us.
        out = torch.empty_like(q) if q.is_contiguous() else torch.empty_like(
            q, memory_format=torch.contiguous_format)
    if out is not None and (lse is not None or not want_lse) and (tlse is not None or
                                                                  not temperature):
        return out, lse, tlse  # nothing sized by q's dims (a call's host time)
    total_q, hq, d = dims(q, "q", 3, "[total_q, Hq, D]")
    if out is None:
        # For a q msa cannot name, any placeholder does: _C rejects q.
        out = empty(q, (total_q, hq, d), _out_dtype(q) or dtype_of(q) or "f32")
    if want_lse and lse is None:
        lse = empty(q, (hq, total_q), "f32")
    if temperature and tlse is None:
        tlse = empty(q, (hq, total_q), "f32")
    return out, lse, tlse


def attention_eager(q, k, v, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, layout, q2k,
                    k2q, softmax_scale, causal, kv_block_size, temperature, partial, k_scale,
                    v_scale, out, lse, tlse, want_lse, workspace, stream, check,
                    decode_plan: Any = None, q_scale: Any = None,
                    vis: Optional["Visibility"] = None) -> tuple:
    """The eager body of attention_forward and, with `decode_plan` (a msa._C.DecodePlan), of
    DecodePlan.run. q is plain values (a QTensor q is unpacked by the caller) with `q_scale`;
    `vis` the dense-attention keywords."""
    out, lse, tlse = _outputs(q, out, lse, tlse, want_lse, temperature)
    st = stream_of(q, stream)
    status = status_for(q)
    vis = vis or _NO_VISIBILITY
    # One dict display, passed positionally: _C takes it as the call's keywords (~1.4 us less
    # host time than unpacking them into the call).
    args = {"q": arg(q), "q_scale": arg(q_scale), "cu_seqlens_q": arg(cu_seqlens_q),
            "q2k": arg(q2k), "out": arg(out, _out_dtype(q)), "lse": arg(lse),
            "tlse": arg(tlse), "softmax_scale": float(softmax_scale or 0.0), "causal": causal,
            "temperature": float(temperature or 0.0), "status": status, "stream": st,
            "causal_offset": arg(vis.causal_offset), "key_mask": arg(vis.key_mask),
            "key_mask_rows": vis.key_mask_rows, "soft_cap": float(vis.soft_cap or 0.0)}
    kv_into(args, k, v, layout, cu_seqlens_k, page_table, seqused_k, k_scale, v_scale)
    if decode_plan is not None:
        decode_plan.run(args)
    else:
        if k2q is not None:
            args["k2q_row_ptr"] = arg(k2q[0])
            args["k2q_q_idx"] = arg(k2q[1])
            if len(k2q) > 2:
                args["k2q_schedule"] = arg(k2q[2])
        args["kv_block_size"] = kv_block_size
        args["partial_dtype"] = partial
        if workspace is not None:
            args["workspace"] = arg(workspace)
        else:
            args["alloc"] = allocator(q, stream)
        _C.attention_forward(args)
    finish(status, st, check)
    return out, lse, tlse


def sparse_attention(q: Any, k: Any, v: Any, cu_seqlens_q: Any, *, cu_seqlens_k: Any = None,
                     page_table: Any = None, seqused_k: Any = None,
                     kv_layout: Optional[str] = None, topk: int = 16, sink_blocks: int = 1,
                     local_blocks: int = 1, causal: bool = True, kv_block_size: int = 128,
                     index_q: Any = None, index_k: Any = None,
                     softmax_scale: Optional[float] = None, temperature: Optional[float] = None,
                     partial_dtype: Optional[str] = None, k_scale: Any = None,
                     v_scale: Any = None, max_seqlen_k: Optional[int] = None, out: Any = None,
                     lse: Any = None, return_lse: bool = False, return_selection: bool = False,
                     workspace: Any = None, stream: Any = None,
                     check: Optional[bool] = None) -> Any:
    """Block-sparse attention with the block selection computed on the fly: the C++ library's
    one-call pipeline (`block_topk`, then `attention_forward`, which builds the k2q index in its
    workspace). Nothing is read on the host, so the call can be captured in a CUDA graph.

    Scores kv blocks with the indexer inputs (``index_q``/``index_k``, e.g. FP8 `QTensor` copies
    of q and k with as many kv heads as k; default q and k themselves), keeps ``topk`` blocks
    per (kv head, query) with ``sink_blocks``/``local_blocks`` forced, then attends them.
    Returns what `attention_forward` returns (``return_lse``, ``temperature``), plus the q2k
    selection ``[Hkv, total_q, topk]`` last with ``return_selection`` (a view of the workspace:
    it lives as long as the workspace, and a caller's ``workspace`` is overwritten by the next
    call). ``workspace``: u8 of at least `pipeline_workspace_bytes` bytes (default: allocated
    per call by q's framework).

    An ``index_k`` with another kv-head count than k (e.g. 4 index heads on 1 index key head:
    each attention kv head selects by its own index heads, docs/semantics.md, Top-K selection)
    runs the same one call: on CUDA `block_topk` keeps a list per kv head where they fit
    (`block_topk`'s rule: top-16 with the forced blocks in the serving geometry), else the block
    scores go to the workspace, then the top-K per kv head. ``max_seqlen_k`` is not needed by it
    (the scores are sized from the cache) and is ignored.
    """
    layout = layout_name(kv_layout, page_table)
    partial = _partial(partial_dtype)
    _check_pipeline_arrays(q, k, v, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, index_q,
                           index_k, k_scale, v_scale, out=out, lse=lse, workspace=workspace)
    topk = count(topk, "topk", lo=1)  # it sizes the q2k view (and the traced op's output)
    if out is None and lse is None and workspace is None and compiling():
        from . import _torch_ops
        res = _torch_ops.sparse_attention(
            q, unpack(k)[0], unpack(v)[0], cu_seqlens_q, cu_seqlens_k, page_table, seqused_k,
            unpack(k, k_scale)[1], unpack(v, v_scale)[1], layout, topk, sink_blocks,
            local_blocks, causal, kv_block_size, index_q, index_k, float(softmax_scale or 0.0),
            float(temperature or 0.0), partial, check, stream)
        out, lse, tlse, q2k = res
    else:
        out, lse, tlse, q2k = pipeline_eager(
            q, k, v, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, layout, topk,
            sink_blocks, local_blocks, causal, kv_block_size, index_q, index_k, softmax_scale,
            temperature, partial, k_scale, v_scale, out, lse, return_lse, workspace, stream,
            check, want_q2k=return_selection)
    res = _results(out, lse, tlse, return_lse, temperature)
    if not return_selection:
        return res
    return (res if isinstance(res, tuple) else (res,)) + (q2k,)


def _check_pipeline_arrays(q, k, v, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, index_q,
                           index_k, k_scale, v_scale, out=None, lse=None, workspace=None) -> None:
    """check_attention_arrays without k2q, in one call (each keyword hop costs host time)."""
    if not plain_arrays(q, k, v, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, index_q,
                        index_k, k_scale, v_scale, out, lse, workspace):
        check_arrays(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                     page_table=page_table, seqused_k=seqused_k, index_q=index_q,
                     index_k=index_k, k_scale=k_scale, v_scale=v_scale, out=out, lse=lse,
                     workspace=workspace)
    dims(unpack(q)[0], "q", 3, "[total_q, Hq, D]")


def _pipeline_kwargs(q, k, v, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, layout, topk,
                     sink_blocks, local_blocks, causal, kv_block_size, index_q, index_k,
                     softmax_scale, temperature, partial, k_scale, v_scale) -> dict:
    """msa._C's pipeline keywords but the outputs, workspace, status and stream."""
    iq, iq_scale, iq_global = unpack(index_q)
    ik, ik_scale, ik_global = unpack(index_k)
    kw = {"q": arg(q), "cu_seqlens_q": arg(cu_seqlens_q), "index_q": arg(iq),
          "index_q_scale": arg(iq_scale), "index_q_global_scale": float(iq_global),
          "index_k": arg(ik), "index_k_scale": arg(ik_scale),
          "index_k_global_scale": float(ik_global), "topk": topk, "sink_blocks": sink_blocks,
          "local_blocks": local_blocks, "causal": causal, "kv_block_size": kv_block_size,
          "softmax_scale": float(softmax_scale or 0.0),
          "temperature": float(temperature or 0.0), "partial_dtype": partial}
    return kv_into(kw, k, v, layout, cu_seqlens_k, page_table, seqused_k, k_scale, v_scale)


def pipeline_workspace_bytes(q: Any, k: Any, v: Any, cu_seqlens_q: Any, *,
                             cu_seqlens_k: Any = None, page_table: Any = None,
                             seqused_k: Any = None, kv_layout: Optional[str] = None,
                             topk: int = 16, sink_blocks: int = 1, local_blocks: int = 1,
                             causal: bool = True, kv_block_size: int = 128, index_q: Any = None,
                             index_k: Any = None, temperature: Optional[float] = None,
                             partial_dtype: Optional[str] = None, k_scale: Any = None,
                             v_scale: Any = None) -> int:
    """Bytes of the ``workspace`` `sparse_attention` needs for these arguments (its q2k
    selection first, then the attention's scratch); one sized for the largest shape serves
    every smaller one."""
    layout = layout_name(kv_layout, page_table)
    _check_pipeline_arrays(q, k, v, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, index_q,
                           index_k, k_scale, v_scale)
    kw = _pipeline_kwargs(q, k, v, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, layout,
                          topk, sink_blocks, local_blocks, causal, kv_block_size, index_q,
                          index_k, None, temperature, _partial(partial_dtype), k_scale, v_scale)
    out, lse, tlse = _outputs(q, None, None, None, False, temperature)
    return _C.pipeline_workspace_bytes(**kw, out=arg(out), tlse=arg(tlse), stream=0)


def pipeline_eager(q, k, v, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, layout, topk,
                   sink_blocks, local_blocks, causal, kv_block_size, index_q, index_k,
                   softmax_scale, temperature, partial, k_scale, v_scale, out, lse, want_lse,
                   workspace, stream, check, want_q2k: bool = True) -> tuple:
    """The pipeline call; returns out, lse, tlse and the q2k view of the workspace (None unless
    ``want_q2k``: building the view costs ~4 us of host time per call)."""
    out, lse, tlse = _outputs(q, out, lse, None, want_lse, temperature)
    st = stream_of(q, stream)
    status = status_for(q)
    kw = _pipeline_kwargs(q, k, v, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, layout, topk,
                          sink_blocks, local_blocks, causal, kv_block_size, index_q, index_k,
                          softmax_scale, temperature, partial, k_scale, v_scale)
    kw["out"] = arg(out, q.dtype if isinstance(q, Typed) else None)
    kw["lse"] = arg(lse)
    kw["tlse"] = arg(tlse)
    kw["status"] = status
    kw["stream"] = st
    scratch = []  # the workspace allocated for the call: q2k lives at its start
    if workspace is not None:
        kw["workspace"] = arg(workspace)
    elif want_q2k:
        base = allocator(q, stream)

        def alloc(n: int) -> Any:
            scratch.append(base(n))
            return scratch[-1]
        kw["alloc"] = alloc
    else:  # msa._C holds the scratch until the call returns, as the stream-ordered pools need
        kw["alloc"] = allocator(q, stream)
    _C.sparse_attention_pipeline(kw)  # one dict, as attention_eager
    finish(status, st, check)
    if not want_q2k:
        return out, lse, tlse, None
    ws = workspace if workspace is not None else (scratch[0] if scratch else None)
    total_q = dims(q, "q", 3, "[total_q, Hq, D]")[0]
    return out, lse, tlse, _q2k_view(ws, q, k, layout, total_q, topk)


def _q2k_view(workspace: Any, q: Any, k: Any, layout: str, total_q: int, topk: int) -> Any:
    """The pipeline's q2k, int32 [Hkv, total_q, topk] at the start of its workspace (which is
    absent only when the selection is empty)."""
    hkv = kv_heads_of(k, layout)
    n = hkv * total_q * topk
    if workspace is None or n == 0:
        return empty(q, (hkv, total_q, topk), "i32")
    arr = workspace.array if isinstance(workspace, Typed) else workspace
    if framework(arr) == "torch":
        import torch
        return arr[:n * 4].view(torch.int32).view(hkv, total_q, topk)
    return arr[:n * 4].view("int32").reshape(hkv, total_q, topk)


__all__ = ["attention_forward", "attention_workspace_bytes", "sparse_attention",
           "pipeline_workspace_bytes"]
