"""A serving-engine attention backend on msa, split as vLLM and SGLang split theirs: a metadata
builder that runs once per scheduler step (pages, slot mapping, page tables, the decode plan)
and a forward that every layer calls with its projections. Batches mix prefill chunks (first)
and decode tokens; a long prompt is prefilled in two chunks. Every layer's output is checked
against a plain torch reference.

    python examples/python/serving_backend.py [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

import torch

import msa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kv_cache import PagedKVCache  # noqa: E402
import reference  # noqa: E402


@dataclass
class StepMetadata:
    """What every layer of one step shares. Prefill chunks come first in the token order."""

    slots: torch.Tensor            # [T] cache slot of each new token
    num_prefill_tokens: int
    prefill_requests: list         # request ids, in token order
    prefill_cu_q: torch.Tensor     # [P+1] int32 chunk offsets
    prefill_table: torch.Tensor    # [P, max_pages] int32
    prefill_seqused: torch.Tensor  # [P] int32: keys cached once the chunk is written
    decode_requests: list
    decode_cu_q: torch.Tensor      # [D+1] int32
    decode_table: torch.Tensor     # [D, max_pages] int32
    decode_seqused: torch.Tensor   # [D] int32
    plan: msa.DecodePlan           # planned for this step's decode batch


class MetadataBuilder:
    """Turns the scheduler's decision (which requests prefill how many tokens, which decode)
    into StepMetadata: reserves cache pages, builds page tables, plans the decode batch. The
    plan's workspace is reused from step to step."""

    def __init__(self, cache: PagedKVCache, max_pages: int, num_q_heads: int, num_kv_heads: int,
                 head_dim: int, topk: int, block: int) -> None:
        self.cache, self.max_pages = cache, max_pages
        self.shape = dict(num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                          page_size=cache.page_size, max_pages=max_pages, kv_dtype=cache.k.dtype,
                          topk=topk, kv_block_size=block)
        self.plan = msa.DecodePlan()

    def build(self, prefill: list, decode: list) -> StepMetadata:
        device = self.cache.k.device
        slots = [self.cache.reserve(r, n) for r, n in prefill]
        slots += [self.cache.reserve(r, 1) for r in decode]
        p_requests = [r for r, _ in prefill]
        p_cu = torch.tensor([0] + list(torch.tensor([n for _, n in prefill]).cumsum(0).tolist()),
                            dtype=torch.int32, device=device)
        p_table, p_used = self.cache.batch_tables(p_requests, self.max_pages)
        d_table, d_used = self.cache.batch_tables(decode, self.max_pages)
        if decode:
            self.plan.plan(batch=len(decode), seqused_k=d_used, **self.shape)
        return StepMetadata(torch.cat(slots), int(p_cu[-1]), p_requests, p_cu, p_table, p_used,
                            decode,
                            torch.arange(len(decode) + 1, dtype=torch.int32, device=device),
                            d_table, d_used, self.plan)


class MsaBackend:
    """The per-layer forward: writes the new keys into the cache, then prefill chunks through
    msa.sparse_attention and decode tokens through msa.block_topk + the step's DecodePlan."""

    def __init__(self, topk: int, block: int) -> None:
        self.topk, self.block = topk, block

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, index_q: torch.Tensor,
                index_k: torch.Tensor, cache: PagedKVCache, md: StepMetadata) -> tuple:
        """q ``[T, Hq, D]``, k/v/index_k ``[T, Hkv, D]``, index_q ``[T, Hi, D]`` for the step's
        tokens. Returns out ``[T, Hq, D]`` and the selections (prefill, decode) for checks."""
        cache.write(md.slots, k, v, index_k)
        out = torch.empty_like(q)
        p = md.num_prefill_tokens
        sel_p = sel_d = None
        if md.prefill_requests:
            _, sel_p = msa.sparse_attention(
                q[:p], cache.k, cache.v, md.prefill_cu_q, page_table=md.prefill_table,
                seqused_k=md.prefill_seqused, topk=self.topk, kv_block_size=self.block,
                index_q=index_q[:p], index_k=cache.index_k, out=out[:p], return_selection=True)
        if md.decode_requests:
            sel_d = msa.block_topk(index_q[p:], cache.index_k, md.decode_cu_q,
                                   page_table=md.decode_table, seqused_k=md.decode_seqused,
                                   topk=self.topk, kv_block_size=self.block)
            md.plan.run(q[p:], cache.k, cache.v, md.decode_table, md.decode_cu_q,
                        seqused_k=md.decode_seqused, q2k=sel_d, out=out[p:])
        return out, (None if sel_p is None else sel_p.clone()), sel_d


def check(cache: PagedKVCache, md: StepMetadata, q: torch.Tensor, out: torch.Tensor,
          sel_p: torch.Tensor, sel_d: torch.Tensor, block: int) -> float:
    worst = 0.0
    rows = [(r, int(md.prefill_cu_q[b]), int(md.prefill_cu_q[b + 1]), sel_p, 0)
            for b, r in enumerate(md.prefill_requests)]
    rows += [(r, md.num_prefill_tokens + b, md.num_prefill_tokens + b + 1, sel_d,
              md.num_prefill_tokens) for b, r in enumerate(md.decode_requests)]
    for r, t0, t1, sel, base in rows:
        k, v = cache.gather(r, cache.k), cache.gather(r, cache.v)
        want = reference.sparse_attention(q[t0:t1], k, v, sel[:, t0 - base:t1 - base], block)
        worst = max(worst, reference.rel_l2(out[t0:t1], want))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(1)
    hq, hkv, hi, d, topk, block = 8, 2, 2, 128, 4, 128
    cache = PagedKVCache(num_pages=96, page_size=64, num_kv_heads=hkv, head_dim=d,
                         dtype=torch.bfloat16, device=device)
    builder = MetadataBuilder(cache, max_pages=24, num_q_heads=hq, num_kv_heads=hkv,
                              head_dim=d, topk=topk, block=block)
    backend = MsaBackend(topk, block)
    # Request 0: a 900-token prompt prefilled in two chunks; request 1: a 300-token prompt.
    steps = [([(0, 512), (1, 300)], []), ([(0, 388)], [1]), ([], [0, 1]), ([], [0, 1])]
    for i, (prefill, decode) in enumerate(steps):
        md = builder.build(prefill, decode)
        t = md.slots.shape[0]
        worst = 0.0
        with torch.no_grad():
            for _ in range(args.layers):  # one cache per layer in a model; shared here
                q = torch.randn(t, hq, d, dtype=torch.bfloat16, device=device)
                k, v, index_k = (torch.randn(t, hkv, d, dtype=torch.bfloat16, device=device)
                                 for _ in range(3))
                index_q = torch.randn(t, hi, d, dtype=torch.bfloat16, device=device)
                out, sel_p, sel_d = backend.forward(q, k, v, index_q, index_k, cache, md)
                # The layers share one cache here, so later layers overwrite the step's slots;
                # the check reads the cache as this layer left it.
                worst = max(worst, check(cache, md, q, out, sel_p, sel_d, block))
        print(f"step {i}: {len(prefill)} prefill chunk(s), {len(decode)} decode token(s), "
              f"{t} tokens: rel L2 vs torch reference {worst:.2e}")
        if not worst < 1e-2:
            raise SystemExit(f"step {i}: error {worst:.2e} above 1e-2")
    msa.check_status()  # no invalid index was recorded on the device
    print(f"serving_backend OK on {device}")


if __name__ == "__main__":
    main()
