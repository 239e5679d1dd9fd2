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
        msa.attention_forward(q, k, k, cu, cu_seqlens_k=cu)


def test_unsupported_dtype_names_the_argument():
    q = np.zeros((4, 2, 64), np.float64)
    cu = np.array([0, 4], np.int32)
    with pytest.raises(msa.MsaError, match="attention_forward: q: from_dlpack: unsupported"):
        msa.attention_forward(q, q, q, cu, cu_seqlens_k=cu)


def test_unknown_keyword_and_wrong_type_are_errors():
    with pytest.raises(msa.MsaError, match="unknown keyword argument"):
        _C.check_status(status=np.zeros(4, np.int32), bogus=1)
    with pytest.raises(msa.MsaError, match="stream: expected an int"):
        _C.check_status(status=np.zeros(4, np.int32), stream="x")
    with pytest.raises(msa.MsaError, match="expected a DLPack tensor"):
        _C.check_status(status=[0, 0, 0, 0])


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
        msa.attention_forward(q, q, q, cu, cu_seqlens_k=cu)


def test_strided_inputs():
    rng = np.random.default_rng(40)
    qkv = rng.standard_normal((10, 3, 2, 64)).astype(np.float16)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]  # token stride 3 * 2 * 64: not contiguous
    cu = np.array([0, 10], np.int32)
    out, lse = msa.attention_forward(q, k, v, cu, cu_seqlens_k=cu)
    want, want_lse = msa.attention_forward(*(np.ascontiguousarray(x) for x in (q, k, v)), cu,
                                           cu_seqlens_k=cu)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(lse, want_lse)


def test_flat_cache_needs_lengths():
    q = np.zeros((4, 2, 64), np.float16)
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        msa.attention_forward(q, q, q, np.array([0, 4], np.int32))
