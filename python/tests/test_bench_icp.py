# bench/icp_bench.py on the CPU backend at a tiny size, so that the script keeps working between
# GPU sessions: the simulated group on one device and a real gloo group of two processes, both
# cases; each run checks that the sharded q2k equals the baseline's and writes its records.
import json
import os
import sys

import pytest

pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import icp_bench  # noqa: E402


@pytest.mark.parametrize("case", ["ICP-PREFILL-128K", "ICP-DECODE-B64"])
@pytest.mark.parametrize("mode", [["--simulate", "2"], ["--world", "2", "--layout", "p256"]])
def test_icp_bench_on_cpu(tmp_path, case, mode):
    out = tmp_path / "icp.jsonl"
    tokens = "700" if case == "ICP-PREFILL-128K" else "300"
    argv = ["--case", case, "--device", "cpu", "--tokens", tokens, "--iters", "1", "--warmup",
            "0", "--json", str(out)] + mode
    assert icp_bench.main(argv) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["op"] for r in recs} >= {"icp_baseline"} and all(r["check"] == "passed" for r in recs)
    assert recs[-1]["speedup"] > 0 and recs[-1]["world"] == 2
