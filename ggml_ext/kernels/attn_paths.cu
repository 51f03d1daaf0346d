// CUDA kernel of the path attention op (ggml_ext_attn.h; compiled into ggml-cuda).
//
// One block of 4 warps per (query, head). Per tile of kAttnPathsTile virtual rows: warp w scores
// rows w, w + 4, ... (lane-strided dot over D, ggml's warp butterfly), thread j < cnt turns score j
// into p_j = exp(s_j - m), and every thread adds the tile into its own D / 128 output values,
// rows in order. Nothing in a query's arithmetic depends on the other queries, the grid or the
// rows' places: a DDTree node and a decode step over the same virtual rows get the same bits.
#include "ggml_ext_attn.h"
#include "ggml_ext_tree_cuda.cuh"
#include "launch.cuh"

namespace attn_paths_detail {  // named: the emulator's harness compiles every kernel file in one unit

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * WARP_SIZE;
constexpr int kTile = ggml_ext::kAttnPathsTile;

template <typename T>
__device__ __forceinline__ float to_f32(T x);
template <>
__device__ __forceinline__ float to_f32<float>(float x) {
    return x;
}
template <>
__device__ __forceinline__ float to_f32<half>(half x) {
    return __half2float(x);
}
template <>
__device__ __forceinline__ float to_f32<nv_bfloat16>(nv_bfloat16 x) {
    return __bfloat162float(x);
}

template <int D, typename KT, typename VT>
__global__ void __launch_bounds__(kThreads)
    attn_paths_kernel(const float * __restrict__ q, const char * __restrict__ k, const char * __restrict__ v,
                      const int32_t * __restrict__ paths, float * __restrict__ dst, int64_t H, int64_t gqa, int64_t W,
                      int64_t q_nb1, int64_t q_nb2, int64_t k_nb1, int64_t k_nb2, int64_t v_nb1, int64_t v_nb2,
                      float scale) {
    constexpr int kPer = (D + kThreads - 1) / kThreads;  // output values per thread
    const int64_t h = blockIdx.x, i = blockIdx.y, hkv = h / gqa;
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    __shared__ float qs[D];
    __shared__ float s[kTile];
    __shared__ int64_t rows[kTile];

    const float * qr = (const float *)((const char *)q + i * q_nb2 + h * q_nb1);
    for (int d = threadIdx.x; d < D; d += kThreads) qs[d] = qr[d];
    const int32_t * info = paths + i * W;
    const int64_t P = info[0], total = P + info[1];
    const char * kh = k + hkv * k_nb1;
    const char * vh = v + hkv * v_nb1;

    float acc[kPer];
#pragma unroll
    for (int c = 0; c < kPer; ++c) acc[c] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    __syncthreads();
    for (int64_t t0 = 0; t0 < total; t0 += kTile) {
        const int cnt = total - t0 < kTile ? (int)(total - t0) : kTile;
        for (int j = warp; j < cnt; j += kWarps) {
            const int64_t vpos = t0 + j, row = vpos < P ? vpos : info[2 + vpos - P];
            const KT * kr = (const KT *)(kh + row * k_nb2);
            float dot = 0.0f;
            for (int d = lane; d < D; d += WARP_SIZE) dot += qs[d] * to_f32(kr[d]);
            dot = warp_reduce_sum<WARP_SIZE>(dot);
            if (lane == 0) {
                s[j] = dot * scale;
                rows[j] = row;
            }
        }
        __syncthreads();
        float tm = s[0];
        for (int j = 1; j < cnt; ++j) tm = fmaxf(tm, s[j]);
        const float m_new = fmaxf(m, tm), corr = expf(m - m_new);
        __syncthreads();  // every thread has read the scores: they become the weights
        if (threadIdx.x < cnt) s[threadIdx.x] = expf(s[threadIdx.x] - m_new);
        __syncthreads();
        float psum = 0.0f;
        for (int j = 0; j < cnt; ++j) psum += s[j];
        l = l * corr + psum;
#pragma unroll
        for (int c = 0; c < kPer; ++c) {
            const int d = threadIdx.x + c * kThreads;
            if (d >= D) break;
            float a = 0.0f;
            for (int j = 0; j < cnt; ++j) a += s[j] * to_f32(((const VT *)(vh + rows[j] * v_nb2))[d]);
            acc[c] = acc[c] * corr + a;
        }
        m = m_new;
        __syncthreads();  // the tile's weights and rows are read before the next tile's scores
    }
    float * out = dst + (i * H + h) * D;
#pragma unroll
    for (int c = 0; c < kPer; ++c) {
        const int d = threadIdx.x + c * kThreads;
        if (d < D) out[d] = acc[c] / l;
    }
}

template <int D, typename KT, typename VT>
void launch(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * q = dst->src[0];
    const ggml_tensor * k = dst->src[1];
    const ggml_tensor * v = dst->src[2];
    const ggml_tensor * paths = dst->src[3];
    float scale;
    memcpy(&scale, dst->op_params, sizeof(scale));
    const int64_t H = q->ne[1], n = q->ne[2];
    const dim3 grid((unsigned)H, (unsigned)n, 1);
    DFLASH_LAUNCH(grid, dim3(kThreads, 1, 1), 0, ctx.stream(), attn_paths_kernel<D, KT, VT>)(
        (const float *)q->data, (const char *)k->data, (const char *)v->data, (const int32_t *)paths->data,
        (float *)dst->data, H, H / k->ne[1], paths->ne[0], (int64_t)q->nb[1], (int64_t)q->nb[2], (int64_t)k->nb[1],
        (int64_t)k->nb[2], (int64_t)v->nb[1], (int64_t)v->nb[2], scale);
}

template <int D, typename KT>
void launch_v(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    switch (dst->src[2]->type) {
        case GGML_TYPE_F32:
            return launch<D, KT, float>(ctx, dst);
        case GGML_TYPE_F16:
            return launch<D, KT, half>(ctx, dst);
        default:
            return launch<D, KT, nv_bfloat16>(ctx, dst);
    }
}

template <int D>
void launch_kv(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    switch (dst->src[1]->type) {
        case GGML_TYPE_F32:
            return launch_v<D, float>(ctx, dst);
        case GGML_TYPE_F16:
            return launch_v<D, half>(ctx, dst);
        default:
            return launch_v<D, nv_bfloat16>(ctx, dst);
    }
}

}  // namespace attn_paths_detail

using attn_paths_detail::launch_kv;

void ggml_ext_cuda_attn_paths(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    switch (dst->src[0]->ne[0]) {
        case 64:
            return launch_kv<64>(ctx, dst);
        case 128:
            return launch_kv<128>(ctx, dst);
        case 256:
            return launch_kv<256>(ctx, dst);
        default:
            GGML_ABORT("attn_paths: unsupported head size");  // excluded by supports_op
    }
}

bool ggml_ext_cuda_attn_paths_supported(const ggml_tensor * op) {
    const int64_t D = op->src[0]->ne[0];
    return (D == 64 || D == 128 || D == 256) && ggml_ext::attn_paths_supports_type(op->src[1]->type) &&
           ggml_ext::attn_paths_supports_type(op->src[2]->type) && op->src[0]->nb[0] == sizeof(float);
}
