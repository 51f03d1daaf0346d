// cp.async into shared memory (Ampere and newer) and 4-byte reads of 2-byte aligned data staged
// there: how ggml_ext's tensor-core GEMM and its Q6_K GEMV bring weight blocks in (Q6_K's 210-byte
// blocks start at any even address, so a block is copied as its aligned 16-byte chunks).
#pragma once

#include "ggml-cuda/common.cuh"

__device__ __forceinline__ void cp_async_16(void * smem_dst, const void * src) {
#if defined(DFLASH_CUDA_EMU)
    cuda_emu::cp_async_16(smem_dst, src);  // lands at the wait that covers its group, as on a GPU
#elif __CUDA_ARCH__ >= 800
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem_dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" : : "r"(dst), "l"(src));
#else
    GGML_UNUSED(smem_dst);
    GGML_UNUSED(src);
    NO_DEVICE_CODE;
#endif
}

// cp_async_16(smem_dst + kDstOff, src + kSrcOff) with the offsets as the instruction's immediates:
// copies that share one address pair cost no address arithmetic each (ptxas does not always fold a
// constant added to the pointers).
template <int kDstOff, int kSrcOff>
__device__ __forceinline__ void cp_async_16_at(void * smem_dst, const void * src) {
#if defined(DFLASH_CUDA_EMU)
    cuda_emu::cp_async_16(static_cast<char *>(smem_dst) + kDstOff, static_cast<const char *>(src) + kSrcOff);
#elif __CUDA_ARCH__ >= 800
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem_dst);
    asm volatile("cp.async.cg.shared.global [%0+%2], [%1+%3], 16;" : : "r"(dst), "l"(src), "n"(kDstOff), "n"(kSrcOff));
#else
    GGML_UNUSED(smem_dst);
    GGML_UNUSED(src);
    NO_DEVICE_CODE;
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(DFLASH_CUDA_EMU)
    cuda_emu::cp_async_commit();
#elif __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;");
#endif
}

// Waits until at most n of this thread's committed groups are still in flight.
template <int n>
__device__ __forceinline__ void cp_async_wait() {
#if defined(DFLASH_CUDA_EMU)
    cuda_emu::cp_async_wait(n);
#elif __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" : : "n"(n));
#endif
}

// The 16-byte aligned start of the chunks holding a block, and the block's offset in them.
__device__ __forceinline__ const char * align16_down(const char * p) {
    return reinterpret_cast<const char *>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t(15));
}

__device__ __forceinline__ int offset_in16(const char * p) { return (int)(reinterpret_cast<uintptr_t>(p) & 15); }

// 4 bytes at a 2-byte aligned shared-memory address: one load, or two halves.
__device__ __forceinline__ uint32_t load_smem_4_align2(const char * p) {
    if ((reinterpret_cast<uintptr_t>(p) & 2) == 0) return *reinterpret_cast<const uint32_t *>(p);
    const uint16_t * h = reinterpret_cast<const uint16_t *>(p);
    return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
}

// A 2-byte aligned block in shared memory read as 4-byte words at offsets that are multiples of 4:
// each word the funnel shift of the two aligned words it spans, by the block's own 0 or 16 bits.
// One alignment test a block: a test a word (one load, or two half-word loads) had ptxas predicate
// both paths behind an address test of its own, ~6 instructions a word (sm_90a SASS of the f16
// Q6_K GEMM's loop). The word after the last one read must lie in shared memory the caller staged
// (a block in its 16-byte aligned chunks: the 2 bytes after it at most).
struct Smem4Align2 {
    const char * base;  // the block's address rounded down to 4
    uint32_t shift;     // 0 or 16
    __device__ __forceinline__ explicit Smem4Align2(const char * blk) {
        const uint32_t odd = (uint32_t)(reinterpret_cast<uintptr_t>(blk) & 2);
        base = blk - odd;
        shift = odd * 8;
    }
    __device__ __forceinline__ uint32_t operator()(int off) const {
        const uint32_t * w = reinterpret_cast<const uint32_t *>(base + off);
        return __funnelshift_r(w[0], w[1], shift);
    }
};
