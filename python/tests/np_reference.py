"""numpy float64 references of msa's semantics (docs/semantics.md: Block scores, Top-K
selection, Attention) and random varlen problems, for the CPU pytest suite. Written from the
semantics, independent of the C++ code."""

import numpy as np


def check_attention(out, lse, want_out, want_lse, tol=1e-2):
    """out within `tol` relative L2 of the reference (every element finite), lse -inf exactly
    where the reference's is and within 2e-3 elsewhere (docs/semantics.md, Numerics)."""
    out = np.asarray(out, dtype=np.float64)
    assert np.isfinite(out).all()
    err = np.linalg.norm(out - want_out) / max(np.linalg.norm(want_out), 1e-30)
    assert err < tol, f"relative L2 error {err}"
    lse = np.asarray(lse)
    assert np.array_equal(np.isneginf(lse), np.isneginf(want_lse))
    finite = np.isfinite(want_lse)
    assert np.abs(lse[finite] - want_lse[finite]).max(initial=0) < 2e-3


def cu_from_lengths(lengths):
    return np.array([0] + list(np.cumsum(lengths)), dtype=np.int32)


def visible_mask(lq, lk, causal):
    """[lq, lk] bool: query i sees key j iff j <= i + lk - lq (bottom-right causal)."""
    i = np.arange(lq)[:, None]
    j = np.arange(lk)[None, :]
    return (j <= i + lk - lq) if causal else np.ones((lq, lk), bool)


def attention(q, ks, vs, cu_q, *, q2k=None, blk=128, causal=True, scale=None, temperature=None,
              causal_offset=None, key_mask=None, mask_per_query=False, soft_cap=None):
    """out [total_q, Hq, D], lse / tlse [Hq, total_q] from float64 q and per-batch ks/vs
    ([Lk_b, Hkv, D] each); q2k [Hkv, total_q, topk] restricts keys to the selected blocks.
    Dense attention's rules (docs/semantics.md): causal_offset [B] replaces the bottom-right
    offset, key_mask [B or total_q, Lk_max] (nonzero = visible) ANDs with it, soft_cap c > 0
    caps the scores c * tanh(s / c)."""
    total_q, hq, d = q.shape
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    out = np.zeros((total_q, hq, d))
    lse = np.full((hq, total_q), -np.inf)
    tlse = np.full((hq, total_q), -np.inf)
    for b in range(len(cu_q) - 1):
        t0, lq = cu_q[b], cu_q[b + 1] - cu_q[b]
        k, v = ks[b], vs[b]
        lk = k.shape[0]
        if lq == 0:
            continue
        hkv = k.shape[1] if lk else 1
        g = hq // hkv
        if causal_offset is None:
            base = visible_mask(lq, lk, causal)
        else:
            i, j = np.arange(lq)[:, None], np.arange(lk)[None, :]
            base = j <= i + int(causal_offset[b])
        if key_mask is not None:
            rows = key_mask[t0:t0 + lq, :lk] if mask_per_query else key_mask[b:b + 1, :lk]
            base = base & (np.asarray(rows) != 0)
        for h in range(hq):
            kh = h // g
            mask = base.copy()
            if q2k is not None:
                sel = np.zeros((lq, (lk + blk - 1) // blk + 1), bool)
                ids = q2k[kh, t0:t0 + lq]
                for i in range(lq):
                    sel[i, ids[i][ids[i] >= 0]] = True
                mask &= sel[:, np.arange(lk) // blk]
            s = scale * (q[t0:t0 + lq, h] @ k[:, kh].T) if lk else np.zeros((lq, 0))
            if soft_cap:
                s = soft_cap * np.tanh(s / soft_cap)
            s = np.where(mask, s, -np.inf)
            for i in range(lq):
                if not mask[i].any():
                    continue
                m = s[i].max()
                p = np.exp(s[i] - m)
                out[t0 + i, h] = p @ v[:, kh] / p.sum()
                lse[h, t0 + i] = m + np.log(p.sum())
                if temperature:
                    st = s[i] / temperature
                    mt = st.max()
                    tlse[h, t0 + i] = mt + np.log(np.exp(st - mt).sum())
    return out, lse, tlse


def block_scores(q, ks, cu_q, *, blk=128, causal=True, nblk_max=None):
    """scores [Hq, nblk_max, total_q]: max over visible keys of each block of dot(q, k)."""
    total_q, hq, _ = q.shape
    nblk = [(k.shape[0] + blk - 1) // blk for k in ks]
    nblk_max = max(nblk, default=0) if nblk_max is None else nblk_max
    scores = np.full((hq, nblk_max, total_q), -np.inf)
    for b in range(len(cu_q) - 1):
        t0, lq = cu_q[b], cu_q[b + 1] - cu_q[b]
        k = ks[b]
        lk = k.shape[0]
        if lq == 0 or lk == 0:
            continue
        g = hq // k.shape[1]
        mask = visible_mask(lq, lk, causal)
        for h in range(hq):
            s = np.where(mask, q[t0:t0 + lq, h] @ k[:, h // g].T, -np.inf)
            for kb in range(nblk[b]):
                scores[h, kb, t0:t0 + lq] = s[:, kb * blk:(kb + 1) * blk].max(axis=1)
    return scores


def select_topk(scores, cu_q, lengths_k, *, hkv, topk, sink=1, local=1, blk=128, causal=True):
    """q2k [Hkv, total_q, topk] from given scores, following docs/semantics.md, Top-K selection."""
    hq, _, total_q = scores.shape
    g = hq // hkv
    q2k = np.full((hkv, total_q, topk), -1, np.int32)
    for b in range(len(cu_q) - 1):
        t0, lq, lk = cu_q[b], cu_q[b + 1] - cu_q[b], lengths_k[b]
        for i in range(lq):
            last = i + lk - lq if causal else lk - 1
            last = min(last, lk - 1)
            if last < 0:
                continue
            nvis = last // blk + 1
            for h in range(hkv):
                s = scores[h * g:(h + 1) * g, :nvis, t0 + i].max(axis=0)
                chosen = [kb for kb in range(min(sink, nvis))]
                chosen += [kb for kb in range(nvis - local, nvis) if kb >= 0]
                chosen = list(dict.fromkeys(chosen))[:topk]
                rest = sorted((kb for kb in range(nvis) if kb not in chosen),
                              key=lambda kb: (-s[kb], kb))
                chosen += rest[:topk - len(chosen)]
                chosen.sort()
                q2k[h, t0 + i, :len(chosen)] = chosen
    return q2k


def problem(rng, lengths_q, lengths_k, hq, hkv, d, dtype=np.float16):
    """Random q [total_q, Hq, D] and per-batch / concatenated K and V of `dtype`."""
    cu_q, cu_k = cu_from_lengths(lengths_q), cu_from_lengths(lengths_k)
    q = rng.standard_normal((cu_q[-1], hq, d)).astype(dtype)
    k = rng.standard_normal((cu_k[-1], hkv, d)).astype(dtype)
    v = rng.standard_normal((cu_k[-1], hkv, d)).astype(dtype)
    return q, k, v, cu_q, cu_k


def split(x, cu):
    """Per-batch float64 slices of a flat [total, H, D] array."""
    x = np.asarray(x, dtype=np.float64)
    return [x[cu[b]:cu[b + 1]] for b in range(len(cu) - 1)]


def scatter_pages(k, v, cu_k, pages, perm, page_size, k_pool, v_pool, table):
    """Copies request b's keys and values, page_size rows at a time, into the next pool pages of
    perm and records them in table [B, max_pages]; numpy and torch arrays alike (torch_reference
    builds its pools with it too)."""
    n = 0
    for b in range(len(pages)):
        for p in range(pages[b]):
            pid = perm[n]
            n += 1
            table[b, p] = pid
            lo = cu_k[b] + p * page_size
            hi = min(lo + page_size, cu_k[b + 1])
            k_pool[pid, :hi - lo] = k[lo:hi]
            v_pool[pid, :hi - lo] = v[lo:hi]


def to_pages(rng, k, v, cu_k, page_size, layout="paged_nhd", spare_pages=3):
    """Scatters flat K/V into shuffled NaN-filled page pools; returns (k_pages, v_pages,
    page_table [B, max_pages], seqused_k [B])."""
    lengths = np.diff(cu_k)
    b = len(lengths)
    pages = [(int(lk) + page_size - 1) // page_size for lk in lengths]
    max_pages = max(pages + [1])
    num_pages = sum(pages) + spare_pages
    perm = rng.permutation(num_pages).astype(np.int32)
    table = np.zeros((b, max_pages), np.int32)
    hkv, d = k.shape[1], k.shape[2]
    pool_shape = (num_pages, page_size, hkv, d)
    kp = np.full(pool_shape, np.nan, dtype=k.dtype)
    vp = np.full(pool_shape, np.nan, dtype=v.dtype)
    scatter_pages(k, v, cu_k, pages, perm, page_size, kp, vp, table)
    if layout == "paged_hnd":
        kp = np.ascontiguousarray(kp.transpose(0, 2, 1, 3))
        vp = np.ascontiguousarray(vp.transpose(0, 2, 1, 3))
    return kp, vp, table, lengths.astype(np.int32)


# Block-sparse (BSR) masks: FlashInfer's matrix and its element mask.

def random_blocks(rng, shape, density):
    """A random bool block pattern with some rows left empty."""
    blocks = rng.random(shape) < density
    blocks[..., rng.random(shape[:-1]) < 0.2, :] = False
    return blocks


def to_bsr(blocks, rng=None):
    """bool [MB, NB] -> (indptr int32 [MB+1], indices int32 [nnz]); columns of each row in a
    random order when rng is given (FlashInfer does not ask for sorted rows)."""
    indptr, indices = [0], []
    for row in blocks:
        cols = list(np.flatnonzero(row))
        if rng is not None:
            rng.shuffle(cols)
        indices += cols
        indptr.append(len(indices))
    return np.array(indptr, np.int32), np.array(indices, np.int32)


def per_head_bsr(blocks, rng=None):
    """bool [H, MB, NB] -> (indptr int32 [H, MB+1], indices int32 [H, L]): one matrix per head,
    head h's entries first, -1 after."""
    mats = [to_bsr(b, rng) for b in blocks]
    indptr = np.stack([m[0] for m in mats])
    indices = np.full((len(mats), max(len(m[1]) for m in mats)), -1, np.int32)
    for h, m in enumerate(mats):
        indices[h, :len(m[1])] = m[1]
    return indptr, indices


def block_elements(blocks, rows, cols, num_q, num_kv, lens=None):
    """The element mask [num_q, num_kv] of a block pattern [MB, NB] over blocks of rows x cols:
    query t sees key j iff block (t // rows, j // cols) is listed (and j's place in its block
    is below kv_block_lens)."""
    t, j = np.arange(num_q), np.arange(num_kv)
    m = blocks[t // rows][:, j // cols]
    if lens is not None:
        m &= (j % cols < np.asarray(lens)[j // cols])[None, :]
    return m


def masked_attention(q, k, v, mask, scale=None):
    """float64 softmax attention of q [T, Hq, D] over k, v [N, Hkv, D] where query t of head hq
    sees key j iff mask[hq, t, j] (scores times scale, default 1/sqrt(D)); rows without keys
    give 0."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    hq, hkv = q.shape[1], k.shape[1]
    out = np.zeros(q.shape)
    scale = 1.0 / np.sqrt(q.shape[2]) if scale is None else scale
    for h in range(hq):
        s = q[:, h] @ k[:, h // (hq // hkv)].T * scale
        s = np.where(mask[h], s, -np.inf)
        has = mask[h].any(1)
        p = np.exp(s[has] - s[has].max(1, keepdims=True))
        out[has, h] = (p / p.sum(1, keepdims=True)) @ v[:, h // (hq // hkv)]
    return out


# Variable blocks: per kv head, row sizes, column sizes and a block mask.

def random_sizes(rng, total, n):
    """n non-negative sizes summing to total, zeros included (random cut points)."""
    cuts = np.sort(rng.integers(0, total + 1, n - 1))
    return np.diff(np.concatenate([[0], cuts, [total]])).astype(np.int32)


def varblock_elements(mask, rows, cols):
    """The element mask [sum(rows), sum(cols)] of one kv head: query t in row block i sees key
    j in column block c iff mask[i, c]."""
    t_row = np.repeat(np.arange(len(rows)), rows)
    j_col = np.repeat(np.arange(len(cols)), cols)
    return np.asarray(mask, bool)[t_row][:, j_col]
