// Column-invariant quantized matmul (ggml_ext/BATCH_INVARIANCE.md).
//
// ggml's mul_mat_vec_q gives one column the same arithmetic for 1..4 columns on the "generic"
// parameter table (NVIDIA Ampere and newer, except GB10): 4 warps, thread tid walks the row's
// quant blocks kbx = tid/(qi/vdr), +vdr*4*32/qi, ...; warps 1..3 add into warp 0 through shared
// memory in order; then a warp butterfly. This kernel keeps exactly that per-column arithmetic
// (same vec_dot, q8_1 activations quantized per column as ggml does) and walks any number of
// columns in chunks inside the block, the row's weights staying in L1, so a verify of N tokens
// gives every token the bits a one-token decode gives it. Where ggml_ext's GEMV takes the
// one-column product instead (Q4_K, Q6_K: gemv_kquant.cu), columns go through it in chunks.
#include "ggml_ext_gemv_cuda.cuh"
#include "ggml_ext_matmul.h"
#include "ggml_ext_matmul_cuda.cuh"

#include <atomic>
#include <cstdlib>

#include "ggml-cuda/quantize.cuh"
#include "ggml-cuda/vecdotq.cuh"

namespace {

constexpr int kWarps = 4;          // ggml's calc_nwarps(type, 1 column, generic table)
constexpr int kChunk = 4;          // columns held in registers at a time
constexpr int kMaxColumns = 1024;  // a verify's most tokens (EngineConfig::n_verify_max)

// The weight types taken, with ggml's vec_dot and mmvq vdr for each.
#define DFLASH_INVARIANT_TYPES(X)                  \
    X(Q4_0, vec_dot_q4_0_q8_1, VDR_Q4_0_Q8_1_MMVQ) \
    X(Q4_1, vec_dot_q4_1_q8_1, VDR_Q4_1_Q8_1_MMVQ) \
    X(Q5_0, vec_dot_q5_0_q8_1, VDR_Q5_0_Q8_1_MMVQ) \
    X(Q5_1, vec_dot_q5_1_q8_1, VDR_Q5_1_Q8_1_MMVQ) \
    X(Q8_0, vec_dot_q8_0_q8_1, VDR_Q8_0_Q8_1_MMVQ) \
    X(Q4_K, vec_dot_q4_K_q8_1, VDR_Q4_K_Q8_1_MMVQ) \
    X(Q5_K, vec_dot_q5_K_q8_1, VDR_Q5_K_Q8_1_MMVQ) \
    X(Q6_K, vec_dot_q6_K_q8_1, VDR_Q6_K_Q8_1_MMVQ) \
    X(IQ4_XS, vec_dot_iq4_xs_q8_1, VDR_IQ4_XS_Q8_1_MMVQ)

template <ggml_type type>
struct QuantDot;
#define DFLASH_QUANT_DOT(T, fn, vdr_)                                                                          \
    template <>                                                                                                \
    struct QuantDot<GGML_TYPE_##T> {                                                                           \
        static constexpr int vdr = vdr_;                                                                       \
        static __device__ __forceinline__ float dot(const void * vx, const block_q8_1 * y, int kbx, int kqs) { \
            return fn(vx, y, kbx, kqs);                                                                        \
        }                                                                                                      \
    };
DFLASH_INVARIANT_TYPES(DFLASH_QUANT_DOT)
#undef DFLASH_QUANT_DOT

template <ggml_type type>
__global__ void __launch_bounds__(kWarps * WARP_SIZE, 1)
    mul_mat_invariant_kernel(const void * __restrict__ vx, const block_q8_1 * __restrict__ vy, float * __restrict__ dst,
                             const int ncols_x, const int ncols_dst, const int stride_row_x, const int stride_col_y,
                             const int stride_col_dst) {
    constexpr int qk = ggml_cuda_type_traits<type>::qk;
    constexpr int qi = ggml_cuda_type_traits<type>::qi;
    constexpr int vdr = QuantDot<type>::vdr;
    constexpr int blocks_per_iter = vdr * kWarps * WARP_SIZE / qi;

    const int tid = WARP_SIZE * threadIdx.y + threadIdx.x;
    const int row = blockIdx.x;
    const int blocks_per_row = ncols_x / qk;
    const int kbx_offset = row * stride_row_x;

    __shared__ float partial[kWarps - 1][kChunk][WARP_SIZE];

    for (int c0 = 0; c0 < ncols_dst; c0 += kChunk) {
        float tmp[kChunk] = {0.0f};
        for (int kbx = tid / (qi / vdr); kbx < blocks_per_row; kbx += blocks_per_iter) {
            const int kby = kbx * (qk / QK8_1);
            const int kqs = vdr * (tid % (qi / vdr));
#pragma unroll
            for (int j = 0; j < kChunk; ++j) {
                if (c0 + j < ncols_dst) {
                    tmp[j] += QuantDot<type>::dot(vx, &vy[(c0 + j) * stride_col_y + kby], kbx_offset + kbx, kqs);
                }
            }
        }
        if (threadIdx.y > 0) {
#pragma unroll
            for (int j = 0; j < kChunk; ++j) partial[threadIdx.y - 1][j][threadIdx.x] = tmp[j];
        }
        __syncthreads();
        if (threadIdx.y == 0) {
#pragma unroll
            for (int j = 0; j < kChunk; ++j) {
#pragma unroll
                for (int l = 0; l < kWarps - 1; ++l) tmp[j] += partial[l][j][threadIdx.x];
                tmp[j] = warp_reduce_sum<WARP_SIZE>(tmp[j]);
                if (threadIdx.x == 0 && c0 + j < ncols_dst) dst[(c0 + j) * stride_col_dst + row] = tmp[j];
            }
        }
        __syncthreads();  // partial[] is reused by the next chunk
    }
}

// ggml's mmvq parameter table for this device is the generic one (see the file comment).
// The kernels that run are those of the highest compiled arch, which also picks mmvq's table.
bool generic_mmvq_table(int cc) {
    const int arch = ggml_cuda_highest_compiled_arch(cc);
    return GGML_CUDA_CC_IS_NVIDIA(cc) && arch >= GGML_CUDA_CC_AMPERE && arch != GGML_CUDA_CC_DGX_SPARK;
}

template <ggml_type type>
void launch(const ggml_tensor * src0, const block_q8_1 * y, float * dst, int ncols_dst, int stride_col_y,
            int stride_col_dst, cudaStream_t stream) {
    const dim3 grid((unsigned)src0->ne[1], 1, 1);
    const dim3 block(WARP_SIZE, kWarps, 1);
    mul_mat_invariant_kernel<type><<<grid, block, 0, stream>>>(src0->data, y, dst, (int)src0->ne[0], ncols_dst,
                                                               (int)(src0->nb[1] / ggml_type_size(src0->type)),
                                                               stride_col_y, stride_col_dst);
}

}  // namespace

namespace {
bool fuse_add_flag = [] {
    const char * e = std::getenv("DFLASH_FUSE_ADD");
    return !(e && e[0] == '0');
}();
std::atomic<int64_t> add_fusions{0};
}  // namespace

namespace ggml_ext {
void set_fuse_add_enabled(bool on) { fuse_add_flag = on; }
bool fuse_add_enabled() { return fuse_add_flag; }
int64_t mul_mat_add_fusions() { return add_fusions.load(); }
}  // namespace ggml_ext

bool ggml_ext_cuda_mul_mat_add(ggml_backend_cuda_context & ctx, const ggml_tensor * mm, ggml_tensor * add,
                               const ggml_tensor * res) {
    // the GEMM's products only (the GEMV's columns and the invariant matmul keep the add node)
    if (!fuse_add_flag || !ggml_ext::is_mul_mat_tiles(mm) || !ggml_are_same_shape(mm, add) ||
        add->type != GGML_TYPE_F32 || !ggml_ext_cuda_gemm_mma(ctx, mm->src[0], mm->src[1], add, res)) {
        return false;
    }
    add_fusions++;
    return true;
}

bool ggml_ext_cuda_mul_mat_invariant(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * src0 = dst->src[0];
    const ggml_tensor * src1 = dst->src[1];
    const int64_t n = src1->ne[1];
    // The engine's other tagged products: 2..64 columns of the k-quants go to ggml_ext's
    // tensor-core GEMM, the rest of 1..8 columns to its GEMV, whatever ggml's own choice between
    // its vector and tensor-core kernels would be.
    if (ggml_ext::is_mul_mat_tiles(dst)) {
        if (ggml_ext_cuda_gemm_mma(ctx, src0, src1, dst)) return true;
        return n <= kGemvMaxColumns && ggml_ext_cuda_gemv_columns(ctx, src0, src1, dst);
    }
    if (!ggml_ext::is_mul_mat_invariant(dst)) return false;
    // Q4_K / Q6_K: one-column products are ggml_ext's GEMV (patches/0005), on any device, and its
    // per-column arithmetic is the same for any column count.
    if (n >= 2 && n <= kMaxColumns && ggml_ext_cuda_gemv_columns(ctx, src0, src1, dst)) return true;
    const int cc = ggml_cuda_info().devices[ctx.device].cc;
    switch (src0->type) {
#define DFLASH_CASE(T, fn, vdr) case GGML_TYPE_##T:
        DFLASH_INVARIANT_TYPES(DFLASH_CASE)
#undef DFLASH_CASE
        break;
        default:
            return false;
    }
    // One column is ggml's own mul_mat_vec_q already; shapes beyond plain 2-D go to ggml too.
    if (n < 2 || n > kMaxColumns || !generic_mmvq_table(cc) || src1->type != GGML_TYPE_F32 ||
        dst->type != GGML_TYPE_F32 || src0->ne[2] != 1 || src0->ne[3] != 1 || src1->ne[2] != 1 || src1->ne[3] != 1 ||
        src0->nb[0] != ggml_type_size(src0->type) || src1->nb[0] != sizeof(float) || dst->nb[0] != sizeof(float) ||
        ggml_backend_buffer_get_usage(src0->buffer) == GGML_BACKEND_BUFFER_USAGE_COMPUTE) {
        return false;
    }
    cudaStream_t stream = ctx.stream();
    const int64_t ne10 = src1->ne[0];
    const int64_t ne10_padded = GGML_PAD(ne10, MATRIX_ROW_PADDING);
    ggml_cuda_pool_alloc<char> q8_1(ctx.pool(), n * ne10_padded * sizeof(block_q8_1) / QK8_1);
    const int64_t s11 = src1->nb[1] / sizeof(float);
    quantize_row_q8_1_cuda((const float *)src1->data, nullptr, q8_1.get(), src0->type, ne10, s11, s11 * n, s11 * n,
                           ne10_padded, n, 1, 1, stream);
    const auto * y = (const block_q8_1 *)q8_1.get();
    const int stride_col_y = (int)(ne10_padded / QK8_1);
    const int stride_col_dst = (int)(dst->nb[1] / sizeof(float));
    float * d = (float *)dst->data;
    switch (src0->type) {
#define DFLASH_CASE(T, fn, vdr)                                                          \
    case GGML_TYPE_##T:                                                                  \
        launch<GGML_TYPE_##T>(src0, y, d, (int)n, stride_col_y, stride_col_dst, stream); \
        break;
        DFLASH_INVARIANT_TYPES(DFLASH_CASE)
#undef DFLASH_CASE
        default:
            return false;
    }
    CUDA_CHECK(cudaGetLastError());
    return true;
}
