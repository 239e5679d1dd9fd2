# CPU tests of msa.VariableBlockSparseAttention (msa/varblock.py), FlashInfer-style
# variable-block sparse attention mapped onto msa's engine: FlashInfer's example, random
# per-head row / column sizes (zeros included), masks, causal, GQA and both layouts against a
# dense float64 reference with the element mask (DESIGN section 18), the no-sync torch builder
# of the device path against the host builder (and on meta tensors), the invalid inputs it
# leaves for msa's run-time q2k checks, repeatability, and the errors, each naming its argument.
import numpy as np
import pytest

import msa
import np_reference as ref
from msa.varblock import q2k_from_varblock_torch, varblock_to_q2k
from np_reference import masked_attention, random_sizes, varblock_elements

torch = pytest.importorskip("torch")


def cdiv(a, b):
    return -(-a // b)


def aligned_sizes(rng, total, s):
    """Column sizes whose boundaries are multiples of s or total: whole blocks of s keys per
    column (the last short), zero-size columns mixed in."""
    blocks = cdiv(total, s)
    per = random_sizes(rng, blocks, int(rng.integers(1, blocks + 2)))
    ends = np.minimum(np.cumsum(per) * s, total)
    return np.diff(np.concatenate([[0], ends])).astype(np.int32)


def varblock_problem(seed):
    rng = np.random.default_rng(seed)
    hkv, g = [(1, 1), (2, 2), (2, 1), (3, 2), (1, 4), (4, 2)][seed % 6]
    qo_len = int(rng.integers(1, 200))
    kv_len = int(rng.integers(1, 300))
    mb, nb = int(rng.integers(1, 7)), int(rng.integers(1, 7))
    rows = np.stack([random_sizes(rng, qo_len, mb) for _ in range(hkv)])
    aligned = seed % 4 == 3
    if aligned:
        s = int(rng.choice([64, 128]))
        per = [aligned_sizes(rng, kv_len, s) for _ in range(hkv)]
        nb = max(len(p) for p in per)
        cols = np.stack([np.pad(p, (0, nb - len(p))) for p in per])
    else:
        cols = np.stack([random_sizes(rng, kv_len, nb) for _ in range(hkv)])
    mask = rng.random((hkv, mb, nb)) < rng.uniform(0.2, 0.9)
    q, k, v, _, _ = ref.problem(rng, [qo_len], [kv_len], hkv * g, hkv, 32)
    return mask, rows, cols, q, k, v, hkv, g


def reference(q, k, v, mask, rows, cols, g, causal, scale=None):
    """q [T, Hq, D], k, v [N, Hkv, D] (NHD numpy); the element mask per query head."""
    qo_len, kv_len = q.shape[0], k.shape[0]
    vis = ref.visible_mask(qo_len, kv_len, causal)
    em = np.stack([varblock_elements(mask[h // g], rows[h // g], cols[h // g]) & vis
                   for h in range(q.shape[1])])
    return masked_attention(q, k, v, em, scale), em


@pytest.mark.parametrize("seed", range(36))
def test_matches_dense_reference(seed):
    mask, rows, cols, q, k, v, hkv, g = varblock_problem(seed)
    causal = bool(seed % 2)
    layout = "HND" if seed % 3 else "NHD"
    scale = None if seed % 5 else 0.3
    use_torch = seed % 4 >= 2
    if layout == "HND":
        qi, ki, vi = (np.ascontiguousarray(x.swapaxes(0, 1)) for x in (q, k, v))
    else:
        qi, ki, vi = q, k, v
    args = (mask.astype(np.int32) if seed % 7 == 0 else mask, rows, cols)
    if use_torch:
        args = tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in args)
        qi, ki, vi = (torch.from_numpy(x) for x in (qi, ki, vi))
    vsa = msa.VariableBlockSparseAttention().plan(
        *args, hkv * g, hkv, 32, causal=causal, sm_scale=scale, layout=layout)
    assert vsa.planned and vsa.qo_len == q.shape[0] and vsa.kv_len == k.shape[0]
    bounds = np.cumsum(cols, 1)
    whole = [s for s in (128, 64) if ((bounds % s == 0) | (bounds == k.shape[0])).all()]
    assert vsa.kv_block_size == (whole[0] if whole else 1)
    if seed % 4 == 3:
        assert vsa.kv_block_size in (64, 128)
    out, lse = vsa.run(qi, ki, vi, return_lse=True)
    out2, lse2 = vsa.run(qi, ki, vi, return_lse=True)
    to_np = (lambda x: x.numpy()) if use_torch else np.asarray
    assert np.array_equal(to_np(out), to_np(out2)) and np.array_equal(to_np(lse), to_np(lse2))
    got = to_np(out)
    assert got.shape == qi.shape and got.flags["C_CONTIGUOUS"]
    if layout == "HND":
        got = got.swapaxes(0, 1)
    want, em = reference(q, k, v, mask, rows, cols, g, causal, scale)
    np.testing.assert_allclose(got.astype(np.float64), want, atol=4e-3, rtol=2e-3)
    assert np.array_equal(np.isinf(to_np(lse)), ~em.any(2))


def test_flashinfer_example():
    # FlashInfer's docstring example: one head, rows of 1, 2, 3 queries, columns of 3, 1, 2
    # keys, mask [[0, 0, 1], [1, 0, 1], [0, 1, 1]], q / k / v HND.
    block_mask_map = torch.tensor([[[0, 0, 1], [1, 0, 1], [0, 1, 1]]], dtype=torch.bool)
    block_row_sz = torch.tensor([[1, 2, 3]], dtype=torch.int32)
    block_col_sz = torch.tensor([[3, 1, 2]], dtype=torch.int32)
    vsa = msa.VariableBlockSparseAttention()
    assert vsa.plan(block_mask_map, block_row_sz, block_col_sz, 1, 1, 128) is vsa
    assert vsa.kv_block_size == 1
    q = torch.randn((1, 6, 128), dtype=torch.float16)
    k = torch.randn((1, 6, 128), dtype=torch.float16)
    v = torch.randn((1, 6, 128), dtype=torch.float16)
    o = vsa.run(q, k, v)
    assert o.shape == (1, 6, 128) and o.is_contiguous()
    dense = np.array([[0, 0, 0, 0, 1, 1]] + [[1, 1, 1, 0, 1, 1]] * 2 + [[0, 0, 0, 1, 1, 1]] * 3,
                     bool)
    want = masked_attention(q.transpose(0, 1).numpy(), k.transpose(0, 1).numpy(),
                            v.transpose(0, 1).numpy(), dense[None])
    np.testing.assert_allclose(o.transpose(0, 1).numpy().astype(np.float64), want,
                               atol=4e-3, rtol=2e-3)


def test_single_block_is_dense_attention():
    rng = np.random.default_rng(5)
    q, k, v, cu_q, cu_k = ref.problem(rng, [70], [90], 4, 2, 32)
    vsa = msa.VariableBlockSparseAttention().plan(
        np.ones((1, 1, 1), bool), np.array([[70]]), np.array([[90]]), 4, 2, 32, causal=True,
        layout="NHD")
    want = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, causal=True)
    np.testing.assert_allclose(vsa.run(q, k, v).astype(np.float32), want.astype(np.float32),
                               atol=2e-3)


# The device path's builder, run here on CPU tensors.

def builder_case(seed):
    rng = np.random.default_rng(2000 + seed)
    hkv = int(rng.integers(1, 4))
    qo_len, kv_len = int(rng.integers(1, 150)), int(rng.integers(1, 600))
    mb = int(rng.integers(1, 6))
    s = [1, 64, 128][seed % 3]
    rows = np.stack([random_sizes(rng, qo_len, mb) for _ in range(hkv)])
    if s == 1:
        nb = int(rng.integers(1, 6))
        cols = np.stack([random_sizes(rng, kv_len, nb) for _ in range(hkv)])
    else:
        per = [aligned_sizes(rng, kv_len, s) for _ in range(hkv)]
        nb = max(len(p) for p in per)
        cols = np.stack([np.pad(p, (0, nb - len(p))) for p in per])
    mask = rng.random((hkv, mb, nb)) < rng.uniform(0.1, 0.9)
    if seed % 5 == 0:                              # one pattern for every head
        mask, rows, cols = mask[:1], rows[:1], cols[:1]
    return rng, mask, rows, cols, hkv, s, qo_len, kv_len


@pytest.mark.parametrize("seed", range(36))
def test_torch_builder_matches_host_builder(seed):
    rng, mask, rows, cols, hkv, s, qo_len, kv_len = builder_case(seed)
    want, s2, lq, lk = varblock_to_q2k(mask, rows, cols, num_kv_heads=hkv, kv_block_size=s)
    assert (s2, lq, lk) == (s, qo_len, kv_len)
    topk = max(want.shape[2] + int(rng.integers(0, 3)), 1)
    want, _, _, _ = varblock_to_q2k(mask, rows, cols, num_kv_heads=hkv, kv_block_size=s,
                                    topk=topk)
    dt = torch.int64 if seed % 2 else torch.int32
    got = q2k_from_varblock_torch(
        torch.from_numpy(mask), torch.from_numpy(rows).to(dt), torch.from_numpy(cols).to(dt),
        qo_len=qo_len, kv_len=kv_len, num_kv_heads=hkv, topk=topk, kv_block_size=s)
    assert got.dtype == torch.int32 and got.is_contiguous()
    assert np.array_equal(got.numpy(), want)


def test_host_builder_selects_the_element_mask():
    for seed in range(12):
        rng, mask, rows, cols, hkv, s, qo_len, kv_len = builder_case(seed)
        q2k, s, _, _ = varblock_to_q2k(mask, rows, cols, num_kv_heads=hkv, kv_block_size=s)
        for h in range(hkv):
            hh = h if mask.shape[0] > 1 else 0
            em = varblock_elements(mask[hh], rows[hh], cols[hh])
            sel = np.zeros((qo_len, cdiv(kv_len, s) + 1), bool)
            for t in range(qo_len):
                ids = q2k[h, t][q2k[h, t] >= 0]
                assert np.all(np.diff(ids) > 0)
                sel[t, ids] = True
            assert np.array_equal(sel[:, np.arange(kv_len) // s], em)


def test_torch_builder_makes_no_host_reads():
    # Every op the builder uses keeps working on tensors whose values the host cannot see.
    meta = dict(device="meta")
    q2k = q2k_from_varblock_torch(
        torch.empty(2, 3, 4, dtype=torch.bool, **meta),
        torch.empty(2, 3, dtype=torch.int32, **meta), torch.empty(1, 4, dtype=torch.int64, **meta),
        qo_len=300, kv_len=500, num_kv_heads=2, topk=3, kv_block_size=128)
    assert q2k.shape == (2, 300, 3) and q2k.device.type == "meta"
    q2k = q2k_from_varblock_torch(
        torch.empty(1, 2, 2, dtype=torch.int8, **meta),
        torch.empty(1, 2, dtype=torch.int32, **meta), torch.empty(1, 2, dtype=torch.int32, **meta),
        qo_len=10, kv_len=7, num_kv_heads=2, topk=9, kv_block_size=1)
    assert q2k.shape == (2, 10, 9)


BAD = {
    # name: (rows, cols, kv_block_size, the queries of head 0 left invalid)
    "negative row size": ([[6, -2, 4]], [[128, 128]], 128, "all"),
    "negative column size": ([[4, 4]], [[256, -128, 128]], 128, "all"),
    "rows short of qo_len": ([[3, 3]], [[128, 128]], 128, "all"),
    "rows past qo_len": ([[4, 5]], [[128, 128]], 128, "all"),
    "columns short of kv_len": ([[4, 4]], [[128, 64]], 64, "all"),
    "unaligned column": ([[4, 4]], [[100, 156]], 128, "all"),
    "row past topk": ([[4, 4]], [[128, 128]], 128, [0, 1, 2, 3]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_torch_builder_leaves_bad_inputs_to_the_run_time_checks(case):
    rows, cols, s, bad = BAD[case]
    qo_len, kv_len = 8, 256
    mb, nb = len(rows[0]), len(cols[0])
    mask = torch.zeros(1, mb, nb, dtype=torch.bool)
    mask[0, 0] = True                      # row 0 selects every column: two blocks
    mask[0, 1:, 0] = True
    topk = 1 if case == "row past topk" else 2 * 256 // s
    q2k = q2k_from_varblock_torch(mask, torch.tensor(rows), torch.tensor(cols), qo_len=qo_len,
                                  kv_len=kv_len, num_kv_heads=1, topk=topk, kv_block_size=s)
    nblk = cdiv(kv_len, s)
    bad = range(qo_len) if bad == "all" else bad
    for t in range(qo_len):
        if t in bad:
            assert q2k[0, t, 0] == nblk and (q2k[0, t, 1:] == -1).all()
        else:
            assert (q2k[0, t] < nblk).all()
    rng = np.random.default_rng(1)
    q, k, v, cu_q, cu_k = (torch.from_numpy(x) for x in ref.problem(rng, [qo_len], [kv_len],
                                                                     2, 1, 32))
    with pytest.raises(msa.MsaError, match="q2k"):
        msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=q2k, kv_block_size=s,
                              causal=False)


# Layouts, outputs, FP8 K/V, the plan's result.

def small(layout="HND", **kw):
    rng = np.random.default_rng(11)
    qo_len, kv_len, hq, hkv = 100, 300, 4, 2
    rows = np.stack([random_sizes(rng, qo_len, 4) for _ in range(hkv)])
    cols = np.array([[128, 128, 44]] * hkv, np.int32)
    mask = rng.random((hkv, 4, 3)) < 0.6
    q, k, v, _, _ = ref.problem(rng, [qo_len], [kv_len], hq, hkv, 64, dtype=np.float32)
    q, k, v = (torch.from_numpy(x).to(torch.bfloat16) for x in (q, k, v))
    if layout == "HND":
        q, k, v = (x.transpose(0, 1).contiguous() for x in (q, k, v))
    vsa = msa.VariableBlockSparseAttention().plan(
        torch.from_numpy(mask), torch.from_numpy(rows), torch.from_numpy(cols), hq, hkv, 64,
        layout=layout, **kw)
    return vsa, q, k, v


def test_layouts_agree_and_run_is_attention_forward():
    hnd, qh, kh, vh = small(causal=True, sm_scale=0.1)
    nhd, q, k, v = small("NHD", causal=True, sm_scale=0.1)
    assert hnd.kv_block_size == 128
    got = nhd.run(q, k, v)
    assert torch.equal(hnd.run(qh, kh, vh), got.transpose(0, 1))
    want = msa.attention_forward(q, k, v, torch.tensor([0, 100], dtype=torch.int32),
                                 cu_seqlens_k=torch.tensor([0, 300], dtype=torch.int32),
                                 q2k=nhd.q2k, kv_block_size=128, causal=True, softmax_scale=0.1)
    assert torch.equal(got, want)
    # Strided HND views run as they are.
    assert torch.equal(hnd.run(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)),
                       got.transpose(0, 1))


def test_outputs_preallocated_and_lse():
    vsa, q, k, v = small()
    out = torch.empty_like(q)
    lse = torch.empty(4, 100, dtype=torch.float32)
    res = vsa.run(q, k, v, out=out, lse=lse, return_lse=True)
    assert res[0] is out and res[1] is lse
    want, want_lse = vsa.run(q, k, v, return_lse=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    with pytest.raises(msa.MsaError, match=r"out: must be \[Hq, qo_len, D\] = \[4, 100, 64\]"):
        vsa.run(q, k, v, out=torch.empty(4, 99, 64, dtype=torch.bfloat16))


def test_fp8_kv():
    vsa, q, k, v = small("NHD", causal=True)
    kq, vq = msa.quantize(k, "fp8_per_token"), msa.quantize(v, "fp8_per_token")
    got = vsa.run(q, kq.values, vq.values, k_scale=kq.scale, v_scale=vq.scale)
    plain = vsa.run(q, msa.dequantize(kq, dtype="bf16"), msa.dequantize(vq, dtype="bf16"))
    torch.testing.assert_close(got.float(), plain.float(), atol=2e-2, rtol=2e-2)


def test_topk_and_key_ids():
    mask = np.array([[[1, 0, 1], [0, 1, 0]]], bool)
    rows, cols = np.array([[3, 2]]), np.array([[5, 0, 7]])
    vsa = msa.VariableBlockSparseAttention().plan(mask, rows, cols, 2, 1, 32, topk=14)
    assert isinstance(vsa.q2k, np.ndarray) and vsa.kv_block_size == 1
    assert vsa.q2k.shape == (1, 5, 14)
    assert list(vsa.q2k[0, 0, :13]) == list(range(12)) + [-1]
    assert (vsa.q2k[0, 3:] == -1).all()             # row 1 selects the empty column only
    with pytest.raises(msa.MsaError, match="topk: 11 is less than the 12 keys"):
        msa.VariableBlockSparseAttention().plan(mask, rows, cols, 2, 1, 32, topk=11)


# Errors.

M1 = np.ones((2, 2, 2), bool)
R1 = np.array([[4, 4], [2, 6]], np.int32)
C1 = np.array([[64, 64], [100, 28]], np.int32)


@pytest.mark.parametrize("kw, match", [
    (dict(logits_soft_cap=float("inf")), "logits_soft_cap: must be a finite number >= 0"),
    (dict(pos_encoding_mode="ROPE_LLAMA"), "pos_encoding_mode: not supported"),
    (dict(pos_encoding_mode="ALIBI"), "pos_encoding_mode: not supported"),
    (dict(rope_theta=1e4), "rope_theta: not supported"),
    (dict(rope_scale=2.0), "rope_scale: not supported"),
    (dict(use_fp16_qk_reduction=True), "use_fp16_qk_reduction: not supported"),
    (dict(q_scale=np.ones(3, np.float32)), r"q_scale: not supported .* shape \[3\]"),
    (dict(k_scale=np.ones(3, np.float32)), "k_scale: not supported"),
    (dict(v_scale=np.ones(3, np.float32)), "v_scale: not supported"),
    (dict(num_qo_heads=3), "num_qo_heads: 3 must be a multiple"),
    (dict(num_qo_heads=6, num_kv_heads=3), "block_mask_map: its first dim is the kv head"),
    (dict(head_dim=0), "head_dim: must be >= 1"),
    (dict(causal=1), "causal: must be True or False"),
    (dict(layout="NDH"), "layout: must be 'NHD' or 'HND'"),
    (dict(sm_scale=0.0), "sm_scale: must be a finite number > 0"),
    (dict(topk=0), "topk: must be >= 1"),
    (dict(qo_len=9), "qo_len: 9 given, but block_row_sz sums to 8"),
    (dict(kv_len=127), "kv_len: 127 given, but block_col_sz sums to 128"),
    (dict(kv_block_size=32), "kv_block_size: must be 64, 128 or 1"),
    (dict(kv_block_size=64), "block_col_sz: kv_block_size 64 needs every column block"),
    # host arrays planned for CUDA follow the CPU's rules (other columns run as key ids there)
    (dict(device="cuda:0", kv_block_size=64), "block_col_sz: kv_block_size 64 needs every column"),
    (dict(block_mask_map=np.ones((2, 2, 2), np.float32)), "block_mask_map: must be an integer"),
    (dict(block_mask_map=np.ones((2, 2), bool)), r"block_mask_map: must be \[Hkv, MB, NB\]"),
    (dict(block_row_sz=R1[:, :1]), r"block_row_sz / block_col_sz: must be \[Hkv, MB\]"),
    (dict(block_row_sz=np.array([[4, 4], [9, -1]])), r"block_row_sz: sizes must be >= 0, "
                                                    r"got -1 at \[1, 1\]"),
    (dict(block_row_sz=np.array([[4, 4], [4, 5]])), "block_row_sz: every kv head must cover "
                                                    "the same length; head 0 sums to 8, head 1"),
    (dict(block_col_sz=np.zeros((2, 2), np.int32)), "block_col_sz: the sizes sum to kv_len = 0"),
    (dict(block_col_sz=C1.astype(np.float32)), "block_col_sz: must be an integer array"),
])
def test_plan_errors(kw, match):
    base = dict(block_mask_map=M1, block_row_sz=R1, block_col_sz=C1, num_qo_heads=4,
                num_kv_heads=2, head_dim=32)
    base.update(kw)
    with pytest.raises(msa.MsaError, match=match):
        msa.VariableBlockSparseAttention().plan(**base)


def test_defaults_that_flashinfer_passes_are_taken():
    msa.VariableBlockSparseAttention().plan(
        M1, R1, C1, 4, 2, 32, False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
        logits_soft_cap=0.0, non_blocking=True, q_data_type=torch.float16, kv_data_type=None)


def test_run_errors():
    with pytest.raises(msa.MsaError, match=r"VariableBlockSparseAttention: run\(\) called "
                                           r"before a successful plan\(\)"):
        msa.VariableBlockSparseAttention().run(None, None, None)
    vsa, q, k, v = small()
    with pytest.raises(msa.MsaError, match=r"q: must be \[Hq, qo_len, D\] = \[4, 100, 64\] as "
                                           r"planned, got \[4, 99, 64\]"):
        vsa.run(q[:, :99], k, v)
    with pytest.raises(msa.MsaError, match=r"v: must be \[Hkv, kv_len, \.\.\.\] = \[2, 300\]"):
        vsa.run(q, k, v[:1])
    with pytest.raises(msa.MsaError, match=r"k: must be \[Hkv, kv_len, D\] \(3 dims\)"):
        vsa.run(q, k[None], v)
    with pytest.raises(msa.MsaError, match="q: a QTensor is taken with layout 'NHD' only"):
        vsa.run(msa.quantize(q, "fp8_per_token"), k, v)
    nhd, q, k, v = small("NHD")
    with pytest.raises(msa.MsaError, match=r"q: must be \[qo_len, Hq, D\] = \[100, 4, 64\]"):
        nhd.run(q[:99], k, v)
