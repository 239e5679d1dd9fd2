#!/usr/bin/env python3
"""Draws benchmark records (bench/SCHEMA.md) as PNG figures.

    python bench/plot.py records.jsonl... --out DIR [--bf16-tflops 716] [--fp8-tflops 1238]
                                                    [--copy-tbps 4.27]

Writes into DIR:
  throughput_<family>_<metric>.png  the headline rate (effective TFLOP/s, or TB/s for the ops
      that move data) against the sequence length, one line per implementation (msa and each
      peer), one figure per op family: sparse attention per selection pattern (tok, blk, idx),
      dense attention (the peers), the indexer, the pipeline, the CSR build, the decode;
  roofline_<case>.png  every GPU record of a case with a FLOP and a byte count at (FLOP/byte,
      TFLOP/s), under the H200's measured ceilings (the options; defaults: bf16 matmul 716 and
      fp8 matmul 1238 TFLOP/s, device copy 4.27 TB/s).
Records of every program (the benchmark programs, `msa bench --json`, the peers' scripts) work.
"""
import argparse
import os
import re
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import records  # noqa: E402  (this folder's shared record module)

# One colour per implementation, so that msa and a peer look the same in every figure.
IMPL_COLORS = {"msa": "#1f77b4", "cudnn": "#2ca02c", "flex-triton": "#ff7f0e", "fa4": "#d62728",
               "torch-flash": "#9467bd", "flex-fa4": "#8c564b"}
OTHER_COLORS = ["#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X"]
METRIC_LABEL = {"tflops": "TFLOP/s", "tbps": "TB/s"}


def family(r):
    """(file key, title) of the figure a record belongs to."""
    op, pattern = r["op"], r.get("pattern")
    if op == "attention_forward" and pattern == "dense":
        return "dense", "Dense causal attention (each implementation's own FLOP count: 4·D·visible pairs)"
    if op == "attention_forward":
        return f"sparse-{pattern}", (f"Sparse attention forward, {pattern} selection "
                                     "(effective: FLOP = 4·D·attended pairs)")
    if op in ("block_scores", "block_topk", "select_topk"):
        return "indexer", "Indexer: block scores, top-K, fused (FLOP = 2·D·Hq·visible pairs)"
    if op == "pipeline":
        return "pipeline", "Indexer + top-K + CSR + sparse attention in one call (FLOP: the indexer's + the attention's)"
    if op == "build_k2q_csr":
        return "csr", "k2q CSR build (bytes that must move)"
    if op == "decode":
        return "decode", "Decode (bytes that must move: selected K/V once per kv head, q, out, indices)"
    return op, op


# Fields that, when they differ between records of one figure, must tell its lines apart.
VARYING = ("batch", "varlen", "hq", "hkv", "d", "blk", "topk", "causal", "page_size", "layout", "partial",
           "kv", "flush", "device")


def field(r, name):
    if name == "varlen":
        return "seqlens_k" in r
    if name == "kv":
        dtypes = r.get("dtypes") or {}
        return (dtypes.get("kv"), dtypes.get("scales"))
    return r.get(name)


def varying(groups):
    """The VARYING fields that differ between records of one implementation within one of
    `groups` (lists of records): the implementation's name already tells the others apart."""
    found = set()
    for group in groups:
        by_impl = defaultdict(list)
        for r in group:
            by_impl[r["impl"]].append(r)
        for recs in by_impl.values():
            found |= {n for n in VARYING
                      if len({repr(field(r, n)) for r in recs if field(r, n) is not None}) > 1}
    return [n for n in VARYING if n in found]


def series_label(r, ops, vary):
    """The legend entry: the implementation, then what tells its records apart from the others
    drawn with it (the op, the variant, and every field in `vary`)."""
    parts = [r["impl"]]
    if r.get("variant"):
        parts.append(r["variant"])
    if r["op"] == "attention_forward" and r.get("pattern") == "dense":
        parts.append("dense causal")
    if len(ops) > 1:
        parts.append(r["op"])
    for name in vary:
        value = field(r, name)
        if value is None:  # does not apply to this record (a stage without partials)
            continue
        if name == "kv":
            kv, scales = value
            parts.append(f"kv {kv}" + (f" ({scales} scales)" if scales else ""))
        elif name == "varlen":
            parts += ["varlen batch"] if value else []
        elif name == "flush":
            parts.append(f"{value} flush")
        elif name == "device":
            parts.append("(CPU reference)" if value == "cpu" else "(GPU)")
        elif name == "batch":
            parts += [f"B={value}"] if value != 1 else []
        else:
            parts.append(f"{name}={value}")
    return " ".join(parts)


def seq_label(n):
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def provenance(recs):
    """One line under a title: GPUs, commits, L2 flush and dates of the records drawn."""
    gpus = sorted({r.get("gpu") or "CPU" for r in recs})
    commits = sorted({(r.get("commit") or "unknown")[:12] for r in recs})
    flushes = sorted({r.get("flush", "?") for r in recs})
    dates = sorted(r.get("date", "")[:10] for r in recs if r.get("date"))
    when = dates[0] if dates and dates[0] == dates[-1] else f"{dates[0]} .. {dates[-1]}" if dates else "?"
    return f"{', '.join(gpus)}; commit {', '.join(commits)}; L2 flush {', '.join(flushes)}; {when}"


def file_key(text):
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")


def style_for(labels, impl_of):
    """Colour by implementation, marker by the line's place among that implementation's lines."""
    styles, seen, spare = {}, defaultdict(int), iter(OTHER_COLORS * 4)
    colors = dict(IMPL_COLORS)
    for label in labels:
        impl = impl_of[label]
        if impl not in colors:
            colors[impl] = next(spare)
        styles[label] = (colors[impl], MARKERS[seen[impl] % len(MARKERS)])
        seen[impl] += 1
    return styles


def msa_first(impl_of):
    return lambda label: (impl_of[label] != "msa", label)


def set_value_axis(ax, values, unit, effective):
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) > 20:
        ax.set_yscale("log")  # peers can sit 50x apart: a linear axis would flatten the slow ones
        ax.set_ylim(min(positive) / 2, max(positive) * 3)
    else:
        ax.set_ylim(0, max(values, default=1) * 1.22)
    ax.set_ylabel(("effective " if effective else "") + unit)


def save(fig, ax, title, group, path):
    ax.set_title(title, fontsize=11)
    fig.text(0.5, 0.005, provenance(group), ha="center", fontsize=7, color="#555555")
    ax.grid(True, which="major", axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    fig.savefig(path, dpi=120)


def draw_lines(ax, group, metric):
    """One line per series across sequence lengths (the cases of a family that differ only there)."""
    ops, vary = {r["op"] for r in group}, varying([group])
    lines, impl_of = defaultdict(lambda: defaultdict(list)), {}
    for r in group:
        label = series_label(r, ops, vary)
        lines[label][r["seq_k"]].append(r[metric])
        impl_of[label] = r["impl"]
    styles = style_for(sorted(lines), impl_of)
    values = []
    for label in sorted(lines, key=msa_first(impl_of)):
        xs = sorted(lines[label])
        ys = [statistics.median(lines[label][x]) for x in xs]  # repeated runs: their median
        values += ys
        color, marker = styles[label]
        ax.plot(xs, ys, marker=marker, color=color, label=label, linewidth=1.8, markersize=7)
        for x, y in zip(xs, ys):
            ax.annotate(f"{y:.3g}", (x, y), textcoords="offset points", xytext=(0, 7), ha="center",
                        fontsize=8, color=color)
    seqs = sorted({r["seq_k"] for r in group})
    ax.set_xscale("log", base=2)
    ax.set_xticks(seqs)
    ax.set_xticklabels([seq_label(s) for s in seqs])
    ax.minorticks_off()
    ax.set_xlim(seqs[0] / 1.5, seqs[-1] * 1.5)
    ax.set_xlabel("keys per request (sequence length)")
    ax.grid(True, which="major", axis="x", alpha=0.3)
    return values


def case_label(r):
    lengths = f"S={seq_label(r['seq_k'])}" if r["seq_q"] == r["seq_k"] else \
        f"{r['seq_q']} q x {seq_label(r['seq_k'])} keys"
    if "seqlens_k" in r:  # the longest request's
        lengths = f"S<={seq_label(r['seq_k'])}" if r["seq_q"] == r["seq_k"] else \
            f"{r['seq_q']} q x <={seq_label(r['seq_k'])} keys"
    return f"{r['case']}\nB={r['batch']} {lengths}"


def draw_bars(ax, group, metric):
    """Cases side by side, a bar per series: for families whose cases differ in more than their
    length (decode batches) or that were run at one length only."""
    cases = sorted({r["case"] for r in group},
                   key=lambda c: min((r["seq_k"], r["batch"]) for r in group if r["case"] == c))
    vary = varying([[r for r in group if r["case"] == c] for c in cases])
    ops = {r["op"] for r in group}
    bars, impl_of, label_of_case = defaultdict(lambda: defaultdict(list)), {}, {}
    for r in group:
        label = series_label(r, ops, vary)
        bars[label][r["case"]].append(r[metric])
        impl_of[label] = r["impl"]
        label_of_case.setdefault(r["case"], case_label(r))
    labels = sorted(bars, key=msa_first(impl_of))
    styles = style_for(labels, impl_of)
    width = min(0.8 / len(labels), 0.3)
    values = []
    for i, label in enumerate(labels):
        color, _ = styles[label]
        xs = [j + (i - (len(labels) - 1) / 2) * width for j, c in enumerate(cases) if c in bars[label]]
        ys = [statistics.median(bars[label][c]) for c in cases if c in bars[label]]
        values += ys
        hatch = None if impl_of[label] == "msa" or i % 2 == 0 else "//"
        ax.bar(xs, ys, width=width * 0.92, color=color, alpha=0.85 - 0.12 * (i % 3), hatch=hatch, label=label)
        for x, y in zip(xs, ys):
            ax.annotate(f"{y:.3g}", (x, y), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7,
                        color=color)
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels([label_of_case[c] for c in cases], fontsize=8)
    ax.set_xlim(-0.6, len(cases) - 0.4)
    return values


def plot_throughput(plt, recs, out):
    """Figure (a): the headline rate against the sequence length, one figure per family and rate."""
    groups = defaultdict(list)
    for r in recs:
        metric = r.get("metric")
        if metric in METRIC_LABEL and r.get(metric) is not None:
            groups[(family(r), metric)].append(r)
    written = []
    for ((key, title), metric), group in sorted(groups.items()):
        fig, ax = plt.subplots(figsize=(10, 5.8))
        one_length = len({r["seq_k"] for r in group}) == 1
        values = (draw_bars if key == "decode" or one_length else draw_lines)(ax, group, metric)
        set_value_axis(ax, values, METRIC_LABEL[metric], key.startswith("sparse"))
        path = os.path.join(out, f"throughput_{file_key(key)}_{metric}.png")
        save(fig, ax, title, group, path)
        plt.close(fig)
        written.append(path)
    return written


def shape_text(r):
    text = f"B={r['batch']} S={seq_label(r['seq_k'])} Hq={r['hq']} Hkv={r['hkv']} D={r['d']}"
    if r.get("pattern") not in (None, "dense"):
        text += f" topK={r['topk']} {r['pattern']}"
    return text


def plot_rooflines(plt, recs, out, ceilings):
    """Figure (b): one roofline per case, every GPU record with a FLOP and a byte count."""
    bf16, fp8, bw = ceilings
    by_case = defaultdict(list)
    skipped = set()
    for r in recs:
        if r.get("device") == "gpu" and r.get("flop") and r.get("bytes") and r.get("median_ms"):
            by_case[r["case"]].append(r)
        else:
            skipped.add(r["case"])
    written = []
    for case, group in sorted(by_case.items()):
        ops, vary = {r["op"] for r in group}, varying([group])
        points = defaultdict(list)  # label -> (intensity, TFLOP/s, % of the roof there)
        impl_of = {}
        for r in group:
            label = series_label(r, ops, vary)
            x = r["flop"] / r["bytes"]
            y = r["flop"] / (r["median_ms"] * 1e-3) / 1e12
            peak = fp8 if (r.get("dtypes") or {}).get("q", "").startswith("fp8") else bf16
            points[label].append((x, y, 100 * y / min(bw * x, peak)))
            impl_of[label] = r["impl"]
        styles = style_for(sorted(points), impl_of)
        xs = [p[0] for ps in points.values() for p in ps]
        lo = min(min(xs), bf16 / bw) / 8
        hi = max(max(xs), fp8 / bw) * 8
        grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
        fig, ax = plt.subplots(figsize=(10, 5.8))
        ax.plot(grid, [min(bw * x, fp8) for x in grid], color="#444444", linestyle="--", linewidth=1.2,
                label=f"fp8 matmul {fp8:g} TFLOP/s")
        ax.plot(grid, [min(bw * x, bf16) for x in grid], color="#000000", linewidth=1.5,
                label=f"bf16 matmul {bf16:g} TFLOP/s, device copy {bw:g} TB/s")
        for label in sorted(points, key=msa_first(impl_of)):
            color, marker = styles[label]
            pts = points[label]
            legend = label if len(pts) > 1 else f"{label}: {pts[0][1]:.3g} TFLOP/s, {pts[0][2]:.0f}% of roof"
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], color=color, marker=marker, s=60, zorder=3,
                       label=legend)
            for x, y, pct in pts:
                ax.annotate(f"{y:.3g} ({pct:.0f}%)", (x, y), textcoords="offset points", xytext=(7, -11),
                            fontsize=8, color=color)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ys = [p[1] for ps in points.values() for p in ps]
        ax.set_ylim(min(min(ys), bw * lo) / 2, fp8 * 4)
        ax.set_xlabel("arithmetic intensity (FLOP / byte that must move)")
        ax.set_ylabel("TFLOP/s")
        ax.grid(True, which="major", axis="x", alpha=0.3)
        path = os.path.join(out, f"roofline_{file_key(case)}.png")
        save(fig, ax, f"Roofline: {case} ({shape_text(group[0])})", group, path)
        plt.close(fig)
        written.append(path)
    for case in sorted(skipped - set(by_case)):
        print(f"roofline: {case} skipped (no GPU record with both a FLOP and a byte count)")
    return written


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", nargs="+", help="JSON Lines files of records (bench/SCHEMA.md)")
    ap.add_argument("--out", required=True, help="folder for the PNGs (created if missing)")
    ap.add_argument("--bf16-tflops", type=float, default=716.0, help="bf16 matmul ceiling (H200 measured)")
    ap.add_argument("--fp8-tflops", type=float, default=1238.0, help="fp8 matmul ceiling (H200 measured)")
    ap.add_argument("--copy-tbps", type=float, default=4.27, help="memory bandwidth ceiling, TB/s "
                    "(H200 device-to-device copy)")
    args = ap.parse_args(argv)
    if min(args.bf16_tflops, args.fp8_tflops, args.copy_tbps) <= 0:
        ap.error("the ceilings must be positive")
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("bench/plot.py needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = []
    for path in args.records:
        try:
            recs += records.read(path)
        except (OSError, ValueError) as e:
            raise SystemExit(f"bench/plot.py: {e}") from None
    timed = [r for r in recs if r.get("median_ms")]
    if not timed:
        raise SystemExit("bench/plot.py: no timed records in " + ", ".join(args.records))
    os.makedirs(args.out, exist_ok=True)
    written = plot_throughput(plt, timed, args.out)
    written += plot_rooflines(plt, timed, args.out, (args.bf16_tflops, args.fp8_tflops, args.copy_tbps))
    for path in written:
        print(path)


if __name__ == "__main__":
    main()
