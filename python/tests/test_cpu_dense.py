# CPU tests of dense attention's keywords (docs/semantics.md, Dense attention): causal_offset,
# key_mask (bool / uint8, per batch / per query), soft_cap through msa.attention_forward,
# msa.DecodePlan.run and the torch custom op; msa.attention_batched over BSHD / BHSD views; the
# BSR wrappers' logits_soft_cap; exact error texts. Against the float64 reference np_reference.
import numpy as np
import pytest

import msa
import np_reference as ref

ml_dtypes = pytest.importorskip("ml_dtypes")


def _problem(seed, lq=(5, 9, 1), lk=(40, 9, 70), hq=4, hkv=2, d=32, dtype=np.float16):
    rng = np.random.default_rng(seed)
    return (rng,) + ref.problem(rng, list(lq), list(lk), hq, hkv, d, dtype)


def _reference(q, k, v, cu_q, cu_k, **kw):
    return ref.attention(q.astype(np.float64), ref.split(k, cu_k), ref.split(v, cu_k), cu_q, **kw)


@pytest.mark.parametrize("mask_dtype", [np.bool_, np.uint8])
@pytest.mark.parametrize("per_query", [False, True])
def test_offsets_masks_and_soft_cap(mask_dtype, per_query):
    rng, q, k, v, cu_q, cu_k = _problem(1)
    offsets = np.array([36, -3, 100], np.int32)
    rows = q.shape[0] if per_query else 3
    mask = rng.random((rows, 75)) < 0.6
    out, lse = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, causal_offset=offsets,
                                     key_mask=mask.astype(mask_dtype), soft_cap=2.0,
                                     softmax_scale=0.5, return_lse=True)
    want, want_lse, _ = _reference(q, k, v, cu_q, cu_k, causal_offset=offsets, key_mask=mask,
                                   mask_per_query=per_query, soft_cap=2.0, scale=0.5)
    ref.check_attention(out, lse, want, want_lse)


def test_negative_offsets_give_zero_and_minus_inf():
    _, q, k, v, cu_q, cu_k = _problem(2)
    out, lse = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k,
                                     causal_offset=np.array([-5, -9, -1], np.int32),
                                     return_lse=True)
    assert not np.asarray(out, np.float64).any()
    assert np.isneginf(lse).all()


def test_large_offsets_equal_non_causal():
    _, q, k, v, cu_q, cu_k = _problem(3)
    big = np.full(3, np.iinfo(np.int32).max, np.int32)
    out = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, causal_offset=big)
    full = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, causal=False)
    assert np.array_equal(out.view(np.uint16), full.view(np.uint16))


# Dense attention takes any GQA group up to 128: 5, 12 and 48 besides the sparse path's groups.
@pytest.mark.parametrize("d, hq, hkv", [(32, 16, 1), (64, 16, 2), (128, 4, 2), (256, 2, 2),
                                        (5, 2, 1), (64, 10, 2), (32, 12, 1), (16, 96, 2)])
def test_head_dims_and_groups(d, hq, hkv):
    rng, q, k, v, cu_q, cu_k = _problem(4, hq=hq, hkv=hkv, d=d, dtype=ml_dtypes.bfloat16)
    mask = rng.random((3, 70)) < 0.7
    out, lse = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, key_mask=mask,
                                     soft_cap=30.0, return_lse=True)
    want, want_lse, _ = _reference(q, k, v, cu_q, cu_k, key_mask=mask, soft_cap=30.0)
    ref.check_attention(out, lse, want, want_lse)


def test_sparse_calls_keep_their_groups():
    # 10 query heads on 2 kv heads (G = 5) run dense; a q2k selection needs G in {1, 2, 4, 8, 16}.
    rng, q, k, v, cu_q, cu_k = _problem(6, hq=10, hkv=2, d=32)
    q2k = np.zeros((2, q.shape[0], 1), np.int32)
    with pytest.raises(msa.MsaError, match="sparse call's GQA group Hq/Hkv must be 1, 2, 4, 8 or 16"):
        msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=q2k, kv_block_size=64)
    qw = np.zeros((q.shape[0], 129, 32), q.dtype)
    kw = np.zeros((k.shape[0], 1, 32), k.dtype)
    with pytest.raises(msa.MsaError, match="GQA group Hq/Hkv must be at most 128, got 129"):
        msa.attention_forward(qw, kw, kw, cu_q, cu_seqlens_k=cu_k)


def test_paged_and_sparse_with_mask():
    rng, q, k, v, cu_q, cu_k = _problem(5, lq=(12, 7), lk=(300, 90))
    mask = rng.random((2, 300)) < 0.5
    offsets = np.array([295, 100], np.int32)
    blk = 64
    scores = msa.block_scores(q, k, cu_q, cu_seqlens_k=cu_k, kv_block_size=blk)
    q2k = msa.select_topk(scores, cu_q, num_kv_heads=2, topk=2, kv_block_size=blk,
                          cu_seqlens_k=cu_k)
    kw = dict(causal_offset=offsets, key_mask=mask, soft_cap=5.0, return_lse=True)
    flat, flat_lse = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=q2k,
                                           kv_block_size=blk, temperature=None, **kw)
    want, want_lse, _ = _reference(q, k, v, cu_q, cu_k, q2k=q2k, blk=blk, causal_offset=offsets,
                                   key_mask=mask, soft_cap=5.0)
    ref.check_attention(flat, flat_lse, want, want_lse)
    k_pool, v_pool, table, seqused = ref.to_pages(rng, k, v, cu_k, 32)
    paged, paged_lse = msa.attention_forward(q, k_pool, v_pool, cu_q, page_table=table,
                                             seqused_k=seqused, q2k=q2k, kv_block_size=blk, **kw)
    assert np.array_equal(paged.view(np.uint16), flat.view(np.uint16))
    assert np.array_equal(paged_lse, flat_lse)


def test_decode_plan_takes_the_keywords():
    rng, q, k, v, cu_q, cu_k = _problem(6, lq=(1, 3), lk=(200, 70), d=64)
    k_pool, v_pool, table, seqused = ref.to_pages(rng, k, v, cu_k, 32)
    plan = msa.DecodePlan().plan(batch=2, num_q_heads=4, num_kv_heads=2, head_dim=64,
                                 page_size=32, max_pages=table.shape[1],
                                 max_queries_per_request=3, kv_dtype="f16", seqused_k=seqused)
    mask = rng.random((4, 200)) < 0.7
    offsets = np.array([150, 69], np.int32)
    out, lse = plan.run(q, k_pool, v_pool, table, cu_q, seqused_k=seqused, causal_offset=offsets,
                        key_mask=mask, key_mask_rows="query", soft_cap=3.0, return_lse=True)
    want, want_lse, _ = _reference(q, k, v, cu_q, cu_k, causal_offset=offsets, key_mask=mask,
                                   mask_per_query=True, soft_cap=3.0)
    ref.check_attention(out, lse, want, want_lse)


def test_ambiguous_mask_rows():
    rng, q, k, v, cu_q, cu_k = _problem(7, lq=(1, 1), lk=(10, 20))
    mask = rng.random((2, 20)) < 0.5
    with pytest.raises(msa.MsaError, match=r"key_mask: bool\[2, 20\] on cpu has B = total_q = 2 "
                       r"rows, so it may be per batch or per query: set key_mask_rows to "
                       r"per_batch or per_query"):
        msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, key_mask=mask)
    a = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, key_mask=mask,
                              key_mask_rows="batch")
    b = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, key_mask=mask,
                              key_mask_rows="query")
    assert np.array_equal(a.view(np.uint16), b.view(np.uint16))


@pytest.mark.parametrize("kw, match", [
    (dict(soft_cap=-1.0), r"params.soft_cap: must be finite and >= 0 \(0 means no soft-cap\), "
                          r"got -1"),
    (dict(soft_cap=float("nan")), "params.soft_cap: must be finite and >= 0"),
    (dict(causal_offset=np.zeros(3, np.int32), causal=False),
     "causal_offset: given, so params.causal must be true"),
    (dict(causal_offset=np.zeros(2, np.int32)),
     r"causal_offset: shape must be \[3\], got i32\[2\]"),
    (dict(causal_offset=np.zeros(3, np.float32)), "causal_offset: dtype must be i32, got f32"),
    (dict(key_mask=np.ones((3, 75), np.float32)), "key_mask: dtype must be bool or u8, got f32"),
    (dict(key_mask=np.ones((3, 69), bool)),
     r"key_mask: Lk_max = 69 \(its last dim\) is less than the 70 keys of batch 2"),
    (dict(key_mask=np.ones((4, 75), bool)), r"key_mask: shape must be \[B = 3, Lk_max\] \(per "
                                            r"batch\) or \[total_q = 15, Lk_max\] \(per query\)"),
    (dict(key_mask=np.ones((3, 75), bool), key_mask_rows="query"),
     r"key_mask: shape must be \[15, \*\], got bool\[3, 75\]"),
    (dict(key_mask=np.ones((3, 75), bool), key_mask_rows="rows"),
     "attention_forward: key_mask_rows: must be 'batch', 'query' or None"),
    (dict(key_mask=np.ones((3, 75), bool)[:, ::2]),
     "key_mask: last dim must be contiguous"),
])
def test_errors(kw, match):
    _, q, k, v, cu_q, cu_k = _problem(8)
    with pytest.raises(msa.MsaError, match=match):
        msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, **kw)


# ---------------------------------- batched layouts ----------------------------------

def _batched(rng, b, sq, sk, hq, hkv, d, layout):
    """q, k, v as [B, S, H, D] arrays and their BHSD views (transposes, not copies)."""
    q = rng.standard_normal((b, sq, hq, d)).astype(np.float16)
    k = rng.standard_normal((b, sk, hkv, d)).astype(np.float16)
    v = rng.standard_normal((b, sk, hkv, d)).astype(np.float16)
    if layout == "BHSD":
        # Contiguous BHSD storage, seen through the same logical [B, H, S, D] shape.
        return tuple(np.ascontiguousarray(x.swapaxes(1, 2)) for x in (q, k, v))
    return q, k, v


@pytest.mark.parametrize("layout", ["BSHD", "BHSD"])
@pytest.mark.parametrize("mask_kind", [None, "key", "query"])
def test_batched_layouts(layout, mask_kind):
    rng = np.random.default_rng(9)
    b, sq, sk, hq, hkv, d = 3, 6, 20, 4, 2, 32
    q, k, v = _batched(rng, b, sq, sk, hq, hkv, d, layout)
    mask = None if mask_kind is None else \
        rng.random((b, sk) if mask_kind == "key" else (b, sq, sk)) < 0.6
    offsets = np.array([14, 3, 30], np.int32)
    out, lse = msa.attention_batched(q, k, v, layout=layout, causal_offset=offsets,
                                     key_mask=mask, soft_cap=4.0, return_lse=True)
    assert out.shape == q.shape and lse.shape == (b, hq, sq)
    # The same problem in the varlen form.
    to_tokens = (lambda x: x.swapaxes(1, 2)) if layout == "BHSD" else (lambda x: x)
    qt, kt, vt = (np.ascontiguousarray(to_tokens(x)).reshape(-1, x.shape[-2] if layout == "BSHD"
                                                                  else x.shape[1], d)
                  for x in (q, k, v))
    cu_q, cu_k = np.arange(b + 1, dtype=np.int32) * sq, np.arange(b + 1, dtype=np.int32) * sk
    flat_mask = None if mask is None else mask.reshape(-1, sk)
    want, want_lse, _ = _reference(qt, kt, vt, cu_q, cu_k, causal_offset=offsets,
                                   key_mask=flat_mask, mask_per_query=mask_kind == "query",
                                   soft_cap=4.0)
    got = to_tokens(np.asarray(out)).reshape(-1, hq, d)
    ref.check_attention(got, np.asarray(lse).swapaxes(0, 1).reshape(hq, -1), want, want_lse)


def test_batched_shares_memory_and_checks_shapes():
    rng = np.random.default_rng(10)
    q, k, v = _batched(rng, 2, 4, 8, 2, 1, 16, "BSHD")
    out = np.full(q.shape, np.nan, np.float16)
    res = msa.attention_batched(q, k, v, out=out)
    assert res is out and np.isfinite(out).all()
    with pytest.raises(msa.MsaError, match="layout: must be 'BSHD' or 'BHSD', got 'NHD'"):
        msa.attention_batched(q, k, v, layout="NHD")
    with pytest.raises(msa.MsaError, match=r"key_mask: must be \[B, Sk\] = \[2, 8\] or "
                       r"\[B, Sq, Sk\] = \[2, 4, 8\], got shape \[3, 8\]"):
        msa.attention_batched(q, k, v, key_mask=np.ones((3, 8), bool))
    with pytest.raises(msa.MsaError, match=r"k: batch \(dim 0\) must equal q's \(2\)"):
        msa.attention_batched(q, k[:1], v[:1])


# ---------------------------------- torch ----------------------------------

def test_torch_custom_op_and_bool_masks():
    torch = pytest.importorskip("torch")
    rng, q, k, v, cu_q, cu_k = _problem(11)
    mask = rng.random((3, 70)) < 0.6
    offsets = np.array([36, 2, 69], np.int32)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    kw = dict(cu_seqlens_k=torch.from_numpy(cu_k), causal_offset=torch.from_numpy(offsets),
              key_mask=torch.from_numpy(mask), soft_cap=3.0, return_lse=True)
    eager, eager_lse = msa.attention_forward(tq, tk, tv, torch.from_numpy(cu_q), **kw)
    op = torch.ops.msa.attention_forward(
        tq, None, tk, tv, torch.from_numpy(cu_q), kw["cu_seqlens_k"], None, None, None, None,
        None, None, None, None, "flat", 0.0, True, 128, 0.0, "", None, kw["causal_offset"],
        kw["key_mask"], "", 3.0, None)
    assert torch.equal(op[0], eager) and torch.equal(op[1], eager_lse)
    want, want_lse, _ = _reference(q, k, v, cu_q, cu_k, causal_offset=offsets, key_mask=mask,
                                   soft_cap=3.0)
    ref.check_attention(eager.numpy(), eager_lse.numpy(), want, want_lse)

    args = (tq, None, tk, tv, torch.from_numpy(cu_q), kw["cu_seqlens_k"], None, None, None, None,
            None, None, None, None, "flat", 0.0, True, 128, 0.0, "", True, kw["causal_offset"],
            kw["key_mask"], "", 3.0, None)
    torch.library.opcheck(torch.ops.msa.attention_forward.default, args,
                          test_utils=("test_schema", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))

    def f(q_, k_, v_):
        return msa.attention_forward(q_, k_, v_, torch.from_numpy(cu_q), **kw)
    compiled = torch.compile(f, fullgraph=True, backend="eager")
    out, lse = compiled(tq, tk, tv)
    assert torch.equal(out, eager) and torch.equal(lse, eager_lse)


# ---------------------------------- BSR wrappers ----------------------------------

def test_bsr_soft_cap_on_the_cpu():
    rng = np.random.default_rng(12)
    m, n, r, c, hq, hkv, d = 64, 96, 16, 32, 4, 2, 32
    blocks = ref.random_blocks(rng, (m // r, n // c), 0.6)
    indptr, indices = ref.to_bsr(blocks)
    q = rng.standard_normal((m, hq, d)).astype(np.float16)
    k = rng.standard_normal((n, hkv, d)).astype(np.float16)
    v = rng.standard_normal((n, hkv, d)).astype(np.float16)
    bsa = msa.BlockSparseAttention().plan(indptr, indices, M=m, N=n, R=r, C=c, num_qo_heads=hq,
                                           num_kv_heads=hkv, head_dim=d, logits_soft_cap=5.0)
    out, lse = bsa.run(q, k, v, return_lse=True)
    elements = ref.block_elements(blocks, r, c, m, n)
    cu_q, cu_k = np.array([0, m], np.int32), np.array([0, n], np.int32)
    want, want_lse, _ = _reference(q, k, v, cu_q, cu_k, causal=False, key_mask=elements,
                                   mask_per_query=True, soft_cap=5.0)
    ref.check_attention(out, lse, want, want_lse)
    with pytest.raises(msa.MsaError, match="logits_soft_cap: must be a finite number >= 0"):
        msa.BlockSparseAttention().plan(indptr, indices, M=m, N=n, R=r, C=c, num_qo_heads=hq,
                                        num_kv_heads=hkv, head_dim=d, logits_soft_cap=-2.0)


@pytest.mark.parametrize("layout", ["BSHD", "BHSD"])
def test_batched_strided_offsets_refused_on_both_paths(layout):
    """One varlen call (BSHD) or one call per request (BHSD): a strided causal_offset is the same
    error either way."""
    rng = np.random.default_rng(4)
    shape_q, shape_k = ((2, 8, 4, 32), (2, 8, 2, 32)) if layout == "BSHD" else \
        ((2, 4, 8, 32), (2, 2, 8, 32))
    q = rng.standard_normal(shape_q).astype(np.float16)
    k = rng.standard_normal(shape_k).astype(np.float16)
    off = np.array([1, 0, 2, 0], np.int32)[::2]
    with pytest.raises(msa.MsaError, match="causal_offset: must be contiguous"):
        msa.attention_batched(q, k, k, layout=layout, causal_offset=off)


@pytest.mark.parametrize("layout", ["BSHD", "BHSD"])
def test_batched_offsets_of_another_extent_refused_on_both_paths(layout):
    """A causal_offset with B + 1 entries: an error on the one-call path (the C++ check of [B])
    and on the per-request path, whose 1-element slices would pass (found by the GPU soak)."""
    rng = np.random.default_rng(5)
    shape_q, shape_k = ((2, 8, 4, 32), (2, 8, 2, 32)) if layout == "BSHD" else \
        ((2, 4, 8, 32), (2, 2, 8, 32))
    q = rng.standard_normal(shape_q).astype(np.float16)
    k = rng.standard_normal(shape_k).astype(np.float16)
    with pytest.raises(msa.MsaError, match=r"causal_offset: shape must be \[B\]|causal_offset: shape must be \[2\]"):
        msa.attention_batched(q, k, k, layout=layout, causal_offset=np.zeros(3, np.int32))
