#!/usr/bin/env python3
"""Peer figures for the sparse prefill cases, in the same run as bench_sparse_fwd.

Reads the selections that `bench_sparse_fwd --dump DIR --json FILE` wrote (DIR/CASE.q2k.bin) and
our records (FILE, bench/SCHEMA.md; the shapes come from them), then times on the same shapes:
  - FlexAttention with the same selection: `blk` cases (block mask: the selected blocks below the
    diagonal as full blocks, the diagonal with a causal mask_mod) and `tok` at 8K (union block
    mask per 128-query block + a per-token mask_mod over a dense [Hkv, S, nblk] table);
  - cuDNN SDPA, dense causal, on the same S (its own FLOP count: every visible pair).
Prints ours vs peers and the ratios of effective TFLOP/s (FLOP = 4 * D * attended pairs), and
with --json FILE appends a record per peer measurement (bench/records.py).
"""
import argparse
import os
import statistics

import torch
import torch.nn.functional as F


import records  # same folder: the script's directory is on sys.path

FLUSH = records.flush_name()


def flush_l2(flush, i):
    """The L2 flush before a timed run, as the C++ programs' (workloads/flush.cu): MSA_BENCH_FLUSH
    memset (default: a 256 MB fill, which leaves dirty lines in the L2) or read (a reduction over
    the buffer, which leaves clean lines)."""
    if FLUSH == "memset":
        flush.fill_(i & 0xFF)
    else:
        flush.view(torch.int32).max()


def time_ms(fn, iters, warmup, before=None):
    """Median, min, max ms of fn() over iters calls, each after an L2 flush and `before()` (e.g. a
    process group's barrier; both outside the timed span)."""
    flush = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
    for _ in range(warmup):
        fn()
    times = []
    for i in range(iters):
        flush_l2(flush, i)
        if before is not None:
            before()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times), min(times), max(times)


def load_selection(dump, rec):
    """The q2k [Hkv, S, topK] that bench_sparse_fwd --dump wrote for the one-request case `rec`."""
    import numpy

    q2k = torch.from_numpy(numpy.fromfile(os.path.join(dump, rec["case"] + ".q2k.bin"), dtype="int32"))
    return q2k.view(rec["hkv"], rec["seq_q"], rec["topk"])


def flex_block_mask(q2k, rec, pattern, s):
    """BlockMask over Hq heads for one request of length s (queries == keys, causal)."""
    from torch.nn.attention.flex_attention import BlockMask

    hkv, g = rec["hkv"], rec["hq"] // rec["hkv"]
    nqb = (s + 127) // 128
    nkb = nqb
    dev = "cuda"
    q2k = q2k.to(dev)
    if pattern == "blk":
        sel = q2k[:, ::128, :][:, :nqb, :]  # one selection per query block
        sel_mask = torch.zeros(hkv, nqb, nkb + 1, dtype=torch.bool, device=dev)
        idx = torch.where(sel >= 0, sel, torch.full_like(sel, nkb)).long()
        sel_mask.scatter_(2, idx, True)
        sel_mask = sel_mask[:, :, :nkb]
        qb = torch.arange(nqb, device=dev)
        diag = torch.zeros_like(sel_mask)
        diag[:, qb, qb] = True
        partial = sel_mask & diag
        full = sel_mask & ~diag

        def causal(b, h, qi, ki):
            return qi >= ki

        mask_mod = causal
    else:
        # union of the 128 tokens' selections per query block; per-token table for mask_mod
        dense = torch.zeros(hkv, s, nkb + 1, dtype=torch.bool, device=dev)
        idx = torch.where(q2k >= 0, q2k, torch.full_like(q2k, nkb)).long()
        dense.scatter_(2, idx, True)
        dense = dense[:, :, :nkb].contiguous()
        pad = nqb * 128 - s
        dd = F.pad(dense, (0, 0, 0, pad)) if pad else dense
        partial = dd.view(hkv, nqb, 128, nkb).any(dim=2)
        full = torch.zeros_like(partial)

        def per_token(b, h, qi, ki):
            return dense[h // g, qi, ki // 128] & (qi >= ki)

        mask_mod = per_token

    def to_blocks(m):
        m = m.repeat_interleave(g, dim=0).unsqueeze(0)  # [1, Hq, nqb, nkb]
        num = m.sum(-1).to(torch.int32)
        order = torch.argsort((~m).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return num, order

    kv_num, kv_idx = to_blocks(partial)
    full_num, full_idx = to_blocks(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=128,
                                    mask_mod=mask_mod)


def cudnn_dense(q, k, v, visible_pairs, iters, warmup):
    """cuDNN SDPA dense causal on q [1, Hq, S, D], k/v [1, Hkv, S, D]: (median, min, max ms, TF/s)
    with its own FLOP count (4 D per visible (query head, key) pair, all heads counted in
    `visible_pairs`), or ("error", text)."""
    from torch.nn.attention import sdpa_kernel, SDPBackend

    hq, hkv, d = q.shape[1], k.shape[1], q.shape[3]
    try:
        ke = k.repeat_interleave(hq // hkv, dim=1)
        ve = v.repeat_interleave(hq // hkv, dim=1)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            med, lo, hi = time_ms(lambda: F.scaled_dot_product_attention(q, ke, ve, is_causal=True),
                                  iters, warmup)
        return (med, lo, hi, 4.0 * d * visible_pairs / (med * 1e-3) / 1e12)
    except Exception as e:  # report, keep going
        return ("error", str(e)[:200])


def peer_record(path, ours, impl, times, iters, warmup, dense=False):
    """Appends a peer's record on our record's shape: the same selection (FLOP and bytes as ours),
    or with dense=True dense causal attention (its own counts: every visible pair; q, k, v, out
    and lse once). No-op without --json or for a peer that did not run."""
    if not path or times is None or times[0] == "error":
        return
    r = records.new_record(ours["case"], "attention_forward", impl)
    r.update(records.shape_of(ours))
    flop, nbytes = ours["flop"], ours["bytes"]
    if dense:
        r.update({"topk": 0, "pattern": "dense"})
        s, hq, hkv, d = ours["seq_q"], ours["hq"], ours["hkv"], ours["d"]
        flop = 4.0 * d * ours["pairs"]["visible"]
        nbytes = 2.0 * s * d * (2 * hq + 2 * hkv) + 4.0 * hq * s
    records.add_timing(r, times[:3], iters, warmup, flop, nbytes, "tflops")
    records.add_check(r, "skipped")
    records.add_environment(r, FLUSH, ours.get("commit"))
    records.append(path, r)


def e2e(path, iters, warmup, out):
    """E2E-32K: our pipeline time (bench_pipeline --json) over cuDNN dense causal on the shape."""
    ours = [r for r in records.read(path) if r["impl"] == "msa" and r["flush"] == FLUSH]
    stage = {(r["case"], r["op"]): r for r in ours}
    for r in ours:
        if r["op"] != "pipeline":
            continue
        s, hq, hkv, d = r["seq_q"], r["hq"], r["hkv"], r["d"]
        q = torch.randn(1, hq, s, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, hkv, s, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(1, hkv, s, d, device="cuda", dtype=torch.bfloat16)
        dr = cudnn_dense(q, k, v, r["pairs"]["visible"], iters, warmup)
        if dr[0] == "error":
            print("%s: cuDNN error %s" % (r["case"], dr[1]))
            continue
        select, attention = stage[(r["case"], "block_topk")], stage[(r["case"], "attention_forward")]
        print("%s: ours %.3f ms (select %.3f + attention %.3f); cuDNN dense causal %.3f ms "
              "(%.1f TF/s); ours / cuDNN = %.3f (target <= 0.333)"
              % (r["case"], r["median_ms"], select["median_ms"], attention["median_ms"], dr[0], dr[3],
                 r["median_ms"] / dr[0]))
        peer_record(out, r, "cudnn", dr, iters, warmup, dense=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", help="bench_sparse_fwd --dump folder")
    ap.add_argument("--ours", help="bench_sparse_fwd --json records")
    ap.add_argument("--e2e", help="bench_pipeline --json records (E2E-32K vs cuDNN dense)")
    ap.add_argument("--json", help="append the peers' records to this file (bench/SCHEMA.md)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--flex-tok-max", type=int, default=8192,
                    help="longest S for which FlexAttention runs the tok selection")
    args = ap.parse_args()
    if args.e2e and os.path.exists(args.e2e):
        e2e(args.e2e, args.iters, args.warmup, args.json)
    elif args.e2e:
        print("E2E-32K: no %s (bench_pipeline did not run): cuDNN comparison skipped" % args.e2e)
    if not (args.dump and args.ours):
        return
    ours = {r["case"]: r for r in records.read(args.ours)
            if r["impl"] == "msa" and r["op"] == "attention_forward" and r["flush"] == FLUSH}
    from torch.nn.attention.flex_attention import flex_attention

    flex = torch.compile(flex_attention, dynamic=False)
    rows = []
    dense_cache = {}
    for name in ["P8K-tok", "P32K-tok", "P32K-blk", "P48K-tok", "VARLEN-tok", "DENSE-8K",
                 "DENSE-32K"]:
        if name not in ours or not os.path.exists(os.path.join(args.dump, name + ".q2k.bin")):
            continue
        rec = ours[name]
        if rec["batch"] != 1:
            rows.append((name, rec, None, None, "varlen: peers not run (no varlen flex/cudnn path here)"))
            continue
        s, hq, hkv, d = rec["seq_q"], rec["hq"], rec["hkv"], rec["d"]
        q2k = load_selection(args.dump, rec)
        torch.manual_seed(0)
        q = torch.randn(1, hq, s, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, hkv, s, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(1, hkv, s, d, device="cuda", dtype=torch.bfloat16)
        flex_res = None
        dense_case = name.startswith("DENSE")  # no selection: cuDNN dense is the peer
        if not dense_case and (rec["pattern"] == "blk" or s <= args.flex_tok_max):
            try:
                bm = flex_block_mask(q2k, rec, rec["pattern"], s)
                fn = lambda: flex(q, k, v, block_mask=bm, enable_gqa=True)
                med, lo, hi = time_ms(fn, args.iters, args.warmup)
                flex_res = (med, lo, hi, rec["flop"] / (med * 1e-3) / 1e12)
            except Exception as e:  # report, keep going
                flex_res = ("error", str(e)[:200])
        peer_record(args.json, rec, "flex-triton", flex_res, args.iters, args.warmup)
        dense_res = dense_cache.get(s)
        if dense_res is None:
            dense_res = cudnn_dense(q, k, v, rec["pairs"]["visible"], args.iters, args.warmup)
            dense_cache[s] = dense_res
            peer_record(args.json, rec, "cudnn", dense_res, args.iters, args.warmup, dense=True)
        rows.append((name, rec, flex_res, dense_res, ""))
        del q, k, v
        torch.cuda.empty_cache()

    print("\nL2 flush before each timed run: %s (MSA_BENCH_FLUSH)" % FLUSH)
    print("%-11s %22s %26s %26s %9s %9s" % ("case", "ours ms / TFLOP/s", "flex same-sel ms / TF/s",
                                             "cuDNN dense ms / TF/s", "vs flex", "vs cuDNN"))
    for name, o, fr, dr, note in rows:
        def fmt(r):
            if r is None:
                return "n/a"
            if r[0] == "error":
                return "error"
            return "%.3f / %.1f" % (r[0], r[3])
        vf = "%.2fx" % (o["tflops"] / fr[3]) if fr and fr[0] != "error" else "-"
        vd = "%.2fx" % (dr[0] / o["median_ms"]) if dr and dr[0] != "error" else "-"
        print("%-11s %22s %26s %26s %9s %9s %s" % (name, "%.3f / %.1f" % (o["median_ms"], o["tflops"]),
                                                  fmt(fr), fmt(dr), vf, vd, note))
        for r in (fr, dr):
            if r and r[0] == "error":
                print("   error:", r[1])
    print("vs flex: ratio of effective TFLOP/s on the same selection; vs cuDNN: dense causal time "
          "over our sparse time (speedup of sparse over dense).")
    if args.json:
        print("peers' records appended to %s" % args.json)


if __name__ == "__main__":
    main()
