"""The benchmark record of bench/SCHEMA.md on the Python side, shared by the peers' scripts
(peers.py, peers_decode.py, peers_toksparse.py) and the plot (plot.py): the same fields, in the
same order, as the C++ programs write through workloads/record.h. One record per timed op,
appended as a line of a JSON Lines file.
"""
import ctypes
import datetime
import json
import math
import os
import subprocess

SCHEMA = 1

# Shape fields, in record order; a peer's record copies them from the msa record it is compared with.
SHAPE_FIELDS = ("batch", "seq_q", "seq_k", "seqlens_q", "seqlens_k", "hq", "hkv", "d", "blk", "topk",
                "pattern", "causal", "page_size", "layout", "dtypes")


def flush_name():
    """The L2 flush that MSA_BENCH_FLUSH asks for, as records name it: memset (the default;
    `write` is its older name) or read. SystemExit for anything else, before any timing."""
    mode = os.environ.get("MSA_BENCH_FLUSH", "memset")
    if mode not in ("memset", "write", "read"):
        raise SystemExit(f"MSA_BENCH_FLUSH must be memset (or write, its older name) or read, got {mode}")
    return "read" if mode == "read" else "memset"


def new_record(case, op, impl):
    return {"schema": SCHEMA, "case": case, "impl": impl, "op": op}


def shape(batch, seq_q, seq_k, hq, hkv, d, blk, topk, pattern, causal, q_dtype="bf16", kv_dtype="bf16"):
    """Shape fields of a problem whose requests all have the same lengths."""
    return {"batch": batch, "seq_q": seq_q, "seq_k": seq_k, "hq": hq, "hkv": hkv, "d": d, "blk": blk,
            "topk": topk, "pattern": pattern, "causal": causal, "dtypes": {"q": q_dtype, "kv": kv_dtype}}


def shape_of(record):
    """The shape fields of another record (the msa record a peer runs the same problem as)."""
    return {k: record[k] for k in SHAPE_FIELDS if k in record}


def add_timing(r, times, iters, warmup, flop, nbytes, metric):
    """times: (median, min, max) in ms. A count of 0 or None is 'not counted': null, and so is
    its rate. metric: 'tflops' or 'tbps', the rate to read first."""
    med, lo, hi = times
    r.update({"median_ms": med, "min_ms": lo, "max_ms": hi, "iters": iters, "warmup": warmup})
    r["flop"] = flop or None
    r["bytes"] = nbytes or None
    r["tflops"] = flop / (med * 1e-3) / 1e12 if flop and med > 0 else None
    r["tbps"] = nbytes / (med * 1e-3) / 1e12 if nbytes and med > 0 else None
    r["metric"] = metric
    return r


def add_check(r, check, errors=None):
    """check: 'passed', 'failed' or 'skipped'; errors: {name: value} behind it."""
    r["check"] = check
    if errors:
        r["errors"] = errors
    return r


def commit(fallback=None):
    """MSA_COMMIT when set, else the git commit of this folder ('-dirty' when tracked files differ),
    else `fallback` (e.g. the commit in the msa records a peer is compared with), else 'unknown'."""
    if os.environ.get("MSA_COMMIT"):
        return os.environ["MSA_COMMIT"]
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", here, "diff", "--quiet", "HEAD", "--"]).returncode == 1
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return fallback or "unknown"


def _nvidia_driver():
    """The kernel module's version from /proc/driver/nvidia/version, or None."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            line = f.readline()
    except OSError:
        return None
    # "... Kernel Module  570.86.15  ..." or "... Open Kernel Module for x86_64  580.159.04 ...":
    # the first word that starts with a digit and holds a dot.
    for word in line.split():
        if word[0].isdigit() and "." in word:
            return word
    return line.strip() or None


def _cuda_driver():
    """cuDriverGetVersion as '13.0', or None without libcuda."""
    try:
        v = ctypes.c_int()
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(v)) != 0:
            return None
        return f"{v.value // 1000}.{v.value % 1000 // 10}"
    except OSError:
        return None


def add_environment(r, flush, commit_fallback=None):
    """flush, commit, device, gpu, driver, cuda (torch's CUDA runtime) and date: last in every
    record. Runs on the GPU (the peers time CUDA kernels through torch)."""
    import torch

    r.update({
        "flush": flush,
        "commit": commit(commit_fallback),
        "device": "gpu",
        "gpu": torch.cuda.get_device_name(),
        "driver": {"cuda": _cuda_driver(), "nvidia": _nvidia_driver()},
        "cuda": torch.version.cuda,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    })
    return r


def _finite(v):
    """v with every NaN or infinity replaced by None: JSON has no spelling for them (the C++
    side writes null as well)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def append(path, r):
    """Appends r as one line of the JSON Lines file at path, spaced as the C++ programs write it."""
    with open(path, "a") as f:
        f.write(json.dumps(_finite(r), allow_nan=False, separators=(",", ":")) + "\n")


def read(path):
    """The records of a JSON Lines file; ValueError naming the file and line for a line that is
    not a record of this schema."""
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e})") from None
            if not isinstance(r, dict) or r.get("schema") != SCHEMA:
                raise ValueError(f"{path}:{n}: not a schema {SCHEMA} record (bench/SCHEMA.md)")
            out.append(r)
    return out
