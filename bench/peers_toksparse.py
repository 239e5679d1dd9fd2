#!/usr/bin/env python3
"""FlexAttention on the token-sparse cases (bench/CASES.md, TOKSPARSE-*), in the same run as
bench_sparse_fwd.

The selection is q2k [Hkv, S, 2048] of batch-local key ids (kv_block_size 1): the ids that
`bench_sparse_fwd --dump DIR` wrote (DIR/CASE.q2k.bin), or without a dump the same ids drawn here
by the rule and seed of workloads/patterns.cpp (Pattern::ids), bit for bit: per (kv head, query)
the 128 most recent visible keys, then the first distinct draws x = mix64(state + j) % m from the
earlier keys [0, m) until 2048 (every visible key when fewer), ascending, -1 padded.

FlexAttention (Triton backend, torch.compile) runs it with a mask_mod that reads a dense
[Hkv, S, S] bool table of the selected ids (64 MB at 8K) and the block mask create_block_mask
builds from it: 2048 of up to 8192 keys leave almost no 128 x 128 block empty, so FlexAttention
does about the work of dense causal attention with a table lookup per score. GQA through
enable_gqa, bf16, CUDA events after warm-up with the L2 flush of peers.py. Effective TFLOP/s count
the same pairs as ours: FLOP = 4 D x G x the visible ids over every (kv head, query) row. cuDNN
dense causal on the same S is printed as the bar a sparse kernel must beat (its own FLOP count).
Before timing, FlexAttention's output on sampled query rows is checked against fp32 attention over
the rows' ids.

  python3 bench/peers_toksparse.py [--case TOKSPARSE-8K] [--dump DIR] [--ours FILE] [--json FILE]
  python3 bench/peers_toksparse.py --ids-only [--case NAME] [--dump DIR]   # no GPU needed

--ids-only draws (or loads) the ids, checks the rule on every row and, given both a dump and the
generator, that they are identical; it needs numpy only. The peer's default is TOKSPARSE-8K: past
it the [Hkv, S, S] table and the block-mask build grow with S^2 (TOKSPARSE-32K-G16 would need
create_block_mask over 64 heads of 32K x 32K).
"""
import argparse
import os
import sys
import time

import numpy as np

# name: (S, Hq, Hkv); every case D = 128, 2048 ids, causal, one request (workloads/cases.cpp).
CASES = {"TOKSPARSE-8K": (8192, 64, 1), "TOKSPARSE-32K": (32768, 64, 1),
         "TOKSPARSE-32K-G16": (32768, 64, 4)}
D, TOPK, RECENT = 128, 2048, 128  # RECENT: kRecentKeys of workloads/patterns.h
SEED = 20261130  # the seed bench_sparse_fwd draws its inputs and selections with
MASK64 = (1 << 64) - 1


def mix64(x):
    """SplitMix64's finalizer on a Python int (workloads/inputs.h)."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def mix64_np(x):
    """The same on a uint64 array (its arithmetic wraps modulo 2^64 as the C++ does)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def token_ids(s, hkv, topk=TOPK, seed=SEED):
    """q2k [hkv, s, topk] int32 of one causal request of s queries over s keys, as
    make_selection(Pattern::ids) draws it: row (h, t) streams mix64(state + j), state =
    mix64(mix64(seed) ^ mix64(h * 0x100000001b3 + t)), and keeps its first distinct draws."""
    q2k = np.full((hkv, s, topk), -1, dtype=np.int32)
    recent = min(topk, RECENT)
    need = topk - recent
    seed_mix = mix64(seed)
    for h in range(hkv):
        for t in range(s):
            vis = t + 1
            row = q2k[h, t]
            if vis <= topk:
                row[:vis] = np.arange(vis, dtype=np.int32)
                continue
            m = vis - recent
            state = np.uint64(mix64(seed_mix ^ mix64((h * 0x100000001B3 + t) & MASK64)))
            n = 2 * need + 64
            while True:  # enough draws for `need` distinct ones (doubling on a shortfall)
                draws = mix64_np(state + np.arange(n, dtype=np.uint64)) % np.uint64(m)
                vals, first = np.unique(draws, return_index=True)
                if vals.size >= need:
                    break
                n *= 2
            cut = np.sort(first)[need - 1] if need else -1  # the draw that completes the row
            row[:need] = vals[first <= cut]
            row[need:] = np.arange(m, vis, dtype=np.int32)
    return q2k


def check_rule(q2k, topk=TOPK):
    """Problems of q2k [hkv, s, topk] against the rule of one causal request (an empty list when
    it follows it): each row holds min(topk, t + 1) ascending (so distinct) visible ids, then -1,
    and ends with the min(topk, 128, t + 1) most recent keys."""
    problems = []
    hkv, s, _ = q2k.shape
    t = np.arange(s, dtype=np.int64)[:, None]
    count = np.minimum(topk, t[:, 0] + 1)
    slot = np.arange(topk)[None, :]
    for h in range(hkv):
        r = q2k[h].astype(np.int64)
        used = slot < count[:, None]
        if (r[~used] != -1).any():
            problems.append(f"head {h}: ids past the row's count instead of -1")
        if ((r < 0) & used).any() or ((r > t) & used).any():
            problems.append(f"head {h}: an id outside the visible keys [0, t]")
        if ((np.diff(r, axis=1) <= 0) & used[:, 1:]).any():
            problems.append(f"head {h}: ids not strictly ascending")
        for j in range(min(topk, RECENT)):  # the j-th most recent key in slot count - 1 - j
            rows = np.nonzero(count > j)[0]
            if (r[rows, count[rows] - 1 - j] != rows - j).any():
                problems.append(f"head {h}: the {j + 1}-th most recent key missing")
                break
    return problems


def load_dump(dump, case, hkv, s):
    path = os.path.join(dump, case + ".q2k.bin")
    if not os.path.exists(path):
        return None
    return np.fromfile(path, dtype=np.int32).reshape(hkv, s, TOPK)


def counts(q2k, hq):
    """attended ((query head, key) pairs: G x the visible ids, every id here being visible),
    visible (every causally visible pair) and selected_keys ((kv head, key) pairs some query
    selected), as workloads/patterns.cpp counts them."""
    hkv, s, _ = q2k.shape
    g = hq // hkv
    selected = 0
    for h in range(hkv):
        ids = q2k[h][q2k[h] >= 0]
        selected += int((np.bincount(ids, minlength=s) > 0).sum())
    return {"attended": g * int((q2k >= 0).sum()), "visible": hq * s * (s + 1) // 2,
            "selected_keys": selected}


def ids_only(args, s, hq, hkv):
    t0 = time.perf_counter()
    gen = token_ids(s, hkv)
    print(f"{args.case}: {gen.size} ids drawn in numpy in {time.perf_counter() - t0:.1f} s")
    rc = 0
    dumped = load_dump(args.dump, args.case, hkv, s) if args.dump else None
    for what, q2k in (("numpy", gen), ("dump", dumped)):
        if q2k is None:
            continue
        problems = check_rule(q2k)
        print(f"  {what}: {'follows the rule' if not problems else '; '.join(problems)}")
        rc |= bool(problems)
    if dumped is not None:
        same = np.array_equal(gen, dumped)
        print(f"  numpy ids {'identical to' if same else 'DIFFER from'} bench_sparse_fwd's dump")
        rc |= not same
    c = counts(gen, hq)
    print(f"  attended pairs {c['attended']}, density {c['attended'] / c['visible']:.4f}, "
          f"FLOP {4.0 * D * c['attended']:.4e}")
    return rc


def flex_setup(q2k, hq, device):
    """The [Hkv, S, S] bool table of the selected ids, its mask_mod and block mask."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    hkv, s, _ = q2k.shape
    g = hq // hkv
    ids = torch.from_numpy(q2k).to(device).long()
    table = torch.zeros(hkv, s, s + 1, dtype=torch.bool, device=device)  # column s: the -1 pads
    table.scatter_(2, torch.where(ids >= 0, ids, s), True)
    table = table[:, :, :s].contiguous()
    del ids

    def mask_mod(b, h, q_idx, kv_idx):
        return table[h // g, q_idx, kv_idx]

    # One kv head: every query head reads the same rows, so the block mask broadcasts over heads.
    bm = create_block_mask(mask_mod, 1, None if hkv == 1 else hq, s, s, device=device)
    return table, bm


def sampled_check(out, q, k, v, q2k, rows):
    """Relative L2 error of out [1, Hq, S, D] on `rows` against fp32 attention over each row's
    ids (softmax scale 1/sqrt(D))."""
    import torch

    hq, hkv = q.shape[1], k.shape[1]
    g = hq // hkv
    num = den = 0.0
    for t in rows:
        for h in range(hkv):
            ids = torch.from_numpy(q2k[h, t][q2k[h, t] >= 0].astype(np.int64)).to(q.device)
            qs = q[0, h * g:(h + 1) * g, t].float()  # [G, D]
            ks, vs = k[0, h, ids].float(), v[0, h, ids].float()
            p = torch.softmax(qs @ ks.T / q.shape[-1] ** 0.5, dim=-1)
            ref = p @ vs
            got = out[0, h * g:(h + 1) * g, t].float()
            num += float(((got - ref) ** 2).sum())
            den += float((ref ** 2).sum())
    return (num / den) ** 0.5 if den > 0 else float("inf")


def peer_record(path, base, impl, times, iters, warmup, flop, nbytes, check, errors, commit):
    """Appends a peer's record (bench/SCHEMA.md) on `base`, the shape fields and pairs."""
    import records

    if not path:
        return
    r = records.new_record(base["case"], "attention_forward", impl)
    r.update({k: v for k, v in base.items() if k != "case"})
    records.add_timing(r, times, iters, warmup, flop, nbytes, "tflops")
    records.add_check(r, check, errors)
    records.add_environment(r, records.flush_name(), commit)
    records.append(path, r)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", default="TOKSPARSE-8K", choices=sorted(CASES))
    ap.add_argument("--dump", help="bench_sparse_fwd --dump folder (its ids); default: draw them")
    ap.add_argument("--ours", help="bench_sparse_fwd --json records, printed beside the peer")
    ap.add_argument("--json", help="append the peers' records to this file (bench/SCHEMA.md)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--ids-only", action="store_true", help="draw / load and check the ids, no GPU")
    args = ap.parse_args()
    s, hq, hkv = CASES[args.case]
    if args.ids_only:
        return ids_only(args, s, hq, hkv)

    import torch
    from torch.nn.attention.flex_attention import flex_attention

    import records
    from peers import FLUSH, cudnn_dense, time_ms

    q2k = load_dump(args.dump, args.case, hkv, s) if args.dump else None
    source = "bench_sparse_fwd's dump"
    if q2k is None:
        t0 = time.perf_counter()
        q2k, source = token_ids(s, hkv), "drawn in numpy (the same rule and seed)"
        print(f"{args.case}: ids {source} in {time.perf_counter() - t0:.1f} s")
    problems = check_rule(q2k)
    if problems:
        raise SystemExit(f"{args.case}: the ids break the rule: {'; '.join(problems)}")
    pairs = counts(q2k, hq)
    flop = 4.0 * D * pairs["attended"]
    # What the op must move at least (workloads/counts.cpp): q, the selected K and V rows, q2k,
    # out and lse.
    nbytes = (2.0 * s * hq * D * 2 + 2.0 * 2 * D * pairs["selected_keys"] + 4.0 * q2k.size
              + 4.0 * hq * s)

    ours = None
    if args.ours and os.path.exists(args.ours):
        for r in records.read(args.ours):
            if (r["case"] == args.case and r["impl"] == "msa" and r["op"] == "attention_forward"
                    and r["flush"] == FLUSH):
                ours = r
    base = {"case": args.case}
    base.update(records.shape(1, s, s, hq, hkv, D, 1, TOPK, "ids", True))
    base["pairs"] = pairs
    base["density"] = pairs["attended"] / pairs["visible"]

    dev = "cuda"
    torch.manual_seed(0)
    q = torch.randn(1, hq, s, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, hkv, s, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(1, hkv, s, D, device=dev, dtype=torch.bfloat16)
    t0 = time.perf_counter()
    table, bm = flex_setup(q2k, hq, dev)
    torch.cuda.synchronize()
    mask_s = time.perf_counter() - t0
    flex = torch.compile(flex_attention, dynamic=False)
    fn = lambda: flex(q, k, v, block_mask=bm, enable_gqa=True)
    # The first rows, the last ones that see fewer than 2048 keys and the first that draw, random.
    rows = {0, 1, 127, 2047, 2048, 2049, s // 2, s - 1}
    rows = sorted(rows | set(np.random.default_rng(7).integers(0, s, 8).tolist()))
    err = sampled_check(fn(), q, k, v, q2k, rows)
    check = "passed" if err <= 1e-2 else "failed"
    fr = time_ms(fn, args.iters, args.warmup)
    dr = cudnn_dense(q, k, v, pairs["visible"], args.iters, args.warmup)

    commit = ours.get("commit") if ours else None
    peer_record(args.json, base, "flex-triton", fr, args.iters, args.warmup, flop, nbytes, check,
                {"out_rel_l2": err}, commit)
    if dr[0] != "error":
        dense = {key: val for key, val in base.items() if key not in ("pairs", "density")}
        dense.update(topk=0, pattern="dense")
        peer_record(args.json, dense, "cudnn", dr[:3], args.iters, args.warmup,
                    4.0 * D * pairs["visible"], 2.0 * s * D * (2 * hq + 2 * hkv) + 4.0 * hq * s,
                    "skipped", None, commit)

    print(f"\n{args.case}: S={s} Hq={hq} Hkv={hkv} D={D}, {TOPK} token ids per (kv head, query), "
          f"ids {source}; L2 flush {FLUSH}")
    print(f"  attended pairs {pairs['attended']} (density {base['density']:.4f}), FLOP {flop:.4e}")
    if ours:
        print(f"  msa                      {ours['median_ms']:9.3f} ms  {ours['tflops']:7.1f} TFLOP/s "
              f"(check {ours['check']})")
    else:
        print("  msa                      no record (--ours): bench_sparse_fwd --case", args.case)
    print(f"  FlexAttention (Triton)   {fr[0]:9.3f} ms  {flop / (fr[0] * 1e-3) / 1e12:7.1f} TFLOP/s "
          f"[{fr[1]:.3f}, {fr[2]:.3f}] (check {check}, rel L2 {err:.2e}; mask table + block mask "
          f"{mask_s:.1f} s, untimed)")
    if dr[0] == "error":
        print("  cuDNN dense causal       error:", dr[1])
    else:
        print(f"  cuDNN dense causal       {dr[0]:9.3f} ms  {dr[3]:7.1f} TFLOP/s (every visible pair)")
    if ours:
        print(f"  msa / flex effective TFLOP/s: {fr[0] / ours['median_ms']:.2f}x")
    if args.json:
        print(f"peers' records appended to {args.json}")
    del table
    return 1 if check == "failed" else 0


if __name__ == "__main__":
    sys.exit(main())
