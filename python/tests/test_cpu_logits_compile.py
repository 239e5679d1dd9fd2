# CPU tests of the logits ops as torch custom ops (skipped without torch): torch.compile
# (fullgraph=True) over msa.mqa_logits, msa.paged_mqa_logits and msa.token_topk gives the eager
# call's bits (FP8, bf16 and, where torch has the dtype, FP4 inputs; flat and paged; clean_logits
# on and off; top-K wider than some rows), the compiled graph holds torch.ops.msa.* nodes, and
# each op's fake gives the real output's shape, dtype and device (FakeTensorMode, opcheck).
import pytest

import msa

torch = pytest.importorskip("torch", reason="torch is not installed")
E4M3 = torch.float8_e4m3fn
FP4 = getattr(torch, "float4_e2m1fn_x2", None)
E8M0 = getattr(torch, "float8_e8m0fnu", None)
needs_fp4 = pytest.mark.skipif(FP4 is None, reason="this torch has no float4_e2m1fn_x2")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles its own closures: the cache of one code object holds 8 graphs."""
    torch._dynamo.reset()
    yield


def _compile(fn):
    return torch.compile(fn, fullgraph=True, backend="eager")


def _bits(x):
    """x's bits as integers, so NaN and -inf compare as bits do."""
    return x.view(torch.int32)


def _ranges(gen, t_rows, s_keys):
    a = torch.randint(0, s_keys + 1, (t_rows,), generator=gen)
    b = torch.randint(0, s_keys + 1, (t_rows,), generator=gen)
    ks, ke = torch.minimum(a, b), torch.maximum(a, b)
    ke[0] = ks[0]  # an empty row
    ks[1], ke[1] = 0, s_keys  # a full one
    return ks.to(torch.int32), ke.to(torch.int32)


def _ragged(seed, dtype=E4M3, t_rows=9, heads=4, dim=32, s_keys=70):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(t_rows, heads, dim, generator=gen).to(dtype)
    k = torch.randn(s_keys, dim, generator=gen).to(dtype)
    scale = torch.rand(s_keys, generator=gen) + 0.5 if dtype == E4M3 else None
    w = torch.rand(t_rows, heads, generator=gen) * 2 - 1
    return (q, k, w) + _ranges(gen, t_rows, s_keys) + (scale,)


def _inside(ks, ke, s_keys):
    cols = torch.arange(s_keys)
    return (cols >= ks[:, None].long()) & (cols < ke[:, None].long())


def _paged(seed, lens, next_n, heads=4, dim=64, bs=16, fp4=False, sf_dtype=None):
    """Seed 001's fused pool of random blocks in shuffled order, its block tables (-1 past each
    request's blocks), q (FP8, or MXFP4 values with their UE8M0 scales q_sf) and weights."""
    gen = torch.Generator().manual_seed(seed)
    batch, u8 = len(lens), torch.uint8
    used = [(n + bs - 1) // bs for n in lens]
    blocks = sum(used) + 2
    token = dim // 2 + dim // 32 if fp4 else dim + 4
    vals = bs * (dim // 2 if fp4 else dim)
    pool = torch.zeros(blocks, bs * token, dtype=u8)
    if fp4:
        pool[:, :vals] = torch.randint(0, 256, (blocks, vals), generator=gen, dtype=u8)
        pool[:, vals:] = torch.randint(122, 133, (blocks, bs * dim // 32), generator=gen,
                                       dtype=u8)
        q = torch.randint(0, 256, (batch, next_n, heads, dim // 2), generator=gen,
                          dtype=u8).view(FP4)
        q_sf = torch.randint(122, 133, (batch, next_n, heads, dim // 32), generator=gen, dtype=u8)
        if sf_dtype is not None:
            q_sf = q_sf.view(sf_dtype)
    else:
        pool[:, :vals] = torch.randn(blocks, vals, generator=gen).to(E4M3).view(u8)
        pool[:, vals:] = (torch.rand(blocks, bs, generator=gen) + 0.5).view(u8)
        q = torch.randn(batch, next_n, heads, dim, generator=gen).to(E4M3)
        q_sf = None
    order = torch.randperm(blocks, generator=gen)
    tables = torch.full((batch, max(used) + 1), -1, dtype=torch.int32)
    nxt = 0
    for b, n in enumerate(used):
        tables[b, :n] = order[nxt:nxt + n].to(torch.int32)
        nxt += n
    w = torch.rand(batch * next_n, heads, generator=gen) * 2 - 1
    seq = torch.tensor(lens, dtype=torch.int32)
    return q, pool.view(blocks, bs, 1, token), w, tables, seq, q_sf


def _paged_visible(lens, next_n, width):
    """Row b * next_n + t sees positions p <= lens[b] - next_n + t."""
    cols = torch.arange(width)
    limit = torch.tensor([n - next_n + t for n in lens for t in range(next_n)])
    return cols[None, :] <= limit[:, None]


@pytest.mark.parametrize("dtype,k_form", [(E4M3, "scale"), (E4M3, "qtensor"),
                                          (torch.bfloat16, "plain")])
@pytest.mark.parametrize("clean", [True, False])
def test_mqa_logits_compiled_equals_eager(dtype, clean, k_form):
    q, k, w, ks, ke, scale = _ragged(1, dtype)

    def run(q, k, w, ks, ke, scale):
        key = msa.QTensor(k, scale) if k_form == "qtensor" else k
        return msa.mqa_logits(q, key, w, ks, ke, k_scale=None if k_form == "qtensor" else scale,
                              clean_logits=clean)

    eager = run(q, k, w, ks, ke, scale)
    got = _compile(run)(q, k, w, ks, ke, scale)
    assert got.dtype == torch.float32 and got.shape == (q.shape[0], k.shape[0])
    if clean:
        assert torch.equal(_bits(got), _bits(eager))
        assert torch.isneginf(got[~_inside(ks, ke, k.shape[0])]).all()
    else:  # the columns outside [ks, ke) of a fresh output are unspecified
        inside = _inside(ks, ke, k.shape[0])
        assert torch.equal(_bits(got[inside]), _bits(eager[inside]))


@pytest.mark.parametrize("fp4,sf_dtype", [
    (False, None), pytest.param(True, None, marks=needs_fp4, id="fp4-u8-scales"),
    pytest.param(True, E8M0, marks=[needs_fp4, pytest.mark.skipif(
        E8M0 is None, reason="this torch has no float8_e8m0fnu")], id="fp4-e8m0-scales")])
@pytest.mark.parametrize("clean", [True, False])
@pytest.mark.parametrize("next_n", [1, 3])
def test_paged_mqa_logits_compiled_equals_eager(fp4, sf_dtype, clean, next_n):
    lens = [40, 0, 17, 64]
    q, kv, w, tables, seq, q_sf = _paged(2 + next_n, lens, next_n, fp4=fp4, sf_dtype=sf_dtype)
    width = max(lens) + 7

    def run(q, kv, w, tables, seq, q_sf):
        return msa.paged_mqa_logits(q, kv, w, tables, seq, width, q_sf=q_sf, clean_logits=clean)

    eager = run(q, kv, w, tables, seq, q_sf)
    got = _compile(run)(q, kv, w, tables, seq, q_sf)
    assert got.dtype == torch.float32 and got.shape == (len(lens) * next_n, width)
    visible = _paged_visible(lens, next_n, width)
    if clean:
        assert torch.equal(_bits(got), _bits(eager))
        assert torch.isneginf(got[~visible]).all()
    else:
        assert torch.equal(_bits(got[visible]), _bits(eager[visible]))
    assert torch.isfinite(got[visible]).all()


def test_paged_rows_equal_ragged_rows_when_compiled():
    """The paged form's rows are the ragged form's over each request's own keys, both
    compiled in one graph."""
    lens, next_n, dim, bs = [33, 5], 2, 64, 16
    q, kv, w, tables, seq, _ = _paged(7, lens, next_n, dim=dim, bs=bs)

    def run(q, kv, w, tables, seq, k, scale, ks, ke):
        paged = msa.paged_mqa_logits(q, kv, w, tables, seq, max(lens))
        ragged = msa.mqa_logits(q[0], k, w[:next_n], ks, ke, k_scale=scale)
        return paged, ragged

    # Request 0's keys and scales, gathered from its blocks.
    n, flat = lens[0], kv.view(kv.shape[0], -1)
    rows = [flat[int(tables[0, j // bs])] for j in range(n)]
    k = torch.stack([r[(j % bs) * dim:(j % bs + 1) * dim] for j, r in enumerate(rows)])
    scale = torch.stack([r[bs * dim + 4 * (j % bs):bs * dim + 4 * (j % bs) + 4]
                         for j, r in enumerate(rows)]).view(torch.float32).reshape(n)
    ks = torch.zeros(next_n, dtype=torch.int32)
    ke = torch.tensor([n - next_n + t + 1 for t in range(next_n)], dtype=torch.int32)
    paged, ragged = _compile(run)(q, kv, w, tables, seq, k.view(E4M3), scale, ks, ke)
    assert torch.equal(_bits(paged[:next_n, :n]), _bits(ragged))


def _logits_rows(seed, rows=8, width=50):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, width, generator=gen)
    logits[:, ::7] = float("-inf")
    logits[2, 3:9] = float("nan")
    logits[3] = logits[3].round()  # ties
    logits[4] = float("-inf")
    ks, ke = _ranges(gen, rows, width)
    return logits, ks, ke


@pytest.mark.parametrize("ranged", [False, True])
@pytest.mark.parametrize("topk", [1, 6, 64])
def test_token_topk_compiled_equals_eager(ranged, topk):
    logits, ks, ke = _logits_rows(3)
    if not ranged:
        ks = ke = None

    def run(logits, ks, ke):
        return msa.token_topk(logits, topk, ks=ks, ke=ke)

    eager = run(logits, ks, ke)
    got = _compile(run)(logits, ks, ke)
    assert got.dtype == torch.int32 and got.shape == (logits.shape[0], topk)
    assert torch.equal(got, eager)
    if ranged:  # topk wider than some rows: those pad with -1
        short = (ke - ks) < topk
        assert short.any() and (got[short] == -1).any(dim=1).all()
    assert (got[4] == -1).all()  # nothing finite to choose


def test_logits_then_token_topk_in_one_graph():
    q, k, w, ks, ke, scale = _ragged(5)
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    def run(q, k, w, ks, ke, scale):
        logits = msa.mqa_logits(q, msa.QTensor(k, scale), w, ks, ke)
        return logits, msa.token_topk(logits, 20, ks=ks, ke=ke)

    got = torch.compile(run, fullgraph=True, backend=backend)(q, k, w, ks, ke, scale)
    eager = run(q, k, w, ks, ke, scale)
    assert torch.equal(_bits(got[0]), _bits(eager[0])) and torch.equal(got[1], eager[1])
    assert "msa.mqa_logits.default" in seen and "msa.token_topk.default" in seen
    assert ((ke - ks) < 20).any()


def test_compiled_sizes_follow_the_int_arguments():
    """New max_seq_len and topk values (ints the trace specializes) size the outputs."""
    lens, next_n = [40, 3], 2
    q, kv, w, tables, seq, _ = _paged(11, lens, next_n)

    def run(q, kv, w, tables, seq, width, topk):
        logits = msa.paged_mqa_logits(q, kv, w, tables, seq, width)
        return logits, msa.token_topk(logits, topk)

    compiled = torch.compile(run, fullgraph=True, backend="eager", dynamic=True)
    for width, topk in ((max(lens), 4), (max(lens) + 9, 11), (max(lens) + 20, 60)):
        got = compiled(q, kv, w, tables, seq, width, topk)
        eager = run(q, kv, w, tables, seq, width, topk)
        assert got[0].shape == (len(lens) * next_n, width) and got[1].shape == (4, topk)
        assert torch.equal(_bits(got[0]), _bits(eager[0])) and torch.equal(got[1], eager[1])


def test_out_is_the_direct_path():
    q, k, w, ks, ke, scale = _ragged(6)
    out = torch.full((q.shape[0], k.shape[0]), 7.0)
    got = msa.mqa_logits(q, k, w, ks, ke, k_scale=scale, clean_logits=False, out=out)
    assert got is out
    assert (got[~_inside(ks, ke, k.shape[0])] == 7.0).all()


# The shape rules: each op's fake against the real output, and torch.library.opcheck.

def _op_cases():
    q, k, w, ks, ke, scale = _ragged(8)
    cases = [("mqa_logits", (q, k, scale, w, ks, ke, True, True, None)),
             ("mqa_logits", (q.to(torch.bfloat16), k.to(torch.bfloat16), None, w, ks, ke,
                             False, None, None))]
    pq, kv, pw, tables, seq, _ = _paged(9, [20, 0, 35], 2)
    cases.append(("paged_mqa_logits", (pq, None, kv, pw, tables, seq, 41, True, True, None)))
    cases.append(("paged_mqa_logits", (pq, None, kv, pw, tables, seq, 35, False, None, None)))
    if FP4 is not None:
        fq, fkv, fw, ft, fseq, sf = _paged(10, [20, 0, 35], 3, fp4=True)
        cases.append(("paged_mqa_logits", (fq, sf, fkv, fw, ft, fseq, 50, True, None, None)))
    logits, lks, lke = _logits_rows(12)
    cases.append(("token_topk", (logits, None, None, 7, None, None)))
    cases.append(("token_topk", (logits, lks, lke, 80, True, None)))
    return cases


def _op_case(i):
    """(op, name, args) of case i (the FP4 case is left out where torch lacks the dtype)."""
    cases = _op_cases()
    if i >= len(cases):
        pytest.skip("no FP4 case with this torch")
    name, args = cases[i]
    return getattr(torch.ops.msa, name).default, name, args


@pytest.mark.parametrize("i", range(7))
def test_fake_matches_real(i):
    op, name, args = _op_case(i)
    real = op(*args)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        fake = op(*fake_args)
    assert (fake.shape, fake.dtype, fake.device) == (real.shape, real.dtype, real.device)
    if name == "mqa_logits":
        want = (args[0].shape[0], args[1].shape[0])
    elif name == "paged_mqa_logits":
        want = (args[0].shape[0] * args[0].shape[1], args[6])
    else:
        want = (args[0].shape[0], args[3])
    assert tuple(real.shape) == want
    assert real.dtype == (torch.int32 if name == "token_topk" else torch.float32)


@pytest.mark.parametrize("i", range(7))
def test_opcheck(i):
    op, name, args = _op_case(i)
    utils = ("test_faketensor",)
    if name == "token_topk" or args[-3]:  # clean_logits=False leaves columns unspecified
        utils += ("test_aot_dispatch_dynamic",)
    if not any(isinstance(a, torch.Tensor) and a.dtype in (E4M3, FP4) for a in args):
        utils += ("test_schema",)  # it multiplies the inputs: no CPU kernel for FP8 and FP4
    torch.library.opcheck(op, args, test_utils=utils)


def test_logits_topk_ops_compile_and_match_eager():
    """mqa_logits_topk and paged_mqa_logits_topk as torch ops: compiled == eager == the two
    steps; their fakes give the real output's shape and dtype."""
    q, k, w, ks, ke, scale = _ragged(13)

    def run(q, k, w, ks, ke, scale):
        return msa.mqa_logits_topk(q, msa.QTensor(k, scale), w, ks, ke, 15)

    got = _compile(run)(q, k, w, ks, ke, scale)
    logits = msa.mqa_logits(q, k, w, ks, ke, k_scale=scale)
    assert torch.equal(got, run(q, k, w, ks, ke, scale))
    assert torch.equal(got, msa.token_topk(logits, 15, ks=ks, ke=ke))
    lens, next_n = [40, 0, 23], 2
    pq, kv, pw, tables, seq, _ = _paged(14, lens, next_n)

    def paged(q, kv, w, tables, seq):
        return msa.paged_mqa_logits_topk(q, kv, w, tables, seq, 45, 12)

    pgot = _compile(paged)(pq, kv, pw, tables, seq)
    assert torch.equal(pgot, paged(pq, kv, pw, tables, seq))
    assert torch.equal(pgot, msa.token_topk(msa.paged_mqa_logits(pq, kv, pw, tables, seq, 45), 12))
    from torch._subclasses.fake_tensor import FakeTensorMode
    for op, args in ((torch.ops.msa.mqa_logits_topk.default, (q, k, scale, w, ks, ke, 15, None, None)),
                     (torch.ops.msa.paged_mqa_logits_topk.default,
                      (pq, None, kv, pw, tables, seq, 45, 12, None, None))):
        real = op(*args)
        with FakeTensorMode() as mode:
            fake = op(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])
        assert (fake.shape, fake.dtype) == (real.shape, real.dtype)
        torch.library.opcheck(op, args, test_utils=("test_faketensor", "test_aot_dispatch_dynamic"))
