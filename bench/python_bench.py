#!/usr/bin/env python3
"""msa's Python API against its C++ API, in the same run: the sparse prefill cases and the host
cost of a small call.

1. Throughput: reads the selections and records that `bench_sparse_fwd --dump DIR --json FILE`
   wrote (P8K-tok, P32K-tok, P32K-blk by default) and times msa.attention_forward on the same
   shapes and selections, called as the C++ bench calls attention_forward (the k2q index built
   once, default partial precision), with the same L2 flush and CUDA events. Prints both
   figures and their ratio.
2. Host cost: times msa.attention_forward (k2q given) and msa.sparse_attention on a small
   problem, each call alone after the stream went idle (so the figure is the host's time to
   validate and enqueue, never a wait on the GPU), and compares with the same calls through the
   C++ API that `bench_latency --json FILE` timed the same way.

    python bench/python_bench.py --dump DIR --cpp records.jsonl [--latency-cpp lat.jsonl]
"""
import argparse
import os
import statistics
import sys
import time

import torch

import msa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import records  # noqa: E402
from peers import FLUSH, load_selection, time_ms  # noqa: E402


def host_us(fn, calls, warmup=50):
    """(median, min, max) host microseconds of one call, each started on an idle stream."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times), min(times), max(times)


def throughput(args, cpp):
    rows = []
    for name in args.cases:
        mine = [r for r in cpp if r["case"] == name and r["impl"] == "msa" and
                r["op"] == "attention_forward"]
        if not mine:
            print(f"{name}: no bench_sparse_fwd record in {args.cpp}; skipped")
            continue
        ref = mine[-1]
        q2k = load_selection(args.dump, ref).cuda()
        s, hq, hkv, d = ref["seq_q"], ref["hq"], ref["hkv"], ref["d"]
        gen = torch.Generator(device="cuda").manual_seed(7)
        q = torch.randn(s, hq, d, generator=gen, device="cuda").to(torch.bfloat16)
        k = torch.randn(s, hkv, d, generator=gen, device="cuda").to(torch.bfloat16)
        v = torch.randn(s, hkv, d, generator=gen, device="cuda").to(torch.bfloat16)
        cu = torch.tensor([0, s], dtype=torch.int32, device="cuda")
        k2q = msa.build_k2q_csr(q2k, cu, cu_seqlens_k=cu, k=k)

        def call():
            msa.attention_forward(q, k, v, cu, cu_seqlens_k=cu, q2k=q2k, k2q=k2q)

        times = time_ms(call, args.iters, args.warmup)
        msa.check_status()
        rec = records.new_record(name, "attention_forward", "msa-python")
        rec.update(records.shape_of(ref))
        records.add_timing(rec, times, args.iters, args.warmup, ref.get("flop"), ref.get("bytes"),
                           "tflops")
        rec["vs_cpp"] = times[0] / ref["median_ms"]
        rows.append(records.add_environment(rec, FLUSH, ref.get("commit")))
        print(f"{name}: python {times[0]:.3f} ms ({rec['tflops']:.1f} TFLOP/s), C++ "
              f"{ref['median_ms']:.3f} ms ({ref['tflops']:.1f}): python / C++ = "
              f"{rec['vs_cpp']:.3f}")
    return rows


def latency(args, cpp_lat):
    """Host microseconds per call of the small problem bench_latency times."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    s, hq, hkv, d, topk = args.lat_seq, args.lat_hq, args.lat_hkv, 128, args.lat_topk
    q = torch.randn(s, hq, d, generator=gen, device="cuda").to(torch.bfloat16)
    k = torch.randn(s, hkv, d, generator=gen, device="cuda").to(torch.bfloat16)
    v = torch.randn(s, hkv, d, generator=gen, device="cuda").to(torch.bfloat16)
    cu = torch.tensor([0, s], dtype=torch.int32, device="cuda")
    q2k = msa.block_topk(q, k, cu, cu_seqlens_k=cu, topk=topk)
    k2q = msa.build_k2q_csr(q2k, cu, cu_seqlens_k=cu, k=k)
    calls = {
        "attention_forward": lambda: msa.attention_forward(q, k, v, cu, cu_seqlens_k=cu, q2k=q2k,
                                                           k2q=k2q),
        "pipeline": lambda: msa.sparse_attention(q, k, v, cu, cu_seqlens_k=cu, topk=topk),
    }
    rows = []
    # On a non-blocking stream, as bench_latency calls the C++ API: torch's default stream is the
    # legacy one, whose every launch the driver orders against the device's other blocking
    # streams, which costs host time the C++ figure does not pay.
    side = torch.cuda.Stream()
    torch.cuda.current_stream().synchronize()
    for op, fn in calls.items():
        with torch.cuda.stream(side):
            med, lo, hi = host_us(fn, args.lat_calls)
        msa.check_status()
        rec = records.new_record("LAT-PY", op, "msa-python")
        rec.update(records.shape(1, s, s, hq, hkv, d, 128, topk, "idx", True))
        rec.update(host_us_median=med, host_us_min=lo, host_us_max=hi, calls=args.lat_calls)
        want = [r for r in cpp_lat if r["op"] == op and r.get("seq_q") == s]
        line = (f"host time per call, {op} (S={s}, Hq={hq}, Hkv={hkv}), non-blocking stream: "
                f"python {med:.1f} us")
        if want:
            c = want[-1]["host_us_median"]
            rec["cpp_host_us"] = c
            line += f", C++ {c:.1f} us: python adds {med - c:.1f} us"
        print(line)
        rows.append(records.add_environment(rec, "none"))
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dump", help="bench_sparse_fwd --dump folder (selections)")
    p.add_argument("--cpp", help="bench_sparse_fwd --json records of the same run")
    p.add_argument("--cases", nargs="+", default=["P8K-tok", "P32K-tok", "P32K-blk"])
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--latency-cpp", help="bench_latency --json records of the same run")
    p.add_argument("--lat-seq", type=int, default=256)
    p.add_argument("--lat-hq", type=int, default=8)
    p.add_argument("--lat-hkv", type=int, default=2)
    p.add_argument("--lat-topk", type=int, default=2)
    p.add_argument("--lat-calls", type=int, default=1000)
    p.add_argument("--json", help="append this run's records (JSON Lines)")
    args = p.parse_args()
    rows = []
    if args.dump and args.cpp:
        rows += throughput(args, records.read(args.cpp))
    rows += latency(args, records.read(args.latency_cpp) if args.latency_cpp else [])
    for r in rows if args.json else []:
        records.append(args.json, r)


if __name__ == "__main__":
    main()
