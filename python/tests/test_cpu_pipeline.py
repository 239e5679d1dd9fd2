# CPU (numpy) tests of the selection path: block_scores, select_topk, build_k2q_csr (with the
# reference converters) and the one-call sparse_attention pipeline, flat and paged.
import numpy as np
import pytest

import msa
import np_reference as ref


@pytest.mark.parametrize("causal", [True, False])
def test_block_scores_flat(causal):
    rng = np.random.default_rng(10)
    q, k, _, cu_q, cu_k = ref.problem(rng, [5, 70], [200, 64], 4, 2, 64)
    scores = msa.block_scores(q, k, cu_q, cu_seqlens_k=cu_k, causal=causal, kv_block_size=64)
    want = ref.block_scores(q.astype(np.float64), ref.split(k, cu_k), cu_q, blk=64, causal=causal)
    assert scores.shape == want.shape == (4, 4, 75) and scores.dtype == np.float32
    assert np.array_equal(np.isneginf(scores), np.isneginf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(scores[finite], want[finite], rtol=1e-5, atol=1e-4)


def test_block_scores_paged_and_max_seqlen():
    rng = np.random.default_rng(11)
    q, k, v, cu_q, cu_k = ref.problem(rng, [7, 3], [150, 20], 2, 2, 64)
    kp, _, table, seqused = ref.to_pages(rng, k, v, cu_k, 32)
    paged = msa.block_scores(q, kp, cu_q, page_table=table, seqused_k=seqused, kv_block_size=64)
    # nblk_max defaults to the page table's capacity for a paged cache: 5 pages * 32 / 64.
    assert paged.shape == (2, 3, 10)
    flat = msa.block_scores(q, k, cu_q, cu_seqlens_k=cu_k, kv_block_size=64, max_seqlen_k=192)
    assert flat.shape == (2, 3, 10)
    np.testing.assert_array_equal(paged, flat)


def test_select_topk_matches_reference():
    rng = np.random.default_rng(12)
    lq, lk = [30, 1, 9], [700, 129, 0]
    q, k, _, cu_q, cu_k = ref.problem(rng, lq, lk, 8, 2, 64)
    scores = msa.block_scores(q, k, cu_q, cu_seqlens_k=cu_k, kv_block_size=64)
    q2k = msa.select_topk(scores, cu_q, num_kv_heads=2, topk=4, sink_blocks=1, local_blocks=2,
                          kv_block_size=64, cu_seqlens_k=cu_k)
    want = ref.select_topk(scores.astype(np.float64), cu_q, lk, hkv=2, topk=4, sink=1, local=2,
                           blk=64)
    assert q2k.dtype == np.int32
    np.testing.assert_array_equal(q2k, want)


def test_csr_round_trip_and_schedule():
    rng = np.random.default_rng(13)
    q, k, _, cu_q, cu_k = ref.problem(rng, [20, 5], [300, 70], 4, 4, 64)
    scores = msa.block_scores(q, k, cu_q, cu_seqlens_k=cu_k)
    q2k = msa.select_topk(scores, cu_q, num_kv_heads=4, topk=2, cu_seqlens_k=cu_k)
    k2q = msa.build_k2q_csr(q2k, cu_q, cu_seqlens_k=cu_k)
    assert isinstance(k2q, msa.K2QIndex) and k2q.schedule is not None
    total_rows = 3 + 1  # ceil(300/128) + ceil(70/128)
    assert k2q.row_ptr.shape == (4, total_rows + 1) and k2q.q_idx.shape == (4, 25 * 2)
    conv = msa.q2k_to_k2q(q2k, cu_q, cu_seqlens_k=cu_k)
    np.testing.assert_array_equal(conv.row_ptr, k2q.row_ptr)
    n = k2q.row_ptr[:, -1]
    for h in range(4):
        np.testing.assert_array_equal(conv.q_idx[h, :n[h]], k2q.q_idx[h, :n[h]])
    back = msa.k2q_to_q2k(k2q, cu_q, topk=2, cu_seqlens_k=cu_k)
    np.testing.assert_array_equal(back, q2k)
    no_sched = msa.build_k2q_csr(q2k, cu_q, cu_seqlens_k=cu_k, return_schedule=False)
    assert no_sched.schedule is None


def test_invalid_block_id_is_named():
    rng = np.random.default_rng(14)
    _, _, _, cu_q, cu_k = ref.problem(rng, [3], [200], 2, 2, 64)
    q2k = np.full((2, 3, 2), -1, np.int32)
    q2k[1, 2, 1] = 7  # batch has 2 blocks
    with pytest.raises(msa.MsaError, match=r"head 1, token 2, slot 1"):
        msa.build_k2q_csr(q2k, cu_q, cu_seqlens_k=cu_k)


@pytest.mark.parametrize("paged", [False, True])
def test_sparse_attention_pipeline(paged):
    rng = np.random.default_rng(15)
    q, k, v, cu_q, cu_k = ref.problem(rng, [50, 8], [400, 260], 4, 2, 64)
    kv = dict(cu_seqlens_k=cu_k)
    if paged:
        k, v, table, seqused = ref.to_pages(rng, k, v, cu_k, 64)
        kv = dict(page_table=table, seqused_k=seqused)
    out, lse, sel = msa.sparse_attention(q, k, v, cu_q, topk=3, kv_block_size=64,
                                         return_selection=True, **kv, return_lse=True)
    assert sel.shape == (2, 58, 3)
    direct, direct_lse = msa.attention_forward(q, k, v, cu_q, q2k=sel, kv_block_size=64, **kv,
                                               return_lse=True)
    np.testing.assert_array_equal(out, direct)
    np.testing.assert_array_equal(lse, direct_lse)


def test_build_k2q_csr_sizes_rows_from_shapes():
    # total_rows defaults to total_k // blk + B (no host read of the lengths): the rows past the
    # batches' blocks are empty, and attention takes the padded index.
    rng = np.random.default_rng(16)
    q, k, v, cu_q, cu_k = ref.problem(rng, [20, 5], [300, 70], 4, 4, 64)
    q2k = msa.block_topk(q, k, cu_q, cu_seqlens_k=cu_k, topk=2)
    padded = msa.build_k2q_csr(q2k, cu_q, cu_seqlens_k=cu_k, k=k)
    exact = msa.q2k_to_k2q(q2k, cu_q, cu_seqlens_k=cu_k)
    rows = exact.row_ptr.shape[1] - 1
    assert rows == 4 and padded.row_ptr.shape == (4, 370 // 128 + 2 + 1)
    np.testing.assert_array_equal(padded.row_ptr[:, :rows + 1], exact.row_ptr)
    assert (padded.row_ptr[:, rows:] == exact.row_ptr[:, -1:]).all()
    want = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=q2k)
    got = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=q2k, k2q=padded)
    np.testing.assert_array_equal(got, want)
    with pytest.raises(msa.MsaError, match="second dim must be at least total_rows"):
        msa.build_k2q_csr(q2k, cu_q, cu_seqlens_k=cu_k, total_rows=3)


def test_sparse_attention_with_a_caller_workspace():
    rng = np.random.default_rng(17)
    q, k, v, cu_q, cu_k = ref.problem(rng, [40], [300], 4, 2, 64)
    n = msa.pipeline_workspace_bytes(q, k, v, cu_q, cu_seqlens_k=cu_k, topk=3, kv_block_size=64)
    assert n >= 2 * 40 * 3 * 4  # the q2k selection comes first
    ws = np.zeros(n, np.uint8)
    out, sel = msa.sparse_attention(q, k, v, cu_q, cu_seqlens_k=cu_k, topk=3, kv_block_size=64,
                                    workspace=ws, return_selection=True)
    assert np.shares_memory(sel, ws)
    np.testing.assert_array_equal(
        sel, msa.block_topk(q, k, cu_q, cu_seqlens_k=cu_k, topk=3, kv_block_size=64))
    np.testing.assert_array_equal(
        out, msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=sel, kv_block_size=64))
    with pytest.raises(msa.MsaError, match="workspace: needs pipeline_workspace_bytes"):
        msa.sparse_attention(q, k, v, cu_q, cu_seqlens_k=cu_k, topk=3, kv_block_size=64,
                             workspace=ws[:n - 1])
