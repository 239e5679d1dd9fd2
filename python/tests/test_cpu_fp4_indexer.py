# CPU tests of the indexer over FP4 inputs past the flat public case: FP4 page pools, scales in
# the preordered layout (msa.reorder_fp4_scales) read as the public ones bit for bit, the reorder
# itself against its definition (numpy and torch), and the errors of both.
import numpy as np
import pytest

import msa
import np_reference as ref

ml_dtypes = pytest.importorskip("ml_dtypes")

LAYOUTS = ["flat", "paged_nhd", "paged_hnd"]
SCALE_TYPES = {"nvfp4": ml_dtypes.float8_e4m3fn, "mxfp4": ml_dtypes.float8_e8m0fnu}


def preorder(pub, layout):
    """The preordered layout by its definition: each public scale (matrix l, row m, group g) at
    l*512*restM*restG + (m//128)*512*restG + (g//4)*512 + (m%32)*16 + ((m//32)%4)*4 + g%4,
    every other byte zero."""
    pub = np.asarray(pub).view(np.uint8)
    if layout == "paged_hnd":
        pub = pub.transpose(0, 2, 1, 3)  # [P, 128, H, G], as paged_nhd
    if layout == "flat":
        rows, heads, groups = pub.shape
        m, l, g = np.indices(pub.shape)
        lead = ()
    else:
        pages, rows, heads, groups = pub.shape
        p, m, h, g = np.indices(pub.shape)
        l = p * heads + h
        lead = (pages * heads,)
    rest_m, rest_g = -(-rows // 128), -(-groups // 4)
    shape = (lead or (heads,)) + (rest_m, rest_g, 32, 4, 4)
    out = np.zeros(int(np.prod(shape)), np.uint8)
    idx = (l * 512 * rest_m * rest_g + (m // 128) * 512 * rest_g + (g // 4) * 512 +
           (m % 32) * 16 + ((m // 32) % 4) * 4 + g % 4)
    out[idx.ravel()] = pub.ravel()
    return out.reshape(shape)


def random_scales(rng, shape, fmt):
    """Nonzero scale bytes (zero is the padding's value) typed as the format's scale type."""
    return rng.integers(1, 0xff, size=shape, dtype=np.uint8).view(SCALE_TYPES[fmt])


SHAPES = {"flat": [(300, 3, 6), (128, 2, 8), (1, 1, 1)],
          "paged_nhd": [(3, 128, 2, 8), (2, 128, 3, 3)],
          "paged_hnd": [(3, 2, 128, 6), (1, 4, 128, 4)]}


@pytest.mark.parametrize("fmt", sorted(SCALE_TYPES))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_reorder_matches_definition_and_inverts(layout, fmt):
    rng = np.random.default_rng(7)
    for shape in SHAPES[layout]:
        pub = random_scales(rng, shape, fmt)
        pre = msa.reorder_fp4_scales(pub, layout)
        want = preorder(pub, layout)
        assert pre.dtype == pub.dtype and pre.shape == want.shape
        np.testing.assert_array_equal(pre.view(np.uint8), want)
        # Padding is exactly the zero bytes.
        assert (pre.view(np.uint8) == 0).sum() == pre.size - pub.size
        back = msa.reorder_fp4_scales_to_public(pre, layout, shape=shape)
        np.testing.assert_array_equal(back.view(np.uint8), pub.view(np.uint8))
        # uint8 storage typed by format=, into preallocated outputs.
        out = np.full(want.shape, 0xAB, np.uint8)
        assert msa.reorder_fp4_scales(pub.view(np.uint8), layout, format=fmt, out=out) is out
        np.testing.assert_array_equal(out, want)
        out_pub = np.zeros(shape, np.uint8)
        msa.reorder_fp4_scales_to_public(out, layout, format=fmt, out=out_pub)
        np.testing.assert_array_equal(out_pub, pub.view(np.uint8))


def fp4_problem(rng, fmt, lq, lk, dim):
    """Random q and flat K quantized to `fmt` (QTensors; NVFP4 global scales 0.5 and 0.75)."""
    q, k, _, cu_q, cu_k = ref.problem(rng, lq, lk, 8, 2, dim, np.float32)
    qq = msa.quantize(q, fmt, global_scale=0.5 if fmt == "nvfp4" else 1.0)
    kq = msa.quantize(k, fmt, global_scale=0.75 if fmt == "nvfp4" else 1.0)
    return qq, kq, cu_q, cu_k


def fp4_pool(rng, kq, cu_k, page_size, layout):
    """kq's values and scales scattered into shuffled pages (0xff in the slots without a key)."""
    lengths = np.diff(cu_k)
    pages = [(int(n) + page_size - 1) // page_size for n in lengths]
    num_pages = sum(pages) + 2
    perm = rng.permutation(num_pages).astype(np.int32)
    table = np.full((len(pages), max(pages)), -1, np.int32)
    values = np.asarray(kq.values).view(np.uint8)
    scale = np.asarray(kq.scale).view(np.uint8)
    vp = np.full((num_pages, page_size) + values.shape[1:], 0xff, np.uint8)
    sp = np.full((num_pages, page_size) + scale.shape[1:], 0xff, np.uint8)
    ref.scatter_pages(values, scale, cu_k, pages, perm, page_size, vp, sp, table)
    if layout == "paged_hnd":
        vp = np.ascontiguousarray(vp.transpose(0, 2, 1, 3))
        sp = np.ascontiguousarray(sp.transpose(0, 2, 1, 3))
    pool = msa.QTensor(vp, sp.view(SCALE_TYPES[kq.format]), kq.global_scale, kq.format)
    return pool, table, lengths.astype(np.int32)


@pytest.mark.parametrize("fmt", sorted(SCALE_TYPES))
@pytest.mark.parametrize("layout", ["paged_nhd", "paged_hnd"])
def test_paged_fp4_equals_flat(layout, fmt):
    rng = np.random.default_rng(11)
    qq, kq, cu_q, cu_k = fp4_problem(rng, fmt, [5, 33], [300, 129], 64)
    want = msa.block_scores(qq, kq, cu_q, cu_seqlens_k=cu_k, max_seqlen_k=300)
    want_ids = msa.block_topk(qq, kq, cu_q, cu_seqlens_k=cu_k, topk=2)
    assert not np.isnan(want).any()
    for page_size in (16, 64, 128):
        pool, table, seqused = fp4_pool(rng, kq, cu_k, page_size, layout)
        kv = dict(page_table=table, seqused_k=seqused, kv_layout=layout)
        got = msa.block_scores(qq, pool, cu_q, max_seqlen_k=300, **kv)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
        np.testing.assert_array_equal(msa.block_topk(qq, pool, cu_q, topk=2, **kv), want_ids)


@pytest.mark.parametrize("fmt", sorted(SCALE_TYPES))
def test_preordered_scales_equal_public(fmt):
    """q's and K's scales preordered (flat K, and 128-slot pools in both layouts); D = 96 leaves
    padding groups, 170 queries and 429 keys padding rows."""
    rng = np.random.default_rng(12)
    qq, kq, cu_q, cu_k = fp4_problem(rng, fmt, [100, 70], [300, 129], 96)
    want = msa.block_scores(qq, kq, cu_q, cu_seqlens_k=cu_k)
    want_ids = msa.block_topk(qq, kq, cu_q, cu_seqlens_k=cu_k, topk=3)
    q_pre = msa.reorder_fp4_scales(qq)
    assert q_pre.scale.shape == (8, 2, -(-qq.scale.shape[2] // 4), 32, 4, 4)
    runs = [(q_pre, kq, dict(cu_seqlens_k=cu_k)),
            (qq, msa.reorder_fp4_scales(kq), dict(cu_seqlens_k=cu_k)),
            (q_pre, msa.reorder_fp4_scales(kq), dict(cu_seqlens_k=cu_k))]
    for layout in ("paged_nhd", "paged_hnd"):
        pool, table, seqused = fp4_pool(rng, kq, cu_k, 128, layout)
        runs.append((q_pre, msa.reorder_fp4_scales(pool, layout),
                     dict(page_table=table, seqused_k=seqused, kv_layout=layout)))
    for q, k, kv in runs:
        got = msa.block_scores(q, k, cu_q, max_seqlen_k=300, **kv)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
        np.testing.assert_array_equal(msa.block_topk(q, k, cu_q, topk=3, **kv), want_ids)
    # Values and scales as separate arguments (q_scale=, k_scale=) pass the 6-D arrays through.
    got = msa.block_scores(msa.typed(qq.values, "fp4x2"), msa.typed(kq.values, "fp4x2"), cu_q,
                           cu_seqlens_k=cu_k, q_scale=q_pre.scale, q_global_scale=qq.global_scale,
                           k_scale=kq.scale, k_global_scale=kq.global_scale)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_reorder_errors():
    rng = np.random.default_rng(13)
    pub = random_scales(rng, (300, 3, 6), "nvfp4")
    with pytest.raises(msa.MsaError, match="layout: must be one of"):
        msa.reorder_fp4_scales(pub, "paged")
    with pytest.raises(msa.MsaError, match=r"scale: must be \[num_pages, 128, Hkv, G\] \(4 dims\)"):
        msa.reorder_fp4_scales(pub, "paged_nhd")
    with pytest.raises(msa.MsaError, match="scale: dtype must be fp8_e4m3 .NVFP4. or e8m0 .MXFP4., "
                                           "got u8; pass format="):
        msa.reorder_fp4_scales(pub.view(np.uint8))
    with pytest.raises(msa.MsaError, match="format: must be 'nvfp4' or 'mxfp4'"):
        msa.reorder_fp4_scales(pub.view(np.uint8), format="fp8_per_token")
    pool64 = random_scales(rng, (3, 64, 2, 8), "mxfp4")
    with pytest.raises(msa.MsaError, match="needs page_size 128 .each page is one 128-row tile., "
                                           "got page_size 64"):
        msa.reorder_fp4_scales(pool64, "paged_nhd")
    with pytest.raises(msa.MsaError,
                       match=r"out: preordered FP4 scales must be \[3, 3, 2, 32, 4, 4\]"):
        msa.reorder_fp4_scales(pub, out=np.zeros((3, 2, 2, 32, 4, 4), ml_dtypes.float8_e4m3fn))
    pre = msa.reorder_fp4_scales(pub)
    with pytest.raises(msa.MsaError, match=r"shape: the public shape \[T, H, G\] is required"):
        msa.reorder_fp4_scales_to_public(pre)
    with pytest.raises(msa.MsaError, match=r"shape: must be \[T, H, G\] \(3 ints\)"):
        msa.reorder_fp4_scales_to_public(pre, shape=(300, 3))
    with pytest.raises(msa.MsaError, match=r"scale: preordered FP4 scales must be \[3, 1, 2, 32"):
        msa.reorder_fp4_scales_to_public(pre, shape=(100, 3, 6))


def test_indexer_and_attention_errors():
    rng = np.random.default_rng(14)
    qq, kq, cu_q, cu_k = fp4_problem(rng, "nvfp4", [100, 70], [300, 129], 96)
    bad = msa.QTensor(qq.values, np.zeros((8, 1, 2, 32, 4, 4), ml_dtypes.float8_e4m3fn),
                      qq.global_scale, "nvfp4")
    with pytest.raises(msa.MsaError, match=r"q.scale: preordered FP4 scales must be \[8, 2, 2, 32"):
        msa.block_scores(bad, kq, cu_q, cu_seqlens_k=cu_k)
    pool, table, seqused = fp4_pool(rng, kq, cu_k, 64, "paged_nhd")
    pre_shape = (pool.values.shape[0] * 2, 1, 2, 32, 4, 4)
    pre = msa.QTensor(pool.values, np.zeros(pre_shape, ml_dtypes.float8_e4m3fn), 0.75, "nvfp4")
    with pytest.raises(msa.MsaError, match="k.scale: preordered FP4 scales of a page pool need "
                                           "page_size 128"):
        msa.block_scores(qq, pre, cu_q, page_table=table, seqused_k=seqused)
    # Attention takes the public layout only.
    q = rng.standard_normal((170, 8, 96)).astype(np.float32).astype(ml_dtypes.bfloat16)
    with pytest.raises(msa.MsaError, match=r"k.scale: the preordered \(6-D\) FP4 scale layout is "
                                           r"read by the indexer only"):
        msa.attention_forward(q, msa.reorder_fp4_scales(kq), kq, cu_q, cu_seqlens_k=cu_k)


def test_torch_tensors_and_compile():
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float8_e8m0fnu"):
        pytest.skip("torch without float8_e8m0fnu")
    gen = torch.Generator().manual_seed(15)
    for fmt, dtype in (("nvfp4", torch.float8_e4m3fn), ("mxfp4", torch.float8_e8m0fnu)):
        for layout, shape in (("flat", (300, 3, 6)), ("paged_hnd", (3, 2, 128, 6))):
            pub = torch.randint(1, 0xff, shape, generator=gen, dtype=torch.uint8)
            pre = msa.reorder_fp4_scales(pub.view(dtype), layout)
            assert pre.dtype == dtype
            assert np.array_equal(pre.view(torch.uint8).numpy(), preorder(pub.numpy(), layout))
            got = torch.compile(msa.reorder_fp4_scales, fullgraph=True, backend="eager")(
                pub.view(dtype), layout)
            assert torch.equal(got.view(torch.uint8), pre.view(torch.uint8))
            back = msa.reorder_fp4_scales_to_public(pre, layout, shape=shape)
            assert torch.equal(back.view(torch.uint8), pub)
    # The scale as uint8 storage typed by the dtype argument: opcheck's schema test multiplies
    # the inputs, which torch does not do for float8_e8m0fnu.
    torch.library.opcheck(torch.ops.msa.reorder_fp4_scales.default,
                          (pub, "e8m0", "paged_hnd",
                           [6, 1, 2, 32, 4, 4], False, None),
                          test_utils=("test_schema", "test_faketensor"))
