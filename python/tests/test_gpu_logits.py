# GPU tests of msa.mqa_logits and msa.paged_mqa_logits with torch tensors: the CUDA result
# against the CPU one on the same bits (the CPU reference computes in float64), -inf where the
# CPU has it, and the device-side checks raising MsaError through check=True.
import pytest

import msa
from gpu_env import require_gpu

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


@pytest.mark.parametrize("t_rows,s_keys,heads", [(37, 300, 64), (64, 1000, 32), (9, 130, 128)])
def test_ragged_matches_cpu(t_rows, s_keys, heads):
    gen = torch.Generator().manual_seed(t_rows)
    q, k = _e4m3(gen, t_rows, heads, 128), _e4m3(gen, s_keys, 128)
    scale = torch.rand(s_keys, generator=gen) + 0.5
    w = torch.rand(t_rows, heads, generator=gen) * 2 - 1
    ks = torch.randint(0, s_keys // 2, (t_rows,), generator=gen, dtype=torch.int32)
    ke = torch.minimum(ks + torch.randint(0, s_keys, (t_rows,), generator=gen, dtype=torch.int32),
                       torch.tensor(s_keys, dtype=torch.int32))
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
