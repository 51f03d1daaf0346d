// Graph constructors of the fused Gated DeltaNet inputs (ggml_ext_gdn.h): one token, n tokens; the
// CUDA delta rule switches' CPU stubs.
#include "ggml_ext_gdn.h"
#include "op_node.h"

#include <cmath>
#include <cstring>
#include <initializer_list>

namespace ggml_ext {

namespace {

// r becomes the op of `mode` (kGdnInputsModeParam) over srcs (qkv, alpha, beta, conv state, w,
// dt_bias, a). The L2 norm's constants are computed here as the unfused graph computes them
// (rms_norm's eps / S and ggml_scale's 1 / sqrt(S), on the host), so both give the same bits.
void make_op(ggml_tensor * r, std::initializer_list<ggml_tensor *> srcs, int64_t S, int64_t Hk, float eps, int mode) {
    const float d = (float)S, norm[2] = {eps / d, 1.0f / std::sqrt(d)};
    const int32_t params[2] = {(int32_t)S, (int32_t)Hk};
    std::memcpy(r->op_params, params, sizeof(params));
    std::memcpy(r->op_params + 2, norm, sizeof(norm));
    r->op_params[kGdnInputsModeParam] = mode;
    op_node(r, GGML_OP_GDN_DECODE_INPUTS, srcs);
}

}  // namespace

ggml_tensor * gdn_decode_inputs(ggml_context * ctx, ggml_tensor * qkv, ggml_tensor * alpha, ggml_tensor * beta_raw,
                                ggml_tensor * conv_state, ggml_tensor * w, ggml_tensor * dt_bias, ggml_tensor * a,
                                int64_t S, int64_t Hk, float eps) {
    const int64_t C = ggml_nelements(qkv), Hv = ggml_nelements(alpha), K = w->ne[0];
    for (ggml_tensor * t : {qkv, alpha, beta_raw, conv_state, w, dt_bias, a}) {
        GGML_ASSERT(t->type == GGML_TYPE_F32 && ggml_is_contiguous(t));
    }
    GGML_ASSERT(S > 0 && Hk > 0 && C == S * (2 * Hk + Hv) && K >= 2);
    GGML_ASSERT(ggml_nelements(beta_raw) == Hv && ggml_nelements(dt_bias) == Hv && ggml_nelements(a) == Hv);
    GGML_ASSERT(w->ne[1] == C && ggml_nelements(conv_state) == (K - 1) * C);
    ggml_tensor * r = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, C + 2 * Hv);
    make_op(r, {qkv, alpha, beta_raw, conv_state, w, dt_bias, a}, S, Hk, eps, 0);
    return r;
}

namespace {

// Checks for the n-token modes; returns the output's size (the conv state after the last token
// only for a chain).
int64_t check_tokens(ggml_tensor * qkv, ggml_tensor * alpha, ggml_tensor * beta_raw, ggml_tensor * conv_state,
                     ggml_tensor * w, ggml_tensor * dt_bias, ggml_tensor * a, int64_t S, int64_t Hk, bool chain) {
    const int64_t C = qkv->ne[0], n = qkv->ne[1], Hv = alpha->ne[0], K = w->ne[0];
    for (ggml_tensor * t : {qkv, alpha, beta_raw, conv_state, w, dt_bias, a}) GGML_ASSERT(t->type == GGML_TYPE_F32);
    for (ggml_tensor * t : {qkv, alpha, beta_raw}) {  // rows may lie apart
        GGML_ASSERT(ggml_is_contiguous_rows(t) && t->ne[1] == n && t->ne[2] == 1 && t->ne[3] == 1);
    }
    for (ggml_tensor * t : {conv_state, w, dt_bias, a}) GGML_ASSERT(ggml_is_contiguous(t));
    GGML_ASSERT(S > 0 && Hk > 0 && C == S * (2 * Hk + Hv) && K >= 2 && n >= 1);
    GGML_ASSERT(beta_raw->ne[0] == Hv && ggml_nelements(dt_bias) == Hv && ggml_nelements(a) == Hv);
    GGML_ASSERT(w->ne[1] == C && ggml_nelements(conv_state) == (K - 1) * C);
    return n * C + 2 * n * Hv + (chain ? (K - 1) * C : 0);
}

}  // namespace

ggml_tensor * gdn_verify_inputs(ggml_context * ctx, ggml_tensor * qkv, ggml_tensor * alpha, ggml_tensor * beta_raw,
                                ggml_tensor * conv_state, ggml_tensor * w, ggml_tensor * dt_bias, ggml_tensor * a,
                                int64_t S, int64_t Hk, float eps) {
    const int64_t size = check_tokens(qkv, alpha, beta_raw, conv_state, w, dt_bias, a, S, Hk, true);
    ggml_tensor * r = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, size);
    make_op(r, {qkv, alpha, beta_raw, conv_state, w, dt_bias, a}, S, Hk, eps, 1);
    return r;
}

ggml_tensor * gdn_tree_inputs(ggml_context * ctx, ggml_tensor * qkv, ggml_tensor * alpha, ggml_tensor * beta_raw,
                              ggml_tensor * conv_state, ggml_tensor * w, ggml_tensor * dt_bias, ggml_tensor * a,
                              ggml_tensor * tree, int64_t S, int64_t Hk, float eps) {
    const int64_t size = check_tokens(qkv, alpha, beta_raw, conv_state, w, dt_bias, a, S, Hk, false);
    GGML_ASSERT(tree->type == GGML_TYPE_I32 && tree->ne[0] == qkv->ne[1] && tree->ne[1] == 3);
    GGML_ASSERT(ggml_is_contiguous(tree));
    ggml_tensor * r = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, size);
    make_op(r, {qkv, alpha, beta_raw, conv_state, w, dt_bias, a, tree}, S, Hk, eps, 2);
    return r;
}

#ifndef DFLASH_HAS_CUDA  // the CUDA kernels' switches (kernels/gdn_chain.cu): nothing to switch on the CPU
void set_gdn_columns(int) {}
int gdn_columns() { return 1; }
void set_gdn_chain_enabled(bool) {}
bool gdn_chain_enabled() { return false; }
void set_gdn_staged(bool) {}
bool gdn_staged() { return false; }
void set_tree_gdn_mode(int) {}
int tree_gdn_mode() { return 0; }
void set_gdn_chunked(bool) {}
bool gdn_chunked() { return false; }
void set_gdn_chunked_min_tokens(int) {}
int gdn_chunked_min_tokens() { return kChunkedDeltaRuleMinTokens; }
void set_gdn_one_round(bool) {}
bool gdn_one_round() { return false; }
void set_gdn_one_round_columns(int) {}
int gdn_one_round_columns() { return 0; }
void set_gdn_one_round_lanes(int) {}
int gdn_one_round_lanes() { return 0; }
void set_gdn_one_round_step(int) {}
int gdn_one_round_step() { return 0; }
void set_gdn_inputs_tokens(int) {}
int gdn_inputs_tokens() { return 0; }
void set_gdn_gram(bool) {}
bool gdn_gram() { return false; }
#endif

}  // namespace ggml_ext
