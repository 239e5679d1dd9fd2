"""torch references of msa's semantics (docs/semantics.md: Block scores, Top-K selection, k2q
CSR, Attention, Quantized formats) for the torch/GPU tests: fp32 math on the rounded inputs,
written from the semantics (not msa's C++ CPU backend), plus random varlen problems, random valid
q2k selections and paged-cache builders."""

import math

import pytest

from np_reference import scatter_pages

# Importing this module from a test file skips that file when torch is absent.
torch = pytest.importorskip("torch", reason="the torch tests need torch")


def cu_from_lengths(lengths, device):
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()),
                        dtype=torch.int32, device=device)


def visible(lq, lk, causal, device):
    """[lq, lk] bool: query i sees key j iff j <= i + lk - lq (bottom-right causal)."""
    i = torch.arange(lq, device=device)[:, None]
    j = torch.arange(lk, device=device)[None, :]
    return (j <= i + lk - lq) if causal else torch.ones(lq, lk, dtype=torch.bool, device=device)


def _block_mask(q2k_b, lk, blk):
    """[Hkv, lq, lk] bool from q2k rows [Hkv, lq, topk] (-1 = empty slot)."""
    hkv, lq, _ = q2k_b.shape
    nblk = (lk + blk - 1) // blk
    sel = torch.zeros(hkv, lq, nblk + 1, dtype=torch.bool, device=q2k_b.device)
    ids = torch.where(q2k_b >= 0, q2k_b, torch.full_like(q2k_b, nblk)).long()
    sel.scatter_(2, ids, True)
    return sel[:, :, torch.arange(lk, device=q2k_b.device) // blk]


def attention(q, k, v, cu_q, cu_k, *, q2k=None, blk=128, causal=True, scale=None,
              temperature=None):
    """(out [total_q, Hq, D] f32, lse [Hq, total_q], tlse [Hq, total_q]) for flat k, v."""
    total_q, hq, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = torch.zeros(total_q, hq, d, device=q.device)
    lse = torch.full((hq, total_q), -math.inf, device=q.device)
    tlse = torch.full((hq, total_q), -math.inf, device=q.device)
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cq) - 1):
        t0, t1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        lq, lk = t1 - t0, k1 - k0
        if lq == 0 or lk == 0:
            continue
        g = hq // k.shape[1]
        kb = k[k0:k1].float().repeat_interleave(g, dim=1)
        vb = v[k0:k1].float().repeat_interleave(g, dim=1)
        s = scale * torch.einsum("qhd,khd->hqk", q[t0:t1].float(), kb)
        mask = visible(lq, lk, causal, q.device)[None].expand(hq, lq, lk)
        if q2k is not None:
            mask = mask & _block_mask(q2k[:, t0:t1], lk, blk).repeat_interleave(g, dim=0)
        s = s.masked_fill(~mask, -math.inf)
        m = torch.logsumexp(s, dim=-1)
        p = torch.where(mask, torch.exp(s - m[..., None]), torch.zeros_like(s))
        out[t0:t1] = torch.einsum("hqk,khd->qhd", p, vb)
        lse[:, t0:t1] = m
        if temperature:
            tlse[:, t0:t1] = torch.logsumexp(s / temperature, dim=-1)
    return out, lse, tlse


def block_scores(q, k, cu_q, cu_k, *, blk=128, causal=True, nblk_max=None):
    """[Hq, nblk_max, total_q] f32: max over the visible keys of each block of dot(q, k)."""
    total_q, hq, _ = q.shape
    cq, ck = cu_q.tolist(), cu_k.tolist()
    lengths = [ck[b + 1] - ck[b] for b in range(len(ck) - 1)]
    nblk_max = max(((lk + blk - 1) // blk for lk in lengths), default=0) \
        if nblk_max is None else nblk_max
    scores = torch.full((hq, nblk_max, total_q), -math.inf, device=q.device)
    for b, lk in enumerate(lengths):
        t0, t1 = cq[b], cq[b + 1]
        lq = t1 - t0
        if lq == 0 or lk == 0:
            continue
        g = hq // k.shape[1]
        kb = k[ck[b]:ck[b + 1]].float().repeat_interleave(g, dim=1)
        s = torch.einsum("qhd,khd->hqk", q[t0:t1].float(), kb)
        s = s.masked_fill(~visible(lq, lk, causal, q.device), -math.inf)
        nblk = (lk + blk - 1) // blk
        s = torch.nn.functional.pad(s, (0, nblk * blk - lk), value=-math.inf)
        scores[:, :nblk, t0:t1] = s.view(hq, lq, nblk, blk).amax(-1).permute(0, 2, 1)
    return scores


def select_topk(scores, cu_q, lengths_k, *, hkv, topk, sink=1, local=1, blk=128, causal=True):
    """q2k [Hkv, total_q, topk] int32 from given scores (docs/semantics.md, Top-K selection)."""
    hq, nmax, total_q = scores.shape
    dev = scores.device
    group = scores.view(hkv, hq // hkv, nmax, total_q).amax(1).double()
    q2k = torch.full((hkv, total_q, topk), -1, dtype=torch.int32, device=dev)
    cq = cu_q.tolist()
    kb = torch.arange(nmax, device=dev)
    for b, lk in enumerate(lengths_k):
        t0, lq = cq[b], cq[b + 1] - cq[b]
        if lq == 0:
            continue
        i = torch.arange(lq, device=dev)
        last = (i + lk - lq) if causal else torch.full_like(i, lk - 1)
        last = last.clamp(max=lk - 1)
        nvis = torch.where(last >= 0, last // blk + 1, torch.zeros_like(last))
        vis = kb[None, :] < nvis[:, None]
        forced = vis & ((kb[None, :] < sink) | (kb[None, :] >= nvis[:, None] - local))
        pri = group[:, :, t0:t0 + lq].permute(0, 2, 1)
        pri = torch.where(forced, math.inf, pri)
        pri = torch.where(vis, pri, -math.inf)
        # Stable sort on ids already ascending: equal priorities keep the lower id first.
        order = torch.sort(-pri, dim=-1, stable=True).indices[..., :topk]
        count = torch.clamp(nvis, max=topk)
        slot = torch.arange(order.shape[-1], device=dev)
        big = torch.full_like(order, 1 << 30)
        chosen = torch.where(slot[None, None, :] < count[None, :, None], order, big)
        chosen = torch.sort(chosen, dim=-1).values
        chosen = torch.where(chosen == (1 << 30), torch.full_like(chosen, -1), chosen)
        q2k[:, t0:t0 + lq, :chosen.shape[-1]] = chosen.int()
    return q2k


def k2q_csr(q2k, cu_q, lengths_k, blk):
    """(row_ptr [Hkv, total_rows + 1], q_idx rows) as lists of per-head tensors: each row's
    batch-local query ids ascending (docs/semantics.md, k2q CSR)."""
    hkv, total_q, _ = q2k.shape
    dev = q2k.device
    nblk = [(lk + blk - 1) // blk for lk in lengths_k]
    rowoff = torch.tensor([0] + nblk, device=dev).cumsum(0)
    total_rows = int(rowoff[-1])
    cq = cu_q.long()
    batch_of = torch.searchsorted(cq[1:], torch.arange(total_q, device=dev), right=True)
    local = torch.arange(total_q, device=dev) - cq[batch_of]
    row_ptr, q_idx = [], []
    for h in range(hkv):
        ids = q2k[h].long()
        valid = ids >= 0
        rows = (rowoff[batch_of][:, None] + ids)[valid]
        qs = local[:, None].expand_as(ids)[valid]
        order = torch.argsort(rows * total_q + qs)
        counts = torch.bincount(rows, minlength=total_rows)
        row_ptr.append(torch.cat([counts.new_zeros(1), counts.cumsum(0)]).int())
        q_idx.append(qs[order].int())
    return torch.stack(row_ptr), q_idx


def random_problem(gen, lengths_q, lengths_k, hq, hkv, d, dtype, device):
    cu_q, cu_k = cu_from_lengths(lengths_q, device), cu_from_lengths(lengths_k, device)
    tq, tk = int(cu_q[-1]), int(cu_k[-1])
    q = torch.randn(tq, hq, d, generator=gen).to(dtype=dtype, device=device)
    k = torch.randn(tk, hkv, d, generator=gen).to(dtype=dtype, device=device)
    v = torch.randn(tk, hkv, d, generator=gen).to(dtype=dtype, device=device)
    return q, k, v, cu_q, cu_k


def integer_problem(gen, lengths_q, lengths_k, hq, hkv, d, dtype, device):
    """q, k, cu_q, cu_k with values in {-2, ..., 2}: every dot product (at most 4 d in magnitude)
    is exact in bf16/f16 inputs and f32 sums, so block scores are exact and tie exactly, and
    a selection must match the reference's tie rule (toward the lower id) bit for bit."""
    cu_q, cu_k = cu_from_lengths(lengths_q, device), cu_from_lengths(lengths_k, device)
    tq, tk = int(cu_q[-1]), int(cu_k[-1])
    q = torch.randint(-2, 3, (tq, hq, d), generator=gen).to(dtype=dtype, device=device)
    k = torch.randint(-2, 3, (tk, hkv, d), generator=gen).to(dtype=dtype, device=device)
    return q, k, cu_q, cu_k


def random_q2k(gen, cu_q, lengths_k, hkv, topk, blk):
    """Valid random selections: distinct ids in [0, nblk_b), ascending, -1 padded at the end,
    some rows shorter than topk."""
    cq = cu_q.tolist()
    total_q = cq[-1]
    q2k = torch.full((hkv, total_q, topk), -1, dtype=torch.int32)
    for b, lk in enumerate(lengths_k):
        lq = cq[b + 1] - cq[b]
        nblk = (lk + blk - 1) // blk
        if lq == 0 or nblk == 0:
            continue
        n = min(topk, nblk)
        ids = torch.rand(hkv, lq, nblk, generator=gen).argsort(-1)[..., :n]
        keep = torch.rand(hkv, lq, n, generator=gen) < 0.85
        ids = torch.where(keep, ids, torch.full_like(ids, 1 << 30)).sort(-1).values
        ids = torch.where(ids == (1 << 30), torch.full_like(ids, -1), ids)
        q2k[:, cq[b]:cq[b + 1], :n] = ids.int()
    return q2k.to(cu_q.device)


def to_pages(gen, k, v, cu_k, page_size, layout="paged_nhd", spare_pages=3):
    """Scatters flat K/V (bf16, f16 or FP8 e4m3) into shuffled, NaN-filled page pools: (k_pool,
    v_pool, page_table, seqused_k)."""
    ck = cu_k.tolist()
    lengths = [ck[b + 1] - ck[b] for b in range(len(ck) - 1)]
    pages = [(lk + page_size - 1) // page_size for lk in lengths]
    max_pages = max(pages + [1])
    num_pages = sum(pages) + spare_pages
    perm = torch.randperm(num_pages, generator=gen).tolist()
    table = torch.zeros(len(lengths), max_pages, dtype=torch.int32)
    hkv, d = k.shape[1], k.shape[2]
    fp8 = k.dtype == torch.float8_e4m3fn
    if fp8:  # built on the bytes: 0x7f is e4m3's NaN
        k, v = k.view(torch.uint8), v.view(torch.uint8)
    kp = torch.full((num_pages, page_size, hkv, d), 0x7F if fp8 else math.nan, dtype=k.dtype,
                    device=k.device)
    vp = torch.full_like(kp, 0x7F if fp8 else math.nan)
    scatter_pages(k, v, ck, pages, perm, page_size, kp, vp, table)
    if fp8:
        kp, vp = kp.view(torch.float8_e4m3fn), vp.view(torch.float8_e4m3fn)
    if layout == "paged_hnd":
        kp, vp = kp.transpose(1, 2).contiguous(), vp.transpose(1, 2).contiguous()
    seqused = torch.tensor(lengths, dtype=torch.int32, device=k.device)
    return kp, vp, table.to(k.device), seqused


def e2m1_dequant(values, scale, group, scale_kind, global_scale=1.0):
    """f32 [T, H, D] from packed e2m1 values [T, H, D/2] and per-group scales."""
    lut = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6], device=values.device)
    bits = values.view(torch.uint8).long()
    codes = torch.stack([bits & 0xF, bits >> 4], dim=-1).flatten(-2)
    vals = lut[codes & 7] * torch.where(codes >= 8, -1.0, 1.0)
    if scale_kind == "e4m3":
        s = scale.view(torch.float8_e4m3fn).float() * global_scale
    else:
        # 2^(e - 127) built from its bits (exact, unlike exp2): e = 0 is the subnormal 2^-127.
        e = scale.view(torch.uint8).int()
        s = torch.where(e > 0, e << 23, torch.full_like(e, 1 << 22)).view(torch.float32)
    return vals * s.repeat_interleave(group, dim=-1)


def check_close(out, lse, want_out, want_lse, tol=1e-2, lse_tol=2e-3):
    """docs/semantics.md, Numerics: relative L2 of out, max-abs of lse, -inf at the same places."""
    out = out.float()
    assert torch.isfinite(out).all(), "NaN or inf in out"
    err = (out - want_out).norm() / want_out.norm().clamp_min(1e-30)
    assert err < tol, f"relative L2 error {err:.3e}"
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want_lse)), "-inf positions differ"
    finite = torch.isfinite(want_lse)
    if finite.any():
        lerr = (lse[finite] - want_lse[finite]).abs().max()
        assert lerr < lse_tol, f"lse max abs error {lerr:.3e}"
