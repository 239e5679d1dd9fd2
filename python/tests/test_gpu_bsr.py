# GPU tests of msa.BlockSparseAttention (msa/bsr.py): C = 128 and 256 on CUDA against the same
# plan on the CPU, plan() from device indptr / indices with topk making no host sync (torch's
# sync debug mode set to error around plan and run), CUDA-graph capture of run() (replay equals
# eager), element masks (mask / packed_mask from host or device arrays) against the CPU plan,
# invalid device matrices reported by msa's q2k checks, and the CUDA refusals.
import numpy as np
import pytest

import msa
from gpu_env import gpu_op, require_gpu, runs_without_sync_and_captures
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


@pytest.mark.parametrize("R, C, M, N, causal, where, lens", [
    (16, 96, 200, 700, True, "device", False), (1, 16, 77, 450, False, "device", False),
    (64, 32, 300, 700, False, "host", False), (32, 48, 130, 500, True, "host", True)])
def test_key_ids_on_cuda_match_cpu(R, C, M, N, causal, where, lens):
    """Column blocks that are not multiples of 64 keys (or shortened by kv_block_lens) run as key
    ids (kv_block_size 1) on CUDA, the token-sparse kernel, against the CPU plan."""
    indptr, indices, q, k, v, topk = _case(R + C + M, R, C, M, N)
    kw = dict(causal=causal)
    if lens:
        kw["kv_block_lens"] = np.random.default_rng(1).integers(1, C + 1, cdiv(N, C)).astype(np.int32)
    cpu = _plan(indptr, indices, M, N, R, C, **kw)
    want, want_lse = cpu.run(q, k, v, return_lse=True)
    with gpu_op():
        if where == "device":
            gpu = _plan(torch.from_numpy(indptr).to(DEV), torch.from_numpy(indices).to(DEV), M, N,
                        R, C, topk=topk, **kw)
        else:
            gpu = _plan(indptr, indices, M, N, R, C, device=DEV, **kw)
        got, lse = gpu.run(q.to(DEV), k.to(DEV), v.to(DEV), return_lse=True, check=True)
    assert gpu.kv_block_size == 1
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
    runs_without_sync_and_captures(lambda: _plan(ip, ix, M, N, R, C, topk=topk, causal=True),
                                   q, k, v)


def _element_mask(seed, indptr, indices, R, C, M):
    """A random element mask bool [nnz, R, C] (density 0.6) over the listed blocks, with one
    listed block masked whole and every key of one query masked; returns it and the queries
    left without a key (that one and those of block rows that list nothing)."""
    rng = np.random.default_rng(seed)
    emask = rng.random((len(indices), R, C)) < 0.6
    listed = np.flatnonzero(np.diff(indptr))
    if len(listed):
        emask[rng.integers(len(indices))] = False
        row = int(rng.choice(listed))
        t = row * R + int(rng.integers(min(R, M - row * R)))
        emask[indptr[row]:indptr[row + 1], t % R] = False
    keeps = np.zeros(M, bool)   # queries with a kept key (the last block row clipped to M)
    for row in range(len(indptr) - 1):
        r1 = min(M, row * R + R)
        if indptr[row + 1] > indptr[row]:
            keeps[row * R:r1] = emask[indptr[row]:indptr[row + 1], :r1 - row * R].any((0, 2))
    return emask, np.flatnonzero(~keeps)


def _mask_kw(emask, form, place):
    """The element mask as plan() keywords: "bool" ([nnz, R, C]), "u8" (uint8, flat) or
    "packed" (packed_mask, little-endian bits), each array passed through place."""
    if form == "packed":
        return dict(packed_mask=place(np.packbits(emask.reshape(-1), bitorder="little")))
    if form == "u8":
        return dict(mask=place(emask.astype(np.uint8).reshape(-1)))
    return dict(mask=place(emask))


def _on_gpu(x):
    return torch.from_numpy(np.ascontiguousarray(x)).to(DEV)


@pytest.mark.parametrize("R, C, M, N, form, where", [(64, 128, 300, 700, "bool", "host"),
                                                     (64, 128, 300, 700, "packed", "cuda"),
                                                     (16, 64, 200, 450, "u8", "cuda"),
                                                     (1, 192, 77, 900, "bool", "cuda"),
                                                     (128, 128, 512, 512, "packed", "host"),
                                                     (32, 256, 260, 1000, "u8", "mixed"),
                                                     (3, 64, 100, 333, "bool", "mixed"),
                                                     # key ids (the token kernel's key mask)
                                                     (16, 32, 200, 450, "bool", "host"),
                                                     (4, 48, 100, 333, "packed", "cuda")])
def test_element_masks_match_cpu(R, C, M, N, form, where):
    """mask / packed_mask planned for CUDA from host arrays ("host", device=), from CUDA
    indptr, indices and mask ("cuda", with topk) or CUDA indptr / indices and a host mask
    ("mixed") against the same mask planned on the CPU; queries left without a key get out 0
    and lse -inf on both."""
    indptr, indices, q, k, v, topk = _case(R + C + M + 1, R, C, M, N)
    emask, dead = _element_mask(R + C + M, indptr, indices, R, C, M)
    cpu = _plan(torch.from_numpy(indptr), torch.from_numpy(indices), M, N, R, C,
                **_mask_kw(emask, form, torch.from_numpy))
    want, want_lse = cpu.run(q, k, v, return_lse=True)
    if where == "host":
        ip, ix, top, place = indptr, indices, None, np.asarray
    else:
        ip, ix, top = _on_gpu(indptr), _on_gpu(indices), topk
        place = _on_gpu if where == "cuda" else np.asarray
    with gpu_op():
        gpu = _plan(ip, ix, M, N, R, C, topk=top, device=DEV, **_mask_kw(emask, form, place))
        got, lse = gpu.run(q.to(DEV), k.to(DEV), v.to(DEV), return_lse=True, check=True)
    assert gpu.q2k.is_cuda and torch.equal(gpu.q2k.cpu(), torch.as_tensor(cpu.q2k))
    torch.testing.assert_close(got.cpu().float(), want.float(), atol=2e-2, rtol=2e-2)
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse.cpu()), finite)
    torch.testing.assert_close(lse.cpu()[finite], want_lse[finite], atol=1e-3, rtol=1e-3)
    assert len(dead) and torch.isneginf(lse.cpu()[:, dead]).all()
    assert not got.cpu()[dead].any()


def test_element_mask_run_does_not_sync_and_captures():
    """plan() with a mask syncs (it reads the mask on the host); run() then neither syncs nor
    reads the host, and a CUDA graph of it replays the eager result."""
    R, C, M, N = 64, 128, 384, 1024
    indptr, indices, q, k, v, topk = _case(9, R, C, M, N)
    emask, _ = _element_mask(9, indptr, indices, R, C, M)
    q, k, v = q.to(DEV), k.to(DEV), v.to(DEV)
    with gpu_op():
        bsa = _plan(_on_gpu(indptr), _on_gpu(indices), M, N, R, C, topk=topk,
                    mask=_on_gpu(emask))
        bsa.run(q, k, v)   # warm-up: status buffer, kernels, the workspace (with the mask bits)
    torch.cuda.synchronize()
    runs_without_sync_and_captures(lambda: bsa, q, k, v)


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
        _plan(ip, ix, 64, 96, 64, 96, topk=1, kv_block_size=64)
    bsa = _plan(ip, ix, 64, 128, 64, 128, topk=1)
    q = torch.randn(64, 8, 128, dtype=torch.bfloat16)
    k = torch.randn(128, 2, 128, dtype=torch.bfloat16)
    with pytest.raises(msa.MsaError, match="q: on cpu, but the plan is for cuda"):
        bsa.run(q, k, k)
