// Hopper's mbarriers, bulk copies and named barriers for ggml_ext's kernels: the parts of a
// warp-specialized pipeline, where a producer warp stages a matrix's tiles into shared memory and
// consumer warps wait for each stage on its own barrier instead of every warp meeting at one
// __syncthreads a stage (gemm_q4k_wgmma_ws.cuh). sm_90 builds use the PTX instructions; the CPU
// emulator (cuda_emu.h) models them, so CI checks a pipeline's waits and phases. Barriers are
// CTA-scoped (no clusters).
//
// A stage's usual pair: `full` (count 1: the producer's arrive with the stage's bytes, which the
// bulk copies complete) and `empty` (count: the consumer warps, one arrival each when done). Round
// r of a stage waits on parity r & 1 of full and, before refilling, (r & 1) ^ 1 of empty, which
// passes at once in the first round.
#pragma once

#include <cstdint>

#if defined(DFLASH_CUDA_EMU)

__device__ __forceinline__ void mbar_init(uint64_t * bar, unsigned count) { cuda_emu::mbarrier_init(bar, count); }
// After the inits, before any thread or copy uses them (with a __syncthreads after it).
__device__ __forceinline__ void mbar_init_fence() {}
__device__ __forceinline__ void mbar_arrive(uint64_t * bar) { cuda_emu::mbarrier_arrive(bar, 0); }
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t * bar, unsigned bytes) {
    cuda_emu::mbarrier_arrive(bar, bytes);
}
__device__ __forceinline__ bool mbar_try_wait_parity(uint64_t * bar, unsigned parity) {
    return cuda_emu::mbarrier_try_wait_parity(bar, parity);
}
__device__ __forceinline__ void mbar_wait_parity(uint64_t * bar, unsigned parity) {
    cuda_emu::mbarrier_wait_parity(bar, parity);
}
// bytes (a multiple of 16; both addresses 16-byte aligned) from global src into shared dst,
// completing that many transaction bytes on bar.
__device__ __forceinline__ void bulk_copy_g2s(void * dst, const void * src, unsigned bytes, uint64_t * bar) {
    cuda_emu::cp_async_bulk_g2s(dst, src, bytes, bar);
}
__device__ __forceinline__ void cp_async_mbar_arrive_noinc(uint64_t * bar) {
    cuda_emu::cp_async_mbarrier_arrive_noinc(bar);
}
__device__ __forceinline__ void named_bar_sync(int id, int nthreads) { cuda_emu::named_barrier_sync(id, nthreads); }
__device__ __forceinline__ void named_bar_arrive(int id, int nthreads) { cuda_emu::named_barrier_arrive(id, nthreads); }
// setmaxnreg (every warp of the warpgroup): registers are not modelled.
template <int kRegs>
__device__ __forceinline__ void warpgroup_regs_down() {}
template <int kRegs>
__device__ __forceinline__ void warpgroup_regs_up() {}

#else

// The PTX needs sm_90; other device passes (and the host pass) compile these to a trap, since only
// kernels built for sm_90 call them.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define DFLASH_MBAR_PTX(...) asm volatile(__VA_ARGS__)
#else
#define DFLASH_MBAR_PTX(...) __trap()
#endif

__device__ __forceinline__ uint32_t mbar_smem(const void * p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t * bar, unsigned count) {
    DFLASH_MBAR_PTX("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(mbar_smem(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() {
    DFLASH_MBAR_PTX("fence.mbarrier_init.release.cluster;\n" :: : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t * bar) {
    DFLASH_MBAR_PTX("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(mbar_smem(bar)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t * bar, unsigned bytes) {
    DFLASH_MBAR_PTX("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(mbar_smem(bar)),
                    "r"(bytes) : "memory");
}
__device__ __forceinline__ bool mbar_try_wait_parity(uint64_t * bar, unsigned parity) {
    uint32_t ok = 0;
    DFLASH_MBAR_PTX(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n" : "=r"(
            ok) : "r"(mbar_smem(bar)),
        "r"(parity) : "memory");
    return ok != 0;
}
__device__ __forceinline__ void mbar_wait_parity(uint64_t * bar, unsigned parity) {
    while (!mbar_try_wait_parity(bar, parity)) {
    }
}
__device__ __forceinline__ void bulk_copy_g2s(void * dst, const void * src, unsigned bytes, uint64_t * bar) {
    DFLASH_MBAR_PTX("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                        mbar_smem(dst)),
                    "l"(src), "r"(bytes), "r"(mbar_smem(bar)) : "memory");
}
// An arrival on bar once every cp.async this thread issued so far has landed; .noinc: the barrier's
// count includes it (a thread's 16-byte cp.asyncs, which a warp issues as one instruction, complete
// a stage as a producer's bulk copies do).
__device__ __forceinline__ void cp_async_mbar_arrive_noinc(uint64_t * bar) {
    DFLASH_MBAR_PTX("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(mbar_smem(bar)) : "memory");
}
__device__ __forceinline__ void named_bar_sync(int id, int nthreads) {
    DFLASH_MBAR_PTX("bar.sync %0, %1;\n" ::"r"(id), "r"(nthreads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int nthreads) {
    DFLASH_MBAR_PTX("bar.arrive %0, %1;\n" ::"r"(id), "r"(nthreads) : "memory");
}

// setmaxnreg.dec / .inc (sm_90a; every warp of the warpgroup, kRegs a multiple of 8 in 24..256): a
// producer warpgroup gives registers back to the multiprocessor's pool and the consumers take them,
// so a block launched at the __launch_bounds__ count runs its consumers with more.
template <int kRegs>
__device__ __forceinline__ void warpgroup_regs_down() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void warpgroup_regs_up() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

#undef DFLASH_MBAR_PTX

#endif
