// Hopper's 2D bulk tensor copy (TMA) of a box of matrix rows into shared memory: one instruction
// from one lane stages a super-block of a row tile (16 rows x 144 bytes of Q4_K), where cp.async
// takes a copy a 16-byte chunk, each lane working out the chunk's row and address (~100-135 of the
// ~400 instructions a warp issues a super-block in the 16-column Q4_K GEMM: sm_90a SASS, session 54).
// A TmaRows describes `rows` rows of row_bytes bytes (the row stride) as boxes of box_rows rows x
// box_bytes bytes; it is encoded on the host a launch (a host-only call, nothing on the stream) and
// passed by value as a __grid_constant__ kernel parameter, so CUDA graphs capture it. Box rows past
// the matrix land as zeros; the copy completes its whole box's bytes on an mbarrier (mbarrier.cuh).
// sm_90 builds use the PTX; the CPU emulator models the copy (cuda_emu.h), so CI checks the boxes
// and the waits of a kernel that uses it.
#pragma once

#include "ggml-cuda/common.cuh"
#include "mbarrier.cuh"

#include <cstdint>

#if defined(DFLASH_CUDA_EMU)
#define DFLASH_GRID_CONSTANT
struct TmaRows {
    const char * base = nullptr;
    int64_t row_bytes = 0;
    int rows = 0, box_bytes = 0, box_rows = 0;
};
#else
#define DFLASH_GRID_CONSTANT __grid_constant__
struct alignas(64) TmaRows {
    CUtensorMap map;
};
#endif

// Whether base (16-byte aligned), row_bytes (a multiple of 16) and a box of box_rows x box_bytes
// (a multiple of 16, both at most 256) make a tensor map, written to out: false where they do not or
// the driver has no encoder (the caller stages otherwise).
inline bool tma_rows_encode(TmaRows & out, const void * base, int64_t row_bytes, int rows, int box_bytes,
                            int box_rows) {
    if (reinterpret_cast<uintptr_t>(base) % 16 != 0 || row_bytes % 16 != 0 || box_bytes % 16 != 0 || box_bytes <= 0 ||
        box_bytes > 256 || box_rows <= 0 || box_rows > 256 || rows <= 0 || box_bytes > row_bytes) {
        return false;
    }
#if defined(DFLASH_CUDA_EMU)
    out.base = static_cast<const char *>(base);
    out.row_bytes = row_bytes;
    out.rows = rows;
    out.box_bytes = box_bytes;
    out.box_rows = box_rows;
    return true;
#else
    using Encode = CUresult (*)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
    static const Encode encode = [] {
        void * fn = nullptr;
        cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
        const cudaError_t e =
            cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
#else
        const cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &found);
#endif
        return e == cudaSuccess && found == cudaDriverEntryPointSuccess ? reinterpret_cast<Encode>(fn) : nullptr;
    }();
    if (!encode) return false;
    const cuuint64_t dims[2] = {(cuuint64_t)row_bytes, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)row_bytes};
    const cuuint32_t box[2] = {(cuuint32_t)box_bytes, (cuuint32_t)box_rows};
    const cuuint32_t steps[2] = {1, 1};
    return encode(&out.map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void *>(base), dims, strides, box, steps,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
#endif
}

// The box at byte x of rows y.. into dst (shared memory, 128-byte aligned), its bytes completing on
// bar (whose phase the caller armed with mbar_arrive_expect_tx of the box's bytes). m: the kernel's
// __grid_constant__ parameter itself (its address is what the instruction reads).
__device__ __forceinline__ void tma_load_rows(void * dst, const TmaRows & m, int x, int y, uint64_t * bar) {
#if defined(DFLASH_CUDA_EMU)
    cuda_emu::cp_async_bulk_tensor_2d_g2s(dst, m.base, m.row_bytes, m.rows, m.box_bytes, m.box_rows, x, y, bar);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
        "[%4];\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
        "l"(reinterpret_cast<uint64_t>(&m.map)), "r"(x), "r"(y), "r"((uint32_t)__cvta_generic_to_shared(bar))
        : "memory");
#else
    GGML_UNUSED(dst);
    GGML_UNUSED(m);
    GGML_UNUSED(x);
    GGML_UNUSED(y);
    GGML_UNUSED(bar);
    __trap();
#endif
}
