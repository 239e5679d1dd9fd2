#!/usr/bin/env python3
"""A hostile user of msa's Python API on the CPU: random valid and invalid calls of every op,
each run in a child process so that a crash or a hang is seen as one.

Every call starts from a valid random problem (small varlen shapes) and, in most calls, applies
one mutation: a wrong dtype, rank or extent, a broken stride, an empty or negative size, an
integer past 32 bits, a NaN / infinite / negative scale, an out-of-range id, a read-only output, a
Python list for an array, a missing argument. Outcomes:
  ok        the call returned (valid calls: its attention output is also checked against the
            float64 numpy reference on the same inputs)
  rejected  msa.MsaError (the expected answer to an invalid call; it must name the argument)
  rejected_valid  msa.MsaError for an unmutated, valid call (a defect)
  other     any other exception (a defect: msa should have raised MsaError)
  wrong     a valid call whose result disagrees with the reference (a defect)
  accepted  an invalid call that returned (a defect, for the mutations that are always invalid)
  crash     the child died (a defect)
  hang      the child passed the timeout (a defect)

  python3 scripts/fuzz_api.py --calls 15000 [--seed 1] [--per-child 500] [--timeout 120]
Prints the counts per op and outcome, the first examples of each defect, and exits 1 if any.
"""
import argparse
import collections
import json
import multiprocessing as mp
import sys
import traceback

import numpy as np

D = 32  # a multiple of every format's group (MXFP4: 32)
MUTATIONS = ["none", "none", "dtype", "rank", "extent", "stride", "empty", "negative",
             "huge_int", "nan_scale", "bad_id", "readonly_out", "list", "missing"]
# Mutations after which a call must be rejected (the others may stay valid, e.g. an empty batch).
ALWAYS_INVALID = {"dtype", "rank", "extent", "negative", "huge_int", "nan_scale", "bad_id",
                  "readonly_out", "list", "missing"}


def cu(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def problem(rng):
    b = int(rng.integers(1, 4))
    lk = [int(x) for x in rng.integers(1, 200, b)]
    lq = [int(min(x, k)) for x, k in zip(rng.integers(1, 40, b), lk)]
    hkv = int(rng.choice([1, 2]))
    hq = hkv * int(rng.choice([1, 2, 4]))
    q = rng.standard_normal((sum(lq), hq, D)).astype(np.float16)
    k = rng.standard_normal((sum(lk), hkv, D)).astype(np.float16)
    v = rng.standard_normal((sum(lk), hkv, D)).astype(np.float16)
    return dict(q=q, k=k, v=v, cu_q=cu(lq), cu_k=cu(lk), lq=lq, lk=lk, hq=hq, hkv=hkv)


def mutate_array(rng, x, how):
    if how == "dtype":
        return x.astype(np.float64)
    if how == "rank":
        return x.reshape(x.shape[0], -1) if x.ndim > 1 else x[:, None]
    if how == "extent":
        return np.concatenate([x, x[..., :1]], axis=x.ndim - 1) if x.shape[-1] else x
    if how == "stride":
        return np.repeat(x, 2, axis=x.ndim - 1)[..., ::2]
    if how == "list":
        return x.tolist()
    return x


def call(op, rng, how):
    """One call of `op` with mutation `how`; returns (result or None, reference or None)."""
    import msa
    p = problem(rng)
    blk = int(rng.choice([64, 128]))
    topk = int(rng.integers(2, 6))
    q2k_fn = lambda: msa.block_topk(p["q"], p["k"], p["cu_q"], cu_seqlens_k=p["cu_k"], topk=topk,
                                    kv_block_size=blk)
    args = {}
    if op == "attention_forward":
        q2k = q2k_fn()
        args = dict(q=p["q"], k=p["k"], v=p["v"], cu_seqlens_q=p["cu_q"], cu_seqlens_k=p["cu_k"],
                    q2k=q2k, kv_block_size=blk)
        target = str(rng.choice(["q", "k", "v", "cu_seqlens_q", "q2k"]))
    elif op == "block_scores":
        args = dict(q=p["q"], k=p["k"], cu_seqlens_q=p["cu_q"], cu_seqlens_k=p["cu_k"],
                    kv_block_size=blk)
        target = str(rng.choice(["q", "k", "cu_seqlens_q"]))
    elif op == "block_topk":
        args = dict(q=p["q"], k=p["k"], cu_seqlens_q=p["cu_q"], cu_seqlens_k=p["cu_k"], topk=topk,
                    kv_block_size=blk)
        target = str(rng.choice(["q", "k", "topk"]))
    elif op == "quantize":
        args = dict(x=p["q"].astype(np.float32), format=str(rng.choice(
            ["fp8_per_tensor", "fp8_per_token", "fp8_per_token_head", "nvfp4", "mxfp4"])))
        target = "x"
    elif op == "decode":
        args = dict(q=p["q"], k=p["k"], v=p["v"], cu_seqlens_q=p["cu_q"], cu_seqlens_k=p["cu_k"])
        target = str(rng.choice(["q", "k"]))
    elif op == "attention_dense":
        # Dense attention's keywords (CPU): per-request causal offsets, a per-batch key mask, a
        # soft-cap.
        b = len(p["lq"])
        args = dict(q=p["q"], k=p["k"], v=p["v"], cu_seqlens_q=p["cu_q"], cu_seqlens_k=p["cu_k"],
                    causal_offset=np.array([int(rng.integers(-3, k + 3)) for k in p["lk"]],
                                           np.int32),
                    key_mask=rng.random((b, max(p["lk"]) + 2)) < 0.8,
                    soft_cap=float(rng.uniform(1, 30)))
        if b == sum(p["lq"]):
            args["key_mask_rows"] = "batch"
        target = str(rng.choice(["q", "k", "causal_offset"]))
    elif op == "attention_batched":
        bsz, sq, sk = int(rng.integers(1, 4)), int(rng.integers(1, 20)), int(rng.integers(1, 90))
        args = dict(q=rng.standard_normal((bsz, sq, p["hq"], D)).astype(np.float16),
                    k=rng.standard_normal((bsz, sk, p["hkv"], D)).astype(np.float16),
                    v=rng.standard_normal((bsz, sk, p["hkv"], D)).astype(np.float16),
                    causal_offset=rng.integers(-3, sk + 3, bsz).astype(np.int32),
                    key_mask=rng.random((bsz, sq, sk)) < 0.8, soft_cap=float(rng.uniform(1, 30)))
        target = str(rng.choice(["q", "k", "causal_offset"]))
    elif op == "sdsa":
        args = sdsa_problem(rng)
        target = str(rng.choice(["query", "key_cache", "row_requests"]))
    elif op == "token_topk":
        rows, cols = int(rng.integers(1, 20)), int(rng.integers(1, 300))
        x = np.round(rng.standard_normal((rows, cols)) * 4).astype(np.float32) / 4
        x[rng.random(x.shape) < 0.05] = rng.choice([np.nan, -np.inf])
        ks = rng.integers(0, cols + 1, rows).astype(np.int32)
        args = dict(logits=x, topk=int(rng.integers(1, 40)), ks=ks,
                    ke=np.minimum(ks + rng.integers(0, cols + 1, rows), cols).astype(np.int32))
        target = "ks"
    elif op == "mqa_logits":
        t, s = p["q"].shape[0], p["k"].shape[0]
        import ml_dtypes
        args = dict(q=p["q"].astype(ml_dtypes.bfloat16), k=p["k"][:, 0].astype(ml_dtypes.bfloat16),
                    weights=rng.standard_normal((t, p["hq"])).astype(np.float32),
                    ks=np.zeros(t, np.int32), ke=np.full(t, s, np.int32))
        target = str(rng.choice(["q", "k", "weights", "ks"]))
    # The mutation (`applied`: it changed the arguments, so an invalid call must be rejected).
    scale = None
    def sig(v_):  # what makes an argument different for msa: kind, shape, dtype, layout, value
        if isinstance(v_, np.ndarray):
            return ("array", v_.shape, str(v_.dtype), v_.strides, v_.flags.writeable)
        return (type(v_).__name__, v_ if isinstance(v_, (int, float, str)) else id(v_))
    before = {k_: sig(v_) for k_, v_ in args.items()}
    if how in ("dtype", "rank", "extent", "stride", "list") and target in args and \
            isinstance(args[target], np.ndarray):
        args[target] = mutate_array(rng, args[target], how)
    elif how == "empty":
        for key in ("q", "x"):
            if key in args:
                args[key] = args[key][:0]
        if "cu_seqlens_q" in args:
            args["cu_seqlens_q"] = np.zeros_like(args["cu_seqlens_q"])
        if op == "mqa_logits":
            args["weights"], args["ks"], args["ke"] = (args["weights"][:0], args["ks"][:0],
                                                       args["ke"][:0])
    elif how == "negative" and "kv_block_size" in args:
        args["topk" if "topk" in args and rng.random() < 0.5 else "kv_block_size"] = -64
    elif how == "huge_int" and "kv_block_size" in args:
        args["topk" if "topk" in args and rng.random() < 0.5 else "kv_block_size"] = 2**32 + 64
    elif how == "nan_scale" and op in ("attention_forward", "block_scores", "block_topk"):
        scale = np.full(p["k"].shape[0], np.nan, np.float32)
        args["k"] = msa.quantize(p["k"].astype(np.float32), "fp8_per_token").values
        args["k_scale"] = scale
        if op == "attention_forward":
            args["v"] = args["k"]
            args["v_scale"] = np.ones(p["k"].shape[0], np.float32)
            args["q"] = args["q"].astype(np.float16)
            import ml_dtypes  # noqa: F401  (bf16 q over FP8 K/V)
            args["q"] = p["q"].astype(np.float32).astype("bfloat16")
    elif how == "nan_scale" and op in ("attention_dense", "attention_batched"):
        args["soft_cap"] = np.nan
    elif how == "bad_id" and op == "sdsa":
        args["row_requests"] = args["row_requests"].copy()
        args["row_requests"][0] = args["seq_lens"].shape[0] + 5
    elif how == "bad_id" and op == "attention_forward":
        args["q2k"] = args["q2k"].copy()
        args["q2k"][0, 0, 0] = 10**6
    elif how == "readonly_out" and op in ("attention_forward", "block_scores"):
        shape = (p["q"].shape[0], p["hq"], D) if op == "attention_forward" else None
        if shape is not None:
            out = np.zeros(shape, np.float16)
            out.setflags(write=False)
            args["out"] = out
    elif how == "missing" and "cu_seqlens_k" in args and op != "decode":
        # A keyword the call cannot do without (a flat cache's lengths); required positional
        # arguments are Python's to report (TypeError).
        args.pop("cu_seqlens_k")
    after = {k_: sig(v_) for k_, v_ in args.items()}
    applied = before != after
    result = run_op(op, args, p, rng, how, target, blk)
    return result[0], result[1], applied


def run_op(op, args, p, rng, how, target, blk):
    import msa
    if op == "attention_forward":
        out = msa.attention_forward(**args)
        ref = None
        if how == "none":
            import np_reference as r
            ref = r.attention(p["q"].astype(np.float64), r.split(p["k"], p["cu_k"]),
                              r.split(p["v"], p["cu_k"]), p["cu_q"], q2k=args["q2k"], blk=blk)[0]
        return out, ref
    if op == "block_scores":
        return msa.block_scores(**args), None
    if op == "block_topk":
        return msa.block_topk(**args), None
    if op == "quantize":
        return msa.quantize(**args), None
    if op == "decode":
        lk = np.diff(args["cu_seqlens_k"]) if isinstance(args.get("cu_seqlens_k"), np.ndarray) else []
        plan = msa.DecodePlan().plan(batch=len(p["lq"]), num_q_heads=p["hq"],
                                     num_kv_heads=p["hkv"], head_dim=D, page_size=16,
                                     kv_dtype="f16",
                                     max_pages=int(max(list(lk) + [1]) + 15) // 16,
                                     max_queries_per_request=40)
        import np_reference as r
        kp, vp, table, seqused = r.to_pages(rng, p["k"], p["v"], p["cu_k"], 16)
        if how != "none" and target == "q" and "q" in args:
            qq = args["q"]
        else:
            qq = p["q"]
        return plan.run(qq, args.get("k", kp) if how in ("dtype", "rank", "extent", "list") and
                        target == "k" else kp, vp, table, p["cu_q"], seqused_k=seqused), None
    if op == "mqa_logits":
        return msa.mqa_logits(**args), None
    if op in ("attention_dense", "attention_batched"):
        import np_reference as r
        fn = msa.attention_forward if op == "attention_dense" else msa.attention_batched
        out = fn(**args)
        if how != "none":
            return out, None
        if op == "attention_dense":
            ks, vs, cu_q = r.split(p["k"], p["cu_k"]), r.split(p["v"], p["cu_k"]), p["cu_q"]
            q, mask, per_query = p["q"], args["key_mask"], False
        else:
            bsz, sq = args["q"].shape[:2]
            q = args["q"].reshape(bsz * sq, *args["q"].shape[2:])
            ks, vs, cu_q = list(args["k"]), list(args["v"]), cu([sq] * bsz)
            mask, per_query = args["key_mask"].reshape(bsz * sq, -1), True
        ref = r.attention(q.astype(np.float64), [x.astype(np.float64) for x in ks],
                          [x.astype(np.float64) for x in vs], cu_q,
                          causal_offset=args["causal_offset"], key_mask=mask,
                          mask_per_query=per_query, soft_cap=args["soft_cap"])[0]
        return np.asarray(out).reshape(ref.shape), ref
    if op == "sdsa":
        return sdsa_run(args, how, rng)
    if op == "token_topk":
        ids = msa.token_topk(**args)
        if how != "none":
            return ids, None
        return ids, topk_reference(args["logits"], args["topk"], args["ks"], args["ke"])
    raise AssertionError(op)


def sdsa_problem(rng):
    """The SDSA indexer's inputs (docs/semantics.md, SDSA indexer): a bf16 page pool of one key
    head, its block table and lengths, query rows with their requests."""
    import ml_dtypes
    bsz, ps = int(rng.integers(1, 4)), int(rng.choice([4, 16]))
    lens = rng.integers(0, 120, bsz).astype(np.int32)
    pages = [-(-int(n) // ps) for n in lens]
    order = rng.permutation(sum(pages) + 1).astype(np.int32)
    table = np.zeros((bsz, max(pages + [1])), np.int32)
    used = 0
    for b in range(bsz):
        table[b, :pages[b]] = order[used:used + pages[b]]
        used += pages[b]
    pool = rng.standard_normal((len(order), ps, D)).astype(ml_dtypes.bfloat16)
    rows = int(rng.integers(1, 8))
    return dict(query=rng.standard_normal((rows, D)).astype(ml_dtypes.bfloat16), key_cache=pool,
                block_table=table, seq_lens=lens,
                row_requests=rng.integers(0, bsz, rows).astype(np.int32))


def sdsa_run(args, how, rng):
    """indexer_scores (checked against float64 dot products: bf16 products are exact, so the
    f32 rounding of the sums agrees), then for a valid call the sampled selection
    (gather_key_sample, indexer_scores on the sample, thresholds_from_sample,
    indexer_threshold_select, top_k_from_candidates), whose exact rows (row_status 0) must hold
    the top-K of a full sort of the row's scores."""
    import msa
    lens = args["seq_lens"]
    width = int(max(lens.max(initial=0), 1))
    scores = msa.indexer_scores(**args, max_len=width)
    if how != "none":
        return scores, None
    ps = args["key_cache"].shape[1]
    want = np.full(scores.shape, -np.inf)
    for t, b in enumerate(args["row_requests"]):
        keys = [args["key_cache"][args["block_table"][b, j // ps], j % ps] for j in range(lens[b])]
        if keys:
            want[t, :lens[b]] = np.stack(keys).astype(np.float64) @ \
                args["query"][t].astype(np.float64)
    want = want.astype(np.float32)
    if not np.array_equal(scores, want):
        return scores, want  # compared by the caller: a wrong result
    topk, stride = int(rng.integers(1, 12)), int(rng.integers(1, 5))
    cap = -(-width // stride)
    sample, sample_lens = msa.gather_key_sample(args["key_cache"], args["block_table"], lens,
                                                stride, max_samples=cap)
    ss = msa.indexer_scores(args["query"], sample, np.arange(len(lens), dtype=np.int32)[:, None],
                            sample_lens, args["row_requests"], max_len=cap)
    th, counts = msa.thresholds_from_sample(ss, topk, stride)
    cand, ties, counts = msa.indexer_threshold_select(
        args["query"], args["key_cache"], args["block_table"], lens, args["row_requests"], th,
        counts, capacity=4 * topk, tie_capacity=2 * topk)
    ids, status = msa.top_k_from_candidates(cand, ties, counts, topk)
    full = topk_reference(want, topk, None, None)
    exact = status == 0
    return ids[exact].astype(np.float64), full[exact].astype(np.float64)


def topk_reference(x, topk, ks, ke):
    """The token top-K rule (docs/semantics.md, Token top-K): per row the `topk` best of [ks, ke)
    (higher first, NaN below every number, -inf never, ties toward the lower position),
    ascending, -1 padded."""
    rows, cols = x.shape
    out = np.full((rows, topk), -1, np.int32)
    for r in range(rows):
        lo, hi = (0, cols) if ks is None else (int(ks[r]), int(ke[r]))
        pos = [j for j in range(lo, hi) if not np.isneginf(x[r, j])]
        pos.sort(key=lambda j: (bool(np.isnan(x[r, j])),
                                0.0 if np.isnan(x[r, j]) else -float(x[r, j]), j))
        chosen = sorted(pos[:topk])
        out[r, :len(chosen)] = chosen
    return out


OPS = ["attention_forward", "block_scores", "block_topk", "quantize", "decode", "mqa_logits",
       "attention_dense", "attention_batched", "sdsa", "token_topk"]


def child(seed, n, queue):
    sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0] + "/python/tests")
    import msa
    rng = np.random.default_rng(seed)
    for i in range(n):
        op = str(rng.choice(OPS))
        how = str(rng.choice(MUTATIONS))
        queue.put(("start", op, how, seed, i))
        try:
            out, ref, applied = call(op, rng, how)
            outcome = "ok"
            if ref is not None:
                got = np.asarray(out, np.float64)
                if op in ("sdsa", "token_topk"):  # ids and f32 scores: exact
                    if not np.array_equal(got, np.asarray(ref, np.float64)):
                        outcome = "wrong"
                else:
                    err = np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30)
                    if not err <= 1e-2:
                        outcome = "wrong"
            elif applied and how in ALWAYS_INVALID and not (op == "quantize" and how == "extent"):
                # (quantize: a longer row is a valid FP8 input; FP4 formats reject an odd one)
                outcome = "accepted"
            queue.put(("done", op, how, outcome, ""))
        except msa.MsaError as e:
            # An unmutated call is valid: rejecting it is a defect.
            queue.put(("done", op, how, "rejected" if how != "none" else "rejected_valid",
                       str(e)[:200]))
        except Exception as e:  # noqa: BLE001  (the outcome to find)
            queue.put(("done", op, how, "other",
                       f"{type(e).__name__}: {e}"[:300] + " | " +
                       traceback.format_exc().splitlines()[-3][:200]))
    queue.put(("end",))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=15000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--per-child", type=int, default=500)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--json", help="write the counts and defects to this file")
    args = ap.parse_args()
    counts = collections.Counter()
    examples = collections.defaultdict(list)
    done = 0
    seed = args.seed
    ctx = mp.get_context("spawn")
    while done < args.calls:
        n = min(args.per_child, args.calls - done)
        q = ctx.Queue()
        proc = ctx.Process(target=child, args=(seed, n, q))
        proc.start()
        current, finished = None, 0
        while True:
            try:
                msg = q.get(timeout=args.timeout)
            except Exception:  # noqa: BLE001  (queue.Empty: nothing for `timeout` seconds)
                proc.kill()
                outcome = "crash" if not proc.is_alive() and proc.exitcode not in (0, None) else "hang"
                if current:
                    counts[(current[1], outcome)] += 1
                    examples[outcome].append(f"{current[1]} mutation={current[2]} seed={seed} call={current[4]}")
                break
            if msg[0] == "start":
                current = msg
            elif msg[0] == "done":
                counts[(msg[1], msg[3])] += 1
                finished += 1
                if msg[3] in ("other", "wrong", "accepted", "rejected_valid") and \
                        len(examples[msg[3]]) < 20:
                    examples[msg[3]].append(f"{msg[1]} mutation={msg[2]}: {msg[4]}")
                current = None
            else:
                break
        proc.join(5)
        done += max(finished, 1)
        seed += 1
    by_outcome = collections.Counter()
    for (op, outcome), c in counts.items():
        by_outcome[outcome] += c
    print(f"{done} calls: " + ", ".join(f"{k} {v}" for k, v in sorted(by_outcome.items())))
    for op in OPS:
        row = {o: c for (p_, o), c in counts.items() if p_ == op}
        print(f"  {op:18s} " + ", ".join(f"{k} {v}" for k, v in sorted(row.items())))
    for kind, ex in examples.items():
        print(f"{kind} (first {len(ex)}):")
        for e in ex:
            print("  " + e)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"calls": done, "outcomes": dict(by_outcome),
                       "examples": {k: v for k, v in examples.items()}}, f, indent=1)
    bad = sum(by_outcome[k] for k in ("other", "wrong", "accepted", "rejected_valid", "crash", "hang"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
