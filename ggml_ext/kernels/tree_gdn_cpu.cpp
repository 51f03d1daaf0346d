// CPU kernel of the tree delta rule (compiled into ggml-cpu). It uses ggml's own vector
// helpers in the same order as ggml_gated_delta_net, so a chain-shaped tree reproduces that op's
// outputs bit for bit.
#include "ggml_ext_tree_cpu.h"

#include "ggml-cpu-impl.h"
#include "ggml.h"
#include "vec.h"

#include <cmath>
#include <cstring>
#include <vector>

extern "C" void ggml_ext_compute_forward_tree_gated_delta_net(const ggml_compute_params * params, ggml_tensor * dst) {
    const ggml_tensor * q = dst->src[0];
    const ggml_tensor * k = dst->src[1];
    const ggml_tensor * v = dst->src[2];
    const ggml_tensor * g = dst->src[3];
    const ggml_tensor * beta = dst->src[4];
    const ggml_tensor * state = dst->src[5];
    const int64_t S = v->ne[0], H = v->ne[1], n = v->ne[2], Hk = q->ne[1];
    const int32_t * parent = (const int32_t *)dst->src[6]->data;
    const int32_t * order = parent + n;
    const int32_t * depth = parent + 2 * n;
    const int max_depth = dst->op_params[0];
    const float scale = 1.0f / sqrtf((float)S);
    const float * gd = (const float *)g->data;     // [1, H, n]
    const float * bd = (const float *)beta->data;  // [1, H, n]

    // one S x S state per depth (transposed like ggml_gated_delta_net: row j = column j of S)
    thread_local std::vector<float> stack;
    thread_local std::vector<float> delta;
    stack.resize((size_t)(max_depth + 1) * S * S);
    delta.resize(S);

    for (int64_t h = params->ith; h < H; h += params->nth) {
        const int64_t hk = h % Hk;
        const float * s0 = (const float *)state->data + h * S * S;
        for (int64_t t = 0; t < n; ++t) {
            const int32_t node = order[t], p = parent[node], d = depth[node];
            float * M = stack.data() + (size_t)d * S * S;
            memcpy(M, p < 0 ? s0 : stack.data() + (size_t)(d - 1) * S * S, S * S * sizeof(float));

            const float * qd = (const float *)((const char *)q->data + node * q->nb[2] + hk * q->nb[1]);
            const float * kd = (const float *)((const char *)k->data + node * k->nb[2] + hk * k->nb[1]);
            const float * vd = (const float *)((const char *)v->data + node * v->nb[2] + h * v->nb[1]);
            const float b = bd[node * H + h];
            ggml_vec_scale_f32(S * S, M, expf(gd[node * H + h]));
            for (int64_t j = 0; j < S; ++j) {
                float sum = 0.0f;
                ggml_vec_dot_f32(S, &sum, 0, &M[j * S], 0, kd, 0, 1);
                delta[j] = (vd[j] - sum) * b;
            }
            for (int64_t j = 0; j < S; ++j) ggml_vec_mad_f32(S, &M[j * S], kd, delta[j]);
            float * o = (float *)dst->data + node * S * H + h * S;
            for (int64_t j = 0; j < S; ++j) {
                float sum = 0.0f;
                ggml_vec_dot_f32(S, &sum, 0, &M[j * S], 0, qd, 0, 1);
                o[j] = sum * scale;
            }
        }
    }
}
