"""msa: block-sparse attention for long-context LLM inference (CPU reference + CUDA sm_90a).

Every op takes DLPack arrays (torch, numpy, cupy) and returns arrays of the caller's
framework; see docs/python.md. With torch installed the ops are also torch custom ops
(torch.ops.msa.*), so torch.compile and CUDA-graph capture work.
"""

from . import _C
from ._arrays import DTYPES, Typed, typed
from ._paths import cmake_dir, include_dir
from .decode import DecodePlan
from .ops import (K2QIndex, MsaError, QTensor, attention_forward, block_scores, block_topk,
                  build_k2q_csr, check_status, dequantize, k2q_to_q2k, q2k_to_k2q, quantize,
                  select_topk)
from .pipeline import Selection, sparse_attention

__version__: str = _C.__version__


def built_with_cuda() -> bool:
    """True when this build of msa contains the CUDA backend (a GPU may still be absent)."""
    return _C.built_with_cuda()


def cuda_device_count() -> int:
    """Number of usable CUDA devices (0 without CUDA support or without a GPU)."""
    return _C.cuda_device_count()


__all__ = ["DTYPES", "DecodePlan", "K2QIndex", "MsaError", "QTensor", "Selection", "Typed",
           "attention_forward", "block_scores", "block_topk", "build_k2q_csr",
           "built_with_cuda", "check_status", "cuda_device_count", "dequantize", "k2q_to_q2k",
           "q2k_to_k2q", "quantize", "select_topk", "sparse_attention", "typed",
           "cmake_dir", "include_dir"]
