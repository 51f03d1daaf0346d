// What ggml_ext's kernels take from ggml-cuda/common.cuh, for the CPU emulator (cuda_emu.h):
// the warp size and reduction, ggml's small macros, and the backend context their ggml entry
// points read the stream from. With ggml.h on the include path (the ops harness, emu/ops_emu.cpp)
// the real tensor type; without it (the GEMV standalone) opaque declarations.
#pragma once

#include "../../cuda_emu.h"

#if __has_include("ggml.h")
#include "ggml.h"
#else
enum ggml_type : int;
struct ggml_tensor;
#define GGML_UNUSED(x) (void)(x)
#endif

#define WARP_SIZE 32
#define NO_DEVICE_CODE ::cuda_emu::fail("NO_DEVICE_CODE reached")
#define CUDA_CHECK(x) (void)(x)

struct ggml_cuda_mm_fusion_args_host;

// ggml's memory pool, as plain allocations (each filled with NaN bytes by cudaMalloc)
struct ggml_cuda_pool {
    void * alloc(size_t size, size_t * actual) {
        void * p = nullptr;
        cudaMalloc(&p, size);
        *actual = size;
        return p;
    }
    void free(void * p, size_t) { cudaFree(p); }
};

template <typename T>
struct ggml_cuda_pool_alloc {
    ggml_cuda_pool * pool = nullptr;
    T * ptr = nullptr;
    size_t actual_size = 0;
    explicit ggml_cuda_pool_alloc(ggml_cuda_pool & p) : pool(&p) {}
    ggml_cuda_pool_alloc(ggml_cuda_pool & p, size_t size) : pool(&p) { alloc(size); }
    T * alloc(size_t size) {
        ptr = static_cast<T *>(pool->alloc(size * sizeof(T), &actual_size));
        return ptr;
    }
    ~ggml_cuda_pool_alloc() {
        if (ptr) pool->free(ptr, actual_size);
    }
    ggml_cuda_pool_alloc(const ggml_cuda_pool_alloc &) = delete;
    ggml_cuda_pool_alloc & operator=(const ggml_cuda_pool_alloc &) = delete;
    T * get() { return ptr; }
};

// The device table and compute capabilities the GEMM's dispatch reads (gemm_kquant_mma.cu): one
// Hopper of 132 multiprocessors (its wgmma form is built only with DFLASH_HAVE_WGMMA).
#define GGML_CUDA_CC_AMPERE 800
#define GGML_CUDA_CC_HOPPER 900
#define GGML_CUDA_CC_IS_NVIDIA(cc) ((cc) < 0x1000000)
inline int ggml_cuda_highest_compiled_arch(int cc) { return cc; }
struct ggml_cuda_device_info {
    struct {
        int cc = GGML_CUDA_CC_HOPPER;
        int nsm = 132;
        size_t smpbo = 232448;
    } devices[1];
};
inline const ggml_cuda_device_info & ggml_cuda_info() {
    static const ggml_cuda_device_info info;
    return info;
}

struct ggml_backend_cuda_context {
    int device = 0;
    ggml_cuda_pool pool_;
    cudaStream_t stream() { return nullptr; }
    ggml_cuda_pool & pool() { return pool_; }
};

// ggml's butterfly over `width` lanes
template <int width = WARP_SIZE>
inline float warp_reduce_sum(float x) {
    for (int offset = width / 2; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffff, x, offset, width);
    return x;
}
