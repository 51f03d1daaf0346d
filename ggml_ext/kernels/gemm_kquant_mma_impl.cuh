// ggml_ext's small-batch tensor-core GEMM for Q4_K weights, 9..64 activation columns (a verify of
// a chain or a tree): each weight byte is read once, straight into int8 mma operands, for all
// columns; no shared-memory staging of the weights and no stream-k fixup pass.
//
// A block of 4 warps owns 16 rows; its warps take the row's 256-value super-blocks w, w + 4, ...
// and add their sums in shared memory (in warp order). Per super-block a warp loads its 16 rows
// (header + nibbles: thread (g, t) = (lane / 4, lane % 4) takes rows g and g + 8, bytes 8t..8t+7
// of each 32-byte nibble chunk) and runs one m16n8k32 int8 mma per 32-value sub-block and 8
// columns. The k order inside a sub-block is permuted the same way for weights and activations
// (hardware k 4t..4t+3 and 16+4t..16+4t+3 hold values 8t..8t+3 and 8t+4..8t+7), so both load
// 8 contiguous bytes. Activations are int8 with one scale per 256 values and column (the CPU
// backend's q8_K rule) and int sums per 32: the sub-block scales then stay integer until the end
// of a super-block (sum_j sc_j C_j, sum_j m_j sum_j(y)), one float step per super-block.
#pragma once

#include "ggml-cuda/common.cuh"
#include "stream_loads.cuh"

namespace gemm_kq {

constexpr int kWarps = 4;
constexpr int kRows = 16;  // rows per block (one m16 tile)
constexpr int kQk = 256;

// c += a (16 x 32, int8) * b (32 x 8, int8), int32 accumulators.
__device__ __forceinline__ void mma_s8(int (&c)[4], const int (&a)[4], const int (&b)[2]) {
#if __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    NO_DEVICE_CODE;
#endif
}

// 6-bit scale and min of sub-block j from the 12 scale bytes s0..s2 (ggml's get_scale_min_k4).
__device__ __forceinline__ void scale_min(const uint32_t s0, const uint32_t s1, const uint32_t s2, const int j,
                                          int & sc, int & mn) {
    if (j < 4) {
        sc = (s0 >> (8 * j)) & 63;
        mn = (s1 >> (8 * j)) & 63;
    } else {
        const int b = 8 * (j - 4);
        sc = ((s2 >> b) & 15) | (((s0 >> (b + 6)) & 3) << 4);
        mn = ((s2 >> (b + 4)) & 15) | (((s1 >> (b + 6)) & 3) << 4);
    }
}

// ncol_tiles tiles of 8 columns; the activation buffers hold 8 * ncol_tiles columns (zeros past
// ncols). a_rows_paired: the A fragment's register order (see the file comment of the test).
template <int ncol_tiles, bool a_rows_paired>
__global__ void __launch_bounds__(kWarps * WARP_SIZE)
    gemm_q4_k_mma_kernel(const char * __restrict__ w, const int8_t * __restrict__ yq, const float * __restrict__ yd,
                         const int * __restrict__ ysum, float * __restrict__ dst, const int nrows, const int nblocks,
                         const int64_t row_bytes, const int k_pad, const int ncols, const int stride_col_dst) {
    const int lane = threadIdx.x, warp = threadIdx.y;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * kRows + g, row1 = row0 + 8;
    const char * w0 = w + (int64_t)min(row0, nrows - 1) * row_bytes;
    const char * w1 = w + (int64_t)min(row1, nrows - 1) * row_bytes;
    const int nsub = k_pad / 32;

    float acc[ncol_tiles][4] = {};
    for (int kb = warp; kb < nblocks; kb += kWarps) {
        const uint4 h0 = load_stream_16(w0 + (int64_t)kb * 144), h1 = load_stream_16(w1 + (int64_t)kb * 144);
        uint2 q0[4], q1[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            q0[c] = load_stream_8(w0 + (int64_t)kb * 144 + 16 + 32 * c + 8 * t);
            q1[c] = load_stream_8(w1 + (int64_t)kb * 144 + 16 + 32 * c + 8 * t);
        }
        int sc0[8], mn0[8], sc1[8], mn1[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            scale_min(h0.y, h0.z, h0.w, j, sc0[j], mn0[j]);
            scale_min(h1.y, h1.z, h1.w, j, sc1[j], mn1[j]);
        }
        const float2 dm0 = __half22float2(*reinterpret_cast<const half2 *>(&h0.x));
        const float2 dm1 = __half22float2(*reinterpret_cast<const half2 *>(&h1.x));
#pragma unroll
        for (int nt = 0; nt < ncol_tiles; ++nt) {
            const int8_t * yb = yq + (int64_t)(nt * 8 + g) * k_pad + kb * kQk + 8 * t;  // B: column g of the tile
            int cs[4] = {0, 0, 0, 0};
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const int c = j >> 1, sh = 4 * (j & 1);
                const int lo0 = (q0[c].x >> sh) & 0x0F0F0F0F, hi0 = (q0[c].y >> sh) & 0x0F0F0F0F;
                const int lo1 = (q1[c].x >> sh) & 0x0F0F0F0F, hi1 = (q1[c].y >> sh) & 0x0F0F0F0F;
                const int a[4] = {lo0, a_rows_paired ? hi0 : lo1, a_rows_paired ? lo1 : hi0, hi1};
                const int2 yv = *reinterpret_cast<const int2 *>(yb + 32 * j);
                const int b[2] = {yv.x, yv.y};
                int cj[4] = {0, 0, 0, 0};
                mma_s8(cj, a, b);
                cs[0] += sc0[j] * cj[0];
                cs[1] += sc0[j] * cj[1];
                cs[2] += sc1[j] * cj[2];
                cs[3] += sc1[j] * cj[3];
            }
            // C: (row0, col0), (row0, col0 + 1), (row1, col0), (row1, col0 + 1), col0 = 8 nt + 2t
            const int col0 = nt * 8 + 2 * t;
            const int * s_a = ysum + (int64_t)col0 * nsub + kb * 8;
            const int * s_b = s_a + nsub;
            int m00 = 0, m01 = 0, m10 = 0, m11 = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                m00 += mn0[j] * s_a[j];
                m01 += mn0[j] * s_b[j];
                m10 += mn1[j] * s_a[j];
                m11 += mn1[j] * s_b[j];
            }
            const float dy_a = yd[(int64_t)col0 * (k_pad / kQk) + kb],
                        dy_b = yd[(int64_t)(col0 + 1) * (k_pad / kQk) + kb];
            acc[nt][0] += dy_a * (dm0.x * (float)cs[0] - dm0.y * (float)m00);
            acc[nt][1] += dy_b * (dm0.x * (float)cs[1] - dm0.y * (float)m01);
            acc[nt][2] += dy_a * (dm1.x * (float)cs[2] - dm1.y * (float)m10);
            acc[nt][3] += dy_b * (dm1.x * (float)cs[3] - dm1.y * (float)m11);
        }
    }

    __shared__ float part[kWarps][ncol_tiles][4][WARP_SIZE];
#pragma unroll
    for (int nt = 0; nt < ncol_tiles; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) part[warp][nt][i][lane] = acc[nt][i];
    }
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int nt = 0; nt < ncol_tiles; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            float v = part[0][nt][i][lane];
#pragma unroll
            for (int p = 1; p < kWarps; ++p) v += part[p][nt][i][lane];
            const int row = i < 2 ? row0 : row1, col = nt * 8 + 2 * t + (i & 1);
            if (row < nrows && col < ncols) dst[(int64_t)col * stride_col_dst + row] = v;
        }
    }
}

// Activations for the kernel above: column j of x (stride_col_x floats apart) -> qs[j][k_pad]
// int8 with d[j][k_pad / 256] = max |x| / 127 per 256 values and sums[j][k_pad / 32] of the int8
// per 32; columns ncols..ncols_pad - 1 are zeros. Grid (k_pad / 256, ncols_pad), 256 threads.
static __global__ void quantize_act_k_kernel(const float * __restrict__ x, int8_t * __restrict__ qs,
                                             float * __restrict__ d, int * __restrict__ sums, const int k,
                                             const int k_pad, const int ncols, const int64_t stride_col_x) {
    const int j = blockIdx.y;
    const int i = blockIdx.x * kQk + threadIdx.x;
    const float v = (j < ncols && i < k) ? x[j * stride_col_x + i] : 0.0f;
    __shared__ float wmax[kQk / WARP_SIZE];
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, o));
    if (threadIdx.x % WARP_SIZE == 0) wmax[threadIdx.x / WARP_SIZE] = amax;
    __syncthreads();
    amax = wmax[0];
#pragma unroll
    for (int w = 1; w < kQk / WARP_SIZE; ++w) amax = fmaxf(amax, wmax[w]);
    const float dd = amax / 127.0f;
    const int q = amax == 0.0f ? 0 : (int)roundf(v / dd);
    qs[(int64_t)j * k_pad + i] = (int8_t)q;
    int s = q;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
    if (threadIdx.x % WARP_SIZE == 0) sums[(int64_t)j * (k_pad / 32) + i / 32] = s;
    if (threadIdx.x == 0) d[(int64_t)j * (k_pad / kQk) + blockIdx.x] = dd;
}

template <bool a_rows_paired>
void launch_q4_k(const char * w, const int8_t * yq, const float * yd, const int * ysum, float * dst, int nrows, int k,
                 int64_t row_bytes, int k_pad, int ncols, int stride_col_dst, cudaStream_t stream) {
    const dim3 grid((nrows + kRows - 1) / kRows, 1, 1), block(WARP_SIZE, kWarps, 1);
    const int nb = k / kQk;
#define GEMM_KQ_LAUNCH(NT)                  \
    gemm_q4_k_mma_kernel<NT, a_rows_paired> \
        <<<grid, block, 0, stream>>>(w, yq, yd, ysum, dst, nrows, nb, row_bytes, k_pad, ncols, stride_col_dst)
    if (ncols <= 16) {
        GEMM_KQ_LAUNCH(2);
    } else if (ncols <= 32) {
        GEMM_KQ_LAUNCH(4);
    } else {
        GEMM_KQ_LAUNCH(8);
    }
#undef GEMM_KQ_LAUNCH
}

// Column tiles the activation buffers need for ncols columns.
inline int padded_columns(int ncols) { return ncols <= 16 ? 16 : ncols <= 32 ? 32 : 64; }

}  // namespace gemm_kq
