"""BSR attention benchmark: BSR-108K and BSR-32K-R1 of bench/CASES.md.

msa.BlockSparseAttention (FlashInfer's BSR wrapper surface) is planned once from device indptr /
indices and its run() is timed; FlexAttention (torch.compile) runs the same block mask in the same
process, on its Triton backend and on FA4's (CuTe FlashAttention) where flash_attn.cute imports. Times are peers.time_ms's (CUDA events around each call after the L2
flush of MSA_BENCH_FLUSH), medians of --iters; effective TFLOP/s count only the causally visible
(query head, key) pairs of the listed blocks (4 D FLOP each). With --json, one record of
bench/SCHEMA.md per (case, impl). Needs a CUDA device, torch and msa's CUDA wheel.
"""
import argparse
import os
import sys

import numpy as np
import torch

import msa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also when imported by a test
import records  # noqa: E402
from peers import FLUSH, time_ms  # noqa: E402

D = 128
# S tokens (queries = keys, causal), heads, R x C blocks, listed blocks per block row: the
# diagonal block (holding the row block's last query) and random earlier ones.
CASES = {
    "BSR-108K": dict(S=110592, hq=32, hkv=8, R=64, C=64, per_row=64),
    "BSR-32K-R1": dict(S=32768, hq=64, hkv=4, R=1, C=64, per_row=32),
}


def make_bsr(c, seed):
    """indptr [MB + 1], indices (ascending per row) as int32 numpy arrays."""
    S, R, C, per_row = c["S"], c["R"], c["C"], c["per_row"]
    rng = np.random.default_rng(seed)
    mb = S // R
    indptr = np.zeros(mb + 1, np.int64)
    rows = []
    for i in range(mb):
        diag = ((i + 1) * R - 1) // C
        k = min(per_row - 1, diag)
        earlier = rng.choice(diag, size=k, replace=False) if k > 0 else np.zeros(0, np.int64)
        row = np.sort(np.append(earlier, diag))
        rows.append(row)
        indptr[i + 1] = indptr[i] + len(row)
    return indptr.astype(np.int32), np.concatenate(rows).astype(np.int32)


def attended_pairs(c, indptr, indices):
    """Causally visible (query, key) pairs of the listed blocks, summed over the S queries."""
    R, C = c["R"], c["C"]
    total = 0
    t_off = np.arange(R, dtype=np.int64)
    for i in range(len(indptr) - 1):
        cols = indices[indptr[i]:indptr[i + 1]].astype(np.int64)
        t = i * R + t_off[:, None]                      # [R, 1] queries of the row block
        vis = np.clip(t - cols[None, :] * C + 1, 0, C)  # [R, n] visible keys per block
        total += int(vis.sum())
    return total


def flex_mask(c, indptr, indices):
    """The same mask as a FlexAttention BlockMask (heads share it) of 128 x 128 tiles, the
    smallest its Triton kernel takes: a tile is whole when every query of its rows lists both
    64-key blocks of its columns and it lies below the diagonal, partial when any query lists
    one; mask_mod refines partial tiles by a per-query table of listed blocks and the causal
    rule."""
    from torch.nn.attention.flex_attention import BlockMask

    S, R, C, T = c["S"], c["R"], c["C"], 128
    assert C == 64 and S % T == 0, "64-key blocks, 128-token tiles"
    nb = S // C
    dev = "cuda"
    ip = torch.from_numpy(indptr.astype(np.int64)).to(dev)
    ix = torch.from_numpy(indices.astype(np.int64)).to(dev)
    row_of = torch.repeat_interleave(torch.arange(len(indptr) - 1, device=dev), ip[1:] - ip[:-1])
    listed = torch.zeros(len(indptr) - 1, nb, dtype=torch.bool, device=dev)
    listed[row_of, ix] = True
    per_query = listed.repeat_interleave(R, dim=0)  # [S, nb]
    pairs = per_query.view(S // T, T, nb // 2, 2)   # [q tiles, rows, kv tiles, 2 blocks]
    anyl = pairs.any(dim=3).any(dim=1)
    qt = torch.arange(S // T, device=dev)
    below = qt[:, None] > qt[None, :]
    whole = pairs.all(dim=3).all(dim=1) & below
    partial = anyl & ~whole

    def mask_mod(b, h, qi, ki):
        return per_query[qi, ki // 64] & (qi >= ki)

    def blocks(m):
        m = m.unsqueeze(0).unsqueeze(0)  # [1, 1, q tiles, kv tiles]
        num = m.sum(-1).to(torch.int32)
        order = torch.argsort((~m).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return num, order

    kv_num, kv_idx = blocks(partial)
    full_num, full_idx = blocks(whole)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=T,
                                    mask_mod=mask_mod)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=list(CASES))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-flex", action="store_true", help="no FlexAttention peers")
    ap.add_argument("--json", help="append one record per (case, impl) (JSON Lines)")
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    for name in args.cases:
        c = CASES[name]
        S, hq, hkv = c["S"], c["hq"], c["hkv"]
        indptr, indices = make_bsr(c, seed=1)
        flop = 4.0 * D * hq * attended_pairs(c, indptr, indices)
        q = torch.randn(S, hq, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(S, hkv, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(S, hkv, D, device="cuda", dtype=torch.bfloat16)
        bsa = msa.BlockSparseAttention().plan(
            torch.from_numpy(indptr).cuda(), torch.from_numpy(indices).cuda(), M=S, N=S,
            R=c["R"], C=c["C"], num_qo_heads=hq, num_kv_heads=hkv, head_dim=D,
            topk=c["per_row"], causal=True)
        ours = bsa.run(q, k, v, check=True)
        res = {"msa": time_ms(lambda: bsa.run(q, k, v), args.iters, args.warmup)}
        notes = []
        # FlexAttention on the same mask: its Triton backend, and FA4 (CuTe) where flash_attn.cute
        # is importable (../shared/PEERS.md carries it to the GPU machine).
        backends = [] if args.no_flex else [("flex-triton", None), ("flex-fa4", {"BACKEND": "FLASH"})]
        for impl, options in backends:
            try:
                from torch.nn.attention.flex_attention import flex_attention
                flex = torch.compile(flex_attention, dynamic=False)
                bm = flex_mask(c, indptr, indices)
                qh, kh, vh = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
                fn = lambda: flex(qh, kh, vh, block_mask=bm, enable_gqa=True,
                                  kernel_options=options)
                ref = fn()[0].transpose(0, 1).float()
                err = ((ours.float() - ref).norm() / ref.norm()).item()
                notes.append(f"msa vs {impl} rel L2 {err:.2e}")
                res[impl] = time_ms(fn, args.iters, args.warmup)
            except Exception as e:  # report, do not hide: the table says why a peer is absent
                notes.append(f"{impl}: {type(e).__name__}: {str(e)[:160]}")
        note = "; ".join(notes)
        for impl, times in res.items():
            r = records.new_record(name, "attention_forward", impl)  # BSR run() is one call
            r.update(records.shape(1, S, S, hq, hkv, D, c["C"], c["per_row"], "bsr", True))
            records.add_timing(r, times, args.iters, args.warmup, flop, 0, "tflops")
            records.add_check(r, "skipped")
            rows.append(r)
            if args.json:
                records.append(args.json, records.add_environment(r, FLUSH))
        print(f"{name}: {note}", flush=True)
    print("%-11s %-12s %10s %10s %10s %9s" % ("case", "impl", "median ms", "min", "max",
                                              "eff TF/s"))
    for r in rows:
        print("%-11s %-12s %10.3f %10.3f %10.3f %9.1f" % (r["case"], r["impl"], r["median_ms"],
                                                          r["min_ms"], r["max_ms"], r["tflops"]))


if __name__ == "__main__":
    main()
