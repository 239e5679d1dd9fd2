# CPU (numpy) tests of msa.quantize / msa.dequantize: output shapes and dtypes per format, exact
# round trips on representable values, and uint8 storage typed by `format`.
import numpy as np
import pytest

import msa

ml_dtypes = pytest.importorskip("ml_dtypes")

SHAPES = {"fp8_per_tensor": (1,), "fp8_per_token": (6,), "fp8_per_token_head": (6, 2),
          "nvfp4": (6, 2, 4), "mxfp4": (6, 2, 2)}


@pytest.mark.parametrize("fmt", sorted(SHAPES))
def test_shapes_and_round_trip(fmt):
    rng = np.random.default_rng(30)
    x = rng.standard_normal((6, 2, 64)).astype(np.float32)
    qt = msa.quantize(x, fmt, global_scale=0.5 if fmt == "nvfp4" else 1.0)
    assert qt.format == fmt and qt.scale.shape == SHAPES[fmt]
    fp4 = fmt.endswith("fp4")
    assert qt.values.shape == ((6, 2, 32) if fp4 else (6, 2, 64))
    y = msa.dequantize(qt)
    assert y.shape == x.shape and y.dtype == np.float32
    assert np.abs(y - x).max() <= (0.6 if fp4 else 0.07) * np.abs(x).max()
    # Dequantized values are representable: quantizing them again gives the same bits.
    again = msa.quantize(y, fmt, global_scale=qt.global_scale)
    np.testing.assert_array_equal(msa.dequantize(again), y)


def test_uint8_storage_typed_by_format():
    rng = np.random.default_rng(31)
    x = rng.standard_normal((3, 1, 32)).astype(np.float32)
    qt = msa.quantize(x, "mxfp4")
    values = qt.values.view(np.uint8)
    scale = qt.scale.view(np.uint8)
    y = msa.dequantize(values, scale, format="mxfp4", dtype="bf16")
    assert y.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(y.astype(np.float32),
                                  msa.dequantize(qt).astype(ml_dtypes.bfloat16).astype(np.float32))


def test_bad_format_and_preallocated_out():
    x = np.ones((2, 1, 16), np.float32)
    with pytest.raises(ValueError, match="format"):
        msa.quantize(x, "int4")
    values = np.zeros((2, 1, 16), np.uint8)
    scale = np.zeros((2,), np.float32)
    qt = msa.quantize(x, "fp8_per_token", out=(values, scale))
    assert qt.values is values and (scale == 1 / 448).all()


def test_nvfp4_of_sixteen_values_a_row():
    """D = 16 gives 8-byte FP4 rows: msa.quantize allocates them and the CPU quantizes into them
    (16-byte rows are a CUDA rule only)."""
    x = np.random.default_rng(3).standard_normal((3, 2, 16)).astype(np.float32)
    qt = msa.quantize(x, "nvfp4")
    assert qt.values.shape == (3, 2, 8) and qt.scale.shape == (3, 2, 1)
    back = msa.dequantize(qt)
    # Within half an e2m1 step (at most 1 of 6) of the block scale, itself rounded to e4m3.
    assert np.all(np.abs(back - x) <= np.abs(x).max(axis=2, keepdims=True) / 5)


def test_dequantize_out_sets_the_dtype_and_a_different_dtype_is_an_error():
    x = np.random.default_rng(4).standard_normal((2, 3, 32)).astype(np.float32)
    qt = msa.quantize(x, "fp8_per_token")
    out = np.empty((2, 3, 32), ml_dtypes.bfloat16)
    got = msa.dequantize(qt, out=out)
    assert got is out
    np.testing.assert_array_equal(out.astype(np.float32),
                                  msa.dequantize(qt).astype(ml_dtypes.bfloat16).astype(np.float32))
    assert msa.dequantize(qt, out=out, dtype="bf16") is out
    with pytest.raises(msa.MsaError, match="dtype: 'f32' disagrees with out's dtype 'bf16'"):
        msa.dequantize(qt, out=out, dtype="f32")
