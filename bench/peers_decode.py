#!/usr/bin/env python3
"""Peers of the decode benchmark, in the same run as bench_decode (bench/CASES.md, DEC-B32-dense).

Dense decode B=32, 1 query, 16384 keys, Hq=64, Hkv=4, D=128 (--head-dim 64 / 256: the -D64 / -D256
cases), bf16, on contiguous KV:
  - cuDNN SDPA and torch flash (FA2), the G = 16 query heads of a kv head passed as 16 queries of
    one head (non-causal: a decode query sees every key), so each K/V byte is read once;
  - the same through enable_gqa=True (q [B, 64, 1, D]) where the backend takes it.
TB/s uses our byte count: K and V once per kv head, q and out. With --ours FILE (bench_decode
--json records) our line of the same case prints beside the peers; with --json FILE each peer's
measurement is appended as a record (bench/SCHEMA.md).
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import records  # same folder: the script's directory is on sys.path
from peers import FLUSH, time_ms


WARMUP = 5


def time_us(fn, iters=50, warmup=WARMUP):
    """Median, min, max microseconds of fn (the shared timing of peers.py, in us)."""
    return tuple(t * 1e3 for t in time_ms(fn, iters, warmup))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", help="bench_decode --json records")
    ap.add_argument("--json", help="append the peers' records to this file (bench/SCHEMA.md)")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--head-dim", type=int, default=128, choices=(64, 128, 256))
    args = ap.parse_args()
    B, HQ, HKV, D, LK = 32, 64, 4, args.head_dim, 16384
    case = "DEC-B32-dense" if D == 128 else f"DEC-B32-dense-D{D}"
    G = HQ // HKV
    torch.manual_seed(0)
    dev = "cuda"
    k = torch.randn(B, HKV, LK, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, HKV, LK, D, device=dev, dtype=torch.bfloat16)
    q_rows = torch.randn(B, HKV, G, D, device=dev, dtype=torch.bfloat16)  # G heads as G queries
    q_gqa = q_rows.reshape(B, HQ, 1, D)
    nbytes = 2 * B * HKV * LK * D * 2 + 2 * B * HQ * D * 2
    ref = F.scaled_dot_product_attention(q_rows.float(), k.float(), v.float())
    ours = None
    if args.ours:
        ours = next((r for r in records.read(args.ours) if r["impl"] == "msa"
                     and r["case"] == case and r["flush"] == FLUSH), None)
    rows = []
    for name, impl, backend in (("cuDNN SDPA", "cudnn", SDPBackend.CUDNN_ATTENTION),
                                ("torch flash (FA2)", "torch-flash", SDPBackend.FLASH_ATTENTION)):
        for form, q, kw in (("G as queries", q_rows, {}), ("enable_gqa", q_gqa, {"enable_gqa": True})):
            try:
                with sdpa_kernel(backend):
                    out = F.scaled_dot_product_attention(q, k, v, **kw)
                    err = ((out.float().reshape(ref.shape) - ref).norm() / ref.norm()).item()
                    med, lo, hi = time_us(lambda: F.scaled_dot_product_attention(q, k, v, **kw),
                                          iters=args.iters)
                rows.append((f"{name}, {form}", med, lo, hi, nbytes / (med * 1e-6) / 1e12, err))
            except Exception as e:  # a backend that refuses the shape: say so, keep going
                rows.append((f"{name}, {form}", None, None, None, None, str(e).split("\n")[0][:80]))
                continue
            if args.json:  # the problem of msa's DEC-B32-dense, on contiguous KV
                r = records.new_record(case, "decode", impl)
                r.update(records.shape(B, 1, LK, HQ, HKV, D, 128, 0, "dense", True))
                r.update({"layout": "contiguous", "variant": form})
                records.add_timing(r, (med * 1e-3, lo * 1e-3, hi * 1e-3), args.iters, WARMUP,
                                   4.0 * D * B * HQ * LK, nbytes, "tbps")
                records.add_check(r, "passed" if err <= 1e-2 else "failed", {"out_rel_l2": err})
                records.add_environment(r, FLUSH, ours.get("commit") if ours else None)
                records.append(args.json, r)
    print(f"{case} peers (same run), {nbytes / 1e9:.3f} GB moved by the peers' count, "
          f"L2 flush: {FLUSH}")
    if ours:
        print(f"  {'msa DecodePlan (paged, page 128)':40s} median {ours['median_ms'] * 1e3:9.1f} us  "
              f"{ours['tbps']:6.3f} TB/s")
    for name, med, lo, hi, tbs, err in rows:
        if med is None:
            print(f"  {name:40s} not run: {err}")
        else:
            print(f"  {name:40s} median {med:9.1f} us [{lo:9.1f}, {hi:9.1f}]  {tbs:6.3f} TB/s"
                  f"  rel_l2 {err:.1e}")
    if args.json:
        print(f"peers' records appended to {args.json}")


if __name__ == "__main__":
    main()
