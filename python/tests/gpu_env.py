"""Shared gating for the torch GPU tests: skip the module with a message when torch, a CUDA
device or msa's CUDA backend is absent, and turn 'not supported on CUDA yet' into a skip."""

import contextlib

import pytest

import msa


def require_gpu():
    """Returns torch, or skips the calling test module with the reason."""
    torch = pytest.importorskip("torch", reason="the GPU tests need torch")
    if not torch.cuda.is_available():
        pytest.skip("the GPU tests need a CUDA device (torch.cuda.is_available() is False)",
                    allow_module_level=True)
    if not msa.built_with_cuda():
        pytest.skip("msa was built without its CUDA backend (no nvcc, or MSA_CUDA=OFF)",
                    allow_module_level=True)
    return torch


@contextlib.contextmanager
def gpu_op():
    """Skips (rather than fails) a test whose op has no GPU kernel yet: the capability table
    of msa's CUDA backend raises MsaError '...: not supported on CUDA yet'."""
    try:
        yield
    except msa.MsaError as e:
        if "not supported on CUDA yet" in str(e):
            pytest.skip(str(e))
        raise
