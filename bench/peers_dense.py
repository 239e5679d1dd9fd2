#!/usr/bin/env python3
"""Peer figures for the dense prefill cases (DENSE-8K, DENSE-32K, DENSE-VARLEN, DENSE-16K-D64 and
-D256, DENSE-CHUNK), in the same run as bench_sparse_fwd.

Reads our records (`bench_sparse_fwd --json FILE`, bench/SCHEMA.md; the shapes come from them) and
times the same dense causal attention with:
  - FA4 (the CuTe FlashAttention, `flash_attn.cute`: `flash_attn_func` on [1, S, H, D], and
    `flash_attn_varlen_func` for the varlen case), when importable (../shared/PEERS.md says how to
    carry it to the GPU machine);
  - cuDNN SDPA through torch ([1, H, S, D], kv heads repeated to Hq; one request at a time for the
    varlen case, the requests' times summed).
FLOP = 4 D per visible (query head, key) pair, as our records count them. Prints ours against
the peers and appends a record per peer with --json.
"""
import argparse

import torch
import torch.nn.functional as F

import records  # same folder: the script's directory is on sys.path
from peers import FLUSH, time_ms

CASES = ("DENSE-8K", "DENSE-32K", "DENSE-VARLEN", "DENSE-16K-D64", "DENSE-16K-D256", "DENSE-CHUNK")


def fa4():
    """FA4's dense entry points, or None when it is not installed."""
    try:
        from flash_attn.cute import flash_attn_func, flash_attn_varlen_func
        return flash_attn_func, flash_attn_varlen_func
    except ImportError:
        return None


def run_fa4(rec, entry, iters, warmup):
    dense, varlen = entry
    lens = rec.get("seqlens_q") or [rec["seq_q"]]
    hq, hkv, d, total = rec["hq"], rec["hkv"], rec["d"], sum(lens)
    q = torch.randn(total, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(total, hkv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(total, hkv, d, device="cuda", dtype=torch.bfloat16)
    if len(lens) == 1:
        fn = lambda: dense(q[None], k[None], v[None], causal=True)
    else:
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
        fn = lambda: varlen(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lens),
                            max_seqlen_k=max(lens), causal=True)
    return time_ms(fn, iters, warmup)


def paged_runs(rec, iters, warmup):
    """A paged case (DENSE-CHUNK): B requests of seq_q new queries over seq_k keys in a pool of
    page_size-slot pages with a shuffled table, timed as python_bench's latency peers time them:
    FA4 with the page table, cuDNN SDPA over the requests' keys gathered once (untimed) with the
    bottom-right causal mask. {impl: (median, min, max)}."""
    from python_bench import dense_peers  # imports msa: only paged cases need it

    b, lq, lk, hq, hkv, d = rec["batch"], rec["seq_q"], rec["seq_k"], rec["hq"], rec["hkv"], rec["d"]
    page, per = rec["page_size"], -(-rec["seq_k"] // rec["page_size"])
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = dict(b=b, lq=lq, lk=lk, hq=hq, hkv=hkv, d=d, page=page,
             q=torch.randn(b * lq, hq, d, generator=gen, device="cuda").to(torch.bfloat16),
             cu_q=torch.arange(0, b + 1, dtype=torch.int32, device="cuda") * lq,
             k=torch.randn(b * per, page, hkv, d, generator=gen, device="cuda").to(torch.bfloat16),
             v=torch.randn(b * per, page, hkv, d, generator=gen, device="cuda").to(torch.bfloat16),
             table=torch.randperm(b * per, generator=torch.Generator().manual_seed(1)).to(
                 torch.int32).view(b, per).to("cuda"),
             used=torch.full((b,), lk, dtype=torch.int32, device="cuda"))
    return {impl: time_ms(fn, iters, warmup) for impl, fn in dense_peers(x).items()}


def run_cudnn(rec, iters, warmup):
    from torch.nn.attention import sdpa_kernel, SDPBackend

    lens = rec.get("seqlens_q") or [rec["seq_q"]]
    hq, hkv, d = rec["hq"], rec["hkv"], rec["d"]
    tensors = []
    for s in lens:
        q = torch.randn(1, hq, s, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, hkv, s, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(1, hkv, s, d, device="cuda", dtype=torch.bfloat16)
        tensors.append((q, k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)))

    def fn():
        for q, k, v in tensors:
            F.scaled_dot_product_attention(q, k, v, is_causal=True)

    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return time_ms(fn, iters, warmup)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", required=True, help="bench_sparse_fwd --json records")
    ap.add_argument("--json", help="append the peers' records to this file (bench/SCHEMA.md)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    ours = {r["case"]: r for r in records.read(args.ours)
            if r["impl"] == "msa" and r["case"] in CASES and r["flush"] == FLUSH}
    entry = fa4()
    if entry is None:
        print("FA4 (flash_attn.cute) is not importable here: its column stays empty")
    print("L2 flush before each timed run: %s (MSA_BENCH_FLUSH)" % FLUSH)
    print("%-13s %20s %20s %20s %9s %9s" % ("case", "ours ms / TF/s", "FA4 ms / TF/s",
                                           "cuDNN ms / TF/s", "vs FA4", "vs cuDNN"))
    for name in CASES:
        if name not in ours:
            continue
        rec = ours[name]
        res = {}
        runs = (("fa4", (lambda: run_fa4(rec, entry, args.iters, args.warmup)) if entry else None),
                ("cudnn", lambda: run_cudnn(rec, args.iters, args.warmup)))
        if rec.get("page_size"):
            try:
                paged = paged_runs(rec, args.iters, args.warmup)
            except Exception as e:  # report, keep going
                print("%s paged peers error: %s" % (name, str(e)[:200]))
                paged = {}
            runs = tuple((impl, (lambda t=t: t)) for impl, t in paged.items())
        for impl, run in runs:
            if run is None:
                continue
            try:
                t = run()
            except Exception as e:  # report, keep going
                print("%s %s error: %s" % (name, impl, str(e)[:200]))
                continue
            res[impl] = t
            if args.json:
                r = records.new_record(name, "attention_forward", impl)
                r.update(records.shape_of(rec))
                records.add_timing(r, t, args.iters, args.warmup, rec["flop"], rec["bytes"], "tflops")
                records.add_check(r, "skipped")
                records.add_environment(r, FLUSH, rec.get("commit"))
                records.append(args.json, r)
            torch.cuda.empty_cache()

        def fmt(t):
            return "%.3f / %.1f" % (t[0], rec["flop"] / (t[0] * 1e-3) / 1e12) if t else "-"

        def ratio(impl):
            return "%.3fx" % (res[impl][0] / rec["median_ms"]) if impl in res else "-"

        print("%-13s %20s %20s %20s %9s %9s" % (name, "%.3f / %.1f" % (rec["median_ms"], rec["tflops"]),
                                               fmt(res.get("fa4")), fmt(res.get("cudnn")),
                                               ratio("fa4"), ratio("cudnn")))
    print("vs X: X's time over ours (> 1: msa is faster).")


if __name__ == "__main__":
    main()
