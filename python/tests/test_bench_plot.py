# bench/plot.py on the sample records of bench/testdata: every figure it names is a non-empty PNG,
# and a file that holds no records of the schema stops it with the file and line named.
import os
import subprocess
import sys

import pytest

pytest.importorskip("matplotlib", reason="bench/plot.py draws with matplotlib, which is not installed here")

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")
PLOT = os.path.join(BENCH, "plot.py")
SAMPLE = os.path.join(BENCH, "testdata", "records.jsonl")


def run_plot(*args):
    return subprocess.run([sys.executable, PLOT, *args], capture_output=True, text=True, timeout=600)


def test_plot_draws_every_family_and_a_roofline_per_case(tmp_path):
    out = tmp_path / "plots"
    r = run_plot(SAMPLE, "--out", str(out), "--bf16-tflops", "700")
    assert r.returncode == 0, r.stderr
    written = [line for line in r.stdout.splitlines() if line.endswith(".png")]
    names = {os.path.basename(p) for p in written}
    for expected in ("throughput_sparse-tok_tflops.png", "throughput_sparse-blk_tflops.png",
                     "throughput_indexer_tflops.png", "throughput_dense_tflops.png",
                     "throughput_decode_tbps.png", "roofline_P32K-tok.png", "roofline_E2E-32K.png",
                     "roofline_DEC-MTP.png"):
        assert expected in names, (expected, sorted(names))
    assert sorted(names) == sorted(os.listdir(out))
    for name in names:
        data = (out / name).read_bytes()
        assert len(data) > 1000 and data.startswith(b"\x89PNG"), name
    # CSR-32K has no FLOP count, so no roofline, and says so.
    assert "roofline: CSR-32K skipped" in r.stdout


def test_plot_names_a_line_that_is_not_a_record(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(open(SAMPLE).readline() + '{"case": "no schema field"}\n')
    r = run_plot(str(bad), "--out", str(tmp_path / "plots"))
    assert r.returncode != 0
    assert "bad.jsonl:2: not a schema 1 record" in r.stderr
