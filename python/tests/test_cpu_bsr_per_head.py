# CPU tests of FlashInfer's per-head block-sparse forms: block_mask [H, MB, NB] and q2k_indices
# [H, MB, K] with q2k_num [H, MB] (DESIGN section 18), through msa.bsr_mask_to_q2k,
# msa.q2k_indices_to_q2k and msa.BlockSparseAttention.plan: the same selection and the same
# outputs as the indptr / indices form of the pattern, a dense float64 reference, the no-sync
# torch builders of the device path (on CPU and meta tensors) against the host converters, the
# invalid rows they leave for msa's run-time q2k checks, and errors naming the argument.
import numpy as np
import pytest

import msa
import np_reference as ref
from msa.bsr import (_check_device_per_head, q2k_from_bsr_mask_torch,
                     q2k_from_q2k_indices_torch)
from np_reference import block_elements, masked_attention, per_head_bsr, random_blocks

torch = pytest.importorskip("torch")


def cdiv(a, b):
    return -(-a // b)


def to_q2k_indices(blocks, rng, extra=0, pad=None):
    """bool [H, MB, NB] -> (q2k_indices int32 [H, MB, K], q2k_num int32 [H, MB]): each row's
    blocks in a random order, then `extra` more slots of junk (pad, default random)."""
    h, mb, nb = blocks.shape
    num = blocks.sum(-1).astype(np.int32)
    k = int(num.max(initial=0)) + extra
    ix = rng.integers(-5, nb + 5, (h, mb, max(k, 1))).astype(np.int32) if pad is None else \
        np.full((h, mb, max(k, 1)), pad, np.int32)
    for hh in range(h):
        for r in range(mb):
            cols = np.flatnonzero(blocks[hh, r])
            rng.shuffle(cols)
            ix[hh, r, :cols.size] = cols
    return ix, num


def case(seed):
    rng = np.random.default_rng(500 + seed)
    R = int(rng.choice([1, 16, 32, 64, 5, 100]))
    C = int(rng.choice([16, 32, 64, 128, 256, 48]))
    M = int(rng.integers(1, 3 * R + 5))
    N = int(rng.integers(1, 4 * C + 7))
    hq, hkv = [(4, 2), (4, 1), (2, 2), (6, 3), (8, 2)][seed % 5]
    heads = [1, hkv, hq][seed % 3]
    mb, nb = cdiv(M, R), cdiv(N, C)
    kv_blocks = random_blocks(rng, (1 if heads == 1 else hkv, mb, nb), rng.uniform(0.2, 0.8))
    # The form's heads: H = Hq repeats each kv head's pattern for its group.
    blocks = np.repeat(kv_blocks, heads // kv_blocks.shape[0], axis=0)
    return rng, R, C, M, N, hq, hkv, kv_blocks, blocks


def forms(rng, blocks):
    ix, num = to_q2k_indices(blocks, rng, extra=int(rng.integers(0, 3)))
    full_ix, _ = to_q2k_indices(blocks[:, :, :], rng)   # rows of equal width need no q2k_num
    yield "block_mask", dict(block_mask=blocks)
    yield "q2k_indices", dict(q2k_indices=ix, q2k_num=num)
    if (blocks.sum(-1) == blocks.sum(-1).flat[0]).all() and blocks.sum(-1).flat[0] > 0:
        yield "q2k_indices without q2k_num", dict(q2k_indices=full_ix[..., :blocks.sum(-1).flat[0]])


@pytest.mark.parametrize("seed", range(30))
def test_converters_equal_bsr_to_q2k(seed):
    rng, R, C, M, N, hq, hkv, kv_blocks, blocks = case(seed)
    indptr, indices = per_head_bsr(kv_blocks, rng)
    size = dict(R=R, C=C, num_q=M, num_kv=N, num_kv_heads=hkv)
    want = msa.bsr_to_q2k(indptr, indices, **size)
    got = msa.bsr_mask_to_q2k(blocks, **size)
    assert got.kv_block_size == want.kv_block_size
    assert np.array_equal(got.q2k, want.q2k) and got.q2k.dtype == np.int32
    ix, num = to_q2k_indices(blocks, rng, extra=2)
    got = msa.q2k_indices_to_q2k(ix, num, **size)
    assert np.array_equal(got.q2k, want.q2k)
    # torch in, torch out; key ids and an explicit topk.
    got = msa.q2k_indices_to_q2k(torch.from_numpy(ix), torch.from_numpy(num), **size,
                                 kv_block_size=1, topk=N + 1)
    want = msa.bsr_to_q2k(indptr, indices, **size, kv_block_size=1, topk=N + 1)
    assert isinstance(got.q2k, torch.Tensor) and np.array_equal(got.q2k.numpy(), want.q2k)


def test_kv_block_lens_and_flashinfer_example():
    # FlashInfer's example pattern [[0, 0, 1], [1, 0, 1], [0, 1, 1]] with 32 / 8 heads.
    dense = np.array([[0, 0, 1], [1, 0, 1], [0, 1, 1]], bool)
    bm = torch.from_numpy(np.broadcast_to(dense, (32, 3, 3)).copy())
    ix = torch.tensor([[2, 0], [2, 0], [1, 2]], dtype=torch.int32).expand(32, 3, 2).contiguous()
    num = torch.tensor([1, 2, 2], dtype=torch.int32).expand(32, 3).contiguous()
    want = msa.bsr_to_q2k(np.array([0, 1, 3, 5]), np.array([2, 0, 2, 1, 2]), R=1, C=1, num_q=3,
                          num_kv=3, num_kv_heads=8)
    for got in (msa.bsr_mask_to_q2k(bm, R=1, C=1, num_q=3, num_kv=3, num_kv_heads=8),
                msa.q2k_indices_to_q2k(ix, num, R=1, C=1, num_q=3, num_kv=3, num_kv_heads=8)):
        assert torch.equal(got.q2k, torch.from_numpy(want.q2k))
    lens = np.array([3, 1, 2], np.int32)
    want = msa.bsr_to_q2k(np.array([0, 1, 3, 5]), np.array([2, 0, 2, 1, 2]), R=1, C=3, num_q=3,
                          num_kv=9, kv_block_lens=lens)
    got = msa.bsr_mask_to_q2k(dense[None], R=1, C=3, num_q=3, num_kv=9, kv_block_lens=lens)
    assert got.kv_block_size == 1 and np.array_equal(got.q2k, want.q2k)


@pytest.mark.parametrize("seed", range(20))
def test_plan_forms_match_indptr_and_reference(seed):
    rng, R, C, M, N, hq, hkv, kv_blocks, blocks = case(seed)
    causal = bool(seed % 2)
    indptr, indices = per_head_bsr(kv_blocks, rng)
    q, k, v, _, _ = ref.problem(rng, [M], [N], hq, hkv, 32)
    use_torch = seed % 4 >= 2
    conv = (lambda x: torch.from_numpy(np.ascontiguousarray(x))) if use_torch else (lambda x: x)
    q, k, v = (conv(x) for x in (q, k, v))
    kw = dict(M=M, N=N, R=R, C=C, num_qo_heads=hq, num_kv_heads=hkv, head_dim=32, causal=causal)
    base = msa.BlockSparseAttention().plan(conv(indptr), conv(indices), **kw)
    want = base.run(q, k, v)
    to_np = (lambda x: x.numpy()) if use_torch else np.asarray
    mask = np.stack([block_elements(kv_blocks[h * kv_blocks.shape[0] // hq], R, C, M, N)
                     for h in range(hq)]) & ref.visible_mask(M, N, causal)
    dense = masked_attention(to_np(q), to_np(k), to_np(v), mask)
    for name, args in forms(rng, blocks):
        args = {key: conv(val) for key, val in args.items()}
        bsa = msa.BlockSparseAttention().plan(**args, **kw)
        assert np.array_equal(to_np(bsa.q2k), to_np(base.q2k)), name
        assert bsa.kv_block_size == base.kv_block_size
        out = bsa.run(q, k, v)
        assert np.array_equal(to_np(out), to_np(want)), name
        np.testing.assert_allclose(to_np(out).astype(np.float64), dense, atol=4e-3, rtol=2e-3)


# The device path's builders, run here on CPU tensors.

@pytest.mark.parametrize("seed", range(30))
def test_torch_builders_match_host(seed):
    rng, R, C, M, N, hq, hkv, kv_blocks, blocks = case(seed)
    s = int(rng.choice([v for v in (1, 64, 128) if C % v == 0]))
    m = C // s
    widest = int(blocks.sum(-1).max())
    topk = max(1, widest) + int(rng.integers(0, 3))
    lens = rng.integers(1, C + 1, blocks.shape[2]).astype(np.int32) if s == 1 and seed % 2 \
        else None
    tl = None if lens is None else torch.from_numpy(lens)
    size = dict(R=R, C=C, num_kv_heads=hkv, kv_block_size=s)
    want = msa.bsr_mask_to_q2k(blocks, num_q=M, num_kv=N, kv_block_lens=lens, topk=topk * m,
                               **size).q2k
    got = q2k_from_bsr_mask_torch(torch.from_numpy(blocks), M=M, N=N, topk=topk,
                                  kv_block_lens=tl, **size)
    assert got.dtype == torch.int32 and got.is_contiguous()
    assert np.array_equal(got.numpy(), want)
    ix, num = to_q2k_indices(blocks, rng, extra=int(rng.integers(0, 3)))
    dt = torch.int64 if seed % 2 else torch.int32
    k = ix.shape[2]
    got = q2k_from_q2k_indices_torch(torch.from_numpy(ix).to(dt), torch.from_numpy(num), M=M,
                                     N=N, kv_block_lens=tl, **size)   # topk default K
    want = msa.q2k_indices_to_q2k(ix, num, num_q=M, num_kv=N, kv_block_lens=lens,
                                  topk=k * m, **size).q2k
    assert np.array_equal(got.numpy(), want)
    got = q2k_from_q2k_indices_torch(torch.from_numpy(ix), torch.from_numpy(num), M=M, N=N,
                                     topk=topk, kv_block_lens=tl, **size)
    want = msa.q2k_indices_to_q2k(ix, num, num_q=M, num_kv=N, kv_block_lens=lens,
                                  topk=topk * m, **size).q2k
    assert np.array_equal(got.numpy(), want)


def test_torch_builders_make_no_host_reads():
    bm = torch.empty((4, 3, 3), dtype=torch.bool, device="meta")
    q2k = q2k_from_bsr_mask_torch(bm, M=300, N=384, R=128, C=128, num_kv_heads=2, topk=2,
                                  kv_block_size=128)
    assert q2k.shape == (2, 300, 2) and q2k.device.type == "meta"
    ix = torch.empty((4, 3, 5), dtype=torch.int32, device="meta")
    num = torch.empty((4, 3), dtype=torch.int32, device="meta")
    q2k = q2k_from_q2k_indices_torch(ix, num, M=300, N=768, R=128, C=256, num_kv_heads=2,
                                     kv_block_size=128)
    assert q2k.shape == (2, 300, 10) and q2k.device.type == "meta"
    q2k = q2k_from_q2k_indices_torch(ix, None, M=300, N=768, R=128, C=256, num_kv_heads=4,
                                     topk=7, kv_block_size=128)
    assert q2k.shape == (4, 300, 14) and q2k.device.type == "meta"


def bad_rows(q2k, R, nblk, bad):
    for r in range(q2k.shape[1] // R):
        row = q2k[:, r * R:(r + 1) * R]
        if r in bad:
            assert (row[..., 0] == nblk).all() and (row[..., 1:] == -1).all(), r
        else:
            assert (row < nblk).all(), r


def run_fails(q2k, N, match="q2k"):
    rng = np.random.default_rng(1)
    hkv, M = q2k.shape[:2]
    q, k, v, cu_q, cu_k = (torch.from_numpy(x) for x in ref.problem(rng, [M], [N], hkv, hkv, 32))
    with pytest.raises(msa.MsaError, match=match):
        msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=q2k, kv_block_size=64,
                              causal=False)


def test_block_mask_builder_leaves_bad_rows_to_the_run_time_checks():
    # Row 0 of both heads selects three blocks (topk 2); row 1 of the query heads sharing kv
    # head 0 differs.
    bm = torch.tensor([[[1, 1, 1], [0, 1, 0], [1, 0, 0]],
                       [[1, 1, 1], [0, 0, 1], [1, 0, 0]]], dtype=torch.bool)
    q2k = q2k_from_bsr_mask_torch(bm, M=12, N=192, R=4, C=64, num_kv_heads=1, topk=2,
                                  kv_block_size=64)
    bad_rows(q2k, 4, 3, [0, 1])
    run_fails(q2k, 192)


@pytest.mark.parametrize("ix, num, bad", [
    ([[0, 1], [2, 0], [1, 0]], [2, 3, 1], [1]),            # q2k_num above K
    ([[0, 1], [2, 0], [1, 0]], [2, -1, 1], [1]),           # q2k_num negative
    ([[0, 3], [2, 0], [1, 9]], [2, 2, 1], [0]),            # id past NB, and one past q2k_num
    ([[0, 1], [-1, 0], [1, 0]], None, [1]),                # -1 without q2k_num
])
def test_q2k_indices_builder_leaves_bad_rows_to_the_run_time_checks(ix, num, bad):
    q2k = q2k_from_q2k_indices_torch(torch.tensor([ix]), None if num is None else
                                     torch.tensor([num]), M=12, N=192, R=4, C=64,
                                     num_kv_heads=1, kv_block_size=64)
    bad_rows(q2k, 4, 3, bad)
    run_fails(q2k, 192)


def test_q2k_indices_builder_rows_past_topk_groups_and_repeats():
    ix = torch.tensor([[[0, 1, 2], [2, 0, 1]], [[1, 0, 2], [2, 0, 1]]])
    num = torch.tensor([[3, 1], [3, 2]])
    q2k = q2k_from_q2k_indices_torch(ix, num, M=8, N=192, R=4, C=64, num_kv_heads=1, topk=2,
                                     kv_block_size=64)
    bad_rows(q2k, 4, 3, [0, 1])      # row 0: 3 > topk; row 1: the group's heads differ
    q2k = q2k_from_q2k_indices_torch(torch.tensor([[[1, 1]]]), None, M=4, N=128, R=4, C=64,
                                     num_kv_heads=1, kv_block_size=64)
    run_fails(q2k, 128, "repeat")


# Errors.

SIZE = dict(R=4, C=64, num_q=8, num_kv=128)


@pytest.mark.parametrize("fn, args, kw, match", [
    ("mask", (np.ones((1, 2, 2), np.int32),), {}, "block_mask: must be a bool array"),
    ("mask", (np.ones((1, 3, 2), bool),), {}, r"block_mask: must be \[H, MB, NB\] = \[H, 2, 2\]"),
    ("mask", (np.ones((2, 2), bool),), {}, r"block_mask: must be \[H, MB, NB\]"),
    ("mask", (np.array([[[1, 0], [1, 1]], [[1, 1], [1, 1]]], bool),), dict(num_kv_heads=1),
     "block_mask: heads 0 and 1 share kv head 0"),
    ("mask", (np.ones((1, 2, 2), bool),), dict(topk=1), "topk: 1 is less than the 2 ids"),
    ("idx", (np.zeros((1, 2, 1), np.float32),), {}, "q2k_indices: must be an integer array"),
    ("idx", (np.zeros((1, 3, 1), np.int32),), {}, r"q2k_indices: must be \[H, MB, K\] with MB"),
    ("idx", (np.zeros((2, 1), np.int32),), {}, r"q2k_indices: must be \[H, MB, K\] \(3 dims\)"),
    ("idx", (np.array([[[0], [2]]]),), {}, r"q2k_indices: q2k_indices\[0, 1, 0\] = 2 is outside"),
    ("idx", (np.array([[[0], [-1]]]),), {}, r"q2k_indices\[0, 1, 0\] = -1 .* not with -1"),
    ("idx", (np.array([[[0, 1], [1, 1]]]), np.array([[1, 2]])), {},
     "q2k_indices: block row 1 of head 0 lists column block 1 twice"),
    ("idx", (np.array([[[0, 1], [1, 0]]]), np.array([[1, 3]])), {},
     r"q2k_num: q2k_num\[0, 1\] = 3 is outside \[0, K = 2\]"),
    ("idx", (np.array([[[0, 1], [1, 0]]]), np.array([1, 2])), {},
     r"q2k_num: must be \[H, MB\] \(2 dims\)"),
    ("idx", (np.array([[[0, 1], [1, 0]]]), np.array([[1, 2, 0]])), {},
     r"q2k_num: must be \[H, MB\] = \[1, 2\] like q2k_indices"),
    ("idx", (np.array([[[0, 1]], [[0, 0]]]).repeat(2, 1), np.array([[2, 2], [1, 1]])),
     dict(num_kv_heads=1), "q2k_indices: heads 0 and 1 share kv head 0"),
    ("idx", (np.zeros((1, 2, 1), np.int32), [1, 1]), {}, "q2k_num: expected an array"),
])
def test_converter_errors(fn, args, kw, match):
    f = msa.bsr_mask_to_q2k if fn == "mask" else msa.q2k_indices_to_q2k
    with pytest.raises(msa.MsaError, match=match):
        f(*args, **SIZE, **kw)


def test_group_orders_may_differ():
    # Query heads of one group may list the same blocks in other orders.
    ix = np.array([[[0, 1], [1, 0]], [[1, 0], [0, 1]]])
    got = msa.q2k_indices_to_q2k(ix, None, **SIZE, num_kv_heads=1)
    assert np.array_equal(got.q2k, np.array([[[0, 1]] * 8]))


PLAN = dict(M=8, N=128, R=4, C=64, num_qo_heads=4, num_kv_heads=2, head_dim=32)
BM = np.ones((2, 2, 2), bool)
IX = np.array([[[0, 1], [1, 0]]] * 2, np.int32)


@pytest.mark.parametrize("args, kw, match", [
    ((np.array([0, 1, 2]), np.array([0, 1])), dict(block_mask=BM),
     "block_mask: pass exactly one block-sparse form.* got indptr / indices and block_mask"),
    ((), dict(block_mask=BM, q2k_indices=IX), "q2k_indices: pass exactly one"),
    ((), {}, "indptr: pass exactly one block-sparse form.* got none"),
    ((np.array([0, 1, 2]),), {}, "indices: required with indptr"),
    ((None, np.array([0, 1])), {}, "indptr: required with indices"),
    ((), dict(block_mask=BM, q2k_num=np.ones((2, 2), np.int32)),
     "q2k_num: given without q2k_indices"),
    ((), dict(block_mask=np.ones((3, 2, 2), bool)),
     "block_mask: must have 1, num_kv_heads = 2 or num_qo_heads = 4 heads, got 3"),
    ((), dict(q2k_indices=np.zeros((8, 2, 1), np.int32)),
     "q2k_indices: must have 1, num_kv_heads = 2 or num_qo_heads = 4 heads, got 8"),
    ((), dict(block_mask=BM, topk=1), "topk: 1 is less than the 2 column blocks"),
    ((), dict(q2k_indices=IX, topk=1), "topk: 1 is less than the 2 column blocks"),
    ((), dict(block_mask=BM.astype(np.int8)), "block_mask: must be a bool array"),
    ((), dict(block_mask=[[[True]]]), "block_mask: expected an array"),
    ((), dict(block_mask=BM, C=32, kv_block_size=64, device="cuda:0"),
     "C: CUDA attends blocks of 64 or 128 keys"),
])
def test_plan_errors(args, kw, match):
    with pytest.raises(msa.MsaError, match=match):
        msa.BlockSparseAttention().plan(*args, **{**PLAN, **kw})


def test_device_checks():
    # What plan() checks of CUDA tensors before building, run on CPU tensors.
    chk = _check_device_per_head
    chk("block_mask", torch.ones(4, 2, 3, dtype=torch.bool), None, 2, 3, 2, 4)
    chk("q2k_indices", torch.zeros(2, 2, 5, dtype=torch.int32), torch.zeros(2, 2).int(), 2, 3, 2, 4)
    for args, match in [
        (("block_mask", torch.ones(4, 2, 3), None), "block_mask: must be a bool tensor"),
        (("block_mask", torch.ones(4, 3, 3, dtype=torch.bool), None),
         r"block_mask: must be \[H, MB, NB\] = \[H, 2, 3\]"),
        (("block_mask", torch.ones(3, 2, 3, dtype=torch.bool), None),
         "block_mask: must have 1, num_kv_heads = 2 or num_qo_heads = 4 heads, got 3"),
        (("q2k_indices", torch.zeros(2, 2, 5), None), "q2k_indices: must be an integer tensor"),
        (("q2k_indices", torch.zeros(2, 2, 5, dtype=torch.int32), torch.zeros(2, 2).bool()),
         "q2k_num: must be an integer tensor"),
        (("q2k_indices", torch.zeros(2, 3, 5, dtype=torch.int32), None),
         r"q2k_indices: must be \[H, MB, K\] with MB = ceil\(M / R\) = 2"),
        (("q2k_indices", torch.zeros(2, 2, 5, dtype=torch.int32), torch.zeros(2, 5).int()),
         r"q2k_num: must be \[H, MB\] = \[2, 2\] like q2k_indices"),
    ]:
        with pytest.raises(msa.MsaError, match=match):
            chk(*args, 2, 3, 2, 4)
