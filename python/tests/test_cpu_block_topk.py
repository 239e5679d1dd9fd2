# CPU (numpy) tests of msa.block_topk, the indexer fused with top-K: the same q2k as
# select_topk(block_scores(...)) over random varlen problems, flat and paged, quantized inputs,
# C++ errors passed through, out=, and sparse_attention's use of it.
import numpy as np
import pytest

import msa
import np_reference as ref


def _unfused(q, k, cu_q, *, num_kv_heads, topk, sink, local, causal, blk, **kv):
    scores = msa.block_scores(q, k, cu_q, causal=causal, kv_block_size=blk, **kv)
    return msa.select_topk(scores, cu_q, num_kv_heads=num_kv_heads, topk=topk, sink_blocks=sink,
                           local_blocks=local, causal=causal, kv_block_size=blk, k=k, **kv)


# (G, topk, sink_blocks, local_blocks, kv_block_size): group sizes 1-16, topk from 1 (a forced
# block only) to more than any query sees, both block sizes.
CASES = [(1, 1, 0, 1, 64), (2, 3, 1, 1, 64), (4, 4, 0, 2, 128), (8, 8, 2, 1, 64),
         (16, 2, 0, 0, 128), (2, 40, 1, 1, 64)]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("case", CASES, ids=[f"G{c[0]}-top{c[1]}-s{c[2]}l{c[3]}-blk{c[4]}"
                                             for c in CASES])
def test_equals_select_topk_of_block_scores(case, causal):
    g, topk, sink, local, blk = case
    rng = np.random.default_rng(100 + 7 * g + topk)
    # Varlen batches: empty queries, empty keys, fewer keys than queries, many blocks.
    lq, lk = [1, 37, 0, 20, 9], [300, 700, 50, 0, 5]
    hkv = 2
    q, k, _, cu_q, cu_k = ref.problem(rng, lq, lk, hkv * g, hkv, 32)
    q2k = msa.block_topk(q, k, cu_q, cu_seqlens_k=cu_k, topk=topk, sink_blocks=sink,
                         local_blocks=local, causal=causal, kv_block_size=blk)
    want = _unfused(q, k, cu_q, num_kv_heads=hkv, topk=topk, sink=sink, local=local,
                    causal=causal, blk=blk, cu_seqlens_k=cu_k)
    assert q2k.dtype == np.int32 and q2k.shape == (hkv, sum(lq), topk)
    np.testing.assert_array_equal(q2k, want)
    # The float64 reference agrees wherever no two blocks tie within f32 rounding (random
    # normal inputs: everywhere in practice).
    scores = ref.block_scores(q.astype(np.float64), ref.split(k, cu_k), cu_q, blk=blk,
                              causal=causal)
    np.testing.assert_array_equal(q2k, ref.select_topk(scores, cu_q, lk, hkv=hkv, topk=topk,
                                                       sink=sink, local=local, blk=blk,
                                                       causal=causal))


@pytest.mark.parametrize("rows", [2, 4])
def test_selection_heads_finer_than_key_heads(rows):
    # The serving geometry: 4 index heads on 1 key head, each its own selection (num_kv_heads=4)
    # or two pairs (2): select_topk with that num_kv_heads on the same scores.
    rng = np.random.default_rng(140 + rows)
    q, k, _, cu_q, cu_k = ref.problem(rng, [1, 37, 0, 20], [300, 700, 50, 0], 4, 1, 32)
    q2k = msa.block_topk(q, k, cu_q, cu_seqlens_k=cu_k, topk=3, kv_block_size=64,
                         num_kv_heads=rows)
    want = _unfused(q, k, cu_q, num_kv_heads=rows, topk=3, sink=1, local=1, causal=True, blk=64,
                    cu_seqlens_k=cu_k)
    assert q2k.shape == (rows, 58, 3)
    np.testing.assert_array_equal(q2k, want)
    with pytest.raises(msa.MsaError, match=r"q2k: its first dim \(selection heads\) must be k's "
                       r"heads \(1\) or divide q's heads \(4\)"):
        msa.block_topk(q, k, cu_q, cu_seqlens_k=cu_k, topk=3, kv_block_size=64, num_kv_heads=3)


@pytest.mark.parametrize("layout", ["paged_nhd", "paged_hnd"])
def test_paged_equals_flat(layout):
    rng = np.random.default_rng(101)
    q, k, v, cu_q, cu_k = ref.problem(rng, [30, 4], [500, 130], 8, 2, 64)
    kp, _, table, seqused = ref.to_pages(rng, k, v, cu_k, 32, layout=layout)
    flat = msa.block_topk(q, k, cu_q, cu_seqlens_k=cu_k, topk=3, kv_block_size=64)
    paged = msa.block_topk(q, kp, cu_q, page_table=table, seqused_k=seqused, kv_layout=layout,
                           topk=3, kv_block_size=64)
    np.testing.assert_array_equal(paged, flat)


@pytest.mark.parametrize("fmt", ["fp8_per_token", "nvfp4"])
def test_quantized_inputs(fmt):
    pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(102)
    q, k, _, cu_q, cu_k = ref.problem(rng, [25, 6], [400, 90], 4, 2, 64, np.float32)
    # A non-default global scale checks that it reaches the C++ op for both q and k.
    gs = 0.5 if fmt == "nvfp4" else 1.0
    qq, kq = msa.quantize(q, fmt, global_scale=gs), msa.quantize(k, fmt, global_scale=gs)
    q2k = msa.block_topk(qq, kq, cu_q, cu_seqlens_k=cu_k, topk=4, kv_block_size=64)
    want = _unfused(qq, kq, cu_q, num_kv_heads=2, topk=4, sink=1, local=1, causal=True, blk=64,
                    cu_seqlens_k=cu_k)
    np.testing.assert_array_equal(q2k, want)


def test_bad_knob_raises_the_cpp_message():
    rng = np.random.default_rng(103)
    q, k, _, cu_q, cu_k = ref.problem(rng, [5], [300], 2, 1, 32)
    with pytest.raises(msa.MsaError,
                       match=r"sink_blocks \+ local_blocks: must be <= topk \(3\), got 2 \+ 2"):
        msa.block_topk(q, k, cu_q, cu_seqlens_k=cu_k, topk=3, sink_blocks=2, local_blocks=2)
    with pytest.raises(msa.MsaError, match="kv_block_size: must be 64 or 128, got 32"):
        msa.block_topk(q, k, cu_q, cu_seqlens_k=cu_k, kv_block_size=32)
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        msa.block_topk(q, k, cu_q)


def test_preallocated_out():
    rng = np.random.default_rng(104)
    q, k, _, cu_q, cu_k = ref.problem(rng, [12, 30], [260, 600], 4, 2, 32)
    want = msa.block_topk(q, k, cu_q, cu_seqlens_k=cu_k, topk=5)
    out = np.full((2, 42, 5), 1234, np.int32)
    got = msa.block_topk(q, k, cu_q, cu_seqlens_k=cu_k, topk=5, out=out)
    assert got is out
    np.testing.assert_array_equal(out, want)
    with pytest.raises(msa.MsaError, match="q2k"):
        msa.block_topk(q, k, cu_q, cu_seqlens_k=cu_k, topk=5, out=np.zeros((2, 42, 4), np.int32))


def test_exported_and_in_the_stub():
    import pathlib
    assert "block_topk" in msa.__all__ and msa.block_topk.__doc__
    stub = pathlib.Path(msa._C.__file__).with_name("_C.pyi")
    if not stub.exists():
        pytest.skip(f"no generated stub next to {msa._C.__file__}")
    assert "def block_topk(" in stub.read_text()


def test_sparse_attention_selects_with_block_topk():
    rng = np.random.default_rng(105)
    q, k, v, cu_q, cu_k = ref.problem(rng, [40, 9], [500, 200], 4, 2, 64)
    out, lse, sel = msa.sparse_attention(q, k, v, cu_q, cu_seqlens_k=cu_k, topk=3,
                                         sink_blocks=1, local_blocks=1, kv_block_size=64,
                                         return_selection=True, return_lse=True)
    want = msa.block_topk(q, k, cu_q, cu_seqlens_k=cu_k, topk=3, kv_block_size=64)
    np.testing.assert_array_equal(sel, want)
    direct, direct_lse = msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, q2k=want,
                                               kv_block_size=64, return_lse=True)
    np.testing.assert_array_equal(out, direct)
    np.testing.assert_array_equal(lse, direct_lse)


def test_sparse_attention_index_with_other_kv_heads_keeps_the_unfused_rule():
    # An indexer with one kv head for attention's two: its query heads are grouped by the
    # attention's kv heads, as select_topk(num_kv_heads=2) does.
    rng = np.random.default_rng(106)
    q, k, v, cu_q, cu_k = ref.problem(rng, [30], [400], 4, 2, 64)
    index_k = k[:, :1].copy()
    _, _, sel = msa.sparse_attention(q, k, v, cu_q, cu_seqlens_k=cu_k, topk=3, kv_block_size=64,
                                     index_k=index_k, return_selection=True, return_lse=True)
    scores = msa.block_scores(q, index_k, cu_q, cu_seqlens_k=cu_k, kv_block_size=64)
    want = msa.select_topk(scores, cu_q, num_kv_heads=2, topk=3, kv_block_size=64,
                           cu_seqlens_k=cu_k)
    np.testing.assert_array_equal(sel, want)


def test_sparse_attention_index_heads_fewer_than_kv_heads_is_an_error():
    # One index head for attention's two kv heads: DESIGN section 13's shared rows are not built.
    rng = np.random.default_rng(107)
    q, k, v, cu_q, cu_k = ref.problem(rng, [30], [400], 4, 2, 64)
    with pytest.raises(msa.MsaError, match="Hi must be a multiple of Hkv"):
        msa.sparse_attention(q, k, v, cu_q, cu_seqlens_k=cu_k, topk=3, kv_block_size=64,
                             index_q=q[:, :1].copy(), index_k=k[:, :1].copy())
