// ggml_ext's small-batch quantized GEMV (gemv_kquant.cu): Q4_K, Q5_K, Q6_K and Q8_0 weights times 1..8 columns,
// taking ggml's mul_mat_vec_q calls for the engine's tagged weight matmuls (patches/0005), fused
// forms included (residual add, SwiGLU gate), and the column-invariant matmul of those types
// (mul_mat_invariant.cu). Untagged products (upstream's graphs) keep ggml's kernels.
#pragma once

#include "act_source.cuh"
#include "ggml-cuda/common.cuh"

constexpr int kGemvMaxColumns = 8;

struct GemvArgs {
    const char * w;       // rows of row_bytes each
    const char * w_gate;  // SwiGLU gate weights (same type and strides) or null
    const int8_t * yq;    // quantized activations (ggml_ext_gemv_quantize)
    const float * yd;
    const float * bias;  // added to each output before the gate, same strides as dst, or null
    float * dst;
    int nrows, k, k_pad, ncols, stride_col_dst;
    int64_t row_bytes;
};

// How a matrix is laid out over the warps: split warps per row (K shared), rows per warp.
// Depends on the matrix only (never on the column count): a column's arithmetic depends on split.
struct GemvShape {
    int split = 1, rows_per_warp = 1;
    int unroll = 2;  // super-blocks of each row in flight (2, or 4 for one column)
    // Q6_K without a gate: weights through cp.async and shared memory (gemv_q6k_staged_kernel;
    // the same bits). The default (DFLASH_GEMV_Q6K_STAGED=0: direct loads).
    bool staged = false;
    // Stages of the staged Q6_K kernel's pipeline at one column: 2 (one group of copies in flight
    // while a warp computes), or 3 (two; ggml_ext_gemv_shape's default since session 52,
    // DFLASH_GEMV_Q6K_STAGES=2 turns it off). The same bits.
    int q6k_stages = 2;
    // Staged Q6_K at one column: a warp's blocks of a row and step copied as one run of chunks
    // (gemv_q6k_staged_kernel's kSpans; ggml_ext_gemv_shape's default since session 53,
    // DFLASH_GEMV_Q6K_SPANS=0 turns it off). The same bits.
    bool q6k_spans = false;
};
GemvShape ggml_ext_gemv_shape(ggml_type type, int k, int nrows);
void ggml_ext_gemv_launch_q4_k(const GemvArgs & args, const GemvShape & shape, cudaStream_t stream);
void ggml_ext_gemv_launch_q5_k(const GemvArgs & args, const GemvShape & shape, cudaStream_t stream);
void ggml_ext_gemv_launch_q6_k(const GemvArgs & args, const GemvShape & shape, cudaStream_t stream);
void ggml_ext_gemv_launch_q8_0(const GemvArgs & args, const GemvShape & shape, cudaStream_t stream);

// Whether the kernel takes weight w times ncols columns (type, shape, alignment, enabled).
bool ggml_ext_gemv_supports(const ggml_tensor * w, int64_t ncols);
// x: ncols columns of k floats (or a SwiGLU's inputs) -> qs (ncols x k_pad int8) and d (ncols x
// k_pad / 32), k_pad = k rounded up to 256.
void ggml_ext_gemv_quantize(const ActSource & x, int64_t k, int64_t ncols, int8_t * qs, float * d, cudaStream_t stream);
// Whether ggml_ext_gemv_quantize takes x, an RMSNorm source (x.norm_w) of k values: ggml's
// 1024-thread norm of at most 8192 values or its 256-thread one (gemv::quantize_act_norm_kernel).
bool ggml_ext_gemv_norm_source_ok(const ActSource & x, int64_t k);
void ggml_ext_gemv_launch(ggml_type type, const GemvArgs & args, cudaStream_t stream);

// ggml's mul_mat_vec_q entry (patches/0005): true when ggml_ext computed dst.
bool ggml_ext_cuda_mul_mat_vec_q(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ggml_tensor * src1,
                                 const ggml_tensor * ids, ggml_tensor * dst,
                                 const ggml_cuda_mm_fusion_args_host * fusion);
// dst = src0 x src1 for any number of columns, in chunks of kGemvMaxColumns: each column gets
// the arithmetic of a one-column product. False when the kernel does not take src0.
bool ggml_ext_cuda_gemv_columns(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ggml_tensor * src1,
                                ggml_tensor * dst);
// dst (+ res, a residual of dst's shape and strides) = src0 x the n columns of x, as
// ggml_ext_cuda_gemv_columns computes them (glu_fusion.cu: x a SwiGLU's inputs).
bool ggml_ext_cuda_gemv_from(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ActSource & x, int64_t n,
                             ggml_tensor * dst, const ggml_tensor * res);

// Two products of the same n columns of x (w1 x into dst1, w2 x into dst2) from one quantizer
// launch (rms_norm_fusion.cu's pairs at one column). False when the GEMV does not take both.
bool ggml_ext_cuda_gemv_pair_from(ggml_backend_cuda_context & ctx, const ggml_tensor * w1, ggml_tensor * dst1,
                                  const ggml_tensor * w2, ggml_tensor * dst2, const ActSource & x, int64_t n);

// A one-column SwiGLU's two products from x: dst = (w_up x) * silu(w_gate x) through the gated
// GEMV (the kernel ggml-cuda's {mul_mat, mul_mat, glu} fusion reaches, the same bits) after one
// quantizer launch (rms_norm_fusion.cu: x an RMSNorm source). False unless the GEMV takes both
// weights, of one type and layout.
bool ggml_ext_cuda_gemv_glu_from(ggml_backend_cuda_context & ctx, const ggml_tensor * w_up, const ggml_tensor * w_gate,
                                 const ActSource & x, ggml_tensor * dst);

// The fewest columns ggml_ext's tensor-core GEMM takes: its 8-column tile costs about what the
// GEMV costs for 2 columns (the GEMV grows by about a column's worth per column): the 27B's
// forward of 3 tokens through it took 12.0 ms, of 2 tokens through the GEMV 12.6 (H200, session 9).
constexpr int kMmaMinColumns = 2;

// ggml_ext's tensor-core GEMM for Q4_K / Q5_K / Q6_K (Q8_0 when asked) x 2..64 columns (16 or 32 with
// DFLASH_MMA_MAX_COLUMNS; gemm_kquant_mma.cu; on unless DFLASH_MMA=0 or ggml_ext::set_mma_enabled).
// res: a residual of dst's shape added as the outputs are written (a fused add; may be dst's own
// data). False when it does not take the product.
bool ggml_ext_cuda_gemm_mma(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ggml_tensor * src1,
                            ggml_tensor * dst, const ggml_tensor * res = nullptr);
// The same product of the n columns of x (glu_fusion.cu: a SwiGLU's inputs).
bool ggml_ext_cuda_gemm_mma_from(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ActSource & x,
                                 int64_t n, ggml_tensor * dst, const ggml_tensor * res = nullptr);
// Q6_K or Q4_K (t) rows x n <= 64 columns of x through the f16 wgmma GEMM (gemm_f16_wgmma.cu; an
// sm_90a build on an sm_90 GPU): x into f16 at act (2 * 64 * k bytes), then the product into out (sd
// floats a column), plus res (sr floats a column) when given; ws: through its warp-specialized
// form (gemm_f16_wgmma_ws.cuh) where that can run; converted: act holds x's halves already (a pair's
// one activation launch, gemm_kq::quantize_act_and_f16). 0 when it cannot run here (nothing
// launched), 1 when the f16 form ran, 2 when its warp-specialized form did.
int ggml_ext_cuda_f16_wgmma(ggml_type t, const ActSource & x, int8_t * act, const char * w, int rows, int k,
                            int64_t row_bytes, int n, float * out, int sd, const float * res, int sr, int nsm, bool ws,
                            ggml_cuda_pool & pool, cudaStream_t stream, bool converted = false);
// Both activation forms of x in one launch (gemm_kq::quantize_act_and_f16): the halves at act16 (np16
// padded columns, as ggml_ext_cuda_f16_wgmma converts them) and the int8 bytes, scales a super-block
// and sums at qs, d, sums (np8 padded columns) in the int8 wgmma forms' layout (wgmma_layout) or the
// mma.sync Q4_K / Q5_K forms'.
void ggml_ext_cuda_act_pair(bool wgmma_layout, const ActSource & x, int8_t * qs, float * d, int * sums, int8_t * act16,
                            int k, int ncols, int np8, int np16, cudaStream_t stream);
// The last ggml_ext_cuda_f16_wgmma launch's row tiles in full, tiles split and pieces a split tile
// (tiles, 0, 1 unsplit; 0, 0, 1 before any), for tests.
void ggml_ext_cuda_f16_wgmma_last_split(int & full_tiles, int & tail, int & pieces);
// The f16 GEMM's activation converter with 8 values a thread (gemm_f16_wgmma.cuh; DFLASH_F16_CONVERT_V8).
bool & ggml_ext_cuda_f16_convert_v8();
// Two products of the same n <= 64 columns of x, w1 x into dst1 and w2 x into dst2, their
// activations quantized by one launch (in both layouts where the types want two; rms_norm_fusion.cu's
// pairs): both in the mma.sync forms (not the wgmma one), types with scales per 256 values (Q4_K,
// Q5_K, Q6_K). False when it does not take them: nothing launched.
bool ggml_ext_cuda_gemm_mma_pair_from(ggml_backend_cuda_context & ctx, const ggml_tensor * w1, ggml_tensor * dst1,
                                      const ggml_tensor * w2, ggml_tensor * dst2, const ActSource & x, int64_t n);
