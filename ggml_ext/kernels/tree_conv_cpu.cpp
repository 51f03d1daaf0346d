// CPU kernel of the tree short conv (compiled into ggml-cpu). Built with -ffp-contract=off and
// summing products in ggml_ssm_conv's order, so a node's output equals that op's on the node's
// path bit for bit (no fused multiply-adds; ggml's own loop vectorises the products instead).
#include "ggml_ext_tree_cpu.h"
#include "tree_conv_taps.h"

#include "ggml-cpu-impl.h"
#include "ggml.h"

#include <vector>

extern "C" void ggml_ext_compute_forward_tree_ssm_conv(const ggml_compute_params * params, ggml_tensor * dst) {
    const ggml_tensor * x = dst->src[0];
    const ggml_tensor * cs = dst->src[1];
    const ggml_tensor * w = dst->src[2];
    const int64_t C = x->ne[0], n = x->ne[1], K = w->ne[0];
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
                const float xv = src[j] >= 0 ? xd[src[j] * C + c] : csd[c * (K - 1) + (-1 - src[j])];
                sum += xv * wd[c * K + j];
            }
            out[i * C + c] = sum;
        }
    }
}
