# CPU tests of msa.mqa_logits with numpy arrays: the definition computed in numpy (fp8 through
# ml_dtypes), clean and kept columns, the argument errors.
import numpy as np
import pytest

import msa

ml_dtypes = pytest.importorskip("ml_dtypes")


def _problem(rng, t_rows=7, heads=4, dim=32, s_keys=90):
    q = rng.uniform(-2, 2, (t_rows, heads, dim)).astype(ml_dtypes.float8_e4m3fn)
    k = rng.uniform(-2, 2, (s_keys, dim)).astype(ml_dtypes.float8_e4m3fn)
    scale = rng.uniform(0.25, 1.5, s_keys).astype(np.float32)
    w = rng.uniform(-1, 1, (t_rows, heads)).astype(np.float32)
    a = rng.integers(0, s_keys + 1, t_rows)
    b = rng.integers(0, s_keys + 1, t_rows)
    return q, k, scale, w, np.minimum(a, b).astype(np.int32), np.maximum(a, b).astype(np.int32)


def _want(q, k, scale, w, ks, ke):
    dots = np.einsum("thd,sd->ths", q.astype(np.float64), k.astype(np.float64))
    logits = scale * np.einsum("th,ths->ts", w.astype(np.float64), np.maximum(dots, 0))
    cols = np.arange(k.shape[0])
    inside = (cols >= ks[:, None]) & (cols < ke[:, None])
    return np.where(inside, logits, -np.inf).astype(np.float32), inside


def test_matches_the_definition():
    q, k, scale, w, ks, ke = _problem(np.random.default_rng(1))
    got = msa.mqa_logits(q, k, w, ks, ke, k_scale=scale)
    want, _ = _want(q, k, scale, w, ks, ke)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_qtensor_keys_and_kept_columns():
    rng = np.random.default_rng(2)
    q, k, scale, w, ks, ke = _problem(rng)
    out = np.full((q.shape[0], k.shape[0]), 7.0, np.float32)
    got = msa.mqa_logits(q, msa.QTensor(k, scale), w, ks, ke, clean_logits=False, out=out)
    want, inside = _want(q, k, scale, w, ks, ke)
    assert got is out
    np.testing.assert_allclose(got[inside], want[inside], rtol=1e-6, atol=1e-6)
    assert (got[~inside] == 7.0).all()


def test_bad_ranges_and_shapes_are_errors():
    q, k, scale, w, ks, ke = _problem(np.random.default_rng(3))
    bad = ke.copy()
    bad[0] = k.shape[0] + 1
    with pytest.raises(msa.MsaError, match="ks, ke: row 0 must satisfy"):
        msa.mqa_logits(q, k, w, ks, bad, k_scale=scale)
    with pytest.raises(msa.MsaError, match="weights:"):
        msa.mqa_logits(q, k, w[:, :2], ks, ke, k_scale=scale)


def test_token_topk_on_logits_rows():
    q, k, scale, w, ks, ke = _problem(np.random.default_rng(4))
    logits = msa.mqa_logits(q, k, w, ks, ke, k_scale=scale)
    ids = msa.token_topk(logits, 5)
    assert ids.dtype == np.int32 and ids.shape == (q.shape[0], 5)
    for r in range(q.shape[0]):
        finite = np.flatnonzero(np.isfinite(logits[r]))
        order = sorted(finite, key=lambda s: (-logits[r, s], s))[:5]
        want = sorted(order) + [-1] * (5 - len(order))
        assert ids[r].tolist() == want, r
    ranged = msa.token_topk(logits, 3, ks=ks, ke=ke)
    assert ((ranged == -1) | ((ranged >= ks[:, None]) & (ranged < ke[:, None]))).all()


def test_paged_equals_ragged_per_request():
    """Seed 001's fused pool built from flat keys: each request's rows equal the ragged logits
    of its own keys, with each slot's limit."""
    rng = np.random.default_rng(8)
    next_n, heads, dim, bs, lens = 2, 4, 32, 16, [20, 0, 33]
    q = rng.uniform(-2, 2, (len(lens), next_n, heads, dim)).astype(ml_dtypes.float8_e4m3fn)
    w = rng.uniform(-1, 1, (len(lens) * next_n, heads)).astype(np.float32)
    blocks = sum((n + bs - 1) // bs for n in lens) + 1
    pool = np.zeros((blocks, bs * (dim + 4)), np.uint8)
    table = np.zeros((len(lens), 3), np.int32)
    order = rng.permutation(blocks)
    keys, scales, nxt = [], [], 0
    for b, n in enumerate(lens):
        k = rng.uniform(-2, 2, (n, dim)).astype(ml_dtypes.float8_e4m3fn)
        s = rng.uniform(0.5, 1.5, n).astype(np.float32)
        keys.append(k)
        scales.append(s)
        for j in range(n):
            if j % bs == 0:
                table[b, j // bs] = order[nxt]
                nxt += 1
            blk = pool[table[b, j // bs]]
            blk[(j % bs) * dim:(j % bs + 1) * dim] = k[j].view(np.uint8)
            blk[bs * dim + 4 * (j % bs):bs * dim + 4 * (j % bs) + 4] = s[j:j + 1].view(np.uint8)
    kv_fused = pool.reshape(blocks, bs, 1, dim + 4)
    seq = np.array(lens, np.int32)
    got = msa.paged_mqa_logits(q, kv_fused, w, table, seq, max(lens))
    for b, n in enumerate(lens):
        rows = got[b * next_n:(b + 1) * next_n]
        if n == 0:  # sees nothing
            assert np.isneginf(rows).all()
            continue
        ks = np.zeros(next_n, np.int32)
        ke = np.array([max(0, n - next_n + t + 1) for t in range(next_n)], np.int32)
        want = msa.mqa_logits(q[b], msa.QTensor(keys[b], scales[b]),
                              w[b * next_n:(b + 1) * next_n], ks, ke)
        assert np.array_equal(rows[:, :n], want)
        assert np.isneginf(rows[:, n:]).all()
    with pytest.raises(msa.MsaError, match="max_seq_len"):
        msa.paged_mqa_logits(q, kv_fused, w, table, seq, max(lens) - 1)


def test_logits_topk_equals_the_two_steps():
    """mqa_logits_topk / paged_mqa_logits_topk: token_topk's ids over the logits, for any
    workspace (one row, a few, none: the CPU's own chunks)."""
    q, k, scale, w, ks, ke = _problem(np.random.default_rng(9), t_rows=11)
    logits = msa.mqa_logits(q, k, w, ks, ke, k_scale=scale)
    row = (k.shape[0] * 4 + 15) // 16 * 16
    for topk in (1, 6, 120):
        want = msa.token_topk(logits, topk, ks=ks, ke=ke)
        for rows in (None, 1, 3, 11):
            ws = None if rows is None else np.zeros(rows * row, np.uint8)
            got = msa.mqa_logits_topk(q, k, w, ks, ke, topk, k_scale=scale, workspace=ws)
            assert np.array_equal(got, want), (topk, rows)
    assert msa.mqa_logits_topk_workspace_bytes(11, k.shape[0]) == 11 * row
    with pytest.raises(msa.MsaError, match="workspace: mqa_logits_topk needs at least"):
        msa.mqa_logits_topk(q, k, w, ks, ke, 4, k_scale=scale, workspace=np.zeros(row - 1, np.uint8))
    with pytest.raises(msa.MsaError, match="topk: must be >= 1"):
        msa.mqa_logits_topk(q, k, w, ks, ke, 0, k_scale=scale)


def test_paged_logits_topk_equals_the_two_steps():
    rng = np.random.default_rng(10)
    next_n, heads, dim, bs, lens = 2, 4, 32, 16, [20, 0, 33, 7]
    q = rng.uniform(-2, 2, (len(lens), next_n, heads, dim)).astype(ml_dtypes.float8_e4m3fn)
    w = rng.uniform(-1, 1, (len(lens) * next_n, heads)).astype(np.float32)
    blocks = 12
    pool = rng.integers(0, 256, (blocks, bs, 1, dim + 4), dtype=np.uint8)
    pool[:, :, :, :dim] = rng.uniform(-2, 2, (blocks, bs, 1, dim)).astype(
        ml_dtypes.float8_e4m3fn).view(np.uint8)
    flat = pool.reshape(blocks, bs * (dim + 4))
    flat[:, bs * dim:] = rng.uniform(0.5, 1.5, (blocks, bs)).astype(np.float32).view(np.uint8)
    table = rng.permutation(blocks)[:len(lens) * 3].reshape(len(lens), 3).astype(np.int32)
    seq = np.array(lens, np.int32)
    logits = msa.paged_mqa_logits(q, pool, w, table, seq, 40)
    row = (40 * 4 + 15) // 16 * 16
    for topk in (1, 9, 50):
        want = msa.token_topk(logits, topk)
        for batches in (None, 1, 3):
            ws = None if batches is None else np.zeros(batches * next_n * row, np.uint8)
            got = msa.paged_mqa_logits_topk(q, pool, w, table, seq, 40, topk, workspace=ws)
            assert np.array_equal(got, want), (topk, batches)
    with pytest.raises(msa.MsaError, match="workspace: paged_mqa_logits_topk needs at least"):
        msa.paged_mqa_logits_topk(q, pool, w, table, seq, 40, 4, workspace=np.zeros(row, np.uint8))
    with pytest.raises(msa.MsaError, match="max_seq_len"):
        msa.paged_mqa_logits_topk(q, pool, w, table, seq, 32, 4)
