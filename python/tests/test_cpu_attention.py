# CPU (numpy) tests of msa.attention_forward: dense and sparse, flat and paged, f16 and bf16,
# LSE and temperature LSE, preallocated outputs, against the float64 reference in np_reference.
import numpy as np
import pytest

import msa
import np_reference as ref

ml_dtypes = pytest.importorskip("ml_dtypes")


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("groups", [1, 4])
def test_dense_flat_f16(causal, groups):
    rng = np.random.default_rng(1)
    q, k, v, cu_q, cu_k = ref.problem(rng, [3, 0, 70], [150, 20, 90], 2 * groups, 2, 64)
    out, lse = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, causal=causal,
                                     return_lse=True)
    assert out.dtype == np.float16 and out.shape == q.shape and lse.dtype == np.float32
    want, want_lse, _ = ref.attention(q.astype(np.float64), ref.split(k, cu_k), ref.split(v, cu_k),
                                      cu_q, causal=causal)
    ref.check_attention(out, lse, want, want_lse)


def test_sparse_flat_bf16_with_temperature_and_k2q():
    rng = np.random.default_rng(2)
    q, k, v, cu_q, cu_k = ref.problem(rng, [40, 65], [300, 200], 4, 2, 64, ml_dtypes.bfloat16)
    blk = 64
    scores = msa.block_scores(q, k, cu_q, cu_seqlens_k=cu_k, kv_block_size=blk)
    q2k = msa.select_topk(scores, cu_q, num_kv_heads=2, topk=3, kv_block_size=blk,
                          cu_seqlens_k=cu_k)
    k2q = msa.build_k2q_csr(q2k, cu_q, cu_seqlens_k=cu_k, kv_block_size=blk)
    out, lse, tlse = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=q2k, k2q=k2q,
                                           kv_block_size=blk, temperature=0.5,
                                           softmax_scale=0.1, return_lse=True)
    assert out.dtype == ml_dtypes.bfloat16
    want, want_lse, want_tlse = ref.attention(
        q.astype(np.float64), ref.split(k, cu_k), ref.split(v, cu_k), cu_q, q2k=q2k, blk=blk,
        scale=0.1, temperature=0.5)
    ref.check_attention(out, lse, want, want_lse)
    assert np.abs(tlse - want_tlse).max() < 2e-3
    # Without the CSR index the result is the same.
    out2, lse2 = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=q2k,
                                       kv_block_size=blk, softmax_scale=0.1, return_lse=True)
    assert np.array_equal(out2.view(np.uint16), out.view(np.uint16))
    assert np.array_equal(lse2, lse)


@pytest.mark.parametrize("layout", ["paged_nhd", "paged_hnd"])
def test_paged_equals_flat(layout):
    rng = np.random.default_rng(3)
    q, k, v, cu_q, cu_k = ref.problem(rng, [1, 17, 0], [100, 40, 0], 4, 1, 64)
    kp, vp, table, seqused = ref.to_pages(rng, k, v, cu_k, 16, layout)
    out, lse = msa.attention_forward(q, kp, vp, cu_q, page_table=table, seqused_k=seqused,
                                     kv_layout=layout, return_lse=True)
    flat, flat_lse = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, return_lse=True)
    assert np.isfinite(out.astype(np.float32)).all()  # NaN in unused page slots never leaks
    np.testing.assert_allclose(out.astype(np.float32), flat.astype(np.float32), atol=2e-3)
    np.testing.assert_allclose(lse, flat_lse, atol=1e-5)


def test_typed_uint16_views_and_preallocated_outputs():
    rng = np.random.default_rng(4)
    q, k, v, cu_q, cu_k = ref.problem(rng, [9], [33], 2, 2, 64, ml_dtypes.bfloat16)
    want, want_lse = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, return_lse=True)
    bits = [msa.typed(x.view(np.uint16), "bf16") for x in (q, k, v)]
    out = np.full(q.shape, 0xFFFF, np.uint16)  # NaN poison; bf16 storage inferred from q
    lse = np.full((2, 9), np.nan, np.float32)
    got, got_lse = msa.attention_forward(*bits, cu_q, cu_seqlens_k=cu_k, out=out, lse=lse,
                                         return_lse=True)
    assert got is out and got_lse is lse
    assert np.array_equal(out, want.view(np.uint16)) and np.array_equal(lse, want_lse)
    # Allocated bf16 outputs are ml_dtypes.bfloat16 (uint16 storage without ml_dtypes).
    alloc, _ = msa.attention_forward(*bits, cu_q, cu_seqlens_k=cu_k, return_lse=True)
    assert alloc.dtype == ml_dtypes.bfloat16 and np.array_equal(alloc.view(np.uint16), out)


def test_fp8_kv():
    rng = np.random.default_rng(5)
    q, k, v, cu_q, cu_k = ref.problem(rng, [12], [130], 2, 2, 64, ml_dtypes.bfloat16)
    kq = msa.quantize(k, "fp8_per_tensor")
    vq = msa.quantize(v, "fp8_per_tensor")
    out, lse = msa.attention_forward(q, kq.values, vq.values, cu_q, cu_seqlens_k=cu_k,
                                     k_scale=kq.scale, v_scale=vq.scale, return_lse=True)
    kd = msa.dequantize(kq).astype(np.float64)
    vd = msa.dequantize(vq).astype(np.float64)
    want, want_lse, _ = ref.attention(q.astype(np.float64), ref.split(kd, cu_k),
                                      ref.split(vd, cu_k), cu_q)
    ref.check_attention(out, lse, want, want_lse, tol=3e-2)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_fp4_kv(fmt):
    """NVFP4 / MXFP4 K and V as QTensors (the global scale travels with them)."""
    rng = np.random.default_rng(7)
    q, k, v, cu_q, cu_k = ref.problem(rng, [12], [130], 2, 2, 64, ml_dtypes.bfloat16)
    kq = msa.quantize(k, fmt, global_scale=0.75 if fmt == "nvfp4" else 1.0)
    vq = msa.quantize(v, fmt)
    out, lse = msa.attention_forward(q, kq, vq, cu_q, cu_seqlens_k=cu_k, return_lse=True)
    kd = msa.dequantize(kq).astype(np.float64)
    vd = msa.dequantize(vq).astype(np.float64)
    want, want_lse, _ = ref.attention(q.astype(np.float64), ref.split(kd, cu_k),
                                      ref.split(vd, cu_k), cu_q)
    ref.check_attention(out, lse, want, want_lse, tol=3e-2)


def test_empty_rows_give_zero_and_neg_inf():
    rng = np.random.default_rng(6)
    q, k, v, cu_q, cu_k = ref.problem(rng, [4, 3], [0, 5], 2, 2, 64)
    q2k = np.full((2, 7, 2), -1, np.int32)  # nothing selected anywhere
    out, lse = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=q2k, return_lse=True)
    assert (out == 0).all() and np.isneginf(lse).all()


def test_workspace_sizes_on_the_cpu_are_zero_and_arguments_are_checked():
    rng = np.random.default_rng(9)
    q, k, v, cu_q, cu_k = ref.problem(rng, [5], [70], 4, 2, 64)
    assert msa.attention_workspace_bytes(q, k, v, cu_q, cu_seqlens_k=cu_k) == 0
    with pytest.raises(msa.MsaError, match="cu_seqlens_q"):
        msa.attention_workspace_bytes(q, k, v, cu_k[:1], cu_seqlens_k=cu_k)
