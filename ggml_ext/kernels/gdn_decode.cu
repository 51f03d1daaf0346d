// CUDA kernel of the fused one-token Gated DeltaNet inputs (ggml_ext_gdn.h): block h < C / S takes
// head h's S channels (one thread each: the conv taps, the state shift, SiLU; a block sum for the
// L2 norm of q and k heads); the last block the gate and beta. Same formulas as ggml's CUDA
// kernels for ssm_conv, silu, rms_norm + scale, softplus and sigmoid.
#include "ggml_ext_tree_cuda.cuh"

#include <cstring>

namespace {

__global__ void gdn_decode_inputs_kernel(const float * __restrict__ x, const float * __restrict__ alpha,
                                         const float * __restrict__ beta, float * __restrict__ state,
                                         const float * __restrict__ w, const float * __restrict__ dt_bias,
                                         const float * __restrict__ a, float * __restrict__ out, const int C,
                                         const int K, const int S, const int Hk, const int Hv, const float eps) {
    const int h = blockIdx.x;
    if (h == C / S) {  // gate and beta
        for (int i = threadIdx.x; i < Hv; i += blockDim.x) {
            const float z = alpha[i] + dt_bias[i];
            out[C + i] = (z > 20.0f ? z : logf(1.0f + expf(z))) * a[i];
            out[C + Hv + i] = 1.0f / (1.0f + expf(-beta[i]));
        }
        return;
    }
    const int c = h * S + threadIdx.x;  // blockDim.x == S
    float * st = state + (int64_t)c * (K - 1);
    const float * wc = w + (int64_t)c * K;
    float sum = 0.0f;
    for (int i = 0; i < K - 1; ++i) sum += st[i] * wc[i];
    const float xv = x[c];
    sum += xv * wc[K - 1];
    for (int i = 0; i + 1 < K - 1; ++i) st[i] = st[i + 1];
    st[K - 2] = xv;
    float y = sum / (1.0f + expf(-sum));
    if (h < 2 * Hk) {
        __shared__ float part[32];
        float ss = y * y;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffff, ss, o);
        if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
        __syncthreads();
        ss = 0.0f;
        for (int i = 0; i < S / 32; ++i) ss += part[i];
        y *= rsqrtf(ss / (float)S + eps / (float)S) * (1.0f / sqrtf((float)S));
    }
    out[c] = y;
}

}  // namespace

void ggml_ext_cuda_gdn_decode_inputs(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const int S = ((const int32_t *)dst->op_params)[0], Hk = ((const int32_t *)dst->op_params)[1];
    float eps;
    std::memcpy(&eps, dst->op_params + 2, sizeof(float));
    const int C = (int)ggml_nelements(dst->src[0]), Hv = (int)ggml_nelements(dst->src[1]);
    const int K = (int)dst->src[4]->ne[0];
    gdn_decode_inputs_kernel<<<C / S + 1, S, 0, ctx.stream()>>>(
        (const float *)dst->src[0]->data, (const float *)dst->src[1]->data, (const float *)dst->src[2]->data,
        (float *)dst->src[3]->data, (const float *)dst->src[4]->data, (const float *)dst->src[5]->data,
        (const float *)dst->src[6]->data, (float *)dst->data, C, K, S, Hk, Hv, eps);
    CUDA_CHECK(cudaGetLastError());
}

bool ggml_ext_cuda_gdn_decode_inputs_supported(const ggml_tensor * op) {
    const int64_t S = ((const int32_t *)op->op_params)[0];
    return S % 32 == 0 && S <= 1024;
}
