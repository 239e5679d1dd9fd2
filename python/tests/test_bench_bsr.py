# bench/bsr_bench.py's matrices and FLOP count on the CPU: every block row lists its diagonal
# block and distinct earlier ones, ascending, at most per_row of them, and the attended pairs equal
# a brute-force count of the causally visible (query, key) pairs of the listed blocks.
import importlib.util
import os

import numpy as np
import pytest

pytest.importorskip("torch", reason="bench/bsr_bench.py imports torch")

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench",
                     "bsr_bench.py")
_spec = importlib.util.spec_from_file_location("bsr_bench", BENCH)
bsr_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bsr_bench)

SHAPES = [dict(S=512, hq=2, hkv=1, R=64, C=64, per_row=4),
          dict(S=256, hq=2, hkv=1, R=1, C=64, per_row=3),
          dict(S=384, hq=2, hkv=1, R=16, C=64, per_row=5),
          dict(S=512, hq=2, hkv=1, R=128, C=64, per_row=6)]


@pytest.mark.parametrize("c", SHAPES)
def test_rows_list_their_diagonal_and_distinct_earlier_blocks(c):
    indptr, indices = bsr_bench.make_bsr(c, seed=3)
    assert indptr.dtype == np.int32 and indices.dtype == np.int32
    assert len(indptr) == c["S"] // c["R"] + 1 and indptr[0] == 0
    for i in range(len(indptr) - 1):
        row = indices[indptr[i]:indptr[i + 1]]
        diag = ((i + 1) * c["R"] - 1) // c["C"]
        assert row[-1] == diag and np.all(np.diff(row) > 0) and row[0] >= 0
        assert len(row) == min(c["per_row"], diag + 1)


@pytest.mark.parametrize("c", SHAPES)
def test_attended_pairs_match_a_brute_force_count(c):
    indptr, indices = bsr_bench.make_bsr(c, seed=5)
    S, R, C = c["S"], c["R"], c["C"]
    want = 0
    for t in range(S):
        i = t // R
        for col in indices[indptr[i]:indptr[i + 1]]:
            keys = np.arange(col * C, col * C + C)
            want += int((keys <= t).sum())
    assert bsr_bench.attended_pairs(c, indptr, indices) == want
