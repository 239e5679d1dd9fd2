# GPU tests of the SDSA indexer (msa.indexer_scores, indexer_threshold_select,
# top_k_from_candidates, gather_key_sample, thresholds_from_sample,
# quantize_write_index_qk_nvfp4) with torch CUDA tensors: every step of the sampled pipeline
# equal to the CPU's on the same bits (scores and thresholds bitwise, counts, ids and row_status
# exactly), NVFP4 writes byte for byte, and a device-side value error raised through check=True.
import pytest

import msa
from gpu_env import require_gpu

torch = require_gpu()


def _cache(gen, seq_lens, page_size, dim):
    """A bf16 pool with shuffled pages and NaN in the slots no length covers, its block table."""
    pages = [(n + page_size - 1) // page_size for n in seq_lens]
    num_pages = sum(pages) + 2
    order = torch.randperm(num_pages, generator=gen).to(torch.int32)
    table = torch.full((len(seq_lens), max(pages) + 1), num_pages + 7, dtype=torch.int32)
    pool = torch.full((num_pages, page_size, dim), float("nan"))
    used = 0
    for b, n in enumerate(seq_lens):
        table[b, :pages[b]] = order[used:used + pages[b]]
        used += pages[b]
        for j in range(n):
            pool[table[b, j // page_size], j % page_size] = torch.randn(dim, generator=gen)
    return pool.to(torch.bfloat16), table, torch.tensor(seq_lens, dtype=torch.int32)


def _pipeline(query, key_cache, table, lens, requests, topk, stride, max_len, samples, **kw):
    """Every step of the sampled selection; returns each step's outputs."""
    scores = msa.indexer_scores(query, key_cache, table, lens, requests, max_len=max_len, **kw)
    sample, sample_lens = msa.gather_key_sample(key_cache, table, lens, stride,
                                                max_samples=samples)
    sample_table = torch.arange(len(lens), dtype=torch.int32, device=lens.device)[:, None]
    sample_scores = msa.indexer_scores(query, sample, sample_table, sample_lens, requests,
                                       max_len=samples, **kw)
    thresholds, counts = msa.thresholds_from_sample(sample_scores, topk, stride, oversample=2.0)
    cand, ties, counts = msa.indexer_threshold_select(query, key_cache, table, lens, requests,
                                                      thresholds, counts, capacity=6 * topk,
                                                      tie_capacity=2 * topk, **kw)
    ids, status = msa.top_k_from_candidates(cand, ties, counts, topk)
    return scores, sample_lens, sample_scores, thresholds, counts, ids, status


@pytest.mark.parametrize("nvfp4", [False, True])
@pytest.mark.parametrize("page_size", [16, 64])
def test_pipeline_equals_cpu(nvfp4, page_size):
    gen = torch.Generator().manual_seed(page_size + nvfp4)
    seq_lens = [700, 0, 57, 1500]
    pool, table, lens = _cache(gen, seq_lens, page_size, 64)
    requests = torch.tensor([0, 3, 2, 1, 3, 0], dtype=torch.int32)
    query = torch.randn(6, 64, generator=gen).to(torch.bfloat16)
    key_cache = pool
    if nvfp4:
        slots = torch.cat([table[b, torch.arange(n) // page_size] * page_size +
                           torch.arange(n) % page_size for b, n in enumerate(seq_lens)])
        src = pool.reshape(-1, 64)[slots.long()].float()
        key_cache = msa.QTensor(torch.zeros(pool.shape[0], page_size, 32, dtype=torch.uint8),
                                torch.zeros(pool.shape[0], page_size, 4, dtype=torch.uint8),
                                0.3137, "nvfp4")
        msa.quantize_write_index_qk_nvfp4(src, slots.to(torch.int32), key_cache)
    want = _pipeline(query, key_cache, table, lens, requests, 32, 4, 1500, 400)
    dev = (lambda x: x.cuda())
    dcache = msa.QTensor(dev(key_cache.values), dev(key_cache.scale), key_cache.global_scale,
                         "nvfp4") if nvfp4 else dev(key_cache)
    got = _pipeline(dev(query), dcache, dev(table), dev(lens), dev(requests), 32, 4, 1500, 400,
                    check=True)
    names = ["scores", "sample_lens", "sample_scores", "thresholds", "counts", "ids", "status"]
    for name, g, w in zip(names, got, want):
        g, w = g.cpu(), w.cpu()
        if g.dtype == torch.float32:  # bitwise: NaN and -inf included
            g, w = g.view(torch.int32), w.view(torch.int32)
        assert torch.equal(g, w), name
    assert (want[-1] == 0).sum() >= 4


def test_quantize_write_equals_cpu():
    gen = torch.Generator().manual_seed(9)
    key = torch.randn(20, 64, generator=gen) * 3
    query = torch.randn(5, 64, generator=gen)
    slots = torch.randperm(48, generator=gen)[:20].to(torch.int32)
    slots[::4] = -1

    def write(device):
        cache = msa.QTensor(torch.zeros(3, 16, 32, dtype=torch.uint8, device=device),
                            torch.zeros(3, 16, 4, dtype=torch.uint8, device=device), 0.37, "nvfp4")
        q = msa.quantize_write_index_qk_nvfp4(key.to(device), slots.to(device), cache,
                                              query.to(device), query_global_scale=0.5)
        return [x.cpu() for x in (cache.values, cache.scale, q.values, q.scale)]

    # As bytes: torch has no equal() for its packed FP4 (or every FP8) dtype.
    for g, w in zip(write("cuda"), write("cpu")):
        assert torch.equal(g.view(torch.uint8), w.view(torch.uint8))


def test_device_value_error_raises_with_check():
    gen = torch.Generator().manual_seed(2)
    pool, table, lens = _cache(gen, [40], 16, 32)
    query = torch.randn(2, 32, generator=gen).to(torch.bfloat16).cuda()
    bad = torch.tensor([0, 3], dtype=torch.int32).cuda()  # request 3 of B = 1
    with pytest.raises(msa.MsaError, match="row_requests: row 1 names request 3"):
        msa.indexer_scores(query, pool.cuda(), table.cuda(), lens.cuda(), bad, max_len=40,
                           check=True)
