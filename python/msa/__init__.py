"""msa: block-sparse attention for long-context LLM inference (CPU reference + CUDA sm_90a).

Every op takes DLPack arrays (torch, numpy, cupy) and returns arrays of the caller's
framework; see docs/python.md. GPU ops run on the caller's current stream and never wait for
it (device-side index checks are raised by `check_status`, or after every op with the
environment switch MSA_CHECK_SYNC=1). With torch installed the ops are also torch custom ops
(torch.ops.msa.*), so torch.compile traces them and CUDA graphs capture them.
"""

from . import _C
from ._arrays import DTYPES, Typed, typed
from ._paths import cmake_dir, include_dir
from ._runtime import MsaError, check_status
from .attention import (attention_forward, attention_workspace_bytes, pipeline_workspace_bytes,
                        sparse_attention)
from .batched import attention_batched
from .bsr import BlockSparseAttention
from .csr import K2QIndex, build_k2q_csr, k2q_to_q2k, q2k_to_k2q
from .decode import DecodePlan
from .icp import (icp_exchange, icp_merge, icp_owned_heads, icp_rank_lists, icp_select,
                  icp_shard)
from .indexer import block_scores, block_topk, select_topk
from .logits import (mqa_logits, mqa_logits_topk, mqa_logits_topk_workspace_bytes,
                     paged_mqa_logits, paged_mqa_logits_topk,
                     paged_mqa_logits_topk_workspace_bytes, token_topk)
from .quant import (QTensor, dequantize, quantize, reorder_fp4_scales,
                    reorder_fp4_scales_to_public)
from .sdsa import (gather_key_sample, indexer_scores, indexer_threshold_select,
                   quantize_write_index_qk_nvfp4, thresholds_from_sample, top_k_from_candidates)
from .sparse_convert import (Q2KSelection, block_mask_to_q2k, bsr_mask_to_q2k, bsr_to_k2q,
                             bsr_to_q2k, k2q_to_bsr, q2k_indices_to_q2k, q2k_to_block_mask,
                             q2k_to_bsr)
from .token_sparse import GroupUnion, group_union_masks, token_sparse_kv_indices
from .varblock import VariableBlockSparseAttention

# Registers the torch custom ops (torch.ops.msa.*) before torch.compile traces a caller.
try:
    import torch as _torch  # noqa: F401
except ImportError:
    pass
else:
    from . import _torch_ops  # noqa: F401

__version__: str = _C.__version__


def built_with_cuda() -> bool:
    """True when this build of msa contains the CUDA backend (a GPU may still be absent)."""
    return _C.built_with_cuda()


def cuda_device_count() -> int:
    """Number of usable CUDA devices (0 without CUDA support or without a GPU)."""
    return _C.cuda_device_count()


__all__ = ["BlockSparseAttention", "DTYPES", "DecodePlan", "GroupUnion", "K2QIndex", "MsaError", "Q2KSelection", "QTensor", "Typed",
           "attention_batched", "attention_forward", "attention_workspace_bytes",
           "block_mask_to_q2k", "block_scores",
           "block_topk", "bsr_mask_to_q2k", "bsr_to_k2q", "bsr_to_q2k", "build_k2q_csr",
           "built_with_cuda",
           "check_status", "cmake_dir", "cuda_device_count", "dequantize", "gather_key_sample",
           "group_union_masks", "icp_exchange", "icp_merge", "icp_owned_heads",
           "icp_rank_lists", "icp_select", "icp_shard", "include_dir",
           "indexer_scores", "indexer_threshold_select",
           "k2q_to_bsr", "k2q_to_q2k", "mqa_logits", "mqa_logits_topk",
           "mqa_logits_topk_workspace_bytes", "paged_mqa_logits", "paged_mqa_logits_topk",
           "paged_mqa_logits_topk_workspace_bytes",
           "pipeline_workspace_bytes", "q2k_indices_to_q2k", "q2k_to_block_mask", "q2k_to_bsr",
           "q2k_to_k2q", "quantize", "quantize_write_index_qk_nvfp4", "reorder_fp4_scales",
           "reorder_fp4_scales_to_public",
           "select_topk", "sparse_attention", "thresholds_from_sample", "token_sparse_kv_indices",
           "token_topk",
           "top_k_from_candidates", "typed",
           "VariableBlockSparseAttention"]
