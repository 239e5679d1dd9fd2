# CPU (numpy) tests of msa.DecodePlan: plan once, run with changing lengths, dense and sparse,
# against attention_forward over the same paged cache.
import numpy as np
import pytest

import msa
import np_reference as ref


def _paged_problem(rng, lengths_q, lengths_k, hq=8, hkv=2, d=64, page=16):
    q, k, v, cu_q, cu_k = ref.problem(rng, lengths_q, lengths_k, hq, hkv, d)
    kp, vp, table, seqused = ref.to_pages(rng, k, v, cu_k, page)
    return q, kp, vp, table, seqused, cu_q


def test_dense_decode_matches_attention_and_accepts_new_lengths():
    rng = np.random.default_rng(20)
    q, kp, vp, table, seqused, cu_q = _paged_problem(rng, [1, 2, 1], [40, 70, 3])
    plan = msa.DecodePlan().plan(batch=3, num_q_heads=8, num_kv_heads=2, head_dim=64,
                                 page_size=16, max_pages=table.shape[1],
                                 max_queries_per_request=2, kv_dtype="f16", seqused_k=seqused)
    assert plan.planned and plan.shape["batch"] == 3
    for step in range(2):
        lengths = seqused - step  # the cache shrinks a little: still within the plan
        out, lse = plan.run(q, kp, vp, table, cu_q, seqused_k=lengths, return_lse=True)
        want, want_lse = msa.attention_forward(q, kp, vp, cu_q, page_table=table,
                                               seqused_k=lengths, return_lse=True)
        np.testing.assert_array_equal(out, want)
        np.testing.assert_array_equal(lse, want_lse)


def test_sparse_decode_with_temperature():
    rng = np.random.default_rng(21)
    q, kp, vp, table, seqused, cu_q = _paged_problem(rng, [1, 1], [300, 129], page=64)
    scores = msa.block_scores(q, kp, cu_q, page_table=table, seqused_k=seqused)
    q2k = msa.select_topk(scores, cu_q, num_kv_heads=2, topk=2, k=kp, page_table=table,
                          seqused_k=seqused)
    plan = msa.DecodePlan().plan(batch=2, num_q_heads=8, num_kv_heads=2, head_dim=64,
                                 page_size=64, max_pages=table.shape[1], kv_dtype="f16", topk=2)
    out, lse, tlse = plan.run(q, kp, vp, table, cu_q, seqused_k=seqused, q2k=q2k,
                              temperature=2.0, return_lse=True)
    want = msa.attention_forward(q, kp, vp, cu_q, page_table=table, seqused_k=seqused, q2k=q2k,
                                 temperature=2.0, return_lse=True)
    for got, exp in zip((out, lse, tlse), want):
        np.testing.assert_array_equal(got, exp)


def test_decode_errors():
    rng = np.random.default_rng(22)
    q, kp, vp, table, seqused, cu_q = _paged_problem(rng, [1], [20])
    plan = msa.DecodePlan()
    with pytest.raises(msa.MsaError, match="before"):
        plan.run(q, kp, vp, table, cu_q, return_lse=True)
    plan.plan(batch=1, num_q_heads=8, num_kv_heads=2, head_dim=64, page_size=16,
              max_pages=table.shape[1], kv_dtype="f16")
    with pytest.raises(msa.MsaError, match="q2k"):
        plan.run(q, kp, vp, table, cu_q, q2k=np.zeros((2, 1, 1), np.int32), return_lse=True)
    with pytest.raises(msa.MsaError, match="page_size"):
        msa.DecodePlan().plan(batch=1, num_q_heads=8, num_kv_heads=2, page_size=24, max_pages=1)


def test_fp8_pool_with_per_slot_scales():
    # FP8 page pools with K scales per slot and head and V scales per slot (token P * page + s).
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(23)
    q, k, v, cu_q, cu_k = ref.problem(rng, [2, 1], [150, 40], 8, 2, 64, ml_dtypes.bfloat16)
    kp, vp, table, seqused = ref.to_pages(rng, k, v, cu_k, 32)
    slots = kp.shape[0] * kp.shape[1]
    pools = [np.nan_to_num(x.astype(np.float32)).astype(ml_dtypes.bfloat16).reshape(slots, 2, 64)
             for x in (kp, vp)]
    kq = msa.quantize(pools[0], "fp8_per_token_head")
    vq = msa.quantize(pools[1], "fp8_per_token")
    assert kq.scale.shape == (slots, 2) and vq.scale.shape == (slots,)
    kf8, vf8 = (x.values.reshape(kp.shape) for x in (kq, vq))
    plan = msa.DecodePlan().plan(batch=2, num_q_heads=8, num_kv_heads=2, head_dim=64,
                                 page_size=32, max_pages=table.shape[1],
                                 max_queries_per_request=2, kv_dtype="fp8_e4m3")
    out, lse = plan.run(q, kf8, vf8, table, cu_q, seqused_k=seqused, k_scale=kq.scale,
                        v_scale=vq.scale, return_lse=True)
    want, want_lse = msa.attention_forward(q, kf8, vf8, cu_q, page_table=table,
                                           seqused_k=seqused, k_scale=kq.scale,
                                           v_scale=vq.scale, return_lse=True)
    np.testing.assert_array_equal(out.view(np.uint16), want.view(np.uint16))
    np.testing.assert_array_equal(lse, want_lse)
    # Against the dequantized values in flat form.
    kd = msa.dequantize(kq).astype(np.float64).reshape(kp.shape)
    vd = msa.dequantize(vq).astype(np.float64).reshape(vp.shape)
    ks, vs = [], []
    for b, lk in enumerate(seqused):
        pages = table[b, :(lk + 31) // 32]
        ks.append(kd[pages].reshape(-1, 2, 64)[:lk])
        vs.append(vd[pages].reshape(-1, 2, 64)[:lk])
    exp, exp_lse, _ = ref.attention(q.astype(np.float64), ks, vs, cu_q)
    got = out.astype(np.float64)
    assert np.linalg.norm(got - exp) <= 3e-2 * np.linalg.norm(exp)
    assert np.max(np.abs(lse - exp_lse)) <= 3e-2


def test_plan_infers_its_device_and_reuses_its_workspace():
    rng = np.random.default_rng(24)
    q, kp, vp, table, seqused, cu_q = _paged_problem(rng, [1, 1], [40, 70])
    plan = msa.DecodePlan().plan(batch=2, num_q_heads=8, num_kv_heads=2, head_dim=64,
                                 page_size=16, max_pages=table.shape[1], kv_dtype="f16",
                                 seqused_k=seqused)
    assert plan.shape["device_type"] == "cpu"  # seqused_k is a host array
    ws = plan._workspace
    plan.plan(batch=2, num_q_heads=8, num_kv_heads=2, head_dim=64, page_size=16,
              max_pages=table.shape[1], kv_dtype="f16", seqused_k=seqused - 1)
    assert plan._workspace is ws  # same shape: nothing reallocated
    out = plan.run(q, kp, vp, table, cu_q, seqused_k=seqused - 1)
    np.testing.assert_array_equal(
        out, msa.attention_forward(q, kp, vp, cu_q, page_table=table, seqused_k=seqused - 1))
