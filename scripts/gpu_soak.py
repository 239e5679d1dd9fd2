#!/usr/bin/env python3
"""A soak test of msa's Python API on the GPU: thousands of random valid and invalid calls of
every op in one process, on torch CUDA tensors, on random streams, some captured into CUDA
graphs and replayed; valid results sampled against the CPU backend (the oracle), every invalid
call expected to raise msa.MsaError, the context never poisoned and device memory flat.

Ops: attention_forward (flat and paged nhd / hnd; bf16 / f16 K/V, FP8 and FP4 K/V under bf16 q;
q2k with and without its k2q; LSE, temperature, partial dtypes, out= / lse= / workspace=;
causal_offset, soft_cap, key_mask / key_mask_rows on both backends), attention_batched (BSHD
merged or padded,
BHSD; the same keywords), sparse_attention (flat and paged, FP8 index inputs,
return_selection), block_scores, block_topk, select_topk, build_k2q_csr, the q2k <-> k2q
converters (host only), DecodePlan plan + run (dense and sparse; bf16 / f16 / FP8 caches; bf16 /
f16 / FP8 queries; causal_offset, key_mask and soft_cap on the CPU, refused by CUDA decode),
quantize and dequantize (all five formats), mqa_logits, paged_mqa_logits, token_topk, the SDSA
indexer (indexer_scores, indexer_threshold_select chained into top_k_from_candidates,
top_k_from_candidates, gather_key_sample, thresholds_from_sample,
quantize_write_index_qk_nvfp4; bf16 / f16 / NVFP4 keys and queries, bitwise against the CPU) and
check_status on a caller's buffer. Each call draws a small random problem (an occasional
larger one) of what the CUDA backend takes: head dim 128 (SDSA: 16 to 256), kv blocks of 128
for the indexer and prefill, GQA groups 1-16, each op's CUDA formats and limits
(check_supported in src/cuda, src/api/*.cpp). Selections run on small-integer inputs, whose
scores are exact, so CPU and GPU ids must agree bit for bit.

About a third of the calls break one argument: a wrong dtype, rank or extent, a non-contiguous
last dim, a CPU tensor among CUDA ones, a Python list; an out-of-range, negative or repeated
block id, a page id outside the pool, cu_seqlens not starting at 0, a length past its table or
decode plan, more queries than planned, a k2q index of another q2k, too few score blocks or CSR
rows, a bad logits or token_topk range; an SDSA row naming no request or too many keys, a
sample offset or capacity out of range, a slot past the NVFP4 cache (or, CPU only, given twice,
and counts not zero on entry or negative); an out= of a wrong shape or dtype, a too-small
workspace; a NaN scale or global scale (device FP8 scales only where the CUDA kernels check
them: the indexer), a bad option value, a missing argument. Device-side offences are raised by
`check=True` or `msa.check_status()`, which every call runs on its stream (docs/python.md,
Outputs, streams, errors). Outcomes, per op:
  ok        a valid call returned (and msa.check_status() stayed quiet)
  checked   ... and its result matched the CPU backend's on the same inputs (every
            --check-every-th valid call): docs/semantics.md, Numerics tolerances; ids, CSR and
            quantized bits identical; -inf / NaN at the same places
  graph     ... captured into a CUDA graph, replayed, equal bit for bit to the eager call
            (again after new inputs were copied in), and matched to the CPU backend
  rejected  an invalid call raised msa.MsaError (the expected answer; a message that names
            none of the broken argument's names is listed as "vague", not counted as a defect)
Defects (any makes the exit status 1):
  rejected_valid   MsaError for a valid call (or from the CPU reference on its inputs)
  accepted_invalid an invalid call returned and check_status() raised nothing
  other_exception  any exception other than MsaError
  wrong            a valid result outside tolerance, or a replay differing from the eager call
  crash            a CUDA error or a dead context (the soak stops there)
Device memory: torch.cuda.memory_allocated() and the driver's used bytes (mem_get_info) after
a warm-up and at the end, each after gc.collect() and empty_cache(); torch's allocated bytes
must not grow, the driver's by at most --max-drift-mib.

  python3 scripts/gpu_soak.py --calls 10000 [--seed 1] [--check-every 10] [--json FILE]
  python3 scripts/gpu_soak.py --device cpu --calls 2000      (the same calls on CPU tensors)

--device cpu runs the soak on CPU torch tensors: no streams and no graphs, the oracle is the
same op on a copy of the inputs (bitwise: the CPU backend is deterministic) and, for attention,
the float64 numpy reference of python/tests/np_reference.py. Without a GPU (or without msa's
CUDA backend) and without --device cpu it prints a "skipped: no GPU" line and exits 0.
"""
import argparse
import collections
import faulthandler
import gc
import json
import math
import os
import sys
import time
import traceback

import numpy as np

D = 128    # the head dim every CUDA kernel takes
BLK = 128  # the kv block size of the CUDA indexer and prefill
GROUPS, GROUP_P = (1, 2, 4, 8, 16), (0.3, 0.25, 0.2, 0.15, 0.1)
PAGE_SIZES = (16, 32, 64, 128, 256)
FP8 = ("fp8_per_tensor", "fp8_per_token", "fp8_per_token_head")
FP4 = ("nvfp4", "mxfp4")
ARRAY_MUTATIONS = ("dtype", "rank", "extent", "stride", "device", "list")
DEFECTS = ("rejected_valid", "accepted_invalid", "other_exception", "wrong", "crash")
OUTCOMES = ("ok", "checked", "graph", "rejected") + DEFECTS
# Weights of the ops: attention and decode carry most of the API surface.
OPS = {"attention_flat": 3, "attention_paged": 2, "sparse_attention": 2, "block_scores": 1.5,
       "block_topk": 1.5, "select_topk": 1, "build_k2q_csr": 1.5, "k2q_convert": 0.5,
       "decode": 3, "quantize": 1, "dequantize": 1, "mqa_logits": 1, "paged_mqa_logits": 1,
       "token_topk": 0.5, "check_status": 0.3, "attention_batched": 1.5,
       "indexer_scores": 1, "threshold_select": 1, "top_k_from_candidates": 0.5,
       "gather_key_sample": 0.7, "thresholds_from_sample": 0.5, "quantize_write_nvfp4": 0.7}

torch = None  # imported in main(): the skip line must print even without torch
msa = None


# ------------------------------------------------------------------------------------------------
# Trees of arguments and results

def _tree(x, leaf):
    """x with `leaf` applied to every torch tensor in it (tuples, named tuples, lists, dicts)."""
    if isinstance(x, torch.Tensor):
        return leaf(x)
    if isinstance(x, dict):
        return {k: _tree(v, leaf) for k, v in x.items()}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(_tree(v, leaf) for v in x))
    if isinstance(x, (tuple, list)):
        return type(x)(_tree(v, leaf) for v in x)
    return x


def to_cpu(x):
    """A CPU copy of every tensor of x (fresh memory even for CPU tensors)."""
    return _tree(x, lambda t: t.detach().to("cpu", copy=True))


def flatten(res):
    """An op's result as a tuple of tensors: QTensor (values, scale), K2QIndex (row_ptr, q_idx;
    the schedule's items are the backend's own, docs: src/common/schedule.h), tuples in order."""
    if isinstance(res, torch.Tensor):
        return (res,)
    if isinstance(res, msa.K2QIndex):
        return (res.row_ptr, res.q_idx)
    if isinstance(res, msa.QTensor):
        return (res.values, res.scale)
    if isinstance(res, (tuple, list)):
        return tuple(t for r in res for t in flatten(r))
    if res is None:
        return ()
    raise TypeError(f"unexpected result {type(res).__name__}")


def device_of(x):
    if isinstance(x, msa.QTensor):
        x = x.values
    return "cuda" if x.is_cuda else "cpu"


# ------------------------------------------------------------------------------------------------
# Comparisons (CPU tensors in, None or a message out)

_BYTES = None  # dtypes compared as raw bytes: the 8-bit float formats (NaN codes included)


def same(a, b, what="result"):
    """Bitwise equality up to NaN payloads: same shape and dtype, NaN at the same places."""
    a, b = a.cpu(), b.cpu()
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"{what}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    if a.dtype in _BYTES:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    if a.is_floating_point():
        na, nb = torch.isnan(a), torch.isnan(b)
        if not torch.equal(na, nb):
            return f"{what}: NaN at different places ({int((na ^ nb).sum())} elements)"
        a, b = a.masked_fill(na, 0), b.masked_fill(nb, 0)
    if not torch.equal(a, b):
        diff = int((a != b).sum())
        return f"{what}: {diff} of {a.numel()} elements differ"
    return None


def same_all(got, want):
    if len(got) != len(want):
        return f"{len(got)} outputs vs {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        err = same(g, w, f"output {i}")
        if err:
            return err
    return None


def close_rows(got, want, tol, what):
    """-inf, +inf and NaN at the same places, the finite rest within `tol` relative L2."""
    g, w = got.cpu().double(), want.cpu().double()
    if g.shape != w.shape:
        return f"{what}: shape {list(g.shape)} vs {list(w.shape)}"
    for name, f in (("-inf", torch.isneginf), ("+inf", torch.isposinf), ("NaN", torch.isnan)):
        if not torch.equal(f(g), f(w)):
            return f"{what}: {name} at different places ({int((f(g) ^ f(w)).sum())} elements)"
    fin = torch.isfinite(w)
    if fin.any():
        err = float((g[fin] - w[fin]).norm() / w[fin].norm().clamp_min(1e-30))
        if not err <= tol:
            return f"{what}: relative L2 error {err:.3e} > {tol:g}"
    return None


def close_attention(got, want, tol, lse_tol, n_stats):
    """docs/semantics.md, Numerics: out by relative L2 over the tensor (finite, 0 rows where the
    reference is 0), each lse / tlse -inf where the reference's is and within lse_tol
    elsewhere; `n_stats` of the outputs after out are row statistics."""
    out, ref = got[0].cpu().double(), want[0].cpu().double()
    if out.shape != ref.shape:
        return f"out: shape {list(out.shape)} vs {list(ref.shape)}"
    if not torch.isfinite(out).all():
        return f"out: {int((~torch.isfinite(out)).sum())} NaN or inf elements"
    err = float((out - ref).norm() / ref.norm().clamp_min(1e-30))
    if ref.norm() == 0:
        err = float(out.abs().max()) if out.numel() else 0.0
    if not err <= tol:
        return f"out: relative L2 error {err:.3e} > {tol:g}"
    for i in range(1, 1 + n_stats):
        g, w = got[i].cpu().double(), want[i].cpu().double()
        if not torch.equal(torch.isneginf(g), torch.isneginf(w)):
            return f"lse {i}: -inf at different places"
        fin = torch.isfinite(w)
        if not torch.isfinite(g[fin]).all():
            return f"lse {i}: NaN or inf where the reference is finite"
        if fin.any():
            e = float((g[fin] - w[fin]).abs().max())
            if not e <= lse_tol:
                return f"lse {i}: max abs error {e:.3e} > {lse_tol:g}"
    return None


def k2q_equal(got, want):
    """row_ptr identical, q_idx identical over each head's used entries."""
    err = same(got[0], want[0], "row_ptr")
    if err:
        return err
    for h in range(got[0].shape[0]):
        n = int(want[0][h, -1])
        err = same(got[1][h, :n], want[1][h, :n], f"q_idx head {h}")
        if err:
            return err
    return None


def sdsa_stores_equal(got, want):
    """The threshold select chain (candidates, ties, counts, ids, row_status; unwritten slots
    -1) against the CPU's: counts, ids and row_status bitwise; a store's entries as a set
    (sorted by position: CUDA stores in any slot order) in the rows where it did not overflow
    (an overflowing store holds an unspecified subset on CUDA; docs/semantics.md, SDSA
    indexer, On CUDA)."""
    if len(got) != len(want):
        return f"{len(got)} outputs vs {len(want)}"
    for i, name in ((2, "counts"), (3, "ids"), (4, "row_status")):
        err = same(got[i], want[i], name)
        if err:
            return err
    counts = want[2].cpu()
    for i, name in ((0, "candidates"), (1, "ties")):
        g, w = got[i].cpu(), want[i].cpu()
        if g.shape != w.shape:
            return f"{name}: shape {list(g.shape)} vs {list(w.shape)}"
        keep = counts[:, i] <= w.shape[1]

        def by_position(x):
            pos = x[..., 0] if x.dim() == 3 else x
            order = torch.sort(pos, dim=1, stable=True).indices
            return torch.gather(x, 1, order[..., None].expand_as(x) if x.dim() == 3 else order)
        err = same(by_position(g)[keep], by_position(w)[keep], f"{name} (as sets)")
        if err:
            return err
    return None


# ------------------------------------------------------------------------------------------------
# One call

class Case:
    """One call of an op: its keywords, how to run it (bind: host work such as a decode plan,
    then a zero-argument callable that makes the call), how to compare its outputs with the
    CPU backend's, and the ways to break it: {name: (fn(kw) -> kw or None when it does not
    apply, names the error message should mention, where: 'any' | 'cpu' | 'cuda')}."""

    def __init__(self, op, kw, api=None, *, bind=None, compare=same_all, mutations=None,
                 graph=True, refill=False, check=True, stream=True, reference=None):
        self.op, self.kw, self.compare = op, kw, compare
        self.bind = bind or (lambda kw: (lambda: api(**kw)))
        self.mutations = mutations or {}
        self.graph, self.refill = graph, refill
        self.takes_check, self.takes_stream = check, stream
        self.reference = reference  # CPU mode: a float64 reference (inputs) -> outputs, or None


def mutation(fn, hints=(), where="any"):
    return (fn, tuple(hints), where)


# The names the C++ checks give some keywords (an output by what it holds, the decode caches by
# the attention names).
ALIASES = {"k_cache": ("k",), "v_cache": ("v",), "index_k": ("index", "k"), "q2k": ("k2q",),
           "scores": ("cu_seqlens_q",),  # its last dim counts the queries
           "out": ("out", "logits", "scores", "q2k", "ids", "row_ptr", "x.values")}


def hints_of(key):
    return (key,) + ALIASES.get(key, ())


def with_kw(key, value):
    """A mutation that sets keyword `key` (a bad option value)."""
    return mutation(lambda kw: dict(kw, **{key: value}), (key,))


class Soak:
    def __init__(self, args):
        self.args = args
        self.dev = args.device
        self.cuda = self.dev == "cuda"
        self.rng = np.random.default_rng(args.seed)
        self.gen = torch.Generator().manual_seed(args.seed)
        self.streams = [torch.cuda.Stream() for _ in range(3)] if self.cuda else []
        self.counts = collections.Counter()
        self.examples = collections.defaultdict(list)
        self.vague = collections.Counter()
        self.vague_examples = []
        self.mutations_seen = collections.Counter()
        self.valid_calls = 0
        self.previous = None  # the last call, when it was an invalid one
        self.crashed = False

    # ---- random inputs (made on the CPU with the soak's generator, then moved) ----

    def to(self, x):
        return x.to(self.dev)

    def randn(self, *shape, dtype=None):
        x = torch.randn(*shape, generator=self.gen)
        return x if dtype is None else x.to(dtype)

    def ints(self, *shape, dtype):
        """Values in {-2..2}: dot products are exact in bf16/f16/e4m3 and f32 sums, so scores
        tie exactly and selections must match the CPU's bit for bit (docs: Numerics)."""
        return torch.randint(-2, 3, shape, generator=self.gen).to(dtype)

    def pow2(self, n):
        """f32 scales of powers of two: exact products, so FP8 scores stay exact too."""
        return torch.from_numpy(2.0 ** self.rng.integers(-3, 4, n)).float()

    def choice(self, seq, p=None):
        return seq[int(self.rng.choice(len(seq), p=p))]

    def chance(self, p):
        return self.rng.random() < p

    def big(self):
        """4 for an occasional larger problem, else 1."""
        return 4 if self.chance(self.args.big) else 1

    def varlen(self, max_q, max_k, max_b=3):
        """Lengths of a varlen batch: some requests without queries or keys, more queries than
        keys allowed, at least one query and one key in all."""
        s = self.big()
        b = int(self.rng.integers(1, max_b * (2 if s > 1 else 1) + 1))
        lk = [int(x) for x in self.rng.integers(0, max_k * s + 1, b)]
        lq = [min(int(self.rng.integers(0, max_q * s + 1)), lk[i] + int(self.rng.integers(0, 5)))
              for i in range(b)]
        if sum(lq) == 0:
            lq[-1] = 1
        if sum(lk) == 0:
            lk[-1] = 1
        return lq, lk

    def heads(self, max_group=16):
        hkv = int(self.rng.choice([1, 2] if self.big() == 1 else [1, 2, 4]))
        g = self.choice([x for x in GROUPS if x <= max_group],
                        p=None if max_group < 16 else GROUP_P)
        return hkv, hkv * g

    @staticmethod
    def cu(lengths):
        return torch.tensor([0] + list(np.cumsum(lengths)), dtype=torch.int32)

    def q2k(self, lq, lk, hkv, topk, blk):
        """A valid random selection (torch_reference.random_q2k): distinct ids in [0, nblk_b)
        ascending, -1 padded at the end, some rows short."""
        q2k = np.full((hkv, sum(lq), topk), -1, np.int32)
        t0 = 0
        for b in range(len(lq)):
            nblk = -(-lk[b] // blk)
            if lq[b] and nblk:
                n = min(topk, nblk)
                ids = np.argsort(self.rng.random((hkv, lq[b], nblk)), -1)[..., :n]
                keep = self.rng.random((hkv, lq[b], n)) < 0.85
                ids = np.sort(np.where(keep, ids, 1 << 30), -1)
                q2k[:, t0:t0 + lq[b], :n] = np.where(ids == 1 << 30, -1, ids)
            t0 += lq[b]
        return torch.from_numpy(q2k)

    def pages(self, flats, lk, page_size, fill, spare_column=True):
        """Flat [total_k, H, D] tensors scattered into shuffled pools [pages, page_size, H, D]
        (unused slots `fill`, never read): (pools, page_table [B, max_pages], seqused_k [B]);
        sometimes a spare table column (never read either)."""
        cu = np.concatenate([[0], np.cumsum(lk)])
        used = [-(-n // page_size) for n in lk]
        max_pages = max(used + [1]) + int(spare_column and self.rng.integers(0, 2))
        num_pages = sum(used) + int(self.rng.integers(1, 4))
        perm = self.rng.permutation(num_pages)
        table = torch.zeros(len(lk), max_pages, dtype=torch.int32)
        pools = []
        for x in flats:
            pools.append(torch.full((num_pages, page_size) + tuple(x.shape[1:]), fill,
                                    dtype=x.dtype))
        n = 0
        for b in range(len(lk)):
            for p in range(used[b]):
                table[b, p] = int(perm[n])
                lo = int(cu[b]) + p * page_size
                hi = min(lo + page_size, int(cu[b + 1]))
                for pool, x in zip(pools, flats):
                    pool[int(perm[n]), :hi - lo] = x[lo:hi]
                n += 1
        return pools, table, torch.tensor(lk, dtype=torch.int32)

    def full_pages(self, lk, page_size):
        """Lengths that fill every table column (the same page count for every request): a
        page table read without seqused_k then holds only keys."""
        return [page_size * int(self.rng.integers(1, 4))] * len(lk)

    def lengths_kv(self, kw, lk, hkv, paged):
        """The key lengths of an op that reads no key (select_topk, build_k2q_csr) into kw:
        cu_seqlens_k, or a page table, seqused_k and a pool k whose shape gives the page size.
        Returns the page size (0: flat)."""
        if not paged:
            kw["cu_seqlens_k"] = self.to(self.cu(lk))
            return 0
        page_size = self.choice(PAGE_SIZES)
        (kp,), table, seqused = self.pages([torch.zeros(sum(lk), hkv, 1)], lk, page_size, 0.0)
        kw.update(k=self.to(torch.zeros(kp.shape[0], page_size, hkv, D, dtype=torch.bfloat16)),
                  page_table=self.to(table), seqused_k=self.to(seqused))
        return page_size

    def selection(self):
        """topk (up to the CUDA limit of 64 for a larger problem) and forced sink and local
        blocks with sink + local <= topk."""
        topk = int(self.rng.integers(1, 17 if self.big() == 1 else 65))
        sink = int(self.rng.integers(0, min(2, topk) + 1))
        local = int(self.rng.integers(0, min(2, topk - sink) + 1))
        return dict(topk=topk, sink_blocks=sink, local_blocks=local)

    def strided(self, x):
        """Sometimes a view of x with padded rows (dims before the last strided), which every op
        takes (docs/semantics.md, Conventions)."""
        if not self.chance(0.15):
            return x
        pad = torch.empty(x.shape[:-2] + (x.shape[-2] + 1, x.shape[-1]), dtype=x.dtype,
                          device=x.device)
        view = pad[..., :x.shape[-2], :]
        view.copy_(x)
        return view

    # ---- mutations shared by the ops ----

    def m_dtype(self, key):
        """The argument (a QTensor's values) in a dtype it may not have."""
        wrong = {torch.bfloat16: torch.float32, torch.float16: torch.float32,
                 torch.float32: torch.float64, torch.int32: torch.int64, torch.uint8: torch.int32}

        def change(x):
            if x.dtype in wrong:
                return x.to(wrong[x.dtype])
            return x.view(torch.uint8).to(torch.float16)  # FP8 / FP4 bytes as f16 values

        def fn(kw):
            x = kw.get(key)
            if isinstance(x, msa.QTensor):
                return dict(kw, **{key: x._replace(values=change(x.values))})
            if not isinstance(x, torch.Tensor):
                return None
            return dict(kw, **{key: change(x)})
        return mutation(fn, hints_of(key))

    def m_array(self, key, how):
        """rank (one more dim), extent (last dim 16 longer), stride (last dim non-contiguous),
        device (a CPU tensor among CUDA ones), list (a Python list)."""
        def change(x):
            if how == "rank":
                return x.unsqueeze(0)
            if how in ("extent", "stride"):
                # On the bytes of 8-bit formats, which torch cannot fill or index (FP4 pairs).
                b = x.view(torch.uint8) if x.element_size() == 1 else x
                n = b.shape[-1]
                y = torch.zeros(b.shape[:-1] + (n + 16 if how == "extent" else 2 * n,),
                                dtype=b.dtype, device=b.device)
                (y[..., :n] if how == "extent" else y[..., ::2]).copy_(b)
                y = y if how == "extent" else y[..., ::2]
                return y.view(x.dtype) if b is not x else y
            if how == "device":
                return x.cpu()
            return x.cpu().view(torch.uint8).tolist() if x.element_size() == 1 else x.tolist()

        def on_cuda(v):
            if isinstance(v, msa.QTensor):
                return on_cuda(v.values)
            if isinstance(v, (tuple, list)):
                return any(on_cuda(u) for u in v)
            return isinstance(v, torch.Tensor) and v.is_cuda

        def fn(kw):
            x = kw.get(key)
            # Moving the call's only device array (outputs allocated like it) makes a valid host
            # call, not a mixed-device one.
            if how == "device" and not any(on_cuda(v) for k, v in kw.items() if k != key):
                return None
            if isinstance(x, msa.QTensor) and how in ("rank", "extent", "stride", "device"):
                return dict(kw, **{key: x._replace(values=change(x.values))})
            if not isinstance(x, torch.Tensor) or (how == "stride" and x.shape[-1] < 2):
                return None
            return dict(kw, **{key: change(x)})
        return mutation(fn, hints_of(key), "cuda" if how == "device" else "any")

    def m_arrays(self, keys, hows=("rank", "extent", "stride", "device")):
        out = {}
        for key in keys:
            out[f"dtype:{key}"] = self.m_dtype(key)
            for how in hows:
                out[f"{how}:{key}"] = self.m_array(key, how)
        return out

    def m_edit(self, key, edit, hints=None, where="any"):
        """A copy of tensor `key` changed in place by edit(cpu copy) -> bool (False: n/a)."""
        def fn(kw):
            x = kw.get(key)
            if not isinstance(x, torch.Tensor):
                return None
            y = x.cpu().clone()
            if edit(y) is False:
                return None
            return dict(kw, **{key: y.to(x.device)})
        return mutation(fn, hints or (key,), where)

    def m_q2k_values(self, tokens=None):
        """Out-of-range, negative and repeated ids in q2k (device-checked on CUDA) at a token of
        `tokens` (default any; CUDA decode checks the rows of requests with keys)."""
        def pick(y, rows=None):
            ts = list(range(y.shape[1]) if tokens is None else tokens)
            if rows is not None:
                rows = [(h, t) for h, t in rows if tokens is None or t in ts]
                return rows[int(self.rng.integers(0, len(rows)))] if rows else None
            return int(self.rng.integers(0, y.shape[0])), ts[int(self.rng.integers(0, len(ts)))] \
                if ts else None

        def bad(y, value, slot):
            h, t = pick(y)
            if t is None:
                return False
            y[h, t, slot] = value

        def repeat(y):
            if y.shape[2] < 2:
                return False
            rows = ((y[..., 0] >= 0) & (y[..., 1] != y[..., 0])).nonzero().tolist()
            hit = pick(y, [tuple(r) for r in rows])
            if hit is None:
                return False
            y[hit[0], hit[1], 1] = y[hit[0], hit[1], 0]
        return {"bad_id": self.m_edit("q2k", lambda y: bad(y, 10**6, 0)),
                "negative_id": self.m_edit("q2k", lambda y: bad(y, -5, -1)),
                "repeated_id": self.m_edit("q2k", repeat)}

    def m_cu_start(self, key="cu_seqlens_q"):
        """cu_seqlens not starting at 0 (checked on the device by the q2k and decode checks)."""
        def edit(y):
            y[0] = 1
        return self.m_edit(key, edit, (key,))

    def m_pages(self, table_key, seq_key, page_size, rows=None):
        """A used page id outside the pool, a length past the table (and past any decode plan's
        capacity, its length rounded up to 128 keys) or negative; device-checked on CUDA.
        `rows`: the requests whose pages the op reads whatever the other arguments (default
        all; CUDA decode checks the ids it loads, so there: requests with queries)."""
        def lengths(kw):
            if kw.get(seq_key) is not None:
                return kw[seq_key].tolist()
            return [kw[table_key].shape[1] * page_size] * kw[table_key].shape[0]

        def fn_page(kw):
            lens = lengths(kw)
            pool = kw["k"] if "k" in kw else kw["k_cache"]
            num_pages = (pool.values if isinstance(pool, msa.QTensor) else pool).shape[0]
            cand = [b for b in (rows if rows is not None else range(len(lens))) if lens[b] > 0]
            if not cand:
                return None
            b = cand[int(self.rng.integers(0, len(cand)))]
            y = kw[table_key].cpu().clone()
            y[b, int(self.rng.integers(0, -(-lens[b] // page_size)))] = \
                num_pages + 3 if self.chance(0.5) else -2
            return dict(kw, **{table_key: y.to(kw[table_key].device)})

        def fn_long(kw):
            cand = list(rows if rows is not None else range(kw[table_key].shape[0]))
            if kw.get(seq_key) is None or not cand:
                return None
            y = kw[seq_key].cpu().clone()
            y[cand[int(self.rng.integers(0, len(cand)))]] = \
                kw[table_key].shape[1] * page_size + BLK if self.chance(0.7) else -1
            return dict(kw, **{seq_key: y.to(kw[seq_key].device)})
        return {"bad_page": mutation(fn_page, ("page_table", "page id")),
                "seqused_past_table": mutation(fn_long, ("seqused_k", "shape mismatch"))}

    @staticmethod
    def m_selection():
        """topk 0 or past 32 bits, sink + local past topk."""
        return {"topk_zero": with_kw("topk", 0), "topk_huge": with_kw("topk", 2**32 + 1),
                "sink_local": mutation(lambda kw: dict(kw, sink_blocks=kw["topk"],
                                                       local_blocks=1), ("sink_blocks",))}

    @staticmethod
    def m_missing(key):
        """Keyword `key` left out (one the call cannot do without)."""
        return {f"missing:{key}": mutation(lambda kw: {x: y for x, y in kw.items() if x != key},
                                           (key,))}

    def m_out(self, key, shape_fn, dtype):
        """A preallocated output of a wrong shape, and one of a wrong dtype."""
        def fn_shape(kw):
            shape = list(shape_fn(kw))
            shape[-1] += 1
            return dict(kw, **{key: torch.empty(shape, dtype=dtype, device=self.dev)})

        def fn_dtype(kw):
            wrong = torch.float16 if dtype != torch.float16 else torch.float32
            return dict(kw, **{key: torch.empty(tuple(shape_fn(kw)), dtype=wrong,
                                                device=self.dev)})
        return {f"shape:{key}": mutation(fn_shape, hints_of(key)),
                f"dtype_of:{key}": mutation(fn_dtype, hints_of(key))}

    def m_workspace(self, bytes_fn):
        """A workspace 256 bytes too small (the CPU attention needs none: CUDA only there)."""
        def fn(kw):
            n = bytes_fn(kw)
            if n <= 0:
                return None
            return dict(kw, workspace=torch.empty(max(n - 256, 0), dtype=torch.uint8,
                                                  device=self.dev))
        return {"small_workspace": mutation(fn, ("workspace",))}

    # ---- the ops ----

    def kv_quantized(self, flat_k, flat_v, fmt_k, fmt_v, layout, page_shape):
        """K/V as QTensors quantized by msa on the soak's device: flat [total_k, Hkv, D], or page
        pools (quantized per pool slot; FP4 scales laid out like the values)."""
        out = []
        for x, fmt in ((flat_k, fmt_k), (flat_v, fmt_v)):
            gs = float(self.rng.uniform(0.25, 2.0)) if fmt == "nvfp4" else 1.0
            qt = msa.quantize(self.to(x.to(torch.bfloat16)), fmt, global_scale=gs)
            if page_shape is not None:
                vals = qt.values.reshape(page_shape[:3] + (qt.values.shape[-1],))
                scale = qt.scale
                if fmt in FP4:
                    scale = scale.reshape(page_shape[:3] + (scale.shape[-1],))
                if layout == "paged_hnd":
                    vals = vals.transpose(1, 2).contiguous()
                    scale = scale.transpose(1, 2).contiguous() if fmt in FP4 else scale
                qt = qt._replace(values=vals, scale=scale)
            out.append(qt)
        return out

    def case_attention(self, paged):
        r = self.rng
        lq, lk = self.varlen(48, 700)
        hkv, hq = self.heads()
        # bf16 or f16 q over K/V of its dtype; FP8 or FP4 K/V (CUDA: with bf16 q, one FP4
        # format for both, src/cuda/sm90/sparse_fwd/plan.cpp).
        kind = self.choice(["plain"] * 5 + ["fp8"] * 2 + ["fp4"])
        qdt = torch.bfloat16 if kind != "plain" or self.chance(0.5) else torch.float16
        kvdt = qdt if kind == "plain" else torch.float32  # quantized by msa below
        layout, page_size = "flat", 0
        # A paged cache read without seqused_k reads every table column: full pages then.
        full = paged and self.chance(0.25)
        if paged:
            layout = self.choice(["paged_nhd", "paged_hnd"])
            page_size = self.choice(PAGE_SIZES)
            if full:
                lk = self.full_pages(lk, page_size)
        cu_q, cu_k = self.cu(lq), self.cu(lk)
        q = self.randn(sum(lq), hq, D, dtype=qdt)
        k, v = self.randn(sum(lk), hkv, D, dtype=kvdt), self.randn(sum(lk), hkv, D, dtype=kvdt)
        topk = int(r.integers(1, 9))
        dense = self.chance(0.2)  # no q2k: every visible key
        kw = dict(q=self.strided(self.to(q)), cu_seqlens_q=self.to(cu_q), causal=self.chance(0.8),
                  kv_block_size=BLK)
        if not dense:
            kw["q2k"] = self.to(self.q2k(lq, lk, hkv, topk, BLK))
        if kind == "plain":
            fk = fv = None
        elif kind == "fp8":
            fk, fv = self.choice(FP8), self.choice(FP8)
        else:
            fk = fv = self.choice(FP4)
        if paged:
            (kp, vp), table, seqused = self.pages([k, v], lk, page_size,
                                                  math.nan if kind == "plain" else 0.0,
                                                  spare_column=not full)
            kw.update(page_table=self.to(table), kv_layout=layout)
            if not full:
                kw["seqused_k"] = self.to(seqused)
            if kind == "plain":
                if layout == "paged_hnd":
                    kp, vp = kp.transpose(1, 2).contiguous(), vp.transpose(1, 2).contiguous()
                kw.update(k=self.to(kp), v=self.to(vp))
            else:
                kw["k"], kw["v"] = self.kv_quantized(kp.reshape(-1, hkv, D),
                                                     vp.reshape(-1, hkv, D), fk, fv, layout,
                                                     tuple(kp.shape))
        else:
            kw["cu_seqlens_k"] = self.to(cu_k)
            if kind == "plain":
                kw.update(k=self.strided(self.to(k)), v=self.strided(self.to(v)))
            else:
                kw["k"], kw["v"] = self.kv_quantized(k, v, fk, fv, "flat", None)
        if not dense and self.chance(0.3):
            # The k2q index built by msa from the same q2k (the GPU then skips its own build).
            kv = {x: kw[x] for x in ("cu_seqlens_k", "page_table", "seqused_k", "kv_layout")
                  if x in kw}
            kw["k2q"] = msa.build_k2q_csr(kw["q2k"], kw["cu_seqlens_q"], k=kw["k"],
                                          kv_block_size=BLK, **kv)
        if self.chance(0.3):
            kw["softmax_scale"] = float(r.uniform(0.02, 0.15))
        if self.chance(0.3):
            kw["temperature"] = float(r.uniform(0.3, 2.0))
        kw["partial_dtype"] = self.choice([None, "f32", "bf16"])
        kw["return_lse"] = self.chance(0.6)
        vis_muts = self.visibility(kw, lq, lk, True, mask_on_cuda=True)
        total_q = sum(lq)
        if self.chance(0.2):
            kw["out"] = torch.full((total_q, hq, D), math.nan, dtype=qdt, device=self.dev)
        if kw["return_lse"] and self.chance(0.2):
            kw["lse"] = torch.full((hq, total_q), math.nan, device=self.dev)
        if self.cuda and self.chance(0.2):
            n = msa.attention_workspace_bytes(**self._ws_kw(kw))
            kw["workspace"] = torch.empty(n, dtype=torch.uint8, device=self.dev)
        quantized = kind != "plain"
        n_stats = int(kw["return_lse"]) + int("temperature" in kw)
        tol, lse_tol = (3e-2, 3e-2) if quantized else (1e-2, 2e-3)
        muts = self.m_arrays(["q", "k", "v", "cu_seqlens_q"] + ([] if dense else ["q2k"]))
        if not dense:
            muts.update(self.m_q2k_values())
            muts["list:q2k"] = self.m_array("q2k", "list")
        muts["bad_cu"] = self.m_cu_start()
        muts["short:cu_seqlens_q"] = mutation(
            lambda kw: dict(kw, cu_seqlens_q=kw["cu_seqlens_q"][:-1]), ("cu_seqlens",
                                                                        "page_table"))
        muts["kv_block_size"] = with_kw("kv_block_size", 96)
        muts["negative_block_size"] = with_kw("kv_block_size", -128)
        muts["partial_dtype"] = with_kw("partial_dtype", "f64")
        muts["nan_softmax_scale"] = with_kw("softmax_scale", math.nan)
        muts["negative_temperature"] = with_kw("temperature", -1.0)
        muts["kv_layout"] = with_kw("kv_layout", "paged_xyz")
        muts.update(self.m_out("out", lambda kw: (total_q, hq, D), qdt))
        muts["lse_shape"] = mutation(
            lambda kw: dict(kw, return_lse=True, lse=torch.empty(hq, total_q + 1,
                                                                 device=self.dev)), ("lse",))
        if self.cuda:
            muts.update(self.m_workspace(lambda kw: msa.attention_workspace_bytes(
                **self._ws_kw(kw))))
        if paged:
            muts.update(self.m_pages("page_table", "seqused_k", page_size))
        else:
            muts.update(self.m_missing("cu_seqlens_k"))
        muts.update(vis_muts)
        if "k2q" in kw:
            muts["stale_k2q"] = mutation(self._stale_k2q, ("k2q",))
            muts["k2q_without_q2k"] = mutation(
                lambda kw: {x: y for x, y in kw.items() if x != "q2k"}, ("k2q", "q2k"))
        if kind == "fp8":
            # FP8 K/V scale values are checked on the host for CPU tensors; the CUDA prefill
            # does not check device K/V scales (only the indexer's kernels do), so CPU only.
            muts["nan_k_scale"] = mutation(
                lambda kw: dict(kw, k=kw["k"]._replace(scale=torch.full_like(kw["k"].scale,
                                                                             math.nan))),
                ("scale",), "cpu")
        if kind == "fp4" and kw["k"].format == "nvfp4":
            # The NVFP4 global scale: a host float, checked for any device.
            muts["nan_global_scale"] = mutation(
                lambda kw: dict(kw, k=kw["k"]._replace(global_scale=math.nan)),
                ("global scale",))
        reference = None
        if not quantized:
            # float64 numpy reference of the flat keys (CPU mode), docs/semantics.md, Attention.
            reference = self._np_attention(*self._ref_keys(k, v, lk), lq)
        return Case(("attention_flat" if not paged else "attention_paged") + ("_dense" if dense else ""), kw,
                    msa.attention_forward, mutations=muts, refill=True, reference=reference,
                    compare=lambda g, w: close_attention(g, w, tol, lse_tol, n_stats))

    @staticmethod
    def _ws_kw(kw):
        drop = ("out", "lse", "tlse", "return_lse", "workspace", "stream", "check",
                "softmax_scale")
        return {k: v for k, v in kw.items() if k not in drop}

    def _stale_k2q(self, kw):
        """q2k with one id dropped after its k2q was built: the index no longer matches."""
        y = kw["q2k"].cpu().clone()
        pos = (y >= 0).nonzero()
        if len(pos) == 0:
            return None
        h, t, s = (int(x) for x in pos[int(self.rng.integers(0, len(pos)))])
        y[h, t, s:-1] = y[h, t, s + 1:].clone()
        y[h, t, -1] = -1
        return dict(kw, q2k=y.to(kw["q2k"].device))

    @staticmethod
    def _ref_keys(k, v, lk):
        cu = np.concatenate([[0], np.cumsum(lk)])
        return ([k[cu[b]:cu[b + 1]].double().numpy() for b in range(len(lk))],
                [v[cu[b]:cu[b + 1]].double().numpy() for b in range(len(lk))])

    def _np_attention(self, ks, vs, lq):
        """A float64 reference for CPU mode (np_reference.attention on the keys as the call holds
        them), reading q, q2k and the options the call finally gets."""
        def ref(cpu_kw):
            import np_reference
            co, mask = cpu_kw.get("causal_offset"), cpu_kw.get("key_mask")
            rows = cpu_kw.get("key_mask_rows")
            per_query = mask is not None and (rows == "query" or (
                rows is None and mask.shape[0] != len(lq)))
            out, lse, tlse = np_reference.attention(
                cpu_kw["q"].double().numpy(), ks, vs, self.cu(lq).numpy(),
                q2k=cpu_kw["q2k"].numpy() if "q2k" in cpu_kw else None, blk=BLK,
                causal=cpu_kw["causal"],
                scale=cpu_kw.get("softmax_scale"), temperature=cpu_kw.get("temperature"),
                causal_offset=None if co is None else co.numpy(),
                key_mask=None if mask is None else mask.numpy(), mask_per_query=per_query,
                soft_cap=cpu_kw.get("soft_cap"))
            res = [torch.from_numpy(out)]
            if cpu_kw["return_lse"]:
                res.append(torch.from_numpy(lse))
            if cpu_kw.get("temperature"):
                res.append(torch.from_numpy(tlse))
            return tuple(res)
        return ref

    def case_pipeline(self):
        """sparse_attention (block_topk, k2q, attention in one call) on integer q and k, so the
        selection is exact on both backends; fused index inputs sometimes (FP8, power-of-two
        scales)."""
        r = self.rng
        lq, lk = self.varlen(48, 900)
        hkv, hq = self.heads()
        qdt = self.choice([torch.bfloat16, torch.float16])
        cu_q, cu_k = self.cu(lq), self.cu(lk)
        q, k = self.ints(sum(lq), hq, D, dtype=qdt), self.ints(sum(lk), hkv, D, dtype=qdt)
        v = self.randn(sum(lk), hkv, D, dtype=qdt)
        kw = dict(q=self.to(q), cu_seqlens_q=self.to(cu_q), causal=self.chance(0.8),
                  kv_block_size=BLK, return_lse=self.chance(0.6),
                  return_selection=self.chance(0.5), **self.selection())
        paged = self.chance(0.35)
        page_size = 0
        if paged:
            page_size = self.choice(PAGE_SIZES)
            (kp, vp), table, seqused = self.pages([k, v], lk, page_size, math.nan)
            layout = self.choice(["paged_nhd", "paged_hnd"])
            if layout == "paged_hnd":
                kp, vp = kp.transpose(1, 2).contiguous(), vp.transpose(1, 2).contiguous()
            kw.update(k=self.to(kp), v=self.to(vp), page_table=self.to(table),
                      seqused_k=self.to(seqused), kv_layout=layout)
        else:
            kw.update(k=self.to(k), v=self.to(v), cu_seqlens_k=self.to(cu_k))
            if self.chance(0.25):
                kw["index_q"] = msa.QTensor(self.to(self.ints(sum(lq), hq, D,
                                                              dtype=torch.float8_e4m3fn)),
                                            self.to(self.pow2(sum(lq))), format="fp8_per_token")
                kw["index_k"] = msa.QTensor(self.to(self.ints(sum(lk), hkv, D,
                                                              dtype=torch.float8_e4m3fn)),
                                            self.to(self.pow2(sum(lk))), format="fp8_per_token")
        if self.chance(0.3):
            kw["temperature"] = float(r.uniform(0.3, 2.0))
        if self.chance(0.2):
            kw["out"] = torch.full((sum(lq), hq, D), math.nan, dtype=qdt, device=self.dev)
        if self.chance(0.2):
            n = msa.pipeline_workspace_bytes(**self._pipe_ws_kw(kw))
            kw["workspace"] = torch.empty(n, dtype=torch.uint8, device=self.dev)
        n_stats = int(kw["return_lse"]) + int("temperature" in kw)

        def compare(got, want):
            if kw["return_selection"]:
                err = same(got[-1], want[-1], "q2k selection")
                if err:
                    return err
                got, want = got[:-1], want[:-1]
            return close_attention(got, want, 1e-2, 2e-3, n_stats)
        muts = self.m_arrays(["q", "k", "v", "cu_seqlens_q"])
        muts.update(self.m_selection())
        muts["kv_block_size"] = with_kw("kv_block_size", 96)
        muts["nan_softmax_scale"] = with_kw("softmax_scale", math.nan)
        muts["bad_cu"] = self.m_cu_start()
        muts.update(self.m_workspace(lambda kw: msa.pipeline_workspace_bytes(
            **self._pipe_ws_kw(kw))))
        muts.update(self.m_out("out", lambda kw: (sum(lq), hq, D), qdt))
        if paged:
            muts.update(self.m_pages("page_table", "seqused_k", page_size))
        else:
            muts.update(self.m_missing("cu_seqlens_k"))
            if "index_k" in kw:
                muts["extent:index_k"] = self.m_array("index_k", "extent")
        return Case("sparse_attention", kw, msa.sparse_attention, compare=compare,
                    mutations=muts, refill="index_q" not in kw)

    @staticmethod
    def _pipe_ws_kw(kw):
        drop = ("out", "lse", "return_lse", "return_selection", "workspace", "stream", "check",
                "softmax_scale")
        return {k: v for k, v in kw.items() if k not in drop}

    def indexer_inputs(self, lq, lk, hkv, hq, paged):
        """q and k for the indexer: bf16 / f16, or FP8 (a QTensor, or values plus q_scale /
        k_scale; power-of-two scales per token or tensor), flat or paged (per-slot scales).
        Returns (keywords, page size, kind, the key lengths)."""
        kind = self.choice(["bf16", "f16", "fp8"])
        dt = {"bf16": torch.bfloat16, "f16": torch.float16, "fp8": torch.float8_e4m3fn}[kind]
        kw, page_size = {}, 0
        full = paged and self.chance(0.3)  # no seqused_k: every table column is read
        if paged:
            page_size = self.choice(PAGE_SIZES)
            if full:
                lk = self.full_pages(lk, page_size)
        q, k = self.ints(sum(lq), hq, D, dtype=dt), self.ints(sum(lk), hkv, D, dtype=dt)
        if paged:
            # Unused slots hold NaN (0x7f for e4m3): never read.
            (kp,), table, seqused = self.pages([k.view(torch.uint8) if kind == "fp8" else k], lk,
                                               page_size, 0x7F if kind == "fp8" else math.nan,
                                               spare_column=not full)
            kp = kp.view(dt)
            layout = self.choice(["paged_nhd", "paged_hnd"])
            kw.update(page_table=self.to(table), kv_layout=layout)
            if not full:
                kw["seqused_k"] = self.to(seqused)
            n_keys = kp.shape[0] * page_size
            if layout == "paged_hnd":
                kp = kp.transpose(1, 2).contiguous()
            k = kp
        else:
            kw["cu_seqlens_k"] = self.to(self.cu(lk))
            n_keys = sum(lk)
        q, k = self.to(q), self.to(k)
        if kind == "fp8":
            qs = self.pow2(sum(lq)) if self.chance(0.5) else self.pow2(1)
            ks = self.pow2(n_keys) if self.chance(0.5) else self.pow2(1)
            qs, ks = self.to(qs), self.to(ks)
            if self.chance(0.5):
                kw.update(q=msa.QTensor(q, qs), k=msa.QTensor(k, ks))
            else:
                kw.update(q=q, q_scale=qs, k=k, k_scale=ks)
        else:
            kw.update(q=self.strided(q) if not paged else q, k=k)
        return kw, page_size, kind, lk

    def _indexer_muts(self, kw, lq, lk, page_size, kind):
        muts = self.m_arrays(["q", "k", "cu_seqlens_q"])
        muts["kv_block_size"] = with_kw("kv_block_size", 96)
        if "page_table" in kw:
            muts.update(self.m_pages("page_table", "seqused_k", page_size))
        else:
            muts.update(self.m_missing("cu_seqlens_k"))
        if kind == "fp8" and any(a > 0 and b > 0 for a, b in zip(lq, lk)):
            # NaN scales: the host check on the CPU, the kernels' (negative_scale) on CUDA; the
            # last query of a request with keys reads every key.
            def nan_scale(which):
                def fn(kw):
                    if isinstance(kw[which], msa.QTensor):
                        x = kw[which]
                        return dict(kw, **{which: x._replace(scale=torch.full_like(x.scale,
                                                                                   math.nan))})
                    return dict(kw, **{which + "_scale": torch.full_like(kw[which + "_scale"],
                                                                         math.nan)})
                return mutation(fn, ("scale",))
            muts["nan_q_scale"], muts["nan_k_scale"] = nan_scale("q"), nan_scale("k")
        return muts

    def case_block_scores(self):
        lq, lk = self.varlen(48, 900)
        hkv, hq = self.heads()
        paged = self.chance(0.35)
        kw, page_size, kind, lk = self.indexer_inputs(lq, lk, hkv, hq, paged)
        kw.update(cu_seqlens_q=self.to(self.cu(lq)), causal=self.chance(0.8), kv_block_size=BLK)
        if not paged and self.chance(0.5):
            kw["max_seqlen_k"] = max(lk) + int(self.rng.integers(0, 300))
        if paged:
            nblk = -(-kw["page_table"].shape[1] * page_size // BLK)
        else:
            nblk = -(-kw.get("max_seqlen_k", max(lk)) // BLK)
        if self.chance(0.2):
            kw["out"] = torch.full((hq, nblk, sum(lq)), math.nan, device=self.dev)
        muts = self._indexer_muts(kw, lq, lk, page_size, kind)
        muts["negative_max_seqlen_k"] = with_kw("max_seqlen_k", -1)
        muts.update(self.m_out("out", lambda kw: (hq, nblk, sum(lq)), torch.float32))
        # A flat cache without max_seqlen_k reads the lengths on the host: not capturable.
        return Case("block_scores", kw, msa.block_scores, mutations=muts,
                    graph=paged or "max_seqlen_k" in kw, refill=kind != "fp8",
                    compare=lambda g, w: close_rows(g[0], w[0], 1e-3, "scores"))

    def case_block_topk(self):
        lq, lk = self.varlen(48, 900)
        hkv, hq = self.heads()
        paged = self.chance(0.35)
        kw, page_size, kind, lk = self.indexer_inputs(lq, lk, hkv, hq, paged)
        kw.update(cu_seqlens_q=self.to(self.cu(lq)), causal=self.chance(0.8), kv_block_size=BLK,
                  **self.selection())
        topk = kw["topk"]
        if self.chance(0.2):
            kw["out"] = torch.full((hkv, sum(lq), topk), 7, dtype=torch.int32, device=self.dev)
        muts = self._indexer_muts(kw, lq, lk, page_size, kind)
        muts.update(self.m_selection())
        muts.update(self.m_out("out", lambda kw: (hkv, sum(lq), topk), torch.int32))
        return Case("block_topk", kw, msa.block_topk, mutations=muts, refill=kind != "fp8")

    def case_select_topk(self):
        """select_topk over random scores with ties, NaN and -inf (the selection rule of
        docs/semantics.md, Top-K selection; exact on both backends)."""
        r = self.rng
        lq, lk = self.varlen(48, 900)
        hkv, hq = self.heads()
        blk = self.choice([64, 128])
        paged = self.chance(0.3)
        kw = dict(cu_seqlens_q=self.to(self.cu(lq)), num_kv_heads=hkv, causal=self.chance(0.8),
                  kv_block_size=blk)
        page_size = self.lengths_kv(kw, lk, hkv, paged)
        nblk = -(-max(lk) // blk) + int(r.integers(0, 3))
        scores = torch.round(self.randn(hq, nblk, sum(lq)) * 4) / 4  # ties
        special = torch.from_numpy(r.random(scores.shape) < 0.05)
        scores[special] = self.choice([math.nan, -math.inf])
        kw["scores"] = self.to(scores)
        kw.update(self.selection())
        topk = kw["topk"]
        muts = self.m_arrays(["scores", "cu_seqlens_q"])
        muts["num_kv_heads"] = with_kw("num_kv_heads", hq + 1)
        muts.update(self.m_selection())
        muts["kv_block_size"] = with_kw("kv_block_size", 96)
        muts.update(self.m_out("out", lambda kw: (hkv, sum(lq), topk), torch.int32))
        need = -(-max(lk) // blk)
        if not paged and any(lq[b] and -(-lk[b] // blk) == need for b in range(len(lk))) \
                and need > 0:
            # Too few score blocks for a request whose last query sees them all (a host check on
            # the CPU, shape_mismatch per query on the device).
            muts["short_scores"] = mutation(
                lambda kw: dict(kw, scores=kw["scores"][:, :need - 1].contiguous()),
                ("scores", "shape mismatch"))
        if not paged:
            muts.update(self.m_missing("cu_seqlens_k"))
        return Case("select_topk", kw, msa.select_topk, mutations=muts)

    def q2k_problem(self, max_q, max_k):
        """(lq, lk, hkv, kv_block_size, topk, q2k) of a random valid selection."""
        lq, lk = self.varlen(max_q, max_k)
        hkv, _ = self.heads()
        blk = self.choice([64, 128])
        topk = int(self.rng.integers(1, 9))
        return lq, lk, hkv, blk, topk, self.q2k(lq, lk, hkv, topk, blk)

    def case_build_k2q(self):
        lq, lk, hkv, blk, topk, q2k = self.q2k_problem(48, 900)
        kw = dict(q2k=self.to(q2k), cu_seqlens_q=self.to(self.cu(lq)), kv_block_size=blk,
                  return_schedule=self.chance(0.7))
        rows = sum(-(-n // blk) for n in lk)
        paged = self.chance(0.3)
        graph = True
        page_size = self.lengths_kv(kw, lk, hkv, paged)
        if not paged:
            how = self.choice(["k", "total_rows", "lengths"])
            if how == "k":  # total_rows from k's shape: total_k // blk + B
                kw["k"] = self.to(torch.zeros(sum(lk), hkv, D, dtype=torch.bfloat16))
            elif how == "total_rows":
                kw["total_rows"] = rows + int(self.rng.integers(0, 3))
            else:
                graph = False  # the lengths are read on the host
        muts = self.m_arrays(["q2k", "cu_seqlens_q"])
        muts.update(self.m_q2k_values())
        muts["bad_cu"] = self.m_cu_start()
        muts["kv_block_size"] = with_kw("kv_block_size", 96)
        muts["out_list"] = mutation(lambda kw: dict(kw, out=[torch.zeros(1, device=self.dev)]),
                                    ("out",))
        if rows > 0 and not paged:
            muts["short_rows"] = mutation(lambda kw: dict(kw, total_rows=rows - 1),
                                          ("row_ptr", "total_rows"))
        if paged:
            muts.update(self.m_missing("k"))
        return Case("build_k2q_csr", kw, msa.build_k2q_csr, mutations=muts, graph=graph,
                    compare=k2q_equal)

    def case_k2q_convert(self):
        """The CPU reference converters (host arrays only): q2k -> k2q -> q2k round trip."""
        lq, lk, hkv, blk, topk, q2k = self.q2k_problem(32, 600)
        kw = dict(q2k=q2k, cu_seqlens_q=self.cu(lq), cu_seqlens_k=self.cu(lk), kv_block_size=blk,
                  topk=topk)

        def run(kw):
            kw = dict(kw)
            topk, q2k = kw.pop("topk"), kw["q2k"]
            idx = msa.q2k_to_k2q(**kw)
            del kw["q2k"]
            back = msa.k2q_to_q2k(idx, topk=topk, **kw)
            err = same(back, q2k, "round trip")
            if err:  # each row of a valid q2k is ascending and -1 padded: the trip is exact
                raise WrongResult(f"k2q_to_q2k(q2k_to_k2q(q2k)) != q2k: {err}")
            return (idx.row_ptr, idx.q_idx, back)
        muts = self.m_arrays(["q2k", "cu_seqlens_q"], ("rank", "extent"))
        muts["bad_id"] = self.m_q2k_values()["bad_id"]
        muts["kv_block_size"] = with_kw("kv_block_size", 96)
        muts["topk_zero"] = with_kw("topk", 0)
        muts["on_cuda"] = mutation(lambda kw: dict(kw, q2k=kw["q2k"].cuda()), ("cpu", "CPU"),
                                   "cuda")
        return Case("k2q_convert", kw, bind=lambda kw: (lambda: run(kw)), mutations=muts,
                    graph=False, check=False, stream=False)

    def case_decode(self):
        """DecodePlan.plan then run: dense or sparse, bf16 / f16 / FP8 page pools (nhd, hnd),
        bf16 / f16 / FP8 queries, run lengths equal to or below the planned ones."""
        r = self.rng
        s = self.big()
        batch = int(r.integers(1, 9 * (4 if s > 1 else 1)))
        mqpr = int(self.choice([1, 1, 2, 4]))
        lq = [int(x) for x in r.integers(0, mqpr + 1, batch)]
        if sum(lq) == 0:
            lq[0] = 1
        lk = [int(x) for x in r.integers(0, 1500 * s + 1, batch)]
        hkv, hq = self.heads()
        page_size = self.choice(PAGE_SIZES)
        layout = self.choice(["paged_nhd", "paged_hnd"])
        cache = self.choice(["bf16", "f16", "fp8"])
        qkind = {"bf16": ["bf16", "fp8"], "f16": ["f16"], "fp8": ["bf16", "f16", "fp8"]}[cache]
        qkind = self.choice(qkind)
        topk = int(r.integers(1, 9)) if self.chance(0.4) else 0
        k, v = self.randn(sum(lk), hkv, D), self.randn(sum(lk), hkv, D)
        cdt = {"bf16": torch.bfloat16, "f16": torch.float16, "fp8": torch.float32}[cache]
        (kp, vp), table, seqused = self.pages([k.to(cdt), v.to(cdt)], lk, page_size,
                                              0.0 if cache == "fp8" else math.nan)
        shape = dict(batch=batch, num_q_heads=hq, num_kv_heads=hkv, head_dim=D,
                     page_size=page_size, max_pages=table.shape[1],
                     max_queries_per_request=mqpr, kv_layout=layout, topk=topk,
                     kv_dtype={"bf16": "bf16", "f16": "f16", "fp8": "fp8_e4m3"}[cache])
        if self.chance(0.3) and cache != "fp8":
            shape["kv_dtype"] = {"bf16": torch.bfloat16, "f16": torch.float16}[cache]
        if cache == "fp8":
            page_shape = tuple(kp.shape)
            kk, vv = self.kv_quantized(kp.reshape(-1, hkv, D), vp.reshape(-1, hkv, D),
                                       self.choice(FP8), self.choice(FP8), layout, page_shape)
        else:
            if layout == "paged_hnd":
                kp, vp = kp.transpose(1, 2).contiguous(), vp.transpose(1, 2).contiguous()
            kk, vv = self.to(kp), self.to(vp)
        # Lengths at plan time; run may see them shrunk (docs: key counts may shrink freely).
        run_len = seqused.clone()
        if self.chance(0.3):
            run_len = torch.from_numpy(r.integers(0, seqused.numpy() + 1)).to(torch.int32)
        q = self.randn(sum(lq), hq, D)
        q_scale = None
        if qkind == "fp8":  # a QTensor, or its values plus q_scale
            qq = msa.quantize(self.to(q.to(torch.bfloat16)), self.choice(FP8))
            if self.chance(0.5):
                qq, q_scale = qq.values, qq.scale
        else:
            qq = self.to(q.to({"bf16": torch.bfloat16, "f16": torch.float16}[qkind]))
        kw = dict(plan=shape, plan_seqused=self.to(seqused) if self.chance(0.8) else None,
                  k_cache=kk, v_cache=vv, page_table=self.to(table),
                  cu_seqlens_q=self.to(self.cu(lq)), seqused_k=self.to(run_len),
                  causal=self.chance(0.8), return_lse=self.chance(0.6))
        kw["q"] = qq
        if q_scale is not None:
            kw["q_scale"] = q_scale
        if topk:
            kw["q2k"] = self.to(self.q2k(lq, run_len.tolist(), hkv, topk, BLK))
        if self.chance(0.3):
            kw["softmax_scale"] = float(r.uniform(0.02, 0.15))
        out_dt = torch.bfloat16 if qkind in ("bf16", "fp8") else torch.float16
        if self.chance(0.2):
            kw["out"] = torch.full((sum(lq), hq, D), math.nan, dtype=out_dt, device=self.dev)
        vis_muts = self.visibility(kw, lq, run_len.tolist(), False)
        low = cache == "fp8" or qkind == "fp8"
        tol, lse_tol = (3e-2, 3e-2) if low else (1e-2, 2e-3)
        n_stats = int(kw["return_lse"])

        def bind(kw):
            kw = dict(kw)
            shape, plan_len = kw.pop("plan"), kw.pop("plan_seqused")
            unplanned = kw.pop("unplanned", False)
            plan = msa.DecodePlan()
            if not unplanned:
                plan.plan(**shape, seqused_k=plan_len, device=device_of(kw["q"]),
                          stream=kw.get("stream"))
            return lambda: plan.run(**kw)

        def plan_kw(key, value):
            return mutation(lambda kw: dict(kw, plan=dict(kw["plan"], **{key: value})),
                            (key, "planned", "decode shape"))
        muts = self.m_arrays(["q", "k_cache", "v_cache", "page_table", "cu_seqlens_q"])
        # CUDA decode checks the page ids it loads: all of a request's pages when the request
        # has queries and the plan is dense (the last query sees every key).
        with_q = [b for b in range(batch) if lq[b] > 0]
        muts.update(self.m_pages("page_table", "seqused_k", page_size, with_q))
        if topk:
            del muts["bad_page"]
        muts["bad_cu"] = self.m_cu_start()
        muts["plan_kv_dtype"] = plan_kw("kv_dtype", "f32")
        muts["plan_page_size"] = plan_kw("page_size", 48)
        muts["plan_kv_heads"] = plan_kw("num_kv_heads", hq + 1)
        muts["plan_head_dim"] = plan_kw("head_dim", 64)
        muts["plan_topk"] = plan_kw("topk", -1)
        muts["plan_block_size"] = plan_kw("kv_block_size", 96)
        muts["plan_queries"] = plan_kw("max_queries_per_request", 0)
        muts["unplanned"] = mutation(lambda kw: dict(kw, unplanned=True), ("plan",))
        muts["nan_softmax_scale"] = with_kw("softmax_scale", math.nan)
        muts.update(self.m_out("out", lambda kw: (sum(lq), hq, D), out_dt))
        muts["lse_shape"] = mutation(
            lambda kw: dict(kw, return_lse=True, lse=torch.empty(hq, sum(lq) + 1,
                                                                 device=self.dev)), ("lse",))
        if not topk and qkind != "fp8":
            # More queries in a request than planned: a host check on the CPU,
            # queries_past_plan on the device. (Dense only: q2k would change shape too.)
            more = [n + mqpr for n in lq]

            def past_plan(kw):
                kw = {x: y for x, y in kw.items() if x not in ("out", "lse")}
                return dict(kw, q=self.to(self.randn(sum(more), hq, D, dtype=out_dt)),
                            cu_seqlens_q=self.to(self.cu(more)))
            muts["queries_past_plan"] = mutation(past_plan, ("cu_seqlens_q",
                                                             "max_queries_per_request"))
        if topk:
            cu = np.concatenate([[0], np.cumsum(lq)])
            muts.update(self.m_q2k_values([t for b in range(batch) if run_len[b] > 0
                                           for t in range(cu[b], cu[b + 1])]))
            muts.update(self.m_missing("q2k"))
        else:
            muts["q2k_for_dense"] = mutation(
                lambda kw: dict(kw, q2k=torch.zeros(hkv, sum(lq), 1, dtype=torch.int32,
                                                    device=self.dev)), ("q2k",))
        muts.update(vis_muts)
        if cache == "fp8":  # (CPU only: CUDA decode does not check device scales)
            muts["nan_k_scale"] = mutation(
                lambda kw: dict(kw, k_cache=kw["k_cache"]._replace(
                    scale=torch.full_like(kw["k_cache"].scale, math.nan))), ("scale",), "cpu")
        return Case("decode", kw, bind=bind, mutations=muts, refill=qkind != "fp8",
                    compare=lambda g, w: close_attention(g, w, tol, lse_tol, n_stats))

    def case_quantize(self):
        r = self.rng
        fmt = self.choice(FP8 + FP4)
        dq = self.choice([32, 64, 128, 256])
        t, h = int(r.integers(1, 300 * self.big() + 1)), int(r.integers(1, 9))
        dt = self.choice([torch.float32, torch.bfloat16, torch.float16])
        x = (self.randn(t, h, dq) * float(r.uniform(0.05, 20))).to(dt)
        kw = dict(x=self.to(x), format=fmt)
        if fmt == "nvfp4":
            kw["global_scale"] = float(r.uniform(0.25, 2.0))
        if self.chance(0.15):
            fp8 = fmt in FP8
            vals = torch.empty(t, h, dq if fp8 else dq // 2,
                               dtype=torch.float8_e4m3fn if fp8 else torch.uint8, device=self.dev)
            sshape = {"fp8_per_tensor": (1,), "fp8_per_token": (t,), "fp8_per_token_head": (t, h),
                      "nvfp4": (t, h, dq // 16), "mxfp4": (t, h, dq // 32)}[fmt]
            sdt = {"nvfp4": torch.float8_e4m3fn, "mxfp4": torch.uint8}.get(fmt, torch.float32)
            kw["out"] = (vals, torch.empty(sshape, dtype=sdt, device=self.dev))
        muts = self.m_arrays(["x"], ("rank", "stride"))
        if "out" in kw:  # (without out= a CPU x is a valid CPU call)
            muts["device:x"] = self.m_array("x", "device")
        muts["format"] = with_kw("format", "fp16")
        muts["out_list"] = mutation(lambda kw: dict(kw, out=[torch.zeros(1, device=self.dev)]),
                                    ("out",))
        muts["dtype:x"] = mutation(lambda kw: dict(kw, x=kw["x"].double()), ("x",))
        if fmt in FP4:
            # A head dim that is no multiple of the format's scale group.
            muts["group"] = mutation(lambda kw: dict(kw, x=kw["x"][..., :dq - 8]), ("head dim",))
        if fmt == "nvfp4":
            muts["nan_global_scale"] = with_kw("global_scale", math.nan)
        if "out" in kw:
            muts["out_shape"] = mutation(
                lambda kw: dict(kw, out=(kw["out"][0][:-1], kw["out"][1])), ("out",))
        return Case("quantize", kw, msa.quantize, mutations=muts, check=False)

    def case_dequantize(self):
        r = self.rng
        fmt = self.choice(FP8 + FP4)
        dq = self.choice([32, 64, 128])
        t, h = int(r.integers(1, 200 * self.big() + 1)), int(r.integers(1, 9))
        gs = float(r.uniform(0.25, 2.0)) if fmt == "nvfp4" else 1.0
        qt = msa.quantize(self.to(self.randn(t, h, dq) * float(r.uniform(0.1, 10))), fmt,
                          global_scale=gs)
        dtype = self.choice(["f32", "bf16", "f16"])
        if self.chance(0.5):
            kw = dict(x=qt, dtype=dtype)
        else:
            kw = dict(x=qt.values, scale=qt.scale, format=fmt, global_scale=gs, dtype=dtype)
        tdt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[dtype]
        if self.chance(0.15):
            kw["out"] = torch.full((t, h, dq), math.nan, dtype=tdt, device=self.dev)
        muts = {"dtype": with_kw("dtype", "f64"),
                "format": mutation(lambda kw: dict(kw, x=kw["x"].values, scale=kw["x"].scale,
                                                   format="bogus") if isinstance(
                    kw["x"], msa.QTensor) else dict(kw, format="bogus"), ("format",)),
                "rank:x": mutation(lambda kw: dict(kw, x=kw["x"]._replace(
                    values=kw["x"].values.unsqueeze(0))) if isinstance(kw["x"], msa.QTensor)
                    else dict(kw, x=kw["x"].unsqueeze(0)), ("x",)),
                "scale_shape": mutation(self._short_scale, ("scale",))}
        muts["shape:out"] = self.m_out("out", lambda kw: (t, h, dq), tdt)["shape:out"]
        muts["out_int"] = mutation(
            lambda kw: dict(kw, out=torch.zeros(t, h, dq, dtype=torch.int32, device=self.dev)),
            ("out",))
        if fmt in FP4:
            muts["missing_scale"] = mutation(
                lambda kw: dict(kw, x=kw["x"]._replace(scale=None))
                if isinstance(kw["x"], msa.QTensor) else dict(kw, scale=None), ("scale",))
        if fmt == "nvfp4":
            muts["nan_global_scale"] = mutation(
                lambda kw: dict(kw, x=kw["x"]._replace(global_scale=math.nan))
                if isinstance(kw["x"], msa.QTensor) else dict(kw, global_scale=math.nan),
                ("global_scale",))
        return Case("dequantize", kw, msa.dequantize, mutations=muts, check=False)

    @staticmethod
    def _short_scale(kw):
        """The scale one row short (of a QTensor or the scale keyword)."""
        if isinstance(kw["x"], msa.QTensor):
            return dict(kw, x=kw["x"]._replace(scale=kw["x"].scale[:-1]))
        return dict(kw, scale=kw["scale"][:-1])

    def case_mqa_logits(self):
        """FP8 q [T, H, 128], k [S, 128] with per-key scales (CUDA: fp8, D 128, H <= 128)."""
        r = self.rng
        t = int(r.integers(1, 64 * self.big() + 1))
        s_keys = int(r.integers(1, 1000 * self.big() + 1))
        heads = self.choice([1, 4, 8, 16, 32, 64] + ([128] if self.big() > 1 else []))
        q = self.randn(t, heads, D, dtype=torch.float8_e4m3fn)
        k = self.randn(s_keys, D, dtype=torch.float8_e4m3fn)
        scale = torch.rand(s_keys, generator=self.gen) + 0.5
        w = torch.rand(t, heads, generator=self.gen) * 2 - 1
        ks = torch.from_numpy(r.integers(0, s_keys + 1, t)).to(torch.int32)
        ke = torch.minimum(ks + torch.from_numpy(r.integers(0, s_keys + 1, t)).to(torch.int32),
                           torch.tensor(s_keys, dtype=torch.int32))
        kw = dict(q=self.to(q), weights=self.to(w), ks=self.to(ks), ke=self.to(ke),
                  clean_logits=self.chance(0.8))
        if self.chance(0.5):
            kw.update(k=self.to(k), k_scale=self.to(scale))
        else:
            kw["k"] = msa.QTensor(self.to(k), self.to(scale))
        if not kw["clean_logits"] or self.chance(0.2):
            # Columns outside [ks, ke) keep what out held without clean_logits.
            kw["out"] = torch.full((t, s_keys), 7.0, device=self.dev)
        muts = self.m_arrays(["q", "weights", "ks"], ("rank", "device"))
        muts["dtype:k"] = mutation(lambda kw: dict(kw, k=torch.zeros(s_keys, D,
                                                                     dtype=torch.bfloat16,
                                                                     device=self.dev),
                                                   k_scale=None), ("k",))

        def range_bad(y):
            y[int(r.integers(0, t))] = s_keys + 1
        muts["ke_past_s"] = self.m_edit("ke", range_bad, ("ks", "ke"))
        def ks_after_ke(kw):
            a, b = kw["ks"].cpu().clone(), kw["ke"].cpu().clone()
            if b[0] < s_keys:
                a[0] = b[0] + 1
            elif a[0] > 0:
                b[0] = a[0] - 1
            else:
                a[0], b[0] = s_keys, s_keys - 1
            return dict(kw, ks=self.to(a), ke=self.to(b))
        muts["ks_after_ke"] = mutation(ks_after_ke, ("ks", "ke"))
        muts["weights_shape"] = mutation(
            lambda kw: dict(kw, weights=torch.zeros(t, heads + 1, device=self.dev)), ("weights",))
        muts.update(self.m_out("out", lambda kw: (t, s_keys), torch.float32))
        return Case("mqa_logits", kw, msa.mqa_logits, mutations=muts,
                    compare=lambda g, w: close_rows(g[0], w[0], 1e-3, "logits"))

    def case_paged_mqa_logits(self):
        """Seed 001's fused pool (test_gpu_logits._pool): shuffled blocks, -1 past each table."""
        r = self.rng
        batch = int(r.integers(1, 5))
        next_n = int(r.integers(1, 5))
        heads = self.choice([8, 16, 32, 64])
        bs = self.choice([32, 64, 128])
        lens = [int(x) for x in r.integers(0, 700 * self.big() + 1, batch)]
        blocks = sum(-(-n // bs) for n in lens) + 1
        pool = torch.zeros(blocks, bs, 1, D + 4, dtype=torch.uint8)
        flat = pool.view(blocks, bs * (D + 4))
        flat[:, :bs * D] = self.randn(blocks, bs * D, dtype=torch.float8_e4m3fn).view(torch.uint8)
        flat[:, bs * D:] = (torch.rand(blocks, bs, generator=self.gen) + 0.5).view(
            torch.uint8).reshape(blocks, bs * 4)
        order = r.permutation(blocks)
        width = max(-(-n // bs) for n in lens) + 1
        tables = torch.full((batch, width), -1, dtype=torch.int32)
        nxt = 0
        for b, n in enumerate(lens):
            for c in range(-(-n // bs)):
                tables[b, c] = int(order[nxt])
                nxt += 1
        max_len = max(lens) + int(r.integers(1, 10))
        kw = dict(q=self.to(self.randn(batch, next_n, heads, D, dtype=torch.float8_e4m3fn)),
                  kv_fused=self.to(pool),
                  weights=self.to(torch.rand(batch * next_n, heads, generator=self.gen) * 2 - 1),
                  block_tables=self.to(tables), seq_lens=self.to(torch.tensor(lens,
                                                                              dtype=torch.int32)),
                  max_seq_len=max_len, clean_logits=self.chance(0.8))
        if not kw["clean_logits"] or self.chance(0.2):
            kw["out"] = torch.full((batch * next_n, max_len + int(r.integers(0, 3))), 7.0,
                                   device=self.dev)
        muts = self.m_arrays(["q", "weights", "block_tables", "seq_lens"], ("rank", "device"))

        def too_long(y):
            y[int(r.integers(0, batch))] = max_len + 1
        muts["seq_len_past_max"] = self.m_edit("seq_lens", too_long, ("seq_lens",))

        def bad_block(y):
            used = [(b, c) for b in range(batch) for c in range(-(-lens[b] // bs))]
            if not used:
                return False
            b, c = used[int(r.integers(0, len(used)))]
            y[b, c] = blocks + 2
        muts["bad_block"] = self.m_edit("block_tables", bad_block, ("block_tables", "page id",
                                                                    "block id"))
        # A length the table cannot hold (within max_seq_len): block_table_narrow on CUDA.
        muts["narrow_table"] = mutation(
            lambda kw: {**{x: y for x, y in kw.items() if x != "out"},
                        "seq_lens": self.to(torch.tensor([width * bs + 1] + lens[1:],
                                                         dtype=torch.int32)),
                        "max_seq_len": max(max_len, width * bs + 1)}, ("block_tables",))
        muts["kv_fused_width"] = mutation(
            lambda kw: dict(kw, kv_fused=torch.zeros(blocks, bs, 1, D + 5, dtype=torch.uint8,
                                                     device=self.dev)), ("kv_fused",))
        muts["q_sf_for_fp8"] = mutation(
            lambda kw: dict(kw, q_sf=torch.zeros(batch, next_n, heads, D // 32, dtype=torch.uint8,
                                                 device=self.dev)), ("q_sf",))
        muts["negative_max_seq_len"] = with_kw("max_seq_len", -1)
        if max_len > 0:
            muts["narrow_out"] = mutation(
                lambda kw: dict(kw, out=torch.zeros(batch * next_n, max_len - 1,
                                                    device=self.dev)), ("logits",))
        return Case("paged_mqa_logits", kw, msa.paged_mqa_logits, mutations=muts,
                    compare=lambda g, w: close_rows(g[0], w[0], 1e-3, "logits"))

    def case_token_topk(self):
        """token_topk over rows with ties, NaN and -inf, on the soak's device (CUDA: a radix
        select per row, the CPU's ids for any topk); ranges, a strided row view, out=. A bad
        range is a host check on the CPU and key_range_invalid through the status on CUDA."""
        r = self.rng
        rows, cols = int(r.integers(1, 64)), int(r.integers(1, 1500 * self.big()))
        logits = torch.round(torch.randn(rows, cols, generator=self.gen) * 8) / 8
        logits[torch.from_numpy(r.random((rows, cols)) < 0.05)] = self.choice([math.nan,
                                                                                -math.inf])
        topk = int(r.integers(1, min(cols + 3, 64 if self.big() == 1 else 2048) + 1))
        kw = dict(logits=self.strided(self.to(logits)), topk=topk)
        if self.chance(0.5):
            ks = torch.from_numpy(r.integers(0, cols + 1, rows)).to(torch.int32)
            ke = torch.minimum(ks + torch.from_numpy(r.integers(0, cols + 1, rows)).to(
                torch.int32), torch.tensor(cols, dtype=torch.int32))
            kw.update(ks=self.to(ks), ke=self.to(ke))
        if self.chance(0.2):
            kw["out"] = torch.full((rows, topk), 12345, dtype=torch.int32, device=self.dev)
        muts = self.m_arrays(["logits"], ("rank", "stride", "device"))
        muts["dtype:logits"] = mutation(lambda kw: dict(kw, logits=kw["logits"].double()),
                                        ("logits",))
        muts["topk_zero"] = with_kw("topk", 0)
        muts["ks_alone"] = mutation(
            lambda kw: dict(kw, ks=torch.zeros(rows, dtype=torch.int32, device=self.dev),
                            ke=None), ("ks",))
        muts["out_shape"] = mutation(
            lambda kw: dict(kw, out=torch.zeros(rows, kw["topk"] + 1, dtype=torch.int32,
                                                device=self.dev)), ("ids",))

        def ranges(kw):
            if "ks" in kw:
                return kw["ks"].cpu().clone(), kw["ke"].cpu().clone()
            return torch.zeros(rows, dtype=torch.int32), torch.full((rows,), cols,
                                                                     dtype=torch.int32)

        def ke_past(kw):
            ks, ke = ranges(kw)
            ke[int(r.integers(0, rows))] = cols + 1 + int(r.integers(0, 5))
            return dict(kw, ks=self.to(ks), ke=self.to(ke))

        def ks_after_ke(kw):
            ks, ke = ranges(kw)
            t = int(r.integers(0, rows))
            if ke[t] < cols:
                ks[t] = ke[t] + 1
            elif ks[t] > 0:
                ke[t] = ks[t] - 1
            else:
                ks[t], ke[t] = cols, cols - 1
            return dict(kw, ks=self.to(ks), ke=self.to(ke))
        muts["ke_past_s"] = mutation(ke_past, ("ks", "ke"))
        muts["ks_after_ke"] = mutation(ks_after_ke, ("ks", "ke"))
        if "ks" in kw:
            muts.update(self.m_arrays(["ks"], ("extent", "device")))
            muts["dtype:ke"] = self.m_dtype("ke")
        return Case("token_topk", kw, msa.token_topk, mutations=muts)

    def case_check_status(self):
        """msa.check_status on a caller's status buffer: quiet when zero, MsaError for an
        offence or a malformed buffer."""
        kw = dict(status=torch.zeros(4, dtype=torch.int32, device=self.dev))

        def offence(y):
            y[0], y[1], y[2], y[3] = 1, 0, 0, 0
        muts = {"offence": self.m_edit("status", offence, ("q2k",)),
                "dtype:status": self.m_dtype("status"),
                "shape:status": mutation(lambda kw: dict(kw, status=kw["status"][:3]),
                                         ("status",)),
                "list:status": self.m_array("status", "list")}
        return Case("check_status", kw, lambda **kw: (msa.check_status(**kw), kw["status"])[1],
                    mutations=muts, graph=False, check=False)

    # ---- dense attention's keywords (docs/semantics.md, Dense attention) ----

    def key_mask(self, rows, lk_max):
        """A random key mask [rows, lk_max], bool or uint8 (any nonzero byte visible), about
        three keys in four visible; sometimes one row broadcast (stride 0)."""
        seen = torch.from_numpy(self.rng.random((rows, lk_max)) < 0.75)
        if self.chance(0.5):
            m = seen
        else:
            m = torch.from_numpy(self.rng.integers(1, 256, (rows, lk_max), dtype=np.uint8))
            m = m * seen.to(torch.uint8)
        if rows > 1 and self.chance(0.15):
            m = m[:1].expand(rows, lk_max)
        return self.to(m)

    def visibility(self, kw, lq, lk, offsets_on_cuda, mask_on_cuda=False):
        """causal_offset, key_mask (with key_mask_rows) and soft_cap drawn into kw; returns their
        mutations. lk: each request's key count Lk_b (the keys a mask must cover). The CUDA
        prefill takes causal_offset and the soft-cap (offsets_on_cuda), and the key mask
        (mask_on_cuda); elsewhere (and all three in CUDA decode) CUDA mode never draws them
        as valid and calls with them must be refused naming them (the "cuda" mutations). A CUDA
        mask narrower than a request's keys is a device-side report (key_mask_short, the C++
        GPU test), not drawn here."""
        r = self.rng
        batch, total_q = len(lq), sum(lq)
        lk_max = max(lk + [0])
        muts = {}
        offsets = (offsets_on_cuda or not self.cuda) and kw["causal"] and self.chance(0.3)
        if offsets:
            co = [int(r.integers(-lq[b] - 3, lk[b] + 4)) for b in range(batch)]
            if self.chance(0.1):  # near the int32 limits: the rule is computed in 64-bit
                co[int(r.integers(0, batch))] = self.choice([2**31 - 1, -2**31])
            kw["causal_offset"] = self.to(torch.tensor(co, dtype=torch.int32))
            muts.update(self.m_arrays(["causal_offset"], ("rank", "extent", "stride", "device")))
            muts["dtype:causal_offset"] = self.m_dtype("causal_offset")
            muts["offset_not_causal"] = mutation(lambda kw: dict(kw, causal=False),
                                                 ("causal_offset", "causal"))

        def mask_kw(kw):
            per_query = self.chance(0.5)
            m = self.key_mask(total_q if per_query else batch, lk_max + int(r.integers(0, 4)))
            kw = dict(kw, key_mask=m)
            if batch == total_q or self.chance(0.3):
                kw["key_mask_rows"] = "query" if per_query else "batch"
            return kw
        if (mask_on_cuda or not self.cuda) and self.chance(0.3):
            kw.update(mask_kw({}))
            m = kw["key_mask"]
            muts["dtype:key_mask"] = mutation(lambda kw: dict(kw, key_mask=kw["key_mask"].float()),
                                              ("key_mask",))
            muts["rank:key_mask"] = self.m_array("key_mask", "rank")
            muts["key_mask_rows"] = with_kw("key_mask_rows", "rows")
            muts["rows_of:key_mask"] = mutation(
                lambda kw: dict(kw, key_mask=self.key_mask(batch + total_q + 1, m.shape[1])),
                ("key_mask",))
            if lk_max > 0 and not self.cuda:
                muts["short:key_mask"] = mutation(
                    lambda kw: dict(kw, key_mask=kw["key_mask"][:, :lk_max - 1]), ("key_mask",))
            if batch == total_q:
                muts["ambiguous:key_mask"] = mutation(
                    lambda kw: {x: y for x, y in kw.items() if x != "key_mask_rows"},
                    ("key_mask",))
        if (offsets_on_cuda or not self.cuda) and self.chance(0.25):
            kw["soft_cap"] = float(r.uniform(0.5, 30.0))
        muts["negative_soft_cap"] = with_kw("soft_cap", -1.0)
        muts["nan_soft_cap"] = with_kw("soft_cap", math.nan)
        if not mask_on_cuda:
            muts["cuda:key_mask"] = mutation(mask_kw, ("key_mask",), "cuda")
        if not offsets_on_cuda:
            muts["cuda:soft_cap"] = mutation(lambda kw: dict(kw, soft_cap=float(r.uniform(1, 30))),
                                             ("soft_cap",), "cuda")
        if not offsets_on_cuda and kw["causal"]:
            muts["cuda:causal_offset"] = mutation(
                lambda kw: dict(kw, causal_offset=self.to(torch.zeros(batch, dtype=torch.int32))),
                ("causal_offset",), "cuda")
        return muts

    def case_batched(self):
        """attention_batched over [B, S, H, D] or [B, H, S, D]: contiguous BSHD (one varlen call),
        BSHD with padded rows (batch and sequence dims that do not merge) and BHSD tensors or
        views of BSHD storage (one call per request)."""
        r = self.rng
        s = self.big()
        batch = int(r.integers(1, 5))
        sq, sk = int(r.integers(1, 33 * s)), int(r.integers(1, 300 * s))
        hkv, hq = self.heads()
        dt = self.choice([torch.bfloat16, torch.float16])
        layout = self.choice(["BSHD", "BHSD"])
        padded = layout == "BSHD" and self.chance(0.3)
        transposed = layout == "BHSD" and self.chance(0.5)

        def tensor(seq, h):
            x = self.randn(batch, seq, h, D, dtype=dt)
            if padded:
                pad = torch.full((batch, seq + 2, h, D), math.nan, dtype=dt)
                pad[:, :seq] = x
                return self.to(pad)[:, :seq]
            if layout == "BHSD":
                return self.to(x).transpose(1, 2) if transposed else \
                    self.to(x.transpose(1, 2).contiguous())
            return self.to(x)
        kw = dict(q=tensor(sq, hq), k=tensor(sk, hkv), v=tensor(sk, hkv), layout=layout,
                  causal=self.chance(0.8), return_lse=self.chance(0.5))
        if self.chance(0.3):
            kw["softmax_scale"] = float(r.uniform(0.02, 0.15))
        if self.chance(0.2):
            kw["temperature"] = float(r.uniform(0.3, 2.0))
        if self.chance(0.2):
            kw["out"] = torch.full(tuple(kw["q"].shape), math.nan, dtype=dt, device=self.dev)
        muts = self.visibility(kw, [sq] * batch, [sk] * batch, True, mask_on_cuda=True)
        # attention_batched takes the mask's row kind from its rank: [B, Sk] or [B, Sq, Sk].
        kw.pop("key_mask_rows", None)
        for name in ("key_mask_rows", "ambiguous:key_mask", "rows_of:key_mask"):
            muts.pop(name, None)

        def batched_mask(kw):
            per_query = self.chance(0.5)
            m = self.key_mask(batch * (sq if per_query else 1), sk)
            return dict(kw, key_mask=m.reshape(batch, sq, sk) if per_query else m)
        muts.pop("rank:key_mask", None)  # [1, B, Sk] may read as a valid [B, Sq, Sk]
        # One call per request passes causal_offset[b:b + 1], a one-entry view that any stride
        # of the [B] array gives: a strided offset array is refused only by the one-call path.
        muts.pop("stride:causal_offset", None)
        if "key_mask" in kw:
            kw.update(batched_mask({}))
            if not self.cuda:  # on CUDA a device-side report (visibility())
                muts["short:key_mask"] = mutation(
                    lambda kw: dict(kw, key_mask=kw["key_mask"][..., :sk - 1]), ("key_mask",))
            muts["shape:key_mask"] = mutation(
                lambda kw: dict(kw, key_mask=self.key_mask(batch + 1, sk)), ("key_mask",))
        muts.update(self.m_arrays(["q", "k", "v"], ("rank", "stride", "device")))
        muts["dtype:q"] = self.m_dtype("q")
        muts["layout"] = with_kw("layout", "SBHD")
        muts["v_shape"] = mutation(lambda kw: dict(kw, v=kw["v"][:, :-1] if layout == "BSHD"
                                                   else kw["v"][:, :, :-1]), ("v",))
        if batch > 1:
            muts["batch:k"] = mutation(lambda kw: dict(kw, k=kw["k"][:-1], v=kw["v"][:-1]),
                                       ("k",))
        muts["shape:out"] = mutation(
            lambda kw: dict(kw, out=torch.empty(tuple(kw["q"].shape[:-1]) + (D + 1,), dtype=dt,
                                                device=self.dev)), ("out",))
        n_stats = int(kw["return_lse"]) + int("temperature" in kw)
        return Case("attention_batched", kw, msa.attention_batched, mutations=muts, refill=True,
                    reference=self._np_batched(),
                    compare=lambda g, w: close_attention(g, w, 1e-2, 2e-3, n_stats))

    def _np_batched(self):
        """The float64 reference of attention_batched (CPU mode): np_reference.attention on the
        token-major form of the call's tensors, reshaped back to its layout."""
        def ref(cpu_kw):
            import np_reference
            bhsd = cpu_kw["layout"] == "BHSD"

            def tm(x):
                return (x.transpose(1, 2) if bhsd else x).double().numpy()
            q, k, v = tm(cpu_kw["q"]), tm(cpu_kw["k"]), tm(cpu_kw["v"])
            batch, sq, hq, d = q.shape
            mask = cpu_kw.get("key_mask")
            per_query = mask is not None and mask.dim() == 3
            if mask is not None:
                mask = mask.numpy().reshape(batch * sq, -1) if per_query else mask.numpy()
            co = cpu_kw.get("causal_offset")
            out, lse, tlse = np_reference.attention(
                q.reshape(batch * sq, hq, d), list(k), list(v), self.cu([sq] * batch).numpy(),
                causal=cpu_kw["causal"], scale=cpu_kw.get("softmax_scale"),
                temperature=cpu_kw.get("temperature"),
                causal_offset=None if co is None else co.numpy(), key_mask=mask,
                mask_per_query=per_query, soft_cap=cpu_kw.get("soft_cap"))
            out = out.reshape(batch, sq, hq, d)
            res = [torch.from_numpy(out.transpose(0, 2, 1, 3) if bhsd else out)]
            for x, want in ((lse, cpu_kw["return_lse"]), (tlse, cpu_kw.get("temperature"))):
                if want:
                    res.append(torch.from_numpy(x.reshape(hq, batch, sq).transpose(1, 0, 2)))
            return tuple(res)
        return ref

    # ---- the SDSA indexer (docs/semantics.md, SDSA indexer): bitwise on both backends ----

    def sdsa_problem(self, rows=True):
        """A paged index key cache of one key head and (with `rows`) query rows over it. Keys
        bf16 / f16, or NVFP4 written by quantize_write_index_qk_nvfp4 on the soak's device (a
        QTensor, or values plus key_scale); small-integer values (many tied scores) or normal
        ones; shuffled pages whose unused slots hold NaN (never read). Rows: bf16 / f16 or NVFP4
        queries, random requests, sometimes row_lens. Returns (keywords, facts): the keywords on
        the device, the facts on the host (lens, page_size, dim, num_pages, requests, L: each
        row's key count)."""
        r = self.rng
        s = self.big()
        batch = int(r.integers(1, 5))
        lens = [int(x) for x in r.integers(0, 600 * s + 1, batch)]
        dim = self.choice([16, 32, 64, 128, 256])
        page_size = self.choice(PAGE_SIZES)
        kind = self.choice(["bf16", "f16", "nvfp4"])
        ints = self.chance(0.5)

        def values(n):
            return self.ints(n, dim, dtype=torch.float32) if ints else self.randn(n, dim)
        keys = values(sum(lens))
        (pool,), table, seq = self.pages([keys[:, None, :]], lens, page_size, math.nan)
        pool = pool[:, :, 0]
        num_pages = pool.shape[0]
        kw = dict(block_table=self.to(table), seq_lens=self.to(seq))
        if kind == "nvfp4":
            # The cache's used slots written by msa; the others keep bytes never read.
            slots = torch.tensor([int(table[b, j // page_size]) * page_size + j % page_size
                                  for b in range(batch) for j in range(lens[b])],
                                 dtype=torch.int32)
            gs = float(r.uniform(0.25, 2.0))
            cache = msa.QTensor(self.to(torch.full((num_pages, page_size, dim // 2), 0x77,
                                                   dtype=torch.uint8)),
                                self.to(torch.full((num_pages, page_size, dim // 16), 0x7F,
                                                   dtype=torch.uint8)), gs, "nvfp4")
            if len(slots):
                msa.quantize_write_index_qk_nvfp4(self.to(keys), self.to(slots), cache)
            if self.chance(0.5):
                kw.update(key_cache=cache)
            else:
                kw.update(key_cache=cache.values, key_scale=cache.scale, key_global_scale=gs)
        else:
            kw["key_cache"] = self.to(pool.to(torch.bfloat16 if kind == "bf16" else torch.float16))
        facts = dict(lens=lens, page_size=page_size, dim=dim, num_pages=num_pages, kind=kind,
                     width=table.shape[1], batch=batch, ints=ints)
        if not rows:
            return kw, facts
        t_rows = int(r.integers(1, 13 * s))
        req = [int(x) for x in r.integers(0, batch, t_rows)]
        row_lens = None
        if self.chance(0.4):
            row_lens = [int(r.integers(0, lens[b] + 1)) for b in req]
            kw["row_lens"] = self.to(torch.tensor(row_lens, dtype=torch.int32))
        kw["row_requests"] = self.to(torch.tensor(req, dtype=torch.int32))
        q = values(t_rows)
        qkind = self.choice(["bf16", "f16", "nvfp4"])
        if qkind == "nvfp4":
            qt = msa.quantize_write_index_qk_nvfp4(query=self.to(q),
                                                   query_global_scale=float(r.uniform(0.25, 2)))
            if self.chance(0.5):
                kw["query"] = qt
            else:
                kw.update(query=qt.values, query_scale=qt.scale,
                          query_global_scale=qt.global_scale)
        else:
            kw["query"] = self.to(q.to(torch.bfloat16 if qkind == "bf16" else torch.float16))
        facts.update(requests=req, rows=t_rows,
                     L=row_lens if row_lens is not None else [lens[b] for b in req])
        return kw, facts

    def m_sdsa_cache(self, kw, f, rows=True):
        """The cache's and the rows' values: checked on the host for CPU tensors, on the device
        for CUDA ones (row_request_invalid, row_len_invalid, seq_len_invalid,
        page_id_out_of_range). CUDA checks only what a row reads, so each offence is aimed at a
        request some row names and a page it reads."""
        r = self.rng
        batch, width, ps = f["batch"], f["width"], f["page_size"]

        edit = self._edit_copy

        def seq_past(y):
            named = sorted(set(f["requests"])) if rows else list(range(batch))
            y[named[int(r.integers(0, len(named)))]] = \
                width * ps + int(r.integers(1, 200)) if self.chance(0.7) else -1

        muts = {"seq_lens_past_table": mutation(lambda kw: edit(kw, "seq_lens", seq_past),
                                                ("seq_lens",))}
        if not rows:
            return muts

        def bad_request(y):
            y[int(r.integers(0, len(y)))] = batch + int(r.integers(0, 3)) \
                if self.chance(0.6) else -1 - int(r.integers(0, 3))

        def bad_row_len(y):
            t = int(r.integers(0, len(y)))
            y[t] = f["lens"][f["requests"][t]] + 1 if self.chance(0.7) else -1

        def bad_page(kw):
            read = [t for t in range(f["rows"]) if f["L"][t] > 0]
            if not read:
                return None
            t = read[int(r.integers(0, len(read)))]
            col = int(r.integers(0, f["L"][t])) // ps

            def fn(y):
                y[f["requests"][t], col] = f["num_pages"] + 3 if self.chance(0.5) else -2
            return edit(kw, "block_table", fn)
        muts["row_request_out"] = mutation(lambda kw: edit(kw, "row_requests", bad_request),
                                           ("row_requests",))
        muts["bad_page"] = mutation(bad_page, ("block_table", "page_table", "page id"))
        if "row_lens" in kw:
            muts["row_len_past"] = mutation(lambda kw: edit(kw, "row_lens", bad_row_len),
                                            ("row_lens",))
        return muts

    def m_sdsa_arrays(self, kw, f, rows=True):
        """Broken arrays of the cache and rows. No extent for a block table (more columns are
        still a valid one), nor for bf16 / f16 keys without rows (a longer head dim is a valid
        sample's; NVFP4 values then disagree with their scales)."""
        muts = self.m_arrays(["seq_lens"] + (["query", "row_requests"] if rows else []))
        muts.update(self.m_arrays(["key_cache"], ("rank", "stride", "device") + (
            ("extent",) if rows or f["kind"] == "nvfp4" else ())))
        muts.update(self.m_arrays(["block_table"], ("rank", "stride", "device")))
        if rows and "row_lens" in kw:
            muts.update(self.m_arrays(["row_lens"], ("extent", "device")))
        if f["kind"] == "nvfp4":
            muts["nan_global_scale"] = mutation(self._nan_key_global_scale, ("global_scale",))
            muts["missing_key_scale"] = mutation(
                lambda kw: None if isinstance(kw["key_cache"], msa.QTensor)
                else {x: y for x, y in kw.items() if x != "key_scale"},
                ("key_cache", "scale", "out"))
        else:
            muts["scale_for_bf16"] = mutation(
                lambda kw: dict(kw, key_scale=torch.zeros(1, dtype=torch.uint8,
                                                          device=self.dev)), ("scale",))
        return muts

    def case_indexer_scores(self):
        kw, f = self.sdsa_problem()
        longest = max(f["L"] + [0])
        width = longest + int(self.rng.integers(0, 40))
        if self.chance(0.2):
            kw["out"] = torch.full((f["rows"], width), math.nan, device=self.dev)
        else:
            kw["max_len"] = width
        muts = self.m_sdsa_arrays(kw, f)
        muts.update(self.m_sdsa_cache(kw, f))
        if longest > 0:
            # A row with more keys than the scores have columns (host on the CPU,
            # row_past_scores on the device).
            def short(kw):
                if "out" in kw:
                    return dict(kw, out=torch.empty(f["rows"], longest - 1, device=self.dev))
                return dict(kw, max_len=longest - 1)
            muts["row_past_scores"] = mutation(short, ("scores", "max_len"))
        muts["missing_max_len"] = mutation(
            lambda kw: {x: y for x, y in kw.items() if x not in ("max_len", "out")},
            ("max_len",))
        muts["negative_max_len"] = mutation(
            lambda kw: dict({x: y for x, y in kw.items() if x != "out"}, max_len=-1),
            ("max_len",))
        muts["dtype_of:out"] = mutation(
            lambda kw: dict({x: y for x, y in kw.items() if x != "max_len"},
                            out=torch.empty(f["rows"], width, dtype=torch.float16,
                                            device=self.dev)), ("scores",))
        muts["rows_of:out"] = mutation(
            lambda kw: dict({x: y for x, y in kw.items() if x != "max_len"},
                            out=torch.empty(f["rows"] + 1, width, device=self.dev)),
            ("scores",))
        return Case("indexer_scores", kw, msa.indexer_scores, mutations=muts)

    @staticmethod
    def stores(cand, ties, counts):
        """The select's stores with the slots it did not write set to -1 (they hold what the
        buffers held before), so two calls compare bit for bit."""
        c, ct = cand.shape[1], ties.shape[1]
        n = counts[:, 0].clamp(0, c)
        m = counts[:, 1].clamp(0, ct)
        used = torch.arange(c, device=cand.device)[None, :] < n[:, None]
        used_t = torch.arange(ct, device=ties.device)[None, :] < m[:, None]
        return (torch.where(used[..., None], cand, torch.full_like(cand, -1)),
                torch.where(used_t, ties, torch.full_like(ties, -1)), counts)

    def sdsa_thresholds(self, kw, f, topk):
        """(thresholds, counts) for a select: from a key sample (gather_key_sample,
        indexer_scores on it, thresholds_from_sample: the sampled pipeline), or per row a score
        of the row itself (its r-th best, so ties fall on the threshold), -inf (every key a
        candidate), +inf or NaN; counts zero. Setup calls, all valid."""
        r = self.rng
        rows_kw = {x: kw[x] for x in ("query", "query_scale", "query_global_scale", "key_cache",
                                      "key_scale", "key_global_scale", "block_table",
                                      "seq_lens", "row_requests", "row_lens") if x in kw}
        if self.chance(0.5):
            stride = int(r.integers(1, 9))
            offsets = [int(r.integers(0, stride)) for _ in range(f["batch"])]
            counts_s = [-(-max(n - o, 0) // stride) for n, o in zip(f["lens"], offsets)]
            cap = max(counts_s + [0]) + int(r.integers(0, 3))
            sample, sample_lens = msa.gather_key_sample(
                kw["key_cache"], kw["block_table"], kw["seq_lens"], stride, max_samples=cap,
                offsets=self.to(torch.tensor(offsets, dtype=torch.int32)),
                key_scale=kw.get("key_scale"), key_global_scale=kw.get("key_global_scale", 1.0))
            sk = dict(rows_kw, key_cache=sample,
                      block_table=self.to(torch.arange(f["batch"], dtype=torch.int32)[:, None]),
                      seq_lens=sample_lens)
            sk.pop("key_scale", None)
            sk.pop("key_global_scale", None)
            if "row_lens" in kw:
                sk["row_lens"] = self.to(torch.tensor(
                    [-(-max(n - offsets[b], 0) // stride)
                     for n, b in zip(f["L"], f["requests"])], dtype=torch.int32))
            ss = msa.indexer_scores(max_len=cap, **sk)
            return msa.thresholds_from_sample(ss, topk, stride,
                                              oversample=float(r.uniform(1.0, 4.0)))
        scores = msa.indexer_scores(max_len=max(f["L"] + [0]), **rows_kw).cpu()
        th = torch.empty(f["rows"])
        for t in range(f["rows"]):
            row = scores[t, :f["L"][t]]
            row = row[torch.isfinite(row)]
            pick = self.rng.random()
            if len(row) and pick < 0.75:
                best = torch.sort(row, descending=True).values
                th[t] = best[min(int(r.integers(0, 2 * topk + 1)), len(best) - 1)]
            else:
                th[t] = self.choice([-math.inf, math.inf, math.nan, 0.0])
        return self.to(th), self.to(torch.zeros(f["rows"], 3, dtype=torch.int32))

    def case_threshold_select(self):
        """indexer_threshold_select, chained into top_k_from_candidates: the stores (unwritten
        slots masked), the counts, the ids and row_status. On CUDA the stores may be in any slot
        order and an overflowing store holds any of the keys: compared as sets where no store
        overflowed (sdsa_stores_equal); counts, ids and row_status bitwise."""
        r = self.rng
        kw, f = self.sdsa_problem()
        topk = int(r.integers(1, 33))
        th, counts = self.sdsa_thresholds(kw, f, topk)
        kw.update(thresholds=th, counts=counts, chain_topk=topk)
        cap, tie_cap = int(r.integers(1, 4 * topk + 1)), int(r.integers(1, 2 * topk + 1))
        if self.chance(0.3):
            kw["candidates"] = torch.full((f["rows"], cap, 2), 9, dtype=torch.int32,
                                          device=self.dev)
        else:
            kw["capacity"] = cap
        if self.chance(0.3):
            kw["ties"] = torch.full((f["rows"], tie_cap), 9, dtype=torch.int32, device=self.dev)
        else:
            kw["tie_capacity"] = tie_cap

        def bind(kw):
            kw = dict(kw)
            k = kw.pop("chain_topk")

            def run():
                cand, ties, cnt = msa.indexer_threshold_select(**kw)
                ids, status = msa.top_k_from_candidates(cand, ties, cnt, k,
                                                        stream=kw.get("stream"))
                return self.stores(cand, ties, cnt) + (ids, status)
            return run
        muts = self.m_sdsa_arrays(kw, f)
        muts.update(self.m_sdsa_cache(kw, f))
        muts.update(self.m_arrays(["thresholds", "counts"]))

        def nonzero(y):
            y[int(r.integers(0, len(y))), int(r.integers(0, 3))] = int(r.integers(1, 5))
        # Zero counts on entry: a CPU check (on CUDA non-zero counts shift the slots).
        muts["counts_nonzero"] = mutation(lambda kw: self._edit_copy(kw, "counts", nonzero),
                                          ("counts",), "cpu")
        muts["capacity_zero"] = mutation(
            lambda kw: dict({x: y for x, y in kw.items() if x != "candidates"}, capacity=0),
            ("capacity",))
        muts["negative_tie_capacity"] = mutation(
            lambda kw: dict({x: y for x, y in kw.items() if x != "ties"}, tie_capacity=-1),
            ("tie_capacity",))
        muts["missing_capacity"] = mutation(
            lambda kw: {x: y for x, y in kw.items() if x not in ("capacity", "candidates")},
            ("capacity",))
        muts["candidates_width"] = mutation(
            lambda kw: dict({x: y for x, y in kw.items() if x != "capacity"},
                            candidates=torch.zeros(f["rows"], cap, 3, dtype=torch.int32,
                                                   device=self.dev)), ("candidates",))
        muts["ties_rows"] = mutation(
            lambda kw: dict({x: y for x, y in kw.items() if x != "tie_capacity"},
                            ties=torch.zeros(f["rows"] + 1, tie_cap, dtype=torch.int32,
                                             device=self.dev)), ("ties",))
        return Case("threshold_select", kw, bind=bind, mutations=muts, graph=False,
                    compare=sdsa_stores_equal)

    @staticmethod
    def _nan_key_global_scale(kw):
        """An NVFP4 key cache (a QTensor or values plus key_global_scale) with a NaN global
        scale (a host check on any device)."""
        c = kw["key_cache"]
        if isinstance(c, msa.QTensor):
            return dict(kw, key_cache=c._replace(global_scale=math.nan))
        return dict(kw, key_global_scale=math.nan)

    def _edit_copy(self, kw, key, fn):
        """kw with tensor `key` replaced by an edited copy (fn(cpu copy) -> False: n/a)."""
        y = kw[key].cpu().clone()
        if fn(y) is False:
            return None
        return dict(kw, **{key: y.to(kw[key].device)})

    def case_top_k_from_candidates(self):
        """top_k_from_candidates over stores a select made (setup; slots it did not write hold
        -1), sometimes overflowing: the same stores on both backends, so ids and row_status
        bitwise."""
        r = self.rng
        kw, f = self.sdsa_problem()
        topk = int(r.integers(1, 33))
        th, counts = self.sdsa_thresholds(kw, f, topk)
        cap, tie_cap = int(r.integers(1, 4 * topk + 1)), int(r.integers(1, 2 * topk + 1))
        cand, ties, counts = msa.indexer_threshold_select(
            thresholds=th, counts=counts,
            candidates=torch.full((f["rows"], cap, 2), -1, dtype=torch.int32, device=self.dev),
            ties=torch.full((f["rows"], tie_cap), -1, dtype=torch.int32, device=self.dev), **kw)
        k = int(r.integers(1, 33))
        kw = dict(candidates=cand, ties=ties, counts=counts, topk=k)
        if self.chance(0.2):
            kw["out"] = torch.full((f["rows"], k), 5, dtype=torch.int32, device=self.dev)
        if self.chance(0.2):
            kw["row_status"] = torch.full((f["rows"],), 5, dtype=torch.int32, device=self.dev)
        muts = self.m_arrays(["candidates", "counts"])
        muts.update(self.m_arrays(["ties"], ("rank", "stride", "device")))
        muts["dtype:ties"] = self.m_dtype("ties")
        muts["topk_zero"] = with_kw("topk", 0)
        muts["topk_huge"] = with_kw("topk", 2**32 + 1)

        def negative(y):
            y[int(r.integers(0, len(y))), int(r.integers(0, 3))] = -1 - int(r.integers(0, 9))
        # A negative count: the CPU raises, CUDA answers row_status 4 (counts_invalid).
        muts["negative_count"] = mutation(lambda kw: self._edit_copy(kw, "counts", negative),
                                          ("counts",), "cpu")
        muts["shape:out"] = mutation(
            lambda kw: dict(kw, out=torch.zeros(f["rows"], kw["topk"] + 1, dtype=torch.int32,
                                                device=self.dev)), ("ids",))
        muts["shape:row_status"] = mutation(
            lambda kw: dict(kw, row_status=torch.zeros(f["rows"] + 1, dtype=torch.int32,
                                                       device=self.dev)), ("row_status",))
        return Case("top_k_from_candidates", kw, msa.top_k_from_candidates, mutations=muts,
                    check=False)

    def case_gather_key_sample(self):
        """gather_key_sample: the sample's written slots (those past sample_lens are not
        written: masked before comparing) and sample_lens."""
        r = self.rng
        kw, f = self.sdsa_problem(rows=False)
        stride = int(r.integers(1, 17))
        kw["stride"] = stride
        offsets = [0] * f["batch"]
        if self.chance(0.6):
            offsets = [int(r.integers(0, stride)) for _ in range(f["batch"])]
            kw["offsets"] = self.to(torch.tensor(offsets, dtype=torch.int32))
        need = [-(-max(n - o, 0) // stride) for n, o in zip(f["lens"], offsets)]
        cap = max(need + [0]) + int(r.integers(0, 4))
        nvfp4 = f["kind"] == "nvfp4"
        if self.chance(0.2):
            d = f["dim"]
            vals = torch.full((f["batch"], cap, d // 2 if nvfp4 else d), 3,
                              dtype=torch.uint8 if nvfp4 else kw["key_cache"].dtype,
                              device=self.dev)
            kw["out"] = (vals, torch.full((f["batch"], cap, d // 16), 3, dtype=torch.uint8,
                                          device=self.dev)) if nvfp4 else vals
        else:
            kw["max_samples"] = cap

        def bind(kw):
            def run():
                sample, lens = msa.gather_key_sample(**kw)
                parts = (sample.values, sample.scale) if isinstance(sample, msa.QTensor) \
                    else (sample,)
                used = torch.arange(parts[0].shape[1], device=lens.device)[None, :] < \
                    lens[:, None]
                out = []
                for x in parts:
                    b = x.view(torch.uint8) if x.element_size() == 1 else x
                    out.append(torch.where(used[..., None], b, torch.zeros_like(b)))
                return tuple(out) + (lens,)
            return run
        muts = self.m_sdsa_arrays(kw, f, rows=False)
        muts.update(self.m_sdsa_cache(kw, f, rows=False))
        if "offsets" in kw:
            muts.update(self.m_arrays(["offsets"], ("extent", "device")))

        def bad_offset(kw):
            y = torch.tensor(offsets, dtype=torch.int32)
            y[int(r.integers(0, f["batch"]))] = stride + int(r.integers(0, 3)) \
                if self.chance(0.6) else -1
            return dict(kw, offsets=self.to(y))
        muts["offset_out_of_range"] = mutation(bad_offset, ("offsets",))

        def bad_page(kw):
            # A page holding a sampled key (CUDA checks the pages it reads).
            read = [b for b in range(f["batch"]) if f["lens"][b] > offsets[b]]
            if not read:
                return None
            b = read[int(r.integers(0, len(read)))]
            return self._edit_copy(kw, "block_table", lambda y: y.__setitem__(
                (b, offsets[b] // f["page_size"]), f["num_pages"] + 1 if self.chance(0.5)
                else -3))
        muts["bad_page"] = mutation(bad_page, ("block_table", "page_table", "page id"))
        if max(need) > 0:
            # Too few sample slots (host on the CPU, sample_past_capacity on the device).
            def short(kw):
                kw = {x: y for x, y in kw.items() if x != "out"}
                return dict(kw, max_samples=max(need) - 1)
            muts["sample_past_capacity"] = mutation(short, ("sample", "max_samples"))
        muts["stride_zero"] = with_kw("stride", 0)
        muts["missing_max_samples"] = mutation(
            lambda kw: {x: y for x, y in kw.items() if x not in ("max_samples", "out")},
            ("max_samples",))
        muts["sample_lens_shape"] = mutation(
            lambda kw: dict(kw, sample_lens=torch.zeros(f["batch"] + 1, dtype=torch.int32,
                                                        device=self.dev)), ("sample_lens",))
        muts["dtype_of:out"] = mutation(
            lambda kw: dict({x: y for x, y in kw.items() if x != "max_samples"},
                            out=torch.empty(f["batch"], cap, f["dim"], dtype=torch.float32,
                                            device=self.dev)) if not nvfp4 else None,
            ("sample",))
        return Case("gather_key_sample", kw, bind=bind, mutations=muts)

    def case_thresholds_from_sample(self):
        """thresholds_from_sample over sample scores with ties, -inf (no sample) and NaN: the
        thresholds (canonical NaN and zero) and the counts it zeroes, bitwise."""
        r = self.rng
        t_rows, s_cols = int(r.integers(1, 40)), int(r.integers(0, 300))
        scores = torch.round(self.randn(t_rows, s_cols) * 4) / 4
        scores[torch.from_numpy(r.random(scores.shape) < 0.1)] = -math.inf
        scores[torch.from_numpy(r.random(scores.shape) < 0.03)] = math.nan
        scores[torch.from_numpy(r.random(scores.shape) < 0.03)] = -0.0
        kw = dict(sample_scores=self.strided(self.to(scores)), topk=int(r.integers(1, 65)),
                  sample_stride=int(r.integers(1, 17)))
        if self.chance(0.6):
            kw["oversample"] = float(r.uniform(1.0, 6.0))
        if self.chance(0.2):
            kw["thresholds"] = torch.full((t_rows,), 3.0, device=self.dev)
        if self.chance(0.2):
            kw["counts"] = torch.full((t_rows, 3), 7, dtype=torch.int32, device=self.dev)
        muts = self.m_arrays(["sample_scores"], ("rank", "stride", "device"))
        muts["dtype:sample_scores"] = mutation(
            lambda kw: dict(kw, sample_scores=kw["sample_scores"].double()), ("sample_scores",))
        muts["topk_zero"] = with_kw("topk", 0)
        muts["stride_zero"] = with_kw("sample_stride", 0)
        muts["oversample_low"] = with_kw("oversample", 0.5)
        muts["oversample_nan"] = with_kw("oversample", math.nan)
        muts["oversample_huge"] = with_kw("oversample", 2.0**21)
        muts.update(self.m_out("thresholds", lambda kw: (t_rows,), torch.float32))
        muts.update(self.m_out("counts", lambda kw: (t_rows, 3), torch.int32))
        return Case("thresholds_from_sample", kw, msa.thresholds_from_sample, mutations=muts,
                    check=False)

    def case_quantize_write(self):
        """quantize_write_index_qk_nvfp4: keys into a cache at random distinct slots (some
        negative: skipped), queries into rows, or both; the whole cache (bytes it did not write
        are the soak's) and the query bytes compared."""
        r = self.rng
        dim = self.choice([16, 32, 64, 128, 256])
        page_size = self.choice(PAGE_SIZES[:3])
        num_pages = int(r.integers(1, 7))
        pool = num_pages * page_size
        side = self.choice(["key", "key", "both", "query"])
        kw = {}
        gs = float(r.uniform(0.25, 2.0))
        if side != "query":
            n = int(r.integers(1, min(pool, 64) + 1))
            slots = torch.from_numpy(r.permutation(pool)[:n].astype(np.int32))
            slots[torch.from_numpy(r.random(n) < 0.15)] = -1
            kdt = self.choice([torch.float32, torch.bfloat16, torch.float16])
            key = (self.randn(n, dim) * float(r.uniform(0.05, 20))).to(kdt)
            vals = torch.from_numpy(r.integers(0, 256, (num_pages, page_size, dim // 2),
                                               dtype=np.uint8))
            scale = torch.from_numpy(r.integers(0, 256, (num_pages, page_size, dim // 16),
                                                dtype=np.uint8))
            kw.update(key=self.strided(self.to(key)), slots=self.to(slots))
            if self.chance(0.5):
                kw["key_cache"] = msa.QTensor(self.to(vals), self.to(scale), gs, "nvfp4")
            else:
                kw.update(key_cache=self.to(vals), key_scale=self.to(scale), key_global_scale=gs)
        t_rows = int(r.integers(1, 20))
        if side != "key":
            qdt = self.choice([torch.float32, torch.bfloat16, torch.float16])
            kw["query"] = self.to((self.randn(t_rows, dim) * float(r.uniform(0.05, 20))).to(qdt))
            kw["query_global_scale"] = float(r.uniform(0.25, 2.0))
            if self.chance(0.3):
                kw["query_out"] = (torch.zeros(t_rows, dim // 2, dtype=torch.uint8,
                                               device=self.dev),
                                   torch.zeros(t_rows, dim // 16, dtype=torch.uint8,
                                               device=self.dev))

        def bind(kw):
            def run():
                res = msa.quantize_write_index_qk_nvfp4(**kw)
                out = ()
                c = kw.get("key_cache")
                if isinstance(c, msa.QTensor):
                    out = (c.values, c.scale)
                elif c is not None:
                    out = (c, kw["key_scale"])
                return out + (() if res is None else (res.values, res.scale))
            return run
        muts = {}
        if "key" in kw:
            muts.update(self.m_arrays(["key", "slots"], ("rank", "extent", "stride", "device")))
            muts.update(self.m_arrays(["key_cache"], ("rank", "extent", "device")))
            muts["dtype:key"] = mutation(lambda kw: dict(kw, key=kw["key"].double()), ("key",))
            muts["dtype:slots"] = self.m_dtype("slots")
            muts["dtype:key_cache"] = self.m_dtype("key_cache")
            muts["group:key"] = mutation(lambda kw: dict(kw, key=kw["key"][:, :dim - 8]),
                                         ("key",))

            def past(y):
                y[int(r.integers(0, len(y)))] = pool + int(r.integers(0, 100))
            # A slot past the pool (host on the CPU, slot_out_of_range on the device).
            muts["slot_past_pool"] = mutation(lambda kw: self._edit_copy(kw, "slots", past),
                                              ("slots",))

            def twice(y):
                given = (y >= 0).nonzero().flatten().tolist()
                if len(given) < 2:
                    return False
                a, b = r.choice(given, 2, replace=False)
                y[int(b)] = y[int(a)]
            # A slot given twice: a CPU check (CUDA leaves each group to one of the keys).
            muts["slot_twice"] = mutation(lambda kw: self._edit_copy(kw, "slots", twice),
                                          ("slots",), "cpu")
            muts["missing:key_cache"] = mutation(
                lambda kw: {x: y for x, y in kw.items() if x not in ("key_cache", "key_scale")},
                ("key_cache",))
            muts["nan_global_scale"] = mutation(self._nan_key_global_scale, ("global_scale",))
        if "query" in kw:
            muts.update(self.m_arrays(["query"], ("rank", "stride", "device")))
            muts["dtype:query"] = mutation(lambda kw: dict(kw, query=kw["query"].double()),
                                           ("query",))
            muts["nan_query_global_scale"] = mutation(
                lambda kw: dict(kw, query_global_scale=math.nan), ("global_scale",))
            muts["query_out_rows"] = mutation(
                lambda kw: dict(kw, query_out=(
                    torch.zeros(t_rows + 1, dim // 2, dtype=torch.uint8, device=self.dev),
                    torch.zeros(t_rows + 1, dim // 16, dtype=torch.uint8, device=self.dev))),
                ("query_out",))
            muts["query_out_one"] = mutation(
                lambda kw: dict(kw, query_out=torch.zeros(t_rows, dim // 2, dtype=torch.uint8,
                                                          device=self.dev)), ("query_out",))
        muts["nothing"] = mutation(
            lambda kw: {x: y for x, y in kw.items() if x not in ("key", "query")},
            ("key", "query"))
        return Case("quantize_write_nvfp4", kw, bind=bind, mutations=muts)

    # ---- the engine ----

    def build(self, op):
        return {"attention_flat": lambda: self.case_attention(False),
                "attention_paged": lambda: self.case_attention(True),
                "sparse_attention": self.case_pipeline, "block_scores": self.case_block_scores,
                "block_topk": self.case_block_topk, "select_topk": self.case_select_topk,
                "build_k2q_csr": self.case_build_k2q, "k2q_convert": self.case_k2q_convert,
                "decode": self.case_decode, "quantize": self.case_quantize,
                "dequantize": self.case_dequantize, "mqa_logits": self.case_mqa_logits,
                "paged_mqa_logits": self.case_paged_mqa_logits,
                "token_topk": self.case_token_topk,
                "check_status": self.case_check_status, "attention_batched": self.case_batched,
                "indexer_scores": self.case_indexer_scores,
                "threshold_select": self.case_threshold_select,
                "top_k_from_candidates": self.case_top_k_from_candidates,
                "gather_key_sample": self.case_gather_key_sample,
                "thresholds_from_sample": self.case_thresholds_from_sample,
                "quantize_write_nvfp4": self.case_quantize_write}[op]()

    def mutate(self, case):
        """(name, hints, kw) of one applicable mutation of this device, or None. Breaking an
        array's dtype, rank, extent, stride or device is one kind in two; values (ids, pages,
        lengths, scales), options and outputs the other, so that the device-side checks get
        their share."""
        where = ("any", self.dev)
        names = [n for n, m in case.mutations.items() if m[2] in where]
        arrays = [n for n in names if n.split(":")[0] in ARRAY_MUTATIONS]
        others = [n for n in names if n not in arrays]
        groups = [arrays, others] if self.chance(0.5) else [others, arrays]
        for group in groups:
            for i in self.rng.permutation(len(group)):
                fn, hints, _ = case.mutations[group[i]]
                kw = fn(dict(case.kw))
                if kw is not None:
                    return group[i], hints, kw
        return None

    def execute(self, case, kw, stream, explicit, check):
        """The call on `stream` (None: the current one), then check_status on it; returns the
        outputs as a tuple of tensors."""
        kw = dict(kw)
        if case.takes_check and check is not None:
            kw["check"] = check
        if stream is None:
            res = flatten(case.bind(kw)())
            msa.check_status()
            return res
        if explicit and case.takes_stream:
            kw["stream"] = stream
        cur = torch.cuda.current_stream()
        stream.wait_stream(cur)  # the inputs were made on the current stream
        try:
            if explicit and case.takes_stream:
                res = flatten(case.bind(kw)())
                msa.check_status(stream=stream)
            else:
                with torch.cuda.stream(stream):
                    res = flatten(case.bind(kw)())
                    msa.check_status()  # waits for `stream`, raises its device-side offences
        finally:
            cur.wait_stream(stream)
        return res

    def execute_graph(self, case, kw, stream):
        """Eager call, capture, replays (bitwise equal to eager), then new q values copied into
        the captured input and replayed again (equal to a new eager call). Returns the captured
        outputs and the CPU copy of the final inputs."""
        fn = case.bind(kw)  # host work (a decode plan) stays outside the capture
        cur = torch.cuda.current_stream()
        side = stream or torch.cuda.Stream()
        side.wait_stream(cur)
        with torch.cuda.stream(side):  # the warm-up torch asks for before a capture
            eager = tuple(t.clone() for t in flatten(fn()))
            msa.check_status()
        cur.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = flatten(fn())
        replay_on = self.choice(self.streams + [None])
        for _ in range(int(self.rng.integers(1, 4))):
            if replay_on is None:
                graph.replay()
            else:
                replay_on.wait_stream(cur)
                with torch.cuda.stream(replay_on):
                    graph.replay()
                cur.wait_stream(replay_on)
        torch.cuda.synchronize()
        msa.check_status()
        err = same_all(got, eager)
        if err:
            raise WrongResult(f"replay differs from the eager call: {err}")
        if case.refill and isinstance(kw.get("q"), torch.Tensor) and kw["q"].is_floating_point():
            q = kw["q"]
            q.copy_(self.ints(*q.shape, dtype=q.dtype).to(q.device))
            graph.replay()
            torch.cuda.synchronize()
            replayed = tuple(t.clone() for t in got)  # before an eager call writes an out=
            fresh = flatten(fn())
            msa.check_status()
            err = same_all(replayed, fresh)
            if err:
                raise WrongResult(f"replay with new q differs from the eager call: {err}")
            result = replayed
        else:
            result = tuple(t.clone() for t in got)
        cpu_kw = to_cpu(kw)
        del graph, got
        return result, cpu_kw

    def oracle(self, case, cpu_kw, got):
        """None or the message of a disagreement with the CPU backend (CPU mode: the same call
        again, bitwise, and the float64 reference where there is one)."""
        if self.cuda:  # the CPU sizes its own scratch
            cpu_kw = {k: v for k, v in cpu_kw.items() if k != "workspace"}
        try:
            want = flatten(case.bind(cpu_kw)())
        except msa.MsaError as e:
            raise RejectedByReference(str(e)) from None
        if self.cuda:
            return case.compare(to_cpu(got), want)
        err = same_all(got, want)
        if err is None and case.reference is not None:
            err = case.compare(got, case.reference(cpu_kw))
            if err:
                err = "float64 reference: " + err
        return err

    def record(self, op, outcome, detail=""):
        self.counts[(op, outcome)] += 1
        if outcome in DEFECTS and len(self.examples[outcome]) < self.args.examples:
            # A defect right after an invalid call may be that call's leftover (a poisoned
            # context, a stale status): name it.
            after = f" [after the invalid call {self.previous}]" if self.previous else ""
            self.examples[outcome].append(f"{op}: {detail}"[:1500] + after)

    def step(self):
        ops = [o for o in OPS if not self.args.ops or o in self.args.ops]
        weights = np.array([OPS[o] for o in ops], dtype=float)
        op = self.choice(ops, p=weights / weights.sum())
        try:
            case = self.build(op)
        except Exception as e:  # noqa: BLE001  (the setup's msa calls are valid ones)
            self.record(op, "crash" if _cuda_error(e) else "other_exception",
                        f"setup: {type(e).__name__}: {e} | {_where(e)}")
            self.crashed = _cuda_error(e)
            return
        mut = None
        if self.rng.random() < self.args.invalid:
            mut = self.mutate(case)
        valid = mut is None
        kw = case.kw if valid else mut[2]
        name = "valid" if valid else f"mutation={mut[0]}"
        if not valid:
            self.mutations_seen[(op, mut[0])] += 1
        stream, explicit = None, False
        if self.cuda and self.chance(0.5):
            stream, explicit = self.choice(self.streams), self.chance(0.3)
        check = self.choice([True, None]) if self.cuda else None
        graph = valid and self.cuda and case.graph and self.chance(self.args.graph)
        if valid:
            self.valid_calls += 1
        sample = valid and (graph or self.valid_calls % self.args.check_every == 1 or
                            self.args.check_every == 1)
        try:
            if graph:
                got, cpu_kw = self.execute_graph(case, kw, stream)
            else:
                cpu_kw = to_cpu(kw) if sample else None  # before the call writes any out=
                got = self.execute(case, kw, stream, explicit, check)
            outcome = "ok" if valid else "accepted_invalid"
            detail = f"{name}: returned without an error"
            if sample:
                err = self.oracle(case, cpu_kw, got)
                outcome = "wrong" if err else ("graph" if graph else "checked")
                detail = f"{name}{' (graph)' if graph else ''}: {err}"
                if err:
                    detail += f" | call: {describe_call(kw)}"
            self.record(op, outcome, detail)
        except msa.MsaError as e:
            if _cuda_error(e):  # a failed launch or copy, reported by msa
                self.record(op, "crash", f"{name}: {e}")
                self.crashed = True
            elif valid:
                self.record(op, "rejected_valid", f"{name}: {e}")
            else:
                self.record(op, "rejected")
                if not any(h in str(e) for h in mut[1]):
                    self.vague[(op, mut[0])] += 1
                    if len(self.vague_examples) < self.args.examples:
                        self.vague_examples.append(f"{op} {mut[0]}: {str(e)[:200]}")
        except RejectedByReference as e:
            self.record(op, "rejected_valid", f"{name}: the CPU reference raised MsaError: {e}")
        except WrongResult as e:
            self.record(op, "wrong" if valid else "accepted_invalid", f"{name}: {e}")
        except Exception as e:  # noqa: BLE001  (the outcome to find)
            crash = _cuda_error(e)
            self.record(op, "crash" if crash else "other_exception",
                        f"{name}: {type(e).__name__}: {str(e)[:300]} | {_where(e)}")
            self.crashed = crash
        self.previous = None if valid else f"{op} mutation={mut[0]}"
        if self.cuda and not valid and not self.crashed:
            # After an invalid call the context must still work.
            try:
                torch.cuda.synchronize()
                assert float(torch.ones(8, device="cuda").sum()) == 8.0
            except Exception as e:  # noqa: BLE001
                self.record(op, "crash", f"{name}: context poisoned: {type(e).__name__}: {e}")
                self.crashed = True


def describe_call(kw):
    """The keywords of a call in short: arrays by dtype, shape and device (small int32 ones by
    value), QTensors by their parts, the rest as they are."""
    def one(v):
        if isinstance(v, torch.Tensor):
            if v.dtype == torch.int32 and v.numel() <= 16:
                return f"i32{v.tolist()}"
            return f"{str(v.dtype).replace('torch.', '')}{list(v.shape)}@{v.device.type}"
        if hasattr(v, "_fields"):
            return "(" + ", ".join(f"{f}={one(getattr(v, f))}" for f in v._fields) + ")"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k}: {one(x)}" for k, x in v.items()) + "}"
        return repr(v)
    return ", ".join(f"{k}={one(v)}" for k, v in kw.items())


class WrongResult(Exception):
    pass


class RejectedByReference(Exception):
    pass


def _cuda_error(e):
    text = f"{type(e).__name__}: {e}"
    return any(s in text for s in ("CUDA error", "AcceleratorError", "illegal memory access",
                                   "unspecified launch failure", "device-side assert"))


def _where(e):
    """The innermost frame of the traceback that is not this script's."""
    frames = traceback.extract_tb(e.__traceback__)
    ours = [f for f in frames if not f.filename.endswith("gpu_soak.py")] or frames
    f = ours[-1]
    return f"{os.path.basename(f.filename)}:{f.lineno} {f.name}"


def memory():
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    return {"torch_allocated": torch.cuda.memory_allocated(), "driver_used": total - free}


def main():
    global torch, msa, _BYTES
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--check-every", type=int, default=10,
                    help="compare every N-th valid call with the CPU backend (graphs: always)")
    ap.add_argument("--verbose", action="store_true",
                    help="also list the invalid calls per op and mutation")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--invalid", type=float, default=1 / 3, help="fraction of invalid calls")
    ap.add_argument("--graph", type=float, default=0.05,
                    help="fraction of valid calls captured into a CUDA graph (where capturable)")
    ap.add_argument("--big", type=float, default=0.03, help="fraction of larger problems")
    ap.add_argument("--warmup", type=int, default=200, help="calls before the memory baseline")
    ap.add_argument("--max-drift-mib", type=float, default=64.0)
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="seconds one call may take before the soak dumps its stack and exits")
    ap.add_argument("--examples", type=int, default=5, help="examples kept per defect kind")
    ap.add_argument("--json", help="write the summary to this file")
    ap.add_argument("--ops", type=lambda x: x.split(","), default=None,
                    help="comma list of the ops to call (default: all)")
    args = ap.parse_args()
    unknown = set(args.ops or []) - set(OPS)
    if unknown:
        ap.error(f"--ops: unknown {sorted(unknown)}; ops are {', '.join(OPS)}")
    args.check_every = max(args.check_every, 1)

    try:
        import torch as torch_module
    except ImportError:
        torch_module = None
    if args.device == "cuda":
        reason = None
        if torch_module is None:
            reason = "torch is not installed"
        elif not torch_module.cuda.is_available():
            reason = "torch.cuda.is_available() is False"
        else:
            import msa as msa_module
            if not msa_module.built_with_cuda():
                reason = "msa was built without its CUDA backend"
        if reason:
            print(f"gpu_soak: skipped: no GPU ({reason}); --device cpu runs the soak on the CPU")
            return 0
    elif torch_module is None:
        print("gpu_soak: --device cpu needs torch")
        return 1
    torch = torch_module
    import msa as msa_module
    msa = msa_module
    _BYTES = {torch.float8_e4m3fn, torch.uint8} | {
        getattr(torch, n) for n in ("float8_e8m0fnu", "float4_e2m1fn_x2") if hasattr(torch, n)}
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python",
                                    "tests"))  # np_reference for the CPU mode's reference
    faulthandler.enable()

    soak = Soak(args)
    if soak.cuda:
        # torch keeps state for graph-safe RNG from the first capture on: capture once before
        # the memory baseline, so that the soak's first graph does not look like a leak.
        x = torch.zeros(1, device="cuda")
        warm = torch.cuda.CUDAGraph()
        with torch.cuda.graph(warm):
            x.add_(1)
        warm.replay()
        torch.cuda.synchronize()
        del warm, x
    mem0 = mem1 = None
    t0 = time.time()
    done = 0
    for _ in range(args.calls):
        faulthandler.dump_traceback_later(args.timeout, exit=True)
        soak.step()
        done += 1
        if soak.crashed:
            break
        if soak.cuda and done == min(args.warmup, args.calls):
            mem0 = memory()
    faulthandler.cancel_dump_traceback_later()
    sync_error = None
    if soak.cuda:
        try:
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            sync_error = f"{type(e).__name__}: {e}"
            soak.record("end", "crash", f"final torch.cuda.synchronize(): {sync_error}")
        if sync_error is None and not soak.crashed:
            mem1 = memory()
    wall = time.time() - t0

    by_outcome = collections.Counter()
    per_op = collections.defaultdict(dict)
    for (op, outcome), n in soak.counts.items():
        by_outcome[outcome] += n
        per_op[op][outcome] = n
    print(f"gpu_soak: {done} calls on {args.device} (seed {args.seed}) in {wall:.1f} s")
    cols = [o for o in OUTCOMES if by_outcome[o]]
    w = max(len(op) for op in OPS)
    print(f"  {'op':{w}s}" + "".join(f"{o:>17s}" for o in cols))
    for op in OPS:
        if op in per_op:
            print(f"  {op:{w}s}" + "".join(f"{per_op[op].get(o, 0):17d}" for o in cols))
    print(f"  {'all':{w}s}" + "".join(f"{by_outcome[o]:17d}" for o in cols))
    n_mut = len({m for _, m in soak.mutations_seen})
    print(f"  invalid calls: {sum(soak.mutations_seen.values())} over {len(soak.mutations_seen)} "
          f"(op, mutation) pairs, {n_mut} mutation kinds")
    if args.verbose:
        for op in OPS:
            row = sorted((m, n) for (o, m), n in soak.mutations_seen.items() if o == op)
            if row:
                print(f"  {op}: " + ", ".join(f"{m} {n}" for m, n in row))
    for kind in DEFECTS:
        if soak.examples[kind]:
            print(f"{kind} (first {len(soak.examples[kind])} of {by_outcome[kind]}):")
            for ex in soak.examples[kind]:
                print("  " + ex)
    if soak.vague:
        print(f"rejected with a message that names none of the expected arguments "
              f"({sum(soak.vague.values())}, not counted as defects):")
        for ex in soak.vague_examples:
            print("  " + ex)
    mem_fail = False
    mem_report = None
    if mem0 is not None and mem1 is not None:
        d_torch = mem1["torch_allocated"] - mem0["torch_allocated"]
        d_driver = mem1["driver_used"] - mem0["driver_used"]
        mem_fail = d_torch > 0 or d_driver > args.max_drift_mib * 2**20
        mem_report = {"after_warmup": mem0, "end": mem1, "torch_allocated_drift": d_torch,
                      "driver_used_drift": d_driver, "ok": not mem_fail}
        print(f"memory: torch allocated {mem0['torch_allocated']} -> {mem1['torch_allocated']} B "
              f"({d_torch:+d}), driver used {mem0['driver_used'] / 2**20:.1f} -> "
              f"{mem1['driver_used'] / 2**20:.1f} MiB ({d_driver / 2**20:+.1f}; limit "
              f"{args.max_drift_mib:g}){': FAIL' if mem_fail else ''}")
    elif soak.cuda:
        print("memory: not measured (the soak stopped early)")
        mem_fail = True
    defects = sum(by_outcome[k] for k in DEFECTS)
    ok = defects == 0 and not mem_fail and done == args.calls
    summary = (f"gpu_soak: {'PASS' if ok else 'FAIL'}: {done} calls on {args.device} in "
               f"{wall:.0f} s, " + ", ".join(f"{o} {by_outcome[o]}" for o in OUTCOMES[:4])
               + f", defects {defects}"
               + (f", memory drift torch {mem_report['torch_allocated_drift']:+d} B driver "
                  f"{mem_report['driver_used_drift'] / 2**20:+.1f} MiB" if mem_report else ""))
    print(summary)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"pass": ok, "calls": done, "device": args.device, "seed": args.seed,
                       "wall_s": round(wall, 1), "outcomes": dict(by_outcome),
                       "per_op": per_op, "defects": defects,
                       "examples": {k: v for k, v in soak.examples.items() if v},
                       "vague": {f"{op} {m}": n for (op, m), n in soak.vague.items()},
                       "vague_examples": soak.vague_examples, "memory": mem_report,
                       "mutations": {op: {m: n for (o, m), n in sorted(soak.mutations_seen.items())
                                          if o == op} for op in OPS},
                       "summary": summary}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
