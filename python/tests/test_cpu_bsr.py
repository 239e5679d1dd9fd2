# CPU tests of msa.BlockSparseAttention (msa/bsr.py), FlashInfer-style block-sparse attention
# mapped onto msa's engine: random R, C, lengths, heads and causal against a dense float64
# reference with the BSR element mask (DESIGN section 18), the no-sync torch builder of the
# device path against bsr_to_q2k, the invalid matrices it leaves for msa's run-time q2k checks,
# repeatability, FP8 K/V, the HND layout, and the errors, each naming its argument.
import numpy as np
import pytest

import msa
import np_reference as ref
from msa.bsr import check_cuda_plan, q2k_from_bsr_torch
from np_reference import block_elements, masked_attention, per_head_bsr, random_blocks, to_bsr

torch = pytest.importorskip("torch")


def cdiv(a, b):
    return -(-a // b)


def bsr_problem(seed):
    """Random R, C, lengths (mostly not multiples), heads, causal and a pattern with empty
    rows; q, k, v f16."""
    rng = np.random.default_rng(seed)
    R = int(rng.choice([1, 16, 32, 64, 128, 3, 100]))
    C = int(rng.choice([16, 32, 64, 128, 256, 48]))
    M = int(rng.integers(1, 3 * R + 5)) if R < 100 else int(rng.integers(1, 2 * R + 5))
    N = int(rng.integers(1, 4 * C + 7))
    hq, hkv = [(4, 2), (4, 1), (2, 2), (6, 3), (8, 2)][seed % 5]
    mb, nb = cdiv(M, R), cdiv(N, C)
    blocks = random_blocks(rng, (mb, nb), rng.uniform(0.2, 0.8))
    indptr, indices = to_bsr(blocks, rng)
    q, k, v, _, _ = ref.problem(rng, [M], [N], hq, hkv, 32)
    return rng, R, C, M, N, hq, hkv, blocks, indptr, indices, q, k, v


def reference(q, k, v, blocks, R, C, causal, scale=None, lens=None):
    M, N = q.shape[0], k.shape[0]
    mask = block_elements(blocks, R, C, M, N, lens) & ref.visible_mask(M, N, causal)
    return masked_attention(q, k, v, np.broadcast_to(mask, (q.shape[1], M, N)), scale), mask


@pytest.mark.parametrize("seed", range(36))
def test_matches_dense_reference(seed):
    rng, R, C, M, N, hq, hkv, blocks, indptr, indices, q, k, v = bsr_problem(seed)
    causal = bool(seed % 2)
    scale = None if seed % 3 else 0.2
    use_torch = seed % 4 >= 2
    if use_torch:
        indptr, indices = torch.from_numpy(indptr), torch.from_numpy(indices)
        q, k, v = (torch.from_numpy(x) for x in (q, k, v))
    bsa = msa.BlockSparseAttention().plan(
        indptr, indices, M=M, N=N, R=R, C=C, num_qo_heads=hq, num_kv_heads=hkv, head_dim=32,
        causal=causal, sm_scale=scale)
    assert bsa.planned
    assert bsa.kv_block_size == (128 if C % 128 == 0 else 64 if C % 64 == 0 else 1)
    assert isinstance(bsa.q2k, torch.Tensor) == use_torch
    out, lse = bsa.run(q, k, v, return_lse=True)
    out2, lse2 = bsa.run(q, k, v, return_lse=True)
    to_np = (lambda x: x.numpy()) if use_torch else np.asarray
    assert np.array_equal(to_np(out), to_np(out2)) and np.array_equal(to_np(lse), to_np(lse2))
    want, mask = reference(to_np(q), to_np(k), to_np(v), blocks, R, C, causal, scale)
    np.testing.assert_allclose(to_np(out).astype(np.float64), want, atol=4e-3, rtol=2e-3)
    # lse is -inf exactly where a query has no key.
    assert np.array_equal(np.isinf(to_np(lse)), np.broadcast_to(~mask.any(1), (hq, M)))


def test_flashinfer_example():
    # FlashInfer's docstring example: the 3 x 3 matrix [[0, 0, 1], [1, 0, 1], [0, 1, 1]] with
    # R = C = 1 (key ids), GQA 32 / 8 heads.
    rng = np.random.default_rng(0)
    indptr = torch.tensor([0, 1, 3, 5], dtype=torch.int32)
    indices = torch.tensor([2, 0, 2, 1, 2], dtype=torch.int32)
    bsa = msa.BlockSparseAttention().plan(indptr, indices, M=3, N=3, R=1, C=1, num_qo_heads=32,
                                          num_kv_heads=8, head_dim=128)
    q, k, v, _, _ = ref.problem(rng, [3], [3], 32, 8, 128)
    out = bsa.run(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v))
    dense = np.array([[0, 0, 1], [1, 0, 1], [0, 1, 1]], bool)
    want = masked_attention(q, k, v, np.broadcast_to(dense, (32, 3, 3)))
    np.testing.assert_allclose(out.numpy().astype(np.float64), want, atol=4e-3, rtol=2e-3)


def test_per_head_and_kv_block_lens():
    rng = np.random.default_rng(7)
    R, C, M, N, hq, hkv = 20, 16, 70, 90, 4, 2
    mb, nb = cdiv(M, R), cdiv(N, C)
    blocks = random_blocks(rng, (hkv, mb, nb), 0.5)
    indptr, indices = per_head_bsr(blocks, rng)
    lens = rng.integers(1, C + 1, nb).astype(np.int32)
    bsa = msa.BlockSparseAttention().plan(indptr, indices, M=M, N=N, R=R, C=C, num_qo_heads=hq,
                                          num_kv_heads=hkv, head_dim=32, kv_block_lens=lens,
                                          causal=True)
    q, k, v, _, _ = ref.problem(rng, [M], [N], hq, hkv, 32)
    out = bsa.run(q, k, v)
    vis = ref.visible_mask(M, N, True)
    mask = np.stack([block_elements(blocks[h // 2], R, C, M, N, lens) & vis for h in range(hq)])
    np.testing.assert_allclose(out.astype(np.float64), masked_attention(q, k, v, mask),
                               atol=4e-3, rtol=2e-3)


# The device path's builder, run here on CPU tensors.

def builder_case(seed):
    rng = np.random.default_rng(1000 + seed)
    R = int(rng.choice([1, 16, 32, 64, 128, 5]))
    C = int(rng.choice([16, 32, 64, 128, 256, 384, 48]))
    s = int(rng.choice([v for v in (1, 64, 128) if C % v == 0]))
    M, N = int(rng.integers(1, 3 * R + 4)), int(rng.integers(1, 5 * C + 3))
    hkv = int(rng.integers(1, 4))
    mb, nb = cdiv(M, R), cdiv(N, C)
    per_head = seed % 3 == 0
    blocks = random_blocks(rng, (hkv if per_head else 1, mb, nb), rng.uniform(0.1, 0.9))
    indptr, indices = per_head_bsr(blocks, rng) if per_head else to_bsr(blocks[0], rng)
    widest = int(np.diff(indptr, axis=-1).max())
    topk = max(1, widest) + int(rng.integers(0, 3))
    lens = rng.integers(1, C + 1, nb).astype(np.int32) if s == 1 and seed % 2 else None
    return R, C, s, M, N, hkv, indptr, indices, topk, lens


@pytest.mark.parametrize("seed", range(40))
def test_torch_builder_matches_bsr_to_q2k(seed):
    R, C, s, M, N, hkv, indptr, indices, topk, lens = builder_case(seed)
    dt = torch.int64 if seed % 2 else torch.int32
    got = q2k_from_bsr_torch(torch.from_numpy(indptr).to(dt), torch.from_numpy(indices).to(dt),
                             M=M, N=N, R=R, C=C, num_kv_heads=hkv, topk=topk, kv_block_size=s,
                             kv_block_lens=None if lens is None else torch.from_numpy(lens))
    want = msa.bsr_to_q2k(indptr, indices, R=R, C=C, num_q=M, num_kv=N, num_kv_heads=hkv,
                          kv_block_size=s, kv_block_lens=lens, topk=topk * (C // s))
    assert want.kv_block_size == s
    assert got.dtype == torch.int32 and got.is_contiguous()
    assert np.array_equal(got.numpy(), want.q2k)


def test_torch_builder_makes_no_host_reads():
    # Every op the builder uses keeps working on tensors whose values the host cannot see.
    indptr = torch.tensor([0, 1, 3, 5], dtype=torch.int32, device="meta")
    indices = torch.empty(5, dtype=torch.int32, device="meta")
    q2k = q2k_from_bsr_torch(indptr, indices, M=300, N=384, R=128, C=128, num_kv_heads=2,
                             topk=2, kv_block_size=128)
    assert q2k.shape == (2, 300, 2) and q2k.device.type == "meta"


BAD_ROWS = {
    # name: (indptr, indices, the block rows left invalid)
    "row past topk": ([0, 3, 4], [0, 1, 2, 1], [0]),
    "column out of range": ([0, 1, 2], [0, 3], [1]),
    "negative column": ([0, 1, 2], [-1, 0], [0]),
    "decreasing indptr": ([0, 2, 1], [0, 1], [1]),
    "indptr past indices": ([0, 1, 3], [0, 1], [1]),
    "indptr short of indices": ([0, 1, 1], [0, 1], [1]),
    "indptr not from 0": ([1, 1, 2], [0, 1], [0]),
}


@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_torch_builder_leaves_bad_rows_to_the_run_time_checks(case):
    ip, ix, bad = BAD_ROWS[case]
    R, C, M, N = 4, 64, 8, 192
    q2k = q2k_from_bsr_torch(torch.tensor(ip), torch.tensor(ix), M=M, N=N, R=R, C=C,
                             num_kv_heads=1, topk=2, kv_block_size=64)
    nblk = cdiv(N, 64)
    for r in range(2):
        row = q2k[0, r * R:(r + 1) * R]
        if r in bad:
            assert (row[:, 0] == nblk).all() and (row[:, 1:] == -1).all()
        else:
            assert (row < nblk).all()
    rng = np.random.default_rng(1)
    q, k, v, cu_q, cu_k = (torch.from_numpy(x) for x in ref.problem(rng, [M], [N], 2, 1, 32))
    with pytest.raises(msa.MsaError, match="q2k"):
        msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=q2k, kv_block_size=64,
                              causal=False)


def test_torch_builder_repeated_column_is_a_run_time_error():
    q2k = q2k_from_bsr_torch(torch.tensor([0, 2]), torch.tensor([1, 1]), M=4, N=128, R=4,
                             C=64, num_kv_heads=1, topk=2, kv_block_size=64)
    rng = np.random.default_rng(2)
    q, k, v, cu_q, cu_k = (torch.from_numpy(x) for x in ref.problem(rng, [4], [128], 1, 1, 32))
    with pytest.raises(msa.MsaError, match="repeat"):
        msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=q2k, kv_block_size=64,
                              causal=False)


def test_torch_builder_bad_kv_block_lens_is_a_run_time_error():
    q2k = q2k_from_bsr_torch(torch.tensor([0, 1]), torch.tensor([0]), M=4, N=32, R=4, C=16,
                             num_kv_heads=1, topk=1, kv_block_size=1,
                             kv_block_lens=torch.tensor([17, 4]))
    assert (q2k[0, :, 0] == 32).all()


# Repeatability, outputs, FP8 K/V, layouts.

def small_plan(**kw):
    rng = np.random.default_rng(11)
    R, C, M, N, hq, hkv = 16, 128, 100, 300, 4, 2
    blocks = random_blocks(rng, (cdiv(M, R), cdiv(N, C)), 0.6)
    indptr, indices = to_bsr(blocks, rng)
    q, k, v, _, _ = ref.problem(rng, [M], [N], hq, hkv, 64, dtype=np.float32)
    q, k, v = (torch.from_numpy(x).to(torch.bfloat16) for x in (q, k, v))
    bsa = msa.BlockSparseAttention().plan(torch.from_numpy(indptr), torch.from_numpy(indices),
                                          M=M, N=N, R=R, C=C, num_qo_heads=hq,
                                          num_kv_heads=hkv, head_dim=64, **kw)
    return bsa, q, k, v


def test_run_is_attention_forward_with_the_plan():
    bsa, q, k, v = small_plan(causal=True, sm_scale=0.1)
    got = bsa.run(q, k, v)
    cu_q = torch.tensor([0, 100], dtype=torch.int32)
    cu_k = torch.tensor([0, 300], dtype=torch.int32)
    want = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=bsa.q2k,
                                 kv_block_size=128, causal=True, softmax_scale=0.1)
    assert torch.equal(got, want)


def test_outputs_preallocated_and_lse():
    bsa, q, k, v = small_plan()
    out = torch.empty_like(q)
    lse = torch.empty(4, 100, dtype=torch.float32)
    res = bsa.run(q, k, v, out=out, lse=lse, return_lse=True)
    assert res[0] is out and res[1] is lse
    want, want_lse = bsa.run(q, k, v, return_lse=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)


def test_fp8_kv():
    bsa, q, k, v = small_plan(causal=True)
    kq, vq = msa.quantize(k, "fp8_per_token"), msa.quantize(v, "fp8_per_token")
    got = bsa.run(q, kq, vq)
    got2 = bsa.run(q, kq.values, vq.values, k_scale=kq.scale, v_scale=vq.scale)
    assert torch.equal(got, got2)
    plain = bsa.run(q, msa.dequantize(kq, dtype="bf16"), msa.dequantize(vq, dtype="bf16"))
    torch.testing.assert_close(got.float(), plain.float(), atol=2e-2, rtol=2e-2)


def test_hnd_layout_is_a_view():
    nhd, q, k, v = small_plan()
    hnd, _, _, _ = small_plan(layout="HND")
    kh, vh = k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()
    assert torch.equal(hnd.run(q, kh, vh), nhd.run(q, k, v))
    with pytest.raises(msa.MsaError, match=r"k: must be \[Hkv, N, \.\.\.\] = \[2, 300\]"):
        hnd.run(q, k, v)
    with pytest.raises(msa.MsaError, match="k: a QTensor is taken with layout 'NHD' only"):
        hnd.run(q, msa.quantize(k, "fp8_per_token"), vh)


def test_numpy_plan_torch_run_and_topk():
    rng = np.random.default_rng(3)
    blocks = random_blocks(rng, (4, 3), 0.7)
    indptr, indices = to_bsr(blocks, rng)
    widest = int(np.diff(indptr).max())
    bsa = msa.BlockSparseAttention().plan(indptr, indices, M=60, N=40, R=16, C=16,
                                          num_qo_heads=2, num_kv_heads=2, head_dim=32,
                                          topk=widest)
    assert isinstance(bsa.q2k, np.ndarray) and bsa.kv_block_size == 1
    with pytest.raises(msa.MsaError, match=f"topk: {widest - 1} is less than the {widest}"):
        msa.BlockSparseAttention().plan(indptr, indices, M=60, N=40, R=16, C=16,
                                        num_qo_heads=2, num_kv_heads=2, head_dim=32,
                                        topk=widest - 1)


# Errors.

def plan_kw(**kw):
    base = dict(M=8, N=128, R=4, C=64, num_qo_heads=2, num_kv_heads=1, head_dim=32)
    base.update(kw)
    return base


IP, IX = np.array([0, 1, 2], np.int32), np.array([0, 1], np.int32)


@pytest.mark.parametrize("kw, match", [
    (dict(mask=np.ones((2, 4, 64), bool), causal=True), "mask: causal=True with an element mask"),
    (dict(mask=np.ones((2, 4, 64), bool), packed_mask=np.ones(64, np.uint8)),
     "mask, packed_mask: pass at most one"),
    (dict(mask=np.ones((2, 4, 32), bool)), r"mask: must be \[nnz, R, C\] = \[2, 4, 64\]"),
    (dict(mask=np.ones((2, 4, 64), np.float32)), "mask: must be bool or uint8"),
    (dict(packed_mask=np.ones(3, np.uint8)),
     r"packed_mask: must be uint8 \[ceil\(nnz \* R \* C / 8\)\] = \[64\]"),
    # A CUDA plan takes element masks under the CPU's rules (these fail before anything is
    # placed on a device, so they run without one).
    (dict(N=256, C=128, mask=np.ones((2, 4, 64), bool), device="cuda:0"),
     r"mask: must be \[nnz, R, C\] = \[2, 4, 128\]"),
    (dict(N=256, C=128, mask=np.ones((2, 4, 128), bool), causal=True, device="cuda:0"),
     "mask: causal=True with an element mask"),
    (dict(logits_soft_cap=-1.0), "logits_soft_cap: must be a finite number >= 0"),
    (dict(pos_encoding_mode="ROPE_LLAMA"), "pos_encoding_mode: not supported"),
    (dict(rope_theta=1e4), "rope_theta: not supported"),
    (dict(rope_scale=2.0), "rope_scale: not supported"),
    (dict(block_mask=np.ones((2, 2, 2), bool)), "block_mask: pass exactly one block-sparse form"),
    (dict(q2k_indices=np.zeros((2, 2, 1), np.int32)), "q2k_indices: pass exactly one"),
    (dict(num_qo_heads=3, num_kv_heads=2), "num_qo_heads: 3 must be a multiple"),
    (dict(R=0), "R: must be >= 1"),
    (dict(C=0), "C: must be >= 1"),
    (dict(M=0), "M: must be >= 1"),
    (dict(causal=1), "causal: must be True or False"),
    (dict(layout="NDH"), "layout: must be 'NHD' or 'HND'"),
    (dict(sm_scale=-1.0), "sm_scale: must be a finite number > 0"),
    (dict(topk=0), "topk: must be >= 1"),
    (dict(M=9), r"indptr: must have MB \+ 1 = 4 entries"),
    (dict(C=32, kv_block_size=64, device="cuda:0"),
     "C: CUDA attends blocks of 64 or 128 keys, and C = 32"),
    (dict(C=96, kv_block_size=128, device="cuda:0"), "C: CUDA attends blocks of 64 or 128 keys"),
])
def test_plan_errors(kw, match):
    with pytest.raises(msa.MsaError, match=match):
        msa.BlockSparseAttention().plan(IP, IX, **plan_kw(**kw))


def element_reference_mask(indptr, indices, emask, R, C, M, N):
    """Query t keeps key j iff j's column block is listed in t's block row, at entry e, and
    emask[e, t % R, j % C]: a lookup per element (independent of bsr.py's block copies)."""
    entry = {(row, int(indices[e])): e for row in range(len(indptr) - 1)
             for e in range(indptr[row], indptr[row + 1])}
    out = np.zeros((M, N), bool)
    for t in range(M):
        for j in range(N):
            e = entry.get((t // R, j // C))
            out[t, j] = e is not None and bool(emask[e, t % R, j % C])
    return out


@pytest.mark.parametrize("seed", range(12))
def test_element_masks(seed):
    """FlashInfer's mask [nnz, R, C] (bool, uint8, flat) and packed_mask (little-endian bits)
    against the dense float64 reference of the same element mask."""
    rng, R, C, M, N, hq, hkv, blocks, indptr, indices, q, k, v = bsr_problem(seed)
    emask = rng.random((len(indices), R, C)) < 0.7
    if seed % 3 == 0:
        kw = dict(packed_mask=np.packbits(emask.reshape(-1), bitorder="little"))
    elif seed % 3 == 1:
        kw = dict(mask=emask.astype(np.uint8).reshape(-1))
    else:
        kw = dict(mask=torch.from_numpy(emask))
    bsa = msa.BlockSparseAttention().plan(indptr, indices, M=M, N=N, R=R, C=C, num_qo_heads=hq,
                                          num_kv_heads=hkv, head_dim=32, **kw)
    out, lse = bsa.run(q, k, v, return_lse=True)
    el = element_reference_mask(indptr, indices, emask, R, C, M, N)
    want = masked_attention(q, k, v, np.broadcast_to(el, (hq, M, N)))
    np.testing.assert_allclose(np.asarray(out).astype(np.float64), want, atol=4e-3, rtol=2e-3)
    assert np.array_equal(np.isinf(np.asarray(lse)), np.broadcast_to(~el.any(1), (hq, M)))


def test_element_mask_needs_the_indptr_form():
    with pytest.raises(msa.MsaError, match="mask: an element mask applies to the indptr / indices "
                                           "form"):
        msa.BlockSparseAttention().plan(block_mask=np.ones((1, 2, 2), bool),
                                        mask=np.ones((4, 4, 64), bool), **plan_kw())


def test_defaults_that_flashinfer_passes_are_taken():
    msa.BlockSparseAttention().plan(IP, IX, **plan_kw(logits_soft_cap=0.0,
                                                      pos_encoding_mode="NONE"))


def test_cuda_rules():
    check_cuda_plan(128, 128, None)
    check_cuda_plan(384, 128, None)
    check_cuda_plan(64, 64, None)
    check_cuda_plan(192, 64, None)
    check_cuda_plan(48, 1, None)  # key ids: any C, and kv_block_lens
    check_cuda_plan(128, 1, None)
    check_cuda_plan(128, 128, np.ones(1, np.int32))
    with pytest.raises(msa.MsaError, match="C: CUDA attends blocks of 64 or 128 keys, and C = 48"):
        check_cuda_plan(48, 64, None)



def test_run_errors():
    with pytest.raises(msa.MsaError, match="run\\(\\) called before a successful plan\\(\\)"):
        msa.BlockSparseAttention().run(None, None, None)
    bsa, q, k, v = small_plan()
    with pytest.raises(msa.MsaError, match=r"q: must be \[M, Hq, D\] = \[100, 4, 64\] as "
                                           r"planned, got \[99, 4, 64\]"):
        bsa.run(q[:99], k, v)
    with pytest.raises(msa.MsaError, match=r"q: must be \[M, Hq, D\]"):
        bsa.run(q[:, :2], k, v)
    with pytest.raises(msa.MsaError, match=r"v: must be \[N, Hkv, \.\.\.\] = \[300, 2\]"):
        bsa.run(q, k, v[:, :1])
    with pytest.raises(msa.MsaError, match=r"k: must be \[N, Hkv, D\] \(3 dims\)"):
        bsa.run(q, k[None], v)
    with pytest.raises(msa.MsaError, match="q: expected an array"):
        bsa.run(q.tolist(), k, v)
