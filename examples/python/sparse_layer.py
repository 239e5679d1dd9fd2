"""A sparse-attention layer as a torch.nn.Module over a paged KV cache: prefill with
msa.sparse_attention (an index branch of its own selects kv blocks, fused with top-K), then
decode steps with msa.block_topk + msa.DecodePlan. Each step is checked against a plain torch
reference.

    python examples/python/sparse_layer.py [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch import nn

import msa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kv_cache import PagedKVCache  # noqa: E402
import reference  # noqa: E402


class SparseAttention(nn.Module):
    """Attention whose kv blocks are picked per (kv head, query) by a small index branch:
    `index_heads` index query heads scored against one index key head per kv head (the index
    keys live in the cache next to k and v), `topk` blocks of `block` keys kept."""

    def __init__(self, hidden: int, num_q_heads: int, num_kv_heads: int, head_dim: int = 128,
                 index_heads: int | None = None, topk: int = 4, block: int = 128) -> None:
        super().__init__()
        self.hq, self.hkv, self.d = num_q_heads, num_kv_heads, head_dim
        self.hi = index_heads or num_kv_heads
        self.topk, self.block = topk, block
        self.q_proj = nn.Linear(hidden, num_q_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=False)
        self.index_q_proj = nn.Linear(hidden, self.hi * head_dim, bias=False)
        self.index_k_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_q_heads * head_dim, hidden, bias=False)
        self.plan = msa.DecodePlan()

    def _project(self, x: torch.Tensor) -> tuple:
        t = x.shape[0]
        return (self.q_proj(x).view(t, self.hq, self.d), self.k_proj(x).view(t, self.hkv, self.d),
                self.v_proj(x).view(t, self.hkv, self.d),
                self.index_q_proj(x).view(t, self.hi, self.d),
                self.index_k_proj(x).view(t, self.hkv, self.d))

    def prefill(self, x: torch.Tensor, lengths: list[int], requests: list[int],
                cache: PagedKVCache, max_pages: int) -> tuple:
        """x ``[sum(lengths), hidden]``: the prompts of new requests, packed. Returns the layer
        output and (q, q2k) for the check."""
        q, k, v, iq, ik = self._project(x)
        starts = [0]
        for n in lengths:
            starts.append(starts[-1] + n)
        for b, r in enumerate(requests):
            cache.append(r, k[starts[b]:starts[b + 1]], v[starts[b]:starts[b + 1]],
                         ik[starts[b]:starts[b + 1]])
        table, seqused = cache.batch_tables(requests, max_pages)
        cu_q = torch.tensor(starts, dtype=torch.int32, device=x.device)
        out, q2k = msa.sparse_attention(q, cache.k, cache.v, cu_q, page_table=table,
                                        seqused_k=seqused, topk=self.topk,
                                        kv_block_size=self.block, index_q=iq,
                                        index_k=cache.index_k, return_selection=True)
        return self.o_proj(out.flatten(1)), (q, out, q2k.clone())

    def decode(self, x: torch.Tensor, requests: list[int], cache: PagedKVCache,
               max_pages: int) -> tuple:
        """x ``[B, hidden]``: one new token per request. Returns the layer output and
        (q, out, q2k) for the check."""
        q, k, v, iq, ik = self._project(x)
        for b, r in enumerate(requests):
            cache.append(r, k[b:b + 1], v[b:b + 1], ik[b:b + 1])
        table, seqused = cache.batch_tables(requests, max_pages)
        cu_q = torch.arange(len(requests) + 1, dtype=torch.int32, device=x.device)
        q2k = msa.block_topk(iq, cache.index_k, cu_q, page_table=table, seqused_k=seqused,
                             topk=self.topk, kv_block_size=self.block)
        # Plan for this step's lengths: the workspace is reused, nothing is reallocated.
        self.plan.plan(batch=len(requests), num_q_heads=self.hq, num_kv_heads=self.hkv,
                       head_dim=self.d, page_size=cache.page_size, max_pages=max_pages,
                       kv_dtype=cache.k.dtype, topk=self.topk, kv_block_size=self.block,
                       seqused_k=seqused)
        out = self.plan.run(q, cache.k, cache.v, table, cu_q, seqused_k=seqused, q2k=q2k)
        return self.o_proj(out.flatten(1)), (q, out, q2k)


def check(cache: PagedKVCache, requests: list[int], q_rows: list[int], q: torch.Tensor,
          out: torch.Tensor, q2k: torch.Tensor, block: int, what: str) -> float:
    """Compares each request's attention output with the torch reference; returns the worst
    relative L2 error."""
    worst, t = 0.0, 0
    for r, n in zip(requests, q_rows):
        k, v = cache.gather(r, cache.k), cache.gather(r, cache.v)
        want = reference.sparse_attention(q[t:t + n], k, v, q2k[:, t:t + n], block)
        worst = max(worst, reference.rel_l2(out[t:t + n], want))
        t += n
    print(f"{what}: rel L2 vs torch reference {worst:.2e}")
    if not worst < 1e-2:
        raise SystemExit(f"{what}: error {worst:.2e} above 1e-2")
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=4, help="decode steps")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    hidden, prompts = 1024, [700, 300]
    layer = SparseAttention(hidden, num_q_heads=8, num_kv_heads=2, topk=4).to(device,
                                                                             torch.bfloat16)
    cache = PagedKVCache(num_pages=64, page_size=64, num_kv_heads=2, head_dim=128,
                         dtype=torch.bfloat16, device=device)
    max_pages = 16
    requests = [0, 1]
    with torch.no_grad():
        x = torch.randn(sum(prompts), hidden, dtype=torch.bfloat16, device=device)
        y, (q, out, q2k) = layer.prefill(x, prompts, requests, cache, max_pages)
        check(cache, requests, prompts, q, out, q2k, layer.block, "prefill")
        for step in range(args.steps):
            x = torch.randn(len(requests), hidden, dtype=torch.bfloat16, device=device)
            y, (q, out, q2k) = layer.decode(x, requests, cache, max_pages)
            check(cache, requests, [1] * len(requests), q, out, q2k, layer.block,
                  f"decode step {step}")
    msa.check_status()  # no invalid index was recorded on the device
    print(f"sparse_layer OK on {device}: output {tuple(y.shape)}, "
          f"{sum(cache.lengths.values())} cached tokens")


if __name__ == "__main__":
    main()
