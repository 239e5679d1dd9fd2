// Thin PTX wrappers for Hopper (sm_90a) kernels: mbarriers, TMA tensor loads, wgmma and its
// shared-memory descriptors, proxy fences, named barriers and register reallocation.
// Included by kernel bodies only (src/cuda/sm90/*); each wrapper is one instruction or a loop.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace msa::cuda::sm90 {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarrier ---------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}

// Makes barrier initialisation visible to the async proxy (TMA) and to other threads.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("{\n\t.reg .b64 st;\n\tmbarrier.arrive.shared::cta.b64 st, [%0];\n\t}" ::"r"(
                   smem_addr(bar))
               : "memory");
}

// One arrival that also announces `bytes` of TMA traffic the phase must wait for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile(
      "{\n\t.reg .b64 st;\n\tmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n\t}" ::"r"(
          smem_addr(bar)),
      "r"(bytes)
      : "memory");
}

// Announces `bytes` of TMA traffic for the current phase without arriving.
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}

// Blocks until the phase with the given parity has completed.
// By shared-memory address: a loop that waits on a ring of barriers keeps one base address in a
// register instead of converting a generic pointer at every step.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n\t.reg .pred done;\n"
      "WAIT_%=:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
      "@!done bra WAIT_%=;\n\t}" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  mbar_wait(smem_addr(bar), parity);
}

// A copy of v in a fresh register that ptxas cannot see through: a loop counter that starts from
// a value ptxas spilled earlier does not reload it at every step, and values derived from it in a
// loop are computed there instead of hoisted out of the loop (where they may spill).
__device__ __forceinline__ int reg_copy(int v) {
  int r;
  asm volatile("mov.b32 %0, %1;" : "=r"(r) : "r"(v));
  return r;
}
// The same for a pointer: an address ptxas would otherwise rebuild from its parts at every use.
template <class T>
__device__ __forceinline__ T* reg_copy(T* v) {
  asm volatile("mov.b64 %0, %0;" : "+l"(v));
  return v;
}

// 2^x on the SFU alone (ex2.approx.ftz: ~2^-22 relative error; a result below 2^-126 becomes 0,
// -inf gives 0, NaN stays NaN). exp2f adds a range fix-up for subnormal results around it, which
// softmax terms never need: every row sum holds a term >= 1.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 1/x and log2(x) on the SFU alone (rcp.approx.ftz / lg2.approx.ftz: ~1 ulp, ~2^-22 relative),
// for arguments that are never subnormal, such as a softmax row sum (>= 1). The IEEE forms add a
// subnormal fix-up around the SFU instruction: 1.f / x is a call to a slow path.
__device__ __forceinline__ float fast_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// prmt.b32 (byte permute) as written. __byte_perm lets the compiler narrow a use's selector mask,
// which undoes masks that several permutes share (the MXFP4 logits conversion: 57 instructions a
// 32-value group instead of 48).
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

// stmatrix.m8n8.x4: four 8 x 8 tiles of 16-bit values from the mma accumulator layout (register
// j of lane l: row l / 4 of tile j, columns 2 (l % 4) + {0, 1}) to shared memory; lane l gives the
// address of row l % 8 of tile l / 8 (16 contiguous bytes).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                            uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// ---- cp.async (4-byte, zero fill) tracked by an mbarrier ----------------------------------
// Copies src_bytes (0 or 4) of src to the shared address dst and zero-fills the rest.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
// The same for 8 bytes (src_bytes 0 or 8; dst and src 8-byte aligned).
__device__ __forceinline__ void cp_async_8(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
// The same for 16 bytes through L2 only (.cg; src_bytes 0 or 16; dst and src 16-byte aligned).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
// Closes this thread's group of cp.async copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
// Waits until at most N of this thread's committed groups are pending: the older ones have landed
// and are visible to this thread.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// ---- shared-memory loads and stores by address (smem_addr) --------------------------------
__device__ __forceinline__ uint32_t ld_shared_u32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ uint2 ld_shared_u32x2(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ uint4 ld_shared_u32x4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}
__device__ __forceinline__ void st_shared_u32x4(uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}
__device__ __forceinline__ void st_shared_s32(uint32_t addr, int32_t v) {
  asm volatile("st.shared.s32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}

// One arrival on `bar`, made when every cp.async this thread issued before has landed (.noinc:
// it is one of the phase's expected arrivals).
__device__ __forceinline__ void cp_async_mbar_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar))
               : "memory");
}

// ---- TMA (cp.async.bulk.tensor) ----------------------------------------------------------
// 3-D tile load global -> shared, completing `bar`'s transaction count. Out-of-range
// coordinates are zero-filled by the copy engine and never fault.
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar,
                                            int32_t c0, int32_t c1, int32_t c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// 4-D tile load global -> shared, completing `bar`'s transaction count; dst is a shared-memory
// address (smem_addr), or a pointer (the form below).
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint64_t* bar,
                                            int32_t c0, int32_t c1, int32_t c2, int32_t c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2),
      "r"(c3)
      : "memory");
}
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, uint64_t* bar,
                                            int32_t c0, int32_t c1, int32_t c2, int32_t c3) {
  tma_load_4d(smem_addr(dst), map, bar, c0, c1, c2, c3);
}
// The same with an L2 cache policy (l2_evict_first_policy) for the lines it brings in.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint64_t* bar,
                                            int32_t c0, int32_t c1, int32_t c2, int32_t c3,
                                            uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".L2::cache_hint [%0], [%1, {%3, %4, %5, %6}], [%2], %7;" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2),
      "r"(c3), "l"(policy)
      : "memory");
}
// An L2 policy under which the lines a load brings in are the first to go: data read once (a
// decode's K/V when no other CTA reads the same lines) does not push out other lines, e.g. the
// dirty ones a previous kernel left, whose write-backs would share the read's DRAM time.
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// 3-D tile store shared -> global, in the issuing thread's bulk async-group. The source must be
// written (generic proxy) and fenced with fence_proxy_async_smem() before the store is issued.
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, const void* src, int32_t c0,
                                             int32_t c1, int32_t c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4}], [%1];"
      ::"l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// Waits until the thread's bulk groups but the newest N have read their shared-memory sources.
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}
// Waits until the thread's bulk groups but the newest N have completed (writes done).
template <int N>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}

// Non-tensor bulk copy global -> shared of `bytes` (a multiple of 16; both addresses 16-byte
// aligned), completing `bar`'s transaction count.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

// Starts bringing the 128-byte line of global address p into L2; no register waits for it.
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Generic-proxy shared stores that the async proxy (wgmma, TMA) reads next need this fence in
// each writing thread before the barrier that orders them.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// Async-proxy writes of global memory (completed TMA stores) before later generic accesses, and
// generic writes before async-proxy reads (bulk loads) of global memory.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

// ---- named barriers (id 0 is __syncthreads) ----------------------------------------------
__device__ __forceinline__ void named_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// Named barrier `id` of `threads` threads that also returns whether `pred` holds in all of them.
__device__ __forceinline__ bool named_all(uint32_t id, uint32_t threads, bool pred) {
  uint32_t all;
  asm volatile(
      "{\n\t.reg .pred pi, po;\n\tsetp.ne.u32 pi, %1, 0;\n\t"
      "bar.red.and.pred po, %2, %3, pi;\n\tselp.u32 %0, 1, 0, po;\n\t}"
      : "=r"(all)
      : "r"(uint32_t(pred)), "r"(id), "r"(threads)
      : "memory");
  return all != 0;
}

// ---- register reallocation between warpgroups --------------------------------------------
template <uint32_t kRegs>
__device__ __forceinline__ void regs_dealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <uint32_t kRegs>
__device__ __forceinline__ void regs_alloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}

// ---- wgmma ---------------------------------------------------------------------------------
// Shared-memory matrix descriptor: start address, leading and stride byte offsets (16-byte
// units), layout type in bits 62-63 (sm_90: 0 no swizzle, 1 the 128-byte swizzle).
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t smem_byte_addr, uint32_t lbo, uint32_t sbo,
                                               uint32_t layout) {
  uint64_t d = 0;
  d |= uint64_t((smem_byte_addr & 0x3FFFF) >> 4);
  d |= uint64_t((lbo >> 4) & 0x3FFF) << 16;
  d |= uint64_t((sbo >> 4) & 0x3FFF) << 32;
  d |= uint64_t(layout) << 62;
  return d;
}
// The 128-byte swizzle. `lbo`/`sbo` in bytes: K-major operands use sbo = 1024 (8 rows of 128 B)
// and ignore lbo; MN-major operands use lbo = bytes between 64-element MN chunks, sbo = 1024 (8 K
// rows).
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t smem_byte_addr, uint32_t lbo,
                                                     uint32_t sbo) {
  return wgmma_desc(smem_byte_addr, lbo, sbo, 1);
}

// The descriptor of the K-major 128-byte-swizzled tile `byte_off` bytes past the one `d`
// describes: the offset moves only the start address (bits 0-13 of the low word, in 16-byte
// units; shared addresses stay below 2^18, so nothing carries out of them). Built once per
// operand and offset by constants: re-encoding every k-step's descriptors (mask, shift, or in
// vector registers, then two R2UR each) was ~170 of the ~710 instructions of a bf16 indexer loop
// iteration. With uniform inputs the offsets are UIADD3s.
__device__ __forceinline__ uint64_t desc_offset(uint64_t d, uint32_t byte_off) {
  return (d & 0xFFFFFFFF00000000ull) | uint32_t(uint32_t(d) + (byte_off >> 4));
}
// Descriptor of a K-major tile of 128-byte rows with the 128-byte swizzle at `smem`.
__device__ __forceinline__ uint64_t tile_desc(const void* smem) {
  return wgmma_desc_sw128(smem_addr(smem), 16, 1024);
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving accumulator reads/writes across a wgmma boundary.
__device__ __forceinline__ void reg_fence(float& r) { asm volatile("" : "+f"(r)::"memory"); }

}  // namespace msa::cuda::sm90
