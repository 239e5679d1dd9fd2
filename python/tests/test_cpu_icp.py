# CPU tests of the ICP indexer's Python API (msa.icp_shard, icp_rank_lists, icp_merge) with
# simulated ranks: a paged index key pool sharded over 2 or 4 ranks, each rank's lists, the
# all-to-all done by stacking, the merge; the same q2k as block_topk on the unsharded pool (numpy
# f16, FP8 with per-slot scales through ml_dtypes, torch), and MsaError for bad arguments.
import ml_dtypes
import numpy as np
import pytest

import msa


def _pool(rng, lk, page_rows, dtype=np.float16, hik=1, d=64):
    """An unsharded pool [pages, page_rows, hik, d] with pages handed out in a random order, its
    page table [B, max_pages] and seqused_k."""
    need = [(n + page_rows - 1) // page_rows for n in lk]
    pages = sum(need) + 2
    pool = rng.standard_normal((pages, page_rows, hik, d)).astype(dtype)
    order = rng.permutation(pages).astype(np.int32)
    table = np.full((len(lk), max(max(need), 1)), order[-1], np.int32)
    n = 0
    for b, m in enumerate(need):
        table[b, :m] = order[n:n + m]
        n += m
    return pool, table, np.asarray(lk, np.int32)


def _stack(xs):
    """The all-to-all of a simulated group: every rank's lists stacked, in their framework."""
    if hasattr(xs[0], "contiguous"):
        import torch
        return torch.stack(xs)
    return np.stack(xs)


def _sharded(q, pool, table, used, cu_q, *, layout, world, hsel, topk, sink, local, causal,
             q_scale=None, k_scale=None):
    lists = []
    for rank in range(world):
        shard, shard_scale = msa.icp_shard(pool, layout=layout, world=world, rank=rank,
                                           k_scale=k_scale)
        lists.append(msa.icp_rank_lists(q, shard, table, cu_q, layout=layout, world=world,
                                        rank=rank, seqused_k=used, topk=topk, sink_blocks=sink,
                                        local_blocks=local, causal=causal, num_kv_heads=hsel,
                                        index_q_scale=q_scale, shard_scale=shard_scale))
    ids, scores = _stack([x[0] for x in lists]), _stack([x[1] for x in lists])
    assert tuple(ids.shape) == tuple(scores.shape) == (world, hsel, int(cu_q[-1]), topk)
    return msa.icp_merge(ids, scores, table, cu_q, layout=layout, seqused_k=used,
                         sink_blocks=sink, local_blocks=local, causal=causal)


@pytest.mark.parametrize("layout", ["p128", "p256"])
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("hsel,topk,sink,local,causal",
                         [(4, 4, 1, 1, True), (2, 6, 0, 2, True), (1, 3, 1, 0, False),
                          (2, 5, 1, 0, True)])  # no local block: the partial last block competes
def test_sharded_equals_block_topk(layout, world, hsel, topk, sink, local, causal):
    rng = np.random.default_rng(7 * world + topk)
    lq, lk = [5, 0, 30, 1], [900, 40, 1300, 257]
    cu_q = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    q = rng.standard_normal((sum(lq), 4, 64)).astype(np.float16)
    pool, table, used = _pool(rng, lk, 128 if layout == "p128" else 256)
    got = _sharded(q, pool, table, used, cu_q, layout=layout, world=world, hsel=hsel, topk=topk,
                   sink=sink, local=local, causal=causal)
    want = msa.block_topk(q, pool, cu_q, page_table=table, seqused_k=used, topk=topk,
                          sink_blocks=sink, local_blocks=local, causal=causal,
                          num_kv_heads=hsel)
    assert got.dtype == np.int32 and got.shape == (hsel, sum(lq), topk)
    np.testing.assert_array_equal(got, want)


def test_fp8_per_slot_scales_and_torch():
    rng = np.random.default_rng(3)
    lq, lk = [12, 3], [1000, 600]
    cu_q = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    pool16, table, used = _pool(rng, lk, 256)
    pool = msa.typed(pool16.astype(ml_dtypes.float8_e4m3fn).view(np.uint8), "fp8_e4m3")
    k_scale = (0.5 + rng.integers(0, 4, pool16.shape[0] * 256) * 0.25).astype(np.float32)
    q = msa.typed(rng.standard_normal((15, 4, 64)).astype(ml_dtypes.float8_e4m3fn).view(np.uint8),
                  "fp8_e4m3")
    got = _sharded(q, pool, table, used, cu_q, layout="p256", world=4, hsel=4, topk=5, sink=1,
                   local=1, causal=True, k_scale=k_scale)
    want = msa.block_topk(q, pool, cu_q, page_table=table, seqused_k=used, topk=5,
                          num_kv_heads=4, k_scale=k_scale)
    np.testing.assert_array_equal(got, want)

    torch = pytest.importorskip("torch")
    q16 = torch.from_numpy(rng.standard_normal((15, 4, 64)).astype(np.float32)).to(torch.bfloat16)
    p16 = torch.from_numpy(pool16.astype(np.float32)).to(torch.bfloat16)
    t_table, t_used, t_cu = (torch.from_numpy(x) for x in (table, used, cu_q))
    got = _sharded(q16, p16, t_table, t_used, t_cu, layout="p256", world=2,
                   hsel=2, topk=4, sink=1, local=1, causal=True)
    assert isinstance(got, torch.Tensor)
    want = msa.block_topk(q16, p16, t_cu, page_table=t_table, seqused_k=t_used, topk=4,
                          num_kv_heads=2)
    assert torch.equal(got, want)


def test_errors():
    rng = np.random.default_rng(5)
    cu_q = np.array([0, 4], np.int32)
    q = rng.standard_normal((4, 4, 64)).astype(np.float16)
    pool, table, used = _pool(rng, [500], 128)
    with pytest.raises(msa.MsaError, match="world: must be 2 or 4"):
        msa.icp_shard(pool, world=3)
    with pytest.raises(msa.MsaError, match='layout: must be "p128" or "p256"'):
        msa.icp_shard(pool, layout="p64")
    with pytest.raises(msa.MsaError, match="page rows"):
        msa.icp_shard(pool, layout="p256")
    with pytest.raises(msa.MsaError, match=r"rank: must be in \[0, world = 2\)"):
        msa.icp_shard(pool, rank=2)
    shard, _ = msa.icp_shard(pool, rank=1)
    assert shard.shape == (pool.shape[0], 64, 1, 64) and shard.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(shard, pool[:, 1::2])
    with pytest.raises(msa.MsaError, match="rows_per_rank = 32"):
        msa.icp_rank_lists(q, shard, table, cu_q, world=4, rank=1, seqused_k=used)
    with pytest.raises(msa.MsaError, match='layout: must be "p128" or "p256"'):
        msa.icp_rank_lists(q, shard, table, cu_q, layout="x", rank=1, seqused_k=used)
    nan_q = q.copy()
    nan_q[2, 1, 7] = np.nan
    with pytest.raises(msa.MsaError, match="group score is NaN on rank 1"):
        msa.icp_rank_lists(nan_q, shard, table, cu_q, rank=1, seqused_k=used, topk=4)
    ids, scores = msa.icp_rank_lists(q, shard, table, cu_q, rank=1, seqused_k=used, topk=4)
    both = np.stack([ids, ids]), np.stack([scores, scores])
    q2k = msa.icp_merge(*both, table, cu_q, seqused_k=used)
    assert q2k.shape == (1, 4, 4)
    bad = both[0].copy()
    bad[0, 0, 3, 0] = 0  # the sink block
    with pytest.raises(msa.MsaError, match="is not a list entry"):
        msa.icp_merge(bad, both[1], table, cu_q, seqused_k=used)
