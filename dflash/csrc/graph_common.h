// Small graph pieces shared by the target and draft graphs.
#pragma once

#include "ggml.h"
#include "ggml_ext_matmul.h"

namespace dflash {

// RMSNorm then the (already +1) weight.
inline ggml_tensor * rms_norm_mul(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, float eps) {
    return ggml_mul(ctx, ggml_rms_norm(ctx, x, eps), w);
}

// A weight matmul: ggml_ext::mul_mat_tiles (ggml's product; on CUDA, mmq launched without the
// stream-k fixup where that is cheaper), or ggml_ext::mul_mat_invariant
// (ggml_ext/BATCH_INVARIANCE.md).
using MatMulFn = ggml_tensor * (*)(ggml_context *, ggml_tensor *, ggml_tensor *);

// SwiGLU MLP: down(silu(gate x) * up x).
inline ggml_tensor * swiglu_ffn(ggml_context * ctx, ggml_tensor * x, ggml_tensor * gate, ggml_tensor * up,
                                ggml_tensor * down, MatMulFn mm = ggml_ext::mul_mat_tiles) {
    return mm(ctx, down, ggml_swiglu_split(ctx, mm(ctx, gate, x), mm(ctx, up, x)));
}

// A graph input of 1 or 2 dimensions (filled after allocation).
inline ggml_tensor * graph_input(ggml_context * ctx, ggml_type t, int64_t n0, int64_t n1 = 1) {
    ggml_tensor * x = n1 == 1 ? ggml_new_tensor_1d(ctx, t, n0) : ggml_new_tensor_2d(ctx, t, n0, n1);
    ggml_set_input(x);
    return x;
}

}  // namespace dflash
