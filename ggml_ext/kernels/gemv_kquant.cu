// Small-batch quantized GEMV for the weights of Q4_K_M / Q5_K_M / Q6_K / Q8_0 files (Q4_K, Q5_K,
// Q6_K, Q8_0), 1..8 activation columns: the decode step of a 27B model is ~450 of these products, and ggml's
// mul_mat_vec_q reads the weights at ~1.6 TB/s on an H200 (bench/results/h200-s4-27b-kernels.json)
// because each thread has only a few 4-byte loads in flight.
//
// Layout (gemv_kquant_impl.cuh): a warp owns 1 or 2 rows, or shares them with 1 or 3 other warps
// when K is long; its 32 lanes split into 4 groups of 8, group g taking the row's 256-value
// super-blocks g, g+4, ... (of its share); inside a super-block, lane m takes 32 of its values
// (Q4_K / Q5_K: the m-th 16-byte slice of the nibbles; Q6_K: 8 values of each 32-value quarter of
// one half; Q8_0: the m-th 32-value block). Weights come in 16-byte (Q4_K, Q5_K) or 4-byte
// funnel-shifted (Q6_K, Q8_0, whose blocks are 2-byte aligned) loads, 2 (or 4) super-blocks
// of every row in flight before any arithmetic. Activations are quantized to int8 per 32 values
// (ggml's q8_1 rule, d = max|x| / 127), stored as a plain int8 row plus a float scale per 32 so
// that a lane reads its 16 or 8 values with one aligned load; products go through dp4a.
//
// One column's arithmetic does not depend on how many columns the call has, nor on how many rows
// a warp takes (the same per-lane sums in the same order, the same butterfly, the same split,
// which depends on the type and K only), and every float operation is spelled with a rounding
// intrinsic so the compiler cannot contract it differently per instantiation: a verify of N
// tokens through this kernel gives each token the bits of a one-token decode (the invariant
// matmul uses it, ggml_ext/BATCH_INVARIANCE.md).
#include "ggml_ext_gemv_cuda.cuh"
#include "gemv_kquant_impl.cuh"
#include "ggml_ext_matmul.h"
#include "ggml_ext_matmul_cuda.cuh"

#include <cstdlib>

namespace {

using gemv::kQk;

bool gemv_enabled_flag = [] {
    const char * e = std::getenv("DFLASH_GEMV");
    return !(e && e[0] == '0');
}();

// Q8_0 weights (this GEMV and the tensor-core GEMM): off unless asked (DFLASH_Q80=1 or
// ggml_ext::set_q80_enabled). Measured on the H200 in session 8: its GEMV reads Q8_0 at ~0.8 TB/s
// in every layout (bench/results/h200-s8-gemv-standalone-all-a092eca.json.gz), below ggml's mul_mat_vec_q.
bool q80_flag = [] {
    const char * e = std::getenv("DFLASH_Q80");
    return e && e[0] == '1';
}();

int env_int(const char * name) {
    const char * e = std::getenv(name);
    return e ? std::atoi(e) : 0;
}

}  // namespace

namespace {

bool gemv_type(ggml_type t) {
    if (t == GGML_TYPE_Q4_K || t == GGML_TYPE_Q5_K || t == GGML_TYPE_Q6_K) return true;
    return q80_flag && t == GGML_TYPE_Q8_0;
}

}  // namespace

// Rows of whole 256-value super-blocks, 16-byte aligned for the 16-byte loads of Q4_K / Q5_K
// (Q8_0 rows of whole super-blocks are 272-byte multiples, so aligned too), weights not in a
// compute buffer.
bool ggml_ext_gemv_supports(const ggml_tensor * w, int64_t ncols) {
    const bool wide_loads = w->type == GGML_TYPE_Q4_K || w->type == GGML_TYPE_Q5_K;
    return gemv_enabled_flag && gemv_type(w->type) && ncols >= 1 && ncols <= kGemvMaxColumns && w->ne[0] % kQk == 0 &&
           w->ne[2] == 1 && w->ne[3] == 1 && w->nb[0] == ggml_type_size(w->type) && w->nb[1] % 4 == 0 &&
           reinterpret_cast<uintptr_t>(w->data) % 16 == 0 && (!wide_loads || w->nb[1] % 16 == 0) &&
           ggml_backend_buffer_get_usage(w->buffer) != GGML_BACKEND_BUFFER_USAGE_COMPUTE;
}

bool ggml_ext_gemv_norm_source_ok(const ActSource & x, int64_t k) {
    const bool threads_fit = x.norm_threads == 1024 ? k <= gemv::kNormMax : x.norm_threads == 256 && k <= 1024;
    return x.norm_w && !x.up && !x.head_w && !x.gate && threads_fit;
}

void ggml_ext_gemv_quantize(const ActSource & x, int64_t k, int64_t ncols, int8_t * qs, float * d,
                            cudaStream_t stream) {
    const int64_t k_pad = GGML_PAD(k, kQk);
    if (x.norm_w) {  // ggml_ext_gemv_norm_source_ok
        if (x.norm_threads == 1024) {
            DFLASH_LAUNCH_PDL(dflash_pdl::kGemv, dim3((unsigned)ncols), 1024, 0, stream,
                              gemv::quantize_act_norm_kernel<1024>)(x, qs, d, (int)k, (int)k_pad);
        } else {
            DFLASH_LAUNCH_PDL(dflash_pdl::kGemv, dim3((unsigned)ncols), 256, 0, stream,
                              gemv::quantize_act_norm_kernel<256>)(x, qs, d, (int)k, (int)k_pad);
        }
        return;
    }
    const dim3 grid((unsigned)(k_pad / kQk), (unsigned)ncols, 1);
    DFLASH_LAUNCH_PDL(dflash_pdl::kGemv, grid, kQk, 0, stream, gemv::quantize_act_kernel)(x, qs, d, (int)k, (int)k_pad);
}

GemvShape ggml_ext_gemv_shape(ggml_type type, int k, int nrows) {
    // Measured on the H200 for one column (bench/results/h200-s5-gemv-standalone*.json, every
    // layout of the 27B's shapes): Q4_K is best unsplit, with two rows per warp for long rows
    // (K >= 6144: ffn_down 2.7 TB/s, ssm_out); Q6_K, whose decode is instruction-bound, best with
    // two warps and two rows each everywhere (ffn_down, the GDN qkv, the output). Session 8
    // (h200-s8-gemv-standalone-all-a092eca.json.gz): staged Q6_K is best unsplit on the 248320-row
    // output (340 us against 382 split in two), Q5_K with one row per warp, split in two for long
    // rows (ffn_down 24.5 us against 31.1 in Q4_K's layout). The layout depends on the matrix,
    // never on the column count. DFLASH_GEMV_SPLIT (1, 2, 4),
    // DFLASH_GEMV_ROWS (1, 2) and DFLASH_GEMV_UNROLL (2, 4: one column) force the choices, for
    // benches.
    static const int forced_split = env_int("DFLASH_GEMV_SPLIT"), forced_rows = env_int("DFLASH_GEMV_ROWS");
    static const int forced_unroll = env_int("DFLASH_GEMV_UNROLL");
    // Q6_K stages its blocks through shared memory by default (session 8, H200: ffn_down 44.8 ->
    // 38.2 us, the output 528 -> 340 us, 27B AR 117.3 -> 122.2 t/s); DFLASH_GEMV_Q6K_STAGED=0: direct
    // loads.
    static const bool q6k_staged = [] {
        const char * e = std::getenv("DFLASH_GEMV_Q6K_STAGED");
        return !(e && e[0] == '0');
    }();
    // Two groups of copies in flight at one column: the default since session 52 (H100, same run:
    // the 27B's decode step 8.315 against 8.532 ms of kernels; the standalone's ffn_down 35.8
    // against 40.0 us, GDN attn_qkv 20.4 against 21.6, the LM head 361 against 377 in their
    // layouts; bench/results/h100-s52-c1-*, -c4-*). DFLASH_GEMV_Q6K_STAGES=2: one group.
    static const int q6k_stages = env_int("DFLASH_GEMV_Q6K_STAGES") == 2 ? 2 : 3;
    // Each warp's blocks copied as runs of chunks: the default since session 53 (H100, same runs:
    // the 27B's decode step 7.843 against 7.966 ms of kernels, AR 126.3 against 124.8 t/s;
    // bench/results/h100-s53-c1-*). DFLASH_GEMV_Q6K_SPANS=0: a copy a chunk of each block.
    static const bool q6k_spans = [] {
        const char * e = std::getenv("DFLASH_GEMV_Q6K_SPANS");
        return !(e && e[0] == '0');
    }();
    // Q8_0 takes Q4_K's layout.
    GemvShape s;
    if (type == GGML_TYPE_Q6_K) {
        s.split = q6k_staged && nrows >= 65536 ? 1 : 2;
        s.rows_per_warp = 2;
    } else if (type == GGML_TYPE_Q5_K) {
        s.split = k / kQk >= 24 ? 2 : 1;
        s.rows_per_warp = 1;
    } else {
        s.split = 1;
        s.rows_per_warp = k / kQk >= 24 ? 2 : 1;
    }
    if (forced_split == 1 || forced_split == 2 || forced_split == 4) s.split = forced_split;
    if (forced_rows == 1 || forced_rows == 2) s.rows_per_warp = forced_rows;
    if (forced_unroll == 2 || forced_unroll == 4) s.unroll = forced_unroll;
    s.staged = type == GGML_TYPE_Q6_K && q6k_staged;
    s.q6k_stages = q6k_stages;
    s.q6k_spans = q6k_spans;
    return s;
}

void ggml_ext_gemv_launch(ggml_type type, const GemvArgs & a, cudaStream_t stream) {
    const GemvShape shape = ggml_ext_gemv_shape(type, a.k, a.nrows);
    switch (type) {
        case GGML_TYPE_Q4_K:
            ggml_ext_gemv_launch_q4_k(a, shape, stream);
            break;
        case GGML_TYPE_Q5_K:
            ggml_ext_gemv_launch_q5_k(a, shape, stream);
            break;
        case GGML_TYPE_Q8_0:
            ggml_ext_gemv_launch_q8_0(a, shape, stream);
            break;
        default:
            ggml_ext_gemv_launch_q6_k(a, shape, stream);
            break;
    }
    CUDA_CHECK(cudaGetLastError());
}

namespace ggml_ext {
void set_gemv_enabled(bool on) { gemv_enabled_flag = on; }
bool gemv_enabled() { return gemv_enabled_flag; }
void set_q80_enabled(bool on) { q80_flag = on; }
bool q80_enabled() { return q80_flag; }
}  // namespace ggml_ext

namespace {

// The MUL_MAT node behind a mul_mat_vec_q call: dst itself, or the product that a fused ADD
// (residual) or GLU (gate) consumes, maybe through the ADD. Only the engine's tagged weight
// matmuls are taken: upstream's graphs (libllama in the same build) keep ggml's kernels.
bool engine_product(const ggml_tensor * dst, const ggml_tensor * src0, const ggml_tensor * src1) {
    auto product = [&](const ggml_tensor * t) {
        return t && t->op == GGML_OP_MUL_MAT && t->src[0] == src0 && t->src[1] == src1;
    };
    const ggml_tensor * node = product(dst) ? dst : nullptr;
    for (int i = 0; i < 2 && !node; ++i) {
        const ggml_tensor * s = dst->src[i];
        if (product(s)) node = s;
        for (int j = 0; j < 2 && !node && s; ++j) {
            if (product(s->src[j])) node = s->src[j];
        }
    }
    return node && (ggml_ext::is_mul_mat_tiles(node) || ggml_ext::is_mul_mat_invariant(node));
}

ActSource plain_source(const ggml_tensor * t) {
    ActSource s;
    s.x = (const float *)t->data;
    s.sx = (int64_t)(t->nb[1] / sizeof(float));
    return s;
}

// Quantizes the n columns of x into the pool once and runs them kGemvMaxColumns at a time.
// The GEMV launches of src0 x n columns quantized into qs and d (ggml_ext_gemv_quantize).
void launch_columns(const ggml_tensor * src0, const int8_t * qs, const float * d, int64_t n, float * dst,
                    int stride_col_dst, const char * w_gate, const float * bias, cudaStream_t stream) {
    const int64_t k = src0->ne[0];
    const int64_t k_pad = GGML_PAD(k, kQk);
    for (int64_t c0 = 0; c0 < n; c0 += kGemvMaxColumns) {
        GemvArgs a{};
        a.w = (const char *)src0->data;
        a.w_gate = w_gate;
        a.yq = qs + c0 * k_pad;
        a.yd = d + c0 * (k_pad / 32);
        a.bias = bias ? bias + c0 * stride_col_dst : nullptr;
        a.dst = dst + c0 * stride_col_dst;
        a.nrows = (int)src0->ne[1];
        a.k = (int)k;
        a.k_pad = (int)k_pad;
        a.ncols = (int)std::min<int64_t>(kGemvMaxColumns, n - c0);
        a.stride_col_dst = stride_col_dst;
        a.row_bytes = (int64_t)src0->nb[1];
        ggml_ext_gemv_launch(src0->type, a, stream);
    }
}

void run_columns(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ActSource & x, int64_t n, float * dst,
                 int stride_col_dst, const char * w_gate, const float * bias) {
    cudaStream_t stream = ctx.stream();
    const int64_t k = src0->ne[0];
    const int64_t k_pad = GGML_PAD(k, kQk);
    ggml_cuda_pool_alloc<int8_t> qs(ctx.pool(), n * k_pad);
    ggml_cuda_pool_alloc<float> d(ctx.pool(), n * (k_pad / 32));
    ggml_ext_gemv_quantize(x, k, n, qs.get(), d.get(), stream);
    launch_columns(src0, qs.get(), d.get(), n, dst, stride_col_dst, w_gate, bias, stream);
}

// Whether the GEMV takes src0 x the n columns of source x into dst (no residual).
bool gemv_takes(const ggml_tensor * src0, const ActSource & x, int64_t n, const ggml_tensor * dst) {
    return !(x.norm_w && !ggml_ext_gemv_norm_source_ok(x, src0->ne[0])) && !x.head_w && !x.gate &&
           ggml_ext_gemv_supports(src0, 1) && plain_f32_columns(dst) && dst->ne[0] == src0->ne[1] && dst->ne[1] == n;
}

}  // namespace

bool ggml_ext_cuda_mul_mat_vec_q(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ggml_tensor * src1,
                                 const ggml_tensor * ids, ggml_tensor * dst,
                                 const ggml_cuda_mm_fusion_args_host * fusion) {
    if (ids || !ggml_ext_gemv_supports(src0, src1->ne[1]) || !engine_product(dst, src0, src1) ||
        !plain_f32_columns(src1) || !plain_f32_columns(dst) || src1->ne[0] != src0->ne[0] ||
        dst->ne[0] != src0->ne[1] || dst->ne[1] != src1->ne[1]) {
        return false;
    }
    const char * w_gate = nullptr;
    const float * bias = nullptr;
    if (fusion) {
        if (fusion->gate_bias || fusion->x_scale || fusion->gate_scale) return false;
        if (fusion->gate) {  // ggml fuses one-column products only; so does the kernel
            const ggml_tensor * g = fusion->gate;
            if (src1->ne[1] != 1) return false;
            if (fusion->glu_op != GGML_GLU_OP_SWIGLU || g->type != src0->type || !ggml_are_same_shape(g, src0) ||
                !ggml_are_same_stride(g, src0) || !ggml_ext_gemv_supports(g, src1->ne[1])) {
                return false;
            }
            w_gate = (const char *)g->data;
        }
        if (fusion->x_bias) {
            const ggml_tensor * b = fusion->x_bias;
            if (!plain_f32_columns(b) || !ggml_are_same_shape(b, dst) || b->nb[1] != dst->nb[1]) return false;
            bias = (const float *)b->data;
        }
    }
    run_columns(ctx, src0, plain_source(src1), src1->ne[1], (float *)dst->data, (int)(dst->nb[1] / sizeof(float)),
                w_gate, bias);
    return true;
}

bool ggml_ext_cuda_gemv_columns(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ggml_tensor * src1,
                                ggml_tensor * dst) {
    if (!ggml_ext_gemv_supports(src0, 1) || !plain_f32_columns(src1) || !plain_f32_columns(dst)) return false;
    run_columns(ctx, src0, plain_source(src1), src1->ne[1], (float *)dst->data, (int)(dst->nb[1] / sizeof(float)),
                nullptr, nullptr);
    return true;
}

bool ggml_ext_cuda_gemv_from(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ActSource & x, int64_t n,
                             ggml_tensor * dst, const ggml_tensor * res) {
    if (!gemv_takes(src0, x, n, dst) ||
        (res && (!plain_f32_columns(res) || !ggml_are_same_shape(res, dst) || res->nb[1] != dst->nb[1]))) {
        return false;
    }
    run_columns(ctx, src0, x, n, (float *)dst->data, (int)(dst->nb[1] / sizeof(float)), nullptr,
                res ? (const float *)res->data : nullptr);
    return true;
}

bool ggml_ext_cuda_gemv_pair_from(ggml_backend_cuda_context & ctx, const ggml_tensor * w1, ggml_tensor * dst1,
                                  const ggml_tensor * w2, ggml_tensor * dst2, const ActSource & x, int64_t n) {
    const int64_t k = w1->ne[0];
    if (w2->ne[0] != k || !gemv_takes(w1, x, n, dst1) || !gemv_takes(w2, x, n, dst2)) return false;
    cudaStream_t stream = ctx.stream();
    const int64_t k_pad = GGML_PAD(k, kQk);
    ggml_cuda_pool_alloc<int8_t> qs(ctx.pool(), n * k_pad);
    ggml_cuda_pool_alloc<float> d(ctx.pool(), n * (k_pad / 32));
    ggml_ext_gemv_quantize(x, k, n, qs.get(), d.get(), stream);
    for (auto [w, dst] : {std::pair{w1, dst1}, std::pair{w2, dst2}}) {
        launch_columns(w, qs.get(), d.get(), n, (float *)dst->data, (int)(dst->nb[1] / sizeof(float)), nullptr, nullptr,
                       stream);
    }
    return true;
}

bool ggml_ext_cuda_gemv_glu_from(ggml_backend_cuda_context & ctx, const ggml_tensor * w_up, const ggml_tensor * w_gate,
                                 const ActSource & x, ggml_tensor * dst) {
    if (w_gate->type != w_up->type || !ggml_are_same_shape(w_gate, w_up) || !ggml_are_same_stride(w_gate, w_up) ||
        !ggml_ext_gemv_supports(w_gate, 1) || !gemv_takes(w_up, x, 1, dst)) {
        return false;
    }
    run_columns(ctx, w_up, x, 1, (float *)dst->data, (int)(dst->nb[1] / sizeof(float)), (const char *)w_gate->data,
                nullptr);
    return true;
}
