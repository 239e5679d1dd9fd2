# CPU tests of the binding plumbing: import and build info, C++ errors as msa.MsaError with the
# same message, keyword and dtype checks, strided views, numpy allocation rules.
from importlib.metadata import version

import numpy as np
import pytest

import msa
from msa import _C


def test_import_and_build_info():
    assert msa.__version__ == version("msa-attention")  # kVersion is the wheel's version too
    assert isinstance(msa.built_with_cuda(), bool)
    assert msa.cuda_device_count() >= 0
    assert issubclass(msa.MsaError, RuntimeError)


def test_cpp_error_message_reaches_python():
    q = np.zeros((4, 3, 64), np.float16)
    k = np.zeros((4, 2, 64), np.float16)
    cu = np.array([0, 4], np.int32)
    with pytest.raises(msa.MsaError, match=r"k: kv heads \(2\) must divide q heads \(3\)"):
        msa.attention_forward(q, k, k, cu, cu_seqlens_k=cu, return_lse=True)


def test_unsupported_dtype_names_the_argument():
    q = np.zeros((4, 2, 64), np.float64)
    cu = np.array([0, 4], np.int32)
    with pytest.raises(msa.MsaError, match="attention_forward: q: from_dlpack: unsupported"):
        msa.attention_forward(q, q, q, cu, cu_seqlens_k=cu, return_lse=True)


def test_unknown_keyword_and_wrong_type_are_errors():
    with pytest.raises(msa.MsaError, match="unknown keyword argument"):
        _C.check_status(status=np.zeros(4, np.int32), bogus=1)
    with pytest.raises(msa.MsaError, match="stream: expected an int"):
        _C.check_status(status=np.zeros(4, np.int32), stream="x")
    with pytest.raises(msa.MsaError, match="expected a DLPack tensor"):
        _C.check_status(status=[0, 0, 0, 0])


# The ops take their arguments as keywords or as one positional dict (the Python layer's hot
# paths pass one), never both, and every other shape of call is an error naming the op.
def test_ops_take_keywords_or_one_dict():
    st = np.zeros(4, np.int32)
    _C.check_status({"status": st})
    _C.check_status(status=st)
    with pytest.raises(msa.MsaError, match="unknown keyword argument"):
        _C.check_status({"status": st, "bogus": 1})
    for bad in (lambda: _C.check_status({"status": st}, stream=0),
                lambda: _C.check_status({"status": st}, {}),
                lambda: _C.check_status(st)):
        with pytest.raises(msa.MsaError, match="check_status: takes keyword arguments, or one dict"):
            bad()
    plan = _C.DecodePlan()
    with pytest.raises(msa.MsaError, match="DecodePlan.run: takes keyword arguments, or one dict"):
        plan.run(st)


def test_status_buffer_check():
    msa.check_status(np.zeros(4, np.int32))
    with pytest.raises(msa.MsaError, match=r"page id 9 out of range .* \(batch 1, column 2\)"):
        msa.check_status(np.array([3, 1, 2, 9], np.int32))


def test_typed_checks_storage_width():
    with pytest.raises(ValueError, match="unknown dtype"):
        msa.typed(np.zeros(2, np.uint16), "bfloat16")
    q = msa.typed(np.zeros((4, 2, 64), np.uint8), "bf16")
    cu = np.array([0, 4], np.int32)
    with pytest.raises(ValueError, match="16-bit"):
        msa.attention_forward(q, q, q, cu, cu_seqlens_k=cu, return_lse=True)


def test_strided_inputs():
    rng = np.random.default_rng(40)
    qkv = rng.standard_normal((10, 3, 2, 64)).astype(np.float16)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]  # token stride 3 * 2 * 64: not contiguous
    cu = np.array([0, 10], np.int32)
    out, lse = msa.attention_forward(q, k, v, cu, cu_seqlens_k=cu, return_lse=True)
    want, want_lse = msa.attention_forward(*(np.ascontiguousarray(x) for x in (q, k, v)), cu,
                                           cu_seqlens_k=cu, return_lse=True)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(lse, want_lse)


def test_flat_cache_needs_lengths():
    q = np.zeros((4, 2, 64), np.float16)
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        msa.attention_forward(q, q, q, np.array([0, 4], np.int32), return_lse=True)


def test_return_lse_flag_and_temperature():
    rng = np.random.default_rng(41)
    q = rng.standard_normal((6, 2, 64)).astype(np.float16)
    cu = np.array([0, 6], np.int32)
    out = msa.attention_forward(q, q, q, cu, cu_seqlens_k=cu)
    assert isinstance(out, np.ndarray) and out.shape == q.shape
    both = msa.attention_forward(q, q, q, cu, cu_seqlens_k=cu, return_lse=True)
    np.testing.assert_array_equal(both[0], out)
    assert both[1].shape == (2, 6)
    out_t, tlse = msa.attention_forward(q, q, q, cu, cu_seqlens_k=cu, temperature=2.0)
    np.testing.assert_array_equal(out_t, out)
    assert tlse.shape == (2, 6)


def test_inputs_with_too_many_dims_name_the_argument():
    q = np.zeros((1, 4, 2, 64), np.float16)  # batched [B, S, H, D]
    cu = np.array([0, 4], np.int32)
    with pytest.raises(msa.MsaError, match=r"q: must be \[total_q, Hq, D\] \(3 dims\), got 4"):
        msa.attention_forward(q, q[0], q[0], cu, cu_seqlens_k=cu)
    with pytest.raises(msa.MsaError, match=r"q: must be \[total_q, Hq, D\] \(3 dims\), got 4"):
        msa.sparse_attention(q, q[0], q[0], cu, cu_seqlens_k=cu)
    with pytest.raises(msa.MsaError, match=r"q: must be \[total_q, Hq, D\]"):
        msa.block_topk(q, q[0], cu, cu_seqlens_k=cu)
    with pytest.raises(msa.MsaError, match=r"k: must be a 3-d \[total_k, Hkv, D\]|k: "):
        msa.attention_forward(q[0], q, q, cu, cu_seqlens_k=cu)


def test_integers_past_32_bits_are_errors_not_truncated():
    rng = np.random.default_rng(42)
    q = rng.standard_normal((4, 2, 64)).astype(np.float16)
    cu = np.array([0, 4], np.int32)
    with pytest.raises(msa.MsaError, match="kv_block_size: 4294967360 does not fit a 32-bit int"):
        msa.attention_forward(q, q, q, cu, cu_seqlens_k=cu, kv_block_size=2**32 + 64)
    with pytest.raises(msa.MsaError, match="topk: 4294967298 does not fit"):
        msa.block_topk(q, q, cu, cu_seqlens_k=cu, topk=2**32 + 2, kv_block_size=64,
                       out=np.zeros((2, 4, 2), np.int32))
    with pytest.raises(msa.MsaError, match="batch: 4294967299 does not fit"):
        msa.DecodePlan().plan(batch=2**32 + 3, num_q_heads=2, num_kv_heads=2, page_size=16,
                              max_pages=1)


def test_partial_dtype_is_checked():
    q = np.zeros((4, 2, 64), np.float16)
    cu = np.array([0, 4], np.int32)
    with pytest.raises(msa.MsaError, match="partial_dtype: must be 'f32', 'bf16' or None"):
        msa.attention_forward(q, q, q, cu, cu_seqlens_k=cu, partial_dtype="f16")
