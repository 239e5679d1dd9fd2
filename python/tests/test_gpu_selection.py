# GPU tests of the selection path and quantization with torch tensors: block_scores,
# select_topk, block_topk (fused), build_k2q_csr and dequantize/quantize against
# torch_reference.py, random shapes.
import pytest

import msa
import torch_reference as ref
from gpu_env import gpu_op, require_gpu

torch = require_gpu()
DEV = "cuda"


def _case(seed, dtype=None):
    gen = torch.Generator().manual_seed(seed)
    batch = int(torch.randint(1, 4, (1,), generator=gen))
    lk = torch.randint(0, 2000, (batch,), generator=gen).tolist()
    lq = [min(int(x), lk[b] + 3) for b, x in enumerate(torch.randint(0, 200, (batch,),
                                                                      generator=gen))]
    hkv = [1, 2][seed % 2]
    hq = hkv * [1, 4, 16][seed % 3]
    q, k, v, cu_q, cu_k = ref.random_problem(gen, lq, lk, hq, hkv, 128, dtype or torch.bfloat16,
                                             DEV)
    return gen, q, k, v, cu_q, cu_k, lk, hkv


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("causal", [True, False])
def test_block_scores(seed, causal):
    _, q, k, _, cu_q, cu_k, lk, _ = _case(seed)
    blk = [64, 128][seed % 2]
    with gpu_op():
        scores = msa.block_scores(q, k, cu_q, cu_seqlens_k=cu_k, kv_block_size=blk,
                                  causal=causal)
    want = ref.block_scores(q, k, cu_q, cu_k, blk=blk, causal=causal)
    assert scores.shape == want.shape and scores.dtype == torch.float32
    assert torch.equal(torch.isneginf(scores), torch.isneginf(want))
    finite = torch.isfinite(want)
    torch.testing.assert_close(scores[finite], want[finite], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("seed", range(4))
def test_select_topk(seed):
    _, q, k, _, cu_q, cu_k, lk, hkv = _case(10 + seed)
    scores = ref.block_scores(q, k, cu_q, cu_k)  # the reference's, so top-K is tested alone
    with gpu_op():
        q2k = msa.select_topk(scores, cu_q, num_kv_heads=hkv, topk=8, sink_blocks=1,
                              local_blocks=2, cu_seqlens_k=cu_k)
    want = ref.select_topk(scores, cu_q, lk, hkv=hkv, topk=8, sink=1, local=2, blk=128)
    assert torch.equal(q2k, want)


# (G, topk, sink_blocks, local_blocks): group sizes 1-16, topk from 1 to the CUDA limit of 64.
TOPK_CASES = [(1, 1, 0, 1), (2, 8, 1, 1), (4, 16, 1, 2), (8, 64, 2, 1), (16, 5, 0, 0)]


@pytest.mark.parametrize("blk", [128, 64])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("case", TOPK_CASES, ids=[f"G{c[0]}-top{c[1]}-s{c[2]}l{c[3]}"
                                                  for c in TOPK_CASES])
def test_block_topk_matches_reference(case, causal, dtype, blk):
    g, topk, sink, local = case
    gen = torch.Generator().manual_seed(30 + g + topk + (blk == 64))
    # Varlen: empty query and key batches, fewer keys than queries, and more visible blocks
    # (9000 / 128 = 71) than the largest topk, so every rank of the selection is exercised.
    lq, lk = [1, 150, 0, 40, 70, 9], [2000, 9000, 300, 0, 33, 500]
    hkv = 2 if g <= 4 else 1
    q, k, cu_q, cu_k = ref.integer_problem(
        gen, lq, lk, hkv * g, hkv, 128, torch.bfloat16 if dtype == "bf16" else torch.float16,
        DEV)
    with gpu_op():
        q2k = msa.block_topk(q, k, cu_q, cu_seqlens_k=cu_k, topk=topk, sink_blocks=sink,
                             local_blocks=local, causal=causal, kv_block_size=blk)
    scores = ref.block_scores(q, k, cu_q, cu_k, blk=blk, causal=causal)
    want = ref.select_topk(scores, cu_q, lk, hkv=hkv, topk=topk, sink=sink, local=local,
                           blk=blk, causal=causal)
    assert q2k.dtype == torch.int32 and q2k.shape == want.shape
    assert torch.equal(q2k, want)


# Head dims besides 128 on CUDA: bf16 / f16 at 64 (exact integer inputs: the reference's ids bit
# for bit), and the whole pipeline at 64 (its default index inputs are q and k themselves).
@pytest.mark.parametrize("blk", [128, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_block_topk_head_dim_64(dtype, blk):
    gen = torch.Generator().manual_seed(64 + blk)
    lq, lk = [1, 150, 0, 40], [2000, 900, 300, 33]
    q, k, cu_q, cu_k = ref.integer_problem(gen, lq, lk, 8, 2, 64, dtype, DEV)
    with gpu_op():
        q2k = msa.block_topk(q, k, cu_q, cu_seqlens_k=cu_k, topk=8, kv_block_size=blk)
    scores = ref.block_scores(q, k, cu_q, cu_k, blk=blk)
    want = ref.select_topk(scores, cu_q, lk, hkv=2, topk=8, blk=blk)
    assert torch.equal(q2k, want)


@pytest.mark.parametrize("blk", [128, 64])
def test_pipeline_head_dim_64(blk):
    gen = torch.Generator().manual_seed(640 + blk)
    lq, lk = [300, 0, 77], [1500, 40, 600]
    q, k, v, cu_q, cu_k = ref.random_problem(gen, lq, lk, 16, 2, 64, torch.bfloat16, DEV)
    with gpu_op():
        out, lse, q2k = msa.sparse_attention(q, k, v, cu_q, cu_seqlens_k=cu_k, topk=6,
                                             kv_block_size=blk, return_lse=True,
                                             return_selection=True)
    want, want_lse, _ = ref.attention(q, k, v, cu_q, cu_k, q2k=q2k.clone(), blk=blk)
    ref.check_close(out, lse, want, want_lse)


@pytest.mark.parametrize("blk", [128, 64])
@pytest.mark.parametrize("seed", range(3))
def test_block_topk_equals_unfused(seed, blk):
    _, q, k, _, cu_q, cu_k, lk, hkv = _case(40 + seed)
    with gpu_op():
        fused = msa.block_topk(q, k, cu_q, cu_seqlens_k=cu_k, topk=16, kv_block_size=blk)
        scores = msa.block_scores(q, k, cu_q, cu_seqlens_k=cu_k, kv_block_size=blk)
        unfused = msa.select_topk(scores, cu_q, num_kv_heads=hkv, topk=16, cu_seqlens_k=cu_k,
                                  kv_block_size=blk)
    assert torch.equal(fused, unfused)


# (index heads on one key head, selection heads, topk at the lists' size: 16 picks besides the
# sink and local blocks for 256 lists a CTA, 32 for 128): a list per head (MiniMax-M3's 4 on 1;
# 16 on 1), 16 heads in 8 lists of 2, 2 heads in 2 lists.
LIST_CASES = [(4, 4, 18), (16, 16, 18), (16, 8, 34), (2, 2, 34)]


@pytest.mark.parametrize("blk", [128, 64])
@pytest.mark.parametrize("case", LIST_CASES, ids=[f"H{c[0]}-rows{c[1]}-top{c[2]}"
                                                  for c in LIST_CASES])
def test_block_topk_lists_per_head_match_reference(case, blk):
    hq, rows, topk = case
    gen = torch.Generator().manual_seed(60 + hq + rows + (blk == 64))
    lq, lk = [1, 150, 0, 70], [2000, 9000, 300, 33]
    q, k, cu_q, cu_k = ref.integer_problem(gen, lq, lk, hq, 1, 128, torch.bfloat16, DEV)
    with gpu_op():
        q2k = msa.block_topk(q, k, cu_q, cu_seqlens_k=cu_k, topk=topk, kv_block_size=blk,
                             num_kv_heads=rows)
    scores = ref.block_scores(q, k, cu_q, cu_k, blk=blk)
    want = ref.select_topk(scores, cu_q, lk, hkv=rows, topk=topk, sink=1, local=1, blk=blk)
    assert q2k.shape == want.shape and torch.equal(q2k, want)
    # One pick past the lists' size: refused, naming the two-step form.
    with pytest.raises(msa.MsaError, match="picks a row besides the forced blocks"):
        msa.block_topk(q, k, cu_q, cu_seqlens_k=cu_k, topk=topk + 1, kv_block_size=blk,
                       num_kv_heads=rows)


def test_block_topk_out_stream_and_limits():
    gen = torch.Generator().manual_seed(50)
    q, k, cu_q, cu_k = ref.integer_problem(gen, [64, 200], [1000, 3000], 8, 2, 128,
                                           torch.bfloat16, DEV)
    with gpu_op():
        want = msa.block_topk(q, k, cu_q, cu_seqlens_k=cu_k, topk=8)
    out = torch.full_like(want, 7)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = msa.block_topk(q, k, cu_q, cu_seqlens_k=cu_k, topk=8, out=out)
    side.synchronize()
    assert got is out and torch.equal(out, want)
    with pytest.raises(msa.MsaError, match="topk"):
        msa.block_topk(q, k, cu_q, cu_seqlens_k=cu_k, topk=65)


@pytest.mark.parametrize("seed", range(4))
def test_build_k2q_csr(seed):
    gen, _, _, _, cu_q, cu_k, lk, hkv = _case(20 + seed)
    blk = [64, 128][seed % 2]
    q2k = ref.random_q2k(gen, cu_q, lk, hkv, topk=8, blk=blk)
    with gpu_op():
        k2q = msa.build_k2q_csr(q2k, cu_q, cu_seqlens_k=cu_k, kv_block_size=blk)
    row_ptr, q_idx = ref.k2q_csr(q2k, cu_q, lk, blk)
    assert torch.equal(k2q.row_ptr, row_ptr)
    for h in range(hkv):
        n = int(row_ptr[h, -1])
        assert torch.equal(k2q.q_idx[h, :n], q_idx[h])
    assert k2q.schedule is not None and k2q.schedule.dtype == torch.int32


@pytest.mark.parametrize("fmt", ["fp8_per_tensor", "fp8_per_token", "fp8_per_token_head"])
def test_fp8_quantize_dequantize(fmt):
    x = torch.randn(300, 4, 128, device=DEV) * 3
    with gpu_op():
        qt = msa.quantize(x, fmt)
    assert qt.values.dtype == torch.float8_e4m3fn
    amax = {"fp8_per_tensor": x.abs().amax().reshape(1),
            "fp8_per_token": x.abs().amax(dim=(1, 2)),
            "fp8_per_token_head": x.abs().amax(dim=2)}[fmt]
    torch.testing.assert_close(qt.scale, amax / 448, rtol=1e-6, atol=0)
    scale = qt.scale.reshape(*qt.scale.shape, *([1] * (3 - qt.scale.dim())))
    want_bits = (x / scale).to(torch.float8_e4m3fn)
    # Single rounding in msa vs torch's divide-then-convert: a rare one-step difference is fine.
    differ = qt.values.view(torch.uint8) != want_bits.view(torch.uint8)
    assert differ.float().mean() < 1e-3
    with gpu_op():
        y = msa.dequantize(qt)
    assert torch.equal(y, qt.values.float() * scale)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_fp4_dequantize(fmt):
    x = torch.randn(200, 2, 128, device=DEV)
    with gpu_op():
        qt = msa.quantize(x, fmt, global_scale=0.25 if fmt == "nvfp4" else 1.0)
        y = msa.dequantize(qt)
    want = ref.e2m1_dequant(qt.values, qt.scale, 16 if fmt == "nvfp4" else 32,
                            "e4m3" if fmt == "nvfp4" else "e8m0", qt.global_scale)
    assert torch.equal(y, want)
    assert (y - x).abs().max() <= 0.6 * x.abs().max()
