# GPU tests of the ICP indexer with torch tensors and simulated ranks (msa.icp_shard,
# icp_rank_lists, icp_merge): the merged q2k equal to the unsharded GPU selection
# (select_topk over block_scores with the same selection heads) and, on integer-valued inputs,
# to block_topk on the CPU; a NaN key raises with check=True.
import pytest

import msa
from gpu_env import require_gpu

torch = require_gpu()


def _problem(seed, layout, integer):
    gen = torch.Generator().manual_seed(seed)
    lq, lk = [30, 0, 7], [2500, 300, 129]
    page = 128 if layout == "p128" else 256
    need = [(n + page - 1) // page for n in lk]
    draw = ((lambda *s: torch.randint(-1, 2, s, generator=gen).float()) if integer
            else (lambda *s: torch.randn(*s, generator=gen)))
    pool = draw(sum(need) + 1, page, 1, 128).to(torch.bfloat16)
    order = torch.randperm(pool.shape[0], generator=gen).to(torch.int32)
    table = torch.full((len(lk), max(need)), int(order[-1]), dtype=torch.int32)
    n = 0
    for b, m in enumerate(need):
        table[b, :m] = order[n:n + m]
        n += m
    q = draw(sum(lq), 4, 128).to(torch.bfloat16)
    cu = torch.tensor([0] + list(torch.tensor(lq).cumsum(0)), dtype=torch.int32)
    return q, pool, table, torch.tensor(lk, dtype=torch.int32), cu


@pytest.mark.parametrize("layout,world", [("p128", 2), ("p256", 2), ("p256", 4)])
@pytest.mark.parametrize("hsel", [4, 1])
@pytest.mark.parametrize("integer", [True, False])
def test_sharded_equals_unsharded(layout, world, hsel, integer):
    q, pool, table, used, cu = _problem(world * 10 + hsel, layout, integer)
    opts = dict(layout=layout, seqused_k=used.cuda(), topk=8, sink_blocks=1, local_blocks=1)
    lists = []
    for rank in range(world):
        shard, _ = msa.icp_shard(pool.cuda(), layout=layout, world=world, rank=rank)
        lists.append(msa.icp_rank_lists(q.cuda(), shard, table.cuda(), cu.cuda(), world=world,
                                        rank=rank, num_kv_heads=hsel, check=True, **opts))
    ids, scores = torch.stack([x[0] for x in lists]), torch.stack([x[1] for x in lists])
    q2k = msa.icp_merge(ids, scores, table.cuda(), cu.cuda(), check=True, **opts)
    assert q2k.is_cuda and q2k.shape == (hsel, q.shape[0], 8)
    scores = msa.block_scores(q.cuda(), pool.cuda(), cu.cuda(), page_table=table.cuda(),
                              seqused_k=used.cuda(), check=True)
    want = msa.select_topk(scores, cu.cuda(), num_kv_heads=hsel, topk=8, k=pool.cuda(),
                           page_table=table.cuda(), seqused_k=used.cuda(), check=True)
    assert torch.equal(q2k, want)
    if integer:
        cpu = msa.block_topk(q, pool, cu, page_table=table, seqused_k=used, topk=8,
                             num_kv_heads=hsel)
        assert torch.equal(q2k.cpu(), cpu)


def test_nan_key_raises():
    q, pool, table, used, cu = _problem(3, "p128", False)
    # Key 300 of request 0 (block 2, not forced, visible to every query): rank 0 (row 44 % 2).
    pool[int(table[0, 2]), 44, 0, 5] = float("nan")
    shard, _ = msa.icp_shard(pool.cuda(), rank=0)
    with pytest.raises(msa.MsaError, match="is NaN"):
        msa.icp_rank_lists(q.cuda(), shard, table.cuda(), cu.cuda(), seqused_k=used.cuda(),
                           topk=8, num_kv_heads=4, check=True)
