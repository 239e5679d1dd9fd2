#!/usr/bin/env python3
"""msa's Python API against its C++ API, in the same run: the sparse prefill cases and the host
cost of a small call.

1. Throughput: reads the selections and records that `bench_sparse_fwd --dump DIR --json FILE`
   wrote (P8K-tok, P32K-tok, P32K-blk by default) and times msa.attention_forward on the same
   shapes and selections, called as the C++ bench calls attention_forward (the k2q index built
   once, default partial precision), with the same L2 flush and CUDA events. Prints both
   figures and their ratio.
2. Latency (the LAT-* cases of `bench_latency --json FILE`): times msa.sparse_attention (the
   index branch of E2E-32K-M3) and msa.attention_forward (k2q given) on the same shapes, the
   host time of each call alone after the stream went idle (so the figure is the host's time to
   validate and enqueue, never a wait on the GPU) against the C++ figure, and the GPU time of
   calls back to back; FA4 (when importable) and cuDNN dense causal attention on the same shapes
   beside them.

    python bench/python_bench.py [--dump DIR --cpp records.jsonl] [--latency-cpp lat.jsonl]
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


def gpu_us(fn, calls, warmup=20):
    """GPU microseconds per call of `calls` calls back to back (CUDA events around the loop)."""
    for _ in range(warmup):
        fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(calls):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3 / calls


def fa4_dense():
    """FA4's dense entry points (flash_attn.cute), or None when it is not installed."""
    try:
        from flash_attn.cute import flash_attn_func, flash_attn_varlen_func
        return flash_attn_func, flash_attn_varlen_func
    except Exception:  # noqa: BLE001 - any import failure means "no FA4 here"
        return None


def latency_inputs(rec, gen):
    """Torch inputs of a LAT-* case as bench_latency builds them: q, k, v (flat, or pools of
    page_size slots with a shuffled page table), the index branch (4 index heads on 1 index key
    head, FP8 per token) and the lengths."""
    b, lq, lk, hq, hkv, d = rec["batch"], rec["seq_q"], rec["seq_k"], rec["hq"], rec["hkv"], rec["d"]
    page = rec.get("page_size", 0)
    dev = "cuda"
    q = torch.randn(b * lq, hq, d, generator=gen, device=dev).to(torch.bfloat16)
    cu_q = torch.arange(0, b + 1, dtype=torch.int32, device=dev) * lq
    x = dict(q=q, cu_q=cu_q, b=b, lq=lq, lk=lk, hq=hq, hkv=hkv, d=d, page=page)
    if page:
        per = -(-lk // page)
        pages = b * per
        x["k"] = torch.randn(pages, page, hkv, d, generator=gen, device=dev).to(torch.bfloat16)
        x["v"] = torch.randn(pages, page, hkv, d, generator=gen, device=dev).to(torch.bfloat16)
        x["table"] = torch.randperm(pages, generator=torch.Generator().manual_seed(1)).to(
            torch.int32).view(b, per).to(dev)
        x["used"] = torch.full((b,), lk, dtype=torch.int32, device=dev)
        keys = pages * page
        x["kv_args"] = dict(page_table=x["table"], seqused_k=x["used"])
    else:
        keys = b * lk
        x["k"] = torch.randn(keys, hkv, d, generator=gen, device=dev).to(torch.bfloat16)
        x["v"] = torch.randn(keys, hkv, d, generator=gen, device=dev).to(torch.bfloat16)
        x["cu_k"] = torch.arange(0, b + 1, dtype=torch.int32, device=dev) * lk
        x["kv_args"] = dict(cu_seqlens_k=x["cu_k"])
    iq = torch.randn(b * lq, 4, d, generator=gen, device=dev).to(torch.bfloat16)
    ik = torch.randn(keys, 1, d, generator=gen, device=dev).to(torch.bfloat16)
    x["index_q"] = msa.quantize(iq, "fp8_per_token")
    ikq = msa.quantize(ik, "fp8_per_token")
    if page:
        ikq = msa.QTensor(ikq.values.view(pages, page, 1, d), ikq.scale, format="fp8_per_token")
    x["index_k"] = ikq
    return x


def decode_calls(x, topk):
    """{op: call} of DecodePlan.run over a paged case's cache as bench_latency times it: one query
    per request, sparse (the sink block and the last topk - 1 blocks) and dense, planned once."""
    b, hq, hkv, d, page = x["b"], x["hq"], x["hkv"], x["d"], x["page"]
    per = x["table"].shape[1]
    gen = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(b, hq, d, generator=gen, device="cuda").to(torch.bfloat16)
    cu = torch.arange(0, b + 1, dtype=torch.int32, device="cuda")
    nblk = -(-x["lk"] // 128)
    last = [nblk - topk + j for j in range(1, topk)]
    row = [0] + [i if i > 0 else -1 for i in last]
    q2k = torch.tensor(row, dtype=torch.int32, device="cuda").repeat(hkv, b, 1)
    calls = {}
    for op, k in (("decode", topk), ("decode_dense", 0)):
        plan = msa.DecodePlan().plan(batch=b, num_q_heads=hq, num_kv_heads=hkv, head_dim=d,
                                     page_size=page, max_pages=per, topk=k, seqused_k=x["used"])
        sel = q2k if k else None
        calls[op] = (lambda plan=plan, sel=sel: plan.run(
            q, x["k"], x["v"], x["table"], cu, seqused_k=x["used"], q2k=sel, check=False))
    return calls


def dense_peers(x):
    """{name: call} of dense causal attention on the same shape: FA4 (flat, or its page table)
    and cuDNN SDPA (B = 1: [1, H, S, D]; paged: the requests' keys gathered once, untimed, as
    [B, H, Lk, D], bottom-right causal as a boolean mask)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    peers = {}
    b, lq, lk, hq, hkv, d = x["b"], x["lq"], x["lk"], x["hq"], x["hkv"], x["d"]
    fa4 = fa4_dense()
    if fa4 is not None:
        func, varlen = fa4
        if x["page"]:
            peers["fa4"] = lambda: varlen(x["q"], x["k"], x["v"], cu_seqlens_q=x["cu_q"],
                                          max_seqlen_q=lq, seqused_k=x["used"],
                                          page_table=x["table"], causal=True)
        else:
            q4, k4, v4 = (t.view(b, -1, *t.shape[1:]) for t in (x["q"], x["k"], x["v"]))
            peers["fa4"] = lambda: func(q4, k4, v4, causal=True)
    if x["page"]:
        pos = torch.arange(lk, device="cuda")
        slots = x["table"].long()[:, pos // x["page"]] * x["page"] + pos % x["page"]  # [B, Lk]
        kc = x["k"].view(-1, hkv, d)[slots].permute(0, 2, 1, 3).contiguous()
        vc = x["v"].view(-1, hkv, d)[slots].permute(0, 2, 1, 3).contiguous()
        qc = x["q"].view(b, lq, hq, d).permute(0, 2, 1, 3).contiguous()
        mask = (torch.arange(lk, device="cuda")[None, :] <=
                torch.arange(lq, device="cuda")[:, None] + (lk - lq))
        sdpa = lambda: F.scaled_dot_product_attention(qc, kc, vc, attn_mask=mask, enable_gqa=True)
    else:
        qc = x["q"].view(b, lq, hq, d).permute(0, 2, 1, 3).contiguous()
        kc = x["k"].view(b, lk, hkv, d).permute(0, 2, 1, 3).contiguous()
        vc = x["v"].view(b, lk, hkv, d).permute(0, 2, 1, 3).contiguous()
        sdpa = lambda: F.scaled_dot_product_attention(qc, kc, vc, is_causal=True, enable_gqa=True)

    def cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return sdpa()
    try:
        cudnn()
        peers["cudnn"] = cudnn
    except RuntimeError as e:  # the shape or mask is not one cuDNN takes: say so, time the default
        print(f"  cuDNN SDPA refused this shape ({str(e).splitlines()[0][:100]}); "
              "timing torch's SDPA backend choice instead")
        peers["sdpa"] = sdpa
    return peers


def pipeline_host_split(x, kw, calls):
    """Median host us of msa.sparse_attention split into its layers: with out= and workspace=
    given (no allocation), the Python layer alone (msa._C's entry replaced by a stand-in that
    only allocates the workspace it would), and that C entry alone on prebuilt keywords with the
    workspace given (the binding's conversions and the C++ call)."""
    import msa.attention as attention
    c = attention._C
    real = c.sparse_attention_pipeline
    args = {}
    nbytes = size_of_call(x, kw)

    def stand_in(a):  # allocates what the call would, sized beforehand (one dict, as _C takes it)
        args.update(a)
        if a.get("alloc") is not None:
            a["alloc"](nbytes)
    call = lambda **extra: msa.sparse_attention(x["q"], x["k"], x["v"], x["cu_q"],
                                                index_q=x["index_q"], index_k=x["index_k"],
                                                **kw, **extra)
    ws = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    out = torch.empty_like(x["q"])
    pre = host_us(lambda: call(out=out, workspace=ws), calls)
    c.sparse_attention_pipeline = stand_in
    try:
        py = host_us(call, calls)
    finally:
        c.sparse_attention_pipeline = real
    direct = dict(args, workspace=ws, alloc=None)
    entry = host_us(lambda: real(direct), calls)
    return dict(host_us_preallocated=pre[0], host_us_preallocated_min=pre[1],
                host_us_python_layer=py[0], host_us_python_layer_min=py[1],
                host_us_c_entry=entry[0], host_us_c_entry_min=entry[1])


def size_of_call(x, kw):
    return msa.pipeline_workspace_bytes(x["q"], x["k"], x["v"], x["cu_q"], index_q=x["index_q"],
                                        index_k=x["index_k"],
                                        **{k: v for k, v in kw.items() if k != "check"})


def latency(args, cpp_lat):
    """The LAT-* cases of bench_latency's records: the same calls through the Python API (host
    and GPU time per call, against the C++ host time), and FA4 and cuDNN dense on the same
    shapes in the same run."""
    cases = [r for r in cpp_lat if str(r.get("case", "")).startswith("LAT-") and r["op"] == "pipeline"]
    if not cases:
        print("no bench_latency records (--latency-cpp); latency cases skipped")
        return []
    rows = []
    # On a non-blocking stream, as bench_latency calls the C++ API: torch's default stream is the
    # legacy one, whose every launch the driver orders against the device's other blocking
    # streams, which costs host time the C++ figure does not pay.
    side = torch.cuda.Stream()
    torch.cuda.current_stream().synchronize()
    table = []
    split, cpp_mins, decode = {}, {}, []
    for ref in cases:
        name = ref["case"]
        cpp = {r["op"]: r for r in cpp_lat if r.get("case") == name}
        with torch.cuda.stream(side):
            x = latency_inputs(ref, torch.Generator(device="cuda").manual_seed(11))
            kw = dict(x["kv_args"], topk=ref["topk"], check=False)
            _, sel = msa.sparse_attention(x["q"], x["k"], x["v"], x["cu_q"], index_q=x["index_q"],
                                          index_k=x["index_k"], return_selection=True, **kw)
            sel = sel.clone()  # a view of that call's workspace
            k2q = msa.build_k2q_csr(sel, x["cu_q"], k=x["k"], **x["kv_args"])
            calls = {
                ("pipeline", "msa-python"): lambda: msa.sparse_attention(
                    x["q"], x["k"], x["v"], x["cu_q"], index_q=x["index_q"],
                    index_k=x["index_k"], **kw),
                ("attention_forward", "msa-python"): lambda: msa.attention_forward(
                    x["q"], x["k"], x["v"], x["cu_q"], q2k=sel, k2q=k2q, check=False,
                    **x["kv_args"]),
            }
            if x["page"]:  # the serving step after this prefill, as bench_latency times it
                for op, fn in decode_calls(x, ref["topk"]).items():
                    calls[(op, "msa-python")] = fn
            for peer, fn in dense_peers(x).items():
                calls[("dense", peer)] = fn
            got = {}
            for (op, impl), fn in calls.items():
                med, lo, hi = host_us(fn, args.lat_calls)
                g = gpu_us(fn, args.lat_calls)
                got[(op, impl)] = (med, g)
                rec = records.new_record(name, op, impl)
                rec.update(records.shape_of(ref))
                rec.update(host_us_median=med, host_us_min=lo, host_us_max=hi, gpu_us=g,
                           calls=args.lat_calls)
                if op.startswith("decode"):  # one query a request over the case's cache
                    rec.update(seq_q=1, topk=rec["topk"] if op == "decode" else 0)
                if impl == "msa-python" and op in cpp:
                    rec["cpp_host_us"] = cpp[op]["host_us_median"]
                    rec["cpp_gpu_us"] = cpp[op]["gpu_us"]
                if op.startswith("decode") and op in cpp:
                    decode.append((name, op, cpp[op]["host_us_median"], med, cpp[op]["gpu_us"], g,
                                   cpp[op]["launches"]))
                if (op, impl) == ("pipeline", "msa-python"):
                    rec.update(pipeline_host_split(x, kw, args.lat_calls))
                    split[name] = rec
                    cpp_mins[name] = cpp[op].get("host_us_min")
                rows.append(records.add_environment(rec, "none"))
        msa.check_status()
        dense = {impl: g for (op, impl), (_, g) in got.items() if op == "dense"}
        best = min(dense.values()) if dense else None
        p = cpp["pipeline"]
        table.append((name, p["gpu_us"], cpp["attention_forward"]["gpu_us"],
                      cpp["attention_forward_dense"]["gpu_us"], dense.get("fa4"),
                      dense.get("cudnn", dense.get("sdpa")), best, p["host_us_median"],
                      got[("pipeline", "msa-python")][0], got[("attention_forward", "msa-python")][0],
                      cpp["attention_forward"]["host_us_median"],
                      (p["launches"], cpp["attention_forward"]["launches"],
                       cpp["attention_forward_dense"]["launches"])))
    # Median (min): the GPU machine's host timings move by up to 2x between runs (a shared,
    # virtualized CPU), so compare only figures of one run, and the minimums beside the medians.
    print("\n| case | pipeline host us, median (min): C++ | Python | Python with out= and "
          "workspace= | the Python layer alone (C entry stubbed) | C entry alone (workspace "
          "given) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, r in split.items():
        cpp_min = cpp_mins.get(name)
        print(f"| {name} | {r['cpp_host_us']:.1f} ({'-' if cpp_min is None else f'{cpp_min:.1f}'}) | "
              f"{r['host_us_median']:.1f} ({r['host_us_min']:.1f}) | "
              f"{r['host_us_preallocated']:.1f} ({r['host_us_preallocated_min']:.1f}) | "
              f"{r['host_us_python_layer']:.1f} ({r['host_us_python_layer_min']:.1f}) | "
              f"{r['host_us_c_entry']:.1f} ({r['host_us_c_entry_min']:.1f}) |")
    f = lambda v: "-" if v is None else f"{v:.1f}"
    print("\n| case | pipeline GPU us | attention_forward (k2q) | msa dense | FA4 dense | cuDNN dense "
          "| pipeline / best dense | host us: pipeline C++ / Python | attention_forward C++ / Python "
          "| launches: pipeline / attn / dense |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (name, pg, ag, dg, fa, cu, best, ph, pyh, pya, ah, launches) in table:
        ratio = "-" if best is None else f"{pg / best:.2f}x"
        print(f"| {name} | {pg:.1f} | {ag:.1f} | {dg:.1f} | {f(fa)} | {f(cu)} | {ratio} | "
              f"{ph:.1f} / {pyh:.1f} | {ah:.1f} / {pya:.1f} | {launches[0]} / {launches[1]} / "
              f"{launches[2]} |")
    if decode:
        print("\n| case | DecodePlan.run | host us: C++ / Python (over C++) | GPU us: C++ / Python "
              "| launches |")
        print("| --- | --- | --- | --- | --- |")
        for name, op, ch, ph, cg, pg, n in decode:
            print(f"| {name} | {op} | {ch:.1f} / {ph:.1f} ({ph - ch:.1f}) | {cg:.1f} / {pg:.1f} | "
                  f"{n} |")
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dump", help="bench_sparse_fwd --dump folder (selections)")
    p.add_argument("--cpp", help="bench_sparse_fwd --json records of the same run")
    p.add_argument("--cases", nargs="+", default=["P8K-tok", "P32K-tok", "P32K-blk"])
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--latency-cpp", help="bench_latency --json records of the same run")
    p.add_argument("--lat-calls", type=int, default=200)
    p.add_argument("--json", help="append this run's records (JSON Lines)")
    args = p.parse_args()
    rows = []
    if args.dump and args.cpp:
        rows += throughput(args, records.read(args.cpp))
    if args.latency_cpp:
        rows += latency(args, records.read(args.latency_cpp))
    for r in rows if args.json else []:
        records.append(args.json, r)


if __name__ == "__main__":
    main()
