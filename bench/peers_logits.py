#!/usr/bin/env python3
"""Peers of the MQA logits benchmark, in the same run as bench_logits (bench/CASES.md, MQAL-*).

The same math in torch on the same shapes and the same random distribution: FP8 products by
torch._scaled_mm (e4m3 in, f32 out), then relu, the head weights and the sum over heads, times
the key scales:
  - MQAL-PAGED-B64: per request its pool blocks gathered into [32768, 128] (index_select), one
    _scaled_mm of the request's next_n x H query rows against them;
  - MQAL-PREFILL-32K: chunks of 256 query rows against all keys (the causal half computed and
    masked, as a dense torch implementation does), --seq to shrink it;
  - TOPK2048-B64, TOPK2048-32K: torch.topk(k=2048) over the rows of those logits (the prefill's
    full [T, S] rows, -inf past the diagonal; torch picks -inf for rows shorter than 2048 and
    orders its output by value, so only the time compares).
With --ours FILE (bench_logits --json records) our lines print beside the peers; with --json
FILE each peer's measurement is appended as a record (bench/SCHEMA.md).
"""
import argparse

import torch

import records  # same folder: the script's directory is on sys.path
from peers import FLUSH, time_ms

WARMUP = 2
H, D = 64, 128


def e4m3(*shape):
    return torch.randn(*shape, device="cuda").to(torch.float8_e4m3fn)


def paged_peer(iters):
    B, NEXT_N, LEN, BS = 64, 2, 32768, 64
    per = LEN // BS
    blocks = B * per
    pool_vals = e4m3(blocks, BS, D)
    pool_scales = torch.rand(blocks, BS, device="cuda") + 0.5
    tables = torch.randperm(blocks, device="cuda").view(B, per)
    q = e4m3(B, NEXT_N * H, D)
    w = torch.rand(B, NEXT_N, H, 1, device="cuda") * 2 - 1
    one = torch.ones((), device="cuda")

    def run():
        out = []
        for b in range(B):
            k = pool_vals.index_select(0, tables[b]).view(LEN, D)
            s = torch._scaled_mm(q[b], k.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
            sc = pool_scales.index_select(0, tables[b]).view(LEN)
            out.append((s.view(NEXT_N, H, LEN).relu() * w[b]).sum(1) * sc)
        return out

    med, lo, hi = time_ms(run, iters, WARMUP)
    logits = torch.cat(run())  # [B * next_n, LEN], the rows the top-K peer reads
    return (med, lo, hi, B * LEN * (D + 4), 2.0 * H * D * B * NEXT_N * LEN), logits


def prefill_peer(iters, seq):
    T = S = seq
    CH = 256
    q = e4m3(T, H, D)
    k = e4m3(S, D)
    ks = torch.rand(S, device="cuda") + 0.5
    w = torch.rand(T, H, 1, device="cuda") * 2 - 1
    one = torch.ones((), device="cuda")
    cols = torch.arange(S, device="cuda")
    out = torch.empty(T, S, device="cuda")

    def run():
        for t0 in range(0, T, CH):
            s = torch._scaled_mm(q[t0:t0 + CH].reshape(-1, D), k.t(), scale_a=one, scale_b=one,
                                 out_dtype=torch.float32)
            x = (s.view(-1, H, S).relu() * w[t0:t0 + CH]).sum(1) * ks
            rows = torch.arange(t0, t0 + x.shape[0], device="cuda")[:, None]
            out[t0:t0 + CH] = x.masked_fill(cols[None, :] > rows, float("-inf"))

    med, lo, hi = time_ms(run, iters, WARMUP)
    return (med, lo, hi, S * (D + 4), 2.0 * H * D * T * (T + 1) / 2), out


def topk_peer(iters, logits, visible):
    """torch.topk(k=2048) over the rows of `logits`; bytes as bench_logits counts them (the
    `visible` logits read and the ids written)."""
    k = min(2048, logits.shape[1])

    def run():
        return torch.topk(logits, k, dim=-1)

    med, lo, hi = time_ms(run, iters, WARMUP)
    return med, lo, hi, 4.0 * visible + 4.0 * logits.shape[0] * k, 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", help="bench_logits --json records")
    ap.add_argument("--json", help="append the peers' records to this file (bench/SCHEMA.md)")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--seq", type=int, default=32768)
    args = ap.parse_args()
    torch.manual_seed(0)
    ours = {}
    if args.ours:
        for r in records.read(args.ours):
            if r["impl"] == "msa" and r["case"].startswith(("MQAL-", "TOPK")):
                ours[r["case"]] = r
    paged, paged_logits = paged_peer(args.iters)
    results = [("MQAL-PAGED-B64", "paged_mqa_logits", paged)]
    results.append(("TOPK2048-B64", "token_topk",
                    topk_peer(args.iters, paged_logits, paged_logits.numel())))
    del paged_logits
    prefill, prefill_logits = prefill_peer(args.iters, args.seq)
    results.append(("MQAL-PREFILL-32K", "mqa_logits", prefill))
    results.append(("TOPK2048-32K", "token_topk",
                    topk_peer(args.iters, prefill_logits, args.seq * (args.seq + 1) / 2)))
    del prefill_logits
    print(f"MQA logits peers (same run): torch _scaled_mm + relu + weighted head sum, torch.topk; "
          f"L2 flush: {FLUSH}")
    for case, op, (med, lo, hi, nbytes, flop) in results:
        topk = op == "token_topk"
        mine = ours.get(case)
        if mine:
            rate = f"{mine['tbps']:7.3f} TB/s" if topk else f"{mine['tflops']:7.1f} TFLOP/s"
            print(f"  {case:18s} msa   median {mine['median_ms'] * 1e3:10.1f} us  {rate}")
        rate = (f"{nbytes / (med * 1e-3) / 1e12:7.3f} TB/s" if topk
                else f"{flop / (med * 1e-3) / 1e12:7.1f} TFLOP/s")
        print(f"  {case:18s} torch median {med * 1e3:10.1f} us [{lo * 1e3:.1f}, {hi * 1e3:.1f}]  "
              f"{rate}")
        if args.json:
            r = records.new_record(case, op, "torch-topk" if topk else "torch-scaled-mm")
            r.update({"topk": 2048} if topk else {"hq": H, "d": D})
            records.add_timing(r, (med, lo, hi), args.iters, WARMUP, flop or None, nbytes,
                               "tbps" if case == "MQAL-PAGED-B64" or topk else "tflops")
            records.add_check(r, "skipped", {})
            records.add_environment(r, FLUSH, mine.get("commit") if mine else None)
            records.append(args.json, r)


if __name__ == "__main__":
    main()
