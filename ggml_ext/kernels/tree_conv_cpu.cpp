// CPU kernel of the tree short conv (compiled into ggml-cpu). A node's output must equal
// ggml_ssm_conv's on the node's path bit for bit: the same taps in the same order, each step
// `sum += x * w` as ggml's loop is compiled. ggml-cpu builds as GNU C++ (-ffp-contract=fast), so
// on a target with FMA the compiler fuses that step into one fused multiply-add; this file is
// built with -ffp-contract=off and spells the step out, fused exactly where ggml's is.
#include "ggml_ext_tree_cpu.h"
#include "tree_conv_taps.h"

#include "ggml-cpu-impl.h"
#include "ggml.h"

#include <cmath>
#include <vector>

namespace {

inline float conv_step(float sum, float x, float w) {
#if defined(__FMA__)
    return std::fmaf(x, w, sum);  // what -ffp-contract=fast makes of ggml's `sumf += s * c`
#else
    return sum + x * w;
#endif
}

}  // namespace

extern "C" void ggml_ext_compute_forward_tree_ssm_conv(const ggml_compute_params * params, ggml_tensor * dst) {
    const ggml_tensor * x = dst->src[0];
    const ggml_tensor * cs = dst->src[1];
    const ggml_tensor * w = dst->src[2];
    const int64_t C = x->ne[0], n = x->ne[1], K = w->ne[0];
    const int64_t sx = x->nb[1] / sizeof(float);  // x's rows may lie apart
    const int32_t * parent = (const int32_t *)dst->src[3]->data;
    const float * xd = (const float *)x->data;
    const float * csd = (const float *)cs->data;  // [K-1, C]: column K-2 is the newest input
    const float * wd = (const float *)w->data;    // [K, C]: tap K-1 multiplies the node itself
    float * out = (float *)dst->data;

    std::vector<int64_t> src(K);  // per tap: x column (>= 0) or -1 - conv state column
    for (int64_t i = params->ith; i < n; i += params->nth) {
        tree_conv_taps(parent, i, (int)K, src.data());
        for (int64_t c = 0; c < C; ++c) {
            float sum = 0.0f;
            for (int64_t j = 0; j < K; ++j) {
                const float xv = src[j] >= 0 ? xd[src[j] * sx + c] : csd[c * (K - 1) + (-1 - src[j])];
                sum = conv_step(sum, xv, wd[c * K + j]);
            }
            out[i * C + c] = sum;
        }
    }
}
