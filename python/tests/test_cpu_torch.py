# CPU tests of msa's torch integration with CPU tensors (skipped without torch): the custom ops
# agree with the direct path and the torch reference, torch.compile(fullgraph=True) traces them,
# opcheck passes, and tensors that require grad are accepted.
import pytest

import msa
import torch_reference as ref

torch = pytest.importorskip("torch", reason="torch is not installed")


def _problem(seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v, cu_q, cu_k = ref.random_problem(gen, [9, 40], [300, 129], 4, 2, 64,
                                             torch.bfloat16, "cpu")
    q2k = ref.random_q2k(gen, cu_q, [300, 129], 2, 3, 64)
    return q, k, v, cu_q, cu_k, q2k


def test_attention_matches_torch_reference_and_direct_path():
    q, k, v, cu_q, cu_k, q2k = _problem()
    out, lse = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=q2k,
                                     kv_block_size=64, return_lse=True)
    want, want_lse, _ = ref.attention(q, k, v, cu_q, cu_k, q2k=q2k, blk=64)
    ref.check_close(out, lse, want, want_lse)
    pre = torch.empty_like(q)
    direct, _ = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=q2k,
                                      kv_block_size=64, out=pre, return_lse=True)
    assert direct is pre and torch.equal(direct, out)


def test_selection_matches_torch_reference():
    q, k, _, cu_q, cu_k, _ = _problem(1)
    scores = msa.block_scores(q, k, cu_q, cu_seqlens_k=cu_k, kv_block_size=64)
    want = ref.block_scores(q, k, cu_q, cu_k, blk=64)
    finite = torch.isfinite(want)
    assert torch.equal(torch.isneginf(scores), torch.isneginf(want))
    torch.testing.assert_close(scores[finite], want[finite], rtol=1e-4, atol=1e-4)
    q2k = msa.select_topk(scores, cu_q, num_kv_heads=2, topk=4, kv_block_size=64,
                          cu_seqlens_k=cu_k)
    assert torch.equal(q2k, ref.select_topk(scores, cu_q, [300, 129], hkv=2, topk=4, blk=64))
    k2q = msa.build_k2q_csr(q2k, cu_q, cu_seqlens_k=cu_k, kv_block_size=64)
    row_ptr, q_idx = ref.k2q_csr(q2k, cu_q, [300, 129], 64)
    assert torch.equal(k2q.row_ptr, row_ptr)
    for h in range(2):
        assert torch.equal(k2q.q_idx[h, :int(row_ptr[h, -1])], q_idx[h])


def test_block_topk_custom_op():
    gen = torch.Generator().manual_seed(4)
    lk = [300, 129, 0]
    q, k, cu_q, cu_k = ref.integer_problem(gen, [9, 40, 3], lk, 8, 2, 64, torch.bfloat16, "cpu")

    def run(q, k, cu_q, cu_k):
        return msa.block_topk(q, k, cu_q, cu_seqlens_k=cu_k, topk=3, local_blocks=2,
                              kv_block_size=64)

    q2k = run(q, k, cu_q, cu_k)
    want = ref.select_topk(ref.block_scores(q, k, cu_q, cu_k, blk=64), cu_q, lk, hkv=2, topk=3,
                           local=2, blk=64)
    assert torch.equal(q2k, want)
    assert torch.equal(torch.compile(run, fullgraph=True, backend="eager")(q, k, cu_q, cu_k), want)
    args = (q, None, k, None, cu_q, cu_k, None, None, "flat", 1.0, 1.0, 3, 1, 2, True, 64, 0,
            True, None)
    torch.library.opcheck(torch.ops.msa.block_topk.default, args,
                          test_utils=("test_schema", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


def test_compile_fullgraph_pipeline():
    q, k, v, cu_q, cu_k, _ = _problem(2)

    def run(q, k, v, cu_q, cu_k):
        return msa.sparse_attention(q, k, v, cu_q, cu_seqlens_k=cu_k, topk=3, kv_block_size=64,
                                    return_lse=True)

    eager = run(q, k, v, cu_q, cu_k)
    got = torch.compile(run, fullgraph=True, backend="eager")(q, k, v, cu_q, cu_k)
    for a, b in zip(got, eager):
        assert torch.equal(a, b)


def test_opcheck_and_requires_grad():
    q, k, v, cu_q, cu_k, q2k = _problem(3)
    args = (q, None, k, v, cu_q, cu_k, None, None, None, None, q2k, None, None, None, "flat",
            0.0, True, 64, 0.5, "f32", True, None, None, "", 0.0, None)
    torch.library.opcheck(torch.ops.msa.attention_forward.default, args,
                          test_utils=("test_schema", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))
    qt = msa.quantize(k.float(), "nvfp4")
    assert qt.values.dtype == getattr(torch, "float4_e2m1fn_x2", torch.uint8)
    y = torch.compile(msa.dequantize, fullgraph=True, backend="eager")(qt)
    assert torch.equal(y, msa.dequantize(qt))
    out, _ = msa.attention_forward(q.requires_grad_(), k, v, cu_q, cu_seqlens_k=cu_k,
                                   return_lse=True)
    assert out.shape == q.shape
