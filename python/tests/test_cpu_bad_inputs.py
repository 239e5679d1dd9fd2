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


# ---------------------------------- read-only outputs ----------------------------------

def _read_only(shape, dtype):
    """A zeroed read-only numpy array; the second kind shares the memory of a bytes object."""
    a = np.zeros(shape, dtype)
    a.setflags(write=False)
    return a


def _from_bytes(shape, dtype):
    return np.frombuffer(bytes(int(np.prod(shape)) * np.dtype(dtype).itemsize),
                         dtype).reshape(shape)


READ_ONLY = [_read_only, _from_bytes]


def _refuses(make, key, shape, dtype, call):
    """call(array) with a read-only `make` array in place of output `key` must raise naming
    `key`, leaving the array untouched."""
    arr = make(shape, dtype)
    with pytest.raises(msa.MsaError,
                       match=rf"{key}: must be writable \(a read-only array was given\)"):
        call(arr)
    assert not arr.any()


@pytest.mark.parametrize("make", READ_ONLY)
def test_attention_refuses_read_only_outputs(make):
    q, k, v = _qkv(6, 6)
    cu = _cu(6)

    def attend(**out):
        return msa.attention_forward(q, k, v, cu, cu_seqlens_k=cu, return_lse=True,
                                     temperature=0.5, **out)
    _refuses(make, "out", (6, HQ, D), np.float16, lambda a: attend(out=a))
    _refuses(make, "lse", (HQ, 6), np.float32, lambda a: attend(lse=a))
    _refuses(make, "tlse", (HQ, 6), np.float32, lambda a: attend(tlse=a))

    def pipeline(**out):
        return msa.sparse_attention(q, k, v, cu, cu_seqlens_k=cu, topk=1, local_blocks=0,
                                    return_lse=True, **out)
    _refuses(make, "out", (6, HQ, D), np.float16, lambda a: pipeline(out=a))
    _refuses(make, "lse", (HQ, 6), np.float32, lambda a: pipeline(lse=a))
    # On the CPU the pipeline's workspace holds its q2k selection: it is written too.
    nbytes = msa.pipeline_workspace_bytes(q, k, v, cu, cu_seqlens_k=cu, topk=1, local_blocks=0)
    _refuses(make, "workspace", (nbytes,), np.uint8, lambda a: pipeline(workspace=a))


@pytest.mark.parametrize("make", READ_ONLY)
def test_decode_refuses_read_only_outputs(make):
    pool = np.ones((2, 16, HKV, D), np.float16)
    page_table = np.array([[0, 1]], np.int32)
    plan = msa.DecodePlan().plan(batch=1, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D,
                                 page_size=16, max_pages=2, kv_dtype="f16")
    q = np.ones((1, HQ, D), np.float16)

    def run(**out):
        return plan.run(q, pool, pool, page_table, _cu(1), return_lse=True, **out)
    _refuses(make, "out", (1, HQ, D), np.float16, lambda a: run(out=a))
    _refuses(make, "lse", (HQ, 1), np.float32, lambda a: run(lse=a))


@pytest.mark.parametrize("make", READ_ONLY)
def test_indexer_and_csr_refuse_read_only_outputs(make):
    q, k, _ = _qkv(8, 300)
    cu_q, cu_k = _cu(8), _cu(300)
    _refuses(make, "scores", (HQ, 3, 8), np.float32,
             lambda a: msa.block_scores(q, k, cu_q, cu_seqlens_k=cu_k, out=a))
    _refuses(make, "q2k", (HKV, 8, 2), np.int32,
             lambda a: msa.block_topk(q, k, cu_q, cu_seqlens_k=cu_k, topk=2, out=a))
    scores = msa.block_scores(q, k, cu_q, cu_seqlens_k=cu_k)
    _refuses(make, "q2k", (HKV, 8, 2), np.int32,
             lambda a: msa.select_topk(scores, cu_q, num_kv_heads=HKV, topk=2,
                                       cu_seqlens_k=cu_k, out=a))
    q2k = msa.select_topk(scores, cu_q, num_kv_heads=HKV, topk=2, cu_seqlens_k=cu_k)
    full = msa.build_k2q_csr(q2k, cu_q, cu_seqlens_k=cu_k, k=k)
    for i, key in enumerate(("row_ptr", "q_idx", "schedule")):
        def build(a, i=i):
            out = [np.empty_like(x) for x in full]
            out[i] = a
            return msa.build_k2q_csr(q2k, cu_q, cu_seqlens_k=cu_k, k=k, out=out)
        _refuses(make, key, full[i].shape, np.int32, build)


@pytest.mark.parametrize("make", READ_ONLY)
def test_quant_refuses_read_only_outputs(make):
    x = np.ones((3, HQ, 32), np.float32)
    _refuses(make, "out", (3, HQ, 32), np.uint8,
             lambda a: msa.quantize(x, "fp8_per_token", out=(a, np.empty(3, np.float32))))
    _refuses(make, "out_scale", (3,), np.float32,
             lambda a: msa.quantize(x, "fp8_per_token", out=(np.empty(x.shape, np.uint8), a)))
    qx = msa.quantize(x, "fp8_per_token")
    _refuses(make, "out", (3, HQ, 32), np.float32, lambda a: msa.dequantize(qx, out=a))


@pytest.mark.parametrize("make", READ_ONLY)
def test_logits_refuse_read_only_outputs(make):
    q = msa.typed(np.zeros((4, 2, 32), np.uint16), "bf16")
    k = msa.typed(np.zeros((6, 32), np.uint16), "bf16")
    weights = np.ones((4, 2), np.float32)
    ks, ke = np.zeros(4, np.int32), np.full(4, 6, np.int32)
    _refuses(make, "logits", (4, 6), np.float32,
             lambda a: msa.mqa_logits(q, k, weights, ks, ke, out=a))
    _refuses(make, "ids", (4, 2), np.int32,
             lambda a: msa.token_topk(np.ones((4, 6), np.float32), 2, out=a))
    q8 = msa.typed(np.zeros((1, 1, 2, 128), np.uint8), "fp8_e4m3")
    pool = np.zeros((2, 16, 1, 132), np.uint8)
    _refuses(make, "logits", (1, 32), np.float32,
             lambda a: msa.paged_mqa_logits(q8, pool, np.ones((1, 2), np.float32),
                                            np.array([[0, 1]], np.int32),
                                            np.array([20], np.int32), 32, out=a))


def test_read_only_inputs_are_fine():
    q, k, v = _qkv(6, 6)
    cu = _cu(6)
    for a in (q, k, v, cu):
        a.setflags(write=False)
    out = msa.attention_forward(q, k, v, cu, cu_seqlens_k=cu)
    assert out.shape == (6, HQ, D)


# ---------------------------------- integer arguments ----------------------------------
# A Python int past what msa's C++ field holds is an error naming it, never truncated to its low
# 32 bits (2**32 + 64 would otherwise run as 64).

def _index_problem():
    q, k, v = _qkv(8, 300)
    return q, k, v, _cu(8), _cu(300)


@pytest.mark.parametrize("op", ["attention_forward", "block_scores", "block_topk", "select_topk",
                                "build_k2q_csr", "q2k_to_k2q", "sparse_attention"])
def test_kv_block_size_past_32_bits(op):
    q, k, v, cu_q, cu_k = _index_problem()
    big = 2**32 + 64
    calls = {
        "attention_forward": lambda: msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k,
                                                           kv_block_size=big),
        "block_scores": lambda: msa.block_scores(q, k, cu_q, cu_seqlens_k=cu_k,
                                                 kv_block_size=big),
        "block_topk": lambda: msa.block_topk(q, k, cu_q, cu_seqlens_k=cu_k, kv_block_size=big),
        "select_topk": lambda: msa.select_topk(np.zeros((HQ, 3, 8), np.float32), cu_q,
                                               num_kv_heads=HKV, topk=2, cu_seqlens_k=cu_k,
                                               kv_block_size=big),
        "build_k2q_csr": lambda: msa.build_k2q_csr(np.zeros((HKV, 8, 2), np.int32), cu_q,
                                                   cu_seqlens_k=cu_k, k=k, kv_block_size=big),
        "q2k_to_k2q": lambda: msa.q2k_to_k2q(np.zeros((HKV, 8, 2), np.int32), cu_q,
                                             cu_seqlens_k=cu_k, kv_block_size=big),
        "sparse_attention": lambda: msa.sparse_attention(q, k, v, cu_q, cu_seqlens_k=cu_k,
                                                         kv_block_size=big),
    }
    with pytest.raises(msa.MsaError, match="kv_block_size: 4294967360 does not fit a 32-bit int"):
        calls[op]()


def test_topk_past_32_bits():
    q, k, v, cu_q, cu_k = _index_problem()
    big = 2**32 + 2
    scores = np.zeros((HQ, 3, 8), np.float32)
    k2q = msa.q2k_to_k2q(np.full((HKV, 8, 2), -1, np.int32), cu_q, cu_seqlens_k=cu_k)
    for call in (lambda: msa.block_topk(q, k, cu_q, cu_seqlens_k=cu_k, topk=big),
                 lambda: msa.select_topk(scores, cu_q, num_kv_heads=HKV, topk=big,
                                         cu_seqlens_k=cu_k),
                 lambda: msa.sparse_attention(q, k, v, cu_q, cu_seqlens_k=cu_k, topk=big),
                 lambda: msa.k2q_to_q2k(k2q, cu_q, topk=big, cu_seqlens_k=cu_k),
                 lambda: msa.token_topk(np.zeros((4, 8), np.float32), big)):
        with pytest.raises(msa.MsaError, match="topk: 4294967298 does not fit a 32-bit int"):
            call()


def test_decode_plan_integers_past_32_bits():
    shape = dict(batch=2, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, page_size=16,
                 max_pages=4)
    for key, big in (("batch", 2**32 + 3), ("max_pages", 2**32), ("topk", 2**32 + 2),
                     ("batch", 2**70)):
        with pytest.raises(msa.MsaError, match=rf"{key}: {big} does not fit a 32-bit int"):
            msa.DecodePlan().plan(**{**shape, key: big})
    with pytest.raises(msa.MsaError, match="batch: expected an int, got float"):
        msa.DecodePlan().plan(**{**shape, "batch": 2.0})
    assert msa.DecodePlan().plan(**{**shape, "batch": np.int64(2)}).planned  # numpy ints are ints


def test_other_integers_past_their_range():
    q, k, v, cu_q, cu_k = _index_problem()
    with pytest.raises(msa.MsaError, match="total_rows: 1099511627776 does not fit a 32-bit int"):
        msa.build_k2q_csr(np.zeros((HKV, 8, 2), np.int32), cu_q, cu_seqlens_k=cu_k,
                          total_rows=2**40)
    with pytest.raises(msa.MsaError, match="max_seqlen_k: 4294967296 does not fit a 32-bit int"):
        msa.block_scores(q, k, cu_q, cu_seqlens_k=cu_k, max_seqlen_k=2**32)
    q8 = msa.typed(np.zeros((1, 1, 2, 128), np.uint8), "fp8_e4m3")
    with pytest.raises(msa.MsaError, match=r"max_seq_len: 9223372036854775808 does not fit a "
                                           r"64-bit int"):
        msa.paged_mqa_logits(q8, np.zeros((2, 16, 1, 132), np.uint8), np.ones((1, 2), np.float32),
                             np.array([[0, 1]], np.int32), np.array([20], np.int32), 2**63)


def test_integers_of_other_types():
    q, k, v, cu_q, cu_k = _index_problem()
    with pytest.raises(msa.MsaError, match="kv_block_size: expected an int, got float"):
        msa.block_scores(q, k, cu_q, cu_seqlens_k=cu_k, kv_block_size=128.0)
    with pytest.raises(msa.MsaError, match="topk: expected an int, got str"):
        msa.block_topk(q, k, cu_q, cu_seqlens_k=cu_k, topk="4")
    # numpy integers are ints.
    q2k = msa.block_topk(q, k, cu_q, cu_seqlens_k=cu_k, topk=np.int64(2),
                         kv_block_size=np.int32(128))
    assert q2k.shape == (HKV, 8, 2)


# ---------------------------------- malformed inputs ----------------------------------
# Each raises msa.MsaError naming the argument and the rule, before the Python layer unpacks,
# divides or allocates anything with it (never ValueError, ZeroDivisionError, KeyError,
# AttributeError or MemoryError from the plumbing).

def test_q_of_the_wrong_rank():
    q, k, v, cu_q, cu_k = _index_problem()
    for bad in (q[:, 0], q[None]):
        n = bad.ndim
        for call in (lambda: msa.attention_forward(bad, k, v, cu_q, cu_seqlens_k=cu_k),
                     lambda: msa.attention_workspace_bytes(bad, k, v, cu_q, cu_seqlens_k=cu_k),
                     lambda: msa.sparse_attention(bad, k, v, cu_q, cu_seqlens_k=cu_k),
                     lambda: msa.block_scores(bad, k, cu_q, cu_seqlens_k=cu_k),
                     lambda: msa.block_topk(bad, k, cu_q, cu_seqlens_k=cu_k)):
            with pytest.raises(msa.MsaError, match=rf"q: must be \[total_q, Hq, D\] \(3 dims\), "
                                                   rf"got {n} dims"):
                call()
    with pytest.raises(msa.MsaError, match=r"x: must be \[T, H, D\] \(3 dims\), got 2 dims"):
        msa.quantize(q[:, 0].astype(np.float32), "fp8_per_token")
    with pytest.raises(msa.MsaError, match=r"x: must be \[T, H, D\] \(3 dims\), got 0 dims"):
        msa.dequantize(np.zeros((), np.uint8), np.zeros(1, np.float32), format="fp8_per_tensor")
    with pytest.raises(msa.MsaError, match=r"scores: must be \[Hq, nblk_max, total_q\]"):
        msa.select_topk(np.zeros((HQ, 8), np.float32), cu_q, num_kv_heads=HKV, topk=2,
                        cu_seqlens_k=cu_k)
    with pytest.raises(msa.MsaError, match=r"q2k: must be \[Hkv, total_q, topk\]"):
        msa.build_k2q_csr(np.zeros((HKV, 8), np.int32), cu_q, cu_seqlens_k=cu_k, k=k)


def test_kv_of_the_wrong_rank():
    q, k, _, cu_q, _ = _index_problem()
    pool = np.zeros((4, 128, HKV, D), np.float16)
    page_table = np.zeros((1, 3), np.int32)
    with pytest.raises(msa.MsaError, match=r"page_table: must be \[B, max_pages\] \(2 dims\), "
                                           r"got 1 dims"):
        msa.block_scores(q, pool, cu_q, page_table=page_table[0])
    with pytest.raises(msa.MsaError, match=r"k: must be a page pool .* \(4 dims\), got 3 dims"):
        msa.block_scores(q, k, cu_q, page_table=page_table)
    with pytest.raises(msa.MsaError, match=r"k: must be a page pool .* \(4 dims\), got 3 dims"):
        msa.build_k2q_csr(np.zeros((HKV, 8, 2), np.int32), cu_q, page_table=page_table, k=k)
    with pytest.raises(msa.MsaError, match=r"cu_seqlens_k: must be \[B\+1\] \(1 dims\), got 2"):
        msa.block_scores(q, k, cu_q, cu_seqlens_k=np.zeros((2, 2), np.int32))


def test_kv_block_size_zero():
    q, k, _, cu_q, cu_k = _index_problem()
    q2k = np.zeros((HKV, 8, 2), np.int32)
    for call in (lambda: msa.block_scores(q, k, cu_q, cu_seqlens_k=cu_k, kv_block_size=0),
                 lambda: msa.build_k2q_csr(q2k, cu_q, cu_seqlens_k=cu_k, kv_block_size=0),
                 lambda: msa.build_k2q_csr(q2k, cu_q, cu_seqlens_k=cu_k, k=k, kv_block_size=0),
                 lambda: msa.q2k_to_k2q(q2k, cu_q, cu_seqlens_k=cu_k, kv_block_size=0)):
        with pytest.raises(msa.MsaError, match="kv_block_size: must be >= 1, got 0"):
            call()


def test_negative_sizes():
    q, k, _, cu_q, cu_k = _index_problem()
    scores = np.zeros((HQ, 3, 8), np.float32)
    k2q = msa.q2k_to_k2q(np.full((HKV, 8, 2), -1, np.int32), cu_q, cu_seqlens_k=cu_k)
    for key, call in (
            ("topk", lambda: msa.block_topk(q, k, cu_q, cu_seqlens_k=cu_k, topk=-1)),
            ("topk", lambda: msa.select_topk(scores, cu_q, num_kv_heads=HKV, topk=-1,
                                             cu_seqlens_k=cu_k)),
            ("topk", lambda: msa.token_topk(np.zeros((4, 8), np.float32), -1)),
            ("topk", lambda: msa.k2q_to_q2k(k2q, cu_q, topk=-1, cu_seqlens_k=cu_k)),
            ("num_kv_heads", lambda: msa.select_topk(scores, cu_q, num_kv_heads=-1, topk=2,
                                                     cu_seqlens_k=cu_k))):
        with pytest.raises(msa.MsaError, match=rf"{key}: must be >= 1, got -1"):
            call()
    with pytest.raises(msa.MsaError, match="total_rows: must be >= 0, got -5"):
        msa.build_k2q_csr(np.zeros((HKV, 8, 2), np.int32), cu_q, cu_seqlens_k=cu_k,
                          total_rows=-5)
    with pytest.raises(msa.MsaError, match="max_seqlen_k: must be >= 0, got -1"):
        msa.block_scores(q, k, cu_q, cu_seqlens_k=cu_k, max_seqlen_k=-1)
    q8 = msa.typed(np.zeros((1, 1, 2, 128), np.uint8), "fp8_e4m3")
    with pytest.raises(msa.MsaError, match="max_seq_len: must be >= 0, got -1"):
        msa.paged_mqa_logits(q8, np.zeros((2, 16, 1, 132), np.uint8), np.ones((1, 2), np.float32),
                             np.array([[0, 1]], np.int32), np.array([20], np.int32), -1)


def test_unsupported_dtype_name():
    qx = msa.quantize(np.ones((2, HQ, 32), np.float32), "fp8_per_token")
    with pytest.raises(msa.MsaError, match="dtype: must be 'f32', 'bf16' or 'f16', got 'f64'"):
        msa.dequantize(qx, dtype="f64")
    with pytest.raises(msa.MsaError, match="dtype: must be 'f32', 'bf16' or 'f16', got 'f64'"):
        msa.dequantize(qx, dtype="f64", out=np.zeros((2, HQ, 32), np.uint16))
    with pytest.raises(ValueError, match="format: must be one of"):
        msa.dequantize(qx.values, qx.scale, format="fp8")


def test_python_lists_are_not_arrays():
    q, k, v, cu_q, cu_k = _index_problem()
    for key, call in (
            ("q", lambda: msa.attention_forward(q.tolist(), k, v, cu_q, cu_seqlens_k=cu_k)),
            ("cu_seqlens_q", lambda: msa.attention_forward(q, k, v, [0, 8], cu_seqlens_k=cu_k)),
            ("cu_seqlens_k", lambda: msa.block_scores(q, k, cu_q, cu_seqlens_k=[0, 300])),
            ("k", lambda: msa.block_topk(q, k.tolist(), cu_q, cu_seqlens_k=cu_k)),
            ("scores", lambda: msa.select_topk([[[0.0]]], cu_q, num_kv_heads=HKV, topk=2,
                                               cu_seqlens_k=cu_k)),
            ("q2k", lambda: msa.build_k2q_csr([[[0]]], cu_q, cu_seqlens_k=cu_k)),
            (r"k2q\[0\]", lambda: msa.k2q_to_q2k([[0], [0]], cu_q, topk=2, cu_seqlens_k=cu_k)),
            ("x", lambda: msa.quantize([[[1.0]]], "fp8_per_token")),
            ("logits", lambda: msa.token_topk([[1.0, 2.0]], 1)),
            ("status", lambda: msa.check_status([0, 0, 0, 0])),
            ("seqused_k", lambda: msa.DecodePlan().plan(batch=1, num_q_heads=HQ,
                                                        num_kv_heads=HKV, head_dim=D,
                                                        page_size=16, max_pages=2,
                                                        seqused_k=[5]))):
        with pytest.raises(msa.MsaError, match=rf"{key}: expected an array .*, got list"):
            call()
    with pytest.raises(msa.MsaError, match=r"k2q: must be a sequence \(row_ptr, q_idx"):
        msa.attention_forward(q, k, v, cu_q, cu_seqlens_k=cu_k, k2q=np.zeros(3, np.int32))


def test_outputs_too_large_to_allocate():
    # 2 * 65536 * 10**9 int32 ids (524 TB): beyond any address space, so the allocation fails
    # whatever the memory overcommit policy; msa names the argument that sized it.
    q = np.zeros((65536, HQ, D), np.float16)
    k = np.zeros((300, HKV, D), np.float16)
    cu_q, cu_k = _cu(65536), _cu(300)
    with pytest.raises(msa.MsaError, match=r"q2k: cannot allocate i32\[2, 65536, 1000000000\] "
                                           r"for topk = 1000000000"):
        msa.block_topk(q, k, cu_q, cu_seqlens_k=cu_k, topk=10**9)
    scores = np.zeros((HQ, 3, 65536), np.float32)
    with pytest.raises(msa.MsaError, match=r"q2k: cannot allocate .* for num_kv_heads = 2, "
                                           r"topk = 1000000000"):
        msa.select_topk(scores, cu_q, num_kv_heads=HKV, topk=10**9, cu_seqlens_k=cu_k)
