# GPU tests of the FP4 indexer through the Python API on torch CUDA tensors: NVFP4 and MXFP4 q and
# K quantized on the GPU (msa.quantize), block scores against the CPU backend on the same bits, the
# fused top-K against select_topk on the GPU's own scores, and scales reordered on the GPU
# (msa.reorder_fp4_scales) giving the public layout's bits.
import pytest

import msa
from gpu_env import gpu_op, require_gpu

torch = require_gpu()
DEV = "cuda"


def _cpu(x):
    return msa.QTensor(x.values.cpu(), x.scale.cpu(), x.global_scale, x.format)


def _problem(fmt, seed):
    gen = torch.Generator().manual_seed(seed)
    lq, lk = [37, 0, 150], [300, 90, 700]
    hq, hkv = 16, 2
    q = torch.randn(sum(lq), hq, 128, generator=gen).to(DEV)
    k = torch.randn(sum(lk), hkv, 128, generator=gen).to(DEV)
    cum = lambda v: torch.tensor([0] + torch.tensor(v).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
    nv = fmt == "nvfp4"
    qq = msa.quantize(q, fmt, global_scale=0.5 if nv else 1.0)
    kq = msa.quantize(k, fmt, global_scale=0.75 if nv else 1.0)
    return qq, kq, cum(lq), cum(lk), hkv


@pytest.mark.parametrize("blk", [128, 64])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("causal", [True, False])
def test_fp4_scores_and_fused_topk(fmt, causal, blk):
    qq, kq, cu_q, cu_k, hkv = _problem(fmt, 3 if causal else 4)
    with gpu_op():
        got = msa.block_scores(qq, kq, cu_q, cu_seqlens_k=cu_k, causal=causal, kv_block_size=blk)
        ids = msa.block_topk(qq, kq, cu_q, cu_seqlens_k=cu_k, causal=causal, topk=4,
                             kv_block_size=blk)
    assert got.is_cuda and ids.is_cuda
    want = msa.block_scores(_cpu(qq), _cpu(kq), cu_q.cpu(), cu_seqlens_k=cu_k.cpu(), causal=causal,
                            kv_block_size=blk)
    got = got.cpu()
    assert torch.equal(torch.isneginf(got), torch.isneginf(want))
    assert not torch.isnan(got).any()
    finite = torch.isfinite(want)
    torch.testing.assert_close(got[finite], want[finite], rtol=1e-4, atol=1e-4)
    unfused = msa.select_topk(got.to(DEV), cu_q, num_kv_heads=hkv, topk=4, causal=causal,
                              cu_seqlens_k=cu_k, kv_block_size=blk)
    assert torch.equal(ids, unfused)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_fp4_preordered_scales_on_gpu(fmt):
    qq, kq, cu_q, cu_k, _ = _problem(fmt, 5)
    with gpu_op():
        want = msa.block_scores(qq, kq, cu_q, cu_seqlens_k=cu_k)
        q_pre, k_pre = msa.reorder_fp4_scales(qq), msa.reorder_fp4_scales(kq)
        assert q_pre.scale.is_cuda and q_pre.scale.dim() == 6
        # the GPU reorder writes the CPU's bytes
        cpu_pre = msa.reorder_fp4_scales(_cpu(qq))
        assert torch.equal(q_pre.scale.cpu().view(torch.uint8), cpu_pre.scale.view(torch.uint8))
        got = msa.block_scores(q_pre, k_pre, cu_q, cu_seqlens_k=cu_k)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
