// CPU kernel of the fused Gated DeltaNet inputs (ggml_ext_gdn.h): threads take heads (S channels
// each); thread 0 also the gate and beta. One token (mode 0), n tokens of a chain (1) or of a tree (2).
#include "ggml_ext_gdn.h"
#include "ggml_ext_tree_cpu.h"
#include "tree_conv_taps.h"

#include "ggml-cpu-impl.h"
#include "ggml.h"

#include <cmath>
#include <cstring>
#include <vector>

namespace {

// SiLU of the conv of one head's S channels c0.. for one token (window(c, j): tap j's input),
// L2-normed when it is a q or k head, into out[c0..c0+S).
template <typename Window>
void head_inputs(const Window & window, const float * w, int64_t c0, int64_t S, int64_t K, bool l2, const float * norm,
                 float * out) {
    double ss = 0.0;
    for (int64_t c = c0; c < c0 + S; ++c) {
        const float * wc = w + c * K;
        float sum = 0.0f;
        for (int64_t j = 0; j < K; ++j) sum += window(c, j) * wc[j];
        const float y = sum / (1.0f + expf(-sum));
        out[c - c0] = y;
        ss += (double)y * y;
    }
    if (l2) {  // q and k heads: rms_norm(eps / S), then times 1 / sqrt(S)
        const float scale = 1.0f / sqrtf((float)(ss / (double)S) + norm[0]);
        for (int64_t c = 0; c < S; ++c) out[c] = norm[1] * (scale * out[c]);
    }
}

void gate_beta(const float * alpha, const float * beta, const float * dt_bias, const float * a, int64_t Hv,
               float * gate, float * b) {
    for (int64_t h = 0; h < Hv; ++h) {
        const float z = alpha[h] + dt_bias[h];
        gate[h] = (z > 20.0f ? z : logf(1.0f + expf(z))) * a[h];
        b[h] = 1.0f / (1.0f + expf(-beta[h]));
    }
}

// Modes 1 and 2: n tokens of a chain (ggml_ext::gdn_verify_inputs) or nodes of a tree
// (gdn_tree_inputs), the conv state read only. A tap's source as tree_conv_taps gives it: an x
// column when >= 0, else -1 - c for column c of the conv state.
void verify_inputs(const ggml_compute_params * params, ggml_tensor * dst, bool tree) {
    const ggml_tensor * tx = dst->src[0];
    const ggml_tensor * ta = dst->src[1];
    const ggml_tensor * tb = dst->src[2];
    const float * state = (const float *)dst->src[3]->data;  // [K-1, C]
    const float * w = (const float *)dst->src[4]->data;
    const float * dt_bias = (const float *)dst->src[5]->data;
    const float * a = (const float *)dst->src[6]->data;
    const int32_t * parent = tree ? (const int32_t *)dst->src[7]->data : nullptr;
    const int64_t S = ((const int32_t *)dst->op_params)[0], Hk = ((const int32_t *)dst->op_params)[1];
    float norm[2];
    std::memcpy(norm, dst->op_params + 2, sizeof(norm));
    const int64_t C = tx->ne[0], n = tx->ne[1], Hv = ta->ne[0], K = dst->src[4]->ne[0];
    const int64_t sx = tx->nb[1] / sizeof(float);
    const float * x = (const float *)tx->data;
    float * out = (float *)dst->data;
    auto value = [&](int64_t c, int64_t src) { return src >= 0 ? x[src * sx + c] : state[c * (K - 1) + (-1 - src)]; };
    auto chain_tap = [&](int64_t p) { return p < K - 1 ? -1 - p : p - (K - 1); };  // column p of [state, x]
    std::vector<int64_t> taps(K);
    for (int64_t t = params->ith; t < n * (C / S); t += params->nth) {
        const int64_t i = t / (C / S), h = t % (C / S);
        if (tree) {
            tree_conv_taps(parent, i, (int)K, taps.data());
        } else {
            for (int64_t j = 0; j < K; ++j) taps[j] = chain_tap(i + j);
        }
        head_inputs([&](int64_t c, int64_t j) { return value(c, taps[j]); }, w, h * S, S, K, h < 2 * Hk, norm,
                    out + i * C + h * S);
    }
    if (params->ith != 0) return;
    for (int64_t i = 0; i < n; ++i) {
        gate_beta((const float *)((const char *)ta->data + i * ta->nb[1]),
                  (const float *)((const char *)tb->data + i * tb->nb[1]), dt_bias, a, Hv, out + n * C + i * Hv,
                  out + n * C + n * Hv + i * Hv);
    }
    if (tree) return;
    float * tail = out + n * C + 2 * n * Hv;  // a chain's conv state after its last token
    for (int64_t c = 0; c < C; ++c) {
        for (int64_t j = 0; j < K - 1; ++j) tail[c * (K - 1) + j] = value(c, chain_tap(n + j));
    }
}

}  // namespace

extern "C" void ggml_ext_compute_forward_gdn_decode_inputs(const ggml_compute_params * params, ggml_tensor * dst) {
    const int mode = dst->op_params[ggml_ext::kGdnInputsModeParam];
    if (mode != 0) {
        verify_inputs(params, dst, mode == 2);
        return;
    }
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
