# CPU tests of the inputs at the edge of what msa takes: legal empty arrays (numpy 2 gives them
# zero strides) run, and malformed ones raise msa.MsaError naming the argument and the rule
# before anything is allocated or written.
import numpy as np
import pytest

import msa

HQ, HKV, D = 4, 2, 16


def _qkv(total_q, total_k, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((total_q, HQ, D)).astype(np.float16),
            rng.standard_normal((total_k, HKV, D)).astype(np.float16),
            rng.standard_normal((total_k, HKV, D)).astype(np.float16))


def _cu(*lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


# ---------------------------------- empty inputs ----------------------------------

def test_numpy_gives_empty_arrays_zero_strides():
    # What the tests below rely on: the rule they exercise only bites with zero strides.
    assert np.empty((0, HQ, D), np.float16).strides == (0, 0, 0)


def test_attention_without_queries():
    q, k, v = _qkv(0, 40)
    out, lse = msa.attention_forward(q, k, v, _cu(0), cu_seqlens_k=_cu(40), return_lse=True)
    assert out.shape == (0, HQ, D) and lse.shape == (HQ, 0)
    q2k = np.empty((HKV, 0, 2), np.int32)
    out = msa.attention_forward(q, k, v, _cu(0), cu_seqlens_k=_cu(40), q2k=q2k)
    assert out.shape == (0, HQ, D)


def test_attention_without_keys():
    q, k, v = _qkv(5, 0)
    out, lse = msa.attention_forward(q, k, v, _cu(3, 2), cu_seqlens_k=_cu(0, 0), return_lse=True)
    assert not out.astype(np.float32).any()  # no key: out 0, lse -inf
    assert (lse == -np.inf).all()


def test_attention_without_requests():
    q, k, v = _qkv(0, 0)
    out = msa.attention_forward(q, k, v, _cu(), cu_seqlens_k=_cu(), temperature=0.5)
    assert out[0].shape == (0, HQ, D)


@pytest.mark.parametrize("batch", [0, 2])
def test_decode_idle_batch(batch):
    # A decode step in which no request has a query (B = 2, total_q = 0) or there is no request.
    pool = np.zeros((4, 16, HKV, D), np.float16)
    page_table = np.arange(batch * 2, dtype=np.int32).reshape(batch, 2)
    seqused_k = np.full(batch, 20, np.int32)
    plan = msa.DecodePlan().plan(batch=batch, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D,
                                 page_size=16, max_pages=2, kv_dtype="f16", seqused_k=seqused_k)
    q = np.empty((0, HQ, D), np.float16)
    out = plan.run(q, pool, pool, page_table, np.zeros(batch + 1, np.int32), seqused_k=seqused_k)
    assert out.shape == (0, HQ, D)


def test_block_scores_and_selection_without_queries():
    q, k, _ = _qkv(0, 300)
    scores = msa.block_scores(q, k, _cu(0), cu_seqlens_k=_cu(300))
    assert scores.shape == (HQ, 3, 0)
    q2k = msa.select_topk(scores, _cu(0), num_kv_heads=HKV, topk=2, cu_seqlens_k=_cu(300))
    assert q2k.shape == (HKV, 0, 2)
    q2k = msa.block_topk(q, k, _cu(0), cu_seqlens_k=_cu(300), topk=2)
    assert q2k.shape == (HKV, 0, 2)


@pytest.mark.parametrize("fmt", ["fp8_per_token", "fp8_per_token_head", "nvfp4", "mxfp4"])
def test_quantize_empty(fmt):
    x = np.empty((0, HQ, 32), np.float32)
    qx = msa.quantize(x, fmt)
    assert msa.dequantize(qx).shape == (0, HQ, 32)
