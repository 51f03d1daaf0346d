// RMSNorm read by the quantizer of the weight matmul after it (patches/0010). A verify of the 27B
// runs 129 RMSNorm + weight nodes of n x 5120 floats (ggml-cuda fuses each pair into one
// rms_norm_f32 kernel, ~4.5 us on the H200 at 16 tokens); 97 of them are read only by one tagged
// product: the FFN's [gate; up] and the GDN layers' stacked input projections. Here the GEMM's
// quantizer computes the column's norm scale itself, in rms_norm_f32's order (act_source.cuh's
// column_scale: the same float operations, so the quantized activations, and the outputs, are the
// unfused graph's bits), and the norm and multiply nodes are skipped. Each quantizer block re-reads
// its column (k floats, from L2) for the sum: cheaper than a launch and a round trip of the normed
// output up to kMaxColumns columns. The GEMM only: one column keeps the GEMV and the norm kernel.
// H200, the 27B (session 24, kernel_profile, same run): a forward of 16 / 32 tokens 9.43 / 12.95
// ms of kernels against 9.75 / 13.19 unfused (the quantizers 0.13 / 0.17 ms slower, the norms
// 0.43 ms fewer), 64 tokens 19.37 against 19.47; bench/results/h200-s24-27b-kernels-2ea4ca3*.json.
#include "ggml_ext_gemv_cuda.cuh"
#include "ggml_ext_matmul.h"
#include "ggml_ext_matmul_cuda.cuh"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "ggml-impl.h"

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

}  // namespace

namespace ggml_ext {
void set_fuse_rms_norm_enabled(bool on) { fuse_rms_norm_flag = on; }
bool fuse_rms_norm_enabled() { return fuse_rms_norm_flag; }
int64_t mul_mat_rms_norm_fusions() { return rms_norm_fusions.load(); }
}  // namespace ggml_ext

int ggml_ext_cuda_try_fuse_rms_norm(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i) {
    if (!fuse_rms_norm_flag || i + 2 >= cgraph->n_nodes) return 0;
    const ggml_tensor * norm = cgraph->nodes[i];
    const ggml_tensor * mul = cgraph->nodes[i + 1];
    ggml_tensor * mm = cgraph->nodes[i + 2];
    ActSource x;
    if (norm->op != GGML_OP_RMS_NORM || mul->op != GGML_OP_MUL || mm->op != GGML_OP_MUL_MAT || mm->src[1] != mul ||
        (mul->flags & GGML_TENSOR_FLAG_COMPUTE) == 0 || (mm->flags & GGML_TENSOR_FLAG_COMPUTE) == 0 ||
        !ggml_ext::is_mul_mat_tiles(mm) || !ggml_node_has_n_uses(cgraph, i, 1) ||
        !ggml_node_has_n_uses(cgraph, i + 1, 1) || !rms_norm_source(norm, mul, x)) {
        return 0;
    }
    const int64_t n = mul->ne[1];
    if (n < 2 || n > max_columns_flag || !ggml_ext_cuda_gemm_mma_from(ctx, mm->src[0], x, n, mm, nullptr)) return 0;
    rms_norm_fusions++;
    return 2;
}
