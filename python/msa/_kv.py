"""The KV cache arguments of the ops (flat `[total_k, Hkv, D]` with cu_seqlens_k, or a page pool
with page_table / seqused_k; docs/semantics.md, Paged KV) as msa._C keywords, and the sizes that
follow from them without reading lengths on the host where possible."""

from __future__ import annotations

from typing import Any, Optional

from ._arrays import to_host_list
from ._runtime import MsaError, arg, dims
from .quant import unpack

LAYOUTS = {"flat": "flat", "paged_nhd": "paged_nhd", "paged_hnd": "paged_hnd",
           "nhd": "paged_nhd", "hnd": "paged_hnd"}


def layout_name(kv_layout: Optional[str], page_table: Any) -> str:
    """kv_layout, defaulting to flat without a page table and paged_nhd with one."""
    if kv_layout is None:
        return "flat" if page_table is None else "paged_nhd"
    if kv_layout not in LAYOUTS:
        raise MsaError(f"kv_layout: must be one of {sorted(LAYOUTS)}, got {kv_layout!r}")
    return LAYOUTS[kv_layout]


def kv_heads_dim(layout: str) -> int:
    """The dim of k that counts the kv heads: [total_k, Hkv, D], [pages, page, Hkv, D] or
    [pages, Hkv, page, D] (fp4x2 halves only the last dim)."""
    return 2 if layout == "paged_nhd" else 1


def kv_shape(k: Any, layout: str) -> tuple:
    """The shape of k's values (k may be a QTensor): 3 dims flat, 4 for a page pool."""
    if layout == "flat":
        return dims(unpack(k)[0], "k", 3, "[total_k, Hkv, D]")
    return dims(unpack(k)[0], "k", 4, "a page pool [num_pages, page_size, Hkv, D] (nhd) or "
                "[num_pages, Hkv, page_size, D] (hnd)")


def kv_heads_of(k: Any, layout: str) -> int:
    return kv_shape(k, layout)[kv_heads_dim(layout)]


def page_size_of(k: Any, layout: str) -> int:
    shape = kv_shape(k, layout)
    return shape[1] if layout == "paged_nhd" else shape[2]


def page_table_shape(page_table: Any) -> tuple:
    return dims(page_table, "page_table", 2, "[B, max_pages]")


def _require_lengths(layout: str, cu_seqlens_k: Any) -> None:
    if layout == "flat" and cu_seqlens_k is None:
        raise MsaError("cu_seqlens_k: required for a flat KV cache (or pass page_table)")


def kv_args(k: Any, v: Any = None, *, layout: str, cu_seqlens_k: Any = None,
            page_table: Any = None, seqused_k: Any = None, k_scale: Any = None,
            v_scale: Any = None, k_global_scale: float = 1.0) -> dict:
    """The KV-cache keywords of msa._C; k and v may be QTensors."""
    return kv_into({}, k, v, layout, cu_seqlens_k, page_table, seqused_k, k_scale, v_scale,
                   k_global_scale)


def kv_into(out: dict, k: Any, v: Any, layout: str, cu_seqlens_k: Any, page_table: Any,
            seqused_k: Any, k_scale: Any, v_scale: Any, k_global_scale: float = 1.0) -> dict:
    """kv_args written into `out` (returned), arguments positional: the attention calls build
    their keywords in one dict this way (kv_args' keyword call and its dict merged into theirs
    cost ~2 us of host time a call on a 2-core development machine)."""
    _require_lengths(layout, cu_seqlens_k)
    k, k_scale, k_global_scale = unpack(k, k_scale, k_global_scale)
    out["kv_layout"] = layout
    out["k"] = arg(k)
    out["k_scale"] = arg(k_scale)
    out["k_global_scale"] = float(k_global_scale)
    out["cu_seqlens_k"] = arg(cu_seqlens_k)
    out["page_table"] = arg(page_table)
    out["seqused_k"] = arg(seqused_k)
    if v is not None:
        v, v_scale, v_global_scale = unpack(v, v_scale)
        out["v"] = arg(v)
        out["v_scale"] = arg(v_scale)
        out["v_global_scale"] = float(v_global_scale)
    return out


def key_lengths(layout: str, k: Any, cu_seqlens_k: Any, page_table: Any,
                seqused_k: Any) -> list:
    """Lk_b of every batch, on the host (waits for the stream for GPU cu_seqlens_k/seqused_k)."""
    _require_lengths(layout, cu_seqlens_k)
    if layout == "flat":
        dims(cu_seqlens_k, "cu_seqlens_k", 1, "[B+1]")
        cu = to_host_list(cu_seqlens_k)
        return [cu[b + 1] - cu[b] for b in range(len(cu) - 1)]
    batch, max_pages = page_table_shape(page_table)
    if seqused_k is not None:
        dims(seqused_k, "seqused_k", 1, "[B]")
        return to_host_list(seqused_k)
    return [max_pages * page_size_of(k, layout)] * batch


def rows_bound(layout: str, k: Any, cu_seqlens_k: Any, page_table: Any,
               kv_block_size: int) -> Optional[int]:
    """An upper bound of the k2q CSR's rows, sum_b ceil(Lk_b / kv_block_size), from shapes alone:
    total_k // kv_block_size + B for a flat cache (None without k: total_k is then unknown), the
    page table's capacity for a paged one."""
    if layout == "flat":
        if k is None:
            return None
        _require_lengths(layout, cu_seqlens_k)
        batch = dims(cu_seqlens_k, "cu_seqlens_k", 1, "[B+1]")[0] - 1
        return kv_shape(k, layout)[0] // kv_block_size + max(batch, 0)
    batch, max_pages = page_table_shape(page_table)
    return batch * -(-max_pages * page_size_of(k, layout) // kv_block_size)
