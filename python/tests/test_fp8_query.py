# FP8 queries (docs/semantics.md, Quantized attention): fp8_e4m3 q with an f32 q_scale per tensor
# [1], per token [total_q] or per token and head [total_q, Hq], over bf16, FP8 or FP4 K/V; out is
# bf16. CPU (numpy and torch): attention_forward and DecodePlan against a float64 reference on the
# dequantized values, a QTensor q equal bit for bit to its values plus q_scale, the errors, and
# torch.compile over both ops. GPU: DecodePlan on CUDA (FP8 q over a paged FP8, bf16 or NVFP4
# cache) against the CPU DecodePlan, and for the sparse cases attention_forward on CUDA too (FP8 q
# over an FP8 pool runs Q K^T in FP8).
import numpy as np
import pytest

import msa
import np_reference as ref

try:
    import torch
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

Q_FORMATS = ["fp8_per_tensor", "fp8_per_token", "fp8_per_token_head"]
Q_SCALE_SHAPES = {"fp8_per_tensor": lambda t, h: (1,), "fp8_per_token": lambda t, h: (t,),
                  "fp8_per_token_head": lambda t, h: (t, h)}
LQ, LK = [3, 1, 2], [150, 40, 300]
HQ, HKV, D, PAGE, BLK = 8, 2, 64, 32, 64


def _ml_dtypes():
    return pytest.importorskip("ml_dtypes", reason="numpy bf16 and FP8 arrays need ml_dtypes")


def _is_torch(x):
    return torch is not None and isinstance(x, torch.Tensor)


def _f64(x):
    """float64 numpy copy of a numpy (ml_dtypes) or torch array."""
    if _is_torch(x):
        return x.detach().cpu().double().numpy()
    return np.asarray(x).astype(np.float64)


def _bits(x):
    """The raw 16-bit elements of a bf16 array, for bitwise comparisons."""
    if _is_torch(x):
        return x.detach().cpu().view(torch.int16).numpy()
    return np.asarray(x).view(np.uint16)


def _rel(got, want):
    return np.linalg.norm(_f64(got) - want) / np.linalg.norm(want)


def _bf16(x, fw):
    """An f32 numpy array as bf16 of framework `fw` ('numpy' or 'torch')."""
    if fw == "torch":
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.bfloat16)
    return x.astype(_ml_dtypes().bfloat16)


def _host(x, fw):
    """An int32 / f32 numpy array in framework `fw`."""
    return torch.from_numpy(np.ascontiguousarray(x)) if fw == "torch" else x


def _problem(seed, lq=LQ, lk=LK, hq=HQ, hkv=HKV, d=D, page=PAGE):
    """f32 numpy q (magnitudes varying by token and head, so the three scale shapes differ), flat
    K/V and NaN-filled page pools of them."""
    rng = np.random.default_rng(seed)
    q, k, v, cu_q, cu_k = ref.problem(rng, lq, lk, hq, hkv, d, np.float32)
    q = q * rng.uniform(0.25, 4.0, (q.shape[0], hq, 1)).astype(np.float32)
    kp, vp, table, seqused = ref.to_pages(rng, k, v, cu_k, page)
    return q, k, v, kp, vp, cu_q, cu_k, table, seqused


def _quantize_q(q, fmt, fw):
    qq = msa.quantize(_host(q, fw) if fw == "torch" else q, fmt)
    assert tuple(qq.scale.shape) == Q_SCALE_SHAPES[fmt](q.shape[0], q.shape[1])
    if fw == "torch":
        assert qq.values.dtype == torch.float8_e4m3fn
    return qq, _f64(msa.dequantize(qq))


def _kv(k, v, kind, fw):
    """K/V [N, Hkv, D] (f32 numpy, NaN allowed for bf16) as `kind` ('bf16', 'fp8': per token and
    head K scales, per token V scales, 'nvfp4') in framework fw, with their float64 values."""
    kb, vb = _bf16(k, fw), _bf16(v, fw)
    if kind == "bf16":
        return kb, vb, _f64(kb), _f64(vb)
    kq = msa.quantize(kb, "fp8_per_token_head" if kind == "fp8" else kind)
    vq = msa.quantize(vb, "fp8_per_token" if kind == "fp8" else kind)
    return kq, vq, _f64(msa.dequantize(kq)), _f64(msa.dequantize(vq))


def _pools(kp, vp, kind, fw):
    """Page pools [pages, page, Hkv, D] as `kind` ('bf16' keeps the NaN of unused slots; 'fp8'
    quantizes per pool slot, 'nvfp4' per 16 values with scale pools of the values' layout, unused
    slots zeroed) and their float64 values."""
    shape = kp.shape
    if kind == "bf16":
        return _kv(kp, vp, kind, fw)
    slots = shape[0] * shape[1]
    flat = [np.nan_to_num(x).reshape(slots, shape[2], shape[3]) for x in (kp, vp)]
    kq, vq, kd, vd = _kv(flat[0], flat[1], kind, fw)
    if kind == "nvfp4":
        kq, vq = (x._replace(values=x.values.reshape(shape[:3] + (-1,)),
                             scale=x.scale.reshape(shape[:3] + (-1,))) for x in (kq, vq))
    else:
        kq, vq = (x._replace(values=x.values.reshape(shape)) for x in (kq, vq))
    return kq, vq, kd.reshape(shape), vd.reshape(shape)


_KV_DTYPE = {"bf16": "bf16", "fp8": "fp8_e4m3", "nvfp4": "fp4x2"}


def _gather(pool, table, seqused, page):
    """Per-request float64 [Lk_b, Hkv, D] keys of an nhd page pool."""
    out = []
    for b, lk in enumerate(seqused):
        pages = table[b, :(lk + page - 1) // page]
        out.append(pool[pages].reshape(-1, pool.shape[2], pool.shape[3])[:lk])
    return out


def _q2k(cu_q, lk, hkv, blk):
    """A valid selection: kv head h of query i picks its last visible block and one before
    it (block 0 for even h)."""
    q2k = np.full((hkv, int(cu_q[-1]), 2), -1, np.int32)
    for b in range(len(lk)):
        lq = int(cu_q[b + 1] - cu_q[b])
        for i in range(lq):
            last = (i + int(lk[b]) - lq) // blk
            for h in range(hkv):
                ids = sorted({0 if h % 2 == 0 else max(last - 1, 0), last})
                q2k[h, cu_q[b] + i, :len(ids)] = ids
    return q2k


def _check(out, lse, want, want_lse, out_tol=1e-2, lse_tol=2e-3):
    assert _rel(out, want) <= out_tol
    assert np.max(np.abs(_f64(lse) - want_lse)) <= lse_tol


# --- CPU: attention_forward ---------------------------------------------------------------------

@pytest.mark.parametrize("fmt", Q_FORMATS)
@pytest.mark.parametrize("kv", ["bf16", "fp8", "nvfp4"])
@pytest.mark.parametrize("sparse", [False, True])
def test_attention_forward_numpy(fmt, kv, sparse):
    ml = _ml_dtypes()
    q, k, v, _, _, cu_q, cu_k, _, _ = _problem(1)
    qq, qd = _quantize_q(q, fmt, "numpy")
    assert qq.values.dtype == ml.float8_e4m3fn
    kk, vv, kd, vd = _kv(k, v, kv, "numpy")
    q2k = _q2k(cu_q, LK, HKV, BLK) if sparse else None
    kw = dict(cu_seqlens_k=cu_k, q2k=q2k, kv_block_size=BLK)
    out, lse = msa.attention_forward(qq, kk, vv, cu_q, return_lse=True, **kw)
    assert out.dtype == ml.bfloat16 and out.shape == q.shape
    want, want_lse, _ = ref.attention(qd, ref.split(kd, cu_k), ref.split(vd, cu_k), cu_q,
                                      q2k=q2k, blk=BLK)
    _check(out, lse, want, want_lse)
    # The QTensor, its values plus q_scale, a uint8 storage view typed as fp8_e4m3, and
    # preallocated bf16 outputs (ml_dtypes or uint16 storage) give the same bits.
    plain = msa.attention_forward(qq.values, kk, vv, cu_q, q_scale=qq.scale, **kw)
    typed = msa.attention_forward(msa.typed(qq.values.view(np.uint8), "fp8_e4m3"), kk, vv, cu_q,
                                  q_scale=qq.scale, **kw)
    assert typed.dtype == ml.bfloat16
    pre_ml = np.empty(q.shape, ml.bfloat16)
    pre_u16 = np.empty(q.shape, np.uint16)
    msa.attention_forward(qq, kk, vv, cu_q, out=pre_ml, **kw)
    msa.attention_forward(qq, kk, vv, cu_q, out=pre_u16, **kw)
    for got in (plain, typed, pre_ml, pre_u16):
        np.testing.assert_array_equal(_bits(got), _bits(out))
    assert msa.attention_workspace_bytes(qq, kk, vv, cu_q, **kw) == 0
    assert msa.attention_workspace_bytes(qq.values, kk, vv, cu_q, q_scale=qq.scale, **kw) == 0


def test_without_q_scale_q_is_taken_as_is():
    ml = _ml_dtypes()
    q, k, v, _, _, cu_q, cu_k, _, _ = _problem(2)
    q8 = q.astype(ml.float8_e4m3fn)
    kb, vb = _bf16(k, "numpy"), _bf16(v, "numpy")
    out = msa.attention_forward(q8, kb, vb, cu_q, cu_seqlens_k=cu_k)
    ones = msa.attention_forward(q8, kb, vb, cu_q, cu_seqlens_k=cu_k,
                                 q_scale=np.ones(1, np.float32))
    np.testing.assert_array_equal(_bits(out), _bits(ones))
    want, _, _ = ref.attention(_f64(q8), ref.split(kb, cu_k), ref.split(vb, cu_k), cu_q)
    assert _rel(out, want) <= 1e-2


def test_fp8_query_errors():
    ml = _ml_dtypes()
    q, k, v, _, _, cu_q, cu_k, _, _ = _problem(3)
    qq, _ = _quantize_q(q, "fp8_per_token_head", "numpy")
    kb, vb = _bf16(k, "numpy"), _bf16(v, "numpy")
    kw = dict(cu_seqlens_k=cu_k)
    with pytest.raises(msa.MsaError, match="scale"):  # a q_scale needs fp8 q
        msa.attention_forward(q.astype(ml.bfloat16), kb, vb, cu_q, q_scale=qq.scale, **kw)
    with pytest.raises(msa.MsaError, match="out"):  # fp8 q writes bf16, not f16
        msa.attention_forward(qq, kb, vb, cu_q, out=np.empty(q.shape, np.float16), **kw)
    with pytest.raises(msa.MsaError, match="k"):  # f16 K/V under fp8 q
        msa.attention_forward(qq, k.astype(np.float16), v.astype(np.float16), cu_q, **kw)
    with pytest.raises(msa.MsaError, match="scale"):  # a scale of no accepted shape
        msa.attention_forward(qq.values, kb, vb, cu_q, q_scale=np.ones((q.shape[0], HQ + 1),
                                                                       np.float32), **kw)


# --- CPU: DecodePlan ----------------------------------------------------------------------------

def _decode(fw, fmt, kv, sparse, seed):
    """FP8 q through a CPU DecodePlan over a paged cache of `kv`: checks run() against
    attention_forward (bitwise), values plus q_scale (bitwise) and the float64 reference."""
    q, _, _, kp, vp, cu_q, _, table, seqused = _problem(seed)
    qq, qd = _quantize_q(q, fmt, fw)
    kk, vv, kd, vd = _pools(kp, vp, kv, fw)
    q2k = _q2k(cu_q, seqused, HKV, 128) if sparse else None
    cu_q_, table_, seqused_, q2k_ = (None if x is None else _host(x, fw)
                                     for x in (cu_q, table, seqused, q2k))
    plan = msa.DecodePlan().plan(batch=len(LQ), num_q_heads=HQ, num_kv_heads=HKV, head_dim=D,
                                 page_size=PAGE, max_pages=table.shape[1],
                                 max_queries_per_request=max(LQ),
                                 kv_dtype=_KV_DTYPE[kv], topk=2 if sparse else 0,
                                 seqused_k=seqused_)
    assert plan.shape["device_type"] == "cpu"
    kw = dict(seqused_k=seqused_, q2k=q2k_)
    out, lse = plan.run(qq, kk, vv, table_, cu_q_, return_lse=True, **kw)
    if fw == "torch":
        assert out.dtype == torch.bfloat16
    else:
        assert out.dtype == _ml_dtypes().bfloat16
    same, same_lse = msa.attention_forward(qq, kk, vv, cu_q_, page_table=table_, return_lse=True,
                                           **kw)
    np.testing.assert_array_equal(_bits(out), _bits(same))
    np.testing.assert_array_equal(_f64(lse), _f64(same_lse))
    plain = plan.run(qq.values, kk, vv, table_, cu_q_, q_scale=qq.scale, **kw)
    np.testing.assert_array_equal(_bits(plain), _bits(out))
    want, want_lse, _ = ref.attention(qd, _gather(kd, table, seqused, PAGE),
                                      _gather(vd, table, seqused, PAGE), cu_q, q2k=q2k)
    _check(out, lse, want, want_lse)
    return plan, qq, kk, vv, table_, cu_q_, kw, out


@pytest.mark.parametrize("fmt", Q_FORMATS)
@pytest.mark.parametrize("kv", ["bf16", "fp8", "nvfp4"])
@pytest.mark.parametrize("sparse", [False, True])
def test_decode_plan_numpy(fmt, kv, sparse):
    _ml_dtypes()
    _decode("numpy", fmt, kv, sparse, 10)


def test_decode_errors():
    ml = _ml_dtypes()
    q, _, _, kp, vp, cu_q, _, table, seqused = _problem(11)
    qq, _ = _quantize_q(q, "fp8_per_token", "numpy")
    kk, vv, _, _ = _pools(kp, vp, "fp8", "numpy")
    plan = msa.DecodePlan().plan(batch=len(LQ), num_q_heads=HQ, num_kv_heads=HKV, head_dim=D,
                                 page_size=PAGE, max_pages=table.shape[1],
                                 max_queries_per_request=max(LQ), kv_dtype="fp8_e4m3")
    with pytest.raises(msa.MsaError, match="scale"):
        plan.run(q.astype(ml.bfloat16), kk, vv, table, cu_q, seqused_k=seqused,
                 q_scale=qq.scale)
    with pytest.raises(msa.MsaError, match="out"):
        plan.run(qq, kk, vv, table, cu_q, seqused_k=seqused, out=np.empty(q.shape, np.float16))


# --- CPU: torch ---------------------------------------------------------------------------------

@needs_torch
@pytest.mark.parametrize("fmt", Q_FORMATS)
@pytest.mark.parametrize("kv", ["bf16", "fp8"])
def test_torch_attention_forward(fmt, kv):
    q, k, v, _, _, cu_q, cu_k, _, _ = _problem(20)
    qq, qd = _quantize_q(q, fmt, "torch")
    kk, vv, kd, vd = _kv(k, v, kv, "torch")
    q2k = _q2k(cu_q, LK, HKV, BLK)
    kw = dict(cu_seqlens_k=torch.from_numpy(cu_k), q2k=torch.from_numpy(q2k), kv_block_size=BLK)
    out, lse = msa.attention_forward(qq, kk, vv, torch.from_numpy(cu_q), return_lse=True, **kw)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    want, want_lse, _ = ref.attention(qd, ref.split(kd, cu_k), ref.split(vd, cu_k), cu_q,
                                      q2k=q2k, blk=BLK)
    _check(out, lse, want, want_lse)
    plain = msa.attention_forward(qq.values, kk, vv, torch.from_numpy(cu_q), q_scale=qq.scale,
                                  **kw)
    assert torch.equal(plain, out)


@needs_torch
@pytest.mark.parametrize("fmt", ["fp8_per_token", "fp8_per_token_head"])
@pytest.mark.parametrize("sparse", [False, True])
def test_torch_decode_plan(fmt, sparse):
    _decode("torch", fmt, "fp8", sparse, 21)


@needs_torch
def test_torch_compile_traces_fp8_queries():
    q, k, v, _, _, cu_q, cu_k, _, _ = _problem(22)
    qq, _ = _quantize_q(q, "fp8_per_token_head", "torch")
    kk, vv, _, _ = _kv(k, v, "fp8", "torch")
    cu_q, cu_k = torch.from_numpy(cu_q), torch.from_numpy(cu_k)

    def attend(qq, kk, vv):
        return msa.attention_forward(qq, kk, vv, cu_q, cu_seqlens_k=cu_k, return_lse=True)

    eager = attend(qq, kk, vv)
    got = torch.compile(attend, fullgraph=True, backend="eager")(qq, kk, vv)
    assert got[0].dtype == torch.bfloat16
    for a, b in zip(got, eager):
        assert torch.equal(a, b)
    # The op's fake implementation (bf16 out for fp8 q). opcheck's test_schema cannot run here:
    # its schema check multiplies the inputs, which torch does not implement for fp8 tensors.
    ks, vs = kk.scale, vv.scale
    args = (qq.values, qq.scale, kk.values, vv.values, cu_q, cu_k, None, None, ks, vs, None,
            None, None, None, "flat", 0.0, True, 128, 0.0, "", True, None, None, "", 0.0, None)
    torch.library.opcheck(torch.ops.msa.attention_forward.default, args,
                          test_utils=("test_faketensor", "test_aot_dispatch_dynamic"))

    plan, qq, kk, vv, table, cu_q, kw, out = _decode("torch", "fp8_per_token", "fp8", False, 23)

    def run(qq, kk, vv):
        return plan.run(qq, kk, vv, table, cu_q, return_lse=True, **kw)

    got = torch.compile(run, fullgraph=True, backend="eager")(qq, kk, vv)
    assert got[0].dtype == torch.bfloat16
    assert torch.equal(got[0], out)
    for a, b in zip(got, run(qq, kk, vv)):
        assert torch.equal(a, b)


# --- GPU: DecodePlan on CUDA against the CPU one ------------------------------------------------

@pytest.mark.parametrize("fmt,kv,layout,sparse", [
    ("fp8_per_token_head", "fp8", "paged_nhd", False),
    ("fp8_per_token", "fp8", "paged_hnd", True),
    ("fp8_per_tensor", "fp8", "paged_nhd", True),
    ("fp8_per_token_head", "bf16", "paged_hnd", False),
    ("fp8_per_token_head", "nvfp4", "paged_nhd", True),
    ("fp8_per_token", "nvfp4", "paged_hnd", False),
])
def test_cuda_decode_matches_cpu(fmt, kv, layout, sparse):
    from gpu_env import require_gpu
    require_gpu()  # skips this test (not the module) without torch CUDA, a GPU or msa's CUDA
    lq, lk, hq, page = [1, 4, 2, 3], [700, 129, 1500, 64], 16, 64
    q, _, _, kp, vp, cu_q, _, table, seqused = _problem(30, lq, lk, hq, HKV, 128, page)
    qq, _ = _quantize_q(q, fmt, "torch")
    kk, vv, _, _ = _pools(kp, vp, kv, "torch")
    if layout == "paged_hnd":  # per-slot scales stay as they are: slot s of page P
        kk, vv = (x.transpose(1, 2).contiguous() if _is_torch(x) else
                  x._replace(values=x.values.transpose(1, 2).contiguous(),
                             scale=x.scale.transpose(1, 2).contiguous() if kv == "nvfp4"
                             else x.scale) for x in (kk, vv))
    q2k = torch.from_numpy(_q2k(cu_q, seqused, HKV, 128)) if sparse else None
    cu_q, table, seqused = (torch.from_numpy(x) for x in (cu_q, table, seqused))
    shape = dict(batch=len(lq), num_q_heads=hq, num_kv_heads=HKV, head_dim=128, page_size=page,
                 max_pages=table.shape[1], max_queries_per_request=max(lq), kv_layout=layout,
                 kv_dtype=_KV_DTYPE[kv], topk=2 if sparse else 0)

    def cuda(x):
        if x is None or _is_torch(x):
            return None if x is None else x.cuda()
        return x._replace(values=x.values.cuda(), scale=x.scale.cuda())

    cpu = msa.DecodePlan().plan(**shape, seqused_k=seqused)
    want, want_lse = cpu.run(qq, kk, vv, table, cu_q, seqused_k=seqused, q2k=q2k,
                             return_lse=True)
    gpu = msa.DecodePlan().plan(**shape, seqused_k=cuda(seqused))
    assert gpu.shape["device_type"] == "cuda"
    out, lse = gpu.run(cuda(qq), cuda(kk), cuda(vv), cuda(table), cuda(cu_q),
                       seqused_k=cuda(seqused), q2k=cuda(q2k), return_lse=True, check=True)
    assert out.dtype == torch.bfloat16 and out.is_cuda
    _check(out, lse, _f64(want), _f64(want_lse), out_tol=3e-2, lse_tol=3e-2)
    plain = gpu.run(cuda(qq.values), cuda(kk), cuda(vv), cuda(table), cuda(cu_q),
                    q_scale=cuda(qq.scale), seqused_k=cuda(seqused), q2k=cuda(q2k), check=True)
    assert torch.equal(plain, out)
    if not sparse:
        return
    # attention_forward on CUDA: q converted exactly, q_scale in each row's score scale.
    fwd, fwd_lse = msa.attention_forward(cuda(qq), cuda(kk), cuda(vv), cuda(cu_q),
                                         page_table=cuda(table), seqused_k=cuda(seqused),
                                         kv_layout=layout, q2k=cuda(q2k), return_lse=True,
                                         check=True)
    assert fwd.dtype == torch.bfloat16
    _check(fwd, fwd_lse, _f64(want), _f64(want_lse), out_tol=3e-2, lse_tol=3e-2)
