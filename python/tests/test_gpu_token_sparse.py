# GPU tests of msa.token_sparse_kv_indices and msa.group_union_masks with torch tensors: int32
# tensors on the device run the CUDA op (no host copy) and equal the numpy version on the same
# inputs (the union and groups padded to the capacities the CUDA path takes); offences raise
# MsaError through check=True; max_union is required on the device; other dtypes keep the host
# path; both calls captured in a CUDA graph replay over new inputs.
import numpy as np
import pytest

import msa
from gpu_env import require_gpu
from test_cpu_token_sparse import random_case, random_positions

torch = require_gpu()


@pytest.mark.parametrize("seed", range(8))
def test_kv_indices_match_host(seed):
    rng, lens, ps, table, cu, rows_of = random_case(seed)
    pos = random_positions(rng, lens, rows_of, int(rng.choice([1, 7, 64])), None if seed % 2 else 2)
    want = msa.token_sparse_kv_indices(pos, rows_of, table, ps, seq_lens=lens.astype(np.int32))
    dev = [torch.from_numpy(x).cuda() for x in (pos, rows_of, table, lens.astype(np.int32))]
    got = msa.token_sparse_kv_indices(*dev[:3], ps, seq_lens=dev[3], check=True)
    assert got.is_cuda and got.dtype == torch.int32
    assert np.array_equal(got.cpu().numpy(), want)


@pytest.mark.parametrize("seed", range(8))
def test_group_unions_match_host(seed):
    rng, lens, ps, table, cu, rows_of = random_case(seed)
    k = int(rng.choice([1, 5, 64]))
    pos = random_positions(rng, lens, rows_of, k, None if seed % 2 else 3)
    g, packed = int(rng.choice([1, 2, 3])), seed % 3 == 0
    want = msa.group_union_masks(pos, cu, g, packed=packed)
    cap = min(g * k, want.union.shape[-1] + 3)
    got = msa.group_union_masks(torch.from_numpy(pos).cuda(), torch.from_numpy(cu).cuda(), g,
                                max_union=cap, packed=packed, check=True)
    rows, batch = pos.shape[-2], len(cu) - 1
    groups = min(rows, (rows + batch * (g - 1)) // g)
    n, width = want.union.shape[-2], want.union.shape[-1]
    assert got.union.shape[-2:] == (groups, cap) and got.union.is_cuda
    union, lens_u = got.union.cpu().numpy(), got.union_lens.cpu().numpy()
    assert np.array_equal(union[..., :n, :width], want.union)
    assert (union[..., :n, width:] == -1).all() and (union[..., n:, :] == -1).all()
    assert np.array_equal(lens_u[..., :n], want.union_lens) and (lens_u[..., n:] == 0).all()
    assert got.group_rows.cpu().tolist() == want.group_rows.tolist() + [rows] * (groups - n)
    mask = got.mask.cpu().numpy()
    if packed:
        mask = np.unpackbits(mask, axis=-1, count=cap, bitorder="little").astype(bool)
        ref = np.unpackbits(want.mask, axis=-1, count=width, bitorder="little").astype(bool)
    else:
        ref = want.mask
    assert np.array_equal(mask[..., :width], ref) and not mask[..., width:].any()


def test_device_offences_raise():
    pos = torch.tensor([[1, -1], [2, -1]], dtype=torch.int32, device="cuda")
    req = torch.tensor([0, 1], dtype=torch.int32, device="cuda")
    table = torch.tensor([[3, 1], [0, -1]], dtype=torch.int32, device="cuda")
    assert msa.token_sparse_kv_indices(pos, req, table, 4, check=True).tolist() == [[13, -1], [2, -1]]
    cases = [(torch.tensor([[1, 1], [2, -1]]), "id 1 is repeated in row 0"),
             (torch.tensor([[8, -1], [2, -1]]), "id 8 at row 0 .* entry 0"),
             (torch.tensor([[1, -1], [5, -1]]), r"block_table\[1, 1\] = -1")]
    for p, message in cases:
        with pytest.raises(msa.MsaError, match=message):
            msa.token_sparse_kv_indices(p.to(torch.int32).cuda(), req, table, 4, check=True)
    with pytest.raises(msa.MsaError, match=r"requests\[1\] = 2"):
        msa.token_sparse_kv_indices(pos, req + 1, table, 4, check=True)
    cu = torch.tensor([0, 2], dtype=torch.int32, device="cuda")
    with pytest.raises(msa.MsaError, match="max_union: required"):
        msa.group_union_masks(pos, cu, 2)
    with pytest.raises(msa.MsaError, match="max_union = 2: the union of group 0"):
        msa.group_union_masks(torch.tensor([[0, 1], [2, -1]], dtype=torch.int32, device="cuda"),
                              cu, 2, max_union=2, check=True)
    with pytest.raises(msa.MsaError, match="cu_seqlens_q"):
        msa.group_union_masks(pos, cu + 1, 2, max_union=2, check=True)
    # int64 on the device: the host path, its sizes exact
    res = msa.group_union_masks(pos.long(), cu.long(), 2)
    assert res.union.is_cuda and res.union.tolist() == [[1, 2]]


def test_graph_capture_and_replay():
    rng, lens, ps, table, cu, rows_of = random_case(3)
    pos = random_positions(rng, lens, rows_of, 16)
    dpos, dreq, dtab, dcu = (torch.from_numpy(x).cuda() for x in (pos, rows_of, table, cu))
    msa.token_sparse_kv_indices(dpos, dreq, dtab, ps, check=True)  # warm-up: the status buffer
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        slots = msa.token_sparse_kv_indices(dpos, dreq, dtab, ps)
        res = msa.group_union_masks(dpos, dcu, 2, max_union=32)
    for seed in range(3):
        p = np.random.default_rng(seed).permuted(pos, axis=1)  # the same rows, shuffled
        dpos.copy_(torch.from_numpy(p))
        graph.replay()
        torch.cuda.synchronize()
        msa.check_status()
        assert np.array_equal(slots.cpu().numpy(), msa.token_sparse_kv_indices(p, rows_of, table, ps))
        want = msa.group_union_masks(p, cu, 2)
        n, width = want.union.shape[-2:]
        assert np.array_equal(res.union.cpu().numpy()[:n, :width], want.union)
        assert np.array_equal(res.mask.cpu().numpy()[:, :width], want.mask)


def test_torch_compile_and_opcheck():
    """Both builders under torch.compile(fullgraph=True) equal the eager calls (their custom ops'
    fakes give the shapes), and torch.library.opcheck passes on the ops."""
    rng, lens, ps, table, cu, rows_of = random_case(5)
    pos = random_positions(rng, lens, rows_of, 16)
    dpos, dreq, dtab, dcu = (torch.from_numpy(x).cuda() for x in (pos, rows_of, table, cu))

    def run(p, r, t, c):
        u = msa.group_union_masks(p, c, 2, max_union=32, packed=True)
        return (msa.token_sparse_kv_indices(p, r, t, ps),) + tuple(u)

    eager = run(dpos, dreq, dtab, dcu)
    got = torch.compile(run, fullgraph=True)(dpos, dreq, dtab, dcu)
    for a, b in zip(got, eager):
        assert torch.equal(a, b)
    msa.check_status()
    tests = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(torch.ops.msa.token_sparse_kv_indices.default,
                          (dpos, dreq, dtab, ps, None, True, None), test_utils=tests)
    torch.library.opcheck(torch.ops.msa.group_union_masks.default,
                          (dpos, dcu, 2, 32, False, True, None), test_utils=tests)
