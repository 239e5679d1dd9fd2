# GPU tests of msa.attention_forward with torch tensors over random shapes: dense and sparse,
# flat and paged, LSE and temperature LSE, preallocated outputs, non-default streams and invalid
# ids, each against the torch reference in torch_reference.py.
import pytest

import msa
import torch_reference as ref
from gpu_env import gpu_op, require_gpu

torch = require_gpu()
DEV = "cuda"


def _random_case(seed):
    """A random varlen shape: 1-3 batches, GQA group 1-16, head dim 128, kv block 64 or 128."""
    gen = torch.Generator().manual_seed(seed)

    def r(lo, hi):
        return int(torch.randint(lo, hi + 1, (1,), generator=gen))

    batch = r(1, 3)
    lk = [r(0, 1500) for _ in range(batch)]
    lq = [min(r(0, 300), lk[b] + r(0, 4)) for b in range(batch)]
    hkv = [1, 2, 4][r(0, 2)]
    group = [1, 2, 4, 8, 16][r(0, 4)]
    blk = [64, 128][r(0, 1)]
    causal = bool(r(0, 1))
    return gen, lq, lk, hkv * group, hkv, blk, causal


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_dense_flat(seed, dtype):
    gen, lq, lk, hq, hkv, _, causal = _random_case(seed)
    tdtype = torch.bfloat16 if dtype == "bf16" else torch.float16
    q, k, v, cu_q, cu_k = ref.random_problem(gen, lq, lk, hq, hkv, 128, tdtype, DEV)
    with gpu_op():
        out, lse = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, causal=causal,
                                         return_lse=True)
    assert out.dtype == tdtype and out.device.type == DEV
    want, want_lse, _ = ref.attention(q, k, v, cu_q, cu_k, causal=causal)
    ref.check_close(out, lse, want, want_lse)


# Dense attention takes any GQA group up to 128 on CUDA (groups that do not divide 16 too).
@pytest.mark.parametrize("hq, hkv", [(10, 2), (12, 1), (21, 3), (64, 1), (128, 1), (192, 2)])
def test_dense_any_group(hq, hkv):
    gen = torch.Generator().manual_seed(hq)
    q, k, v, cu_q, cu_k = ref.random_problem(gen, [37, 0, 150], [300, 9, 150], hq, hkv, 128,
                                             torch.bfloat16, DEV)
    with gpu_op():
        out, lse = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, return_lse=True)
    want, want_lse, _ = ref.attention(q, k, v, cu_q, cu_k, causal=True)
    ref.check_close(out, lse, want, want_lse)


# Head dims 32, 64 and 256 run dense attention on CUDA, flat and paged (bf16 / f16; pages of 128
# slots and more take 64-slot boxes at 256; D = 32 runs D = 64's tiles over zero-filled columns).
@pytest.mark.parametrize("dim, page_size", [(32, 64), (64, 16), (256, 16), (256, 128)])
@pytest.mark.parametrize("layout", ["flat", "paged_nhd", "paged_hnd"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dense_head_dims(dim, page_size, layout, dtype):
    if layout == "flat" and page_size != 16:
        pytest.skip("one flat case per head dim")
    gen = torch.Generator().manual_seed(dim)
    lq, lk = [37, 0, 150], [300, 9, 150]
    q, k, v, cu_q, cu_k = ref.random_problem(gen, lq, lk, 16, 2, dim, dtype, DEV)
    want, want_lse, _ = ref.attention(q, k, v, cu_q, cu_k, causal=True)
    with gpu_op():
        if layout == "flat":
            out, lse = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, return_lse=True)
        else:
            kp, vp, table, seqused = ref.to_pages(gen, k, v, cu_k, page_size, layout)
            out, lse = msa.attention_forward(q, kp, vp, cu_q, page_table=table,
                                             seqused_k=seqused, kv_layout=layout,
                                             return_lse=True)
    ref.check_close(out, lse, want, want_lse)


# Head dim 32 is dense attention over 16-bit inputs on CUDA: a q2k is refused by name.
def test_head_dim_32_is_dense_only():
    gen = torch.Generator().manual_seed(32)
    q, k, v, cu_q, cu_k = ref.random_problem(gen, [40], [300], 8, 2, 32, torch.bfloat16, DEV)
    q2k = ref.random_q2k(gen, cu_q, [300], 2, topk=2, blk=128)
    with pytest.raises(msa.MsaError, match="head dim 32 runs dense attention only"):
        msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=q2k)


# Sparse attention at head dims 64 and 256 (the KV-major and uniform kernels at that D): random
# shapes over 64- and 128-key blocks, flat and paged, with its k2q and without.
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("layout", ["flat", "paged_nhd", "paged_hnd"])
@pytest.mark.parametrize("dim", [64, 256])
def test_sparse_head_dims(dim, seed, layout):
    gen, lq, lk, hq, hkv, blk, causal = _random_case(300 + seed)
    dtype = torch.float16 if seed % 2 else torch.bfloat16
    q, k, v, cu_q, cu_k = ref.random_problem(gen, lq, lk, hq, hkv, dim, dtype, DEV)
    q2k = ref.random_q2k(gen, cu_q, lk, hkv, topk=8, blk=blk)
    with gpu_op():
        if layout == "flat":
            k2q = msa.build_k2q_csr(q2k, cu_q, cu_seqlens_k=cu_k, kv_block_size=blk)
            out, lse = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=q2k, k2q=k2q,
                                             kv_block_size=blk, causal=causal, return_lse=True)
        else:
            kp, vp, table, seqused = ref.to_pages(gen, k, v, cu_k, 32, layout)
            out, lse = msa.attention_forward(q, kp, vp, cu_q, page_table=table,
                                             seqused_k=seqused, kv_layout=layout, q2k=q2k,
                                             kv_block_size=blk, causal=causal, return_lse=True)
    want, want_lse, _ = ref.attention(q, k, v, cu_q, cu_k, q2k=q2k, blk=blk, causal=causal)
    ref.check_close(out, lse, want, want_lse)


@pytest.mark.parametrize("seed", range(6))
def test_sparse_flat(seed):
    gen, lq, lk, hq, hkv, blk, causal = _random_case(100 + seed)
    q, k, v, cu_q, cu_k = ref.random_problem(gen, lq, lk, hq, hkv, 128, torch.bfloat16, DEV)
    q2k = ref.random_q2k(gen, cu_q, lk, hkv, topk=8, blk=blk)
    with gpu_op():
        k2q = msa.build_k2q_csr(q2k, cu_q, cu_seqlens_k=cu_k, kv_block_size=blk)
        out, lse, tlse = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=q2k,
                                               k2q=k2q, kv_block_size=blk, causal=causal,
                                               temperature=0.7, return_lse=True)
    want, want_lse, want_tlse = ref.attention(q, k, v, cu_q, cu_k, q2k=q2k, blk=blk,
                                              causal=causal, temperature=0.7)
    ref.check_close(out, lse, want, want_lse)
    ref.check_close(out, tlse, want, want_tlse)


@pytest.mark.parametrize("layout", ["paged_nhd", "paged_hnd"])
@pytest.mark.parametrize("page_size", [16, 64, 256])
def test_sparse_paged(layout, page_size):
    gen, lq, lk, hq, hkv, blk, causal = _random_case(200 + page_size)
    q, k, v, cu_q, cu_k = ref.random_problem(gen, lq, lk, hq, hkv, 128, torch.bfloat16, DEV)
    kp, vp, table, seqused = ref.to_pages(gen, k, v, cu_k, page_size, layout)
    q2k = ref.random_q2k(gen, cu_q, lk, hkv, topk=6, blk=blk)
    with gpu_op():
        out, lse = msa.attention_forward(q, kp, vp, cu_q, page_table=table, seqused_k=seqused,
                                         kv_layout=layout, q2k=q2k, kv_block_size=blk,
                                         causal=causal, return_lse=True)
    want, want_lse, _ = ref.attention(q, k, v, cu_q, cu_k, q2k=q2k, blk=blk, causal=causal)
    ref.check_close(out, lse, want, want_lse)


@pytest.mark.parametrize("fmt", ["fp8_per_tensor", "fp8_per_token", "fp8_per_token_head"])
@pytest.mark.parametrize("paged", [False, True])
def test_sparse_fp8_kv(fmt, paged):
    """bf16 q over FP8 e4m3 K/V (QTensor with scales, quantized on the GPU), flat and paged,
    against the reference on their exact dequantization (rounded once to bf16, as the GPU reads
    them)."""
    gen, lq, lk, hq, hkv, _, causal = _random_case(300 + len(fmt) + paged)
    blk = 128  # the CUDA kernels' block size: the test must run, not skip
    q, k, v, cu_q, cu_k = ref.random_problem(gen, lq, lk, hq, hkv, 128, torch.bfloat16, DEV)
    q2k = ref.random_q2k(gen, cu_q, lk, hkv, topk=6, blk=blk)
    with gpu_op():
        kq, vq = msa.quantize(k, fmt), msa.quantize(v, fmt)
        kd, vd = msa.dequantize(kq, dtype="bf16"), msa.dequantize(vq, dtype="bf16")
        if paged:
            table_gen = torch.Generator().manual_seed(7)
            kp, vp, table, seqused = ref.to_pages(table_gen, kq.values, vq.values, cu_k, 64,
                                                 "paged_nhd")
            assert fmt == "fp8_per_tensor" or kq.scale.shape[0] == k.shape[0]
            if fmt != "fp8_per_tensor":  # per-token scales follow their keys into the pool slots
                ks = _scales_to_slots(kq.scale, kp, table, seqused, cu_k, 64)
                vs = _scales_to_slots(vq.scale, vp, table, seqused, cu_k, 64)
            else:
                ks, vs = kq.scale, vq.scale
            out, lse = msa.attention_forward(q, msa.QTensor(kp, ks), msa.QTensor(vp, vs), cu_q,
                                             page_table=table, seqused_k=seqused,
                                             kv_layout="paged_nhd", q2k=q2k, kv_block_size=blk,
                                             causal=causal, return_lse=True)
        else:
            out, lse = msa.attention_forward(q, kq, vq, cu_q, cu_seqlens_k=cu_k, q2k=q2k,
                                             kv_block_size=blk, causal=causal, return_lse=True)
    want, want_lse, _ = ref.attention(q, kd, vd, cu_q, cu_k, q2k=q2k, blk=blk, causal=causal)
    ref.check_close(out, lse, want, want_lse)


def _scales_to_slots(scale, pool, table, seqused, cu_k, page_size):
    """A flat per-token (and head) scale moved to the pool's slots: key j of batch b sits in slot
    page * page_size + j % page_size of page table[b, j // page_size]."""
    out = torch.full((pool.shape[0] * page_size,) + tuple(scale.shape[1:]), float("nan"),
                     device=scale.device)
    for b in range(table.shape[0]):
        n = int(seqused[b])
        j = torch.arange(n, device=scale.device)
        slots = table[b].long()[j // page_size] * page_size + j % page_size
        out[slots] = scale[int(cu_k[b]):int(cu_k[b]) + n]
    return out


def test_preallocated_outputs_on_a_side_stream():
    gen, lq, lk, hq, hkv, blk, causal = _random_case(300)
    q, k, v, cu_q, cu_k = ref.random_problem(gen, lq, lk, hq, hkv, 128, torch.bfloat16, DEV)
    q2k = ref.random_q2k(gen, cu_q, lk, hkv, topk=4, blk=blk)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((hq, q.shape[0]), float("nan"), device=DEV)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with gpu_op(), torch.cuda.stream(side):
        got, got_lse = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=q2k,
                                             kv_block_size=blk, causal=causal, out=out, lse=lse,
                                             return_lse=True)
    torch.cuda.current_stream().wait_stream(side)
    assert got is out and got_lse is lse
    want, want_lse, _ = ref.attention(q, k, v, cu_q, cu_k, q2k=q2k, blk=blk, causal=causal)
    ref.check_close(out, lse, want, want_lse)
    # An explicit stream handle works the same way.
    with gpu_op():
        again, _ = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=q2k,
                                         kv_block_size=blk, causal=causal, stream=side,
                                         return_lse=True)
    side.synchronize()
    assert torch.equal(again, out)


def _freed_block_reused(alloc, n):
    """Whether `n` bytes from `alloc`, dropped at once, go to the next n-byte allocation on the
    current stream."""
    scratch = alloc(n)
    ptr = scratch.data_ptr()
    del scratch
    later = torch.empty(n, dtype=torch.uint8, device=DEV)
    return later.data_ptr() == ptr


def test_scratch_of_an_op_on_another_stream_waits_for_that_stream():
    """The per-call workspace of an op given stream= (not the current stream) is dropped when the
    call returns, while its kernels may still run there: the block must not go to the next
    allocation on the current stream before that stream's work is done. With the cache emptied
    first, a block freed on the current stream is reused at once (checked: the test's premise)."""
    from msa._runtime import allocator
    q = torch.zeros(8, 2, 128, dtype=torch.bfloat16, device=DEV)
    n = 3 << 20
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    assert _freed_block_reused(allocator(q), n), \
        "premise: the caching allocator reuses a freed block at once"
    for stream in (side, side.cuda_stream):  # a torch.cuda.Stream or its handle
        torch.cuda.empty_cache()  # (waits for the blocks of the round before)
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)  # the side stream's work outlasts this round's checks
        assert not _freed_block_reused(allocator(q, stream), n), \
            "scratch of the side stream's op reused on the current one"
    side.synchronize()
    # An op on the default stream (handle 0) called while a side stream is current.
    torch.cuda.empty_cache()
    torch.cuda.default_stream().synchronize()
    with torch.cuda.stream(torch.cuda.default_stream()):
        torch.cuda._sleep(200_000_000)
    with torch.cuda.stream(side):
        assert not _freed_block_reused(allocator(q, 0), n), \
            "scratch of the default stream's op reused on the side one"
    torch.cuda.synchronize()


def test_invalid_block_id_is_recorded_and_raised_by_check_status():
    gen, lq, lk, hq, hkv, blk, causal = _random_case(400)
    q, k, v, cu_q, cu_k = ref.random_problem(gen, [5], [700], 4, 2, 128, torch.bfloat16, DEV)
    q2k = torch.full((2, 5, 4), -1, dtype=torch.int32, device=DEV)
    q2k[1, 3, 0] = 1000
    msa.check_status()  # nothing pending
    with gpu_op():
        out = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=q2k)  # does not wait
    assert out.shape == q.shape
    with pytest.raises(msa.MsaError, match=r"head 1, token 3, slot 0"):
        msa.check_status()
    msa.check_status()  # the check cleared it
    with gpu_op(), pytest.raises(msa.MsaError, match=r"head 1, token 3, slot 0"):
        msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=q2k, check=True)
    msa.check_status()


def test_check_sync_environment_switch_raises_at_the_op():
    import subprocess
    import sys
    code = ("import torch, msa\n"
            "q = torch.randn(5, 4, 128, dtype=torch.bfloat16, device='cuda')\n"
            "k = torch.randn(700, 2, 128, dtype=torch.bfloat16, device='cuda')\n"
            "cu_q = torch.tensor([0, 5], dtype=torch.int32, device='cuda')\n"
            "cu_k = torch.tensor([0, 700], dtype=torch.int32, device='cuda')\n"
            "q2k = torch.full((2, 5, 4), -1, dtype=torch.int32, device='cuda')\n"
            "q2k[1, 3, 0] = 1000\n"
            "try:\n"
            "    msa.attention_forward(q, k, k, cu_q, cu_seqlens_k=cu_k, q2k=q2k)\n"
            "except msa.MsaError as e:\n"
            "    print('raised:', e)\n")
    env = dict(__import__("os").environ, MSA_CHECK_SYNC="1")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert "raised: " in run.stdout and "head 1, token 3, slot 0" in run.stdout, run.stderr


def test_k2q_built_without_lengths_matches():
    # build_k2q_csr sizes row_ptr from shapes (total_k // blk + B rows, the extra ones empty):
    # attention takes that index and gives the bitwise result of building its own.
    gen, lq, lk, hq, hkv, blk, causal = _random_case(500)
    q, k, v, cu_q, cu_k = ref.random_problem(gen, lq, lk, hq, hkv, 128, torch.bfloat16, DEV)
    q2k = ref.random_q2k(gen, cu_q, lk, hkv, topk=4, blk=128)
    with gpu_op():
        k2q = msa.build_k2q_csr(q2k, cu_q, cu_seqlens_k=cu_k, k=k)
        assert k2q.row_ptr.shape[1] == k.shape[0] // 128 + len(lk) + 1
        got = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=q2k, k2q=k2q,
                                    causal=causal)
        want = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=q2k, causal=causal)
    msa.check_status()
    assert torch.equal(got, want)
