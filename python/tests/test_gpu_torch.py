# GPU tests of msa's torch integration: torch.compile (fullgraph, and reduce-overhead CUDA
# graphs) over the custom ops (attention, the fused block_topk, the whole pipeline), manual
# CUDA-graph capture and replay of attention and of DecodePlan.run (over blocks and over token
# ids), torch.library.opcheck, and cupy arrays through the same API.
import pytest

import msa
import torch_reference as ref
from gpu_env import gpu_op, require_gpu

torch = require_gpu()
DEV = "cuda"
LQ, LK, HQ, HKV, BLK, TOPK = [37, 100], [900, 1300], 8, 2, 128, 4


def _problem(seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v, cu_q, cu_k = ref.random_problem(gen, LQ, LK, HQ, HKV, 128, torch.bfloat16, DEV)
    q2k = ref.random_q2k(gen, cu_q, LK, HKV, TOPK, BLK)
    return q, k, v, cu_q, cu_k, q2k


def _sparse(q, k, v, cu_q, cu_k, q2k):
    return msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=q2k, temperature=0.5,
                                 return_lse=True)


def test_custom_ops_are_registered():
    for name in ("block_scores", "block_topk", "select_topk", "build_k2q_csr",
                 "attention_forward", "decode_run", "quantize", "dequantize"):
        assert hasattr(torch.ops.msa, name)


def test_torch_compile_fullgraph():
    args = _problem(1)
    with gpu_op():
        eager = _sparse(*args)
    compiled = torch.compile(_sparse, fullgraph=True)
    got = compiled(*args)
    for a, b in zip(got, eager):
        assert torch.equal(a, b)
    want, want_lse, _ = ref.attention(*args[:5], q2k=args[5], blk=BLK)
    ref.check_close(got[0], got[1], want, want_lse)


def test_torch_compile_reduce_overhead():
    args = _problem(2)
    with gpu_op():
        eager = _sparse(*args)
    compiled = torch.compile(_sparse, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):  # the later calls replay a CUDA graph
        got = compiled(*args)
    for a, b in zip(got, eager):
        assert torch.equal(a, b)


def test_block_topk_compiles_and_passes_opcheck():
    gen = torch.Generator().manual_seed(9)
    q, k, cu_q, cu_k = ref.integer_problem(gen, LQ, LK, HQ, HKV, 128, torch.bfloat16, DEV)

    def run(q, k, cu_q, cu_k):
        return msa.block_topk(q, k, cu_q, cu_seqlens_k=cu_k, topk=TOPK)

    with gpu_op():
        eager = run(q, k, cu_q, cu_k)
    got = torch.compile(run, fullgraph=True)(q, k, cu_q, cu_k)
    assert torch.equal(got, eager)
    want = ref.select_topk(ref.block_scores(q, k, cu_q, cu_k), cu_q, LK, hkv=HKV, topk=TOPK)
    assert torch.equal(got, want)
    args = (q, None, k, None, cu_q, cu_k, None, None, "flat", 1.0, 1.0, TOPK, 1, 1, True, BLK,
            0, True, None)
    torch.library.opcheck(torch.ops.msa.block_topk.default, args,
                          test_utils=("test_schema", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


def test_pipeline_compiles_and_captures_without_sizes():
    # The one-call pipeline reads nothing on the host: torch.compile(fullgraph=True) and CUDA
    # graph capture need no static sizes.
    q, k, v, cu_q, cu_k, _ = _problem(3)

    def run(q, k, v, cu_q, cu_k):
        return msa.sparse_attention(q, k, v, cu_q, cu_seqlens_k=cu_k, topk=TOPK,
                                    return_lse=True, return_selection=True)

    with gpu_op():
        eager = run(q, k, v, cu_q, cu_k)
    got = torch.compile(run, fullgraph=True)(q, k, v, cu_q, cu_k)
    for a, b in zip(got, eager):
        assert torch.equal(a, b)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run(q, k, v, cu_q, cu_k)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run(q, k, v, cu_q, cu_k)
    fresh = _problem(9)
    for dst, src in zip((q, k, v), fresh[:3]):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    want = run(q, k, v, cu_q, cu_k)
    for a, b in zip(captured, want):
        assert torch.equal(a, b)


def test_decode_length_past_the_plan_is_a_clear_error():
    gen = torch.Generator().manual_seed(10)
    q, k, v, cu_q, cu_k = ref.random_problem(gen, [1, 1], [300, 200], 16, 2, 128,
                                             torch.bfloat16, DEV)
    kp, vp, table, seqused = ref.to_pages(gen, k, v, cu_k, 64)
    with gpu_op():
        plan = msa.DecodePlan().plan(batch=2, num_q_heads=16, num_kv_heads=2, head_dim=128,
                                     page_size=64, max_pages=table.shape[1],
                                     kv_dtype=torch.bfloat16, seqused_k=seqused)
        ws = plan._workspace
        assert plan.shape["device_type"] == "cuda"  # from seqused_k
        plan.run(q, kp, vp, table, cu_q, seqused_k=seqused)
    msa.check_status()
    # Request 1 was planned for 200 keys (capacity 256, a multiple of 128); 300 is past it.
    grown = torch.tensor([300, 300], dtype=torch.int32, device=DEV)
    plan.run(q, kp, vp, table, cu_q, seqused_k=grown)
    with pytest.raises(msa.MsaError, match=r"seqused_k: request 1 has 300 keys, past the "
                                           r"planned capacity 256"):
        msa.check_status()
    plan.plan(batch=2, num_q_heads=16, num_kv_heads=2, head_dim=128, page_size=64,
              max_pages=table.shape[1], kv_dtype=torch.bfloat16, seqused_k=grown)
    assert plan._workspace is ws  # re-planned in place
    plan.run(q, kp, vp, table, cu_q, seqused_k=grown)
    msa.check_status()


def test_cuda_graph_capture_and_replay():
    static = _problem(4)
    with gpu_op():
        _sparse(*static)  # warm-up outside capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _sparse(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse, tlse = _sparse(*static)
    fresh = _problem(5)
    for dst, src in zip(static, fresh):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    want = _sparse(*fresh)
    for a, b in zip((out, lse, tlse), want):
        assert torch.equal(a, b)


def test_decode_plan_in_cuda_graph():
    gen = torch.Generator().manual_seed(6)
    batch, page = 4, 64
    lengths = [700, 1, 0, 1000]
    q, k, v, cu_q, cu_k = ref.random_problem(gen, [2, 1, 1, 2], lengths, 16, 2, 128,
                                             torch.bfloat16, DEV)
    kp, vp, table, seqused = ref.to_pages(gen, k, v, cu_k, page)
    with gpu_op():
        plan = msa.DecodePlan().plan(batch=batch, num_q_heads=16, num_kv_heads=2, head_dim=128,
                                     page_size=page, max_pages=table.shape[1],
                                     max_queries_per_request=2, kv_dtype=torch.bfloat16,
                                     device=DEV, seqused_k=seqused)
        eager = plan.run(q, kp, vp, table, cu_q, seqused_k=seqused, return_lse=True)
    want, want_lse, _ = ref.attention(q, k, v, cu_q, cu_k)
    ref.check_close(eager[0], eager[1], want, want_lse)
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        plan.run(q, kp, vp, table, cu_q, seqused_k=seqused, return_lse=True)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        out, lse = plan.run(q, kp, vp, table, cu_q, seqused_k=seqused, return_lse=True)
    seqused.copy_(torch.tensor([650, 1, 0, 999], dtype=torch.int32))  # new lengths, same plan
    graph.replay()
    torch.cuda.synchronize()
    again = plan.run(q, kp, vp, table, cu_q, seqused_k=seqused, return_lse=True)
    assert torch.equal(out, again[0]) and torch.equal(lse, again[1])


@pytest.mark.parametrize("page_size,topk", [(16, 64), (64, 2048)])
def test_decode_token_ids_match_the_reference_and_replay(page_size, topk):
    """Sparse decode over token ids (kv_block_size=1) on CUDA: random ascending ids per (kv head,
    query), -1 padded, against the reference over flat K/V; then a CUDA-graph capture of run()
    replayed with new ids equals an eager run on them."""
    gen = torch.Generator().manual_seed(12)
    lq, lk = [2, 1, 1, 1], [700, 1, 0, 3000]
    q, k, v, cu_q, cu_k = ref.random_problem(gen, lq, lk, 16, 2, 128, torch.bfloat16, DEV)
    q2k = ref.random_q2k(gen, cu_q, lk, 2, topk, 1)
    kp, vp, table, seqused = ref.to_pages(gen, k, v, cu_k, page_size)
    with gpu_op():
        plan = msa.DecodePlan().plan(batch=4, num_q_heads=16, num_kv_heads=2, head_dim=128,
                                     page_size=page_size, max_pages=table.shape[1],
                                     max_queries_per_request=2, kv_dtype=torch.bfloat16,
                                     topk=topk, kv_block_size=1, device=DEV, seqused_k=seqused)
        out, lse = plan.run(q, kp, vp, table, cu_q, seqused_k=seqused, q2k=q2k, return_lse=True)
    want, want_lse, _ = ref.attention(q, k, v, cu_q, cu_k, q2k=q2k, blk=1)
    ref.check_close(out, lse, want, want_lse)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        plan.run(q, kp, vp, table, cu_q, seqused_k=seqused, q2k=q2k, return_lse=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_out, g_lse = plan.run(q, kp, vp, table, cu_q, seqused_k=seqused, q2k=q2k,
                                return_lse=True)
    q2k.copy_(ref.random_q2k(gen, cu_q, lk, 2, topk, 1))
    graph.replay()
    torch.cuda.synchronize()
    again = plan.run(q, kp, vp, table, cu_q, seqused_k=seqused, q2k=q2k, return_lse=True)
    assert torch.equal(g_out, again[0]) and torch.equal(g_lse, again[1])
    want, want_lse, _ = ref.attention(q, k, v, cu_q, cu_k, q2k=q2k, blk=1)
    ref.check_close(g_out, g_lse, want, want_lse)


@pytest.mark.parametrize("group, dim", [(16, 128), (64, 128), (16, 64), (64, 256)])
def test_token_sparse_prefill_matches_the_reference_and_replays(group, dim):
    """Token-sparse prefill (kv_block_size=1) on CUDA through the torch op: random ascending key
    ids per (kv head, query), -1 padded, against the reference; then a CUDA-graph capture of the
    call replayed with new ids and new q equals an eager call on them. Head dims 64 and 256 too."""
    gen = torch.Generator().manual_seed(21 + group + dim)
    hkv = 64 // group
    lq, lk = [100, 0, 40], [300, 17, 900]
    q, k, v, cu_q, cu_k = ref.random_problem(gen, lq, lk, 64, hkv, dim, torch.bfloat16, DEV)
    q2k = ref.random_q2k(gen, cu_q, lk, hkv, 256, 1).to(DEV)

    def call():
        return msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=q2k, kv_block_size=1,
                                     return_lse=True)

    with gpu_op():
        out, lse = call()
    want, want_lse, _ = ref.attention(q, k, v, cu_q, cu_k, q2k=q2k, blk=1)
    ref.check_close(out, lse, want, want_lse)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_out, g_lse = call()
    q2k.copy_(ref.random_q2k(gen, cu_q, lk, hkv, 256, 1).to(DEV))
    q.copy_(torch.randn(q.shape, generator=gen).to(q))
    graph.replay()
    torch.cuda.synchronize()
    again = call()
    assert torch.equal(g_out, again[0]) and torch.equal(g_lse, again[1])
    want, want_lse, _ = ref.attention(q, k, v, cu_q, cu_k, q2k=q2k, blk=1)
    ref.check_close(g_out, g_lse, want, want_lse)


def test_opcheck():
    q, k, v, cu_q, cu_k, q2k = _problem(7)
    with gpu_op():
        _sparse(q, k, v, cu_q, cu_k, q2k)
    args = (q, None, k, v, cu_q, cu_k, None, None, None, None, q2k, None, None, None, "flat",
            0.0, True, BLK, 0.0, "f32", True, None, None, "", 0.0, None)
    torch.library.opcheck(torch.ops.msa.attention_forward.default, args,
                          test_utils=("test_schema", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


def test_cupy_arrays():
    cupy = pytest.importorskip("cupy", reason="cupy is not installed")
    q, k, v, cu_q, cu_k, q2k = _problem(8)
    with gpu_op():
        want, want_lse = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=q2k,
                                               return_lse=True)
    torch.cuda.synchronize()
    cq, ck, cv = (msa.typed(cupy.from_dlpack(x.view(torch.int16)), "bf16") for x in (q, k, v))
    out, lse = msa.attention_forward(cq, ck, cv, cupy.from_dlpack(cu_q),
                                     cu_seqlens_k=cupy.from_dlpack(cu_k),
                                     q2k=cupy.from_dlpack(q2k), return_lse=True)
    cupy.cuda.get_current_stream().synchronize()
    assert isinstance(out, cupy.ndarray) and out.dtype == cupy.uint16
    assert torch.equal(torch.from_dlpack(out).view(torch.bfloat16), want)
    assert torch.equal(torch.from_dlpack(lse), want_lse)


def test_capture_before_any_eager_call_is_a_clear_error():
    # msa keeps one status buffer per device, made by the first eager call: a graph captured
    # first would own it (its pool, zeroed only on replay), so capture asks for a warm-up.
    import subprocess
    import sys
    code = ("import torch, msa\n"
            "q = torch.randn(5, 4, 128, dtype=torch.bfloat16, device='cuda')\n"
            "cu = torch.tensor([0, 5], dtype=torch.int32, device='cuda')\n"
            "q2k = torch.zeros(2, 5, 1, dtype=torch.int32, device='cuda')\n"
            "k = torch.randn(5, 2, 128, dtype=torch.bfloat16, device='cuda')\n"
            "g = torch.cuda.CUDAGraph()\n"
            "try:\n"
            "    with torch.cuda.graph(g):\n"
            "        msa.attention_forward(q, k, k, cu, cu_seqlens_k=cu, q2k=q2k)\n"
            "except msa.MsaError as e:\n"
            "    print('raised:', e)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert "raised: msa: no status buffer yet for cuda:0" in run.stdout, run.stdout + run.stderr
