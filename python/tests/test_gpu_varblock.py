# GPU tests of msa.VariableBlockSparseAttention (msa/varblock.py): columns aligned to 128 or 64
# keys (block ids of 128 or 64) on CUDA against the same plan on the CPU, plan() from device inputs with
# topk / qo_len / kv_len making no host sync (torch's sync debug mode set to error around plan
# and run), CUDA-graph capture of run() (replay equals eager), a column size that breaks the
# 128 rule reported by msa's q2k checks with check=True, and the CUDA refusals.
import numpy as np
import pytest

import msa
from gpu_env import gpu_op, require_gpu, runs_without_sync_and_captures
from np_reference import random_sizes

torch = require_gpu()
DEV = "cuda"
HQ, HKV, D = 8, 2, 128


def _case(seed, qo_len, kv_len, mb, blk=128):
    """Per-head random rows; columns of blk keys (the last short) or of 2 blk with a zero-size
    one; a random mask; HND bf16 q, k, v."""
    rng = np.random.default_rng(seed)
    rows = np.stack([random_sizes(rng, qo_len, mb) for _ in range(HKV)])
    nb = -(-kv_len // blk)
    c1 = np.array([blk] * (nb - 1) + [kv_len - blk * (nb - 1)], np.int32)
    cols = np.stack([c1, c1])
    if seed % 2 and kv_len % (2 * blk) == 0:
        c2 = np.array([2 * blk] * (kv_len // (2 * blk)) + [0] * (nb - kv_len // (2 * blk)),
                      np.int32)
        cols = np.stack([c1, c2])
    mask = rng.random((HKV, mb, nb)) < 0.5
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(h, n, D, generator=gen).to(torch.bfloat16)
               for h, n in ((HQ, qo_len), (HKV, kv_len), (HKV, kv_len)))
    return mask, rows, cols, q, k, v


def _plan(mask, rows, cols, **kw):
    return msa.VariableBlockSparseAttention().plan(mask, rows, cols, HQ, HKV, D, **kw)


def _dev(*xs):
    return tuple(torch.as_tensor(x).to(DEV) for x in xs)


@pytest.mark.parametrize("qo_len, kv_len, mb, causal, blk", [(300, 700, 5, False, 128),
                                                             (512, 512, 4, True, 128),
                                                             (77, 1024, 3, True, 128),
                                                             (200, 1000, 1, False, 128),
                                                             (300, 700, 5, True, 64),
                                                             (257, 512, 4, False, 64),
                                                             (65, 1024, 2, True, 64)])
def test_cuda_matches_cpu(qo_len, kv_len, mb, causal, blk):
    mask, rows, cols, q, k, v = _case(qo_len + kv_len, qo_len, kv_len, mb, blk)
    cpu = _plan(mask, rows, cols, causal=causal, kv_block_size=blk)
    want, want_lse = cpu.run(q, k, v, return_lse=True)
    topk = -(-kv_len // blk)
    with gpu_op():
        gpu = _plan(*_dev(mask, rows, cols), topk=topk, qo_len=qo_len, kv_len=kv_len,
                    causal=causal, kv_block_size=blk)
        got, lse = gpu.run(*_dev(q, k, v), return_lse=True, check=True)
    assert gpu.kv_block_size == blk
    host, _, _, _ = msa.varblock.varblock_to_q2k(mask, rows, cols, num_kv_heads=HKV,
                                                 kv_block_size=blk, topk=topk)
    assert np.array_equal(gpu.q2k.cpu().numpy(), host)
    assert got.shape == q.shape and got.is_contiguous()
    torch.testing.assert_close(got.cpu().float(), want.float(), atol=2e-2, rtol=2e-2)
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse.cpu()), finite)
    torch.testing.assert_close(lse.cpu()[finite], want_lse[finite], atol=1e-3, rtol=1e-3)


def test_key_id_columns_on_cuda_match_cpu():
    """Columns off the 64-key grid (host arrays) run as key ids on CUDA (the token-sparse
    kernel), against the same plan on the CPU."""
    rng = np.random.default_rng(3)
    rows = np.stack([random_sizes(rng, 200, 4) for _ in range(HKV)])
    cols = np.array([[96, 32, 200, 172], [50, 150, 100, 200]], np.int32)
    mask = rng.random((HKV, 4, 4)) < 0.6
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(h, n, D, generator=gen).to(torch.bfloat16)
               for h, n in ((HQ, 200), (HKV, 500), (HKV, 500)))
    cpu = _plan(mask, rows, cols, causal=True)
    want, want_lse = cpu.run(q, k, v, return_lse=True)
    with gpu_op():
        gpu = _plan(mask, rows, cols, causal=True, device=DEV)
        got, lse = gpu.run(*_dev(q, k, v), return_lse=True, check=True)
    assert gpu.kv_block_size == 1
    torch.testing.assert_close(got.cpu().float(), want.float(), atol=2e-2, rtol=2e-2)
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse.cpu()), finite)
    torch.testing.assert_close(lse.cpu()[finite], want_lse[finite], atol=1e-3, rtol=1e-3)


def test_host_arrays_plan_for_cuda():
    mask, rows, cols, q, k, v = _case(5, 300, 700, 4)
    cpu = _plan(mask, rows, cols)
    with gpu_op():
        gpu = _plan(mask, rows, cols, device=DEV)
        got = gpu.run(*_dev(q, k, v), check=True)
    assert gpu.q2k.is_cuda and torch.equal(gpu.q2k.cpu(), torch.from_numpy(cpu.q2k))
    torch.testing.assert_close(got.cpu().float(), cpu.run(q, k, v).float(), atol=2e-2,
                               rtol=2e-2)


def test_plan_and_run_do_not_sync_and_run_captures():
    qo_len, kv_len = 384, 1024
    mask, rows, cols, q, k, v = _case(7, qo_len, kv_len, 6)
    m, r, c = _dev(mask, rows, cols)
    q, k, v = _dev(q, k, v)
    kw = dict(topk=8, qo_len=qo_len, kv_len=kv_len)
    with gpu_op():
        _plan(m, r, c, **kw).run(q, k, v)          # warm-up: status buffer, kernels
    torch.cuda.synchronize()
    runs_without_sync_and_captures(lambda: _plan(m, r, c, causal=True, **kw), q, k, v)


@pytest.mark.parametrize("cols", [[[100, 156]], [[128, 64]], [[128, -128, 256]]])
def test_bad_column_sizes_are_reported_by_the_q2k_checks(cols):
    qo_len, kv_len = 128, 256
    cols = torch.tensor(cols, dtype=torch.int32, device=DEV)
    mask = torch.ones(1, 1, cols.shape[1], dtype=torch.bool, device=DEV)
    rows = torch.tensor([[qo_len]], dtype=torch.int32, device=DEV)
    q = torch.randn(HQ, qo_len, D, dtype=torch.bfloat16, device=DEV)
    k = torch.randn(HKV, kv_len, D, dtype=torch.bfloat16, device=DEV)
    with gpu_op():
        vsa = _plan(mask, rows, cols, topk=2, qo_len=qo_len, kv_len=kv_len)
        with pytest.raises(msa.MsaError, match="q2k"):
            vsa.run(q, k, k, check=True)
    msa.check_status()


def test_cuda_refusals():
    m = torch.ones(1, 1, 1, dtype=torch.bool, device=DEV)
    r = torch.tensor([[64]], dtype=torch.int32, device=DEV)
    c = torch.tensor([[128]], dtype=torch.int32, device=DEV)
    for name, kw in (("topk", dict(qo_len=64, kv_len=128)), ("qo_len", dict(topk=1, kv_len=128)),
                     ("kv_len", dict(topk=1, qo_len=64))):
        with pytest.raises(msa.MsaError, match=f"{name}: required with CUDA block_mask_map"):
            _plan(m, r, c, **kw)
    with pytest.raises(msa.MsaError, match="kv_block_size: CUDA block_mask_map takes 64 or 128"):
        _plan(m, r, c, topk=1, qo_len=64, kv_len=128, kv_block_size=1)
    vsa = _plan(m, r, c, topk=1, qo_len=64, kv_len=128)
    q = torch.randn(HQ, 64, D, dtype=torch.bfloat16)
    k = torch.randn(HKV, 128, D, dtype=torch.bfloat16)
    with pytest.raises(msa.MsaError, match="q: on cpu, but the plan is for cuda"):
        vsa.run(q, k, k)
