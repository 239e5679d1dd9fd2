"""Shared gating for the torch GPU tests: skip the module with a message when torch, a CUDA
device or msa's CUDA backend is absent, and turn 'not supported on CUDA yet' into a skip."""

import contextlib
import re

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


# How msa's CUDA backend names a feature it does not have yet (its capability table, or a
# kernel's runtime dispatch): "...: not supported on CUDA yet", "... is not supported by the
# CUDA sparse prefill yet", "params.kv_block_size: must be 128 on CUDA, got 64".
_MISSING = re.compile(r"not supported (on|by) (the )?CUDA|on CUDA, got")


@contextlib.contextmanager
def gpu_op():
    """Skips (rather than fails) a test whose op or variant has no GPU kernel yet, with the
    backend's message; any other MsaError fails the test."""
    try:
        yield
    except msa.MsaError as e:
        if _MISSING.search(str(e)):
            pytest.skip(str(e))
        raise


def runs_without_sync_and_captures(plan, q, k, v):
    """Calls plan() and runs the plan twice with torch's sync debug mode set to error, then
    checks that a CUDA graph of run() replays the eager result, also after q changes. For the
    plan / run wrappers (BlockSparseAttention, VariableBlockSparseAttention); the caller warms
    up first (status buffer, kernels)."""
    import torch

    torch.cuda.set_sync_debug_mode("error")
    try:
        wrapper = plan()
        eager = wrapper.run(q, k, v)
        again = wrapper.run(q, k, v)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert torch.equal(eager, again)
    out = torch.empty_like(q)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        wrapper.run(q, k, v, out=out)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, wrapper.run(q, k, v))
    msa.check_status()
