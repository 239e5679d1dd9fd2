# The ICP indexer's collective step with real processes: one process per rank in a
# torch.distributed gloo group on the CPU, each holding only its shard, running msa.icp_select
# (its lists, the all-to-all or all-gather of icp_exchange, the merge); every rank's q2k equals
# its heads' rows of block_topk on the unsharded pool. The same code runs over NCCL on GPUs.
import os
import socket

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed without gloo", allow_module_level=True)


def _problem(seed, layout):
    """The unsharded problem every rank rebuilds from the seed (no rank sees another's shard)."""
    rng = np.random.default_rng(seed)
    lq, lk = [7, 1, 20], [1100, 300, 2000]
    page = 128 if layout == "p128" else 256
    need = [(n + page - 1) // page for n in lk]
    pool = rng.standard_normal((sum(need) + 1, page, 1, 64)).astype(np.float32)
    order = rng.permutation(pool.shape[0]).astype(np.int32)
    table = np.full((len(lk), max(need)), order[-1], np.int32)
    n = 0
    for b, m in enumerate(need):
        table[b, :m] = order[n:n + m]
        n += m
    q = rng.standard_normal((sum(lq), 4, 64)).astype(np.float32)
    cu = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    as_bf16 = lambda x: torch.from_numpy(x).to(torch.bfloat16)  # noqa: E731
    return (as_bf16(q), as_bf16(pool), torch.from_numpy(table),
            torch.from_numpy(np.asarray(lk, np.int32)), torch.from_numpy(cu))


def _rank(rank, world, port, layout, hsel, topk, local):
    import msa
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        q, pool, table, used, cu = _problem(11 * world + hsel, layout)
        shard, _ = msa.icp_shard(pool, layout=layout, world=world, rank=rank)
        del pool  # this rank holds its shard only
        q2k = msa.icp_select(q, shard, table, cu, layout=layout, seqused_k=used, topk=topk,
                             local_blocks=local, num_kv_heads=hsel)
        q, pool, table, used, cu = _problem(11 * world + hsel, layout)
        want = msa.block_topk(q, pool, cu, page_table=table, seqused_k=used, topk=topk,
                              local_blocks=local, num_kv_heads=hsel)
        owned = msa.icp_owned_heads(hsel, world, rank)
        assert q2k.shape == (len(owned), q.shape[0], topk)
        assert torch.equal(q2k, want[owned.start:owned.stop]), f"rank {rank}: q2k differs"
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("layout,world,hsel,topk,local",
                         [("p128", 2, 4, 5, 0), ("p128", 2, 1, 4, 1), ("p256", 4, 4, 6, 1)],
                         ids=["P128-TP2-alltoall", "P128-TP2-allgather", "P256-TP4-alltoall"])
def test_icp_select_over_gloo(layout, world, hsel, topk, local):
    import torch.multiprocessing as mp
    mp.spawn(_rank, args=(world, _free_port(), layout, hsel, topk, local), nprocs=world,
             join=True)


def test_owned_heads():
    import msa
    assert [msa.icp_owned_heads(4, 2, r) for r in range(2)] == [range(0, 2), range(2, 4)]
    assert msa.icp_owned_heads(4, 4, 3) == range(3, 4)
    assert msa.icp_owned_heads(1, 2, 1) == range(0, 1)  # fewer heads than ranks: all of them
    with pytest.raises(msa.MsaError, match=r"rank: must be in \[0, world = 2\)"):
        msa.icp_owned_heads(4, 2, 2)
