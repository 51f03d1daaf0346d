// CPU kernel of the path attention op (ggml_ext_attn.h; compiled into ggml-cpu). Each (query,
// head) walks its virtual rows in tiles of kAttnPathsTile with the online softmax in a fixed
// order, as the CUDA kernel does, so a query's output depends only on its own rows.
#include "ggml-cpu-impl.h"
#include "ggml.h"
#include "ggml_ext_attn.h"
#include "ggml_ext_tree_cpu.h"

#include <cmath>
#include <cstring>
#include <vector>

namespace {

// Row `row`, head `h` of a [D, H, rows] K or V view, as floats.
void load_row(const ggml_tensor * t, int64_t row, int64_t h, float * out) {
    const char * src = (const char *)t->data + row * t->nb[2] + h * t->nb[1];
    const int64_t D = t->ne[0];
    if (t->type == GGML_TYPE_F32) {
        std::memcpy(out, src, D * sizeof(float));
    } else {
        ggml_get_type_traits(t->type)->to_float(src, out, D);
    }
}

}  // namespace

extern "C" void ggml_ext_compute_forward_attn_paths(const ggml_compute_params * params, ggml_tensor * dst) {
    const ggml_tensor * q = dst->src[0];
    const ggml_tensor * k = dst->src[1];
    const ggml_tensor * v = dst->src[2];
    const ggml_tensor * paths = dst->src[3];
    const int64_t D = q->ne[0], H = q->ne[1], n = q->ne[2], gqa = H / k->ne[1], W = paths->ne[0];
    constexpr int T = ggml_ext::kAttnPathsTile;
    float scale;
    std::memcpy(&scale, dst->op_params, sizeof(scale));

    thread_local std::vector<float> krow, vt, acc;
    krow.resize(D);
    vt.resize((size_t)T * D);
    acc.resize(D);
    float s[T], p[T];
    for (int64_t pair = params->ith; pair < n * H; pair += params->nth) {
        const int64_t i = pair / H, h = pair % H, hkv = h / gqa;
        const float * qr = (const float *)((const char *)q->data + i * q->nb[2] + h * q->nb[1]);
        const int32_t * info = (const int32_t *)paths->data + i * W;
        const int64_t P = info[0], total = P + info[1];
        float m = -INFINITY, l = 0.0f;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t t0 = 0; t0 < total; t0 += T) {
            const int cnt = (int)std::min<int64_t>(T, total - t0);
            float tm = -INFINITY;
            for (int j = 0; j < cnt; ++j) {
                const int64_t vpos = t0 + j, row = vpos < P ? vpos : info[2 + vpos - P];
                load_row(k, row, hkv, krow.data());
                float dot = 0.0f;
                for (int64_t d = 0; d < D; ++d) dot += qr[d] * krow[d];
                s[j] = dot * scale;
                tm = std::max(tm, s[j]);
                load_row(v, row, hkv, vt.data() + (size_t)j * D);
            }
            const float m_new = std::max(m, tm), corr = expf(m - m_new);
            float psum = 0.0f;
            for (int j = 0; j < cnt; ++j) {
                p[j] = expf(s[j] - m_new);
                psum += p[j];
            }
            l = l * corr + psum;
            for (int64_t d = 0; d < D; ++d) {
                float a = 0.0f;
                for (int j = 0; j < cnt; ++j) a += p[j] * vt[(size_t)j * D + d];
                acc[d] = acc[d] * corr + a;
            }
            m = m_new;
        }
        float * out = (float *)((char *)dst->data + i * dst->nb[2] + h * dst->nb[1]);
        for (int64_t d = 0; d < D; ++d) out[d] = acc[d] / l;
    }
}
