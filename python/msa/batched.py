"""msa.attention_batched: dense (or sparse) attention over batched tensors, ``[B, S, H, D]``
("BSHD") or ``[B, H, S, D]`` ("BHSD"), as strided views onto `attention_forward`'s token-major
varlen form (docs/semantics.md, Dense attention): nothing is copied. BSHD tensors whose batch
and sequence dims merge into one token dim (``stride(0) == S * stride(1)``, e.g. contiguous
ones) run as one call; others, and every BHSD tensor, run one call per request over the
``[S, H, D]`` view of that request (a BHSD batch has no single token stride)."""

from __future__ import annotations

from typing import Any, Optional

from ._arrays import dtype_of, empty, framework
from ._runtime import MsaError, check_arrays, dims
from .attention import _out_dtype, _results, attention_forward
from .sparse_convert import _like, _np

_LAYOUTS = ("BSHD", "BHSD")


def _strides(x: Any) -> tuple:
    """x's strides in elements."""
    if framework(x) == "torch":
        return tuple(x.stride())
    return tuple(s // x.itemsize for s in x.strides)


def _tokens(x: Any, bhsd: bool) -> tuple:
    """The request views of x as token-major ``[S, H, D]`` arrays (views), one per request."""
    def one(b: int) -> Any:
        xb = x[b]
        if not bhsd:
            return xb
        return xb.transpose(0, 1) if framework(x) == "torch" else xb.swapaxes(0, 1)
    return tuple(one(b) for b in range(x.shape[0]))


def _merged(x: Any) -> Optional[Any]:
    """The BSHD array x as one ``[B * S, ...]`` view, or None when its strides do not allow it."""
    b, s = x.shape[0], x.shape[1]
    st = _strides(x)
    if b > 1 and s > 1 and st[0] != s * st[1]:
        return None
    shape = (b * s,) + tuple(x.shape[2:])
    return x.view(shape) if framework(x) == "torch" else x.reshape(shape)


def _offsets(like: Any, batch: int, length: int) -> Any:
    """int32 ``[0, length, 2 * length, ...]`` of batch + 1 entries, on like's device."""
    if framework(like) == "torch":
        import torch
        return torch.arange(batch + 1, dtype=torch.int32, device=like.device) * length
    np = _np()
    return _like(like, np.arange(batch + 1, dtype=np.int32) * length)


def attention_batched(q: Any, k: Any, v: Any, *, layout: str = "BSHD", causal: bool = True,
                      causal_offset: Any = None, key_mask: Any = None,
                      soft_cap: Optional[float] = None, softmax_scale: Optional[float] = None,
                      temperature: Optional[float] = None, out: Any = None,
                      return_lse: bool = False, stream: Any = None,
                      check: Optional[bool] = None) -> Any:
    """Dense attention over batched tensors of one shape per request.

    q ``[B, Sq, Hq, D]`` and k, v ``[B, Sk, Hkv, D]`` with ``layout="BSHD"``, or ``[B, Hq, Sq,
    D]`` and ``[B, Hkv, Sk, D]`` with ``layout="BHSD"``; any strides with a contiguous last dim.
    Returns ``out`` in q's layout and dtype, or ``(out, lse)`` with ``return_lse`` (lse
    ``[B, Hq, Sq]`` f32, possibly a strided view), the tlse last with a ``temperature``, as
    `attention_forward` does. ``causal`` is bottom-right aligned per request (query i sees key j
    iff ``j <= i + Sk - Sq``); ``causal_offset`` int32 ``[B]`` replaces that offset;
    ``key_mask`` bool or uint8 ``[B, Sk]`` (per key) or ``[B, Sq, Sk]`` (per query and key) ANDs
    with it; ``soft_cap`` as in `attention_forward`. ``out``: a preallocated output of q's shape
    and layout.
    """
    if layout not in _LAYOUTS:
        raise MsaError(f"layout: must be 'BSHD' or 'BHSD', got {layout!r}")
    check_arrays(q=q, k=k, v=v, causal_offset=causal_offset, key_mask=key_mask, out=out)
    bhsd = layout == "BHSD"
    what = "[B, H, S, D]" if bhsd else "[B, S, H, D]"
    qs, ks = dims(q, "q", 4, what), dims(k, "k", 4, what)
    if dims(v, "v", 4, what) != ks:
        raise MsaError(f"v: shape must equal k's {list(ks)}, got {list(v.shape)}")
    batch, sq = qs[0], qs[2 if bhsd else 1]
    sk = ks[2 if bhsd else 1]
    if ks[0] != batch:
        raise MsaError(f"k: batch (dim 0) must equal q's ({batch}), got {list(ks)}")
    mask_rows = None
    if key_mask is not None:
        mask_rows = "query" if len(key_mask.shape) == 3 else "batch"
        want = (batch, sq) if mask_rows == "query" else (batch,)
        if len(key_mask.shape) not in (2, 3) or tuple(key_mask.shape)[:-1] != want:
            raise MsaError(f"key_mask: must be [B, Sk] = [{batch}, {sk}] or [B, Sq, Sk] = "
                           f"[{batch}, {sq}, {sk}], got shape {list(key_mask.shape)}")
    common = dict(softmax_scale=softmax_scale, causal=causal, temperature=temperature,
                  soft_cap=soft_cap, return_lse=return_lse, stream=stream, check=check,
                  causal_offset=causal_offset, key_mask_rows=mask_rows)
    if not bhsd:
        views = [_merged(x) for x in (q, k, v)]
        views.append(None if out is None else _merged(out))
        views.append(_merged(key_mask) if mask_rows == "query" else key_mask)
        if all(x is not None for x in views[:3]) and (out is None or views[3] is not None) and \
                (key_mask is None or views[4] is not None):
            return _one_call(views, out, batch, sq, sk, common)
    if out is None:
        out = empty(q, qs, _out_dtype(q) or dtype_of(q) or "f32")
    return _per_request(q, k, v, out, bhsd, batch, sq, sk, key_mask, common)


def _one_call(views: list, out: Any, batch: int, sq: int, sk: int, common: dict) -> Any:
    """Every request in one varlen call over the merged ``[B * S, H, D]`` views; the result is
    the caller's `out` when given, else a view of the call's output."""
    qv, kv, vv, ov, mask = views
    res = attention_forward(qv, kv, vv, _offsets(qv, batch, sq),
                            cu_seqlens_k=_offsets(qv, batch, sk), out=ov, key_mask=mask,
                            **common)
    res = res if isinstance(res, tuple) else (res,)
    if out is None:
        out = _unmerge(res[0], (batch, sq) + tuple(res[0].shape[1:]))
    stats = tuple(_unmerge(x, (x.shape[0], batch, sq)) for x in res[1:])
    stats = tuple(x.transpose(0, 1) if framework(x) == "torch" else x.swapaxes(0, 1)
                  for x in stats)  # [Hq, B, Sq] -> [B, Hq, Sq], a view
    return out if len(res) == 1 else (out,) + stats


def _unmerge(x: Any, shape: tuple) -> Any:
    return x.view(shape) if framework(x) == "torch" else x.reshape(shape)


def _per_request(q, k, v, out, bhsd, batch, sq, sk, key_mask, common) -> Any:
    """One call per request over its ``[S, H, D]`` views, writing into out's request views and
    into ``[B, Hq, Sq]`` statistics (one contiguous ``[Hq, Sq]`` block per request)."""
    hq = q.shape[1 if bhsd else 2]
    return_lse, temperature = common["return_lse"], common["temperature"]
    lse = empty(q, (batch, hq, sq), "f32") if return_lse else None
    tlse = empty(q, (batch, hq, sq), "f32") if temperature else None
    qs, ks, vs, os_ = (_tokens(x, bhsd) for x in (q, k, v, out))
    cu_q, cu_k = _offsets(q, 1, sq), _offsets(q, 1, sk)
    offset = common.pop("causal_offset")
    # The one-call path checks the whole [B] array; a request's 1-element slice would pass any
    # extent or stride, so check them here the same way.
    if offset is not None and tuple(offset.shape) != (batch,):
        raise MsaError(f"causal_offset: shape must be [B] = [{batch}], got {list(offset.shape)}")
    if offset is not None and len(offset) > 1 and _strides(offset)[0] != 1:
        raise MsaError(f"causal_offset: must be contiguous, got strides {list(_strides(offset))}")
    rows = common["key_mask_rows"]
    for b in range(batch):
        mask = None
        if key_mask is not None:
            mask = key_mask[b] if rows == "query" else key_mask[b:b + 1]
        attention_forward(qs[b], ks[b], vs[b], cu_q, cu_seqlens_k=cu_k, out=os_[b],
                          lse=None if lse is None else lse[b],
                          tlse=None if tlse is None else tlse[b],
                          causal_offset=None if offset is None else offset[b:b + 1],
                          key_mask=mask, **common)
    return _results(out, lse, tlse, return_lse, temperature)


__all__ = ["attention_batched"]
