"""A plain torch reference for the examples' checks: softmax attention of each query over the
visible keys of the blocks its kv head selected (docs/semantics.md, Attention), in fp32."""

from __future__ import annotations

import math

import torch


def sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q2k: torch.Tensor,
                     block: int) -> torch.Tensor:
    """One request: q ``[lq, Hq, D]`` (the last lq of its lk tokens), k/v ``[lk, Hkv, D]``,
    q2k ``[Hkv, lq, topk]`` block ids (-1 empty). Returns ``[lq, Hq, D]`` f32."""
    lq, hq, d = q.shape
    lk, hkv = k.shape[0], k.shape[1]
    g = hq // hkv
    s = torch.einsum("qhd,khd->hqk", q.float(), k.float().repeat_interleave(g, dim=1))
    s = s / math.sqrt(d)
    i = torch.arange(lq, device=q.device)[:, None]
    j = torch.arange(lk, device=q.device)[None, :]
    visible = j <= i + lk - lq  # bottom-right causal
    nblk = (lk + block - 1) // block
    chosen = torch.zeros(hkv, lq, nblk + 1, dtype=torch.bool, device=q.device)
    ids = torch.where(q2k >= 0, q2k, torch.full_like(q2k, nblk)).long()
    chosen.scatter_(2, ids, True)
    selected = chosen[:, :, j[0] // block].repeat_interleave(g, dim=0)
    s = s.masked_fill(~(visible[None] & selected), -math.inf)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", p, v.float().repeat_interleave(g, dim=1))


def rel_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want).norm() / want.norm().clamp_min(1e-30))
