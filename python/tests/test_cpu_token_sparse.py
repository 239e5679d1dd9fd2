# CPU tests of the token-sparse input builders (msa/token_sparse.py): token_sparse_kv_indices
# against the paged layout's definition, group_union_masks against per-group sets, both over
# random shapes (empty requests and rows, 2-D and per-kv-head positions, torch and numpy), and
# masked dense attention over each group's gathered union against token-sparse attention of the
# same positions. Every error names its argument.
import numpy as np
import pytest

import msa

torch = pytest.importorskip("torch")


def random_positions(rng, lens, rows_of, k, heads=None):
    """[rows, k] (or [heads, rows, k]) distinct positions below each row's request length, in
    any order, -1 padded."""
    shape = (len(rows_of), k) if heads is None else (heads, len(rows_of), k)
    out = np.full(shape, -1, np.int32)
    for idx in np.ndindex(shape[:-1]):
        n = int(lens[rows_of[idx[-1]]])
        take = int(rng.integers(0, min(k, n) + 1))
        out[idx][:take] = rng.permutation(n)[:take]
        out[idx] = rng.permutation(out[idx])
    return out


def random_case(seed):
    rng = np.random.default_rng(seed)
    batch, ps = int(rng.integers(1, 4)), int(rng.choice([1, 4, 16, 64]))
    lens = rng.integers(0, 200, batch)
    lens[rng.integers(0, batch)] = int(rng.integers(1, 200))
    width = int(-(-lens.max() // ps)) + int(rng.integers(0, 3))
    pages = batch * width + 5
    table = rng.permutation(pages)[:batch * width].reshape(batch, width).astype(np.int32)
    rows_q = rng.integers(0, 5, batch)
    cu = np.concatenate([[0], np.cumsum(rows_q)]).astype(np.int32)
    rows_of = np.repeat(np.arange(batch), rows_q).astype(np.int32)
    return rng, lens, ps, table, cu, rows_of


@pytest.mark.parametrize("seed", range(12))
def test_kv_indices_follow_the_page_table(seed):
    rng, lens, ps, table, cu, rows_of = random_case(seed)
    heads = None if seed % 2 else 2
    pos = random_positions(rng, lens, rows_of, int(rng.integers(1, 9)), heads)
    got = msa.token_sparse_kv_indices(pos, rows_of, table, ps, seq_lens=lens.astype(np.int32))
    assert got.dtype == np.int32 and got.shape == pos.shape
    for idx in np.ndindex(pos.shape):
        p = pos[idx]
        want = -1 if p < 0 else table[rows_of[idx[-2]], p // ps] * ps + p % ps
        assert got[idx] == want, (idx, p)
    # torch in, torch out, the same values
    t = msa.token_sparse_kv_indices(torch.from_numpy(pos), torch.from_numpy(rows_of),
                                    torch.from_numpy(table), ps)
    assert isinstance(t, torch.Tensor) and np.array_equal(t.numpy(), got)


def test_kv_indices_errors():
    table = np.array([[3, 1], [0, -1]], np.int32)
    req = np.array([0, 1], np.int32)
    ok = np.array([[1, -1], [2, -1]], np.int32)
    assert msa.token_sparse_kv_indices(ok, req, table, 4).tolist() == [[13, -1], [2, -1]]
    cases = [
        (dict(positions=np.array([[1, 1], [2, -1]], np.int32)), "id 1 is repeated in the row at positions[0]"),
        (dict(positions=np.array([[8, -1], [2, -1]], np.int32)), "id 8 at positions[0] entry 0 is outside"),
        (dict(positions=np.array([[-2, -1], [2, -1]], np.int32)), "id -2 at positions[0] entry 0"),
        (dict(positions=np.array([[1, -1], [5, -1]], np.int32)), "block_table[1, 1] = -1"),
        (dict(requests=np.array([0, 2], np.int32)), "requests[1] = 2"),
        (dict(requests=np.array([0], np.int32)), "requests: must have one entry per row"),
        (dict(seq_lens=np.array([2, 2], np.int32)), "positions[1, 0] = 2: at or past seq_lens[1] = 2"),
        (dict(seq_lens=np.array([2, 9], np.int32)), "seq_lens[1] = 9"),
        (dict(positions=np.array([[0.5]])), "positions: must be an integer array"),
        (dict(page_size=0), "page_size"),
        (dict(page_size=2**30), "does not fit an int32 slot"),
    ]
    for change, message in cases:
        args = dict(positions=ok, requests=req, block_table=table, page_size=4)
        args.update(change)
        with pytest.raises(msa.MsaError, match=message.replace("[", r"\[").replace("]", r"\]")):
            msa.token_sparse_kv_indices(**args)


@pytest.mark.parametrize("seed", range(12))
def test_group_unions_and_masks(seed):
    rng, lens, ps, table, cu, rows_of = random_case(seed)
    heads = None if seed % 2 else 3
    pos = random_positions(rng, lens, rows_of, int(rng.integers(0, 7)), heads)
    g = int(rng.choice([1, 2, 3, 64]))
    packed = seed % 3 == 0
    res = msa.group_union_masks(pos, cu, g, packed=packed)
    # groups: each request's rows from its first, g at a time
    want_rows = [s for b in range(len(cu) - 1) for s in range(cu[b], cu[b + 1], g)]
    assert res.group_rows.tolist() == want_rows + [len(rows_of)]
    n = heads or 1
    p3 = pos.reshape((n,) + pos.shape[-2:])
    union = res.union.reshape((n,) + res.union.shape[-2:])
    lens_u = res.union_lens.reshape((n,) + res.union_lens.shape[-1:])
    mask = res.mask.reshape((n,) + res.mask.shape[-2:])
    width = union.shape[-1]
    if packed:
        assert mask.dtype == np.uint8 and mask.shape[-1] == -(-width // 8)
        mask = np.unpackbits(mask, axis=-1, count=width, bitorder="little").astype(bool)
    for h in range(p3.shape[0]):
        for i in range(len(want_rows)):
            r0, r1 = res.group_rows[i], res.group_rows[i + 1]
            keys = sorted({int(x) for x in p3[h, r0:r1].ravel() if x >= 0})
            assert lens_u[h, i] == len(keys)
            assert union[h, i].tolist() == keys + [-1] * (width - len(keys))
            for t in range(r0, r1):
                mine = {int(x) for x in p3[h, t] if x >= 0}
                assert {keys[j] for j in np.nonzero(mask[h, t])[0]} == mine
    # max_union pads up to group_size x K (the largest union possible); past it, or below the
    # largest union, it is an error
    cap = g * pos.shape[-1]
    more = msa.group_union_masks(torch.from_numpy(pos), torch.from_numpy(cu), g, max_union=cap)
    assert isinstance(more.union, torch.Tensor) and more.union.shape[-1] == cap
    assert torch.equal(more.union[..., :width], torch.from_numpy(res.union))
    with pytest.raises(msa.MsaError, match="at most group_size x K"):
        msa.group_union_masks(pos, cu, g, max_union=cap + 1)
    if width:
        with pytest.raises(msa.MsaError, match="a group's union has"):
            msa.group_union_masks(pos, cu, g, max_union=width - 1)


def test_group_union_errors():
    pos = np.array([[0, 1], [2, -1]], np.int32)
    cu = np.array([0, 2], np.int32)
    assert msa.group_union_masks(pos, cu, 2).union.tolist() == [[0, 1, 2]]
    for args, message in [((np.array([[0, 0], [2, -1]], np.int32), cu, 2), "is repeated"),
                          ((pos, np.array([0, 1], np.int32), 2), r"cu_seqlens_q\[-1\] = 1"),
                          ((pos, np.array([1, 2], np.int32), 2), "must start at 0"),
                          ((pos, cu, 0), "group_size"),
                          ((np.array([[2**31, -1], [2, -1]], np.int64), cu, 2), "int32 key"),
                          ((pos[0], cu, 2), "positions: must be")]:
        with pytest.raises(msa.MsaError, match=message):
            msa.group_union_masks(*args)


def test_masked_dense_attention_over_the_union_is_token_sparse_attention():
    """Each group's rows over its gathered union keys, masked per row, against attention_forward
    with the same positions as token ids (kv_block_size = 1, one kv head, not causal)."""
    rng = np.random.default_rng(7)
    hq, d, k_sel = 2, 64, 6
    lens_q, lens_k = np.array([5, 0, 7]), np.array([40, 10, 23])
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    rows_of = np.repeat(np.arange(3), lens_q)
    pos = random_positions(rng, lens_k, rows_of, k_sel)
    q = torch.randn(int(cu_q[-1]), hq, d, dtype=torch.float16)
    k = torch.randn(int(cu_k[-1]), 1, d, dtype=torch.float16)
    v = torch.randn(int(cu_k[-1]), 1, d, dtype=torch.float16)
    q2k = torch.from_numpy(np.sort(np.where(pos < 0, np.iinfo(np.int32).max, pos), axis=1))
    q2k = torch.where(q2k == np.iinfo(np.int32).max, -1, q2k).to(torch.int32)[None]
    want = msa.attention_forward(q, k, v, torch.from_numpy(cu_q), cu_seqlens_k=torch.from_numpy(cu_k),
                                 q2k=q2k, kv_block_size=1, causal=False)
    res = msa.group_union_masks(pos, cu_q, 3)
    starts = res.group_rows
    req_of_group = rows_of[starts[:-1]]
    gk = [cu_k[req_of_group[i]] + res.union[i, :res.union_lens[i]] for i in range(len(req_of_group))]
    idx = torch.from_numpy(np.concatenate(gk).astype(np.int64))
    cu_u = np.concatenate([[0], np.cumsum(res.union_lens)]).astype(np.int32)
    got = msa.attention_forward(q, k[idx], v[idx], torch.from_numpy(starts.astype(np.int32)),
                                cu_seqlens_k=torch.from_numpy(cu_u), causal=False,
                                key_mask=torch.from_numpy(res.mask))
    assert torch.equal(torch.isfinite(want), torch.isfinite(got))
    assert torch.allclose(want.float(), got.float(), atol=2e-3, rtol=2e-3)


# The C++ CPU op (msa._C, the oracle of the CUDA op) against the numpy version over the same
# random inputs: equal outputs, and an MsaError where numpy raises one.
@pytest.mark.parametrize("seed", range(8))
def test_cpp_cpu_ops_match_numpy(seed):
    from msa import _C
    rng, lens, ps, table, cu, rows_of = random_case(seed)
    heads = None if seed % 2 else 2
    pos = random_positions(rng, lens, rows_of, int(rng.integers(1, 9)), heads)
    want = msa.token_sparse_kv_indices(pos, rows_of, table, ps, seq_lens=lens.astype(np.int32))
    got = np.full(pos.shape, 7, np.int32)
    _C.token_sparse_kv_indices(positions=pos, requests=rows_of, block_table=table, page_size=ps,
                               seq_lens=lens.astype(np.int32), slots=got)
    assert np.array_equal(got, want)
    g, packed = int(rng.choice([1, 2, 3])), seed % 3 == 0
    ref = msa.group_union_masks(pos, cu, g, packed=packed)
    groups, cap = ref.union.shape[-2] + 1, ref.union.shape[-1] + 2   # spare capacity
    lead = pos.shape[:-2]
    out = dict(union_keys=np.empty(lead + (groups, cap), np.int32),
               union_lens=np.empty(lead + (groups,), np.int32),
               group_rows=np.empty((groups + 1,), np.int32),
               mask=np.empty(lead + (pos.shape[-2], -(-cap // 8) if packed else cap),
                             np.uint8 if packed else bool))
    if cap > g * pos.shape[-1]:
        with pytest.raises(msa.MsaError, match="at most group_size x K"):
            _C.group_union_masks(positions=pos, cu_seqlens_q=cu, group_size=g, **out)
        return
    _C.group_union_masks(positions=pos, cu_seqlens_q=cu, group_size=g, **out)
    width = ref.union.shape[-1]
    assert np.array_equal(out["union_keys"][..., :-1, :width], ref.union)
    assert (out["union_keys"][..., :-1, width:] == -1).all()
    assert np.array_equal(out["union_lens"][..., :-1], ref.union_lens)
    assert (out["union_lens"][..., -1] == 0).all()
    assert out["group_rows"].tolist() == ref.group_rows.tolist() + [len(rows_of)]
    m = out["mask"]
    if packed:
        m = np.unpackbits(m, axis=-1, count=cap, bitorder="little").astype(bool)
        r = np.unpackbits(ref.mask, axis=-1, count=width, bitorder="little").astype(bool)
    else:
        r = ref.mask
    assert np.array_equal(m[..., :width], r) and not m[..., width:].any()
    # an offence: numpy and C++ both raise, naming the same row
    bad = pos.copy()
    if bad.size:
        bad.reshape(-1)[-1] = -3
        with pytest.raises(msa.MsaError, match=r"id -3 at positions\["):
            msa.group_union_masks(bad, cu, g)
        with pytest.raises(msa.MsaError, match=r"id -3 at positions\["):
            _C.group_union_masks(positions=bad, cu_seqlens_q=cu, group_size=g, **out)


def test_cuda_keywords_on_host_arrays():
    """stream= and check= are accepted (and unused) on the host path; max_union stays optional
    there."""
    pos = np.array([[0, 1], [2, -1]], np.int32)
    cu = np.array([0, 2], np.int32)
    assert msa.group_union_masks(pos, cu, 2, stream=None, check=True).union.tolist() == [[0, 1, 2]]
    assert msa.token_sparse_kv_indices(pos, np.array([0, 0], np.int32),
                                       np.array([[1]], np.int32), 4, check=False).tolist() == \
        [[4, 5], [6, -1]]
