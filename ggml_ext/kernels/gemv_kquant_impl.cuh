// ggml_ext's k-quant GEMV: the kernel template and the weight formats (gemv_kquant.cu has the
// design notes; gemv_q4_k.cu and gemv_q6_k.cu instantiate it, one weight type per compile unit).
#pragma once

#include "act_source.cuh"
#include "async_copy.cuh"
#include "ggml_ext_gemv_cuda.cuh"
#include "launch.cuh"
#include "pdl.cuh"
#include "stream_loads.cuh"

#include <type_traits>

#include "ggml-cuda/unary.cuh"

namespace gemv {

constexpr int kWarps = 4;
constexpr int kGroups = 4;  // super-blocks of a row taken by one warp at a time
constexpr int kQk = 256;    // values per super-block (QK_K)

// 8 bytes at a 2-byte aligned address, as two words (little endian), from aligned 4-byte loads
// (the third only when the address is not 4-aligned: nothing past the 8 bytes' last word is read).
__device__ __forceinline__ uint2 load_stream_8_align2(const char * p) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    const char * base = reinterpret_cast<const char *>(a & ~uintptr_t(3));
    const uint32_t shift = (uint32_t)(a & 2) * 8;
    const uint32_t w0 = load_stream_4(base), w1 = load_stream_4(base + 4);
    const uint32_t w2 = shift ? load_stream_4(base + 8) : 0u;
    return make_uint2(__funnelshift_r(w0, w1, shift), __funnelshift_r(w1, w2, shift));
}

__device__ __forceinline__ int dot4(int a, int b, int c) { return __dp4a(a, b, c); }

// Sum of the 16 int8 values in v.
__device__ __forceinline__ int sum16(const int4 v) {
    return dot4(v.x, 0x01010101, dot4(v.y, 0x01010101, dot4(v.z, 0x01010101, dot4(v.w, 0x01010101, 0))));
}

// ---- Q4_K: d, dmin (half2), 12 bytes of 6-bit scales and mins, 128 bytes of nibbles. --------------
struct Q4K {
    static constexpr int kBytes = 144;
    struct Raw {
        uint4 head;  // d, dmin, scales[0..11]
        uint4 qs;    // this lane's 16 bytes of nibbles
    };
    struct Act {  // this lane's activations of one column in one super-block
        int4 lo, hi;
        float d_lo, d_hi;
        int s_lo, s_hi;
    };

    static __device__ __forceinline__ Raw load(const char * blk, int m) {
        return {load_stream_16(blk), load_stream_16(blk + 16 + 16 * m)};
    }

    // Lane m: nibble slice m covers values 64c + p .. +15 (low nibbles, sub-block 2c) and
    // 64c + 32 + p .. +15 (high nibbles, sub-block 2c + 1), c = m / 2, p = 16 (m % 2).
    static __device__ __forceinline__ Act act(const int8_t * yq, const float * yd, int kb, int m) {
        const int c = m >> 1, p = (m & 1) * 16;
        const int8_t * y = yq + kb * kQk + 64 * c + p;
        Act a;
        a.lo = *reinterpret_cast<const int4 *>(y);
        a.hi = *reinterpret_cast<const int4 *>(y + 32);
        a.d_lo = yd[kb * 8 + 2 * c];
        a.d_hi = yd[kb * 8 + 2 * c + 1];
        a.s_lo = sum16(a.lo);
        a.s_hi = sum16(a.hi);
        return a;
    }

    static __device__ __forceinline__ float dot(const Raw & r, const Act & a, int m) {
        const uint4 q = r.qs;
        int d_lo = dot4(q.x & 0x0F0F0F0F, a.lo.x, 0);
        d_lo = dot4(q.y & 0x0F0F0F0F, a.lo.y, d_lo);
        d_lo = dot4(q.z & 0x0F0F0F0F, a.lo.z, d_lo);
        d_lo = dot4(q.w & 0x0F0F0F0F, a.lo.w, d_lo);
        int d_hi = dot4((q.x >> 4) & 0x0F0F0F0F, a.hi.x, 0);
        d_hi = dot4((q.y >> 4) & 0x0F0F0F0F, a.hi.y, d_hi);
        d_hi = dot4((q.z >> 4) & 0x0F0F0F0F, a.hi.z, d_hi);
        d_hi = dot4((q.w >> 4) & 0x0F0F0F0F, a.hi.w, d_hi);
        return combine(r.head, a, m, d_lo, d_hi);
    }

    // d (sc_lo d_lo y_lo + sc_hi d_hi y_hi) - dmin (mn_lo s_lo y_lo + mn_hi s_hi y_hi) for lane m's
    // sub-blocks 2c and 2c + 1 (c = m / 2): the integer dot products d_lo, d_hi of its 16 + 16
    // values, their activation sums in a. Shared with Q5_K, whose head is the same.
    static __device__ __forceinline__ float combine(const uint4 head, const Act & a, int m, int d_lo, int d_hi) {
        const int c = m >> 1;
        // 6-bit scale and min of sub-blocks 2c and 2c + 1 (ggml's get_scale_min_k4).
        const uint32_t s0 = head.y, s1 = head.z, s2 = head.w;
        int sc_lo, mn_lo, sc_hi, mn_hi;
        if (c < 2) {
            const int b0 = 16 * c, b1 = 16 * c + 8;
            sc_lo = (s0 >> b0) & 63;
            mn_lo = (s1 >> b0) & 63;
            sc_hi = (s0 >> b1) & 63;
            mn_hi = (s1 >> b1) & 63;
        } else {
            const int b0 = 16 * (c - 2), b1 = b0 + 8;
            sc_lo = ((s2 >> b0) & 15) | (((s0 >> (b0 + 6)) & 3) << 4);
            mn_lo = ((s2 >> (b0 + 4)) & 15) | (((s1 >> (b0 + 6)) & 3) << 4);
            sc_hi = ((s2 >> b1) & 15) | (((s0 >> (b1 + 6)) & 3) << 4);
            mn_hi = ((s2 >> (b1 + 4)) & 15) | (((s1 >> (b1 + 6)) & 3) << 4);
        }
        const float2 dm = __half22float2(*reinterpret_cast<const half2 *>(&head.x));
        const float scaled =
            __fadd_rn(__fmul_rn(a.d_lo, (float)(sc_lo * d_lo)), __fmul_rn(a.d_hi, (float)(sc_hi * d_hi)));
        const float mins =
            __fadd_rn(__fmul_rn(a.d_lo, (float)(mn_lo * a.s_lo)), __fmul_rn(a.d_hi, (float)(mn_hi * a.s_hi)));
        return __fsub_rn(__fmul_rn(dm.x, scaled), __fmul_rn(dm.y, mins));
    }
};

// ---- Q5_K: Q4_K's head (d, dmin, 6-bit scales and mins), qh[32] fifth bits, qs[128] nibbles ------
// (176 bytes). Lane m takes Q4_K's values: nibble slice m of qs, and of qh the 16 bytes
// qh[p..p+15] whose bits 2c and 2c + 1 are the fifth bits of its low and high nibbles
// (ggml's dequantize_row_q5_K: value 64c + l gets bit 2c of qh[l], value 64c + 32 + l bit 2c + 1).
struct Q5K {
    static constexpr int kBytes = 176;
    struct Raw {
        uint4 head;
        uint4 qs;
        uint4 qh;
    };
    using Act = Q4K::Act;

    static __device__ __forceinline__ Raw load(const char * blk, int m) {
        return {load_stream_16(blk), load_stream_16(blk + 48 + 16 * m), load_stream_16(blk + 16 + 16 * (m & 1))};
    }
    static __device__ __forceinline__ Act act(const int8_t * yq, const float * yd, int kb, int m) {
        return Q4K::act(yq, yd, kb, m);
    }
    static __device__ __forceinline__ int lo5(uint32_t q, uint32_t h, int c) {
        return (int)((q & 0x0F0F0F0F) | (((h >> (2 * c)) & 0x01010101) << 4));
    }
    static __device__ __forceinline__ int hi5(uint32_t q, uint32_t h, int c) {
        return (int)(((q >> 4) & 0x0F0F0F0F) | (((h >> (2 * c + 1)) & 0x01010101) << 4));
    }
    static __device__ __forceinline__ float dot(const Raw & r, const Act & a, int m) {
        const int c = m >> 1;
        const uint4 q = r.qs, h = r.qh;
        int d_lo = dot4(lo5(q.x, h.x, c), a.lo.x, 0);
        d_lo = dot4(lo5(q.y, h.y, c), a.lo.y, d_lo);
        d_lo = dot4(lo5(q.z, h.z, c), a.lo.z, d_lo);
        d_lo = dot4(lo5(q.w, h.w, c), a.lo.w, d_lo);
        int d_hi = dot4(hi5(q.x, h.x, c), a.hi.x, 0);
        d_hi = dot4(hi5(q.y, h.y, c), a.hi.y, d_hi);
        d_hi = dot4(hi5(q.z, h.z, c), a.hi.z, d_hi);
        d_hi = dot4(hi5(q.w, h.w, c), a.hi.w, d_hi);
        return Q4K::combine(r.head, a, m, d_lo, d_hi);
    }
};

// ---- Q8_0: blocks of 32 (half d, 32 int8), eight to a 256-value super-block (272 bytes, each
// block 2-byte aligned). Lane m takes block m: d (ggml's vec_dot_q8_0_q8_1: d_w d_y sum(q_w q_y)).
struct Q80 {
    static constexpr int kBytes = 8 * 34;
    struct Raw {
        uint2 q[4];
        uint32_t d;
    };
    struct Act {
        int4 lo, hi;
        float d;
    };

    static __device__ __forceinline__ Raw load(const char * blk, int m) {
        const char * b = blk + 34 * m;
        Raw r;
#pragma unroll
        for (int i = 0; i < 4; ++i) r.q[i] = load_stream_8_align2(b + 2 + 8 * i);
        r.d = load_stream_2(b);
        return r;
    }
    static __device__ __forceinline__ Act act(const int8_t * yq, const float * yd, int kb, int m) {
        const int8_t * y = yq + kb * kQk + 32 * m;
        return {*reinterpret_cast<const int4 *>(y), *reinterpret_cast<const int4 *>(y + 16), yd[kb * 8 + m]};
    }
    static __device__ __forceinline__ float dot(const Raw & r, const Act & a, int) {
        int s = dot4((int)r.q[0].x, a.lo.x, 0);
        s = dot4((int)r.q[0].y, a.lo.y, s);
        s = dot4((int)r.q[1].x, a.lo.z, s);
        s = dot4((int)r.q[1].y, a.lo.w, s);
        s = dot4((int)r.q[2].x, a.hi.x, s);
        s = dot4((int)r.q[2].y, a.hi.y, s);
        s = dot4((int)r.q[3].x, a.hi.z, s);
        s = dot4((int)r.q[3].y, a.hi.w, s);
        const float dw = __half2float(__ushort_as_half((unsigned short)r.d));
        return __fmul_rn(__fmul_rn(dw, a.d), (float)s);
    }
};

// ---- Q6_K: ql[128] low nibbles, qh[64] high 2 bits, int8 scales[16], half d (210 bytes). ---------
// Lane m: half n = m / 4, l0 = 8 (m % 4); values 128n + 32i + l0 .. +7 for quarters i = 0..3.
struct Q6K {
    static constexpr int kBytes = 210;
    struct Raw {
        uint2 ql_a, ql_b, qh, sc;  // ql[64n + l0..], ql[64n + 32 + l0..], qh[32n + l0..], scales[8n..]
        uint32_t d;
    };
    struct Act {
        int2 q[4];
        float d[4];
        int s32[4];  // 32 x the sum of each quarter's 8 values: the offset of the 6-bit quants
    };

    static __device__ __forceinline__ Raw load(const char * blk, int m) {
        const int n = m >> 2, l0 = 8 * (m & 3);
        Raw r;
        r.ql_a = load_stream_8_align2(blk + 64 * n + l0);
        r.ql_b = load_stream_8_align2(blk + 64 * n + 32 + l0);
        r.qh = load_stream_8_align2(blk + 128 + 32 * n + l0);
        r.sc = load_stream_8_align2(blk + 192 + 8 * n);
        r.d = load_stream_2(blk + 208);
        return r;
    }

    static __device__ __forceinline__ Act act(const int8_t * yq, const float * yd, int kb, int m) {
        const int n = m >> 2, l0 = 8 * (m & 3);
        Act a;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            a.q[i] = *reinterpret_cast<const int2 *>(yq + kb * kQk + 128 * n + 32 * i + l0);
            a.d[i] = yd[kb * 8 + 4 * n + i];
            a.s32[i] = 32 * dot4(a.q[i].x, 0x01010101, dot4(a.q[i].y, 0x01010101, 0));
        }
        return a;
    }

    // The 6-bit quants (0..63, stored with an offset of 32), four per word (ggml's
    // dequantize_row_q6_K); the offset comes off the integer sum: sum((q - 32) y) = sum(q y) - 32 sum(y).
    static __device__ __forceinline__ int quarter(uint32_t ql, uint32_t qh, int i) {
        const uint32_t lo = (i & 2) ? (ql >> 4) & 0x0F0F0F0F : ql & 0x0F0F0F0F;
        const uint32_t hi = ((qh >> (2 * i)) << 4) & 0x30303030;
        return (int)(lo | hi);
    }

    static __device__ __forceinline__ float dot(const Raw & r, const Act & a, int m) {
        const int is = (m & 3) >> 1;  // l0 / 16
        const half dh = __ushort_as_half((unsigned short)r.d);
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint2 ql = (i & 1) ? r.ql_b : r.ql_a;
            int s = dot4(quarter(ql.x, r.qh.x, i), a.q[i].x, 0);
            s = dot4(quarter(ql.y, r.qh.y, i), a.q[i].y, s) - a.s32[i];
            const uint32_t sw = (i < 2) ? r.sc.x : r.sc.y;  // scales[8n + is + 2i]
            const int sc = (int)(int8_t)(sw >> (8 * (is + 2 * (i & 1))));
            sum = __fadd_rn(sum, __fmul_rn(a.d[i], (float)(sc * s)));
        }
        return __fmul_rn(__half2float(dh), sum);
    }
};

// The end of a GEMV block: the butterfly over each warp, the split warps' sums in part order, the
// fused residual add and SwiGLU gate, the stores.
template <int ncols, int rows_per_warp, int split, bool gated>
__device__ __forceinline__ void finish(float (&acc)[ncols][rows_per_warp], float (&acc_gate)[ncols][rows_per_warp],
                                       const int row0, const int part, const float * bias, float * __restrict__ dst,
                                       const int nrows, const int stride_col_dst) {
    constexpr int kOut = ncols * rows_per_warp;
    const int lane = threadIdx.x, warp = threadIdx.y;
    // Butterfly over the warp: every lane holds every sum.
#pragma unroll
    for (int j = 0; j < ncols; ++j) {
#pragma unroll
        for (int r = 0; r < rows_per_warp; ++r) {
#pragma unroll
            for (int o = WARP_SIZE / 2; o > 0; o >>= 1) {
                acc[j][r] = __fadd_rn(acc[j][r], __shfl_xor_sync(0xffffffff, acc[j][r], o));
                if (gated) acc_gate[j][r] = __fadd_rn(acc_gate[j][r], __shfl_xor_sync(0xffffffff, acc_gate[j][r], o));
            }
        }
    }
    if (split > 1) {
        __shared__ float partial[kWarps][2][kOut];
        if (lane == 0) {
#pragma unroll
            for (int j = 0; j < ncols; ++j) {
#pragma unroll
                for (int r = 0; r < rows_per_warp; ++r) {
                    partial[warp][0][j * rows_per_warp + r] = acc[j][r];
                    partial[warp][1][j * rows_per_warp + r] = acc_gate[j][r];
                }
            }
        }
        __syncthreads();
        if (part != 0 || row0 >= nrows) return;
#pragma unroll
        for (int j = 0; j < ncols; ++j) {
#pragma unroll
            for (int r = 0; r < rows_per_warp; ++r) {
#pragma unroll
                for (int p = 1; p < split; ++p) {
                    acc[j][r] = __fadd_rn(acc[j][r], partial[warp + p][0][j * rows_per_warp + r]);
                    if (gated) acc_gate[j][r] = __fadd_rn(acc_gate[j][r], partial[warp + p][1][j * rows_per_warp + r]);
                }
            }
        }
    }
#pragma unroll
    for (int j = 0; j < ncols; ++j) {
#pragma unroll
        for (int r = 0; r < rows_per_warp; ++r) {
            const int row = row0 + r;
            if (lane == j * rows_per_warp + r && row < nrows) {  // kOut <= 16 lanes write
                float v = acc[j][r];
                const int64_t o = (int64_t)j * stride_col_dst + row;
                if (bias) v = __fadd_rn(v, bias[o]);  // ggml's fused residual add: dot + bias
                if (gated) v = __fmul_rn(v, ggml_cuda_op_silu_single(acc_gate[j][r]));  // SwiGLU: up * silu(gate)
                dst[o] = v;
            }
        }
    }
}

// Rows: a block's kWarps warps take kWarps / split row groups of rows_per_warp rows; the split
// warps of a group share its super-blocks (group g of part p takes p * kGroups + g, then every
// split * kGroups-th) and add their sums in shared memory in part order. split depends on K only
// and rows_per_warp does not touch a row's arithmetic, so a column's result is the same for any
// column count.
template <typename T, int ncols, int rows_per_warp, int split, bool gated, int unroll>
__global__ void __launch_bounds__(kWarps * WARP_SIZE)
    gemv_kquant_kernel(const char * __restrict__ w, const char * __restrict__ w_gate, const int8_t * yq,
                       const float * yd, const float * bias, float * __restrict__ dst, const int nrows,
                       const int nblocks, const int64_t row_bytes, const int k_pad, const int stride_col_dst) {
    static_assert(kWarps % split == 0, "split must divide the block's warps");
    const int lane = threadIdx.x, warp = threadIdx.y;
    const int g = lane >> 3, m = lane & 7;
    const int part = warp % split;
    const int row0 = (blockIdx.x * (kWarps / split) + warp / split) * rows_per_warp;
    if (split == 1 && row0 >= nrows) return;  // with split > 1 every warp reaches the barrier

    const char * rows[rows_per_warp];
    const char * rows_gate[rows_per_warp];
#pragma unroll
    for (int r = 0; r < rows_per_warp; ++r) {
        const int64_t row = min(row0 + r, nrows - 1);  // tail rows compute a duplicate, never written
        rows[r] = w + row * row_bytes;
        rows_gate[r] = gated ? w_gate + row * row_bytes : nullptr;
    }

    constexpr int kStep = split * kGroups;
    float acc[ncols][rows_per_warp] = {};
    float acc_gate[ncols][rows_per_warp] = {};
    bool waited = false;  // pdl_wait (pdl.cuh) once the first weights are on their way
    for (int kb0 = part * kGroups + g; kb0 < nblocks; kb0 += kStep * unroll) {
        typename T::Raw raw[unroll][rows_per_warp];
        typename T::Raw raw_gate[unroll][rows_per_warp];
#pragma unroll
        for (int u = 0; u < unroll; ++u) {
            const int kb = kb0 + u * kStep;
            if (kb < nblocks) {
#pragma unroll
                for (int r = 0; r < rows_per_warp; ++r) {
                    raw[u][r] = T::load(rows[r] + (int64_t)kb * T::kBytes, m);
                    if (gated) raw_gate[u][r] = T::load(rows_gate[r] + (int64_t)kb * T::kBytes, m);
                }
            }
        }
        if (!waited) {
            pdl_wait();
            pdl_trigger();
            waited = true;
        }
#pragma unroll
        for (int u = 0; u < unroll; ++u) {
            const int kb = kb0 + u * kStep;
            if (kb >= nblocks) break;
#pragma unroll
            for (int j = 0; j < ncols; ++j) {
                const typename T::Act a = T::act(yq + (int64_t)j * k_pad, yd + (int64_t)j * (k_pad / 32), kb, m);
#pragma unroll
                for (int r = 0; r < rows_per_warp; ++r) {
                    acc[j][r] = __fadd_rn(acc[j][r], T::dot(raw[u][r], a, m));
                    if (gated) acc_gate[j][r] = __fadd_rn(acc_gate[j][r], T::dot(raw_gate[u][r], a, m));
                }
            }
        }
    }
    if (!waited) pdl_wait();  // a warp without super-blocks still writes

    finish<ncols, rows_per_warp, split, gated>(acc, acc_gate, row0, part, bias, dst, nrows, stride_col_dst);
}

// Q6_K through shared memory (GemvShape::staged): the kernel above reads a lane's 25 bytes of a
// 210-byte block with ~11 small loads at 2-byte aligned addresses, and its Q6_K products run at
// ~2.2 TB/s against Q4_K's 2.7-2.9 (h200-s6-27b-kernels-*.json). Here each warp copies its next
// super-blocks' aligned 16-byte chunks with cp.async into a second stage while it computes on the
// first, and lanes read their words from shared memory. The same values in the same order reach
// the same sums as in the kernel above (bit-equal results); unroll 2, no gate. kStages 3 keeps two
// groups of copies in flight instead of one (a decode's Q6_K GEMVs of ~1.4-2.8 waves read at ~1.7
// TB/s on the H100 against ~2.75 for its 33-wave LM head, session 51): the same sums in the same
// order; the one-column default since session 52 (ncu on the H100, ffn_down: 0.48 warps issued a
// scheduler either way, 1.97 against 1.76 TB/s; h100-s52-c4-ncu-q6-details-*.txt).
constexpr int kQ6StageBlock = 224;  // 14 aligned chunks hold any 2-byte aligned 210-byte block

__device__ __forceinline__ Q6K::Raw q6k_raw_from_smem(const char * blk, int m) {
    const int n = m >> 2, l0 = 8 * (m & 3);
    const Smem4Align2 words(blk);
    auto pair = [&](int off) { return make_uint2(words(off), words(off + 4)); };
    Q6K::Raw r;
    r.ql_a = pair(64 * n + l0);
    r.ql_b = pair(64 * n + 32 + l0);
    r.qh = pair(128 + 32 * n + l0);
    r.sc = pair(192 + 8 * n);
    r.d = *reinterpret_cast<const uint16_t *>(blk + 208);
    return r;
}

// kSpans (GemvShape::q6k_spans): a warp's kGroups blocks of one row and unroll step are kGroups * 210
// contiguous bytes, so they come in as one run of aligned chunks (kQ6SpanChunks; a lane copies
// chunks lane and lane + 32 of each run, its source one multiply-add from the row) instead of 14
// chunks a block at slot addresses divided out per copy: the copy loop was ~25% of the kernel's
// instructions, its row pointers indexed at run time from local memory (ncu and SASS, H100,
// session 52: h100-s52-c4-*). The same bytes reach the same reads (block g of a run at the run's
// offset in its first chunk + 210 g), so the same bits.
constexpr int kQ6SpanChunks = (kGroups * Q6K::kBytes + 14 + 15) / 16;  // a 2-byte aligned run of kGroups blocks
static_assert(kQ6SpanChunks <= 2 * WARP_SIZE, "two chunks a lane");

template <int ncols, int rows_per_warp, int split, int kStages = 2, bool kSpans = false>
__global__ void __launch_bounds__(kWarps * WARP_SIZE)
    gemv_q6k_staged_kernel(const char * __restrict__ w, const int8_t * yq, const float * yd, const float * bias,
                           float * __restrict__ dst, const int nrows, const int nblocks, const int64_t row_bytes,
                           const int k_pad, const int stride_col_dst) {
    static_assert(kWarps % split == 0, "split must divide the block's warps");
    static_assert(kStages == 2 || kStages == 3, "two or three stages (48 KB of static shared memory)");
    constexpr int unroll = 2;
    constexpr int kStep = split * kGroups;
    constexpr int kSlots = unroll * rows_per_warp * kGroups;  // blocks per warp and stage
    constexpr int kRunBytes = 16 * kQ6SpanChunks;
    constexpr int kStageBytes = kSpans ? unroll * rows_per_warp * kRunBytes : kSlots * kQ6StageBlock;
    __shared__ __align__(16) char stages[kWarps][kStages][kStageBytes];
    const int lane = threadIdx.x, warp = threadIdx.y;
    const int g = lane >> 3, m = lane & 7;
    const int part = warp % split;
    const int row0 = (blockIdx.x * (kWarps / split) + warp / split) * rows_per_warp;
    if (split == 1 && row0 >= nrows) return;  // with split > 1 every warp reaches the barrier

    const char * rows[rows_per_warp];
#pragma unroll
    for (int r = 0; r < rows_per_warp; ++r) rows[r] = w + (int64_t)min(row0 + r, nrows - 1) * row_bytes;
    // the iteration starting at super-block `base`: block (u, r, group) in slot (u R + r) G + group
    auto stage_in = [&](char * st, int base) {
        for (int c = lane; c < kSlots * 14; c += WARP_SIZE) {
            const int slot = c / 14, j = c - slot * 14;
            const int grp = slot % kGroups, r = (slot / kGroups) % rows_per_warp, u = slot / (kGroups * rows_per_warp);
            const int kb = base + grp + u * kStep;
            if (kb < nblocks) {
                cp_async_16(st + slot * kQ6StageBlock + 16 * j,
                            align16_down(rows[r] + (int64_t)kb * Q6K::kBytes) + 16 * j);
            }
        }
        cp_async_commit();
    };
    // kSpans: run (u, r) = blocks base + u kStep .. + kGroups - 1 of row r (those below nblocks), in
    // its aligned chunks at (u R + r) kRunBytes
    auto stage_in_runs = [&](char * st, int base) {
#pragma unroll
        for (int u = 0; u < unroll; ++u) {
#pragma unroll
            for (int r = 0; r < rows_per_warp; ++r) {
                const int kb0 = base + u * kStep;
                const char * p = rows[r] + (int64_t)kb0 * Q6K::kBytes;
                const char * a = align16_down(p);
                // bytes needed from a: none past the row's last block (nblocks - kb0 may be < 1)
                const int need = offset_in16(p) + min(kGroups, nblocks - kb0) * Q6K::kBytes;
                char * run = st + (u * rows_per_warp + r) * kRunBytes;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int j = lane + WARP_SIZE * h;
                    if (j < kQ6SpanChunks && 16 * j < need) cp_async_16(run + 16 * j, a + 16 * j);
                }
            }
        }
        cp_async_commit();
    };
    auto stage = [&](char * st, int base) {
        if constexpr (kSpans) {
            stage_in_runs(st, base);
        } else {
            stage_in(st, base);
        }
    };

    float acc[ncols][rows_per_warp] = {};
    float acc_gate[ncols][rows_per_warp] = {};
    constexpr int kAdvance = kStep * unroll;  // super-blocks of a row from one iteration to the next
    int it = 0;
    // the first kStages - 1 iterations' blocks, a group each (empty past the row: the count of
    // groups committed stays what cp_async_wait expects)
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (part * kGroups + s * kAdvance < nblocks) {
            stage(stages[warp][s], part * kGroups + s * kAdvance);
        } else {
            cp_async_commit();
        }
    }
    pdl_wait();  // the first weights are on their way (pdl.cuh)
    pdl_trigger();
    for (int base = part * kGroups; base < nblocks; base += kAdvance, ++it) {
        cp_async_wait<kStages - 2>();  // this iteration's group; the newer ones may stay in flight
        __syncwarp();
        // iteration it + kStages - 1 into the stage iteration it - 1 left (every lane is past it)
        const int ahead = base + (kStages - 1) * kAdvance;
        if (ahead < nblocks) {
            stage(stages[warp][(it + kStages - 1) % kStages], ahead);
        } else if constexpr (kStages > 2) {
            cp_async_commit();
        }
        const char * st = stages[warp][it % kStages];
#pragma unroll
        for (int u = 0; u < unroll; ++u) {
            const int kb = base + g + u * kStep;
            if (kb >= nblocks) break;
            Q6K::Raw raw[rows_per_warp];
#pragma unroll
            for (int r = 0; r < rows_per_warp; ++r) {
                if constexpr (kSpans) {
                    const char * p = rows[r] + (int64_t)(base + u * kStep) * Q6K::kBytes;  // run (u, r)
                    const int off = (u * rows_per_warp + r) * kRunBytes + offset_in16(p) + g * Q6K::kBytes;
                    raw[r] = q6k_raw_from_smem(st + off, m);
                } else {
                    const int slot = (u * rows_per_warp + r) * kGroups + g;
                    raw[r] = q6k_raw_from_smem(
                        st + slot * kQ6StageBlock + offset_in16(rows[r] + (int64_t)kb * Q6K::kBytes), m);
                }
            }
#pragma unroll
            for (int j = 0; j < ncols; ++j) {
                const Q6K::Act a = Q6K::act(yq + (int64_t)j * k_pad, yd + (int64_t)j * (k_pad / 32), kb, m);
#pragma unroll
                for (int r = 0; r < rows_per_warp; ++r) acc[j][r] = __fadd_rn(acc[j][r], Q6K::dot(raw[r], a, m));
            }
        }
        __syncwarp();  // every lane is done with this stage before it is refilled
    }
    finish<ncols, rows_per_warp, split, false>(acc, acc_gate, row0, part, bias, dst, nrows, stride_col_dst);
}

// Blocks for nrows rows: kWarps / split row groups of rows_per_warp rows each.
inline dim3 gemv_grid(int nrows, int rows_per_warp, int split) {
    const int rows_per_block = kWarps / split * rows_per_warp;
    return dim3((nrows + rows_per_block - 1) / rows_per_block, 1, 1);
}

template <int ncols, int rows_per_warp, int split, int stages = 2, bool spans = false>
void launch_q6k_staged(const GemvArgs & a, cudaStream_t stream) {
    DFLASH_LAUNCH_PDL(dflash_pdl::kGemv, gemv_grid(a.nrows, rows_per_warp, split), dim3(WARP_SIZE, kWarps, 1), 0,
                      stream, gemv_q6k_staged_kernel<ncols, rows_per_warp, split, stages, spans>)(
        a.w, a.yq, a.yd, a.bias, a.dst, a.nrows, a.k / kQk, a.row_bytes, a.k_pad, a.stride_col_dst);
}

template <typename T, int ncols, int rows_per_warp, int split, bool gated, int unroll>
void launch(const GemvArgs & a, cudaStream_t stream) {
    DFLASH_LAUNCH_PDL(dflash_pdl::kGemv, gemv_grid(a.nrows, rows_per_warp, split), dim3(WARP_SIZE, kWarps, 1), 0,
                      stream, gemv_kquant_kernel<T, ncols, rows_per_warp, split, gated, unroll>)(
        a.w, a.w_gate, a.yq, a.yd, a.bias, a.dst, a.nrows, a.k / kQk, a.row_bytes, a.k_pad, a.stride_col_dst);
}

// Calls f(rows_per_warp, split) with the shape's layout as compile-time constants.
template <typename F>
void with_layout(const GemvShape & s, F && f) {
    using R1 = std::integral_constant<int, 1>;
    using R2 = std::integral_constant<int, 2>;
    using S4 = std::integral_constant<int, 4>;
    if (s.rows_per_warp == 2) {
        if (s.split == 4) return f(R2{}, S4{});
        if (s.split == 2) return f(R2{}, R2{});
        return f(R2{}, R1{});
    }
    if (s.split == 4) return f(R1{}, S4{});
    if (s.split == 2) return f(R1{}, R2{});
    return f(R1{}, R1{});
}

template <typename T, int ncols, bool gated, int unroll>
void launch_layout(const GemvArgs & a, const GemvShape & s, cudaStream_t stream) {
    with_layout(
        s, [&](auto r, auto p) { launch<T, ncols, decltype(r)::value, decltype(p)::value, gated, unroll>(a, stream); });
}

// Super-blocks in flight per row: 2, or 4 for one column (the decode step, to be measured:
// GemvShape::unroll). The order of a lane's sums is the same either way.
template <typename T, int ncols, bool gated>
void launch_shape(const GemvArgs & a, const GemvShape & s, cudaStream_t stream) {
    if constexpr (std::is_same_v<T, Q6K> && !gated) {
        if (s.staged) {
            return with_layout(s, [&](auto r, auto p) {
                constexpr int R = decltype(r)::value, P = decltype(p)::value;
                if constexpr (ncols == 1) {  // the decode step's third stage and runs (GemvShape)
                    if (s.q6k_stages == 3) {
                        return s.q6k_spans ? launch_q6k_staged<ncols, R, P, 3, true>(a, stream)
                                           : launch_q6k_staged<ncols, R, P, 3>(a, stream);
                    }
                    if (s.q6k_spans) return launch_q6k_staged<ncols, R, P, 2, true>(a, stream);
                }
                launch_q6k_staged<ncols, R, P>(a, stream);
            });
        }
    }
    if (ncols == 1 && s.unroll == 4) return launch_layout<T, ncols, gated, 4>(a, s, stream);
    return launch_layout<T, ncols, gated, 2>(a, s, stream);
}

// Gated products come from ggml's fused one-column call only.
template <typename T>
void launch_type(const GemvArgs & a, const GemvShape & s, cudaStream_t stream) {
    if (a.w_gate) return launch_shape<T, 1, true>(a, s, stream);
    switch (a.ncols) {
        case 1:
            return launch_shape<T, 1, false>(a, s, stream);
        case 2:
            return launch_shape<T, 2, false>(a, s, stream);
        case 3:
            return launch_shape<T, 3, false>(a, s, stream);
        case 4:
            return launch_shape<T, 4, false>(a, s, stream);
        case 5:
            return launch_shape<T, 5, false>(a, s, stream);
        case 6:
            return launch_shape<T, 6, false>(a, s, stream);
        case 7:
            return launch_shape<T, 7, false>(a, s, stream);
        default:
            return launch_shape<T, 8, false>(a, s, stream);
    }
}

// Activations: int8 per value and a scale per 32 by ggml's q8_1 rule (quantize with amax / 127,
// keep the scale rounded to half precision, as block_q8_1 stores it: the integer dot products and
// scales are then ggml's mul_mat_vec_q's, and only float summation order differs), column j at
// qs + j * k_pad and d + j * k_pad / 32; values past k are zero. x: floats or a SwiGLU's inputs
// (act_source.cuh).
static __global__ void quantize_act_kernel(const ActSource x, int8_t * __restrict__ qs, float * __restrict__ d,
                                           const int k, const int k_pad) {
    pdl_wait();  // launched with DFLASH_LAUNCH_PDL (pdl.cuh)
    pdl_trigger();
    const int j = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const float v = i < k ? x(j, i) : 0.0f;
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, o));
    const float dd = amax / 127.0f;
    qs[(int64_t)j * k_pad + i] = (int8_t)(amax == 0.0f ? 0 : (int)roundf(v / dd));
    if (threadIdx.x % 32 == 0) d[(int64_t)j * (k_pad / 32) + i / 32] = __half2float(__float2half_rn(dd));
}

// quantize_act_kernel for an RMSNorm source (x.norm_w; rms_norm_fusion.cu at one column): a block
// of ggml's norm threads a column (kThreads = x.norm_threads: 1024, or 256 for rows under 1024),
// thread i holding values i, i + kThreads, ... - the threads of ggml's rms_norm_f32<kThreads>,
// which sum x^2 in this order (then block_reduce): the same scale, and the same values scale * x *
// w, as the skipped norm kernel's output. Each warp's 32 values of one round are a q8_1 block.
// Columns of at most kNormMax values (ggml_ext_gemv_norm_source_ok).
constexpr int kNormMax = 8192;

template <int kThreads>
static __global__ void __launch_bounds__(kThreads)
    quantize_act_norm_kernel(const ActSource x, int8_t * __restrict__ qs, float * __restrict__ d, const int k,
                             const int k_pad) {
    constexpr int kPer = kThreads == 1024 ? kNormMax / 1024 : 1024 / kThreads;  // 256 threads: rows under 1024
    const int j = blockIdx.x, tid = threadIdx.x, lane = tid % WARP_SIZE;
    float w[kPer];
#pragma unroll
    for (int m = 0; m < kPer; ++m) {  // the norm's weights: no kernel's output, before pdl_wait
        const int i = tid + kThreads * m;
        w[m] = i < k ? x.norm_w[i] : 0.0f;
    }
    pdl_wait();  // launched with DFLASH_LAUNCH_PDL (pdl.cuh)
    pdl_trigger();
    const float * xc = x.x + (int64_t)j * x.sx;
    float v[kPer];
#pragma unroll
    for (int m = 0; m < kPer; ++m) {
        const int i = tid + kThreads * m;
        v[m] = i < k ? xc[i] : 0.0f;
    }
    float tmp = 0.0f;
#pragma unroll
    for (int m = 0; m < kPer; ++m) {
        if (tid + kThreads * m < k) tmp += v[m] * v[m];
    }
    __shared__ float s_sum[kThreads / WARP_SIZE];  // block_reduce's
    tmp = warp_reduce_sum(tmp);
    if (lane == 0) s_sum[tid / WARP_SIZE] = tmp;
    __syncthreads();
    tmp = warp_reduce_sum(lane < kThreads / WARP_SIZE ? s_sum[lane] : 0.0f);
    const float scale = rsqrtf(tmp / k + x.norm_eps);
#pragma unroll
    for (int m = 0; m < kPer; ++m) {
        const int i = tid + kThreads * m;
        if (i >= k_pad) break;                                 // the same for the warp (k_pad: a multiple of 256)
        const float val = i < k ? scale * v[m] * w[m] : 0.0f;  // rms_norm_f32's scale * x * mul
        float amax = fabsf(val);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, o));
        const float dd = amax / 127.0f;
        qs[(int64_t)j * k_pad + i] = (int8_t)(amax == 0.0f ? 0 : (int)roundf(val / dd));
        if (lane == 0) d[(int64_t)j * (k_pad / 32) + i / 32] = __half2float(__float2half_rn(dd));
    }
}

}  // namespace gemv
