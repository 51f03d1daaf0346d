// CPU kernel of the fused one-token Gated DeltaNet inputs (ggml_ext_gdn.h): threads take heads
// (S channels each); thread 0 also the gate and beta.
#include "ggml_ext_tree_cpu.h"

#include "ggml-cpu-impl.h"
#include "ggml.h"

#include <cmath>
#include <cstring>

extern "C" void ggml_ext_compute_forward_gdn_decode_inputs(const ggml_compute_params * params, ggml_tensor * dst) {
    const float * x = (const float *)dst->src[0]->data;
    const float * alpha = (const float *)dst->src[1]->data;
    const float * beta = (const float *)dst->src[2]->data;
    float * state = (float *)dst->src[3]->data;  // [K-1, C], advanced in place
    const float * w = (const float *)dst->src[4]->data;
    const float * dt_bias = (const float *)dst->src[5]->data;
    const float * a = (const float *)dst->src[6]->data;
    const int64_t S = ((const int32_t *)dst->op_params)[0], Hk = ((const int32_t *)dst->op_params)[1];
    float norm[2];  // eps / S, 1 / sqrt(S)
    std::memcpy(norm, dst->op_params + 2, sizeof(norm));
    const int64_t C = ggml_nelements(dst->src[0]), Hv = ggml_nelements(dst->src[1]), K = dst->src[4]->ne[0];
    float * out = (float *)dst->data;

    for (int64_t h = params->ith; h < C / S; h += params->nth) {
        double ss = 0.0;
        for (int64_t c = h * S; c < (h + 1) * S; ++c) {
            float * st = state + c * (K - 1);
            const float * wc = w + c * K;
            float sum = 0.0f;
            for (int64_t i = 0; i < K - 1; ++i) sum += st[i] * wc[i];
            sum += x[c] * wc[K - 1];
            for (int64_t i = 0; i + 1 < K - 1; ++i) st[i] = st[i + 1];
            st[K - 2] = x[c];
            const float y = sum / (1.0f + expf(-sum));
            out[c] = y;
            ss += (double)y * y;
        }
        if (h < 2 * Hk) {  // q and k heads: rms_norm(eps / S), then times 1 / sqrt(S)
            const float scale = 1.0f / sqrtf((float)(ss / (double)S) + norm[0]);
            for (int64_t c = h * S; c < (h + 1) * S; ++c) out[c] = norm[1] * (scale * out[c]);
        }
    }
    if (params->ith == 0) {
        for (int64_t h = 0; h < Hv; ++h) {
            const float z = alpha[h] + dt_bias[h];
            out[C + h] = (z > 20.0f ? z : logf(1.0f + expf(z))) * a[h];
            out[C + Hv + h] = 1.0f / (1.0f + expf(-beta[h]));
        }
    }
}
