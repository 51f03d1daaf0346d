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

struct ggml_backend_cuda_context {
    int device = 0;
    cudaStream_t stream() { return nullptr; }
};

// ggml's butterfly over `width` lanes
template <int width = WARP_SIZE>
inline float warp_reduce_sum(float x) {
    for (int offset = width / 2; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffff, x, offset, width);
    return x;
}
