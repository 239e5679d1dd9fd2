# CPU tests of msa's sparse-mask converters (msa/sparse_convert.py): FlashInfer BSR <-> q2k and
# the k2q CSR, Flex BlockMask <-> q2k. Round trips over random block sizes and lengths, the keys
# each conversion selects against the source mask's element semantics, attention through the
# converted selection against a dense masked reference, and the errors, each naming its argument.
import numpy as np
import pytest

import msa
import np_reference as ref
from np_reference import block_elements, masked_attention, per_head_bsr, random_blocks, to_bsr

torch = pytest.importorskip("torch")
flex = pytest.importorskip("torch.nn.attention.flex_attention")


# References written from the source formats' definitions, independent of msa's code.

def cdiv(a, b):
    return -(-a // b)


def bsr_blocks(indptr, indices, mb, nb):
    """(indptr, indices) -> bool [MB, NB]."""
    out = np.zeros((mb, nb), bool)
    for r in range(mb):
        out[r, indices[indptr[r]:indptr[r + 1]]] = True
    return out


def q2k_keys(q2k, blk, num_kv):
    """The keys each (kv head, query) of a q2k selects: bool [Hkv, T, num_kv]."""
    q2k = np.asarray(q2k)
    out = np.zeros(q2k.shape[:2] + (num_kv,), bool)
    for h, t, i in zip(*np.nonzero(q2k >= 0)):
        b = q2k[h, t, i]
        out[h, t, b * blk:min((b + 1) * blk, num_kv)] = True
    return out


def assert_canonical(q2k):
    """Each row ascending, -1 only after the ids."""
    q2k = np.asarray(q2k)
    assert q2k.dtype == np.int32
    valid = q2k >= 0
    assert not (~valid[..., :-1] & valid[..., 1:]).any()
    big = np.where(valid, q2k, np.iinfo(np.int32).max)
    assert (np.diff(big, axis=-1) > 0)[valid[..., 1:]].all()


def flex_elements(bm, b, h, lq, lk):
    """The elements [lq, lk] a Flex BlockMask attends for batch b, head h of the mask: full
    blocks whole, partial blocks where mask_mod is True."""
    qbs, kbs = bm.BLOCK_SIZE
    nb = cdiv(bm.seq_lengths[1], kbs)

    def dense(num, idx):
        out = np.zeros((num.shape[-1], nb), bool)
        for r in range(num.shape[-1]):
            out[r, idx[b, h, r, :num[b, h, r]].numpy()] = True
        return out

    partial = dense(bm.kv_num_blocks, bm.kv_indices)
    full = dense(bm.full_kv_num_blocks, bm.full_kv_indices) if bm.full_kv_num_blocks \
        is not None else np.zeros_like(partial)
    qi, ki = torch.arange(lq)[:, None], torch.arange(lk)[None, :]
    mm = torch.broadcast_to(bm.mask_mod(torch.tensor(b), torch.tensor(h), qi, ki), (lq, lk))
    t, j = np.arange(lq), np.arange(lk)
    return full[t // qbs][:, j // kbs] | (partial[t // qbs][:, j // kbs] & mm.numpy())


# FlashInfer BSR <-> q2k.

def bsr_case(seed):
    """Random R, C, lengths (mostly not multiples of R and C) and a pattern."""
    rng = np.random.default_rng(seed)
    R = int(rng.choice([1, 3, 16, 64, 100, 128]))
    C = int(rng.choice([16, 32, 64, 128, 7, 48, 192, 256]))
    num_q = int(rng.integers(0, 4 * R + 3)) if seed % 5 else 0
    num_kv = int(rng.integers(1, 6 * C + 5)) if seed % 7 else 0
    mb, nb = cdiv(num_q, R), cdiv(num_kv, C)
    return rng, R, C, num_q, num_kv, random_blocks(rng, (mb, nb), rng.uniform(0.1, 0.7))


def default_block_size(C):
    return 128 if C % 128 == 0 else 64 if C % 64 == 0 else 1


@pytest.mark.parametrize("seed", range(40))
def test_bsr_round_trip(seed):
    rng, R, C, num_q, num_kv, blocks = bsr_case(seed)
    indptr, indices = to_bsr(blocks, rng)
    sel = msa.bsr_to_q2k(indptr, indices, R=R, C=C, num_q=num_q, num_kv=num_kv)
    s = default_block_size(C)
    assert sel.kv_block_size == s and sel.q2k.shape[:2] == (1, num_q)
    assert_canonical(sel.q2k)
    # The q2k selects exactly the keys of the listed blocks.
    np.testing.assert_array_equal(q2k_keys(sel.q2k, s, num_kv)[0],
                                  block_elements(blocks, R, C, num_q, num_kv))
    # ... and converts back to the same matrix, each row ascending.
    back_ptr, back_idx = msa.q2k_to_bsr(sel.q2k, R=R, kv_block_size=s, C=C, num_kv=num_kv)
    want_ptr, want_idx = to_bsr(blocks)
    assert back_ptr.dtype == np.int32 and back_idx.dtype == np.int32
    np.testing.assert_array_equal(back_ptr, want_ptr)
    np.testing.assert_array_equal(back_idx, want_idx)
    # Key ids express any matrix too, and give the same matrix back.
    ids = msa.bsr_to_q2k(indptr, indices, R=R, C=C, num_q=num_q, num_kv=num_kv,
                         kv_block_size=1)
    assert ids.kv_block_size == 1
    np.testing.assert_array_equal(q2k_keys(ids.q2k, 1, num_kv), q2k_keys(sel.q2k, s, num_kv))
    for got, want in zip(msa.q2k_to_bsr(ids.q2k, R=R, kv_block_size=1, C=C, num_kv=num_kv),
                         (want_ptr, want_idx)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("seed", range(6))
def test_bsr_torch_in_torch_out(seed):
    rng, R, C, num_q, num_kv, blocks = bsr_case(100 + seed)
    indptr, indices = to_bsr(blocks, rng)
    topk = msa.bsr_to_q2k(indptr, indices, R=R, C=C, num_q=num_q, num_kv=num_kv).q2k.shape[-1] + 3
    want = msa.bsr_to_q2k(indptr, indices, R=R, C=C, num_q=num_q, num_kv=num_kv, topk=topk)
    got = msa.bsr_to_q2k(torch.from_numpy(indptr).long(), torch.from_numpy(indices), R=R, C=C,
                         num_q=num_q, num_kv=num_kv, topk=topk)
    assert isinstance(got.q2k, torch.Tensor) and got.q2k.dtype == torch.int32
    assert got.q2k.shape[-1] == topk == want.q2k.shape[-1]
    np.testing.assert_array_equal(got.q2k.numpy(), want.q2k)
    back = msa.q2k_to_bsr(got.q2k, R=R, kv_block_size=got.kv_block_size, C=C, num_kv=num_kv)
    assert all(isinstance(x, torch.Tensor) and x.dtype == torch.int32 for x in back)
    np.testing.assert_array_equal(back[0].numpy(), to_bsr(blocks)[0])


def test_bsr_block_size_choices():
    """An explicit kv_block_size that expresses the matrix exactly is taken: C = 128 in blocks
    of 64, and C = 64 in blocks of 128 when the listed blocks pair up."""
    blocks = np.array([[1, 0, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1]], bool)
    indptr, indices = to_bsr(blocks)
    sel = msa.bsr_to_q2k(indptr, indices, R=4, C=128, num_q=10, num_kv=500, kv_block_size=64)
    assert sel.kv_block_size == 64
    np.testing.assert_array_equal(q2k_keys(sel.q2k, 64, 500)[0],
                                  block_elements(blocks, 4, 128, 10, 500))
    paired = np.array([[1, 1, 0, 0, 1, 1, 1], [0, 0, 1, 1, 0, 0, 1]], bool)
    sel = msa.bsr_to_q2k(*to_bsr(paired), R=8, C=64, num_q=16, num_kv=400, kv_block_size=128)
    np.testing.assert_array_equal(sel.q2k[0, 0], [0, 2, 3])
    np.testing.assert_array_equal(sel.q2k[0, 8], [1, 3, -1])
    with pytest.raises(msa.MsaError, match=r"kv_block_size: 128 cannot express the keys of "
                                           r"block row 0 \(kv head 0\): msa block 0 \(keys "
                                           r"0..127\) is partly selected"):
        msa.bsr_to_q2k(*to_bsr(paired[:, 1:6]), R=8, C=64, num_q=16, num_kv=300,
                       kv_block_size=128)


def test_bsr_kv_block_lens():
    """Blocks shortened by kv_block_lens need key ids; a short last block alone does not."""
    blocks = np.array([[1, 1, 0, 1], [0, 1, 1, 1]], bool)
    indptr, indices = to_bsr(blocks)
    lens = np.array([16, 5, 16, 16], np.int32)
    sel = msa.bsr_to_q2k(indptr, indices, R=3, C=16, num_q=6, num_kv=64, kv_block_lens=lens)
    assert sel.kv_block_size == 1
    np.testing.assert_array_equal(q2k_keys(sel.q2k, 1, 64)[0],
                                  block_elements(blocks, 3, 16, 6, 64, lens))
    lens64 = np.array([64, 64, 64, 10], np.int32)
    sel = msa.bsr_to_q2k(indptr, indices, R=3, C=64, num_q=6, num_kv=202, kv_block_lens=lens64)
    assert sel.kv_block_size == 64  # keys 202.. are past num_kv anyway
    sel = msa.bsr_to_q2k(indptr, indices, R=3, C=64, num_q=6, num_kv=256, kv_block_lens=lens64)
    assert sel.kv_block_size == 1
    np.testing.assert_array_equal(q2k_keys(sel.q2k, 1, 256)[0],
                                  block_elements(blocks, 3, 64, 6, 256, lens64))


@pytest.mark.parametrize("seed", range(8))
def test_bsr_per_head_round_trip(seed):
    rng = np.random.default_rng(200 + seed)
    hkv, R, C = int(rng.integers(1, 4)), int(rng.choice([5, 64])), int(rng.choice([16, 64]))
    num_q, num_kv = int(rng.integers(1, 200)), int(rng.integers(1, 300))
    mb, nb = cdiv(num_q, R), cdiv(num_kv, C)
    blocks = random_blocks(rng, (hkv, mb, nb), 0.4)
    mats = [to_bsr(b, rng) for b in blocks]
    width = max(len(m[1]) for m in mats) + 2
    indptr = np.stack([m[0] for m in mats])
    indices = np.full((hkv, width), 99, np.int32)  # entries past indptr[h, MB] are not read
    for h, m in enumerate(mats):
        indices[h, :len(m[1])] = m[1]
    sel = msa.bsr_to_q2k(indptr, indices, R=R, C=C, num_q=num_q, num_kv=num_kv)
    s = sel.kv_block_size
    assert sel.q2k.shape[:2] == (hkv, num_q)
    keys = q2k_keys(sel.q2k, s, num_kv)
    for h in range(hkv):
        np.testing.assert_array_equal(keys[h], block_elements(blocks[h], R, C, num_q, num_kv))
    ptr, idx = msa.q2k_to_bsr(sel.q2k, R=R, kv_block_size=s, C=C, num_kv=num_kv, per_head=True)
    assert ptr.shape == (hkv, mb + 1)
    for h in range(hkv):
        want_ptr, want_idx = to_bsr(blocks[h])
        np.testing.assert_array_equal(ptr[h], want_ptr)
        np.testing.assert_array_equal(idx[h, :want_ptr[-1]], want_idx)
        assert (idx[h, want_ptr[-1]:] == -1).all()
    # Query heads in groups of G that agree give the kv heads' selection.
    g = 3
    qheads = np.repeat(indptr, g, axis=0), np.repeat(indices, g, axis=0)
    grouped = msa.bsr_to_q2k(*qheads, R=R, C=C, num_q=num_q, num_kv=num_kv, num_kv_heads=hkv)
    np.testing.assert_array_equal(grouped.q2k, sel.q2k)


def test_bsr_shared_by_heads():
    blocks = np.array([[1, 0, 1], [0, 1, 0]], bool)
    indptr, indices = to_bsr(blocks)
    sel = msa.bsr_to_q2k(indptr, indices, R=2, C=64, num_q=4, num_kv=150, num_kv_heads=3)
    assert sel.q2k.shape == (3, 4, 2)
    assert (sel.q2k == sel.q2k[:1]).all()
    for got, want in zip(msa.q2k_to_bsr(sel.q2k, R=2, kv_block_size=64, num_kv=150),
                         (indptr, indices)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("seed", range(10))
def test_bsr_k2q_round_trip(seed):
    rng = np.random.default_rng(300 + seed)
    R, C = int(rng.choice([1, 7, 64, 128])), int(rng.choice([64, 128, 192, 256]))
    num_q, num_kv = int(rng.integers(0, 300)), int(rng.integers(1, 900))
    hkv = int(rng.integers(1, 3))
    blocks = random_blocks(rng, (cdiv(num_q, R), cdiv(num_kv, C)), 0.5)
    indptr, indices = to_bsr(blocks, rng)
    k2q = msa.bsr_to_k2q(indptr, indices, R=R, C=C, num_q=num_q, num_kv=num_kv,
                         num_kv_heads=hkv)
    sel = msa.bsr_to_q2k(indptr, indices, R=R, C=C, num_q=num_q, num_kv=num_kv,
                         num_kv_heads=hkv)
    cu_q, cu_k = np.array([0, num_q], np.int32), np.array([0, num_kv], np.int32)
    want = msa.q2k_to_k2q(sel.q2k, cu_q, cu_seqlens_k=cu_k, kv_block_size=sel.kv_block_size)
    assert k2q.schedule is None
    np.testing.assert_array_equal(k2q.row_ptr, want.row_ptr)
    np.testing.assert_array_equal(k2q.q_idx, want.q_idx)
    back = msa.k2q_to_bsr(k2q, R=R, kv_block_size=sel.kv_block_size, C=C, num_q=num_q,
                          num_kv=num_kv)
    for got, want in zip(back, to_bsr(blocks)):
        np.testing.assert_array_equal(got, want)
    tk = msa.bsr_to_k2q(torch.from_numpy(indptr), torch.from_numpy(indices), R=R, C=C,
                        num_q=num_q, num_kv=num_kv, num_kv_heads=hkv)
    assert isinstance(tk.row_ptr, torch.Tensor)
    np.testing.assert_array_equal(tk.q_idx.numpy(), k2q.q_idx)


# Attention through a converted BSR equals dense attention under the BSR's element mask.

@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", ["C64", "C16", "C128-as-64", "C64-keys", "C16-lens",
                                  "per-head"])
def test_bsr_attention_matches_dense_reference(case, causal):
    rng = np.random.default_rng(400 + len(case) + causal)
    hq, hkv, d = 4, 2, 32
    num_q, num_kv = 150, 200
    R, C = {"C64": (16, 64), "C16": (10, 16), "C128-as-64": (32, 128), "C64-keys": (7, 64),
            "C16-lens": (10, 16), "per-head": (20, 64)}[case]
    mb, nb = cdiv(num_q, R), cdiv(num_kv, C)
    kw = {"kv_block_size": 64} if case == "C128-as-64" else \
        {"kv_block_size": 1} if case == "C64-keys" else {}
    lens = None
    if case == "C16-lens":
        lens = rng.integers(1, C + 1, nb).astype(np.int32)
        kw["kv_block_lens"] = lens
    if case == "per-head":
        blocks = random_blocks(rng, (hkv, mb, nb), 0.5)
        indptr, indices = per_head_bsr(blocks, rng)
    else:
        blocks = np.broadcast_to(random_blocks(rng, (mb, nb), 0.5), (hkv, mb, nb))
        indptr, indices = to_bsr(blocks[0], rng)
        kw["num_kv_heads"] = hkv
    sel = msa.bsr_to_q2k(indptr, indices, R=R, C=C, num_q=num_q, num_kv=num_kv, **kw)
    assert sel.kv_block_size == {"C64": 64, "C16": 1, "C128-as-64": 64, "C64-keys": 1,
                                 "C16-lens": 1, "per-head": 64}[case]
    q, k, v, cu_q, cu_k = ref.problem(rng, [num_q], [num_kv], hq, hkv, d)
    out = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=sel.q2k,
                                kv_block_size=sel.kv_block_size, causal=causal)
    vis = ref.visible_mask(num_q, num_kv, causal)
    mask = np.stack([block_elements(blocks[h // (hq // hkv)], R, C, num_q, num_kv, lens) & vis
                     for h in range(hq)])
    assert mask.any() and not mask.all()
    np.testing.assert_allclose(out.astype(np.float64), masked_attention(q, k, v, mask),
                               atol=4e-3, rtol=2e-3)


# Flex BlockMask <-> q2k.

def q2k_from_blocks(blocks, qbs, blk, lq, lk):
    """A q2k [Hkv, sum(lq), topk] whose queries select, per q block of qbs, the msa blocks of
    blk listed in blocks[b] (bool [Hkv, QB, NB] per request)."""
    rows = []
    for m, nq, nk in zip(blocks, lq, lk):
        ids = [[list(np.flatnonzero(m[h, t // qbs, :cdiv(nk, blk)])) for t in range(nq)]
               for h in range(m.shape[0])]
        rows.append(ids)
    hkv = blocks[0].shape[0]
    width = max([len(r) for req in rows for head in req for r in head] + [1])
    out = np.full((hkv, sum(lq), width), -1, np.int32)
    t0 = 0
    for req, nq in zip(rows, lq):
        for h in range(hkv):
            for t in range(nq):
                out[h, t0 + t, :len(req[h][t])] = req[h][t]
        t0 += nq
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seed", range(8))
def test_q2k_block_mask_round_trip(seed, causal):
    rng = np.random.default_rng(500 + seed)
    blk = int(rng.choice([64, 128]))
    qbs = int(rng.choice([16, 64, 128, 100]))
    hkv, g = int(rng.integers(1, 3)), int(rng.choice([1, 2]))
    nreq = int(rng.integers(1, 4))
    lq = [int(x) for x in rng.integers(0, 300, nreq)]
    lk = [int(x) for x in rng.integers(1, 600, nreq)]
    blocks = [random_blocks(rng, (hkv, max(cdiv(nq, qbs), 1), cdiv(nk, blk)), 0.5)
              for nq, nk in zip(lq, lk)]
    q2k = q2k_from_blocks(blocks, qbs, blk, lq, lk)
    cu_q, cu_k = ref.cu_from_lengths(lq), ref.cu_from_lengths(lk)
    seq_len_kv = max(lk) + int(rng.integers(0, 100))
    bm = msa.q2k_to_block_mask(torch.from_numpy(q2k), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                               kv_block_size=blk, q_block_size=qbs, num_q_heads=hkv * g,
                               seq_len_kv=seq_len_kv, causal=causal)
    assert isinstance(bm, flex.BlockMask)
    assert bm.BLOCK_SIZE == (qbs, blk) and bm.seq_lengths == (max(lq), seq_len_kv)
    assert bm.kv_num_blocks.shape == (nreq, hkv * g, cdiv(max(lq), qbs))
    back = msa.block_mask_to_q2k(bm, causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                 num_kv_heads=hkv)
    assert back.kv_block_size == blk and isinstance(back.q2k, torch.Tensor)
    np.testing.assert_array_equal(back.q2k.numpy(), q2k)
    # The mask attends what msa attends with the q2k and the same causal flag.
    keys = q2k_keys(q2k, blk, max(lk))
    for b in range(nreq):
        sl = slice(cu_q[b], cu_q[b + 1])
        want = keys[:, sl, :lk[b]] & ref.visible_mask(lq[b], lk[b], causal)[None]
        for hm in range(hkv * g):
            np.testing.assert_array_equal(flex_elements(bm, b, hm, lq[b], lk[b]), want[hm // g])


@pytest.mark.parametrize("seed", range(4))
def test_q2k_block_mask_key_ids(seed):
    """Key ids (kv_block_size 1) go through a BlockMask of KV_BLOCK_SIZE 16 or 32 and back."""
    rng = np.random.default_rng(600 + seed)
    kbs, qbs = int(rng.choice([16, 32])), int(rng.choice([8, 32]))
    lq, lk = [int(rng.integers(1, 90)), int(rng.integers(1, 90))], [130, int(rng.integers(1, 200))]
    blocks = [random_blocks(rng, (1, cdiv(nq, qbs), cdiv(nk, kbs)), 0.4) for nq, nk in zip(lq, lk)]
    q2k = q2k_from_blocks(blocks, qbs, kbs, lq, lk)
    # As key ids: every key of each selected block of kbs, up to the request's last key.
    cu_q, cu_k = ref.cu_from_lengths(lq), ref.cu_from_lengths(lk)
    keys = q2k_keys(q2k, kbs, 200)
    rows = [np.flatnonzero(keys[0, t, :lk[int(t >= cu_q[1])]]) for t in range(sum(lq))]
    ids = np.full((1, sum(lq), max([1] + [len(r) for r in rows])), -1, np.int32)
    for t, sel in enumerate(rows):
        ids[0, t, :len(sel)] = sel
    bm = msa.q2k_to_block_mask(ids, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, kv_block_size=1,
                               mask_kv_block_size=kbs, q_block_size=qbs, causal=True)
    assert bm.BLOCK_SIZE == (qbs, kbs)
    back = msa.block_mask_to_q2k(bm, causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    assert back.kv_block_size == 1
    np.testing.assert_array_equal(back.q2k.numpy(), ids)


def flex_problem(rng, bm, lq, lk, hq, hkv, d=32):
    """Random varlen q, k, v for a Flex mask and the dense reference mask [Hq, total_q, total_k]
    (block-diagonal over requests; mask head hq, or 0 when the mask's head dim is 1)."""
    q, k, v, cu_q, cu_k = ref.problem(rng, lq, lk, hq, hkv, d)
    mask = np.zeros((hq, cu_q[-1], cu_k[-1]), bool)
    nb = bm.kv_num_blocks.shape[0]
    for b in range(len(lq)):
        for h in range(hq):
            hm = h if bm.kv_num_blocks.shape[1] > 1 else 0
            mask[h, cu_q[b]:cu_q[b + 1], cu_k[b]:cu_k[b + 1]] = \
                flex_elements(bm, b if nb > 1 else 0, hm, lq[b], lk[b])
    return q, k, v, cu_q, cu_k, mask


def sliced_attention(q, k, v, cu_q, cu_k, mask):
    """masked_attention of each request over its own keys."""
    out = np.zeros(q.shape)
    for b in range(len(cu_q) - 1):
        sq, sk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        out[sq] = masked_attention(q[sq], k[sk], v[sk], mask[:, sq, sk])
    return out


@pytest.mark.parametrize("sizes", [(128, 128), (64, 128), (128, 64), (32, 64), (48, 16),
                                   (128, 32)])
def test_causal_block_mask_attention_matches_flex_elements(sizes):
    """create_block_mask(causal) over padded batches -> q2k; msa's causal attention through it
    attends exactly the mask's elements."""
    qbs, kbs = sizes
    rng = np.random.default_rng(700 + qbs + kbs)
    hq, hkv, L = 4, 2, 300

    def causal_mod(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    bm = flex.create_block_mask(causal_mod, 2, 1, L, L, device="cpu", BLOCK_SIZE=(qbs, kbs))
    sel = msa.block_mask_to_q2k(bm, causal=True, num_kv_heads=hkv)
    assert sel.kv_block_size == default_block_size(kbs)
    q, k, v, cu_q, cu_k, mask = flex_problem(rng, bm, [L, L], [L, L], hq, hkv)
    out = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=sel.q2k.numpy(),
                                kv_block_size=sel.kv_block_size, causal=True)
    np.testing.assert_allclose(out.astype(np.float64), sliced_attention(q, k, v, cu_q, cu_k, mask),
                               atol=4e-3, rtol=2e-3)


def test_block_mask_varlen_heads_attention():
    """A per-head mask (H = Hq, groups alike) over requests shorter than Q_LEN / KV_LEN, with
    a bottom-right causal mask_mod (Lq < Lk) and the requests' own lengths."""
    rng = np.random.default_rng(800)
    hq, hkv, qbs, kbs = 4, 2, 32, 64
    lq, lk = [70, 0, 33], [250, 90, 64]
    q_len, kv_len = 80, 256
    off = torch.tensor([b - a for a, b in zip(lq, lk)])

    def mod(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + off[b]

    blocks = random_blocks(rng, (3, hkv, cdiv(q_len, qbs), cdiv(kv_len, kbs)), 0.6)
    dense = torch.from_numpy(np.repeat(blocks, hq // hkv, axis=1))
    num = dense.sum(-1).int()
    idx = torch.argsort((~dense).int(), dim=-1, stable=True).int()
    bm = flex.BlockMask.from_kv_blocks(num, idx, BLOCK_SIZE=(qbs, kbs), mask_mod=mod,
                                       seq_lengths=(q_len, kv_len))
    cu_q, cu_k = ref.cu_from_lengths(lq), ref.cu_from_lengths(lk)
    sel = msa.block_mask_to_q2k(bm, causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                num_kv_heads=hkv)
    assert sel.q2k.shape[:2] == (hkv, sum(lq))
    q, k, v, cu_q, cu_k, mask = flex_problem(rng, bm, lq, lk, hq, hkv)
    out = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=sel.q2k.numpy(),
                                kv_block_size=sel.kv_block_size, causal=True)
    np.testing.assert_allclose(out.astype(np.float64), sliced_attention(q, k, v, cu_q, cu_k, mask),
                               atol=4e-3, rtol=2e-3)
    with pytest.raises(msa.MsaError, match=r"block_mask: heads 0 and 2 share kv head 0 \(groups "
                                           r"of 4\) but select different blocks"):
        msa.block_mask_to_q2k(bm, causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                              num_kv_heads=1)


def test_noop_block_mask_is_non_causal():
    bm = flex.create_block_mask(flex.noop_mask, 1, 1, 200, 300, device="cpu", BLOCK_SIZE=64)
    sel = msa.block_mask_to_q2k(bm, causal=False)
    assert sel.kv_block_size == 64 and sel.q2k.shape == (1, 200, 5)
    assert (sel.q2k.numpy() == np.arange(5)).all()
    with pytest.raises(msa.MsaError, match=r"causal=True hides .*the mask matches causal=False"):
        msa.block_mask_to_q2k(bm, causal=True)


def test_block_mask_refusals():
    """Element masks msa cannot express are refused, naming the first element it would get
    wrong, and a causal mask converted with causal=False says which flag fits."""
    def window(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < 100)

    bm = flex.create_block_mask(window, 1, 1, 256, 256, device="cpu", BLOCK_SIZE=64)
    for causal in (True, False):
        with pytest.raises(msa.MsaError, match=r"block_mask: msa attends whole blocks, cut only "
                                               r"by the causal rule .* cannot express this mask: "
                                               r"mask_mod masks query"):
            msa.block_mask_to_q2k(bm, causal=causal)

    def causal_mod(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    bm = flex.create_block_mask(causal_mod, 1, 1, 256, 256, device="cpu", BLOCK_SIZE=64)
    with pytest.raises(msa.MsaError, match=r"mask_mod masks query 0 / key 1 .* the mask matches "
                                           r"causal=True: pass that"):
        msa.block_mask_to_q2k(bm, causal=False)
    # Flex's top-left causal is not msa's bottom-right one when Q_LEN != KV_LEN.
    bm = flex.create_block_mask(causal_mod, 1, 1, 128, 256, device="cpu", BLOCK_SIZE=64)
    with pytest.raises(msa.MsaError, match=r"cannot express this mask: mask_mod masks query 0 / "
                                           r"key 1"):
        msa.block_mask_to_q2k(bm, causal=True)
    # A mask_mod that fails on index tensors (a Python bool of a many-element tensor) is
    # reported, not skipped: the causal blocks' diagonal is partial, so it is evaluated.
    def failing(b, h, q_idx, kv_idx):
        return bool(q_idx >= kv_idx)

    whole = flex.create_block_mask(causal_mod, 1, 1, 256, 256, device="cpu", BLOCK_SIZE=64)
    bm = flex.BlockMask.from_kv_blocks(whole.kv_num_blocks, whole.kv_indices,
                                       whole.full_kv_num_blocks, whole.full_kv_indices,
                                       BLOCK_SIZE=64, mask_mod=failing)
    with pytest.raises(msa.MsaError, match=r"block_mask.mask_mod: evaluating it on the partial "
                                           r"blocks failed \(RuntimeError"):
        msa.block_mask_to_q2k(bm, causal=True)


# Errors: each names its argument.

BSR = (np.array([0, 1, 3], np.int32), np.array([1, 0, 2], np.int32))
BSR_KW = dict(R=4, C=64, num_q=8, num_kv=150)


@pytest.mark.parametrize("args, kw, match", [
    ((BSR[0].astype(np.float32), BSR[1]), {}, r"indptr: must be an integer array, got float32"),
    ((BSR[0][None, None], BSR[1]), {}, r"indptr: must be \[MB \+ 1\] or \[H, MB \+ 1\], got 3"),
    ((list(BSR[0]), BSR[1]), {}, r"indptr: expected an array"),
    ((np.array([1, 1, 3], np.int32), BSR[1]), {}, r"indptr: must start at 0, got indptr\[0\] = 1"),
    ((np.array([0, 3, 2], np.int32), BSR[1]), {},
     r"indptr: must be non-decreasing, got indptr\[1\] = 3 > indptr\[2\] = 2"),
    ((np.array([0, 1, 2, 3], np.int32), BSR[1]), {}, r"indptr: must have MB \+ 1 = 3 entries"),
    ((BSR[0], np.array([1, 0, 3], np.int32)), {},
     r"indices: indices\[2\] = 3 is outside \[0, NB = 3\)"),
    ((BSR[0], np.array([1, 2, 2], np.int32)), {},
     r"indices: block row 1 lists column block 2 twice"),
    ((BSR[0], np.array([1, 0, 2, 0], np.int32)), {},
     r"indices: indptr\[2\] = 3 entries are listed, but indices has 4"),
    ((BSR[0], BSR[1][None]), {}, r"indices: must be \[nnz\], got 2 dims"),
    (BSR, {"R": 0}, r"R: must be >= 1, got 0"),
    (BSR, {"C": 0}, r"C: must be >= 1, got 0"),
    (BSR, {"num_q": -1}, r"num_q: must be >= 0"),
    (BSR, {"num_kv": 1.5}, r"num_kv: expected an int"),
    (BSR, {"kv_block_size": 32}, r"kv_block_size: must be 64, 128 or 1 \(key ids\), got 32"),
    (BSR, {"topk": 1}, r"topk: 1 is less than the 2 ids of the widest row"),
    (BSR, {"kv_block_lens": np.array([64, 64], np.int32)},
     r"kv_block_lens: must have NB = ceil\(num_kv / C\) = 3 entries, got 2"),
    (BSR, {"kv_block_lens": np.array([64, 0, 64], np.int32)},
     r"kv_block_lens: kv_block_lens\[1\] = 0 is outside \[1, C = 64\]"),
    ((np.array([[0, 1, 2], [0, 1, 2]], np.int32), np.array([[0, 1], [0, 2]], np.int32)),
     {"num_kv_heads": 1}, r"indptr: heads 0 and 1 share kv head 0 \(groups of 2\) but select "
                          r"different blocks at block row 1, column block 1"),
    ((np.array([[0, 1, 2]] * 3, np.int32), np.array([[0, 1]] * 3, np.int32)),
     {"num_kv_heads": 2}, r"num_kv_heads: 2 must divide the 3 heads of indptr"),
    ((np.array([[0, 1, 2]] * 2, np.int32), np.array([[0, 1]] * 3, np.int32)), {},
     r"indices: must have H = 2 rows like indptr"),
    ((np.array([[0, 1, 5]] * 2, np.int32), np.array([[0, 1]] * 2, np.int32)), {},
     r"indices: indptr\[0, 2\] = 5 entries are listed, but indices row 0 has 2"),
])
def test_bsr_to_q2k_errors(args, kw, match):
    with pytest.raises(msa.MsaError, match=match):
        msa.bsr_to_q2k(*args, **{**BSR_KW, **kw})


def test_bsr_to_q2k_torch_dtype_error():
    with pytest.raises(msa.MsaError, match=r"indices: must be an integer array, got torch.float32"):
        msa.bsr_to_q2k(torch.from_numpy(BSR[0]), torch.zeros(3), **BSR_KW)
    with pytest.raises(msa.MsaError, match=r"indptr: must be an integer array, got torch.bool"):
        msa.bsr_to_q2k(torch.ones(3, dtype=torch.bool), torch.from_numpy(BSR[1]), **BSR_KW)


Q2K = np.array([[[0, 1], [1, 0], [2, -1], [-1, 2]]], np.int32)


@pytest.mark.parametrize("q2k, kw, match", [
    (Q2K.astype(np.int64), {}, r"q2k: must be int32, got int64"),
    (Q2K[0], {}, r"q2k: must be \[Hkv, num_q, topk\] \(3 dims\), got 2 dims"),
    (np.array([[[0, 3]] * 4], np.int32), {},
     r"q2k: id 3 at kv head 0, query 0, slot 1 is outside \[-1, 3\) \(3 blocks of 64 keys\)"),
    (np.array([[[1, 1]] * 4], np.int32), {}, r"q2k: id 1 is repeated in the row at kv head 0, "
                                             r"query 0"),
    (np.array([[[0, 1], [0, 2], [2, -1], [2, -1]]], np.int32), {},
     r"q2k: kv head 0, query 1 selects other ids than kv head 0, query 0, the first query of "
     r"its block of 2"),
    (np.concatenate([Q2K, Q2K[:, ::-1]]), {}, r"q2k: kv heads 0 and 1 select different blocks "
                                              r"in block row 0 \(column block 0\).*per_head=True"),
    (np.array([[[0, 1], [1, 0], [1, 2], [2, 1]]], np.int32), {"C": 128},
     r"q2k: the keys that block row 1 selects \(kv head 0\) cover part of column block 0 "
     r"\(keys 0..127\); a BSR row lists whole blocks of C = 128 keys"),
    (Q2K, {"kv_block_size": 1}, r"C: required with key ids"),
    (Q2K, {"kv_block_size": None}, r"kv_block_size: required"),
    (Q2K, {"R": -2}, r"R: must be >= 1"),
])
def test_q2k_to_bsr_errors(q2k, kw, match):
    with pytest.raises(msa.MsaError, match=match):
        msa.q2k_to_bsr(q2k, **{"R": 2, "kv_block_size": 64, "num_kv": 150, **kw})


def test_k2q_errors():
    with pytest.raises(msa.MsaError, match=r"C: the k2q index needs kv blocks of 64 or 128 keys, "
                                           r"and C = 16 is not a multiple of 64"):
        msa.bsr_to_k2q(*BSR, **{**BSR_KW, "C": 16})
    with pytest.raises(msa.MsaError, match=r"kv_block_size: the k2q index takes 64 or 128, got 1"):
        msa.bsr_to_k2q(*BSR, **BSR_KW, kv_block_size=1)
    with pytest.raises(msa.MsaError, match=r"k2q: must be a sequence"):
        msa.k2q_to_bsr(BSR[0], R=4, kv_block_size=64, num_q=8, num_kv=150)
    k2q = msa.bsr_to_k2q(*BSR, **BSR_KW)
    with pytest.raises(msa.MsaError, match=r"row_ptr: must be int32, got int64"):
        msa.k2q_to_bsr((k2q.row_ptr.astype(np.int64), k2q.q_idx), R=4, kv_block_size=64,
                       num_q=8, num_kv=150)
    with pytest.raises(msa.MsaError, match=r"kv_block_size: required"):
        msa.k2q_to_bsr(k2q, R=4, kv_block_size=None, num_q=8, num_kv=150)


def causal_mask_64():
    def causal_mod(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx
    return flex.create_block_mask(causal_mod, 2, 1, 256, 256, device="cpu", BLOCK_SIZE=64)


@pytest.mark.parametrize("kw, match", [
    ({"causal": 1}, r"causal: must be True or False, got 1"),
    ({"cu_seqlens_q": np.array([0, 300, 400], np.int32)},
     r"cu_seqlens_q: request 0 has 300 tokens, past the BlockMask's Q_LEN = 256"),
    ({"cu_seqlens_q": np.array([0, 3, 2], np.int32)},
     r"cu_seqlens_q: must be non-decreasing, got cu_seqlens_q\[1\] = 3 > cu_seqlens_q\[2\] = 2"),
    ({"cu_seqlens_q": np.array([0, 3, 5, 9], np.int32)},
     r"block_mask: batch dim 2 must be 1 or the 3 requests of cu_seqlens_q"),
    ({"cu_seqlens_k": np.array([0, 3], np.int32)},
     r"cu_seqlens_k: must have 3 entries like cu_seqlens_q, got 2"),
    ({"cu_seqlens_k": np.array([1, 3, 4], np.int32)}, r"cu_seqlens_k: must start at 0"),
    ({"kv_block_size": 128}, r"kv_block_size: 128 cannot express q block 0 of request 0"),
    ({"kv_block_size": 16}, r"kv_block_size: must be 64, 128 or 1"),
    ({"topk": 0}, r"topk: must be >= 1"),
    ({"num_kv_heads": 0}, r"num_kv_heads: must be >= 1"),
])
def test_block_mask_to_q2k_errors(kw, match):
    with pytest.raises(msa.MsaError, match=match):
        msa.block_mask_to_q2k(causal_mask_64(), **{"causal": True, **kw})


def test_block_mask_to_q2k_bad_masks():
    with pytest.raises(msa.MsaError, match=r"block_mask: expected a torch.nn.attention."
                                           r"flex_attention.BlockMask, got tuple"):
        msa.block_mask_to_q2k(BSR, causal=True)
    num = torch.tensor([[[1, 2]]], dtype=torch.int32)
    bad = flex.BlockMask.from_kv_blocks(num, torch.tensor([[[[0, 9], [1, 1]]]], dtype=torch.int32),
                                        BLOCK_SIZE=64, seq_lengths=(128, 128))
    with pytest.raises(msa.MsaError, match=r"block_mask: kv_indices lists kv block 1 twice for "
                                           r"batch 0, head 0, q block 1"):
        msa.block_mask_to_q2k(bad, causal=False)
    bad = flex.BlockMask.from_kv_blocks(num, torch.tensor([[[[2, 9], [1, 0]]]], dtype=torch.int32),
                                        BLOCK_SIZE=64, seq_lengths=(128, 128))
    with pytest.raises(msa.MsaError, match=r"block_mask: kv_indices\[0, 0, 0, 0\] = 2 is outside "
                                           r"\[0, 2\)"):
        msa.block_mask_to_q2k(bad, causal=False)
    idx = torch.tensor([[[[0, 1], [1, 0]]]], dtype=torch.int32)
    both = flex.BlockMask.from_kv_blocks(num, idx, num, idx, BLOCK_SIZE=64, seq_lengths=(128, 128))
    with pytest.raises(msa.MsaError, match=r"block_mask: kv block 0 is both partial and full for "
                                           r"batch 0, head 0, q block 0"):
        msa.block_mask_to_q2k(both, causal=False)
    crossing = flex.BlockMask.from_kv_blocks(torch.zeros_like(num), idx, num, idx, BLOCK_SIZE=64,
                                             seq_lengths=(128, 128))
    with pytest.raises(msa.MsaError, match=r"full block \(batch 0, head 0, q block 0, kv block "
                                           r"0\) of request 0 attends keys that causal=True "
                                           r"hides"):
        msa.block_mask_to_q2k(crossing, causal=True)


QM = np.array([[[0, -1]] * 4 + [[1, 0]] * 2], np.int32)


@pytest.mark.parametrize("kw, match", [
    ({"q_block_size": 3}, r"q2k: kv head 0, query 4 \(request 0\) selects other ids than kv head "
                          r"0, query 3 \(request 0\), the first query of its block of 3"),
    ({"seq_len_kv": None}, r"seq_len_kv: required without cu_seqlens_k"),
    ({"seq_len_kv": 50}, r"q2k: id 1 at kv head 0, query 4 \(request 0, slot 0\) is outside "
                          r"\[-1, 1\)"),
    ({"kv_block_size": 1}, r"mask_kv_block_size: required with key ids"),
    ({"num_q_heads": 3, "q2k": np.concatenate([QM, QM])},
     r"num_q_heads: 3 must be a multiple of q2k's 2 kv heads"),
    ({"cu_seqlens_q": np.array([0, 5], np.int32)}, r"cu_seqlens_q: must end at total_q = 6"),
    ({"q2k": QM.astype(np.int64)}, r"q2k: must be int32, got int64"),
    ({"mask_kv_block_size": 128}, r"q2k: the keys that q block 0 of request 0 selects \(kv head "
                                  r"0\) cover part of kv block 0"),
    ({"causal": None}, r"causal: must be True or False"),
])
def test_q2k_to_block_mask_errors(kw, match):
    args = {"q2k": QM, "cu_seqlens_q": np.array([0, 6], np.int32), "kv_block_size": 64,
            "causal": True, "q_block_size": 4, "seq_len_kv": 200, **kw}
    with pytest.raises(msa.MsaError, match=match):
        msa.q2k_to_block_mask(**args)


def test_empty_inputs():
    """No queries, no keys: empty selections and matrices, not errors."""
    sel = msa.bsr_to_q2k(np.zeros(1, np.int32), np.zeros(0, np.int32), R=4, C=64, num_q=0,
                         num_kv=100)
    assert sel.q2k.shape == (1, 0, 1)
    ptr, idx = msa.q2k_to_bsr(sel.q2k, R=4, kv_block_size=64, num_kv=100)
    assert list(ptr) == [0] and idx.shape == (0,)
    sel = msa.bsr_to_q2k(np.zeros(3, np.int32), np.zeros(0, np.int32), R=4, C=16, num_q=7,
                         num_kv=0)
    assert sel.q2k.shape == (1, 7, 1) and (sel.q2k == -1).all()
    ptr, idx = msa.q2k_to_bsr(sel.q2k, R=4, kv_block_size=1, C=16, num_kv=0)
    assert list(ptr) == [0, 0, 0] and idx.shape == (0,)


def test_exported():
    for name in ("Q2KSelection", "bsr_to_q2k", "q2k_to_bsr", "bsr_to_k2q", "k2q_to_bsr",
                 "block_mask_to_q2k", "q2k_to_block_mask"):
        assert name in msa.__all__ and getattr(msa, name).__doc__
