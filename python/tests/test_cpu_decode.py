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
        out, lse = plan.run(q, kp, vp, table, cu_q, seqused_k=lengths)
        want, want_lse = msa.attention_forward(q, kp, vp, cu_q, page_table=table,
                                               seqused_k=lengths)
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
                              temperature=2.0)
    want = msa.attention_forward(q, kp, vp, cu_q, page_table=table, seqused_k=seqused, q2k=q2k,
                                 temperature=2.0)
    for got, exp in zip((out, lse, tlse), want):
        np.testing.assert_array_equal(got, exp)


def test_decode_errors():
    rng = np.random.default_rng(22)
    q, kp, vp, table, seqused, cu_q = _paged_problem(rng, [1], [20])
    plan = msa.DecodePlan()
    with pytest.raises(msa.MsaError, match="before"):
        plan.run(q, kp, vp, table, cu_q)
    plan.plan(batch=1, num_q_heads=8, num_kv_heads=2, head_dim=64, page_size=16,
              max_pages=table.shape[1], kv_dtype="f16")
    with pytest.raises(msa.MsaError, match="q2k"):
        plan.run(q, kp, vp, table, cu_q, q2k=np.zeros((2, 1, 1), np.int32))
    with pytest.raises(msa.MsaError, match="page_size"):
        msa.DecodePlan().plan(batch=1, num_q_heads=8, num_kv_heads=2, page_size=24, max_pages=1)
