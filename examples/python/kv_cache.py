"""A paged KV cache manager for the examples: fixed page pools for keys, values and index keys,
a free list of pages, and per-request page lists. It is the bookkeeping a serving engine keeps;
msa only reads the pools through a page table (docs/semantics.md, Paged KV)."""

from __future__ import annotations

import torch


class PagedKVCache:
    """Pools ``[num_pages, page_size, heads, head_dim]`` (msa's "paged_nhd" layout) for k, v and
    the index keys. Requests own whole pages; ``append`` writes new tokens at each request's end,
    allocating pages as needed."""

    def __init__(self, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        shape = (num_pages, page_size, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.index_k = torch.zeros(shape, dtype=dtype, device=device)
        self.page_size = page_size
        self.free = list(range(num_pages - 1, -1, -1))
        self.pages: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}

    def reserve(self, request: int, n: int) -> torch.Tensor:
        """Grows the request by `n` tokens, allocating pages as needed; returns their slots, the
        flat positions ``page * page_size + slot`` in the pools (a serving engine's "slot
        mapping")."""
        pages = self.pages.setdefault(request, [])
        start = self.lengths.get(request, 0)
        end = start + n
        while len(pages) * self.page_size < end:
            if not self.free:
                raise RuntimeError("the KV cache is out of pages")
            pages.append(self.free.pop())
        self.lengths[request] = end
        pos = torch.arange(start, end)
        page = torch.tensor(pages, dtype=torch.long)[pos // self.page_size]
        return (page * self.page_size + pos % self.page_size).to(self.k.device)

    def write(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              index_k: torch.Tensor) -> None:
        """Stores ``[n, Hkv, D]`` keys, values and index keys at `slots`."""
        for pool, x in ((self.k, k), (self.v, v), (self.index_k, index_k)):
            pool.view(-1, *pool.shape[2:])[slots] = x.to(pool.dtype)

    def append(self, request: int, k: torch.Tensor, v: torch.Tensor,
               index_k: torch.Tensor) -> None:
        """Writes ``[n, Hkv, D]`` new keys, values and index keys after the request's tokens."""
        self.write(self.reserve(request, k.shape[0]), k, v, index_k)

    def release(self, request: int) -> None:
        self.free.extend(reversed(self.pages.pop(request, [])))
        self.lengths.pop(request, None)

    def batch_tables(self, requests: list[int], max_pages: int) -> tuple:
        """(page_table [B, max_pages] int32, seqused_k [B] int32) for `requests`; unused table
        entries hold page 0 (never read: they lie past seqused_k)."""
        device = self.k.device
        table = torch.zeros(len(requests), max_pages, dtype=torch.int32)
        for b, r in enumerate(requests):
            pages = self.pages.get(r, [])
            table[b, :len(pages)] = torch.tensor(pages, dtype=torch.int32)
        seqused = torch.tensor([self.lengths.get(r, 0) for r in requests], dtype=torch.int32)
        return table.to(device), seqused.to(device)

    def gather(self, request: int, pool: torch.Tensor) -> torch.Tensor:
        """The request's tokens of `pool` in order, ``[length, Hkv, D]`` (for references)."""
        pages = torch.tensor(self.pages.get(request, []), dtype=torch.long, device=pool.device)
        return pool[pages].flatten(0, 1)[:self.lengths.get(request, 0)]
