// RMSNorm read by the quantizer of the weight matmul after it (patches/0010). A verify of the 27B
// runs 129 RMSNorm + weight nodes of n x 5120 floats (ggml-cuda fuses each pair into one
// rms_norm_f32 kernel, ~4.5 us on the H200 at 16 tokens); 97 of them are read only by one tagged
// product: the FFN's [gate; up] and the GDN layers' stacked input projections. Here the GEMM's
// quantizer computes the column's norm scale itself, in rms_norm_f32's order (act_source.cuh's
// column_scale: the same float operations, so the quantized activations, and the outputs, are the
// unfused graph's bits), and the norm and multiply nodes are skipped. Each quantizer block re-read
// its column (k floats, from L2) for the sum, until session 34's block a column
// (quantize_act_norm_column_kernel): cheaper than a launch and a round trip of the normed output
// up to kMaxColumns columns. One column (a decode step): the GEMV's quantizer, on by default
// (DFLASH_FUSE_RMS_NORM_GEMV=0 turns it off; gemv::quantize_act_norm_kernel: ggml's 1024 norm
// threads a column; the engine then also builds a decode's input products next to each other, for
// the pairs: ForwardSpec::adjacent_products).
// H200, the 27B (session 24, kernel_profile, same run): a forward of 16 / 32 tokens 9.43 / 12.95
// ms of kernels against 9.75 / 13.19 unfused (the quantizers 0.13 / 0.17 ms slower, the norms
// 0.43 ms fewer), 64 tokens 19.37 against 19.47; bench/results/h200-s24-27b-kernels-2ea4ca3*.json.
// Session 32 added two forms, on by default since session 33 (DFLASH_FUSE_RMS_NORM_PAIR=0 and
// DFLASH_FUSE_HEAD_NORM=0 turn them off):
// the 32 norms read by two products (fuse_pair) and the 48 per-head norms of the delta rule's gated
// outputs (fuse_head_norm); with them a 16-token verify of the 27B runs 80 norm kernels and 32
// quantizer launches fewer (32 of ggml's 1024-thread norms, 0.13 ms on the H200 in session 30, 48
// of its 256-thread ones, ~0.11 ms, and ~0.12 ms of quantizers), less what the quantizers add.
// On the H100 (session 33, same run): the pair alone took 0.15 / 0.13 / 0.13 ms off the 16 / 32 / 64-
// token forwards, the head norm alone 0.07 / 0.12 / 0.19 (h100-s33-f1-27b-kernels-*).
#include "ggml_ext_gemv_cuda.cuh"
#include "ggml_ext_matmul.h"
#include "ggml_ext_matmul_cuda.cuh"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "ggml-impl.h"
#include "fusion_patterns.h"

namespace {

bool fuse_rms_norm_flag = [] {
    const char * e = std::getenv("DFLASH_FUSE_RMS_NORM");
    return !(e && e[0] == '0');
}();
std::atomic<int64_t> rms_norm_fusions{0};

// Columns up to which the quantizer computes the norm (DFLASH_FUSE_RMS_NORM_COLUMNS for benches):
// a quantizer block per 256 values and column re-reads its column, 64 x 20 blocks of 20 KB a
// launch for a 64-token verify of the 27B, and still gained there on the H200 (19.37 against
// 19.47 ms of kernels, session 24); more columns run in launches of 64 and stay unfused (not measured).
constexpr int kMaxColumns = 64;
int max_columns_flag = [] {
    const char * e = std::getenv("DFLASH_FUSE_RMS_NORM_COLUMNS");
    return e && std::atoi(e) >= 2 ? std::atoi(e) : kMaxColumns;
}();

// The source of rms_norm(x) * w (w a row of x's width, broadcast over the columns).
bool rms_norm_source(const ggml_tensor * norm, const ggml_tensor * mul, ActSource & s) {
    const ggml_tensor * x = norm->src[0];
    const ggml_tensor * w = mul->src[1];
    if (mul->src[0] != norm || !x || !w || !plain_f32_columns(x) || !plain_f32_columns(norm) ||
        !plain_f32_columns(mul) || !ggml_are_same_shape(x, norm) || !ggml_are_same_shape(norm, mul) ||
        w->type != GGML_TYPE_F32 || !ggml_is_contiguous(w) || ggml_nelements(w) != x->ne[0] || w->ne[0] != x->ne[0]) {
        return false;
    }
    float eps;
    std::memcpy(&eps, norm->op_params, sizeof(float));
    s.x = (const float *)x->data;
    s.sx = (int64_t)(x->nb[1] / sizeof(float));
    s.norm_w = (const float *)w->data;
    s.norm_eps = eps;
    s.norm_threads = x->ne[0] < 1024 ? 256 : 1024;  // ggml's rms_norm_f32 block for these rows (norm.cu)
    return true;
}

// On unless the variable is "0" (both on by default since session 33: h100-s33-*).
bool env_not_off(const char * name) {
    const char * e = std::getenv(name);
    return !(e && e[0] == '0');
}
bool fuse_pair_flag = env_not_off("DFLASH_FUSE_RMS_NORM_PAIR");
// One column: on by default since session 52 (H100, same run: the 27B's decode step 8.064 against
// 8.532 ms of kernels, 853 launches against 1014; bench/results/h100-s52-c1-*).
bool fuse_gemv_flag = env_not_off("DFLASH_FUSE_RMS_NORM_GEMV");
bool fuse_head_flag = env_not_off("DFLASH_FUSE_HEAD_NORM");
std::atomic<int64_t> pair_fusions{0}, head_fusions{0}, gemv_fusions{0};

namespace pat = ggml_ext::fusion_patterns;

// The one product after the norm (the FFN's [gate; up], a GDN layer's stacked input projections).
int fuse_single(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i) {
    ActSource x;
    if (!pat::single_at(cgraph, i) || !rms_norm_source(cgraph->nodes[i], cgraph->nodes[i + 1], x)) return 0;
    const ggml_tensor * mul = cgraph->nodes[i + 1];
    ggml_tensor * mm = cgraph->nodes[i + 2];
    const int64_t n = mul->ne[1];
    if (n == 1) {  // a decode step: the GEMV's quantizer (ggml_ext_gemv_norm_source_ok)
        if (!fuse_gemv_flag || !ggml_ext_cuda_gemv_from(ctx, mm->src[0], x, 1, mm, nullptr)) return 0;
        gemv_fusions++;
        return 2;
    }
    if (n > max_columns_flag || !ggml_ext_cuda_gemm_mma_from(ctx, mm->src[0], x, n, mm, nullptr)) {
        return 0;
    }
    rms_norm_fusions++;
    return 2;
}

// Whether a GLU among the few nodes from j reads t: at one column the FFN's gate and up products,
// which ggml-cuda runs as one gated GEMV reading the activations once (split into two GEMVs by the
// pair below, a decode step of the 27B on the H100 ran 128 GEMV launches more, +141 us, against
// the 406 us of norms it saved; session 34, bench/results/h100-s34-*). A pair that fuse_gemv_glu
// does not take (gate and up of two types) keeps the norm node for that reason.
bool read_by_glu(const ggml_cgraph * g, int j, const ggml_tensor * t) {
    for (int m = j; m < g->n_nodes && m < j + 4; ++m) {
        const ggml_tensor * node = g->nodes[m];
        if (node->op == GGML_OP_GLU && (node->src[0] == t || node->src[1] == t)) return true;
    }
    return false;
}

// A decode step's FFN (fusion_patterns' glu_pair_at): the norm's two products read only by the
// SwiGLU right after them, which ggml-cuda would run as one gated GEMV of the normed activations:
// that GEMV from the norm's quantizer instead: the norm, the multiply, both products and the GLU,
// 4 nodes skipped after the norm's (ggml-cuda's loop takes the count past node i).
int fuse_gemv_glu(ggml_backend_cuda_context & ctx, ggml_cgraph * g, int i, const ActSource & x) {
    if (!pat::glu_pair_at(g, i)) return 0;
    ggml_tensor * glu = g->nodes[i + 4];
    return ggml_ext_cuda_gemv_glu_from(ctx, glu->src[1]->src[0], glu->src[0]->src[0], x, glu) ? 4 : 0;
}

// Two products right after the norm, both reading it (a layer whose Q6_K attn_qkv or attn_v sits
// beside the Q4_K stack of its other input projections; qwen35_graph.cpp's project() puts them
// next to each other): one quantizer launch writes both types' layouts (32 such layers in the
// 27B's Q4_K_M: 32 norm kernels and 32 quantizer launches fewer a verify).
int fuse_pair(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i) {
    ActSource x;
    if (!pat::pair_at(cgraph, i) || !rms_norm_source(cgraph->nodes[i], cgraph->nodes[i + 1], x)) return 0;
    const ggml_tensor * mul = cgraph->nodes[i + 1];
    ggml_tensor * mm1 = cgraph->nodes[i + 2];
    ggml_tensor * mm2 = cgraph->nodes[i + 3];
    const int64_t n = mul->ne[1];
    if (n == 1) {  // a decode step: one GEMV quantizer launch for both, or for a SwiGLU's gated GEMV
        if (!fuse_gemv_flag) return 0;
        if (const int taken = fuse_gemv_glu(ctx, cgraph, i, x)) {
            gemv_fusions++;
            return taken;
        }
        if (read_by_glu(cgraph, i + 4, mm1) || read_by_glu(cgraph, i + 4, mm2) ||
            !ggml_ext_cuda_gemv_pair_from(ctx, mm1->src[0], mm1, mm2->src[0], mm2, x, 1)) {
            return 0;
        }
        gemv_fusions++;
        return 3;
    }
    if (n > max_columns_flag || !ggml_ext_cuda_gemm_mma_pair_from(ctx, mm1->src[0], mm1, mm2->src[0], mm2, x, n)) {
        return 0;
    }
    pair_fusions++;
    return 3;
}

// The delta rule's gated output (qwen35_graph.cpp's gated_output; fusion_patterns'
// head_norm_glu_at): the product's quantizer computes silu(z) * ((s o) * w) itself, s each head's
// norm scale in rms_norm_f32's order (act_source.cuh's head_w), so the norm kernel (48 a verify of
// the 27B) is skipped with the SwiGLU; the residual add after the product is taken as the SwiGLU
// fusion takes it.
int fuse_head_norm(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i) {
    const int k = pat::head_norm_glu_at(cgraph, i);
    if (k < 0) return 0;
    const ggml_tensor * norm = cgraph->nodes[i];
    const ggml_tensor * o = norm->src[0];
    const ggml_tensor * glu = cgraph->nodes[k];
    const ggml_tensor * z = glu->src[0];
    const int64_t n = glu->ne[1];
    if (n < 2) return 0;  // one column: the GEMV, whose quantizer does not take a head norm
    float eps;
    std::memcpy(&eps, norm->op_params, sizeof(float));
    ActSource x;
    x.x = (const float *)z->data;
    x.sx = (int64_t)(z->nb[1] / sizeof(float));
    x.up = (const float *)o->data;
    x.sup = (int64_t)(o->nb[2] / sizeof(float));
    x.head_w = (const float *)cgraph->nodes[i + 1]->src[1]->data;
    x.head = (int)o->ne[0];
    x.head_eps = eps;
    const int taken = ggml_ext_cuda_run_glu_product(ctx, cgraph, k + 1, x, n);
    if (taken == 0) return 0;
    head_fusions++;
    return k + taken - i;
}

}  // namespace

namespace ggml_ext {
void set_fuse_rms_norm_enabled(bool on) { fuse_rms_norm_flag = on; }
bool fuse_rms_norm_enabled() { return fuse_rms_norm_flag; }
int64_t mul_mat_rms_norm_fusions() { return rms_norm_fusions.load(); }
void set_fuse_rms_norm_gemv_enabled(bool on) { fuse_gemv_flag = on; }
bool fuse_rms_norm_gemv_enabled() { return fuse_gemv_flag; }
int64_t mul_mat_rms_norm_gemv_fusions() { return gemv_fusions.load(); }
void set_fuse_rms_norm_pair_enabled(bool on) { fuse_pair_flag = on; }
bool fuse_rms_norm_pair_enabled() { return fuse_pair_flag; }
int64_t mul_mat_rms_norm_pair_fusions() { return pair_fusions.load(); }
void set_fuse_head_norm_enabled(bool on) { fuse_head_flag = on; }
bool fuse_head_norm_enabled() { return fuse_head_flag; }
int64_t mul_mat_head_norm_fusions() { return head_fusions.load(); }
}  // namespace ggml_ext

int ggml_ext_cuda_try_fuse_rms_norm(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i) {
    if (!fuse_rms_norm_flag || i + 2 >= cgraph->n_nodes) return 0;
    if (const int n = fuse_single(ctx, cgraph, i)) return n;
    if (fuse_pair_flag) {
        if (const int n = fuse_pair(ctx, cgraph, i)) return n;
    }
    // the head norm takes the SwiGLU too: only where that fusion is on (DFLASH_FUSE_GLU=0 keeps the node)
    return fuse_head_flag && ggml_ext::fuse_glu_enabled() ? fuse_head_norm(ctx, cgraph, i) : 0;
}
