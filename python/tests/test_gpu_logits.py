# GPU tests of msa.mqa_logits, msa.paged_mqa_logits and msa.token_topk with torch tensors: the
# CUDA result against the CPU one on the same bits (the CPU reference computes in float64; the
# token top-K ids are equal), -inf where the CPU has it, the device-side checks raising MsaError
# through check=True, and the custom ops: torch.compile(fullgraph=True) equal to the eager call,
# and a compiled call captured in a CUDA graph whose replay over new inputs equals the eager call
# on them.
import pytest

import msa
from gpu_env import gpu_op, require_gpu

torch = require_gpu()
E4M3 = torch.float8_e4m3fn


def _e4m3(gen, *shape):
    """Random e4m3 values of N(0, 1), as a CPU tensor."""
    return torch.randn(*shape, generator=gen).to(E4M3)


def _same(got, want):
    """NaN / -inf at the same places and the finite values within 1e-3 relative L2."""
    got, want = got.cpu(), want.cpu()
    assert torch.equal(torch.isneginf(got), torch.isneginf(want))
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got))
    err = (got[finite].double() - want[finite].double()).norm() / want[finite].double().norm()
    assert err <= 1e-3, err


def _ragged(gen, t_rows, s_keys, heads):
    """CPU tensors q, k, weights, ks, ke, k_scale of a ragged problem with D = 128."""
    q, k = _e4m3(gen, t_rows, heads, 128), _e4m3(gen, s_keys, 128)
    scale = torch.rand(s_keys, generator=gen) + 0.5
    w = torch.rand(t_rows, heads, generator=gen) * 2 - 1
    ks = torch.randint(0, s_keys // 2, (t_rows,), generator=gen, dtype=torch.int32)
    ke = torch.minimum(ks + torch.randint(0, s_keys, (t_rows,), generator=gen, dtype=torch.int32),
                       torch.tensor(s_keys, dtype=torch.int32))
    return q, k, w, ks, ke, scale


@pytest.mark.parametrize("t_rows,s_keys,heads", [(37, 300, 64), (64, 1000, 32), (9, 130, 128)])
def test_ragged_matches_cpu(t_rows, s_keys, heads):
    gen = torch.Generator().manual_seed(t_rows)
    q, k, w, ks, ke, scale = _ragged(gen, t_rows, s_keys, heads)
    want = msa.mqa_logits(q, k, w, ks, ke, k_scale=scale)
    dev = [x.cuda() for x in (q, k, w, ks, ke, scale)]
    got = msa.mqa_logits(*dev[:5], k_scale=dev[5], check=True)
    assert got.device.type == "cuda" and got.dtype == torch.float32
    _same(got, want)


def _pool(gen, lens, bs):
    """Seed 001's fused pool for requests of `lens` keys: shuffled blocks, block tables."""
    blocks = sum((n + bs - 1) // bs for n in lens) + 1
    pool = torch.zeros(blocks, bs, 1, 132, dtype=torch.uint8)
    vals = _e4m3(gen, blocks, bs, 128).view(torch.uint8)
    scales = (torch.rand(blocks, bs, generator=gen) + 0.5).contiguous()
    flat = pool.view(blocks, bs * 132)
    flat[:, : bs * 128] = vals.reshape(blocks, bs * 128)
    flat[:, bs * 128:] = scales.view(torch.uint8).reshape(blocks, bs * 4)
    order = torch.randperm(blocks, generator=gen)
    width = max((n + bs - 1) // bs for n in lens) + 1
    tables = torch.full((len(lens), width), -1, dtype=torch.int32)
    nxt = 0
    for b, n in enumerate(lens):
        for c in range((n + bs - 1) // bs):
            tables[b, c] = int(order[nxt])
            nxt += 1
    return pool, tables


@pytest.mark.parametrize("next_n,heads,bs", [(2, 64, 64), (1, 64, 128), (4, 32, 32)])
def test_paged_matches_cpu(next_n, heads, bs):
    gen = torch.Generator().manual_seed(next_n * 100 + heads)
    lens = [700, 0, 129, 64]
    pool, tables = _pool(gen, lens, bs)
    q = _e4m3(gen, len(lens), next_n, heads, 128)
    w = torch.rand(len(lens) * next_n, heads, generator=gen) * 2 - 1
    seq = torch.tensor(lens, dtype=torch.int32)
    max_len = max(lens) + 5
    want = msa.paged_mqa_logits(q, pool, w, tables, seq, max_len)
    got = msa.paged_mqa_logits(q.cuda(), pool.cuda(), w.cuda(), tables.cuda(), seq.cuda(),
                               max_len, check=True)
    _same(got, want)


def test_device_checks_raise():
    gen = torch.Generator().manual_seed(3)
    pool, tables = _pool(gen, [200], 64)
    q = _e4m3(gen, 1, 1, 64, 128)
    w = torch.rand(1, 64, generator=gen)
    seq = torch.tensor([300], dtype=torch.int32)  # past max_seq_len
    with pytest.raises(msa.MsaError, match="seq_lens: entry 0 = 300"):
        msa.paged_mqa_logits(q.cuda(), pool.cuda(), w.cuda(), tables.cuda(), seq.cuda(), 200,
                             check=True)


def _bits_equal(a, b):
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


def _capture(fn, static):
    """fn(*static) captured in a CUDA graph after warm-up calls on a side stream: the graph and
    the outputs its replays write."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = fn(*static)
    return graph, outs


def _replay_equals_eager(run, static, fresh):
    """torch.compile(run, fullgraph=True) equals run; its CUDA graph replayed over `fresh`
    (copied into `static`) equals run(*fresh)."""
    with gpu_op():
        eager = run(*static)  # also makes the device's status buffer before capture
    compiled = torch.compile(run, fullgraph=True)
    assert _bits_equal(compiled(*static), eager)
    graph, captured = _capture(compiled, static)
    for dst, src in zip(static, fresh):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    assert _bits_equal(captured, run(*fresh))
    msa.check_status()


def test_ragged_compiles_and_captures():
    gen = torch.Generator().manual_seed(21)
    static = [x.cuda() for x in _ragged(gen, 40, 500, 64)]
    fresh = [x.cuda() for x in _ragged(gen, 40, 500, 64)]

    def run(q, k, w, ks, ke, scale):
        return msa.mqa_logits(q, msa.QTensor(k, scale), w, ks, ke)

    _replay_equals_eager(run, static, fresh)


@pytest.mark.parametrize("next_n,bs", [(1, 64), (2, 32)])
def test_paged_compiles_and_captures(next_n, bs):
    gen = torch.Generator().manual_seed(30 + next_n)
    lens, max_len = [500, 0, 129], 520
    pool, tables = _pool(gen, lens, bs)
    q = _e4m3(gen, len(lens), next_n, 64, 128)
    w = torch.rand(len(lens) * next_n, 64, generator=gen) * 2 - 1
    static = [x.cuda() for x in (q, pool, w, torch.tensor(lens, dtype=torch.int32))]
    # New queries, weights, pool bytes and shorter lengths under the same block tables.
    fresh_pool, _ = _pool(gen, lens, bs)
    fresh_w = torch.rand(w.shape, generator=gen)
    fresh = [x.cuda() for x in (_e4m3(gen, *q.shape), fresh_pool, fresh_w,
                                torch.tensor([300, 0, 64], dtype=torch.int32))]
    tables = tables.cuda()

    def run(q, pool, w, seq):
        return msa.paged_mqa_logits(q, pool, w, tables, seq, max_len)

    _replay_equals_eager(run, static, fresh)


def _topk_rows(gen, rows, cols, kind):
    """CPU logits [rows, cols] f32: N(0, 1), small integers (ties everywhere) or a mix of -inf,
    NaN, -0.0, +0.0 and integers; and causal-like ranges ks, ke."""
    if kind == "normal":
        x = torch.randn(rows, cols, generator=gen)
    else:
        x = torch.randint(0, 6, (rows, cols), generator=gen).float()
    if kind == "special":
        pick = torch.randint(0, 6, (rows, cols), generator=gen)
        x[pick == 0] = float("-inf")
        x[pick == 1] = float("nan")
        x[pick == 2] = -0.0
        x[pick == 3] = 0.0
    ke = torch.clamp((torch.arange(rows) + 1) * cols // rows, max=cols).to(torch.int32)
    ks = (ke // 5).to(torch.int32)
    return x, ks, ke


@pytest.mark.parametrize("rows,cols,topk,kind", [(50, 300, 7, "ints"), (20, 5000, 512, "special"),
                                                 (6, 40000, 2048, "normal"), (9, 100, 64, "normal"),
                                                 (4, 3000, 2048, "ints")])
def test_token_topk_matches_cpu(rows, cols, topk, kind):
    gen = torch.Generator().manual_seed(rows + cols)
    x, ks, ke = _topk_rows(gen, rows, cols, kind)
    for ranges in ((None, None), (ks, ke)):
        want = msa.token_topk(x, topk, ks=ranges[0], ke=ranges[1])
        dev = [None if r is None else r.cuda() for r in ranges]
        got = msa.token_topk(x.cuda(), topk, ks=dev[0], ke=dev[1], check=True)
        assert got.device.type == "cuda" and got.dtype == torch.int32
        assert torch.equal(got.cpu(), want)


def test_token_topk_strided_rows_and_out():
    gen = torch.Generator().manual_seed(40)
    x, _, _ = _topk_rows(gen, 8, 3000, "ints")
    wide = torch.full((8, 3005), float("nan"))
    wide[:, 2:3002] = x
    want = msa.token_topk(wide[:, 2:3002], 100)
    out = torch.full((8, 100), 12345, dtype=torch.int32, device="cuda")
    got = msa.token_topk(wide.cuda()[:, 2:3002], 100, out=out, check=True)
    assert got.data_ptr() == out.data_ptr()
    assert torch.equal(out.cpu(), want)


def test_token_topk_bad_range_raises():
    x = torch.randn(3, 50).cuda()
    ks = torch.tensor([0, 30, 0], dtype=torch.int32).cuda()
    ke = torch.tensor([10, 20, 50], dtype=torch.int32).cuda()
    with pytest.raises(msa.MsaError, match="ks, ke: row 1 must satisfy"):
        msa.token_topk(x, 4, ks=ks, ke=ke, check=True)


def test_logits_then_token_topk_compiles_and_captures():
    gen = torch.Generator().manual_seed(41)
    static = [x.cuda() for x in _ragged(gen, 40, 3000, 64)]
    fresh = [x.cuda() for x in _ragged(gen, 40, 3000, 64)]

    def run(q, k, w, ks, ke, scale):
        logits = msa.mqa_logits(q, msa.QTensor(k, scale), w, ks, ke)
        return msa.token_topk(logits, 256, ks=ks, ke=ke)

    _replay_equals_eager(run, static, fresh)


def test_logits_topk_equals_the_two_steps_and_captures():
    """mqa_logits_topk on the GPU: the two steps' ids with its own workspace (allocated from
    torch) and with one of two rows; a bad range in a later chunk names its row; compiled and
    captured, a replay over new inputs equals the eager call."""
    gen = torch.Generator().manual_seed(43)
    q, k, w, ks, ke, scale = [x.cuda() for x in _ragged(gen, 300, 2000, 64)]
    logits = msa.mqa_logits(q, msa.QTensor(k, scale), w, ks, ke)
    want = msa.token_topk(logits, 128, ks=ks, ke=ke)
    got = msa.mqa_logits_topk(q, k, w, ks, ke, 128, k_scale=scale, check=True)
    assert torch.equal(got, want)
    ws = torch.empty(2 * 2000 * 4, dtype=torch.uint8, device="cuda")
    assert torch.equal(msa.mqa_logits_topk(q, k, w, ks, ke, 128, k_scale=scale, workspace=ws), want)
    bad_ks, bad_ke = ks.clone(), ke.clone()
    bad_ks[251], bad_ke[251] = 9, 4
    with pytest.raises(msa.MsaError, match="ks, ke: row 251 must satisfy"):
        msa.mqa_logits_topk(q, k, w, bad_ks, bad_ke, 128, k_scale=scale, workspace=ws, check=True)
    static = [x.cuda() for x in _ragged(gen, 40, 3000, 64)]
    fresh = [x.cuda() for x in _ragged(gen, 40, 3000, 64)]

    def run(q, k, w, ks, ke, scale):
        return msa.mqa_logits_topk(q, msa.QTensor(k, scale), w, ks, ke, 256)

    _replay_equals_eager(run, static, fresh)
