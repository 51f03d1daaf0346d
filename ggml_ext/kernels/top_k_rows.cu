// ggml_ext's CUDA kernel for GGML_OP_TOP_K nodes tagged by ggml_ext::top_k_rows: a few candidates
// over long rows (a drafter's top-K over the vocabulary), called from ggml-cuda's dispatch
// (patches/0004).
//
// ggml sorts each whole row for it (cub's segmented radix sort where CCCL lacks DeviceTopK, as
// CUDA 13.0's does): 1.6 ms per DDTree draft of the 27B's 248k vocabulary on the H200
// (bench/results/h200-s4-27b-kernels.json). Here one block reads its row once: every thread keeps
// its own best K in shared memory (sorted, K <= 32), then K rounds of a block-wide max over the
// threads' list heads pick the row's best K. Order: value descending, ties to the lower index;
// GGML_OP_TOP_K leaves the order open.

#include "ggml_ext_top_k.h"
#include "ggml_ext_top_k_cuda.cuh"
#include "launch.cuh"

#include <climits>

namespace {

constexpr int kMaxK = 32;
constexpr int kMinCols = 2048;  // shorter rows: ggml's bitonic sort in shared memory is fine

// (a, ia) before (b, ib): larger value first, then lower index; an empty slot (ib < 0) is last.
__device__ __forceinline__ bool before(float a, int ia, float b, int ib) {
    return ib < 0 || a > b || (a == b && ia < ib);
}

template <int K, int NT>
__global__ void top_k_rows_kernel(const float * __restrict__ src, int * __restrict__ dst, const int ncols,
                                  const int64_t row_stride, const int k) {
    // Thread t's list: entries j * NT + t, j = 0 (best) .. K-1 (interleaved: no bank conflicts).
    __shared__ float sv[K * NT];
    __shared__ int si[K * NT];
    __shared__ float wv[NT / WARP_SIZE];
    __shared__ int wi[NT / WARP_SIZE], wt[NT / WARP_SIZE];
    __shared__ int winner;

    const int t = threadIdx.x;
    const float * x = src + blockIdx.x * row_stride;
    for (int j = 0; j < K; ++j) {
        sv[j * NT + t] = -INFINITY;
        si[j * NT + t] = -1;
    }
    float last_v = -INFINITY;  // the list's worst entry, the bar a new value must pass
    int last_i = -1;
    for (int c = t; c < ncols; c += NT) {
        const float f = x[c];
        if (!before(f, c, last_v, last_i)) continue;
        int j = K - 1;  // insertion: shift the worse ones down
        for (; j > 0 && before(f, c, sv[(j - 1) * NT + t], si[(j - 1) * NT + t]); --j) {
            sv[j * NT + t] = sv[(j - 1) * NT + t];
            si[j * NT + t] = si[(j - 1) * NT + t];
        }
        sv[j * NT + t] = f;
        si[j * NT + t] = c;
        last_v = sv[(K - 1) * NT + t];
        last_i = si[(K - 1) * NT + t];
    }
    __syncthreads();

    int head = 0;  // this thread's best entry not yet taken
    const int lane = t % WARP_SIZE, warp = t / WARP_SIZE;
    for (int r = 0; r < k; ++r) {
        float bv = head < K ? sv[head * NT + t] : -INFINITY;
        int bi = head < K ? si[head * NT + t] : -1;
        int bt = t;
#pragma unroll
        for (int off = WARP_SIZE / 2; off > 0; off >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffff, bv, off);
            const int oi = __shfl_xor_sync(0xffffffff, bi, off);
            const int ot = __shfl_xor_sync(0xffffffff, bt, off);
            if (oi >= 0 && before(ov, oi, bv, bi)) {
                bv = ov;
                bi = oi;
                bt = ot;
            }
        }
        if (lane == 0) {
            wv[warp] = bv;
            wi[warp] = bi;
            wt[warp] = bt;
        }
        __syncthreads();
        if (t == 0) {
            for (int w = 1; w < NT / WARP_SIZE; ++w) {
                if (wi[w] >= 0 && before(wv[w], wi[w], wv[0], wi[0])) {
                    wv[0] = wv[w];
                    wi[0] = wi[w];
                    wt[0] = wt[w];
                }
            }
            dst[(int64_t)blockIdx.x * k + r] = wi[0];
            winner = wt[0];
        }
        __syncthreads();
        if (t == winner) head++;
        __syncthreads();  // wv/wi/winner are rewritten next round
    }
}

template <int K>
void launch(const float * src, int * dst, int ncols, int64_t nrows, int64_t row_stride, int k, cudaStream_t stream) {
    constexpr int NT = K > 16 ? 128 : 256;  // K * NT * 8 bytes of lists <= 32 KB
    DFLASH_LAUNCH((unsigned)nrows, NT, 0, stream, top_k_rows_kernel<K, NT>)(src, dst, ncols, row_stride, k);
}

}  // namespace

bool ggml_ext_cuda_top_k(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * src = dst->src[0];
    const int64_t ncols = src->ne[0], k = dst->ne[0], nrows = ggml_nrows(src);
    if (!ggml_ext::is_top_k_rows(dst) || src->type != GGML_TYPE_F32 || dst->type != GGML_TYPE_I32 ||
        !ggml_is_contiguous(src) || !ggml_is_contiguous(dst) || k < 1 || k > kMaxK || ncols < kMinCols ||
        ncols > INT_MAX || nrows > INT_MAX) {
        return false;
    }
    const float * x = (const float *)src->data;
    int * out = (int *)dst->data;
    cudaStream_t stream = ctx.stream();
    if (k <= 8) {
        launch<8>(x, out, (int)ncols, nrows, ncols, (int)k, stream);
    } else if (k <= 16) {
        launch<16>(x, out, (int)ncols, nrows, ncols, (int)k, stream);
    } else {
        launch<32>(x, out, (int)ncols, nrows, ncols, (int)k, stream);
    }
    CUDA_CHECK(cudaGetLastError());
    return true;
}
