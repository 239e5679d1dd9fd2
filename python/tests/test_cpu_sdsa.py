# CPU tests of the SDSA indexer (msa.indexer_scores, indexer_threshold_select,
# top_k_from_candidates, gather_key_sample, thresholds_from_sample,
# quantize_write_index_qk_nvfp4) with numpy and torch arrays: scores against numpy, the sampled
# pipeline against a numpy full sort, NVFP4 writes against msa.quantize, the exact error texts.
import re

import numpy as np
import pytest

import msa

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = ml_dtypes.bfloat16


def _cache(rng, seq_lens, page_size=16, dim=64, coarse=False):
    """A bf16 page pool with shuffled pages, NaN in every slot no length covers, its block table
    and the keys of each request in position order (f32)."""
    pages = [(n + page_size - 1) // page_size for n in seq_lens]
    num_pages = sum(pages) + 2
    order = rng.permutation(num_pages).astype(np.int32)
    width = max(pages + [0]) + 1
    table = np.full((len(seq_lens), width), num_pages + 7, np.int32)
    pool = np.full((num_pages, page_size, dim), np.nan, np.float32)
    keys, used = [], 0
    for b, n in enumerate(seq_lens):
        table[b, :pages[b]] = order[used:used + pages[b]]
        used += pages[b]
        k = (rng.integers(-2, 3, (n, dim)) if coarse else rng.standard_normal((n, dim)))
        k = k.astype(BF16).astype(np.float32)
        for j in range(n):
            pool[table[b, j // page_size], j % page_size] = k[j]
        keys.append(k)
    return pool.astype(BF16), table, np.array(seq_lens, np.int32), keys


def _full_sort(row, length, topk):
    """Top-K positions of one score row by the definition: higher first (NaN below every other
    value, -inf never), ties toward the lower position; ascending, -1 padded."""
    pos = [j for j in range(length) if row[j] != -np.inf]
    pos.sort(key=lambda j: (np.isnan(row[j]), 0.0 if np.isnan(row[j]) else -row[j], j))
    best = sorted(pos[:topk])
    return best + [-1] * (topk - len(best))


def test_scores_match_numpy_with_row_lens():
    rng = np.random.default_rng(1)
    pool, table, lens, keys = _cache(rng, [40, 0, 17])
    query = rng.standard_normal((4, 64)).astype(BF16)
    requests = np.array([0, 2, 1, 0], np.int32)
    row_lens = np.array([40, 9, 0, 3], np.int32)
    got = msa.indexer_scores(query, pool, table, lens, requests, row_lens=row_lens, max_len=41)
    assert got.dtype == np.float32 and got.shape == (4, 41)
    for t in range(4):
        n = row_lens[t]
        want = keys[requests[t]][:n].astype(np.float64) @ query[t].astype(np.float64)
        np.testing.assert_allclose(got[t, :n], want.astype(np.float32), rtol=1e-6, atol=1e-6)
        assert (got[t, n:] == -np.inf).all()


def test_quantize_write_equals_quantize_at_the_slots():
    rng = np.random.default_rng(2)
    key = rng.standard_normal((3, 32)).astype(np.float32)
    query = rng.standard_normal((2, 32)).astype(np.float32)
    cache = np.full((2, 4, 16), 0xAB, np.uint8)
    scale = np.full((2, 4, 2), 0xAB, np.uint8)
    q = msa.quantize_write_index_qk_nvfp4(key, np.array([6, -1, 1], np.int32), cache, query,
                                          key_scale=scale, key_global_scale=0.5,
                                          query_global_scale=2.0)
    for row, slot in ((0, 6), (2, 1)):
        want = msa.quantize(key[row][None, None], "nvfp4", global_scale=0.5)
        np.testing.assert_array_equal(cache.reshape(8, 16)[slot], want.values.reshape(16))
        np.testing.assert_array_equal(scale.reshape(8, 2)[slot],
                                      want.scale.view(np.uint8).reshape(2))
    assert (cache.reshape(8, 16)[[0, 2, 3, 4, 5, 7]] == 0xAB).all()
    want = msa.quantize(query[:, None], "nvfp4", global_scale=2.0)
    assert q.format == "nvfp4" and q.global_scale == 2.0
    np.testing.assert_array_equal(q.values, want.values.reshape(2, 16))
    np.testing.assert_array_equal(q.scale.view(np.uint8), want.scale.view(np.uint8).reshape(2, 2))


@pytest.mark.parametrize("nvfp4", [False, True])
@pytest.mark.parametrize("coarse", [False, True])
def test_sampled_pipeline_equals_full_sort(nvfp4, coarse):
    rng = np.random.default_rng(3 + 2 * nvfp4 + coarse)
    seq_lens = [300, 0, 57, 1000]
    pool, table, lens, _ = _cache(rng, seq_lens, coarse=coarse)
    requests = np.array([0, 3, 2, 1, 3, 0], np.int32)
    query = rng.integers(-2, 3, (6, 64)).astype(BF16) if coarse else \
        rng.standard_normal((6, 64)).astype(BF16)
    key_cache = pool
    if nvfp4:
        # Requantize the covered slots into an NVFP4 pool.
        slots = np.concatenate([table[b, j // 16] * 16 + j % 16 for b, n in enumerate(seq_lens)
                                for j in [np.arange(n)]]).astype(np.int32)
        src = pool.reshape(-1, 64)[slots].astype(np.float32)
        values = np.zeros((pool.shape[0], 16, 32), np.uint8)
        scale = np.zeros((pool.shape[0], 16, 4), np.uint8)
        key_cache = msa.QTensor(values, scale, 0.25, "nvfp4")
        msa.quantize_write_index_qk_nvfp4(src, slots, key_cache)
    topk, stride = 24, 4
    scores = msa.indexer_scores(query, key_cache, table, lens, requests, max_len=1000)
    offsets = rng.integers(0, stride, len(seq_lens)).astype(np.int32)
    sample, sample_lens = msa.gather_key_sample(key_cache, table, lens, stride, offsets=offsets,
                                                max_samples=250)
    assert list(sample_lens) == [(n - o + stride - 1) // stride if n > o else 0
                                 for n, o in zip(seq_lens, offsets)]
    sample_table = np.arange(len(seq_lens), dtype=np.int32)[:, None]
    sample_scores = msa.indexer_scores(query, sample, sample_table, sample_lens, requests,
                                       max_len=250)
    thresholds, counts = msa.thresholds_from_sample(sample_scores, topk, stride, oversample=2.0)
    assert (counts == 0).all()
    candidates, ties, counts = msa.indexer_threshold_select(
        query, key_cache, table, lens, requests, thresholds, counts, capacity=6 * topk,
        tie_capacity=2 * topk)
    ids, status = msa.top_k_from_candidates(candidates, ties, counts, topk)
    assert ids.shape == (6, topk) and status.shape == (6,)
    for t in range(6):
        n = seq_lens[requests[t]]
        want = _full_sort(scores[t], n, topk)
        if status[t] == 0:
            assert list(ids[t]) == want, t
        else:  # reported, never silently wrong
            assert status[t] in (1, 2, 3)
    assert (status == 0).sum() >= 4


def test_overflow_is_reported():
    rng = np.random.default_rng(4)
    pool, table, lens, _ = _cache(rng, [64])
    query = rng.standard_normal((1, 64)).astype(BF16)
    req = np.zeros(1, np.int32)
    counts = np.zeros((1, 3), np.int32)
    thresholds = np.array([-np.inf], np.float32)
    cand, ties, counts = msa.indexer_threshold_select(query, pool, table, lens, req, thresholds,
                                                      counts, capacity=8, tie_capacity=0)
    assert list(counts[0]) == [64, 0, 0]
    ids, status = msa.top_k_from_candidates(cand, ties, counts, 4)
    assert status[0] == 1 and (ids == -1).all()


def test_errors_name_the_argument():
    rng = np.random.default_rng(5)
    pool, table, lens, _ = _cache(rng, [20, 5])
    query = rng.standard_normal((2, 64)).astype(BF16)
    req = np.array([1, 0], np.int32)
    with pytest.raises(msa.MsaError, match=re.escape("max_len: required without out=")):
        msa.indexer_scores(query, pool, table, lens, req)
    with pytest.raises(msa.MsaError, match=re.escape(
            "row_requests: row 1 names request 2, outside [0, B = 2)")):
        msa.indexer_scores(query, pool, table, lens, np.array([1, 2], np.int32), max_len=20)
    with pytest.raises(msa.MsaError, match=re.escape(
            "scores: 19 columns cannot hold a row of 20 keys")):
        msa.indexer_scores(query, pool, table, lens, req, max_len=19)
    with pytest.raises(msa.MsaError, match=re.escape("query: head dim 32 must equal key_cache's 64")):
        msa.indexer_scores(query[:, :32], pool, table, lens, req, max_len=20)
    counts = np.ones((2, 3), np.int32)
    th = np.zeros(2, np.float32)
    with pytest.raises(msa.MsaError, match=re.escape("capacity: required without candidates=")):
        msa.indexer_threshold_select(query, pool, table, lens, req, th, counts, tie_capacity=1)
    with pytest.raises(msa.MsaError, match=re.escape(
            "counts: must be zero on entry (thresholds_from_sample zeroes them), got (1, 1, 1) "
            "for row 0")):
        msa.indexer_threshold_select(query, pool, table, lens, req, th, counts, capacity=4,
                                     tie_capacity=1)
    with pytest.raises(msa.MsaError, match=re.escape("oversample: must be in [1, 2^20], got 0.5")):
        msa.thresholds_from_sample(np.zeros((2, 4), np.float32), 4, 2, oversample=0.5)
    with pytest.raises(msa.MsaError, match=re.escape(
            "sample: S = 3 cannot hold request 0's 4 samples (20 keys, stride 5)")):
        msa.gather_key_sample(pool, table, lens, 5, max_samples=3)
    with pytest.raises(msa.MsaError, match=re.escape("topk: must be >= 1, got 0")):
        msa.top_k_from_candidates(np.zeros((2, 1, 2), np.int32), np.zeros((2, 0), np.int32),
                                  np.zeros((2, 3), np.int32), 0)
    with pytest.raises(msa.MsaError, match=re.escape("slots: slot 1 given twice (entries 0 and 1)")):
        msa.quantize_write_index_qk_nvfp4(np.zeros((2, 16), np.float32),
                                          np.array([1, 1], np.int32),
                                          np.zeros((1, 2, 8), np.uint8),
                                          key_scale=np.zeros((1, 2, 1), np.uint8))


def test_torch_cpu_pipeline():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    pool, table, lens, _ = _cache(rng, [130, 33])
    query = rng.standard_normal((3, 64)).astype(np.float32)
    req = np.array([0, 1, 0], np.int32)
    tq = torch.from_numpy(query).to(torch.bfloat16)
    tpool = torch.from_numpy(pool.astype(np.float32)).to(torch.bfloat16)
    ttable, tlens, treq = (torch.from_numpy(x) for x in (table, lens, req))
    scores = msa.indexer_scores(tq, tpool, ttable, tlens, treq, max_len=130)
    assert isinstance(scores, torch.Tensor) and scores.dtype == torch.float32
    th, counts = msa.thresholds_from_sample(scores, 8, 1, oversample=1.0)
    cand, ties, counts = msa.indexer_threshold_select(tq, tpool, ttable, tlens, treq, th, counts,
                                                      capacity=32, tie_capacity=8)
    ids, status = msa.top_k_from_candidates(cand, ties, counts, 8)
    s = scores.numpy()
    for t in range(3):
        assert status[t].item() == 0
        assert ids[t].tolist() == _full_sort(s[t], int(lens[req[t]]), 8)
