// ggml_ext's Q6_K and Q4_K GEMM through Hopper's f16 warpgroup products (wgmma m64nNk16, sm_90a),
// for 16..64 activation columns.
//
// Why f16: a K-quant weight is d * sc * q (- dmin * m for Q4_K) with a small-integer scale per 16
// (Q6_K, int8) or 32 (Q4_K, 6 bits) values. The int8 forms sum each group in int32 and then
// multiply the sum by its scale: Q6_K's mma.sync form (gemm_kquant_mma_impl.cuh's Q6K) pays 4
// integer multiply-adds (a half-rate pipe) per m16n8k16 mma, which is what bounds it (ncu on the
// H100, session 33: ALU 41% busy, tensor 6.5%), since sc * (q - 32) (up to 4064) fits no 8-bit
// operand; Q4_K's wgmma form (gemm_q4k_wgmma.cuh) splits its 6-bit scale into two u8 operands (two
// wgmmas a sub-block) and still takes a float step per super-block for d, dmin and the min term.
// In f16 the scales go into the weights: each operand is half(d * sc) * (q - 32) (Q6_K) or
// half(d * sc) * q + half(-dmin * m) (Q4_K, one fma), rounded once (q is exact; ggml's
// dequantize-to-f16 path rounds d * sc * q - dmin * m once), the activations are f16 (ggml's cuBLAS
// path), and the f32 accumulators run over all of K: no integer step, no float step per
// super-block, no wait for the tensor cores but the one before an operand register is reused.
//
// A block is WG warpgroups of 64 rows each (one copy of the activations for all). Per super-block
// it stages the rows' blocks (Q6_K's 210 bytes are 2-byte aligned: 14 aligned 16-byte chunks a
// row, the block at its address's offset; Q4_K's 144 are 9 chunks) and every column's 256 f16
// activations with cp.async; each warp builds its 16 rows' A operands for 4 of the 16 groups of 16
// values at a time (a chunk) and issues their 4 wgmmas as one commit group, then waits for the
// chunk before (wait_group 1): the operand registers alternate between two sets, so the tensor
// cores run while the next chunk is built. A stage is refilled 2 super-blocks after it was read
// (kAhead = S - 2): by the barrier of super-block i every warp has waited for all of super-block
// i - 2's wgmmas.
//
// Measured on the H100 (session 35, bench/results/h100-s35-*): ahead of the int8 forms only on long
// rows and the output matrix at some column counts (Q6_K ffn_down 39.4 / 48.8 / 66.9 us at 16 / 32 / 64
// columns against 48.1 / 54.0 / 71.5, the output 700 against 804 at 64), behind on the shorter Q6_K
// matrices and on most Q4_K ones (the int8 wgmma form's [gate; up] 73.3 against 83.6 at 64). In the
// 27B's 64-token forward the Q6_K form took 17.73 ms of kernels against 17.95 (16 / 32 tokens: even);
// Q4_K's made every forward slower. What bounds it: the operand work a warp issues (~30 instructions
// a group and row pair) against the tensor cores' 16 wgmmas a super-block, with 4..8 warps a
// multiprocessor; the per-group scale conversions were not it (the f16 pairs below gained 1..2%).
//
// Activations (f16, their own layout, f16_act_index): per super-block kb and group s a tile of N
// columns x 16 halves in core matrices of 8 columns x 8 halves (16 bytes); core matrix (kk, nn) at
// nn * 256 + kk * 128, so a wgmma's B descriptor has LBO 128 and SBO 256 (K-major, no swizzle), as
// the Q4_K int8 form's. The k order is permuted as the weights' (thread t holds a group's values
// 4t..4t+3, 4 contiguous bytes of Q6_K's ql and Q4_K's nibbles): hardware k 2t, 2t + 1, 8 + 2t,
// 9 + 2t hold values 4t..4t+3.
#pragma once

#include "gemm_q4k_wgmma.cuh"

#include <type_traits>

namespace gemm_kq {

// Hardware k (0..15) of value v (0..15) of a group: value 4t + i at 2t + i (i < 2), 8 + 2t + i - 2.
__host__ __device__ __forceinline__ int f16_k_of_value(int v) {
    const int t = v >> 2, i = v & 3;
    return i < 2 ? 2 * t + i : 8 + 2 * t + (i - 2);
}

// Half index of value v (0..255) of super-block kb, column col, in the f16 activations of np columns.
__host__ __device__ __forceinline__ int64_t f16_act_index(int kb, int v, int col, int np) {
    const int s = v >> 4, p = f16_k_of_value(v & 15);
    return (int64_t)kb * np * kQk + (int64_t)s * np * 16 + (col >> 3) * 128 + (p >> 3) * 64 + (col & 7) * 8 + (p & 7);
}

// Activations for the kernel below: value v of column col of x (ActSource, every form the int8
// quantizer takes), as an f16 (round to nearest), at f16_act_index; columns ncols..np - 1 zero.
// A block of 256 threads a super-block of a column, a value a thread (quantize_act_k_kernel's V = 1
// order, so the head norm's and RMSNorm's scales are summed as there).
template <SrcForm kSrc>
static __global__ void __launch_bounds__(kQk)
    convert_act_f16_kernel(const ActSource x, __half * __restrict__ out, const int k, const int ncols, const int np) {
    pdl_wait();
    pdl_trigger();
    const int col = blockIdx.y, kb = blockIdx.x, r = threadIdx.x;
    const float scale = col < ncols ? x.column_scale<kQk>(col, k) : 1.0f;  // a barrier: before any return
    float head_scale = 1.0f;
    if constexpr (kSrc == SrcForm::kHeadNorm) head_scale = head_scale_one_a_thread(x, col, ncols, kb, r / 32, r % 32);
    const float v = source_value<kSrc>(x, col, ncols, (int64_t)kb * kQk + r, scale, head_scale);
    out[f16_act_index(kb, r, col, np)] = __float2half_rn(v);
}

// The values 8t..8t+7 of sub-block j of super-block kb, column col, that lane 4j + t of a V = 8
// kernel takes (source_values in layout L, after the column's scale, which every thread of the
// block sums: a barrier); false past k (the same for a warp: it returns).
template <ActLayout L, SrcForm kSrc>
__device__ __forceinline__ bool lane_values_v8(const ActSource & x, int k, int ncols, int col, int kb, int j, int t,
                                               int lane, float (&v)[8]) {
    const float scale = col < ncols ? x.column_scale<kQk>(col, k) : 1.0f;
    if (kb * kQk >= k) return false;
    float head_scale = 1.0f;
    if constexpr (kSrc == SrcForm::kHeadNorm) head_scale = head_scale_quad(x, col, ncols, kb, j, t);
    source_values<L, 8, kSrc>(x, col, ncols, kb, j, t, lane, scale, head_scale, v);
    return true;
}

// Lane 4j + t's values 8t..8t+7 of sub-block j (super-block kb, column col) as halves at
// f16_act_index: two runs of 4 (values 8t + {0, 1, 4, 5} at hardware k 4m..4m + 3 of the group's
// first 8, {2, 3, 6, 7} at 8 + 4m.., m = t % 2).
__device__ __forceinline__ void store_halves_v8(__half * out, int kb, int j, int t, int col, int np,
                                                const float (&v)[8]) {
    auto bits = [](float a, float b) {
        const half2 h = __floats2half2_rn(a, b);
        return *reinterpret_cast<const uint32_t *>(&h);
    };
    __half * first = out + f16_act_index(kb, 32 * j + 8 * t, col, np);  // hardware k 4m of its group
    *reinterpret_cast<uint2 *>(first) = make_uint2(bits(v[0], v[1]), bits(v[4], v[5]));
    *reinterpret_cast<uint2 *>(first + 64) = make_uint2(bits(v[2], v[3]), bits(v[6], v[7]));
}

// The same conversion 8 values a thread, as quantize_act_k_kernel's V = 8 reads them: a warp a
// super-block, 8 a block of 256 threads (the column's scale summed once a block, not once a
// super-block), lane 4j + t holding values 8t..8t+7 of sub-block j (source_values: two 16-byte runs
// where the source allows), stored as two runs of 4 halves (f16_k_of_value: values 8t + {0, 1, 4,
// 5} at hardware k 4m..4m + 3 of the group's first 8, {2, 3, 6, 7} at 8 + 4m.., m = t % 2). The
// same halves as the kernel above (the emulator: check_f16_convert). On by default above 16
// columns (convert_act_f16; DFLASH_F16_CONVERT_V8=0: the kernel above everywhere).
template <SrcForm kSrc>
static __global__ void __launch_bounds__(kQk) convert_act_f16_v8_kernel(const ActSource x, __half * __restrict__ out,
                                                                        const int k, const int ncols, const int np) {
    pdl_wait();
    pdl_trigger();
    const int col = blockIdx.y, lane = threadIdx.x % WARP_SIZE;
    const int kb = blockIdx.x * (kQk / WARP_SIZE) + threadIdx.x / WARP_SIZE, j = lane / 4, t = lane % 4;
    float v[8];
    if (!lane_values_v8<ActLayout::kRun, kSrc>(x, k, ncols, col, kb, j, t, lane, v)) return;
    store_halves_v8(out, kb, j, t, col, np, v);
}

// Both activation forms of one source in one launch, for a pair of products of it where one takes
// the f16 form (the halves above) and the other an int8 form with a scale a super-block in layout L
// (kRun: the mma.sync Q4_K / Q5_K forms; kWgmma: the int8 wgmma forms): quantize_act_k_kernel<L,
// kQk, 8, L, kSrc> and convert_act_f16_v8_kernel<kSrc> fused. Their threads are alike (a warp a
// super-block, lane 4j + t values 8t..8t+7 of sub-block j from source_values), so the bytes, scales,
// sums and halves are the two launches' (the emulator: check_act_pair). np8 / np16: the padded
// columns of the int8 layout and of the halves (each zero past ncols); a block a column of the larger.
template <ActLayout L, SrcForm kSrc>
static __global__ void __launch_bounds__(kQk)
    quantize_act_and_f16_kernel(const ActSource x, int8_t * __restrict__ qs, float * __restrict__ d,
                                int * __restrict__ sums, __half * __restrict__ out, const int k, const int ncols,
                                const int np8, const int np16) {
    static_assert(L != ActLayout::kHalves, "the halves' layout pairs values as kRun and kWgmma do");
    pdl_wait();
    pdl_trigger();
    const int col = blockIdx.y, lane = threadIdx.x % WARP_SIZE;
    const int kb = blockIdx.x * (kQk / WARP_SIZE) + threadIdx.x / WARP_SIZE, j = lane / 4, t = lane % 4;
    float v[8];
    if (!lane_values_v8<L, kSrc>(x, k, ncols, col, kb, j, t, lane, v)) return;
    if (col < np8) quantize_values<L, kQk, 8, L>(v, kb, j, t, lane, col, np8 / 8, qs, d, sums, nullptr);
    if (col < np16) store_halves_v8(out, kb, j, t, col, np16, v);
}

// quantize_act_and_f16_kernel over x (kSrc from its form; float4 loads where the source allows).
template <ActLayout L>
inline void quantize_act_and_f16(const ActSource & x_in, int8_t * qs, float * d, int * sums, __half * out, int k,
                                 int ncols, int np8, int np16, cudaStream_t stream) {
    const ActSource x = with_runs16(x_in);
    const int np = np8 > np16 ? np8 : np16;
    const dim3 grid((unsigned)((k / kQk + 7) / 8), (unsigned)np, 1);
    auto go = [&](auto src_tag) {
        constexpr SrcForm kSrc = decltype(src_tag)::value;
        DFLASH_LAUNCH_PDL(dflash_pdl::quant_kind(np), grid, kQk, 0, stream, quantize_act_and_f16_kernel<L, kSrc>)(
            x, qs, d, sums, out, k, ncols, np8, np16);
    };
    with_src_form(x, go);
}

inline bool & f16_convert_v8_flag() {
    static bool on = [] {
        const char * e = std::getenv("DFLASH_F16_CONVERT_V8");
        return !(e && e[0] == '0');
    }();
    return on;
}

// The conversion by either kernel above (v8: 8 values a thread).
inline void convert_act_f16_by(const bool v8, const ActSource & x_in, __half * out, int k, int ncols, int np,
                               cudaStream_t stream) {
    const ActSource x = v8 ? with_runs16(x_in) : x_in;
    const dim3 grid(v8 ? (unsigned)((k / kQk + 7) / 8) : (unsigned)(k / kQk), (unsigned)np, 1);
    auto go = [&](auto src_tag) {
        constexpr SrcForm kSrc = decltype(src_tag)::value;
        if (v8) {
            DFLASH_LAUNCH_PDL(dflash_pdl::quant_kind(np), grid, kQk, 0, stream, convert_act_f16_v8_kernel<kSrc>)(
                x, out, k, ncols, np);
            return;
        }
        DFLASH_LAUNCH_PDL(dflash_pdl::quant_kind(np), grid, kQk, 0, stream, convert_act_f16_kernel<kSrc>)(x, out, k,
                                                                                                          ncols, np);
    };
    with_src_form(x, go);
}

// The GEMM's conversion: 8 values a thread above 16 columns (f16_convert_v8_flag), a value a thread
// up to 16. On the H100 (session 46, bench/results/h100-s46-*) the 8-value kernel took the 27B's 65
// launches from 259 / 347 / 435 to 211 / 268 / 302 us a 32 / 48 / 64-token forward, but at 16 its 32
// launches (ffn_down's 17408 values: 9 blocks a column, 144 in all) 110 against 86 us.
inline void convert_act_f16(const ActSource & x, __half * out, int k, int ncols, int np, cudaStream_t stream) {
    convert_act_f16_by(f16_convert_v8_flag() && np > 16, x, out, k, ncols, np, stream);
}

// d (+)= a (64 x 16 f16, registers: mma_f16's A layout, warp w rows 16w..) * B (16 x N f16, shared
// memory at desc_b, K-major); f32 accumulators in mma's C layout per 8-column tile i, d[4i..].
#if defined(DFLASH_CUDA_EMU)
template <int N>
void wgmma_f16(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b) {
    cuda_emu::wgmma_m64k16_f16(N, d, a, desc_b, true);
}
#else
template <int N>
__device__ __forceinline__ void wgmma_f16(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b);
#endif

#if defined(DFLASH_WGMMA_PTX)
// scale-d 1 (accumulate), scale-a and scale-b 1, trans-b 0 (B K-major).
template <>
__device__ __forceinline__ void wgmma_f16<16>(float (&d)[8], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, 1, 1, 1, "
        "0;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}

template <>
__device__ __forceinline__ void wgmma_f16<24>(float (&d)[12], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n24k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11}, "
        "{%12,%13,%14,%15}, %16, 1, 1, 1, 0;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}

template <>
__device__ __forceinline__ void wgmma_f16<32>(float (&d)[16], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, "
        "{%16,%17,%18,%19}, %20, 1, 1, 1, 0;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}

template <>
__device__ __forceinline__ void wgmma_f16<48>(float (&d)[24], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n48k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23}, {%24,%25,%26,%27}, "
        "%28, 1, 1, 1, 0;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}

template <>
__device__ __forceinline__ void wgmma_f16<64>(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%"
        "29,%30,%31}, {%32,%33,%34,%35}, %36, 1, 1, 1, 0;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}
#endif

// The registers stay where the asm left them (float accumulators; wg_pin's).
template <int n>
__device__ __forceinline__ void wg_pin_f(float (&d)[n]) {
#pragma unroll
    for (int i = 0; i < n; ++i) {
#if defined(DFLASH_CUDA_EMU)
        asm volatile("" : "+m"(d[i])::"memory");
#else
        asm volatile("" : "+f"(d[i])::"memory");
#endif
    }
}

// The weight formats: a super-block's bytes, the aligned 16-byte chunks staged a row (kAligned:
// rows 16-byte aligned, the block at the start of its chunks), a lane's data of a row (Row, loaded
// from the stage), its super-block's scales as f16 pairs (Scales, once a super-block), and group
// s's A operand of rows g and g + 8 (operand: a0 / a1 values 4t, 4t + 1 of rows g / g + 8, a2 / a3
// values 4t + 2, 4t + 3).
//
// The scales in f16 without a conversion instruction (I2F and F2F run at a quarter of the FP32
// rate): small integers under a 0x64 exponent byte read as 1024 + x, less 1024 exactly, then one
// f16 product with d: half(d) * half(sc) rounded once is half(d * sc) (the float product of an
// 11-bit and an 8-bit integer is exact), so the operands are the same bits as converting
// float(d) * sc. Session 35's first form converted every group's scale: 2 I2F, 2 F2F a group and row.

// Bytes b0..b3 of w (0..255 each) less `bias` as two f16 pairs: (b0, b1), (b2, b3).
__device__ __forceinline__ void bytes_to_half2(const uint32_t w, const half2 bias, half2 & p01, half2 & p23) {
    const uint32_t lo = __byte_perm(w, 0x64646464u, 0x4140u), hi = __byte_perm(w, 0x64646464u, 0x4342u);
    p01 = __hsub2(*reinterpret_cast<const half2 *>(&lo), bias);
    p23 = __hsub2(*reinterpret_cast<const half2 *>(&hi), bias);
}

// Half i (0 or 1) of the pair p in both halves.
__device__ __forceinline__ half2 splat_half(const half2 p, int i) {
    const uint32_t w = *reinterpret_cast<const uint32_t *>(&p);
    const uint32_t r = __byte_perm(w, 0u, i ? 0x3232u : 0x1010u);
    return *reinterpret_cast<const half2 *>(&r);
}

__device__ __forceinline__ uint32_t half2_word(const half2 h) { return *reinterpret_cast<const uint32_t *>(&h); }

// Q6_K: each weight half(d * sc) * (q - 32).
struct F16Q6K {
    static constexpr int kBytes = 210, kChunks = 14;  // 14 chunks hold a 2-byte aligned block
    static constexpr bool kAligned = false;
    using Row = Q6KRow;
    struct Scales {
        half2 p[8];  // (d sc_2i, d sc_2i+1)
    };
    static __device__ __forceinline__ Row load(const char * blk, int t) { return load_q6_k_row<true>(blk, t); }
    static __device__ __forceinline__ Scales scales(const Row & r) {
        Scales sc;
        const half2 d2 = __floats2half2_rn(r.d, r.d);            // exact: d came from a half
        const half2 bias = __floats2half2_rn(1152.0f, 1152.0f);  // 1024 + 128: int8 scales biased by 128
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            bytes_to_half2(r.sc[i] ^ 0x80808080u, bias, sc.p[2 * i], sc.p[2 * i + 1]);
            sc.p[2 * i] = __hmul2(sc.p[2 * i], d2);
            sc.p[2 * i + 1] = __hmul2(sc.p[2 * i + 1], d2);
        }
        return sc;
    }
    static __device__ __forceinline__ void operand(const Row & r0, const Row & r1, const Scales & c0, const Scales & c1,
                                                   int s, uint32_t (&a)[4]) {
        const int n = s >> 3, q = (s >> 1) & 3, u = s & 1;
        const half2 bias = __floats2half2_rn(1056.0f, 1056.0f);  // 1024 + 32
        auto values = [&](const Row & r, const Scales & c, uint32_t & lo, uint32_t & hi) {
            const uint32_t ql = (r.ql[n][q & 1][u] >> (4 * (q >> 1))) & 0x0F0F0F0Fu;
            const uint32_t qb = ql | (((r.qh[n][u] >> (2 * q)) & 0x03030303u) << 4);  // q + 32 in 0..63, a byte each
            half2 w01, w23;
            bytes_to_half2(qb, bias, w01, w23);
            const half2 sc = splat_half(c.p[s >> 1], s & 1);
            lo = half2_word(__hmul2(w01, sc));
            hi = half2_word(__hmul2(w23, sc));
        };
        values(r0, c0, a[0], a[2]);
        values(r1, c1, a[1], a[3]);
    }
};

// Q4_K: d, dmin (half2), 12 bytes of 6-bit scales and mins, 128 bytes of nibbles (sub-blocks 2c
// and 2c + 1 in the low and high nibbles of bytes 32c..32c+31). Group s = 2j + u is values 16u..
// 16u+15 of sub-block j: lane t's 4 are the nibbles of bytes 32 (j / 2) + 16u + 4t..+3. Each
// weight half(d * sc) * q + half(-dmin * m), one fma.
struct F16Q4KRow {
    uint32_t q[4][2];  // [c][u]: bytes 16 + 32c + 16u + 4t..+3
    uint32_t s0, s1, s2;
    uint32_t dm;  // d, dmin (half2)
};

struct F16Q4K {
    static constexpr int kBytes = 144, kChunks = 9;
    static constexpr bool kAligned = true;
    using Row = F16Q4KRow;
    struct Scales {
        half2 sc[4], mn[4];  // (d sc_2i, d sc_2i+1), (-dmin m_2i, -dmin m_2i+1)
    };
    static __device__ __forceinline__ Row load(const char * blk, int t) {
        Row r;
        const uint4 h = *reinterpret_cast<const uint4 *>(blk);
        r.dm = h.x, r.s0 = h.y, r.s1 = h.z, r.s2 = h.w;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                r.q[c][u] = *reinterpret_cast<const uint32_t *>(blk + 16 + 32 * c + 16 * u + 4 * t);
            }
        }
        return r;
    }
    static __device__ __forceinline__ Scales scales(const Row & r) {
        Scales c;
        const half2 dm = *reinterpret_cast<const half2 *>(&r.dm);  // (d, dmin)
        const half2 dd = splat_half(dm, 0);
        const uint32_t neg = half2_word(splat_half(dm, 1)) ^ 0x80008000u;  // -dmin: the sign bits flipped
        const half2 nm = *reinterpret_cast<const half2 *>(&neg);
        const half2 bias = __floats2half2_rn(1024.0f, 1024.0f);
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // sub-blocks 4h..4h+3: scale_word / min_word's bytes
            bytes_to_half2(scale_word(r.s0, r.s2, h), bias, c.sc[2 * h], c.sc[2 * h + 1]);
            bytes_to_half2(min_word(r.s1, r.s2, h), bias, c.mn[2 * h], c.mn[2 * h + 1]);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) c.sc[i] = __hmul2(c.sc[i], dd), c.mn[i] = __hmul2(c.mn[i], nm);
        return c;
    }
    static __device__ __forceinline__ void operand(const Row & r0, const Row & r1, const Scales & c0, const Scales & c1,
                                                   int s, uint32_t (&a)[4]) {
        const int j = s >> 1, u = s & 1;
        const half2 bias = __floats2half2_rn(1024.0f, 1024.0f);
        auto values = [&](const Row & r, const Scales & c, uint32_t & lo, uint32_t & hi) {
            const uint32_t nib = (r.q[j >> 1][u] >> (4 * (j & 1))) & 0x0F0F0F0Fu;
            half2 w01, w23;
            bytes_to_half2(nib, bias, w01, w23);
            const half2 sc = splat_half(c.sc[j >> 1], j & 1), mn = splat_half(c.mn[j >> 1], j & 1);
            lo = half2_word(__hfma2(w01, sc, mn));
            hi = half2_word(__hfma2(w23, sc, mn));
        };
        values(r0, c0, a[0], a[2]);
        values(r1, c1, a[1], a[3]);
    }
};

// A stage: the block's rows' blocks (F::kChunks chunks a row), then the super-block's f16
// activations of N columns.
template <typename F, int N, int WG>
struct F16WgPlan {
    static constexpr int kWBytes = WG * kWgRows * F::kChunks * 16;
    static constexpr int kBBytes = N * kQk * 2;
    static constexpr int kStageBytes = kWBytes + kBBytes;
};

// Super-block kb from stage st (its weights at the start, then kWBytes later its activations): this
// lane's rows wrow + g and + 8 (row0 / row1: their rows in the matrix, for Q6_K's offsets in 16
// bytes) into operands, a chunk of 4 groups at a time in the operand set a[chunk & 1], each
// chunk's 4 wgmmas into acc one commit group, waiting for the chunk before. after_first(): once
// the first chunk's wait has returned, so every earlier super-block's wgmmas are done.
template <typename F, int N, int kWBytes, typename AfterFirst>
__device__ __forceinline__ void f16_superblock(const char * st, int kb, int wrow, int g, int t, const char * row0,
                                               const char * row1, float (&acc)[N / 2], uint32_t (&a)[2][4][4],
                                               int & chunk, AfterFirst && after_first) {
    auto in_stage = [&](int r, const char * row) {  // row r's block in the stage
        return st + r * F::kChunks * 16 + (F::kAligned ? 0 : offset_in16(row + (int64_t)kb * F::kBytes));
    };
    const typename F::Row r0 = F::load(in_stage(wrow + g, row0), t);
    const typename F::Row r1 = F::load(in_stage(wrow + g + 8, row1), t);
    const typename F::Scales c0 = F::scales(r0), c1 = F::scales(r1);
    const uint64_t d0 = wg_desc(st + kWBytes, 128, 256);
#pragma unroll
    for (int c = 0; c < 4; ++c, ++chunk) {
        uint32_t (&ac)[4][4] = a[chunk & 1];
#pragma unroll
        for (int m = 0; m < 4; ++m) F::operand(r0, r1, c0, c1, 4 * c + m, ac[m]);
        wg_fence();
#pragma unroll
        for (int m = 0; m < 4; ++m) wgmma_f16<N>(acc, ac[m], wg_desc_plus(d0, (4 * c + m) * N * 32));
        wg_commit();
        wg_wait<1>();  // the chunk before is done: its operand set is free
        if (c == 0) after_first();
    }
}

// The f16 GEMM kernels' arguments (both forms, gemm_f16_wgmma_ws.cuh too): w the weight rows
// (row_bytes each, nblocks super-blocks a row), act convert_act_f16's activations, dst the outputs
// (stride_col_dst floats a column), res a residual to add (kRes instances; stride_col_res floats a
// column), and the tail split (WgSplit's full_tiles and pieces) with its partials.
struct F16GemmArgs {
    const char * w;
    const __half * act;
    float * dst;
    int nrows, nblocks;
    int64_t row_bytes;
    int ncols, stride_col_dst;
    const float * res;
    int stride_col_res, full_tiles, pieces;
    float * partials;
};

// Weight row `row`'s address (a last tile's missing rows read the matrix's last row).
__device__ __forceinline__ const char * f16_row(const F16GemmArgs & args, int row) {
    return args.w + (int64_t)min(row, args.nrows - 1) * args.row_bytes;
}

// A tile's end: a piece of a split tile leaves its sums in the partials and the tile's last piece
// adds every piece's (wg_split_gather among kThreads threads, or those of named barrier kNamedBar);
// then the outputs of this lane's rows (first: the warp's first row in the matrix) and columns,
// plus the residual with kRes.
template <int N, bool kRes, int kThreads, int kNamedBar = 0>
__device__ __forceinline__ void f16_finish(float (&acc)[N / 2], const WgBlockWork & work, const F16GemmArgs & args,
                                           int first, int g, int t, int tid) {
    auto at = [&](int nt, int e) -> float & { return acc[4 * nt + e]; };
    if (work.split && !wg_split_gather<N / 8, kThreads, kNamedBar>(at, args.partials, work, tid)) {
        return;
    }
    write_outputs<N / 2, kRes>(
        [&](int e) { return make_int2(first + g + ((e & 3) < 2 ? 0 : 8), (e >> 2) * 8 + 2 * t + (e & 1)); },
        [&](int e) { return acc[e]; }, args.dst, args.stride_col_dst, args.res, args.stride_col_res, args.nrows,
        args.ncols);
}

// F: the weight format (F16Q6K, F16Q4K); N: padded columns (16, 24, 32, 48, 64); S: stages (3 or
// more); WG: warpgroups a block. The tail split (WgSplit) as the Q4_K int8 form's. kRes: res
// (stride_col_res floats a column) is added to each output as it is written (a fused residual add).
template <typename F, int N, int S, int WG, int MB, bool kRes>
__global__ void __launch_bounds__(128 * WG, MB) gemm_f16_wgmma_kernel(const F16GemmArgs args) {
#if defined(DFLASH_WGMMA)
    using P = F16WgPlan<F, N, WG>;
    constexpr int kThreads = 128 * WG, kBlockRows = WG * kWgRows;
    constexpr int kAhead = S - 2;
    static_assert(kAhead >= 1, "a stage is refilled two super-blocks after it was read: 3 stages at least");
    DFLASH_DYNAMIC_SMEM_BYTES(smem);
    const int lane = threadIdx.x, warp = threadIdx.y, tid = warp * WARP_SIZE + lane;
    const int g = lane >> 2, t = lane & 3;
    const WgBlockWork work = wg_block_work(args.full_tiles, args.pieces, args.nblocks);
    const int kb_begin = work.kb_begin, nkb = work.kb_end - work.kb_begin;
    const int row_base = work.tile * kBlockRows;
    const int wrow = 64 * (warp >> 2) + 16 * (warp & 3);  // the warp's first row in the block
    // This thread's copies of a stage's weights: chunk c = tid + kThreads i (row c / kChunks, chunk
    // c % kChunks) from the row's block (aligned down to 16 bytes); the row's address, once.
    constexpr int kWTotal = kBlockRows * F::kChunks, kWCopies = (kWTotal + kThreads - 1) / kThreads;
    const char * wrow_at[kWCopies];
#pragma unroll
    for (int i = 0; i < kWCopies; ++i) {
        const int c = min(tid + i * kThreads, kWTotal - 1);
        wrow_at[i] = f16_row(args, row_base + c / F::kChunks);
    }
    auto stage_in = [&](int s, int kb) {
        char * st = smem + s * P::kStageBytes;
#pragma unroll
        for (int i = 0; i < kWCopies; ++i) {
            const int c = tid + i * kThreads;
            if (kWTotal % kThreads == 0 || c < kWTotal) {
                const int ch = c % F::kChunks;  // stage byte 16 c: row c / kChunks's chunk ch
                const char * blk = wrow_at[i] + (int64_t)kb * F::kBytes;
                cp_async_16(st + 16 * c, (F::kAligned ? blk : align16_down(blk)) + 16 * ch);
            }
        }
        const char * src = reinterpret_cast<const char *>(args.act) + (int64_t)kb * P::kBBytes;
#pragma unroll
        for (int i = 0; i < (P::kBBytes / 16 + kThreads - 1) / kThreads; ++i) {
            const int c = tid + i * kThreads;
            if ((P::kBBytes / 16) % kThreads == 0 || c < P::kBBytes / 16)
                cp_async_16(st + P::kWBytes + 16 * c, src + 16 * c);
        }
    };
    // the first stages (the weights before the wait for the kernel that wrote the activations would
    // need a group of their own; the activations' copies are a small part: one group a stage)
    pdl_wait();
    pdl_trigger();
#pragma unroll
    for (int s = 0; s < kAhead; ++s) {
        if (s < nkb) stage_in(s, kb_begin + s);
        cp_async_commit();
    }
    // this lane's rows g, g + 8: their blocks' offsets in 16 bytes at super-block kb
    const char *row0 = f16_row(args, row_base + wrow + g), *row1 = f16_row(args, row_base + wrow + g + 8);
    float acc[N / 2] = {};
    uint32_t a[2][4][4];  // a chunk's 4 groups' operands, two chunks in turn
    int chunk = 0;
    for (int i = 0; i < nkb; ++i) {
        const int kb = kb_begin + i;
        cp_async_wait<kAhead - 1>();
        fence_proxy_async();
        __syncthreads();  // every thread's copies of stage i landed; every warp past super-block i - 2's wgmmas
        if (i + kAhead < nkb) stage_in((i + kAhead) % S, kb + kAhead);
        cp_async_commit();
        f16_superblock<F, N, P::kWBytes>(smem + (i % S) * P::kStageBytes, kb, wrow, g, t, row0, row1, acc, a, chunk,
                                         [] {});
    }
    wg_wait0();
    wg_pin_f(acc);
    cp_async_wait<0>();
    f16_finish<N, kRes, kThreads>(acc, work, args, row_base + wrow, g, t, tid);
#else
    NO_DEVICE_CODE;
#endif
}

using F16WgKernel = void (*)(F16GemmArgs);

// A form of the f16 GEMM for the host helpers below: K::kernel<N, kRes>() its instance for N padded
// columns, K::bytes<N>() that instance's dynamic shared memory, K::kThreads a block's threads and
// K::kTileRows the rows of a tile.
template <typename F, int S, int WG, int MB>
struct F16WgForm {
    static constexpr int kThreads = 128 * WG, kTileRows = WG * kWgRows;
    template <int N>
    static constexpr int bytes() {
        return S * F16WgPlan<F, N, WG>::kStageBytes;
    }
    template <int N, bool kRes>
    static F16WgKernel kernel() {
        return gemm_f16_wgmma_kernel<F, N, S, WG, MB, kRes>;
    }
};

// Form K's instance for N padded columns, its dynamic shared memory opted in once; null when that
// failed.
template <typename K, int N, bool kRes>
F16WgKernel f16_kernel_ready() {
    const F16WgKernel kernel = K::template kernel<N, kRes>();
    static const bool ok = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                K::template bytes<N>()) == cudaSuccess;
    return ok ? kernel : nullptr;
}

// The tail split of form K's launch of nrows x k at ncols columns on nsm multiprocessors (WgSplit).
template <typename K>
WgSplit f16_split_for(int nrows, int k, int ncols, int nsm) {
    return wg_for_columns(wg_padded_columns(ncols), [&](auto n_tag) {
        constexpr int N = decltype(n_tag)::value;
        static const int per_sm =
            wg_blocks_per_sm(f16_kernel_ready<K, N, false>(), K::kThreads, K::template bytes<N>());
        return wg_split_plan((nrows + K::kTileRows - 1) / K::kTileRows, k / kQk, per_sm * nsm, wg_min_piece_blocks());
    });
}

// Whether form K's instance for ncols columns (with a residual or not) can run here (its opt-in).
template <typename K>
bool f16_ready(int ncols, bool with_res) {
    return wg_for_columns(wg_padded_columns(ncols), [&](auto n_tag) {
        constexpr int N = decltype(n_tag)::value;
        return (with_res ? f16_kernel_ready<K, N, true>() : f16_kernel_ready<K, N, false>()) != nullptr;
    });
}

// One launch of form K; false when it cannot run here (the opt-in failed). act: convert_act_f16's,
// for wg_padded_columns(ncols) columns. split / partials: a tail split and its floats; none unless
// both are given.
template <typename K>
bool f16_launch(const char * w, const __half * act, float * dst, int nrows, int k, int64_t row_bytes, int ncols,
                int stride_col_dst, cudaStream_t stream, const float * res, int stride_col_res, WgSplit split,
                float * partials) {
    const int tiles = (nrows + K::kTileRows - 1) / K::kTileRows;
    if (split.pieces < 2 || !partials) split = WgSplit{tiles, 0, 1};
    const dim3 grid((unsigned)split.grid(), 1, 1), block(WARP_SIZE, K::kThreads / WARP_SIZE, 1);
    return wg_for_columns(wg_padded_columns(ncols), [&](auto n_tag) {
        constexpr int N = decltype(n_tag)::value;
        constexpr int kBytes = K::template bytes<N>();
        auto go = [&](auto res_tag) {
            const F16WgKernel kernel = f16_kernel_ready<K, N, decltype(res_tag)::value>();
            if (!kernel) return false;
            DFLASH_LAUNCH_PDL(dflash_pdl::gemm_kind(N), grid, block, kBytes, stream,
                              kernel)(F16GemmArgs{w, act, dst, nrows, k / kQk, row_bytes, ncols, stride_col_dst, res,
                                                  stride_col_res, split.full_tiles, split.pieces, partials});
            return true;
        };
        return res ? go(std::true_type{}) : go(std::false_type{});
    });
}

// The engine's stages: 3 (gemm_f16_wgmma.cu picks one warpgroup a block up to 32 columns, two
// above). A Q6_K stage of 64 columns is 46 KB with one warpgroup, 60 KB with two.
constexpr int kF16WgStages = 3;

// Halves of f16 activations for ncols columns of k values (wg_padded_columns(ncols) columns).
inline size_t f16_act_halves(int k, int ncols) { return (size_t)wg_padded_columns(ncols) * k; }

template <typename F, int S = kF16WgStages, int WG = 1, int MB = 1>
WgSplit f16_wgmma_split_for(int nrows, int k, int ncols, int nsm) {
    return f16_split_for<F16WgForm<F, S, WG, MB>>(nrows, k, ncols, nsm);
}

template <typename F, int S = kF16WgStages, int WG = 1, int MB = 1>
bool f16_wgmma_ready(int ncols, bool with_res) {
    return f16_ready<F16WgForm<F, S, WG, MB>>(ncols, with_res);
}

template <typename F, int S = kF16WgStages, int WG = 1, int MB = 1>
bool launch_f16_wgmma(const char * w, const __half * act, float * dst, int nrows, int k, int64_t row_bytes, int ncols,
                      int stride_col_dst, cudaStream_t stream, const float * res = nullptr, int stride_col_res = 0,
                      WgSplit split = {}, float * partials = nullptr) {
    return f16_launch<F16WgForm<F, S, WG, MB>>(w, act, dst, nrows, k, row_bytes, ncols, stride_col_dst, stream, res,
                                               stride_col_res, split, partials);
}

}  // namespace gemm_kq
