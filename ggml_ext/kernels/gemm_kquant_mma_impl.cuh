// ggml_ext's small-batch tensor-core GEMM for Q4_K and Q6_K (and Q5_K, Q8_0) weights, 2..64 activation columns
// (a verify of a chain or a tree): each weight byte is read once for all columns, into int8 mma
// operands; no stream-k fixup pass.
//
// A block of W warps (4; 8 for long rows, kLongRowBlocks) owns 16 rows; its warps take the rows'
// 256-value super-blocks w, w + W, ...
// and add their sums in shared memory (in warp order). With kStages > 0 each warp keeps kStages
// super-blocks of its 16 rows in flight with cp.async into its own shared-memory stages (the
// bytes in flight cost no registers); kStages == 0 loads straight from global memory into
// registers (the first version, kept for the benches). Thread (g, t) = (lane / 4, lane % 4)
// computes rows g and g + 8.
//
// Q4_K: one m16n8k32 int8 mma per 32-value sub-block and 8 columns. The k order inside a
// sub-block is permuted the same way for weights and activations (hardware k 4t..4t+3 and
// 16+4t..16+4t+3 hold values 8t..8t+3 and 8t+4..8t+7), so both read 8 contiguous bytes.
// Activations are int8 with one scale per 256 values and column (the CPU backend's q8_K rule) and
// int sums per 32: the sub-block scales stay integer until the end of a super-block (sum_j sc_j
// C_j, sum_j m_j sum_j(y)), one float step per super-block.
// Q6_K: one m16n8k16 mma per 16-value scale group (thread t holds values 4t..4t+3 of a group);
// the offset -32 is applied to the int8 weight operands, so no activation sums are needed.
//
// Activations are stored tiled (act_q_index): the B operand of one sub-block and 8-column tile is
// 256 contiguous bytes, lane 4g + t's 8 bytes at offset 8 * lane, so a warp loads it in one
// coalesced request. Column-major activations cost 8 cache lines a load: L1 was the busiest
// unit (71% at 16 columns, ncu on the H200, session 9).
#pragma once

#include <climits>

#include "act_source.cuh"
#include "async_copy.cuh"
#include "ggml-cuda/common.cuh"
#include "launch.cuh"
#include "pdl.cuh"
#include "stream_loads.cuh"
#include "tma_copy.cuh"

#include <cstdint>
#include <cstdlib>
#include <type_traits>

namespace gemm_kq {

constexpr int kWarps = 4;
constexpr int kRows = 16;  // rows per block (one m16 tile)
constexpr int kQk = 256;

// Which of a 32-value sub-block's values lane (g, t) holds in its 8 bytes: 8t..8t+7 (kRun: Q4_K,
// Q5_K, whose nibble bytes thread t reads as one run) or 4t..4t+3 and 16+4t..16+4t+3 (kHalves:
// Q6_K's two 16-value groups, Q8_0's PTX k order). kWgmma: kRun's order in the K-major core
// matrices a wgmma B descriptor reads (gemm_q4k_wgmma.cuh).
enum class ActLayout { kRun, kHalves, kWgmma };

// What an activation source holds (ActSource; quantize_act_k_kernel's kSrc): floats, a SwiGLU's
// or an RMSNorm's inputs (kPlain), a per-head RMSNorm's SwiGLU (kHeadNorm), a sigmoid gate and
// the values it gates (kSigmoidGate).
enum class SrcForm { kPlain, kHeadNorm, kSigmoidGate };
inline SrcForm src_form(const ActSource & x) {
    return x.head_w ? SrcForm::kHeadNorm : x.gate ? SrcForm::kSigmoidGate : SrcForm::kPlain;
}

// fn(std::integral_constant<SrcForm, src_form(x)>): a launcher's kernel for x's form.
template <typename Fn>
void with_src_form(const ActSource & x, Fn && fn) {
    switch (src_form(x)) {
        case SrcForm::kHeadNorm:
            fn(std::integral_constant<SrcForm, SrcForm::kHeadNorm>{});
            break;
        case SrcForm::kSigmoidGate:
            fn(std::integral_constant<SrcForm, SrcForm::kSigmoidGate>{});
            break;
        default:
            fn(std::integral_constant<SrcForm, SrcForm::kPlain>{});
    }
}

// kWgmma: per super-block kb and sub-block j a tile of np = 8 ncol_tiles columns x 32 bytes, in
// core matrices of 8 columns x 16 bytes; core matrix (kk, nn) (bytes 16 kk.. of columns 8 nn..) at
// nn * 256 + kk * 128. A column's bytes are in the hardware k order of Q4_K's weight operands
// (k 4t + i: value 8t + i; k 16 + 4t + i: value 8t + 4 + i).
__host__ __device__ __forceinline__ int64_t wg_act_index(int kb, int j, int v, int col, int np) {
    const int t = v >> 3, i = v & 7;
    const int p = i < 4 ? 4 * t + i : 16 + 4 * t + (i - 4);
    return (int64_t)kb * np * 256 + (int64_t)j * np * 32 + (col >> 3) * 256 + (p >> 4) * 128 + (col & 7) * 16 +
           (p & 15);
}

// Byte of value v (0..31) of sub-block j of super-block kb, column 8 nt + g, in the tiled int8
// activations of ncol_tiles column tiles.
template <ActLayout L>
__host__ __device__ __forceinline__ int64_t act_q_index(int kb, int j, int v, int col, int ncol_tiles) {
    if constexpr (L == ActLayout::kWgmma) return wg_act_index(kb, j, v, col, 8 * ncol_tiles);
    const int nt = col >> 3, g = col & 7;
    const int t = L == ActLayout::kRun ? v >> 3 : (v & 15) >> 2;
    const int byte = L == ActLayout::kRun ? v & 7 : ((v >> 4) << 2) | (v & 3);
    return ((((int64_t)kb * 8 + j) * ncol_tiles + nt) * WARP_SIZE + 4 * g + t) * 8 + byte;
}

// The 8 bytes of lane `lane` for sub-block j and column tile nt.
__device__ __forceinline__ int2 act_q_lane(const int8_t * yq, int kb, int j, int nt, int lane, int ncol_tiles) {
    return *reinterpret_cast<const int2 *>(yq + ((((int64_t)kb * 8 + j) * ncol_tiles + nt) * WARP_SIZE + lane) * 8);
}

// Per-32 sums of the int8 activations: the 8 sub-blocks of super-block kb, column col, contiguous;
// ints, or in ActLayout::kWgmma halves (the sum rounded to f16, as the mma of the wgmma forms'
// float step takes it: exact up to 2048, within 1/2048 above; the same value the other forms round
// theirs to before their mma), one 32-bit word of two sub-blocks' sums where the float step reads it.
__host__ __device__ __forceinline__ int64_t act_sum_index(int kb, int col, int ncol_tiles) {
    return ((int64_t)kb * 8 * ncol_tiles + col) * 8;
}

// Activation scales: the 8 ncol_tiles columns of super-block kb, contiguous (or of 32-value block
// kb, for formats whose kActBlock is 32).
__host__ __device__ __forceinline__ int64_t act_d_index(int kb, int col, int ncol_tiles) {
    return (int64_t)kb * 8 * ncol_tiles + col;
}

// A thread's kN outputs to dst (stride_col_dst floats a column): output e is value(e) at pos(e) =
// {row, col}, not written past nrows or ncols (or where pos gives INT_MAX). kRes: plus the residual
// res (stride_col_res floats a column; it may be dst itself), one float addition each, every
// residual loaded before the first store. Loaded one at a time between the stores (res may alias
// dst, so the compiler kept each load after the store before it) a thread waited for one global
// round trip an output: sm_90a SASS of the GEMMs' kRes instances alternated LDG and STG, and on the
// H100 (session 45) ffn_down at 64 columns took ~11 us a launch more with its residual than
// without, in the int8 and f16 wgmma kernels alike.
template <int kN, bool kRes, typename Pos, typename Value>
__device__ __forceinline__ void write_outputs(Pos && pos, Value && value, float * dst, const int stride_col_dst,
                                              const float * res, const int stride_col_res, const int nrows,
                                              const int ncols) {
    float add[kRes ? kN : 1];
    if constexpr (kRes) {
#pragma unroll
        for (int e = 0; e < kN; ++e) {
            const int2 p = pos(e);
            add[e] = p.x < nrows && p.y < ncols ? res[(int64_t)p.y * stride_col_res + p.x] : 0.0f;
        }
    }
#pragma unroll
    for (int e = 0; e < kN; ++e) {
        const int2 p = pos(e);
        if (p.x < nrows && p.y < ncols) {
            float v = value(e);
            if constexpr (kRes) v += add[e];
            dst[(int64_t)p.y * stride_col_dst + p.x] = v;
        }
    }
}

// c += a (16 x 32, int8) * b (32 x 8, int8), int32 accumulators. A: a0 (g, 4t..), a1 (g + 8, 4t..),
// a2 (g, 16 + 4t..), a3 (g + 8, 16 + 4t..) (PTX's layout; checked on the H200).
__device__ __forceinline__ void mma_s8(int (&c)[4], const int (&a)[4], const int (&b)[2]) {
#if defined(DFLASH_CUDA_EMU)
    cuda_emu::mma_m16n8k32_s8(c, a, b);
#elif __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    NO_DEVICE_CODE;
#endif
}

// c += a (16 x 16, int8) * b (16 x 8, int8). A: a0 row g, a1 row g + 8, k 4t..4t+3.
__device__ __forceinline__ void mma_s8_k16(int (&c)[4], const int (&a)[2], const int b) {
#if defined(DFLASH_CUDA_EMU)
    cuda_emu::mma_m16n8k16_s8(c, a, b);
#elif __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(b));
#else
    NO_DEVICE_CODE;
#endif
}

// 4 bytes at a 2-byte aligned global address: one streaming load, or two and a funnel shift.
__device__ __forceinline__ uint32_t load_stream_4_align2(const char * p) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    if ((a & 2) == 0) return load_stream_4(p);
    const char * base = reinterpret_cast<const char *>(a - 2);
    return __funnelshift_r(load_stream_4(base), load_stream_4(base + 4), 16);
}

// Super-blocks of kBytes, a multiple of 16, in 16-byte aligned rows (Q4_K, Q5_K, Q8_0): a stage
// holds whole blocks as they are (Q6_K's 2-byte aligned blocks are staged otherwise, below).
template <int kBlockBytes>
struct AlignedBlocks {
    static_assert(kBlockBytes % 16 == 0, "whole 16-byte chunks");
    static constexpr int kBytes = kBlockBytes;
    static constexpr int kChunks = kBytes / 16;     // 16-byte copies per row and super-block
    static constexpr int kStageRow = 16 * kChunks;  // bytes per row in a stage
    static constexpr bool kRowsAligned = true;      // a row's super-block kb starts kb * kBytes after it

    static __device__ __forceinline__ const char * row_block(const char * w, int row, int64_t row_bytes, int kb) {
        return w + (int64_t)row * row_bytes + (int64_t)kb * kBytes;
    }
    static __device__ __forceinline__ const char * aligned_start(const char * blk) { return blk; }
    static __device__ __forceinline__ int stage_offset(const char *) { return 0; }
};

// ---- Q4_K: d, dmin (half2), 12 bytes of 6-bit scales and mins, 128 bytes of nibbles ------------
// A Q4_K super-block's 6-bit sub-block scales and mins (ggml's get_scale_min_k4) four at a time,
// a byte each, from its 12 scale bytes s0..s2: scales 0..3 (half 0) or 4..7 (half 1) in one or
// two logic ops, then one byte permute a scale (byte_at), where extracting each alone took ~5.
// Computed where used (a word held across the super-block spilled at 80 registers).
__device__ __forceinline__ uint32_t scale_word(const uint32_t s0, const uint32_t s2, int half) {
    return half == 0 ? s0 & 0x3F3F3F3Fu : (s2 & 0x0F0F0F0Fu) | ((s0 >> 2) & 0x30303030u);
}
__device__ __forceinline__ uint32_t min_word(const uint32_t s1, const uint32_t s2, int half) {
    return half == 0 ? s1 & 0x3F3F3F3Fu : ((s2 >> 4) & 0x0F0F0F0Fu) | ((s1 >> 2) & 0x30303030u);
}

// Byte i (0..3) of w, zero-extended.
__device__ __forceinline__ int byte_at(const uint32_t w, int i) {
    return (int)__byte_perm(w, 0u, 0x4440u | (unsigned)i);
}

// The mins 2t and 2t + 1 of a super-block (scale bytes s1, s2) as a half2, exact (mins <= 63):
// their bytes under 0x64 exponent bytes read as 1024 + m, less 1024.
__device__ __forceinline__ uint32_t mins_half2(const uint32_t s1, const uint32_t s2, int t) {
    const unsigned lo = 2u * (unsigned)(t & 1);
    const uint32_t biased = __byte_perm(min_word(s1, s2, t >> 1), 0x64646464u, 0x4040u | lo | ((lo + 1u) << 8));
    const half2 h = __hsub2(*reinterpret_cast<const half2 *>(&biased), __floats2half2_rn(1024.0f, 1024.0f));
    return *reinterpret_cast<const uint32_t *>(&h);
}

// c += a (16 x 16, f16) * b (16 x 8, f16), f32 accumulators. A: a0 (g, 2t..2t+1), a1 (g + 8, ..),
// a2 (g, 8 + 2t..), a3 (g + 8, 8 + 2t..); B: b0 (k 2t..2t+1, col g), b1 (k 8 + 2t..); C as above.
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(DFLASH_CUDA_EMU)
    cuda_emu::mma_m16n8k16_f16(c, a, b);
#elif __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    NO_DEVICE_CODE;
#endif
}

__device__ __forceinline__ uint32_t half2_bits(float lo, float hi) {
    const half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
}

// kMinsMma: the min term sum_j m_j sum_j(y) of a tile through one f16 mma (k = the 8 sub-blocks,
// zero-padded to 16; mins <= 63 are exact in f16, the per-32 sums <= 4064 to within 1) instead of
// 32 integer multiply-adds and 16 loads of sums. The engine's form for Q4_K (faster at 9..16
// columns on the H200, session 8); its sums may differ from the integer form by 1 in 4064.
// kFifthBit: Q5_K, Q4_K's layout with qh[32] (the fifth bit of value l of sub-block j is bit j of
// qh[l]) between the head and the nibbles (176 bytes).
template <bool kMinsMma, bool kFifthBit = false>
struct Q4KT : AlignedBlocks<kFifthBit ? 176 : 144> {
    static constexpr bool kNeedsSums = true;
    static constexpr ActLayout kLayout = ActLayout::kRun;
    static constexpr int kActBlock = kQk;  // values per activation scale
    static constexpr int kMinBlocks16 = 6;
    static constexpr int kNibbles = kFifthBit ? 48 : 16;  // where the nibbles start

    // Sub-block by sub-block (j outer, column tiles inner): one sub-block's operands are live at a
    // time, its int sums per column tile in cs (the j-inner order kept all 8 unpacked: 128 registers
    // at 16 columns, 4 blocks a multiprocessor). R row tiles (b0[r], b1[r]: rows g and g + 8 of
    // tile r) share each activation load: a warp's B operand feeds R mmas.
    template <int ncol_tiles, bool smem, int R>
    static __device__ __forceinline__ void accumulate(float (&acc)[R][ncol_tiles][4], const char * const (&b0)[R],
                                                      const char * const (&b1)[R], const int8_t * yq, const float * yd,
                                                      const int * ysum, int kb, int g, int t) {
        auto load16 = [](const char * p) { return smem ? *reinterpret_cast<const uint4 *>(p) : load_stream_16(p); };
        auto load8 = [](const char * p) { return smem ? *reinterpret_cast<const uint2 *>(p) : load_stream_8(p); };
        const int lane = 4 * g + t;
        // kAhead: the B operands of every column tile loaded a sub-block ahead of their mmas. Loaded
        // right before them, they were what these kernels waited on most (ncu on the H200 at 32 and
        // 64 columns: long scoreboard ~3 of ~7 cycles an issued instruction, against ~0.8 of ~4.4 in
        // Q6K, which loads a sub-block's tiles together: bench/results/h200-s26-ncu-gemm-stalls.txt).
        // Ahead, one row tile a warp ran 1-9% faster (ffn_down 34.4 / 39.4 against 36.1 / 43.3 us at
        // 32 / 48 columns), two ran no faster at 32..48 columns and up to 3.5% slower at 16 (their
        // 168 registers), so two keep the loads in place (h200-s26-mma-standalone-ahead.json.gz).
        constexpr bool kAhead = R == 1;
        int2 y_cur[ncol_tiles], y_next[ncol_tiles];
        if constexpr (kAhead) {
#pragma unroll
            for (int nt = 0; nt < ncol_tiles; ++nt) y_cur[nt] = act_q_lane(yq, kb, 0, nt, lane, ncol_tiles);
        }
        uint4 h0[R], h1[R];
        uint2 e0[R], e1[R];  // Q5_K: qh[8t..8t+7], the fifth bits of values 8t..8t+7
#pragma unroll
        for (int r = 0; r < R; ++r) {
            h0[r] = load16(b0[r]);
            h1[r] = load16(b1[r]);
            e0[r] = e1[r] = {0u, 0u};
            if constexpr (kFifthBit) {
                e0[r] = load8(b0[r] + 16 + 8 * t);
                e1[r] = load8(b1[r] + 16 + 8 * t);
            }
        }
        int cs[R][ncol_tiles][4] = {};
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            uint2 q0[R], q1[R];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                q0[r] = load8(b0[r] + kNibbles + 32 * c + 8 * t);
                q1[r] = load8(b1[r] + kNibbles + 32 * c + 8 * t);
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int j = 2 * c + h, sh = 4 * h;
                if (kAhead && j + 1 < 8) {
#pragma unroll
                    for (int nt = 0; nt < ncol_tiles; ++nt)
                        y_next[nt] = act_q_lane(yq, kb, j + 1, nt, lane, ncol_tiles);
                }
                int a[R][4], sc0[R], sc1[R];
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    sc0[r] = byte_at(scale_word(h0[r].y, h0[r].w, j >> 2), j & 3);
                    sc1[r] = byte_at(scale_word(h1[r].y, h1[r].w, j >> 2), j & 3);
                    int lo0 = (q0[r].x >> sh) & 0x0F0F0F0F, hi0 = (q0[r].y >> sh) & 0x0F0F0F0F;
                    int lo1 = (q1[r].x >> sh) & 0x0F0F0F0F, hi1 = (q1[r].y >> sh) & 0x0F0F0F0F;
                    if constexpr (kFifthBit) {  // bit j of each qh byte -> bit 4 of the value
                        lo0 |= ((e0[r].x >> j) & 0x01010101) << 4;
                        hi0 |= ((e0[r].y >> j) & 0x01010101) << 4;
                        lo1 |= ((e1[r].x >> j) & 0x01010101) << 4;
                        hi1 |= ((e1[r].y >> j) & 0x01010101) << 4;
                    }
                    a[r][0] = lo0, a[r][1] = lo1, a[r][2] = hi0, a[r][3] = hi1;
                }
#pragma unroll
                for (int nt = 0; nt < ncol_tiles; ++nt) {
                    const int2 yv = kAhead ? y_cur[nt] : act_q_lane(yq, kb, j, nt, lane, ncol_tiles);
                    const int b[2] = {yv.x, yv.y};  // B: column g of the tile
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        int cj[4] = {0, 0, 0, 0};
                        mma_s8(cj, a[r], b);
                        cs[r][nt][0] += sc0[r] * cj[0];
                        cs[r][nt][1] += sc0[r] * cj[1];
                        cs[r][nt][2] += sc1[r] * cj[2];
                        cs[r][nt][3] += sc1[r] * cj[3];
                    }
                }
                if constexpr (kAhead) {
#pragma unroll
                    for (int nt = 0; nt < ncol_tiles; ++nt) y_cur[nt] = y_next[nt];
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float2 dm0 = __half22float2(*reinterpret_cast<const half2 *>(&h0[r].x));
            const float2 dm1 = __half22float2(*reinterpret_cast<const half2 *>(&h1[r].x));
            uint32_t a_min[4] = {0u, 0u, 0u, 0u};  // rows g and g + 8, sub-blocks 2t and 2t + 1
            if constexpr (kMinsMma) {
                a_min[0] = mins_half2(h0[r].z, h0[r].w, t);
                a_min[1] = mins_half2(h1[r].z, h1[r].w, t);
            }
#pragma unroll
            for (int nt = 0; nt < ncol_tiles; ++nt) {
                // C: (row0, col0), (row0, col0 + 1), (row1, col0), (row1, col0 + 1), col0 = 8 nt + 2t
                const int col0 = nt * 8 + 2 * t;
                float m00, m01, m10, m11;
                if constexpr (kMinsMma) {
                    const int * s_g = ysum + act_sum_index(kb, nt * 8 + g, ncol_tiles);  // column g's 8 sums
                    const int2 sv = *reinterpret_cast<const int2 *>(s_g + 2 * t);
                    const uint32_t b[2] = {half2_bits((float)sv.x, (float)sv.y), 0u};
                    float mc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    mma_f16(mc, a_min, b);
                    m00 = mc[0], m01 = mc[1], m10 = mc[2], m11 = mc[3];
                } else {
                    const int * s_a = ysum + act_sum_index(kb, col0, ncol_tiles);
                    const int * s_b = s_a + 8;
                    int i00 = 0, i01 = 0, i10 = 0, i11 = 0;
#pragma unroll
                    for (int j = 0; j < 8; ++j) {
                        const int mn0 = byte_at(min_word(h0[r].z, h0[r].w, j >> 2), j & 3);
                        const int mn1 = byte_at(min_word(h1[r].z, h1[r].w, j >> 2), j & 3);
                        i00 += mn0 * s_a[j];
                        i01 += mn0 * s_b[j];
                        i10 += mn1 * s_a[j];
                        i11 += mn1 * s_b[j];
                    }
                    m00 = (float)i00, m01 = (float)i01, m10 = (float)i10, m11 = (float)i11;
                }
                const float2 dy = *reinterpret_cast<const float2 *>(yd + act_d_index(kb, col0, ncol_tiles));
                acc[r][nt][0] += dy.x * (dm0.x * (float)cs[r][nt][0] - dm0.y * m00);
                acc[r][nt][1] += dy.y * (dm0.x * (float)cs[r][nt][1] - dm0.y * m01);
                acc[r][nt][2] += dy.x * (dm1.x * (float)cs[r][nt][2] - dm1.y * m10);
                acc[r][nt][3] += dy.y * (dm1.x * (float)cs[r][nt][3] - dm1.y * m11);
            }
        }
    }
};
using Q4K = Q4KT<false>;
using Q4KMinsMma = Q4KT<true>;
using Q5K = Q4KT<false, true>;
using Q5KMinsMma = Q4KT<true, true>;

// ---- Q8_0: eight 34-byte blocks (half d, 32 int8) to a super-block, 272 bytes -------------------
// One m16n8k32 mma per block and 8 columns, straight from the int8 quants (thread t: bytes 4t..4t+3
// and 16+4t..16+4t+3 of each block, the PTX layout); each block's int32 sums scaled by its d.
struct Q80 : AlignedBlocks<8 * 34> {
    static constexpr bool kNeedsSums = false;
    static constexpr ActLayout kLayout = ActLayout::kHalves;
    // One activation scale per 32 values, like ggml's q8_1: with one per 256 (the K-quants' q8_K
    // rule) the trained pair's q8_0 target accepted 4.54 drafts a step instead of 5.08 (session 11).
    static constexpr int kActBlock = 32;
    static constexpr int kMinBlocks16 = 6;

    template <int ncol_tiles, bool smem, int R>
    static __device__ __forceinline__ void accumulate(float (&acc)[R][ncol_tiles][4], const char * const (&b0)[R],
                                                      const char * const (&b1)[R], const int8_t * yq, const float * yd,
                                                      const int *, int kb, int g, int t) {
        const int lane = 4 * g + t;
        // (not Smem4Align2: the word after a super-block's last quants may lie outside the stage)
        auto load4 = [](const char * p) { return smem ? load_smem_4_align2(p) : load_stream_4_align2(p); };
        auto load_d = [](const char * p) {
            const unsigned short h =
                smem ? *reinterpret_cast<const unsigned short *>(p) : (unsigned short)load_stream_2(p);
            return __half2float(__ushort_as_half(h));
        };
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            int a[R][4];
            float d0[R], d1[R];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const char * r0 = b0[r] + 34 * j;
                const char * r1 = b1[r] + 34 * j;
                a[r][0] = (int)load4(r0 + 2 + 4 * t);
                a[r][1] = (int)load4(r1 + 2 + 4 * t);
                a[r][2] = (int)load4(r0 + 18 + 4 * t);
                a[r][3] = (int)load4(r1 + 18 + 4 * t);
                d0[r] = load_d(r0);
                d1[r] = load_d(r1);
            }
#pragma unroll
            for (int nt = 0; nt < ncol_tiles; ++nt) {
                const int2 yv = act_q_lane(yq, kb, j, nt, lane, ncol_tiles);  // column g: 4t.., 16 + 4t..
                const int b[2] = {yv.x, yv.y};
                // the scales of this block's values of columns 2t and 2t + 1
                const float2 dy =
                    *reinterpret_cast<const float2 *>(yd + act_d_index(8 * kb + j, nt * 8 + 2 * t, ncol_tiles));
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    int cj[4] = {0, 0, 0, 0};
                    mma_s8(cj, a[r], b);
                    acc[r][nt][0] += (d0[r] * dy.x) * (float)cj[0];
                    acc[r][nt][1] += (d0[r] * dy.y) * (float)cj[1];
                    acc[r][nt][2] += (d1[r] * dy.x) * (float)cj[2];
                    acc[r][nt][3] += (d1[r] * dy.y) * (float)cj[3];
                }
            }
        }
    }
};

// ---- Q6_K: ql[128] (low 4 bits), qh[64] (high 2 bits), 16 int8 scales, d (half) ---------------
// Value 16s + i of a super-block has scale s. In group s = 8n + 2q + u, thread t holds values
// l = 16u + 4t..4t+3 of quarter q of half n: low (q < 2) or high nibbles of ql[64n + 32(q & 1) + l],
// bits 2q..2q+1 of qh[32n + l].
struct Q6KRow {
    uint32_t ql[2][2][2];  // [n][q & 1][u]
    uint32_t qh[2][2];     // [n][u]
    uint32_t sc[4];        // the 16 scales
    float d;
};

// kFunnel (shared memory only): the words as funnel shifts of aligned ones (Smem4Align2), else a
// test a word (load_smem_4_align2). The funnel shifts keep more words live: the mma.sync GEMM at 64
// columns spilled 44 bytes with them (22 local loads and stores in its loop, sm_90a; 32 bytes at 48
// with a residual), and on the H100 took 1372 against 1107 us for the 27B's 32 launches at 64
// (session 45), so above 32 columns it keeps a test a word.
template <bool smem, bool kFunnel = smem>
__device__ __forceinline__ Q6KRow load_q6_k_row(const char * blk, int t) {
    // 4 bytes at off of the block (2-byte aligned): one alignment test a block in shared memory
    const Smem4Align2 words(blk);
    auto load4 = [&](int off) {
        if constexpr (smem && kFunnel) return words(off);
        if constexpr (smem) return load_smem_4_align2(blk + off);
        return load_stream_4_align2(blk + off);
    };
    Q6KRow r;
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            r.ql[n][0][u] = load4(64 * n + 16 * u + 4 * t);
            r.ql[n][1][u] = load4(64 * n + 32 + 16 * u + 4 * t);
            r.qh[n][u] = load4(128 + 32 * n + 16 * u + 4 * t);
        }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) r.sc[i] = load4(192 + 4 * i);
    const unsigned short dh =
        smem ? *reinterpret_cast<const unsigned short *>(blk + 208) : (unsigned short)load_stream_2(blk + 208);
    r.d = __half2float(__ushort_as_half(dh));
    return r;
}

// The most column tiles (times row tiles) of the mma.sync Q6_K GEMM whose rows load_q6_k_row reads
// with funnel shifts (below: a test a word).
constexpr int kQ6kFunnelMaxTiles = 4;

// The int8 operand (q - 32) of group s = 8n + 2q + u.
__device__ __forceinline__ int q6_k_operand(const Q6KRow & r, int n, int q, int u) {
    const uint32_t lo = (r.ql[n][q & 1][u] >> (4 * (q >> 1))) & 0x0F0F0F0F;
    const uint32_t hi = ((r.qh[n][u] >> (2 * q)) & 0x03030303) << 4;
    // bytes in 0..63: minus 32 per byte without borrows across bytes
    return (int)((((lo | hi) | 0x80808080u) - 0x20202020u) ^ 0x80808080u);
}

__device__ __forceinline__ int q6_k_scale(const Q6KRow & r, int s) {
    return (int)(int8_t)(r.sc[s >> 2] >> (8 * (s & 3)));
}

struct Q6K {
    static constexpr int kBytes = 210;
    static constexpr int kChunks = 14;  // a 2-byte aligned 210-byte block lies in 14 aligned 16-byte chunks
    static constexpr int kStageRow = 16 * kChunks;
    static constexpr bool kRowsAligned = false;  // its aligned chunks shift with kb
    static constexpr bool kNeedsSums = false;
    static constexpr ActLayout kLayout = ActLayout::kHalves;
    static constexpr int kActBlock = kQk;
    static constexpr int kMinBlocks16 = 4;

    static __device__ __forceinline__ const char * row_block(const char * w, int row, int64_t row_bytes, int kb) {
        return w + (int64_t)row * row_bytes + (int64_t)kb * kBytes;
    }
    static __device__ __forceinline__ const char * aligned_start(const char * blk) { return align16_down(blk); }
    static __device__ __forceinline__ int stage_offset(const char * blk) { return offset_in16(blk); }

    template <int ncol_tiles, bool smem, int R>
    static __device__ __forceinline__ void accumulate(float (&acc)[R][ncol_tiles][4], const char * const (&b0)[R],
                                                      const char * const (&b1)[R], const int8_t * yq, const float * yd,
                                                      const int *, int kb, int g, int t) {
        const int lane = 4 * g + t;
        Q6KRow r0[R], r1[R];
        constexpr bool kFunnel = smem && R * ncol_tiles <= kQ6kFunnelMaxTiles;  // registers (load_q6_k_row)
#pragma unroll
        for (int r = 0; r < R; ++r) {
            r0[r] = load_q6_k_row<smem, kFunnel>(b0[r], t);
            r1[r] = load_q6_k_row<smem, kFunnel>(b1[r], t);
        }
        int cs[R][ncol_tiles][4] = {};
#pragma unroll
        for (int j = 0; j < 8; ++j) {  // sub-block j: the groups s = 2j (lane bytes 0..3), 2j + 1 (4..7)
            int2 yv[ncol_tiles];
#pragma unroll
            for (int nt = 0; nt < ncol_tiles; ++nt) yv[nt] = act_q_lane(yq, kb, j, nt, lane, ncol_tiles);
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                const int s = 2 * j + u, n = s >> 3, q = (s >> 1) & 3;
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const int a[2] = {q6_k_operand(r0[r], n, q, u), q6_k_operand(r1[r], n, q, u)};
                    const int sc0 = q6_k_scale(r0[r], s), sc1 = q6_k_scale(r1[r], s);
#pragma unroll
                    for (int nt = 0; nt < ncol_tiles; ++nt) {
                        int cj[4] = {0, 0, 0, 0};
                        mma_s8_k16(cj, a, u == 0 ? yv[nt].x : yv[nt].y);  // B: column g of the tile
                        cs[r][nt][0] += sc0 * cj[0];
                        cs[r][nt][1] += sc0 * cj[1];
                        cs[r][nt][2] += sc1 * cj[2];
                        cs[r][nt][3] += sc1 * cj[3];
                    }
                }
            }
        }
#pragma unroll
        for (int nt = 0; nt < ncol_tiles; ++nt) {
            const float2 dy = *reinterpret_cast<const float2 *>(yd + act_d_index(kb, nt * 8 + 2 * t, ncol_tiles));
#pragma unroll
            for (int r = 0; r < R; ++r) {
                acc[r][nt][0] += dy.x * r0[r].d * (float)cs[r][nt][0];
                acc[r][nt][1] += dy.y * r0[r].d * (float)cs[r][nt][1];
                acc[r][nt][2] += dy.x * r1[r].d * (float)cs[r][nt][2];
                acc[r][nt][3] += dy.y * r1[r].d * (float)cs[r][nt][3];
            }
        }
    }
};

// One super-block (kb) of `tile_rows` rows from row_base into a warp's stage: tile_rows x kChunks
// 16-byte copies, consecutive lanes on consecutive chunks of a row. (Each lane on one row, its
// copies from one address, took ~20% fewer instructions in the 16-column Q4_K kernel but was
// slower on the H200 for every type and column count, e.g. Q6_K ffn_down at 8 columns 39.7 against
// 37.1 us: session 23, bench/results/h200-s23-mma-standalone-y1-22bf5bb.json.)
template <typename F>
__device__ __forceinline__ void stage_in(char * stage, const char * __restrict__ w, int row_base, int tile_rows,
                                         int nrows, int64_t row_bytes, int kb, int lane) {
    for (int c = lane; c < tile_rows * F::kChunks; c += WARP_SIZE) {
        const int r = c / F::kChunks, j = c - r * F::kChunks;
        const char * blk = F::row_block(w, min(row_base + r, nrows - 1), row_bytes, kb);
        cp_async_16(stage + r * F::kStageRow + 16 * j, F::aligned_start(blk) + 16 * j);
    }
}

// stage_in for F of 16-byte aligned super-blocks (kRowsAligned) with each lane's copies addressed
// once: copy i is chunk c = lane + 32 i of the tile (its row c / kChunks, chunk c % kChunks; stage
// byte 16 c), off[i] its byte offset from the tile's first row (rows past the matrix clamped to
// its last), so a super-block costs one 64-bit base and an add a copy. stage_in's division and
// 64-bit row product a copy: ~80 of the ~910 instructions a thread spends on a super-block in the
// 32-column, two-row-tile Q4_K kernel (sm_90a SASS; ~100 of ~470 at 16 columns, where the H200
// still ran stage_in faster). The wgmma form's staging gained the same way (session 19).
template <typename F, int kTileRows>
struct StagePlan {
    static constexpr int kTotal = kTileRows * F::kChunks;
    static constexpr int kCopies = (kTotal + WARP_SIZE - 1) / WARP_SIZE;
    int off[kCopies];

    __device__ __forceinline__ StagePlan(int row_base, int nrows, int64_t row_bytes, int lane) {
#pragma unroll
        for (int i = 0; i < kCopies; ++i) {
            const int c = min(lane + WARP_SIZE * i, kTotal - 1), r = c / F::kChunks, j = c - r * F::kChunks;
            off[i] = (int)((int64_t)(min(row_base + r, nrows - 1) - row_base) * row_bytes) + 16 * j;
        }
    }

    __device__ __forceinline__ void stage(char * stage, const char * __restrict__ w, int row_base, int64_t row_bytes,
                                          int kb, int lane) const {
        const char * base = w + (int64_t)row_base * row_bytes + (int64_t)kb * F::kBytes;
#pragma unroll
        for (int i = 0; i < kCopies; ++i) {
            const int c = lane + WARP_SIZE * i;
            if (kTotal % WARP_SIZE == 0 || c < kTotal) cp_async_16(stage + 16 * c, base + off[i]);
        }
    }
};

// R: 16-row tiles per warp (the B operand of each activation load feeds R mmas). kActSmem: after
// the warps' stages, kStages stages of a super-block's activations for the whole block (the
// kernel's kActSmem form).
template <typename F, int ncol_tiles, int kStages, int W, int R = 1, bool kActSmem = false>
struct Smem {
    static constexpr int kStageBytes = R * kRows * F::kStageRow;
    static constexpr int kPipeline = W * (kStages > 0 ? kStages : 0) * kStageBytes;
    static constexpr int kActStage = kActSmem ? 8 * ncol_tiles * WARP_SIZE * 8 : 0;  // a super-block's int8 tiles
    static constexpr int kActBytes = (kStages > 0 ? kStages : 0) * kActStage;
    static constexpr int kScratch = W * R * ncol_tiles * 4 * WARP_SIZE * (int)sizeof(float);
    static constexpr int kBytes = kPipeline + kActBytes > kScratch ? kPipeline + kActBytes : kScratch;
};

constexpr int kMaxStaticSmem = 48 * 1024;  // a kernel's static shared memory, on every arch
// A kDynSmem kernel's pipeline (dynamic shared memory, opted in): two such blocks a Hopper or
// A100 multiprocessor; one on the RTX 30x0 / 40x0 (100 KB).
constexpr int kMaxDynamicSmem = 96 * 1024;

// The most stages up to `stages` whose pipeline of W warps of R row tiles fits the static shared
// memory (with 4 warps Q8_0's 272-byte super-blocks fit 2, the others 3; with 8 Q4_K's and Q5_K's
// fit 2; with 2 row tiles Q4_K's fit 2 stages of 4 warps, Q6_K's of 2), or kMaxDynamicSmem.
template <typename F, int W = kWarps, int R = 1, bool kDynSmem = false>
constexpr int fit_stages(int stages) {
    while (stages > 1 && W * stages * R * kRows * F::kStageRow > (kDynSmem ? kMaxDynamicSmem : kMaxStaticSmem)) {
        --stages;
    }
    return stages;
}

// Warps per block: 4, or 8 for long rows (kLongRowBlocks super-blocks or more: ffn_down's 68,
// ssm_out's and attn_output's 24 in the 27B) of up to 16 columns, whose few 16-row blocks leave
// most warp slots of the GPU empty (the 27B's ffn_down: 320 blocks).
constexpr int kLongRowBlocks = 24;

// Blocks a multiprocessor should hold (__launch_bounds__'s minimum): up to 16 columns F's
// kMinBlocks16 (Q4_K-like 6, a register budget of 80: 24 warps; Q6_K 4: at 80 registers its
// ffn_down took 46.6 us at 16 columns against 40.1 with the compiler's 137, h200-s9-mma-standalone-*),
// 24..32 columns 4, more 3 (more column tiles need more accumulators). R row tiles hold R times
// the accumulators: 4 / 3 / 2 blocks of 4 warps (128 / 168 / 255 registers). 8 warps up to 16
// columns (long rows): 3 blocks (24 warps, 85 registers), so the 27B's 320 row tiles of ffn_down
// fit one wave of 132 multiprocessors (Q6_K's 4 a multiprocessor at 4 warps would give 2).
template <typename F, int W = kWarps, int R = 1>
constexpr int min_blocks(int ncol_tiles) {
    if (W == 8 && R == 1 && ncol_tiles <= 2) return 3;
    const int m = R > 1 ? (ncol_tiles <= 2   ? 4
                           : ncol_tiles <= 4 ? 3
                                             : 2)
                        : (ncol_tiles <= 2   ? F::kMinBlocks16
                           : ncol_tiles <= 4 ? 4
                                             : 3);  // for 4 warps
    return m * kWarps / W > 0 ? m * kWarps / W : 1;
}

// Split along K (kPieces kernels): block b runs piece b % pieces (consecutive super-blocks) of its
// row tile b / pieces - with kSplitK the block's warps take the piece's super-blocks in turn and add
// their sums in warp order, without it each warp runs all of them for rows of its own (the warps
// read the same activations at about the same time, from L1) - writes its sums to `partials`, and
// the tile's last piece to arrive (its counter) adds the pieces' sums in piece order and writes
// them: the same bits for any arrival order, no second launch. For grids of under
// a wave (the 27B's 320 row tiles of ffn_down at 32 columns are 0.61 of one: ~10 warps a
// multiprocessor, ncu on the H100, session 33). Zero at load; the last piece puts its counter back
// to 0 (launches on one stream are ordered; under PDL a kernel reaches them after its pdl_wait).
constexpr int kMmaMaxSplitTiles = 4096;
static __device__ unsigned int mma_tile_arrivals[kMmaMaxSplitTiles];

// Floats of partial sums a split of `rows` rows into `pieces` needs for blocks of W warps of R
// 16-row tiles (their warps splitting K, or each on rows of its own) and ncol_tiles column tiles.
inline size_t mma_split_floats(int rows, int pieces, int W, bool split_k, int R, int ncol_tiles) {
    const int tile_rows = 16 * R * (split_k ? 1 : W), tiles = (rows + tile_rows - 1) / tile_rows;
    return pieces > 1 ? (size_t)tiles * pieces * (split_k ? 1 : W) * R * ncol_tiles * 4 * WARP_SIZE : 0;
}

// ncol_tiles tiles of 8 columns; the activation buffers hold 8 * ncol_tiles columns (zeros past
// ncols), tiled (act_q_index). kOccupancy: pass min_blocks to __launch_bounds__ (else the
// compiler's register choice). kSplitK: the block's warps split the super-blocks of one row
// tile group (the engine's); else each warp owns a row tile group of its own and all its
// super-blocks (no shared-memory reduction; an experiment for short rows, timed by the
// standalone). R: 16-row tiles per warp, rows row_base + 16 r + g and + 8.
// kRes: res (stride_col_res floats a column) is added to each output as it is written (a fused
// residual add); a template parameter so that the kernels without it keep their code (a run-time
// branch made the 64-column Q6_K kernel spill 48 bytes, 22% slower on the H200, session 17).
// kDynSmem: the stages in dynamic shared memory (up to kMaxDynamicSmem; Q6_K's 2 stages of 8 warps
// take 56 KB, over the 48 KB of static shared memory). kPieces: `pieces` blocks a row tile along K
// (above; a template parameter so that the kernels without it keep their code).
// kActSmem (warps on rows of their own, kDynSmem): the block stages each super-block's activations
// in shared memory once, with cp.async beside the weights, and its warps read them there (a block
// barrier a super-block): one L2 read of the activations a block, where the warps' own loads meet
// in L1 only when the warps run in step. At 64 columns a super-block's activations are 16 KB
// against 2.3 KB of Q4_K weights a 16-row tile. On the H100 (session 34, standalone) faster than
// the split without it, slower than the unsplit kernel at every shape (gemm_kquant_mma.cu).
// kTma (sm_90; F's rows aligned, static shared memory): each warp's stages filled by one 2D bulk
// tensor copy a super-block from lane 0 (tma_copy.cuh: `tma` boxes the weights as kTileRows rows x
// F::kBytes), each stage completing on an mbarrier of its own, instead of the lanes' cp.asyncs.
template <typename F, int ncol_tiles, int kStages, bool kOccupancy, int W, bool kSplitK = true, int R = 1,
          bool kRes = false, bool kDynSmem = false, bool kPieces = false, bool kActSmem = false, bool kTma = false>
__global__ void __launch_bounds__(W * WARP_SIZE, kOccupancy ? min_blocks<F, W, R>(ncol_tiles) : 1)
    gemm_kquant_mma_kernel(const char * __restrict__ w, const int8_t * yq, const float * yd, const int * ysum,
                           float * dst, const int nrows, const int nblocks, const int64_t row_bytes, const int ncols,
                           const int stride_col_dst, const float * res, const int stride_col_res, const int pieces_arg,
                           float * partials, const DFLASH_GRID_CONSTANT TmaRows tma) {
    const int pieces = kPieces ? pieces_arg : 1;
    static_assert(!kActSmem || (!kSplitK && kDynSmem && kStages > 0),
                  "staged activations: warps on rows of their own, a pipeline in dynamic shared memory");
    using S = Smem<F, ncol_tiles, kStages, W, R, kActSmem>;
    static_assert(S::kBytes <= (kDynSmem ? kMaxDynamicSmem : kMaxStaticSmem), "shared memory over budget: fit_stages");
    static_assert(kStages != 1, "a pipeline needs 2 stages (0: direct loads)");
    static_assert(!kTma || (F::kRowsAligned && kStages > 0 && !kDynSmem && !kActSmem && S::kStageBytes % 128 == 0),
                  "bulk tensor copies: whole aligned super-blocks into 128-byte aligned static stages");
    constexpr int kTileRows = R * kRows;
    char * smem;
    if constexpr (kDynSmem) {
        DFLASH_DYNAMIC_SMEM_BYTES(dyn_smem);
        smem = dyn_smem;
    } else {
        __shared__ __align__(kTma ? 128 : 16) char static_smem[S::kBytes];
        smem = static_smem;
    }
    const int lane = threadIdx.x, warp = threadIdx.y;
    const int g = lane >> 2, t = lane & 3;
    const int tile = kPieces ? blockIdx.x / pieces : blockIdx.x, piece = kPieces ? blockIdx.x % pieces : 0;
    const int row_base = (kSplitK ? tile : tile * W + warp) * kTileRows;
    // a warp past the last tile (no block barrier in this mode but the pieces' count; with kActSmem
    // it runs the block's super-blocks on clamped rows and writes nothing: it stages and meets the
    // barriers)
    if (!kSplitK && !kPieces && !kActSmem && row_base >= nrows) return;
    // this warp's super-blocks kb0, kb0 + kb_step, ... before kb_end (its piece's)
    const int kb_end =
        kSplitK || kActSmem || row_base < nrows ? (kPieces ? (piece + 1) * nblocks / pieces : nblocks) : 0;
    const int kb0 = (kPieces ? piece * nblocks / pieces : 0) + (kSplitK ? warp : 0), kb_step = kSplitK ? W : 1;
    const int n_it = kb0 < kb_end ? (kb_end - kb0 + kb_step - 1) / kb_step : 0;
    char * stages = smem + warp * (kStages > 0 ? kStages : 0) * S::kStageBytes;
    // kTma: stage s of this warp completes on full[s] (lane 0 arms it with the box's bytes), round r
    // of the stage on parity r & 1
    __shared__ uint64_t tma_full[kTma ? W * kStages : 1];
    uint64_t * full = tma_full + (kTma ? warp * kStages : 0);
    if constexpr (kTma) {
        if (lane == 0) {
            for (int s = 0; s < kStages; ++s) mbar_init(full + s, 1);
            mbar_init_fence();
        }
        __syncwarp();
    }

    float acc[R][ncol_tiles][4] = {};
    // super-block kb of the tile's rows into stage buffer `buf`: StagePlan where rows are aligned,
    // above 16 columns (on the H200 the 27B's Q4_K GEMMs a forward of 32 / 64 tokens 6.43 / 3.84 ms
    // against 6.64 / 4.03 with stage_in, of 16 tokens 3.74 + 1.43 against 3.66 + 1.40: session 23).
    // Up to 16 columns the staging is ~100-135 of the ~400 instructions a warp issues a super-block
    // (sm_90a SASS of the 16-column Q4_K kernel, session 54: 4.5 copies a lane, each with its row's
    // division and 64-bit product, the remainder diverging the warp), and two cheaper forms were
    // compiled and dropped untimed: StagePlan there recomputes its 64-bit base a copy at 80
    // registers (~24 instructions a copy, 4 words spilled: no shorter), and a bulk copy a row
    // (cp.async.bulk on an mbarrier a stage) issues as one round a lane, its operands being
    // warp-uniform (576 instructions a loop against 474). kTma's 2D bulk tensor copy (a box of
    // kTileRows rows x kBytes from a tensor map encoded a launch) is one instruction a super-block:
    // 330 instructions a loop (session 55).
    const StagePlan<F, kTileRows> plan(row_base, nrows, row_bytes, lane);
    // super-block kb into stage slot
    auto stage_kb = [&](int slot, int kb) {
        char * buf = stages + slot * S::kStageBytes;
        if constexpr (kTma) {
            if (lane == 0) {
                mbar_arrive_expect_tx(full + slot, kTileRows * F::kBytes);
                tma_load_rows(buf, tma, kb * F::kBytes, row_base, full + slot);
            }
        } else if constexpr (F::kRowsAligned && ncol_tiles > 2) {
            plan.stage(buf, w, row_base, row_bytes, kb, lane);
        } else {
            stage_in<F>(buf, w, row_base, kTileRows, nrows, row_bytes, kb, lane);
        }
    };
    if constexpr (kStages > 0) {
#pragma unroll
        for (int s = 0; s < kStages - 1; ++s) {
            if (s < n_it) stage_kb(s, kb0 + s * kb_step);
            if constexpr (!kTma) cp_async_commit();
        }
    }
    pdl_wait();  // the first weights are on their way; the activations are the kernel before's (pdl.cuh)
    pdl_trigger();
    // kActSmem: super-block kb's activation tiles (S::kActStage contiguous bytes of yq) into stage s
    char * act_stages = smem + S::kPipeline;
    auto stage_act = [&](int s, int kb) {
        const char * src = reinterpret_cast<const char *>(yq) + (int64_t)kb * S::kActStage;
        for (int c = warp * WARP_SIZE + lane; c < S::kActStage / 16; c += W * WARP_SIZE) {
            cp_async_16(act_stages + s * S::kActStage + 16 * c, src + 16 * c);
        }
    };
    if constexpr (kActSmem) {
#pragma unroll
        for (int s = 0; s < kStages - 1; ++s) {
            if (s < n_it) stage_act(s, kb0 + s * kb_step);
        }
        cp_async_commit();
    }
    for (int it = 0; it < n_it; ++it) {
        const int kb = kb0 + it * kb_step;
        const char * blk0[R];
        const char * blk1[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            blk0[r] = F::row_block(w, min(row_base + 16 * r + g, nrows - 1), row_bytes, kb);
            blk1[r] = F::row_block(w, min(row_base + 16 * r + g + 8, nrows - 1), row_bytes, kb);
        }
        if constexpr (kStages > 0) {
            // super-block it has landed (this thread's copies; kActSmem: every copy in flight, its
            // first activations having come in a group of their own; kTma: the stage's barrier)
            if constexpr (kTma) {
                mbar_wait_parity(full + it % kStages, (unsigned)(it / kStages) & 1u);
            } else {
                cp_async_wait<kActSmem ? 0 : kStages - 2>();
            }
            if constexpr (kActSmem) {
                __syncthreads();  // every thread's copies, and every warp done with the previous stage
            } else if constexpr (!kTma) {
                __syncwarp();  // ... and every lane's
            }
            const int nx = it + kStages - 1;  // refill the stage consumed in the previous iteration
            if (nx < n_it) {
                stage_kb(nx % kStages, kb0 + nx * kb_step);
                if constexpr (kActSmem) stage_act(nx % kStages, kb0 + nx * kb_step);
            }
            if constexpr (!kTma) cp_async_commit();
            const char * buf = stages + (it % kStages) * S::kStageBytes;
            const char * s0[R];
            const char * s1[R];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                s0[r] = buf + (16 * r + g) * F::kStageRow + F::stage_offset(blk0[r]);
                s1[r] = buf + (16 * r + g + 8) * F::kStageRow + F::stage_offset(blk1[r]);
            }
            // kActSmem: the stage's tiles at the offsets the accumulation computes for super-block kb
            const int8_t * y = kActSmem ? reinterpret_cast<const int8_t *>(act_stages + (it % kStages) * S::kActStage) -
                                              (int64_t)kb * S::kActStage
                                        : yq;
            F::template accumulate<ncol_tiles, true, R>(acc, s0, s1, y, yd, ysum, kb, g, t);
            __syncwarp();  // every lane is done with this stage before it is refilled
        } else {
            F::template accumulate<ncol_tiles, false, R>(acc, blk0, blk1, yq, yd, ysum, kb, g, t);
        }
    }
    if constexpr (kStages > 0 && !kTma) cp_async_wait<0>();
    // C fragment of tile r: (row0, col0), (row0, col0 + 1), (row1, col0), (row1, col0 + 1),
    // row0 = row_base + 16 r + g, row1 = row0 + 8, col0 = 8 nt + 2t.
    // The sums' values: kValues a warp (kSplitK: a block) of the tile's; `partials` holds each
    // piece's, the values of slot (kSplitK: 0; else the warp) after those of the slots before.
    constexpr int kValues = R * ncol_tiles * 4;
    // value v's place in the C fragments
    auto place = [&](int v) {
        const int r = v / (ncol_tiles * 4), nt = (v / 4) % ncol_tiles, i = v % 4;
        return make_int2(row_base + 16 * r + g + (i < 2 ? 0 : 8), nt * 8 + 2 * t + (i & 1));
    };
    if constexpr (!kSplitK && !kPieces) {  // the warp's own rows
        write_outputs<kValues, kRes>(
            place, [&](int v) { return acc[v / (ncol_tiles * 4)][(v / 4) % ncol_tiles][v % 4]; }, dst, stride_col_dst,
            res, stride_col_res, nrows, ncols);
        return;
    }
    constexpr int kSlots = kSplitK ? 1 : W;
    auto piece_sum = [&](int p, int v) -> float * {
        const int slot = kSplitK ? 0 : warp;
        return partials + ((((int64_t)tile * pieces + p) * kSlots + slot) * kValues + v) * WARP_SIZE + lane;
    };
    // With kSplitK warp q writes the values q, q + W, ...: kPerWarp of them (INT_MAX rows past kValues)
    constexpr int kPerWarp = (kValues + W - 1) / W;
    auto warp_place = [&](int e) {
        const int v = warp + W * e;
        return v < kValues ? place(v) : make_int2(INT_MAX, 0);
    };
    if constexpr (!kSplitK) {  // the warp's own rows, a piece of their super-blocks
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
            for (int nt = 0; nt < ncol_tiles; ++nt) {
#pragma unroll
                for (int i = 0; i < 4; ++i) *piece_sum(piece, (r * ncol_tiles + nt) * 4 + i) = acc[r][nt][i];
            }
        }
    } else {
        __syncthreads();  // the stages become the scratch for the warps' sums
        // The warps' partial sums added in warp order (the same order for any grid), then written.
        float * part = reinterpret_cast<float *>(smem);  // [W][R][ncol_tiles][4][WARP_SIZE]
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
            for (int nt = 0; nt < ncol_tiles; ++nt) {
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    part[(((warp * R + r) * ncol_tiles + nt) * 4 + i) * WARP_SIZE + lane] = acc[r][nt][i];
            }
        }
        __syncthreads();
        // Warp q writes the sums of the values q, q + W, ... (the adds in warp order for each).
        float sums[kPerWarp];
#pragma unroll
        for (int e = 0; e < kPerWarp; ++e) {
            const int v = warp + W * e;
            if (v >= kValues) break;
            float sum = part[v * WARP_SIZE + lane];
#pragma unroll
            for (int p = 1; p < W; ++p) sum += part[(p * kValues + v) * WARP_SIZE + lane];
            sums[e] = sum;
            if constexpr (kPieces) *piece_sum(piece, v) = sum;
        }
        if constexpr (!kPieces) {
            write_outputs<kPerWarp, kRes>(
                warp_place, [&](int e) { return sums[e]; }, dst, stride_col_dst, res, stride_col_res, nrows, ncols);
            return;
        }
    }
    __threadfence();
    __syncthreads();  // every warp's sums written before the count
    const bool first_thread = lane == 0 && warp == 0;
    if (!__syncthreads_or(first_thread && atomicAdd(&mma_tile_arrivals[tile], 1u) == (unsigned)(pieces - 1))) return;
    __threadfence();
    // the tile's values: kSplitK, warp q those of q, q + W, ...; else each warp its own
    auto gathered = [&](int v) {
        float sum = __ldcg(piece_sum(0, v));
        for (int p = 1; p < pieces; ++p) sum += __ldcg(piece_sum(p, v));
        return sum;
    };
    if constexpr (kSplitK) {
        float sums[kPerWarp];
#pragma unroll
        for (int e = 0; e < kPerWarp; ++e) sums[e] = warp + W * e < kValues ? gathered(warp + W * e) : 0.0f;
        write_outputs<kPerWarp, kRes>(
            warp_place, [&](int e) { return sums[e]; }, dst, stride_col_dst, res, stride_col_res, nrows, ncols);
    } else {
        float sums[kValues];
#pragma unroll
        for (int v = 0; v < kValues; ++v) sums[v] = gathered(v);
        write_outputs<kValues, kRes>(
            place, [&](int v) { return sums[v]; }, dst, stride_col_dst, res, stride_col_res, nrows, ncols);
    }
    if (first_thread) mma_tile_arrivals[tile] = 0u;
}

// The head-norm scale (ActSource::head_w) of the head holding sub-block j of super-block kb, a
// block of 256 threads a super-block, thread 32 j + lane holding value lane of sub-block j: its
// warp's sum is ggml's (lane i, value i), the head's warps' sums meet through shared memory. Every
// thread of the block calls it (a barrier inside); padded columns (col >= ncols) sum zeros.
__device__ __forceinline__ float head_scale_one_a_thread(const ActSource & x, int col, int ncols, int kb, int j,
                                                         int lane) {
    __shared__ float warp_sums[kQk / WARP_SIZE];
    const float o = col < ncols ? x.up[(int64_t)col * x.sup + kb * kQk + 32 * j + lane] : 0.0f;
    const float s = warp_reduce_sum(o * o);
    if (lane == 0) warp_sums[j] = s;
    __syncthreads();
    const int per_head = x.head / WARP_SIZE, first = j / per_head * per_head;
    float w[kQk / WARP_SIZE];
    for (int m = 0; m < per_head; ++m) w[m] = warp_sums[first + m];
    return x.head_scale_from(w);
}

// The same where a warp holds super-block kb, sub-block j in lanes 4j..4j+3 (t = lane % 4): each
// lane sums values 8t..8t+7 of its sub-block (whatever its layout holds) in ggml's warp order
// (ActSource::sum_squares_of_quad), then the head's sub-blocks meet through shuffles (lanes 4 o
// apart for sub-blocks o apart: ActSource::head_scale_from's pairs).
__device__ __forceinline__ float head_scale_quad(const ActSource & x, int col, int ncols, int kb, int j, int t) {
    float o[8];
    const float * up = col < ncols ? x.up + (int64_t)col * x.sup + kb * kQk + 32 * j + 8 * t : nullptr;
    if (up && x.runs16) {  // two 16-byte loads
        const float4 a = reinterpret_cast<const float4 *>(up)[0], b = reinterpret_cast<const float4 *>(up)[1];
        o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
    } else {
#pragma unroll
        for (int m = 0; m < 8; ++m) o[m] = up ? up[m] : 0.0f;
    }
    float s = ActSource::sum_squares_of_quad(o);
    for (int off = x.head / 64; off >= 1; off >>= 1) s = s + __shfl_xor_sync(0xffffffff, s, 4 * off);
    return rsqrtf(s / x.head + x.head_eps);
}

// Which value of sub-block j a quantizer thread's value i is (see quantize_act_k_kernel): r % 32
// (V = 1), else those of lane 4j + t in layout L.
template <ActLayout L, int V>
__device__ __forceinline__ int quantized_value_index(int i, int t, int r) {
    if constexpr (V == 1) return r % WARP_SIZE;
    return L == ActLayout::kHalves ? (i < 4 ? 4 * t + i : 16 + 4 * t + i - 4) : 8 * t + i;
}

// A V = 8 thread's 8 bytes (lo: its values 0..3, hi: 4..7, in layout L's order) into layout M. Each
// half is 4 consecutive values starting at a multiple of 4, which every layout keeps as 4
// consecutive bytes (kRun, kHalves: bytes 4m.. of a lane's 8; kWgmma: a core matrix row's 4), so a
// half is one 4-byte store, and both one 8-byte store where M holds them side by side (M's own
// value order, not kWgmma's two core matrices), where a byte a value took 8 stores.
template <ActLayout L, ActLayout M>
__device__ __forceinline__ void store_lane_bytes(int8_t * __restrict__ qs, int kb, int j, int t, int col,
                                                 int ncol_tiles, uint32_t lo, uint32_t hi) {
    constexpr bool kSameOrder = (L == ActLayout::kHalves) == (M == ActLayout::kHalves);
    const int64_t i0 = act_q_index<M>(kb, j, quantized_value_index<L, 8>(0, t, 0), col, ncol_tiles);
    if constexpr (kSameOrder && M != ActLayout::kWgmma) {
        *reinterpret_cast<uint2 *>(qs + i0) = make_uint2(lo, hi);
    } else {
        const int64_t i4 = act_q_index<M>(kb, j, quantized_value_index<L, 8>(4, t, 0), col, ncol_tiles);
        *reinterpret_cast<uint32_t *>(qs + i0) = lo;
        *reinterpret_cast<uint32_t *>(qs + i4) = hi;
    }
}

// The V values v of a quantizer thread (super-block kb, sub-block j; see quantize_act_k_kernel)
// -> their int8 bytes (in layouts L and L2), the scale's d and the sub-block's int sum.
template <ActLayout L, int kBlock, int V, ActLayout L2>
__device__ __forceinline__ void quantize_values(const float (&v)[V], int kb, int j, int t, int r, int col,
                                                int ncol_tiles, int8_t * __restrict__ qs, float * __restrict__ d,
                                                int * __restrict__ sums, int8_t * __restrict__ qs2) {
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < V; ++i) amax = fmaxf(amax, fabsf(v[i]));
    // over the scale's values: a sub-block is 4 lanes (V = 8) or a warp (V = 1); a super-block is a
    // warp (V = 8) or the block's 8 warps (V = 1)
#pragma unroll
    for (int o = kBlock == WARP_SIZE && V == 8 ? 2 : 16; o > 0; o >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, o));
    }
    if constexpr (V == 1 && kBlock == kQk) {
        __shared__ float wmax[kQk / WARP_SIZE];
        if (r % WARP_SIZE == 0) wmax[r / WARP_SIZE] = amax;
        __syncthreads();
        amax = wmax[0];
#pragma unroll
        for (int w = 1; w < kQk / WARP_SIZE; ++w) amax = fmaxf(amax, wmax[w]);
    }
    const float dd = amax / 127.0f;
    int s = 0;
    uint32_t packed[2] = {0u, 0u};  // V = 8: the bytes of values 0..3 and 4..7
#pragma unroll
    for (int i = 0; i < V; ++i) {
        const int q = amax == 0.0f ? 0 : (int)roundf(v[i] / dd);
        if constexpr (V == 8) {
            packed[i / 4] |= (uint32_t)(uint8_t)(int8_t)q << (8 * (i % 4));
        } else {
            qs[act_q_index<L>(kb, j, quantized_value_index<L, V>(i, t, r), col, ncol_tiles)] = (int8_t)q;
            if constexpr (L2 != L)
                qs2[act_q_index<L2>(kb, j, quantized_value_index<L, V>(i, t, r), col, ncol_tiles)] = (int8_t)q;
        }
        s += q;
    }
    if constexpr (V == 8) {
        store_lane_bytes<L, L>(qs, kb, j, t, col, ncol_tiles, packed[0], packed[1]);
        if constexpr (L2 != L) store_lane_bytes<L, L2>(qs2, kb, j, t, col, ncol_tiles, packed[0], packed[1]);
    }
#pragma unroll
    for (int o = V == 8 ? 2 : 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);  // the sub-block's
    const bool first_of_sub = V == 8 ? t == 0 : r % WARP_SIZE == 0;
    if (first_of_sub) {
        // the wgmma forms': the f16 their float step's mma takes (act_sum_index)
        if constexpr (L == ActLayout::kWgmma) {
            reinterpret_cast<__half *>(sums)[act_sum_index(kb, col, ncol_tiles) + j] = __float2half_rn((float)s);
        } else {
            sums[act_sum_index(kb, col, ncol_tiles) + j] = s;
        }
    }
    if constexpr (kBlock == kQk) {
        if (r == 0) d[act_d_index(kb, col, ncol_tiles)] = dd;
    } else {
        // stored as ggml's q8_1 stores it (a half): the same quants and scales as its mmq
        if (first_of_sub) d[act_d_index(8 * kb + j, col, ncol_tiles)] = __half2float(__float2half_rn(dd));
    }
}

// Value vi of column col of the source x in form kSrc, 0 past ncols: scale is the column's RMSNorm
// scale (column_scale), head_scale the head norm's of the value's head (the forms that use them).
template <SrcForm kSrc>
__device__ __forceinline__ float source_value(const ActSource & x, int col, int ncols, int64_t vi, float scale,
                                              float head_scale) {
    if (col >= ncols) return 0.0f;
    if constexpr (kSrc == SrcForm::kHeadNorm) {
        return x.gated_head_normed(col, vi, head_scale);
    } else if constexpr (kSrc == SrcForm::kSigmoidGate) {
        return x.sigmoid_gated(col, vi);
    } else {
        return x(col, vi, scale);
    }
}

// A quantizer thread's V values of sub-block j of super-block kb, column col (quantized_value_index's
// in layout L; zeros past ncols): with V = 8, from a source other than a sigmoid gate, as two runs
// of 4 values with 16-byte loads where x.runs16 allows (the same floats); else a value a load.
template <ActLayout L, int V, SrcForm kSrc>
__device__ __forceinline__ void source_values(const ActSource & x, int col, int ncols, int kb, int j, int t, int r,
                                              float scale, float head_scale, float (&v)[V]) {
    if constexpr (V == 8 && kSrc != SrcForm::kSigmoidGate) {
        if (x.runs16) {  // the thread's two runs of 4 values
            const int64_t base = (int64_t)kb * kQk + 32 * j;
            if (col < ncols) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int64_t i = base + quantized_value_index<L, 8>(4 * h, t, r);
                    if constexpr (kSrc == SrcForm::kHeadNorm) {
                        x.gated_head_normed_run_of_4(col, i, head_scale, v + 4 * h);
                    } else {
                        x.run_of_4(col, i, scale, v + 4 * h);
                    }
                }
            } else {
#pragma unroll
                for (int i = 0; i < V; ++i) v[i] = 0.0f;
            }
            return;
        }
    }
#pragma unroll
    for (int i = 0; i < V; ++i) {
        const int64_t vi = kb * kQk + 32 * j + quantized_value_index<L, V>(i, t, r);
        v[i] = source_value<kSrc>(x, col, ncols, vi, scale, head_scale);
    }
}

// Activations for the kernels above: column j of the source x (act_source.cuh: floats, a
// SwiGLU's inputs, or an RMSNorm's input and weight) -> int8 qs in the tiled layout L of
// ncol_tiles column tiles, d = max |x| / 127 per kBlock (256 or 32) values and column, and the
// int8 sums per 32; columns ncols..8 ncol_tiles - 1 are zeros. Blocks of 256 threads, one column
// each (an RMSNorm source's column scale, column_scale, is summed once a block by all its threads,
// before any returns). V values a thread:
// - V = 8: a warp quantizes a super-block; lane l holds the 8 values of sub-block l / 4 that its
//   layout stores as one lane's 8 bytes (kRun, kWgmma: 8t..8t+7; kHalves: 4t..4t+3 and
//   16+4t..16+4t+3, t = l % 4), so every reduction is a warp's shuffles (no barrier, 8 loads in
//   flight a lane) and a block takes 8 super-blocks: the norm's scale is summed once per 8.
// - V = 1: a block quantizes a super-block, a value a thread (the scale's maximum through shared
//   memory): more blocks, which small column counts need.
// On the H200 (the 27B's forwards, bench/results/h200-s25-27b-kernels-*): V = 8 took the
// quantizers of a 64-token forward from 1.73 to 1.35 ms and a 32-token one from 1.04 to 1.00, but
// a 16-token one from 0.82 to 0.91 (48 blocks for 16 columns of 5120), so up to 16 columns V = 1
// until session 36, whose 16-byte loads (ActSource::runs16) and stores of a lane's bytes made V = 8
// the faster one at every column count (quantize_values_per_thread). The maximum and the integer
// sums do not depend on the order they are taken in: both give the same bytes.
// L2 != L: the same bytes also into qs2 in layout L2 (the scales and sums do not depend on the
// layout): one quantizer for two products of one source whose types want different layouts
// (rms_norm_fusion.cu's pairs). kSrc: what x holds (SrcForm): floats, a SwiGLU's inputs or an
// RMSNorm's (kPlain); a per-head RMSNorm's SwiGLU (kHeadNorm, x.head_w; rms_norm_fusion.cu), each
// value's head scale summed in rms_norm_f32's order first; a sigmoid gate (kSigmoidGate, x.gate;
// glu_fusion.cu).
template <ActLayout L, int kBlock, int V, ActLayout L2 = L, SrcForm kSrc = SrcForm::kPlain>
static __global__ void quantize_act_k_kernel(const ActSource x, int8_t * __restrict__ qs, float * __restrict__ d,
                                             int * __restrict__ sums, const int k, const int ncols,
                                             const int ncol_tiles, int8_t * __restrict__ qs2) {
    pdl_wait();  // launched with DFLASH_LAUNCH_PDL (pdl.cuh)
    pdl_trigger();
    static_assert(kBlock == kQk || kBlock == WARP_SIZE, "a scale per super-block or per 32 values");
    static_assert(V == 1 || V == 8, "a value a thread, or a super-block a warp");
    constexpr int kThreadsPerSuper = kQk / V;
    const int col = blockIdx.y, r = threadIdx.x % kThreadsPerSuper;
    const int kb = blockIdx.x * (kQk / kThreadsPerSuper) + threadIdx.x / kThreadsPerSuper;
    const float scale = col < ncols ? x.column_scale<kQk>(col, k) : 1.0f;  // col: the same for the block
    const int j = V == 8 ? r / 4 : r / WARP_SIZE, t = r % 4;               // sub-block j
    float head_scale = 1.0f;
    constexpr bool kHeadNorm = kSrc == SrcForm::kHeadNorm;
    if constexpr (kHeadNorm && V == 1) {  // before any return: a barrier (the block is one super-block)
        head_scale = head_scale_one_a_thread(x, col, ncols, kb, j, r % WARP_SIZE);
    }
    if (kb * kQk >= k) return;  // the same for a super-block's threads
    if constexpr (kHeadNorm && V == 8) head_scale = head_scale_quad(x, col, ncols, kb, j, t);
    float v[V];
    source_values<L, V, kSrc>(x, col, ncols, kb, j, t, r, scale, head_scale, v);
    quantize_values<L, kBlock, V, L2>(v, kb, j, t, r, col, ncol_tiles, qs, d, sums, qs2);
}

// The quantizer of an RMSNorm source (x.norm_w) with one block a column: the column's k floats come
// into shared memory in one round of 16-byte loads (every load in flight), its scale is summed
// there once (column_scale's order), then the block's 8 warps quantize its super-blocks w, w + 8,
// ... as quantize_act_k_kernel's V = 8 does: the same bytes. Why: the kernel above sums the scale
// again in each of its blocks, from L2 (a column's 20 KB read 20 times at 16 columns of the 27B's
// 5120, 3 times at 32..64), a chain of dependent loads before its first value; its norm-fused
// launches took ~6 us each in a 16-token forward (128 a forward, 0.8 of its 10.2 ms of kernels on
// the H100, bench/results/h100-s33-27b-kernels-fuse-pair-head-gate-512407f.json). The norm's weights
// are read before pdl_wait (they are no kernel's output). Columns of up to kNormColumnMax values.
// Measured slower (H100, session 34, bench/results/h100-s34-*): alone, 200 launches in a CUDA graph,
// 4.40 against 2.95 us a launch at 16 columns of 5120, 4.92 against 3.94 at 32, 5.02 against 4.89 at
// 64 (the redundant sums run in parallel from L2; one block a column runs its rounds in series); in
// the 27B's forwards 10.21 / 13.49 / 17.87 ms of kernels at 16 / 32 / 64 tokens against 10.23 /
// 13.37 / 17.94. Off: DFLASH_QUANT_NORM_COLUMN=1 starts it on.
constexpr int kNormColumnMax = 8192;                                        // 32 KB of shared memory
constexpr int kNormColumnLoads = kNormColumnMax / 4 / kQk;                  // 16-byte loads a thread, at most
constexpr int kNormColumnSuper = kNormColumnMax / kQk / (kQk / WARP_SIZE);  // super-blocks a warp, at most

template <ActLayout L, int kBlock, ActLayout L2 = L>
static __global__ void __launch_bounds__(kQk)
    quantize_act_norm_column_kernel(const ActSource x, int8_t * __restrict__ qs, float * __restrict__ d,
                                    int * __restrict__ sums, const int k, const int ncols, const int ncol_tiles,
                                    int8_t * __restrict__ qs2) {
    __shared__ __align__(16) float xs[kNormColumnMax];
    constexpr int kWarpsHere = kQk / WARP_SIZE;
    const int col = blockIdx.x, warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int j = lane / 4, t = lane % 4, nblocks = k / kQk;
    // a lane's 8 values: two runs of 4 (kHalves: 4t.. and 16+4t..; else 8t.. and 8t+4..), 16-byte aligned
    const int run0 = 32 * j + quantized_value_index<L, 8>(0, t, lane),
              run1 = 32 * j + quantized_value_index<L, 8>(4, t, lane);
    float4 w[kNormColumnSuper][2];
#pragma unroll
    for (int it = 0; it < kNormColumnSuper; ++it) {
        const int kb = warp + kWarpsHere * it;
        const float4 * nw = reinterpret_cast<const float4 *>(x.norm_w + kb * kQk);
        w[it][0] = kb < nblocks ? nw[run0 / 4] : float4{};
        w[it][1] = kb < nblocks ? nw[run1 / 4] : float4{};
    }
    pdl_wait();  // launched with DFLASH_LAUNCH_PDL (pdl.cuh)
    pdl_trigger();
    const bool live = col < ncols;  // the same for the block
    if (live) {
        const float4 * src = reinterpret_cast<const float4 *>(x.x + (int64_t)col * x.sx);
        float4 buf[kNormColumnLoads];
#pragma unroll
        for (int m = 0; m < kNormColumnLoads; ++m) {
            const int i = threadIdx.x + kQk * m;
            if (i < k / 4) buf[m] = src[i];
        }
#pragma unroll
        for (int m = 0; m < kNormColumnLoads; ++m) {
            const int i = threadIdx.x + kQk * m;
            if (i < k / 4) reinterpret_cast<float4 *>(xs)[i] = buf[m];
        }
    }
    __syncthreads();
    const float scale = live ? x.scale_of_column<kQk>(xs, k) : 1.0f;
#pragma unroll
    for (int it = 0; it < kNormColumnSuper; ++it) {
        const int kb = warp + kWarpsHere * it;
        if (kb >= nblocks) break;
        const float4 * xk = reinterpret_cast<const float4 *>(xs + kb * kQk);
        const float4 x0 = xk[run0 / 4], x1 = xk[run1 / 4];
        const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        const float wv[8] = {w[it][0].x, w[it][0].y, w[it][0].z, w[it][0].w,
                             w[it][1].x, w[it][1].y, w[it][1].z, w[it][1].w};
        float v[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = live ? scale * xv[i] * wv[i] : 0.0f;  // ActSource's (scale * x) * mul
        quantize_values<L, kBlock, 8, L2>(v, kb, j, t, lane, col, ncol_tiles, qs, d, sums, qs2);
    }
}

// Whether an RMSNorm source of k values takes quantize_act_norm_column_kernel: off (above) unless
// DFLASH_QUANT_NORM_COLUMN=1, for columns of up to kNormColumnMax values that 16-byte loads can read.
inline bool & quantize_norm_column_flag() {
    static bool on = [] {
        const char * e = std::getenv("DFLASH_QUANT_NORM_COLUMN");
        return e && e[0] == '1';
    }();
    return on;
}
inline bool quantize_norm_column(const ActSource & x, int k) {
    return quantize_norm_column_flag() && x.norm_w && !x.head_w && !x.gate && k % kQk == 0 && k <= kNormColumnMax &&
           reinterpret_cast<uintptr_t>(x.x) % 16 == 0 && reinterpret_cast<uintptr_t>(x.norm_w) % 16 == 0 &&
           x.sx % 4 == 0;
}

// The fewest padded columns whose quantizer takes 8 values a thread (quantize_act_k_kernel's V):
// 8, so every launch (padded columns are 8 or more), or DFLASH_QUANT_V8_FROM=16 / 24 (benches). A
// SwiGLU source of 17408 (the 27B's ffn_down input) alone on the H100 (session 34): V = 1 2.64 /
// 3.02 us a launch at 8 / 16 columns against 3.33 / 3.96 with V = 8, so V = 8 began at 24 columns;
// with the float4 loads of ActSource::runs16 (session 36) V = 8 took 2.47 / 2.72 us there, and the
// 27B's forwards of 8 / 16 tokens 8.90 / 10.08 ms of kernels against 9.36 / 10.12 from 24
// (bench/results/h100-s36-27b-kernels-quant-v8-from-*).
inline int & quantize_v8_from() {
    static int from = [] {
        const char * e = std::getenv("DFLASH_QUANT_V8_FROM");
        const int n = e ? std::atoi(e) : 8;
        return n == 16 || n == 24 ? n : 8;
    }();
    return from;
}

// Values a thread of the quantizer takes for np padded columns (see quantize_act_k_kernel).
inline int quantize_values_per_thread(int np) { return np >= quantize_v8_from() ? 8 : 1; }

// The quantizer's grid for k values, np padded columns and V values a thread.
inline dim3 quantize_act_grid(int k, int np, int V) {
    const int values_per_block = kQk * V;
    return dim3((unsigned)((k + values_per_block - 1) / values_per_block), (unsigned)np, 1);
}

// Whether a source's runs of 4 values load as float4s (ActSource::runs16; floats, a SwiGLU, an
// RMSNorm, a per-head RMSNorm's SwiGLU; not a sigmoid gate's blocks) in the quantizer of 8 values
// a thread (V = 8), which also stores a lane's bytes in one or two stores (store_lane_bytes). On
// the H100 (session 36, standalone `quant`, 200 launches in a CUDA graph): an RMSNorm source of
// 5120 in the wgmma layout 3.35 / 3.59 us a launch at 32 / 64 columns against 3.68 / 4.22 with a
// float a load, a SwiGLU of 17408 (Q6_K's layout) 3.24 / 4.34 against 4.76 / 5.86; the 27B's
// forwards of 32 / 64 tokens 13.03 / 17.42 ms of kernels against 13.17 / 17.51
// (bench/results/h100-s36-*). The same bytes either way (checked on the emulator): on unless
// DFLASH_QUANT_RUNS16=0 (benches: the loads of a float each), where the pointers allow it.
inline bool & quantize_runs16_flag() {
    static bool on = [] {
        const char * e = std::getenv("DFLASH_QUANT_RUNS16");
        return !(e && e[0] == '0');
    }();
    return on;
}
inline ActSource with_runs16(ActSource x) {
    auto a16 = [](const float * p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    x.runs16 = quantize_runs16_flag() && !x.gate && a16(x.x) && x.sx % 4 == 0 &&
               (!x.up || (a16(x.up) && x.sup % 4 == 0)) && (!x.norm_w || a16(x.norm_w)) &&
               (!x.head_w || (a16(x.head_w) && x.head % 4 == 0));
    return x;
}

// Launches quantize_act_k_kernel<L, kBlock, V, L2, kSrc> with V = quantize_values_per_thread(np),
// kSrc from x (src_form); qs2: the bytes in layout L2 too (L2 != L).
template <ActLayout L, int kBlock, ActLayout L2 = L>
void launch_quantize_act(const ActSource & x_in, int8_t * qs, float * d, int * sums, int k, int ncols, int np,
                         cudaStream_t stream, int8_t * qs2 = nullptr) {
    const ActSource x = with_runs16(x_in);
    if (quantize_norm_column(x, k)) {
        DFLASH_LAUNCH_PDL(dflash_pdl::quant_kind(np), dim3((unsigned)np), kQk, 0, stream,
                          quantize_act_norm_column_kernel<L, kBlock, L2>)(x, qs, d, sums, k, ncols, np / 8, qs2);
        return;
    }
    auto go = [&](auto src_tag) {
        constexpr SrcForm kSrc = decltype(src_tag)::value;
        if (quantize_values_per_thread(np) == 1) {
            DFLASH_LAUNCH_PDL(dflash_pdl::quant_kind(np), quantize_act_grid(k, np, 1), kQk, 0, stream,
                              quantize_act_k_kernel<L, kBlock, 1, L2, kSrc>)(x, qs, d, sums, k, ncols, np / 8, qs2);
        } else {
            DFLASH_LAUNCH_PDL(dflash_pdl::quant_kind(np), quantize_act_grid(k, np, 8), kQk, 0, stream,
                              quantize_act_k_kernel<L, kBlock, 8, L2, kSrc>)(x, qs, d, sums, k, ncols, np / 8, qs2);
        }
    };
    with_src_form(x, go);
}

// Whether x can be quantized for products of k values: a head-norm source needs whole heads of
// 32, 64, 128 or 256 values (the quantizer's sums), whose weight holds one head; a sigmoid gate
// blocks of at most their stride, and nothing else on x.
inline bool act_source_ok(const ActSource & x, int k) {
    if (x.head_w) {
        const int h = x.head;
        return x.up && !x.norm_w && !x.gate && (h == 32 || h == 64 || h == 128 || h == 256) && k % h == 0;
    }
    if (x.gate) return !x.up && !x.norm_w && x.gate_block > 0 && x.gate_stride >= x.gate_block;
    return true;
}

// Column tiles the activation buffers need for ncols columns.
// 8: a DDTree verify of 3..8 nodes (the GEMV's cost grows by a column's worth per column).
// 24: a tree verify of 17..24 nodes (DDTree budgets 16..23) pays for 3 column tiles, not 4: on the
// H200 ffn_up 49.1 us against 62.3, the Q6_K output 812 against 949 (h200-s8-mma-standalone-24col.json).
// 48: a verify of 33..48 nodes (DDTree budget 32 is 33 nodes) pays for 6 tiles, not 8.
inline int padded_columns(int ncols) {
    return ncols <= 8 ? 8 : ncols <= 16 ? 16 : ncols <= 24 ? 24 : ncols <= 32 ? 32 : ncols <= 48 ? 48 : 64;
}

// Quantizes ncols columns of x for weight type F (its layout), padded_columns(ncols) of them.
template <typename F>
void quantize_act(const ActSource & x, int8_t * qs, float * d, int * sums, int k, int ncols, cudaStream_t stream) {
    const int np = padded_columns(ncols);
    launch_quantize_act<F::kLayout, F::kActBlock>(x, qs, d, sums, k, ncols, np, stream);
}

// kStages: super-blocks in flight per warp (0: direct loads). The engine uses kDefaultStages: 2
// beat 3 for every type at 16 columns on the H200 (session 8).
constexpr int kDefaultStages = 2;

// A kDynSmem kernel's dynamic shared memory, opted in once an instance (false when that failed:
// the launch must not run).
template <typename F, int NT, int kStages, bool kOccupancy, int W, bool kSplitK, int R, bool kRes, bool kPieces = false,
          bool kActSmem = false>
bool dyn_smem_ready() {
    static const bool ok =
        cudaFuncSetAttribute(
            gemm_kquant_mma_kernel<F, NT, kStages, kOccupancy, W, kSplitK, R, kRes, true, kPieces, kActSmem>,
            cudaFuncAttributeMaxDynamicSharedMemorySize, Smem<F, NT, kStages, W, R, kActSmem>::kBytes) == cudaSuccess;
    return ok;
}

// kStages: asked for; what runs is fit_stages<F, W, R>(kStages) (0 stays 0: direct loads). W:
// warps per block; kSplitK: see the kernel; R: 16-row tiles per warp. The activations were
// quantized by quantize_act<F> for the same ncols. kRes: res (may be dst itself) is a residual
// added to each output as it is written (ggml's mul_mat + add fused: the same float addition).
// kDynSmem: the stages in dynamic shared memory (kMaxDynamicSmem; the caller checks the device's
// opt-in limit); false when its opt-in failed (nothing launched). kActSmem: the kernel's staged
// activations (with kSplitK false and kDynSmem), for 17..64 columns (false below: nothing launched).
// kTma: the stages filled by bulk tensor copies (the kernel's kTma; sm_90 only, the caller checks),
// up to 32 columns; false where that cannot run (more columns, a tensor map the weights do not
// make: nothing launched).
template <typename F, int kStages, bool kOccupancy = true, int W = kWarps, bool kSplitK = true, int R = 1,
          bool kRes = false, bool kDynSmem = false, bool kPieces = false, bool kActSmem = false, bool kTma = false>
bool launch(const char * w, const int8_t * yq, const float * yd, const int * ysum, float * dst, int nrows, int k,
            int64_t row_bytes, int ncols, int stride_col_dst, cudaStream_t stream, const float * res = nullptr,
            int stride_col_res = 0, int pieces = 1, float * partials = nullptr) {
    const int tile_rows = (kSplitK ? kRows : kRows * W) * R;
    const int tiles = (nrows + tile_rows - 1) / tile_rows;
    // a split needs its partial sums, a counter a tile and a super-block a piece
    if (!kPieces || !partials || tiles > kMmaMaxSplitTiles || pieces > k / kQk) pieces = 1;
    if (kPieces && pieces == 1) return false;  // the caller runs the unsplit kernel
    const dim3 grid((unsigned)(tiles * pieces), 1, 1), block(WARP_SIZE, W, 1);
    const int nb = k / kQk;
    constexpr int kSt = kStages > 0 ? fit_stages<F, W, R, kDynSmem>(kStages) : 0;
    TmaRows tma{};
    if constexpr (kTma) {
        static_assert(F::kRowsAligned && kSt > 0 && !kDynSmem && !kActSmem && !kPieces, "see the kernel's kTma");
        if (ncols > 32 || !tma_rows_encode(tma, w, row_bytes, nrows, F::kBytes, R * kRows)) return false;
    }
#define GEMM_KQ_LAUNCH(NT)                                                                                           \
    do {                                                                                                             \
        if constexpr ((kActSmem && NT < 3) || (kTma && NT > 4)) {                                                    \
            return false;                                                                                            \
        } else {                                                                                                     \
            auto kernel = gemm_kquant_mma_kernel<F, NT, kSt, kOccupancy, W, kSplitK, R, kRes, kDynSmem, kPieces,     \
                                                 kActSmem, kTma>;                                                    \
            constexpr int kBytes = kDynSmem ? Smem<F, NT, kSt, W, R, kActSmem>::kBytes : 0;                          \
            if constexpr (kDynSmem) {                                                                                \
                if (!dyn_smem_ready<F, NT, kSt, kOccupancy, W, kSplitK, R, kRes, kPieces, kActSmem>()) return false; \
            }                                                                                                        \
            DFLASH_LAUNCH_PDL(dflash_pdl::gemm_kind(8 * NT), grid, block, kBytes, stream, kernel)(                   \
                w, yq, yd, ysum, dst, nrows, nb, row_bytes, ncols, stride_col_dst, res, stride_col_res, pieces,      \
                partials, tma);                                                                                      \
        }                                                                                                            \
    } while (0)
    if (ncols <= 8) {
        GEMM_KQ_LAUNCH(1);
    } else if (ncols <= 16) {
        GEMM_KQ_LAUNCH(2);
    } else if (ncols <= 24) {
        GEMM_KQ_LAUNCH(3);
    } else if (ncols <= 32) {
        GEMM_KQ_LAUNCH(4);
    } else if (ncols <= 48) {
        GEMM_KQ_LAUNCH(6);
    } else {
        GEMM_KQ_LAUNCH(8);
    }
#undef GEMM_KQ_LAUNCH
    return true;
}

// Warps a block of R row tiles runs with: W, or fewer until 2 stages fit the static shared memory
// (2 row tiles of Q6_K: 2 warps).
template <typename F, int W, int R>
constexpr int fit_warps() {
    if constexpr (W > 1 && fit_stages<F, W, R>(2) != 2) {
        return fit_warps<F, W / 2, R>();
    } else {
        return W;
    }
}

}  // namespace gemm_kq
