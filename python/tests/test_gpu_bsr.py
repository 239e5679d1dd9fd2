# GPU tests of msa.BlockSparseAttention (msa/bsr.py): C = 128 and 256 on CUDA against the same
# plan on the CPU, plan() from device indptr / indices with topk making no host sync (torch's
# sync debug mode set to error around plan and run), CUDA-graph capture of run() (replay equals
# eager), invalid device matrices reported by msa's q2k checks, and the CUDA refusals.
import numpy as np
import pytest

import msa
from gpu_env import gpu_op, require_gpu
from np_reference import random_blocks, to_bsr

torch = require_gpu()
DEV = "cuda"


def cdiv(a, b):
    return -(-a // b)


def _case(seed, R, C, M, N, hq=8, hkv=2):
    rng = np.random.default_rng(seed)
    blocks = random_blocks(rng, (cdiv(M, R), cdiv(N, C)), 0.5)
    indptr, indices = to_bsr(blocks, rng)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(n, h, 128, generator=gen).to(torch.bfloat16)
               for n, h in ((M, hq), (N, hkv), (N, hkv)))
    topk = max(1, int(np.diff(indptr).max()))
    return indptr, indices, q, k, v, topk


def _plan(indptr, indices, M, N, R, C, topk=None, **kw):
    return msa.BlockSparseAttention().plan(indptr, indices, M=M, N=N, R=R, C=C,
                                           num_qo_heads=8, num_kv_heads=2, head_dim=128,
                                           topk=topk, **kw)


@pytest.mark.parametrize("R, C, M, N, causal", [(64, 128, 300, 700, False),
                                                (128, 128, 512, 512, True),
                                                (1, 256, 77, 900, True),
                                                (16, 128, 200, 1000, False),
                                                (64, 64, 300, 700, True),
                                                (1, 64, 77, 450, False),
                                                (32, 192, 260, 1000, True)])
def test_cuda_matches_cpu(R, C, M, N, causal):
    indptr, indices, q, k, v, topk = _case(R + C + M, R, C, M, N)
    cpu = _plan(torch.from_numpy(indptr), torch.from_numpy(indices), M, N, R, C, causal=causal)
    want, want_lse = cpu.run(q, k, v, return_lse=True)
    with gpu_op():
        gpu = _plan(torch.from_numpy(indptr).to(DEV), torch.from_numpy(indices).to(DEV), M, N,
                    R, C, topk=topk, causal=causal)
        got, lse = gpu.run(q.to(DEV), k.to(DEV), v.to(DEV), return_lse=True, check=True)
    blk = 128 if C % 128 == 0 else 64  # 64-key blocks when C is an odd multiple of 64
    assert gpu.kv_block_size == blk
    sel = msa.bsr_to_q2k(indptr, indices, R=R, C=C, num_q=M, num_kv=N, num_kv_heads=2,
                         kv_block_size=blk, topk=topk * (C // blk))
    assert np.array_equal(gpu.q2k.cpu().numpy(), sel.q2k)
    torch.testing.assert_close(got.cpu().float(), want.float(), atol=2e-2, rtol=2e-2)
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse.cpu()), finite)
    torch.testing.assert_close(lse.cpu()[finite], want_lse[finite], atol=1e-3, rtol=1e-3)


def test_host_arrays_plan_for_cuda():
    R, C, M, N = 64, 128, 300, 700
    indptr, indices, q, k, v, _ = _case(5, R, C, M, N)
    cpu = _plan(indptr, indices, M, N, R, C)
    with gpu_op():
        gpu = _plan(indptr, indices, M, N, R, C, device=DEV)
        got = gpu.run(q.to(DEV), k.to(DEV), v.to(DEV), check=True)
    assert gpu.q2k.is_cuda and torch.equal(gpu.q2k.cpu(), torch.from_numpy(cpu.q2k))
    want = cpu.run(q, k, v)   # a numpy plan runs torch CPU tensors
    torch.testing.assert_close(got.cpu().float(), want.float(), atol=2e-2, rtol=2e-2)


def test_plan_and_run_do_not_sync_and_run_captures():
    R, C, M, N = 64, 128, 384, 1024
    indptr, indices, q, k, v, topk = _case(7, R, C, M, N)
    ip, ix = torch.from_numpy(indptr).to(DEV), torch.from_numpy(indices).to(DEV)
    q, k, v = q.to(DEV), k.to(DEV), v.to(DEV)
    with gpu_op():
        _plan(ip, ix, M, N, R, C, topk=topk).run(q, k, v)   # warm-up: status buffer, kernels
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        bsa = _plan(ip, ix, M, N, R, C, topk=topk, causal=True)
        eager = bsa.run(q, k, v)
        again = bsa.run(q, k, v)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert torch.equal(eager, again)
    out = torch.empty_like(q)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        bsa.run(q, k, v, out=out)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, bsa.run(q, k, v))
    msa.check_status()


def test_invalid_device_matrix_is_reported_by_the_q2k_checks():
    R, C, M, N = 64, 128, 128, 256
    ip = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEV)
    ix = torch.tensor([0, 5], dtype=torch.int32, device=DEV)   # column block 5 >= NB = 2
    q = torch.randn(M, 8, 128, dtype=torch.bfloat16, device=DEV)
    k = torch.randn(N, 2, 128, dtype=torch.bfloat16, device=DEV)
    with gpu_op():
        bsa = _plan(ip, ix, M, N, R, C, topk=1)
        with pytest.raises(msa.MsaError, match="q2k"):
            bsa.run(q, k, k, check=True)
    msa.check_status()


def test_cuda_refusals():
    ip = torch.tensor([0, 1], dtype=torch.int32, device=DEV)
    ix = torch.tensor([0], dtype=torch.int32, device=DEV)
    with pytest.raises(msa.MsaError, match="topk: required with CUDA indptr"):
        _plan(ip, ix, 64, 64, 64, 64)
    with pytest.raises(msa.MsaError, match="C: CUDA attends blocks of 64 or 128 keys, and C = 96"):
        _plan(ip, ix, 64, 96, 64, 96, topk=1)
    bsa = _plan(ip, ix, 64, 128, 64, 128, topk=1)
    q = torch.randn(64, 8, 128, dtype=torch.bfloat16)
    k = torch.randn(128, 2, 128, dtype=torch.bfloat16)
    with pytest.raises(msa.MsaError, match="q: on cpu, but the plan is for cuda"):
        bsa.run(q, k, k)
