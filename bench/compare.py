"""Compares two benchmark runs of the same cases (bench/SCHEMA.md records), typically an old and a
new binary run back to back on one GPU: per (case, op, impl), the median time (the mean over the
file's repeats of a case) and the new/old ratio, flagging rows past a tolerance. Exit status 0 either way: the table is the result.
    python3 bench/compare.py OLD.jsonl NEW.jsonl [--tol 0.02]
"""
import argparse

import records


# The figures compared, per record kind: timed ops (median_ms), and the latency records of
# bench_latency (host time of one call and GPU time per call, in microseconds).
FIGURES = (("median_ms", "ms"), ("host_us_median", "host us"), ("gpu_us", "gpu us"))


def by_key(path):
    """{(case, op, impl, unit): value} of every figure in the file; repeated runs of a case give
    the mean of their figures."""
    runs = {}
    for r in records.read(path):
        for field, unit in FIGURES:
            if r.get(field):
                runs.setdefault((r["case"], r["op"], r["impl"], unit), []).append(r[field])
    return {k: sum(v) / len(v) for k, v in runs.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--tol", type=float, default=0.02, help="flag |new/old - 1| above this")
    a = ap.parse_args()
    old, new = by_key(a.old), by_key(a.new)
    print("| case | op | unit | old | new | new/old | |\n| --- | --- | --- | --- | --- | --- | --- |")
    flagged = 0
    for k in sorted(set(old) | set(new)):
        o, n = old.get(k), new.get(k)
        if o is None or n is None:
            print(f"| {k[0]} | {k[1]} | {k[3]} | {o} | {n} | - | only one run |")
            continue
        ratio = n / o
        flag = "**past tolerance**" if abs(ratio - 1) > a.tol else ""
        flagged += bool(flag)
        print(f"| {k[0]} | {k[1]} | {k[3]} | {o:.4g} | {n:.4g} | {ratio:.3f} | {flag} |")
    print(f"{len(set(old) & set(new))} cases in both runs, {flagged} past {a.tol:.0%}")


if __name__ == "__main__":
    main()
