# Property tests (hypothesis) of the selection and attention rules on the CPU, over drawn varlen
# shapes: the fused indexer equals select_topk of block_scores, sparse attention over every
# visible block equals dense attention, a page pool gives what the flat cache gives, and
# token-sparse attention over every key equals dense attention.
import numpy as np
import pytest

import msa
import np_reference as ref

hypothesis = pytest.importorskip("hypothesis", reason="the property tests need hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402

# Few, small examples: the CPU reference is fp64 and CI runs these on every commit.
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True)


@st.composite
def shapes(draw, max_batch=3, max_len=300):
    batch = draw(st.integers(1, max_batch))
    lk = [draw(st.integers(0, max_len)) for _ in range(batch)]
    # Queries: up to the keys plus a few (Lq > Lk is legal: those rows see nothing causally).
    lq = [draw(st.integers(0, min(max_len, k + 3))) for k in lk]
    hkv = draw(st.sampled_from([1, 2]))
    group = draw(st.sampled_from([1, 2, 4, 8, 16]))
    blk = draw(st.sampled_from([64, 128]))
    causal = draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    return lq, lk, hkv, group, blk, causal, seed


@SETTINGS
@given(shapes(), st.integers(1, 8), st.integers(0, 2), st.integers(0, 2))
def test_fused_equals_unfused(shape, topk, sink, local):
    lq, lk, hkv, group, blk, causal, seed = shape
    sink, local = min(sink, topk), min(local, topk - min(sink, topk))
    rng = np.random.default_rng(seed)
    q, k, _, cu_q, cu_k = ref.problem(rng, lq, lk, hkv * group, hkv, 32)
    fused = msa.block_topk(q, k, cu_q, cu_seqlens_k=cu_k, topk=topk, sink_blocks=sink,
                           local_blocks=local, causal=causal, kv_block_size=blk)
    scores = msa.block_scores(q, k, cu_q, cu_seqlens_k=cu_k, causal=causal, kv_block_size=blk)
    unfused = msa.select_topk(scores, cu_q, num_kv_heads=hkv, topk=topk, sink_blocks=sink,
                              local_blocks=local, causal=causal, kv_block_size=blk, k=k,
                              cu_seqlens_k=cu_k)
    np.testing.assert_array_equal(fused, unfused)


def _every_block(lq, lk, hkv, blk):
    """q2k selecting every block of each query's batch, ascending ([Hkv, total_q, max blocks])."""
    nblk = max([(k + blk - 1) // blk for k in lk] + [1])
    rows = []
    for q_len, k_len in zip(lq, lk):
        n = (k_len + blk - 1) // blk
        row = list(range(n)) + [-1] * (nblk - n)
        rows += [row] * q_len
    q2k = np.array(rows, dtype=np.int32).reshape(len(rows), nblk)
    return np.ascontiguousarray(np.broadcast_to(q2k, (hkv,) + q2k.shape))


@SETTINGS
@given(shapes())
def test_sparse_over_every_block_equals_dense(shape):
    lq, lk, hkv, group, blk, causal, seed = shape
    rng = np.random.default_rng(seed)
    q, k, v, cu_q, cu_k = ref.problem(rng, lq, lk, hkv * group, hkv, 32)
    dense, dense_lse = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, causal=causal,
                                             return_lse=True)
    for step in (blk, 1):  # every block, and token-sparse over every key
        q2k = _every_block(lq, lk, hkv, step)
        out, lse = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=q2k,
                                         kv_block_size=step, causal=causal, return_lse=True)
        assert np.array_equal(out.view(np.uint16), dense.view(np.uint16))
        assert np.array_equal(lse, dense_lse)


@SETTINGS
@given(shapes(), st.sampled_from([16, 32, 64]), st.sampled_from(["paged_nhd", "paged_hnd"]))
def test_paged_equals_flat(shape, page_size, layout):
    lq, lk, hkv, group, blk, causal, seed = shape
    rng = np.random.default_rng(seed)
    q, k, v, cu_q, cu_k = ref.problem(rng, lq, lk, hkv * group, hkv, 32)
    kp, vp, table, seqused = ref.to_pages(rng, k, v, cu_k, page_size, layout)
    flat, flat_lse = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, causal=causal,
                                           return_lse=True)
    out, lse = msa.attention_forward(q, kp, vp, cu_q, page_table=table, seqused_k=seqused,
                                     kv_layout=layout, causal=causal, return_lse=True)
    assert np.array_equal(out.view(np.uint16), flat.view(np.uint16))
    assert np.array_equal(lse, flat_lse)
    flat_ids = msa.block_topk(q, k, cu_q, cu_seqlens_k=cu_k, topk=3, causal=causal,
                              kv_block_size=blk)
    paged_ids = msa.block_topk(q, kp, cu_q, page_table=table, seqused_k=seqused,
                               kv_layout=layout, topk=3, causal=causal, kv_block_size=blk)
    np.testing.assert_array_equal(paged_ids, flat_ids)
