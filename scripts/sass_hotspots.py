#!/usr/bin/env python3
"""Summarizes an ncu SASS source export (scripts/ncu_source.sh): stall reasons over the kernel,
the instructions with the most warp samples, and the samples of the hottest address range.
  scripts/sass_hotspots.py NAME_sass.csv [--top 40] [--range START END] [--dump]"""
import argparse, csv, collections

ap = argparse.ArgumentParser()
ap.add_argument("csv")
ap.add_argument("--top", type=int, default=40)
ap.add_argument("--dump", action="store_true", help="print every instruction with its samples")
ap.add_argument("--range", nargs=2, type=int, help="instruction indices [START, END) to total")
a = ap.parse_args()
rows = list(csv.reader(open(a.csv)))
hdr = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
cols, body = rows[hdr], [r for r in rows[hdr + 1:] if len(r) == len(rows[hdr])]
ix = {c: i for i, c in enumerate(cols)}
stall = [c for c in cols if c.startswith("stall_") and "Not Issued" not in c]
num = lambda r, c: float(r[ix[c]] or 0) if r[ix[c]] not in ("-", "") else 0.0
tot = collections.Counter()
for r in body:
    for c in stall: tot[c] += num(r, c)
samples = sum(num(r, "Warp Stall Sampling (All Samples)") for r in body)
print(f"{len(body)} instructions, {samples:.0f} samples")
for c, v in tot.most_common(12): print(f"  {c:24s} {100 * v / max(samples, 1):5.1f}%")
lo, hi = a.range if a.range else (0, len(body))
if a.dump:
    for i, r in enumerate(body[lo:hi], lo):
        s = num(r, "Warp Stall Sampling (All Samples)")
        top = max(stall, key=lambda c: num(r, c))
        print(f"{i:5d} {s:7.0f} {num(r, 'Instructions Executed'):10.0f} {top[6:] if s else '':14s} {r[ix['Source']].strip()}")
else:
    order = sorted(range(lo, hi), key=lambda i: -num(body[i], "Warp Stall Sampling (All Samples)"))
    for i in order[:a.top]:
        r = body[i]
        s = num(r, "Warp Stall Sampling (All Samples)")
        top = max(stall, key=lambda c: num(r, c))
        print(f"{i:5d} {100 * s / samples:5.2f}% {num(r, 'Instructions Executed'):10.0f} {top[6:]:14s} {r[ix['Source']].strip()}")
