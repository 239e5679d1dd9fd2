#!/usr/bin/env python3
"""ICP-PREFILL-128K and ICP-DECODE-B64 (bench/CASES.md): the sharded indexer + top-K of the ICP
indexer (msa.icp_*) against one GPU's indexer + top-K on the unsharded pool, in the M3 index
geometry (4 index heads on 1 index key head, D 128, FP8 e4m3 with per-token scales, each index
head its own top-16 selection, sink 1, local 1).

    python3 bench/icp_bench.py --case ICP-PREFILL-128K --world 2 --json out.jsonl
        one process per GPU (NCCL, NVLS off), each rank holding only its shard; times the
        one-GPU baseline on rank 0 first, then icp_select on every rank (its lists, the
        exchange, the merge); each call after an L2 flush and a barrier (peers.time_ms).
    python3 bench/icp_bench.py --case ICP-PREFILL-128K --simulate 2
        one GPU: the baseline, each rank's icp_rank_lists in turn and the merge; prints the
        projected time of a TP group (the slowest rank's lists + the merge, no exchange).
    --device cpu --tokens 600: a tiny run on the CPU backend (gloo for --world), which keeps the
        script working without a GPU (python/tests/test_bench_icp.py).

Checks every run: the merged q2k equals the baseline's (the GPU's sharded selection is exact on
its own scores). Records (bench/SCHEMA.md) go to --json: op `icp_baseline` (block_topk with a
list per index head: the fastest one-GPU path), `icp_rank_lists` (the slowest rank), `icp_merge`, `icp_select` (one rank's whole
step in a real group; the slowest rank's figure), with `world` and the speedup over the baseline.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402
import records  # noqa: E402

CASES = {"ICP-PREFILL-128K": dict(batch=1, queries=131072, keys=131072),
         "ICP-DECODE-B64": dict(batch=64, queries=1, keys=131072)}
HI, D, TOPK = 4, 128, 16


def problem(case, tokens, device, layout):
    """The case's index queries and unsharded pool, FP8 with per-token / per-slot scales, the
    same on every rank (a fixed seed)."""
    import msa
    spec = dict(CASES[case])
    if tokens:  # a smaller run of the same kind
        spec["keys"] = tokens
        spec["queries"] = min(spec["queries"], tokens)
    gen = torch.Generator(device=device).manual_seed(1234)
    page = 128 if layout == "p128" else 256
    per = (spec["keys"] + page - 1) // page
    pages = spec["batch"] * per
    q = msa.quantize(torch.randn(spec["batch"] * spec["queries"], HI, D, generator=gen,
                                 device=device), "fp8_per_token")
    k = msa.quantize(torch.randn(pages * page, 1, D, generator=gen, device=device),
                     "fp8_per_token")
    pool = k.values.view(pages, page, 1, D)
    table = torch.arange(pages, dtype=torch.int32, device=device).view(spec["batch"], per)
    used = torch.full((spec["batch"],), spec["keys"], dtype=torch.int32, device=device)
    cu = torch.arange(spec["batch"] + 1, dtype=torch.int32, device=device) * spec["queries"]
    return spec, q, pool, k.scale, table, used, cu


def timed(fn, iters, warmup, device, before=None):
    """Median, min, max ms of fn() over iters calls: peers.time_ms on the GPU (L2 flushed, CUDA
    events), the wall clock on the CPU (a check of the script, not a figure)."""
    if device == "cuda":
        return peers.time_ms(fn, iters, warmup, before)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if before is not None:
            before()
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times), min(times), max(times)


def baseline(q, pool, scale, table, used, cu):
    import msa
    return msa.block_topk(q.values, pool, cu, q_scale=q.scale, k_scale=scale, page_table=table,
                          seqused_k=used, topk=TOPK, num_kv_heads=HI)


def record(args, spec, op, times, extra):
    r = records.new_record(args.case, op, "msa")
    r.update(records.shape(spec["batch"], spec["queries"], spec["keys"], HI, 1, D, 128, TOPK,
                           "idx", True, "fp8_e4m3", "fp8_e4m3"))
    r["dtypes"]["scales"] = "token"
    records.add_timing(r, times, args.iters, args.warmup, 0, 0, "tflops")
    r.update(extra)
    return r


def simulate(args):
    import msa
    dev = args.device
    spec, q, pool, scale, table, used, cu = problem(args.case, args.tokens, dev, args.layout)
    opts = dict(layout=args.layout, seqused_k=used, topk=TOPK)
    base = timed(lambda: baseline(q, pool, scale, table, used, cu), args.iters, args.warmup, dev)
    want = baseline(q, pool, scale, table, used, cu)
    lists, rank_times = [], []
    for rank in range(args.simulate):
        shard, shard_scale = msa.icp_shard(pool, layout=args.layout, world=args.simulate,
                                           rank=rank, k_scale=scale)
        call = lambda: msa.icp_rank_lists(q.values, shard, table, cu, world=args.simulate,  # noqa: E731
                                          rank=rank, num_kv_heads=HI, index_q_scale=q.scale,
                                          shard_scale=shard_scale, **opts)
        rank_times.append(timed(call, args.iters, args.warmup, dev))
        lists.append(call())
        del shard
    ids, scores = torch.stack([x[0] for x in lists]), torch.stack([x[1] for x in lists])
    merge = timed(lambda: msa.icp_merge(ids, scores, table, cu, **opts), args.iters, args.warmup, dev)
    same = torch.equal(msa.icp_merge(ids, scores, table, cu, **opts), want)
    slowest = max(rank_times)
    projected = slowest[0] + merge[0]
    out = [record(args, spec, "icp_baseline", base, {"world": 1}),
           record(args, spec, "icp_rank_lists", slowest, {"world": args.simulate}),
           record(args, spec, "icp_merge", merge,
                  {"world": args.simulate, "speedup": base[0] / projected})]
    for r in out:
        records.add_check(r, "passed" if same else "failed")
    print(f"{args.case} {args.layout} TP{args.simulate} (simulated on one device): baseline "
          f"{base[0]:.3f} ms, slowest rank's lists {slowest[0]:.3f} ms, merge {merge[0]:.3f} ms, "
          f"projected {projected:.3f} ms ({base[0] / projected:.2f}x), q2k "
          f"{'equal' if same else 'DIFFERENT'}")
    return out, same


def _rank(rank, args, port, results):
    import torch.distributed as dist
    import msa
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0")
    gpu = args.device == "cuda"
    if gpu:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if gpu else "gloo", rank=rank, world_size=args.world)
    try:
        dev = f"cuda:{rank}" if gpu else "cpu"
        spec, q, pool, scale, table, used, cu = problem(args.case, args.tokens, dev, args.layout)
        base = None
        if rank == 0:
            base = timed(lambda: baseline(q, pool, scale, table, used, cu), args.iters,
                         args.warmup, args.device)
        want = baseline(q, pool, scale, table, used, cu)
        shard, shard_scale = msa.icp_shard(pool, layout=args.layout, world=args.world, rank=rank,
                                           k_scale=scale)
        del pool
        call = lambda: msa.icp_select(q.values, shard, table, cu, layout=args.layout,  # noqa: E731
                                      seqused_k=used, topk=TOPK, num_kv_heads=HI,
                                      index_q_scale=q.scale, shard_scale=shard_scale)

        times = timed(call, args.iters, args.warmup, args.device, before=dist.barrier)
        owned = msa.icp_owned_heads(HI, args.world, rank)
        same = torch.equal(call(), want[owned.start:owned.stop])
        gathered = [None] * args.world
        dist.all_gather_object(gathered, (times, same))
        if rank == 0:
            slowest = max(t for t, _ in gathered)
            ok = all(s for _, s in gathered)
            out = [record(args, spec, "icp_baseline", base, {"world": 1}),
                   record(args, spec, "icp_select", slowest,
                          {"world": args.world, "speedup": base[0] / slowest[0]})]
            for r in out:
                records.add_check(r, "passed" if ok else "failed")
            results.put((out, ok))
            print(f"{args.case} {args.layout} TP{args.world}: baseline {base[0]:.3f} ms, "
                  f"icp_select {slowest[0]:.3f} ms (slowest rank, with the exchange; "
                  f"{base[0] / slowest[0]:.2f}x), q2k {'equal' if ok else 'DIFFERENT'}")
    finally:
        dist.destroy_process_group()


def distributed(args):
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.spawn(_rank, args=(args, port, results), nprocs=args.world, join=True)
    return results.get()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=sorted(CASES), default="ICP-PREFILL-128K")
    ap.add_argument("--layout", choices=["p128", "p256"], default="p128")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--world", type=int, choices=[2, 4], help="one process per device")
    mode.add_argument("--simulate", type=int, choices=[2, 4], help="ranks in turn on one device")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--tokens", type=int, default=0, help="keys per request (and at most as many "
                    "queries) instead of the case's")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json", help="append the records to this JSON Lines file")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("icp_bench: no CUDA device (use --device cpu for a CPU run)")
    if args.world and args.device == "cuda" and torch.cuda.device_count() < args.world:
        raise SystemExit(f"icp_bench: --world {args.world} needs {args.world} GPUs, "
                         f"{torch.cuda.device_count()} visible")
    out, ok = distributed(args) if args.world else simulate(
        argparse.Namespace(**{**vars(args), "simulate": args.simulate or 2}))
    if args.json:
        with open(args.json, "a") as f:
            for r in out:
                f.write(json.dumps(r) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
