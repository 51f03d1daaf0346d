// ggml_ext's Q4_K GEMM through Hopper's wgmma in f16 (sm_90a), for 17..64 activation columns: the
// weights dequantized to f16 in registers (d * sc * q - dmin * m, one LOP3, HSUB2 and HFMA2 per two
// values), the activations f16 in shared memory, f32 accumulators over all of K. Against the int8
// form (gemm_q4k_wgmma.cuh): no int32 step per super-block (there each super-block's wgmmas were
// waited for, then 2 accumulator sets turned to floats: latency with 2 warps a scheduler), one
// wgmma per 16 values instead of two per 32 (the 6-bit scale split lo / hi), and no activation
// sums; in exchange f16 products (the weights rounded to f16 like ggml's dequantize-to-f16 cuBLAS
// path; activations f16 instead of int8), so its outputs are within f16 rounding of the exact ones,
// not equal to the int8 forms'.
//
// Work is split stream-K: the grid's CTAs (one a multiprocessor) take equal runs of (row tile,
// super-block) units, so no wave is left mostly empty whatever the row count (the 27B's [gate; up],
// 272 tiles of 128 rows, is 2.06 waves as whole tiles). A tile split between CTAs is summed by the
// last of them to finish, in CTA order (deterministic), from a workspace.
#pragma once

#include "gemm_q4k_wgmma.cuh"

namespace gemm_kq {

// Half index of value v (0..31) of sub-block j of super-block kb, column col, in the f16
// activations of np columns: per k16 step (two a sub-block) the wgmma B tile of np columns x 16
// values, in K-major core matrices of 8 columns x 8 values (128 bytes; (kk, nn) at nn * 256 +
// kk * 128 bytes). K slot 8 h + 2 t + e of step st holds value 8 t + 4 st + 2 e + h: thread t's A
// fragment then takes its row's 8 values from the 8 bytes at 8 t (two nibbles a 32-bit lane).
__host__ __device__ __forceinline__ int64_t wgf_act_index(int kb, int j, int v, int col, int np) {
    const int t = v >> 3, st = (v >> 2) & 1, e = (v >> 1) & 1, h = v & 1;
    return ((int64_t)(kb * 8 + j) * 2 + st) * np * 16 + (col >> 3) * 128 + h * 64 + (col & 7) * 8 + 2 * t + e;
}

// Padded columns of the f16 form: 16, 32, 48 or 64.
inline int wgf_padded_columns(int ncols) { return ncols <= 16 ? 16 : ncols <= 32 ? 32 : ncols <= 48 ? 48 : 64; }

// x's columns as f16 in wgf_act_index's order; columns ncols..np-1 zero. Grid (k / 256, np).
static __global__ void convert_act_wgf_kernel(const ActSource x, half * __restrict__ y, const int k, const int ncols,
                                              const int np) {
    const int col = blockIdx.y, kb = blockIdx.x, i = kb * kQk + threadIdx.x;
    const float scale = col < ncols ? x.column_scale<kQk>(col, k) : 1.0f;  // col: the same for the block
    const float v = col < ncols ? x(col, i, scale) : 0.0f;
    y[wgf_act_index(kb, threadIdx.x / 32, threadIdx.x % 32, col, np)] = __float2half_rn(v);
}

inline void convert_act_wgf(const ActSource & x, half * y, int k, int ncols, cudaStream_t stream) {
    const int np = wgf_padded_columns(ncols);
    convert_act_wgf_kernel<<<dim3((unsigned)(k / kQk), (unsigned)np, 1), kQk, 0, stream>>>(x, y, k, ncols, np);
}

// d (+)= a (64 x 16 f16, registers: mma's A layout, warp w rows 16w..) * B (16 x N f16 at desc_b).
template <int N>
__device__ __forceinline__ void wgmma_f16(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, int accumulate);

#if defined(DFLASH_WGMMA)
template <>
__device__ __forceinline__ void wgmma_f16<16>(float (&d)[8], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, p, 1, 1, "
        "0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_f16<32>(float (&d)[16], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, "
        "{%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_f16<48>(float (&d)[24], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %29, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n48k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23}, {%24,%25,%26,%27}, "
        "%28, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_f16<64>(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%"
        "29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}
#endif

template <int n>
__device__ __forceinline__ void wg_wait() {
#if defined(DFLASH_WGMMA)
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(n) : "memory");
#endif
}

template <int n>
__device__ __forceinline__ void wg_pin_f(float (&d)[n]) {
#pragma unroll
    for (int i = 0; i < n; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Two f16 weights from two nibbles (bits 0..3 and 16..19 of q): q * s - m, s = d sc, m = dmin mn.
__device__ __forceinline__ uint32_t dequant_pair(uint32_t q, uint32_t s2, uint32_t m2) {
    const uint32_t h = (q & 0x000F000Fu) | 0x64006400u;  // 1024 + q, exact
    half2 v = __hsub2(*reinterpret_cast<const half2 *>(&h), __half2half2(__ushort_as_half(0x6400)));
    v = __hfma2(v, *reinterpret_cast<const half2 *>(&s2), *reinterpret_cast<const half2 *>(&m2));
    return *reinterpret_cast<const uint32_t *>(&v);
}

template <int N, int WG, int S>
struct WgfPlan {
    static constexpr int kRows = WG * kWgRows;   // a tile's rows
    static constexpr int kWBytes = kRows * 144;  // its Q4_K rows of one super-block
    static constexpr int kBBytes = N * kQk * 2;  // the columns' f16 values of one super-block
    static constexpr int kStageBytes = kWBytes + kBBytes;
    static constexpr int kSmem = S * kStageBytes;
    static constexpr int kThreads = 128 * WG;
    static constexpr int kWsFloats = 2 * kThreads * (N / 2);  // a CTA's two partial tiles (first, last)
};

// The CTA whose run of units holds unit u (runs: [units c / G, units (c + 1) / G)).
__device__ __forceinline__ int wgf_cta_of(int64_t u, int64_t units, int G) {
    int c = (int)(u * G / units);
    while (c > 0 && units * c / G > u) --c;
    while (c < G - 1 && units * (c + 1) / G <= u) ++c;
    return c;
}

// N: padded columns; WG: warpgroups a CTA (its tile: 64 WG rows); S: stages (S - 2 loaded ahead: a
// stage is refilled once the wgmmas that read it two units back are complete). y: convert_act_wgf's
// columns; ws: WgfPlan::kWsFloats a CTA; counters: one int a tile, zero (left zero).
template <int N, int WG, int S>
__global__ void __launch_bounds__(128 * WG, 1)
    gemm_q4k_wgmma_f16_kernel(const char * __restrict__ w, const half * __restrict__ y, float * __restrict__ dst,
                              float * __restrict__ ws, int * __restrict__ counters, const int nrows, const int nkb,
                              const int64_t row_bytes, const int ncols, const int stride_col_dst) {
#if defined(DFLASH_WGMMA)
    using P = WgfPlan<N, WG, S>;
    constexpr int kThreads = P::kThreads, kTileRows = P::kRows, NT = N / 8, kAhead = S - 2;
    static_assert(S >= 3, "two stages are being read while one loads");
    extern __shared__ __align__(128) char wgf_smem[];
    __shared__ int last_piece;
    const int lane = threadIdx.x, warp = threadIdx.y, tid = warp * WARP_SIZE + lane;
    const int g = lane >> 2, t = lane & 3, wrow = 16 * warp;
    const int tiles = (nrows + kTileRows - 1) / kTileRows;
    const int64_t units = (int64_t)tiles * nkb;
    const int G = gridDim.x, cta = blockIdx.x;
    const int64_t u0 = units * cta / G, u1 = units * (cta + 1) / G;
    if (u0 >= u1) return;

    constexpr int kWTotal = kTileRows * 9, kWChunks = (kWTotal + kThreads - 1) / kThreads;
    constexpr int kBChunks = P::kBBytes / 16;
    int wr[kWChunks], wo[kWChunks];  // this thread's 16-byte weight chunks: row, byte in the row
#pragma unroll
    for (int i = 0; i < kWChunks; ++i) {
        const int c = min(tid + i * kThreads, kWTotal - 1), r = c / 9;
        wr[i] = r, wo[i] = 16 * (c - 9 * r);
    }
    auto stage_in = [&](int slot, int64_t u) {
        const int tile = (int)(u / nkb), kb = (int)(u - (int64_t)tile * nkb);
        char * st = wgf_smem + slot * P::kStageBytes;
#pragma unroll
        for (int i = 0; i < kWChunks; ++i) {
            if (kWTotal % kThreads == 0 || tid + i * kThreads < kWTotal) {
                const int row = min(tile * kTileRows + wr[i], nrows - 1);
                cp_async_16(st + wr[i] * 144 + wo[i], w + (int64_t)row * row_bytes + (int64_t)kb * 144 + wo[i]);
            }
        }
        const char * src = reinterpret_cast<const char *>(y) + (int64_t)kb * P::kBBytes;
#pragma unroll
        for (int i = 0; i < (kBChunks + kThreads - 1) / kThreads; ++i) {
            const int c = tid + i * kThreads;
            if (kBChunks % kThreads == 0 || c < kBChunks) cp_async_16(st + P::kWBytes + 16 * c, src + 16 * c);
        }
    };
    // Writes a finished tile's (or the last piece's sum's) outputs.
    auto store = [&](int tile, const float (&v)[N / 2]) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int row = tile * kTileRows + wrow + g + (i < 2 ? 0 : 8), col = nt * 8 + 2 * t + (i & 1);
                if (row < nrows && col < ncols) dst[(int64_t)col * stride_col_dst + row] = v[4 * nt + i];
            }
        }
    };

#pragma unroll
    for (int i = 0; i < kAhead; ++i) {
        if (u0 + i < u1) stage_in(i % S, u0 + i);
        cp_async_commit();
    }
    float acc[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) acc[i] = 0.0f;
    uint32_t a[2][4][4];  // two buffers (sub-block pairs) x 4 k16 steps x the A fragment
    // per run of one tile: its units (the pipeline's stages flow on across runs), then its outputs
    for (int64_t seg = u0; seg < u1;) {
        const int tile = (int)(seg / nkb);
        const int64_t seg_end = u1 < (int64_t)(tile + 1) * nkb ? u1 : (int64_t)(tile + 1) * nkb;
        for (int64_t u = seg; u < seg_end; ++u) {
            const int i = (int)(u - u0);
            cp_async_wait<kAhead - 1>();
            fence_proxy_async();  // this thread's cp.async bytes, visible to the wgmma's async reads
            __syncthreads();      // every thread's; the stage of unit i - 2 is free (its wgmmas are complete)
            if (u + kAhead < u1) stage_in((i + kAhead) % S, u + kAhead);
            cp_async_commit();
            const char * st = wgf_smem + (i % S) * P::kStageBytes;
            const char * s0 = st + (wrow + g) * 144;
            const char * s1 = s0 + 8 * 144;
            const uint4 h0 = *reinterpret_cast<const uint4 *>(s0);
            const uint4 h1 = *reinterpret_cast<const uint4 *>(s1);
            const float2 dm0 = __half22float2(*reinterpret_cast<const half2 *>(&h0.x));
            const float2 dm1 = __half22float2(*reinterpret_cast<const half2 *>(&h1.x));
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const uint2 q0 = *reinterpret_cast<const uint2 *>(s0 + 16 + 32 * c + 8 * t);
                const uint2 q1 = *reinterpret_cast<const uint2 *>(s1 + 16 + 32 * c + 8 * t);
                uint32_t sc2[2][2], mn2[2][2];  // [nibble half h: sub-block 2c + h][row g, g + 8]
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    int sc, mn;
                    scale_min(h0.y, h0.z, h0.w, 2 * c + h, sc, mn);
                    const half s0h = __float2half_rn(dm0.x * (float)sc), m0h = __float2half_rn(-dm0.y * (float)mn);
                    scale_min(h1.y, h1.z, h1.w, 2 * c + h, sc, mn);
                    const half s1h = __float2half_rn(dm1.x * (float)sc), m1h = __float2half_rn(-dm1.y * (float)mn);
                    const half2 s0v = __half2half2(s0h), m0v = __half2half2(m0h);
                    const half2 s1v = __half2half2(s1h), m1v = __half2half2(m1h);
                    sc2[h][0] = *reinterpret_cast<const uint32_t *>(&s0v),
                    mn2[h][0] = *reinterpret_cast<const uint32_t *>(&m0v);
                    sc2[h][1] = *reinterpret_cast<const uint32_t *>(&s1v),
                    mn2[h][1] = *reinterpret_cast<const uint32_t *>(&m1v);
                }
                wg_wait<1>();  // the wgmmas that read buffer c & 1 (two groups back) are complete
                uint32_t (&A)[4][4] = a[c & 1];
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const uint32_t x0 = q0.x >> (4 * h), y0 = q0.y >> (4 * h);
                    const uint32_t x1 = q1.x >> (4 * h), y1 = q1.y >> (4 * h);
                    // step 0: values 8t + {0, 2} | {1, 3}; step 1: 8t + {4, 6} | {5, 7} (wgf_act_index)
                    A[2 * h][0] = dequant_pair(x0, sc2[h][0], mn2[h][0]);
                    A[2 * h][1] = dequant_pair(x1, sc2[h][1], mn2[h][1]);
                    A[2 * h][2] = dequant_pair(x0 >> 8, sc2[h][0], mn2[h][0]);
                    A[2 * h][3] = dequant_pair(x1 >> 8, sc2[h][1], mn2[h][1]);
                    A[2 * h + 1][0] = dequant_pair(y0, sc2[h][0], mn2[h][0]);
                    A[2 * h + 1][1] = dequant_pair(y1, sc2[h][1], mn2[h][1]);
                    A[2 * h + 1][2] = dequant_pair(y0 >> 8, sc2[h][0], mn2[h][0]);
                    A[2 * h + 1][3] = dequant_pair(y1 >> 8, sc2[h][1], mn2[h][1]);
                }
                wg_fence();
#pragma unroll
                for (int h = 0; h < 2; ++h) {
#pragma unroll
                    for (int s = 0; s < 2; ++s) {
                        const int step = (2 * c + h) * 2 + s;
                        // the first of a tile's run overwrites the accumulators (no float zeroing to merge
                        // with the in-flight ones at the loop's head: ptxas would wait there every unit)
                        wgmma_f16<N>(acc, A[2 * h + s], wg_desc(st + P::kWBytes + step * N * 32, 128, 256),
                                     u != seg || step != 0);
                    }
                }
                wg_commit();
            }
        }
        // the end of this CTA's run of the tile: all of it, or a piece
        wg_wait<0>();
        float fin[N / 2];  // the accumulators copied out where every thread runs (their reads stay off divergent paths)
#pragma unroll
        for (int r = 0; r < N / 2; ++r) asm volatile("mov.b32 %0, %1;" : "=f"(fin[r]) : "f"(acc[r]) : "memory");
        const int64_t t_lo = (int64_t)tile * nkb, t_hi = t_lo + nkb;
        if (seg == t_lo && seg_end == t_hi) {
            store(tile, fin);
        } else {
            const int c_first = wgf_cta_of(t_lo, units, G), c_last = wgf_cta_of(t_hi - 1, units, G);
            float * mine = ws + (int64_t)(2 * cta + (seg == u0 ? 0 : 1)) * kThreads * (N / 2);
#pragma unroll
            for (int r = 0; r < N / 2; ++r) mine[r * kThreads + tid] = fin[r];
            __threadfence();
            __syncthreads();
            if (tid == 0) last_piece = atomicAdd(&counters[tile], 1) == c_last - c_first;
            __syncthreads();
            if (last_piece) {
                __threadfence();
                float sum[N / 2];
#pragma unroll
                for (int r = 0; r < N / 2; ++r) sum[r] = 0.0f;
                for (int cp = c_first; cp <= c_last; ++cp) {           // in CTA order, whichever finished last
                    const int which = units * cp / G >= t_lo ? 0 : 1;  // its first run, or its last
                    const float * piece = ws + (int64_t)(2 * cp + which) * kThreads * (N / 2);
#pragma unroll
                    for (int r = 0; r < N / 2; ++r) sum[r] += __ldcg(piece + r * kThreads + tid);
                }
                store(tile, sum);
                if (tid == 0) counters[tile] = 0;
            }
        }
        seg = seg_end;
    }
    cp_async_wait<0>();
#else
    NO_DEVICE_CODE;
#endif
}

// CTAs for the stream-K grid: every multiprocessor's resident CTAs, at most one a unit.
template <int N, int WG, int S>
int wgf_grid(int nsm, int64_t units) {
    int per_sm = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemm_q4k_wgmma_f16_kernel<N, WG, S>, 128 * WG,
                                                  WgfPlan<N, WG, S>::kSmem);
    return (int)std::min<int64_t>(units, (int64_t)std::max(1, per_sm) * nsm);
}

// Returns false when the kernel cannot run here (the shared-memory opt-in failed). grid 0: the
// stream-K grid (wgf_grid); else that many CTAs (tiles: one a tile, no pieces). ws: wgf_ws_floats;
// counters: one zero int a tile (left zero).
template <int WG = 2, int S = 4>
bool launch_q4k_wgmma_f16(const char * w, const half * y, float * dst, float * ws, int * counters, int nrows, int k,
                          int64_t row_bytes, int ncols, int stride_col_dst, int nsm, int grid, cudaStream_t stream) {
    const int np = wgf_padded_columns(ncols), nkb = k / kQk;
    const int tiles = (nrows + WG * kWgRows - 1) / (WG * kWgRows);
    auto go = [&](auto n_tag) {
        constexpr int N = decltype(n_tag)::value;
        auto kernel = gemm_q4k_wgmma_f16_kernel<N, WG, S>;
        static bool attr = false;
        if (!attr) {
            if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, WgfPlan<N, WG, S>::kSmem) !=
                cudaSuccess) {
                return false;
            }
            attr = true;
        }
        const int G = grid > 0 ? grid : wgf_grid<N, WG, S>(nsm, (int64_t)tiles * nkb);
        kernel<<<G, dim3(WARP_SIZE, 4 * WG, 1), WgfPlan<N, WG, S>::kSmem, stream>>>(w, y, dst, ws, counters, nrows, nkb,
                                                                                    row_bytes, ncols, stride_col_dst);
        return true;
    };
    switch (np) {
        case 16:
            return go(std::integral_constant<int, 16>{});
        case 32:
            return go(std::integral_constant<int, 32>{});
        case 48:
            return go(std::integral_constant<int, 48>{});
        default:
            return go(std::integral_constant<int, 64>{});
    }
}

// Workspace floats launch_q4k_wgmma_f16 needs for grid CTAs (at most nsm x resident a multiprocessor).
template <int WG = 2>
inline size_t wgf_ws_floats(int grid) {
    return (size_t)grid * 2 * 128 * WG * 32;
}

}  // namespace gemm_kq
