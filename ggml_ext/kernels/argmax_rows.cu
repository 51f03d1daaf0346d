// ggml_ext's CUDA argmax of long rows, called from ggml-cuda's dispatch of GGML_OP_ARGMAX
// (patches/0004). ggml's kernel gives a row one block: the 27B's 248,320 logits took 90 us of an
// 8 ms decode step on the H200 (one multiprocessor pulling 1 MB). Here each row is split into
// chunks of kChunk values, one block each, and a second kernel reduces the chunks' winners:
// the largest value, the highest index among equal ones (the CPU's ggml_vec_argmax_f32 keeps the
// last maximum; a row of -inf gives its last index). NaN never wins.
#include "ggml_ext_top_k_cuda.cuh"

#include <cfloat>

namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = 8192;     // values per block
constexpr int64_t kMinCols = 32768;  // shorter rows stay with ggml's kernel
constexpr int kMaxChunks = 1 << 16;  // grid.x

struct Best {
    float v;
    int i;
};

// a beats b: larger, or equal and later (an index of -1 never wins)
__device__ __forceinline__ bool beats(float av, int ai, float bv, int bi) {
    return ai >= 0 && (bi < 0 || av > bv || (av == bv && ai > bi));
}

__device__ __forceinline__ void warp_best(float & v, int & i) {
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffff, v, o);
        const int oi = __shfl_xor_sync(0xffffffff, i, o);
        if (beats(ov, oi, v, i)) {
            v = ov;
            i = oi;
        }
    }
}

// grid (chunks, rows): chunk c of row r -> part[r * chunks + c]
__global__ void argmax_chunks_kernel(const float * __restrict__ x, Best * __restrict__ part, int64_t ncols,
                                     int64_t stride_row) {
    const int64_t row = blockIdx.y, c0 = blockIdx.x * kChunk;
    const int64_t c1 = c0 + kChunk < ncols ? c0 + kChunk : ncols;
    const float * r = x + row * stride_row;
    float v = -INFINITY;
    int i = -1;
    for (int64_t c = c0 + threadIdx.x; c < c1; c += kThreads) {  // ascending: a thread keeps its last maximum
        const float xv = r[c];
        if (xv >= v) {
            v = xv;
            i = (int)c;
        }
    }
    warp_best(v, i);
    __shared__ float sv[kThreads / WARP_SIZE];
    __shared__ int si[kThreads / WARP_SIZE];
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    if (lane == 0) {
        sv[warp] = v;
        si[warp] = i;
    }
    __syncthreads();
    if (warp != 0) return;
    v = lane < kThreads / WARP_SIZE ? sv[lane] : -INFINITY;
    i = lane < kThreads / WARP_SIZE ? si[lane] : -1;
    warp_best(v, i);
    if (lane == 0) part[row * gridDim.x + blockIdx.x] = {v, i};
}

// one warp a row: the chunks' winners -> dst[row]
__global__ void argmax_reduce_kernel(const Best * __restrict__ part, int32_t * __restrict__ dst, int chunks) {
    const int64_t row = blockIdx.x;
    float v = -INFINITY;
    int i = -1;
    for (int c = threadIdx.x; c < chunks; c += WARP_SIZE) {
        const Best b = part[row * chunks + c];
        if (beats(b.v, b.i, v, i)) {
            v = b.v;
            i = b.i;
        }
    }
    warp_best(v, i);
    if (threadIdx.x == 0) dst[row] = i;
}

}  // namespace

bool ggml_ext_cuda_argmax(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * src = dst->src[0];
    const int64_t ncols = src->ne[0], nrows = ggml_nrows(src);
    if (src->type != GGML_TYPE_F32 || dst->type != GGML_TYPE_I32 || ncols < kMinCols || ncols > INT32_MAX ||
        src->nb[0] != sizeof(float) || !ggml_is_contiguous_rows(src) || src->ne[2] != 1 || src->ne[3] != 1 ||
        nrows > 65535) {
        return false;
    }
    const int chunks = (int)((ncols + kChunk - 1) / kChunk);
    if (chunks > kMaxChunks) return false;
    cudaStream_t stream = ctx.stream();
    ggml_cuda_pool_alloc<Best> part(ctx.pool(), (size_t)chunks * nrows);
    argmax_chunks_kernel<<<dim3((unsigned)chunks, (unsigned)nrows, 1), kThreads, 0, stream>>>(
        (const float *)src->data, part.get(), ncols, (int64_t)(src->nb[1] / sizeof(float)));
    argmax_reduce_kernel<<<(unsigned)nrows, WARP_SIZE, 0, stream>>>(part.get(), (int32_t *)dst->data, chunks);
    CUDA_CHECK(cudaGetLastError());
    return true;
}
