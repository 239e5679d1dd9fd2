"""Compares two benchmark runs of the same cases (bench/SCHEMA.md records), typically an old and a
new binary run back to back on one GPU: per (case, op, impl), the median times and the new/old
ratio, flagging rows past a tolerance. Exit status 0 either way: the table is the result.
    python3 bench/compare.py OLD.jsonl NEW.jsonl [--tol 0.02]
"""
import argparse

import records


def key(r):
    return (r["case"], r["op"], r["impl"])


def by_key(path):
    out = {}
    for r in records.read(path):
        if r.get("median_ms"):
            out[key(r)] = r  # a rerun of a case replaces the earlier record
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--tol", type=float, default=0.02, help="flag |new/old - 1| above this")
    a = ap.parse_args()
    old, new = by_key(a.old), by_key(a.new)
    print(f"| case | op | old ms | new ms | new/old | |\n| --- | --- | --- | --- | --- | --- |")
    flagged = 0
    for k in sorted(set(old) | set(new)):
        o, n = old.get(k), new.get(k)
        if o is None or n is None:
            print(f"| {k[0]} | {k[1]} | {o and o['median_ms']} | {n and n['median_ms']} | - | only one run |")
            continue
        ratio = n["median_ms"] / o["median_ms"]
        flag = "**past tolerance**" if abs(ratio - 1) > a.tol else ""
        flagged += bool(flag)
        print(f"| {k[0]} | {k[1]} | {o['median_ms']:.4g} | {n['median_ms']:.4g} | {ratio:.3f} | {flag} |")
    print(f"{len(set(old) & set(new))} cases in both runs, {flagged} past {a.tol:.0%}")


if __name__ == "__main__":
    main()
