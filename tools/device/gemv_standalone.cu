// ggml_ext's quantized GEMV (ggml_ext/kernels/gemv_kquant_impl.cuh) on its own, without building
// ggml: correctness against a host reference of the formats (ggml's dequantize_row_q4_K / _q5_K /
// _q6_K / _q8_0 formulas, activations quantized by the q8_1 rule) for every layout, and bandwidth per layout
// and column count on the 27B's shapes. For tuning on the GPU machine when a whole build does not
// fit the device time. Build: see tools/device/gemv_standalone.sh. Output: one JSON object per
// line on stdout; "check" lines carry max |gpu - ref| / max |ref|. It also builds for the CPU
// emulator (ggml_ext/emu, -DDFLASH_CUDA_EMU), where tests/test_cuda_emu.py runs its checks.
#include "gemm_kquant_mma_impl.cuh"
#include "gemm_q4k_wgmma.cuh"
#include "gemm_q4k_wgmma_ws.cuh"
#include "gemm_f16_wgmma.cuh"
#include "gemm_f16_wgmma_ws.cuh"
#include "gemv_kquant_impl.cuh"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <type_traits>
#include <tuple>
#include <vector>

#define CK(x)                                                                                             \
    do {                                                                                                  \
        cudaError_t e_ = (x);                                                                             \
        if (e_ != cudaSuccess) {                                                                          \
            std::fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
            std::exit(1);                                                                                 \
        }                                                                                                 \
    } while (0)

namespace {

float half_to_float(uint16_t h) { return __half2float(__ushort_as_half(h)); }

uint16_t float_to_half(float f) { return __half_as_ushort(__float2half(f)); }

// Columns of k floats, k apart, as a quantizer's source.
ActSource act_floats(const float * x, int k) {
    ActSource s;
    s.x = x;
    s.sx = k;
    return s;
}

// The weight types of the GEMV; the tensor-core GEMM takes Q4_K and Q6_K.
enum class W { q4_K, q5_K, q6_K, q8_0 };

const char * type_name(W t) { return t == W::q4_K ? "q4_K" : t == W::q5_K ? "q5_K" : t == W::q6_K ? "q6_K" : "q8_0"; }

int superblock_bytes(W t) { return t == W::q4_K ? 144 : t == W::q5_K ? 176 : t == W::q6_K ? 210 : 8 * 34; }

// Random valid blocks: any bit pattern is a valid quant; the fp16 scales are kept small.
std::vector<uint8_t> random_rows(W t, int rows, int k, std::mt19937 & gen) {
    const int bs = superblock_bytes(t), nb = k / 256;
    std::vector<uint8_t> w((size_t)rows * nb * bs);
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> scale(0.002f, 0.02f);
    for (auto & b : w) b = (uint8_t)byte(gen);
    auto put = [](uint8_t * p, float v) {
        const uint16_t h = float_to_half(v);
        std::memcpy(p, &h, 2);
    };
    for (size_t blk = 0; blk < (size_t)rows * nb; ++blk) {
        uint8_t * p = w.data() + blk * bs;
        if (t == W::q4_K || t == W::q5_K) {
            put(p, scale(gen));
            put(p + 2, scale(gen));
        } else if (t == W::q6_K) {
            put(p + 208, 0.1f * scale(gen));
        } else {
            for (int m = 0; m < 8; ++m) put(p + 34 * m, 0.1f * scale(gen));
        }
    }
    return w;
}

void scale_min_k4(int j, const uint8_t * q, int & d, int & m) {
    if (j < 4) {
        d = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
    }
}

void dequant_row(W t, const uint8_t * row, int k, float * y) {
    for (int kb = 0; kb < k / 256; ++kb) {
        float * o = y + kb * 256;
        if (t == W::q8_0) {
            for (int m = 0; m < 8; ++m) {
                const uint8_t * b = row + kb * 272 + 34 * m;
                uint16_t hd;
                std::memcpy(&hd, b, 2);
                for (int l = 0; l < 32; ++l) o[32 * m + l] = half_to_float(hd) * (float)(int8_t)b[2 + l];
            }
        } else if (t == W::q4_K || t == W::q5_K) {  // Q5_K: Q4_K with qh[32], the fifth bits
            const bool five = t == W::q5_K;
            const uint8_t * b = row + kb * (five ? 176 : 144);
            uint16_t hd, hm;
            std::memcpy(&hd, b, 2);
            std::memcpy(&hm, b + 2, 2);
            const float d = half_to_float(hd), dmin = half_to_float(hm);
            const uint8_t * qh = b + 16;
            const uint8_t * q = b + (five ? 48 : 16);
            // value l of sub-block j: a nibble of q, plus 16 x bit j of qh[l] for Q5_K
            auto fifth = [&](int j, int l) { return five ? ((qh[l] >> j) & 1) * 16 : 0; };
            for (int c = 0; c < 4; ++c) {
                int sc, m;
                scale_min_k4(2 * c, b + 4, sc, m);
                for (int l = 0; l < 32; ++l)
                    o[64 * c + l] = d * sc * ((q[32 * c + l] & 0xF) + fifth(2 * c, l)) - dmin * m;
                scale_min_k4(2 * c + 1, b + 4, sc, m);
                for (int l = 0; l < 32; ++l) {
                    o[64 * c + 32 + l] = d * sc * ((q[32 * c + l] >> 4) + fifth(2 * c + 1, l)) - dmin * m;
                }
            }
        } else {
            const uint8_t * b = row + kb * 210;
            uint16_t hd;
            std::memcpy(&hd, b + 208, 2);
            const float d = half_to_float(hd);
            for (int n = 0; n < 2; ++n) {
                const uint8_t * ql = b + 64 * n;
                const uint8_t * qh = b + 128 + 32 * n;
                const int8_t * sc = (const int8_t *)(b + 192 + 8 * n);
                for (int l = 0; l < 32; ++l) {
                    const int is = l / 16;
                    const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                    const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                    const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                    const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                    o[128 * n + l] = d * sc[is + 0] * q1;
                    o[128 * n + l + 32] = d * sc[is + 2] * q2;
                    o[128 * n + l + 64] = d * sc[is + 4] * q3;
                    o[128 * n + l + 96] = d * sc[is + 6] * q4;
                }
            }
        }
    }
}

// The activations as the kernels see them: int8 per value, d = max|x| / 127 per `group` values
// (32 for the GEMV and the Q8_0 tensor-core GEMM, 256 for the K-quant GEMM); per 32, d is kept
// rounded to half (q8_1).
std::vector<double> quantized(const std::vector<float> & x, int group = 32) {
    std::vector<double> q(x.size());
    for (size_t g = 0; g < x.size(); g += group) {
        float amax = 0.0f;
        for (int i = 0; i < group; ++i) amax = std::fmax(amax, std::fabs(x[g + i]));
        const float d = amax / 127.0f;
        const double d_kept = group == 32 ? (double)half_to_float(float_to_half(d)) : (double)d;
        for (int i = 0; i < group; ++i) q[g + i] = amax == 0.0f ? 0.0 : (double)std::roundf(x[g + i] / d) * d_kept;
    }
    return q;
}

// `copies` x `bytes` of weights on the device (more than the L2 together), from one random pattern.
char * weight_copies(W t, int rows, int k, size_t bytes, int copies, std::mt19937 & gen) {
    const auto w = random_rows(t, rows, std::min(k, 256 * 4), gen);  // a pattern, repeated
    char * dw = nullptr;
    CK(cudaMalloc(&dw, bytes * copies));
    for (size_t off = 0; off < bytes * copies; off += w.size()) {
        CK(cudaMemcpy(dw + off, w.data(), std::min(w.size(), bytes * copies - off), cudaMemcpyHostToDevice));
    }
    return dw;
}

// Microseconds per launch of `launches` back-to-back launches made by body(), CUDA events around.
template <typename F>
double time_us(int launches, F && body) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0));
    body();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return 1000.0 * ms / launches;
}

struct Dev {
    char * w = nullptr;
    char * w_gate = nullptr;
    float * x = nullptr;
    int8_t * yq = nullptr;
    float * yd = nullptr;
    float * bias = nullptr;
    float * dst = nullptr;
};

void run(W t, const GemvArgs & a, const GemvShape & s) {
    switch (t) {
        case W::q4_K:
            return gemv::launch_type<gemv::Q4K>(a, s, 0);
        case W::q5_K:
            return gemv::launch_type<gemv::Q5K>(a, s, 0);
        case W::q6_K:
            return gemv::launch_type<gemv::Q6K>(a, s, 0);
        case W::q8_0:
            return gemv::launch_type<gemv::Q80>(a, s, 0);
    }
}

GemvArgs args_for(const Dev & d, int rows, int k, int ncols, bool gated, bool bias, int64_t row_bytes) {
    GemvArgs a{};
    a.w = d.w;
    a.w_gate = gated ? d.w_gate : nullptr;
    a.yq = d.yq;
    a.yd = d.yd;
    a.bias = bias ? d.bias : nullptr;
    a.dst = d.dst;
    a.nrows = rows;
    a.k = k;
    a.k_pad = k;
    a.ncols = ncols;
    a.stride_col_dst = rows;
    a.row_bytes = row_bytes;
    return a;
}

// ncu: one launch each of the staged Q6_K GEMV at one column in the engine's layout (split 2, 2 rows
// a warp) with 2 and 3 stages, each with and without runs, on the 27B's ffn_down and GDN attn_qkv
// (profile_q6).
void profile_q6(std::mt19937 & gen) {
    for (const auto & [rows, k] : {std::pair{5120, 17408}, std::pair{10240, 5120}}) {
        const int64_t row_bytes = (int64_t)(k / 256) * superblock_bytes(W::q6_K);
        Dev d;
        d.w = weight_copies(W::q6_K, rows, k, (size_t)rows * row_bytes, 1, gen);
        CK(cudaMalloc(&d.yq, (size_t)k));
        CK(cudaMalloc(&d.yd, (size_t)k / 32 * 4));
        CK(cudaMalloc(&d.dst, (size_t)rows * 4));
        CK(cudaMalloc(&d.x, (size_t)k * 4));
        CK(cudaMemset(d.x, 0, (size_t)k * 4));
        DFLASH_LAUNCH(dim3(k / 256, 1, 1), 256, 0, nullptr, gemv::quantize_act_kernel)(act_floats(d.x, k), d.yq, d.yd,
                                                                                       k, k);
        for (int stages : {2, 3}) {
            for (bool spans : {false, true}) {
                run(W::q6_K, args_for(d, rows, k, 1, false, false, row_bytes), {2, 2, 2, true, stages, spans});
            }
        }
        CK(cudaDeviceSynchronize());
        for (void * q : {(void *)d.w, (void *)d.yq, (void *)d.yd, (void *)d.dst, (void *)d.x}) cudaFree(q);
    }
}

// One shape: every layout x column count, gated and bias forms for one column; max relative error.
void check(W t, int rows, int k, std::mt19937 & gen) {
    const int64_t row_bytes = (int64_t)(k / 256) * superblock_bytes(t);
    const auto w = random_rows(t, rows, k, gen), wg = random_rows(t, rows, k, gen);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int ncols_max = kGemvMaxColumns;
    std::vector<float> x((size_t)ncols_max * k), bias((size_t)ncols_max * rows);
    for (auto & v : x) v = normal(gen);
    for (auto & v : bias) v = normal(gen);
    // host reference
    std::vector<float> wf((size_t)rows * k), wgf((size_t)rows * k);
    for (int r = 0; r < rows; ++r) {
        dequant_row(t, w.data() + r * row_bytes, k, wf.data() + (size_t)r * k);
        dequant_row(t, wg.data() + r * row_bytes, k, wgf.data() + (size_t)r * k);
    }
    std::vector<double> ref((size_t)ncols_max * rows), ref_gate((size_t)ncols_max * rows);
    for (int j = 0; j < ncols_max; ++j) {
        const std::vector<float> xj(x.begin() + (size_t)j * k, x.begin() + (size_t)(j + 1) * k);
        const auto q = quantized(xj);
        for (int r = 0; r < rows; ++r) {
            double s = 0, sg = 0;
            for (int i = 0; i < k; ++i) {
                s += (double)wf[(size_t)r * k + i] * q[i];
                sg += (double)wgf[(size_t)r * k + i] * q[i];
            }
            ref[(size_t)j * rows + r] = s;
            ref_gate[(size_t)j * rows + r] = sg;
        }
    }
    Dev d;
    CK(cudaMalloc(&d.w, w.size()));
    CK(cudaMalloc(&d.w_gate, wg.size()));
    CK(cudaMalloc(&d.x, x.size() * 4));
    CK(cudaMalloc(&d.yq, x.size()));
    CK(cudaMalloc(&d.yd, x.size() / 32 * 4));
    CK(cudaMalloc(&d.bias, bias.size() * 4));
    CK(cudaMalloc(&d.dst, bias.size() * 4));
    CK(cudaMemcpy(d.w, w.data(), w.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.w_gate, wg.data(), wg.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.x, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.bias, bias.data(), bias.size() * 4, cudaMemcpyHostToDevice));
    DFLASH_LAUNCH(dim3(k / 256, ncols_max, 1), 256, 0, nullptr, gemv::quantize_act_kernel)(act_floats(d.x, k), d.yq,
                                                                                           d.yd, k, k);
    CK(cudaGetLastError());
    double ref_max = 0;
    for (double v : ref) ref_max = std::fmax(ref_max, std::fabs(v));
    std::vector<float> got(bias.size()), one(rows);
    for (int split : {1, 2, 4}) {
        for (int rpw : {1, 2}) {
            const GemvShape s{split, rpw};
            // all columns, against the reference; then column j alone must give the same bits
            double err = 0;
            bool invariant = true;
            for (int n : {1, 3, 8}) {
                CK(cudaMemset(d.dst, 0, bias.size() * 4));
                run(t, args_for(d, rows, k, n, false, false, row_bytes), s);
                CK(cudaMemcpy(got.data(), d.dst, (size_t)n * rows * 4, cudaMemcpyDeviceToHost));
                for (size_t i = 0; i < (size_t)n * rows; ++i) err = std::fmax(err, std::fabs(got[i] - ref[i]));
                if (n == 8) {
                    std::vector<float> all(got.begin(), got.begin() + (size_t)8 * rows);
                    for (int j : {0, 5, 7}) {
                        for (int unroll : {2, 4}) {  // one column, either depth in flight: the same bits
                            GemvArgs a = args_for(d, rows, k, 1, false, false, row_bytes);
                            a.yq = d.yq + (size_t)j * k;
                            a.yd = d.yd + (size_t)j * k / 32;
                            run(t, a, GemvShape{split, rpw, unroll});
                            CK(cudaMemcpy(one.data(), d.dst, rows * 4, cudaMemcpyDeviceToHost));
                            invariant =
                                invariant && std::memcmp(one.data(), all.data() + (size_t)j * rows, rows * 4) == 0;
                        }
                    }
                }
            }
            // Q6_K through shared memory (GemvShape::staged): the same bits as the loads above
            bool staged_equal = true;
            if (t == W::q6_K) {
                for (int n : {1, 3, 8}) {
                    std::vector<float> plain((size_t)n * rows), staged((size_t)n * rows);
                    run(t, args_for(d, rows, k, n, false, true, row_bytes), s);
                    CK(cudaMemcpy(plain.data(), d.dst, plain.size() * 4, cudaMemcpyDeviceToHost));
                    CK(cudaMemset(d.dst, 0, bias.size() * 4));
                    run(t, args_for(d, rows, k, n, false, true, row_bytes), GemvShape{split, rpw, 2, true});
                    CK(cudaMemcpy(staged.data(), d.dst, staged.size() * 4, cudaMemcpyDeviceToHost));
                    staged_equal = staged_equal && std::memcmp(plain.data(), staged.data(), plain.size() * 4) == 0;
                    // and at one column with three stages (two groups of copies in flight), each
                    // with its blocks copied as runs of chunks (GemvShape::q6k_spans)
                    for (int form = 0; n == 1 && form < 3; ++form) {
                        CK(cudaMemset(d.dst, 0, bias.size() * 4));
                        const GemvShape f{split, rpw, 2, true, form == 1 ? 2 : 3, form > 0};
                        run(t, args_for(d, rows, k, n, false, true, row_bytes), f);
                        CK(cudaMemcpy(staged.data(), d.dst, staged.size() * 4, cudaMemcpyDeviceToHost));
                        staged_equal = staged_equal && std::memcmp(plain.data(), staged.data(), plain.size() * 4) == 0;
                    }
                }
            }
            // fused forms, one column: (up + bias) * silu(gate), and up + bias
            double err_fused = 0;
            for (int form = 0; form < 2; ++form) {
                const bool gated = form == 0;
                run(t, args_for(d, rows, k, 1, gated, true, row_bytes), s);
                CK(cudaMemcpy(got.data(), d.dst, rows * 4, cudaMemcpyDeviceToHost));
                for (int r = 0; r < rows; ++r) {
                    double want = ref[r] + bias[r];
                    if (gated) want *= ref_gate[r] / (1.0 + std::exp(-ref_gate[r]));
                    err_fused = std::fmax(err_fused, std::fabs(got[r] - want) / (1.0 + std::fabs(want)));
                }
            }
            std::printf(
                "{\"check\": \"%s\", \"rows\": %d, \"k\": %d, \"split\": %d, \"rows_per_warp\": %d, "
                "\"rel_err\": %.3g, \"fused_err\": %.3g, \"columns_bit_equal\": %s, \"staged_bit_equal\": %s, "
                "\"ok\": %s}\n",
                type_name(t), rows, k, split, rpw, err / ref_max, err_fused, invariant ? "true" : "false",
                staged_equal ? "true" : "false",
                err / ref_max <= 1e-4 && err_fused <= 1e-3 && invariant && staged_equal ? "true" : "false");
        }
    }
    cudaFree(d.w);
    cudaFree(d.w_gate);
    cudaFree(d.x);
    cudaFree(d.yq);
    cudaFree(d.yd);
    cudaFree(d.bias);
    cudaFree(d.dst);
}

// Bandwidth: enough copies of the weights to exceed the L2 several times; products back to back.
void bench(const char * name, W t, int rows, int k, std::mt19937 & gen) {
    const int64_t row_bytes = (int64_t)(k / 256) * superblock_bytes(t);
    const size_t bytes = (size_t)rows * row_bytes;
    const int copies = (int)std::max<size_t>(2, (size_t)(400u << 20) / bytes + 1);
    char * dw = weight_copies(t, rows, k, bytes, copies, gen);
    Dev d;
    CK(cudaMalloc(&d.yq, (size_t)8 * k));
    CK(cudaMalloc(&d.yd, (size_t)8 * k / 32 * 4));
    CK(cudaMalloc(&d.dst, (size_t)8 * rows * 4));
    CK(cudaMalloc(&d.x, (size_t)8 * k * 4));
    CK(cudaMemset(d.x, 0, (size_t)8 * k * 4));
    DFLASH_LAUNCH(dim3(k / 256, 8, 1), 256, 0, nullptr, gemv::quantize_act_kernel)(act_floats(d.x, k), d.yq, d.yd, k,
                                                                                   k);
    for (int split : {1, 2, 4}) {
        for (int rpw : {1, 2}) {
            // -1: one column with 4 super-blocks in flight; 101, 102, 108: Q6_K staged, 1/2/8 columns;
            // 301: staged with 3 stages, one column (DFLASH_GEMV_Q6K_STAGES=3); 501, 701: 2 and 3
            // stages, one column, the blocks copied as runs (DFLASH_GEMV_Q6K_SPANS=1)
            for (int nu : {1, 2, 4, 8, -1, 101, 102, 108, 301, 501, 701}) {
                if (nu > 100 && t != W::q6_K) continue;
                const int n = nu < 0 ? 1 : nu % 100, unroll = nu < 0 ? 4 : 2;
                const GemvShape s{split, rpw, unroll, nu > 100, nu == 301 || nu == 701 ? 3 : 2, nu > 500};
                GemvArgs a = args_for(d, rows, k, n, false, false, row_bytes);
                const int reps = 5;
                for (int c = 0; c < copies; ++c) {  // warm-up
                    a.w = dw + bytes * c;
                    run(t, a, s);
                }
                const double us = time_us(reps * copies, [&] {
                    for (int i = 0; i < reps; ++i) {
                        for (int c = 0; c < copies; ++c) {
                            a.w = dw + bytes * c;
                            run(t, a, s);
                        }
                    }
                });
                std::printf(
                    "{\"bench\": \"%s\", \"type\": \"%s\", \"rows\": %d, \"k\": %d, \"n\": %d, \"split\": %d, "
                    "\"rows_per_warp\": %d, \"unroll\": %d, \"staged\": %s, \"stages\": %d, \"spans\": %s, "
                    "\"us\": %.2f, \"GBps\": %.0f}\n",
                    name, type_name(t), rows, k, n, split, rpw, unroll, s.staged ? "true" : "false", s.q6k_stages,
                    s.q6k_spans ? "true" : "false", us, bytes / us / 1e3);
            }
        }
    }
    // the activation quantization, one column
    const double us_quantize = time_us(100, [&] {
        for (int i = 0; i < 100; ++i) {
            DFLASH_LAUNCH(dim3(k / 256, 1, 1), 256, 0, nullptr, gemv::quantize_act_kernel)(act_floats(d.x, k), d.yq,
                                                                                           d.yd, k, k);
        }
    });
    std::printf("{\"bench\": \"quantize\", \"k\": %d, \"us\": %.2f}\n", k, us_quantize);
    cudaFree(dw);
    cudaFree(d.yq);
    cudaFree(d.yd);
    cudaFree(d.dst);
    cudaFree(d.x);
}

struct MmaBuffers {
    int8_t * yq = nullptr;
    float * yd = nullptr;
    int * ysum = nullptr;
    float * x = nullptr;
    float * dst = nullptr;
    void alloc(int k, int ncols, int rows) {
        const int np = std::max(16, gemm_kq::padded_columns(ncols));  // 16: the wgmma form's least
        CK(cudaMalloc(&yq, (size_t)np * k));
        CK(cudaMalloc(&yd, (size_t)np * k / 32 * 4));  // per 256 values (per 32: Q8_0)
        CK(cudaMalloc(&ysum, (size_t)np * k / 32 * 4));
        CK(cudaMalloc(&x, (size_t)ncols * k * 4));
        CK(cudaMalloc(&dst, (size_t)ncols * rows * 4));
    }
    // In the layout of type t's GEMM (gemm_kq::quantize_act<F>), from x or from src.
    void quantize(W t, int k, int ncols, const ActSource * src = nullptr) {
        const ActSource a = src ? *src : act_floats(x, k);
        if (t == W::q6_K) {
            gemm_kq::quantize_act<gemm_kq::Q6K>(a, yq, yd, ysum, k, ncols, nullptr);
        } else if (t == W::q8_0) {
            gemm_kq::quantize_act<gemm_kq::Q80>(a, yq, yd, ysum, k, ncols, nullptr);
        } else {
            gemm_kq::quantize_act<gemm_kq::Q4K>(a, yq, yd, ysum, k, ncols, nullptr);
        }
        CK(cudaGetLastError());
    }
    void free_all() {
        cudaFree(yq);
        cudaFree(yd);
        cudaFree(ysum);
        cudaFree(x);
        cudaFree(dst);
    }
};

// Whether F's pipeline of 2 stages fits W warps a block (gemm_kq::fit_stages).
template <typename F, int W>
constexpr bool warps_fit() {
    return gemm_kq::fit_stages<F, W>(2) == 2;
}

// Q6_K on 8 warps a block, its stages in dynamic shared memory (the engine's DFLASH_MMA_Q6K_LONG_8:
// 1 with the occupancy hint, 3 blocks a multiprocessor; 2 without).
void run_q6k_8_warps(bool occupancy, const char * w, const MmaBuffers & b, int rows, int k, int64_t row_bytes,
                     int ncols) {
    if (occupancy) {
        gemm_kq::launch<gemm_kq::Q6K, 2, true, 8, true, 1, false, true>(w, b.yq, b.yd, b.ysum, b.dst, rows, k,
                                                                        row_bytes, ncols, rows, 0);
    } else {
        gemm_kq::launch<gemm_kq::Q6K, 2, false, 8, true, 1, false, true>(w, b.yq, b.yd, b.ysum, b.dst, rows, k,
                                                                         row_bytes, ncols, rows, 0);
    }
}

// The tensor-core GEMM with `stages` super-blocks in flight per warp (0: direct loads); with
// the occupancy hint (gemm_kq::min_blocks, the engine's) or without; 2 stages with the hint also
// with 6 or 8 warps a block (`warps`; the engine's for long rows); `own_rows`: 2 or 3 stages, each
// warp its own 16-row tile (the kernel's kSplitK false).
template <typename F>
void run_mma_t(int stages, bool occupancy, int warps, bool own_rows, bool two_tiles, const char * w,
               const MmaBuffers & b, int rows, int k, int64_t row_bytes, int ncols) {
    if (two_tiles) {  // the engine's for tall matrices: 2 row tiles a warp, 2 stages
        constexpr int kW = gemm_kq::fit_warps<F, gemm_kq::kWarps, 2>();
        gemm_kq::launch<F, 2, true, kW, true, 2>(w, b.yq, b.yd, b.ysum, b.dst, rows, k, row_bytes, ncols, rows, 0);
#if defined(GEMV_STANDALONE_SLIM)  // a binary small enough to carry: the engine's forms (2 stages; 8 warps)
    } else if (warps == 8) {
        if constexpr (warps_fit<F, 8>()) {
            gemm_kq::launch<F, 2, true, 8>(w, b.yq, b.yd, b.ysum, b.dst, rows, k, row_bytes, ncols, rows, 0);
        } else if constexpr (std::is_same_v<F, gemm_kq::Q6K>) {  // its stages in dynamic shared memory
            run_q6k_8_warps(occupancy, w, b, rows, k, row_bytes, ncols);
        }
    } else {
        gemm_kq::launch<F, 2>(w, b.yq, b.yd, b.ysum, b.dst, rows, k, row_bytes, ncols, rows, 0);
    }
    GGML_UNUSED(stages), GGML_UNUSED(occupancy), GGML_UNUSED(own_rows);
#else
    } else if (own_rows) {
        if (stages == 3) {
            gemm_kq::launch<F, 3, true, 4, false>(w, b.yq, b.yd, b.ysum, b.dst, rows, k, row_bytes, ncols, rows, 0);
        } else {
            gemm_kq::launch<F, 2, true, 4, false>(w, b.yq, b.yd, b.ysum, b.dst, rows, k, row_bytes, ncols, rows, 0);
        }
    } else if (warps == 8 || warps == 6) {
        if constexpr (warps_fit<F, 8>()) {
            if (warps == 8) {
                gemm_kq::launch<F, 2, true, 8>(w, b.yq, b.yd, b.ysum, b.dst, rows, k, row_bytes, ncols, rows, 0);
            }
        } else if constexpr (std::is_same_v<F, gemm_kq::Q6K>) {  // its stages in dynamic shared memory
            if (warps == 8) run_q6k_8_warps(occupancy, w, b, rows, k, row_bytes, ncols);
        }
        if constexpr (warps_fit<F, 6>()) {
            if (warps == 6) {
                gemm_kq::launch<F, 2, true, 6>(w, b.yq, b.yd, b.ysum, b.dst, rows, k, row_bytes, ncols, rows, 0);
            }
        }
    } else if (stages == 0) {
        gemm_kq::launch<F, 0>(w, b.yq, b.yd, b.ysum, b.dst, rows, k, row_bytes, ncols, rows, 0);
    } else if (stages == 3) {
        gemm_kq::launch<F, 3>(w, b.yq, b.yd, b.ysum, b.dst, rows, k, row_bytes, ncols, rows, 0);
    } else if (occupancy) {
        gemm_kq::launch<F, 2>(w, b.yq, b.yd, b.ysum, b.dst, rows, k, row_bytes, ncols, rows, 0);
    } else {
        gemm_kq::launch<F, 2, false>(w, b.yq, b.yd, b.ysum, b.dst, rows, k, row_bytes, ncols, rows, 0);
    }
#endif
    CK(cudaGetLastError());
}

// The stage count a request runs with (gemm_kq::launch fits the pipeline into shared memory).
int stages_run(W t, int code) {
    const int s = code % 100;
    if (s == 0) return 0;
    switch (t) {
        case W::q8_0:
            return gemm_kq::fit_stages<gemm_kq::Q80>(s);
        case W::q5_K:
            return gemm_kq::fit_stages<gemm_kq::Q5K>(s);
        case W::q6_K:
            return gemm_kq::fit_stages<gemm_kq::Q6K>(s);
        default:
            return gemm_kq::fit_stages<gemm_kq::Q4K>(s);
    }
}

// A variant's code: stages (0, 2 or 3) + 100 for Q4_K / Q5_K's min term through an f16 mma
// (gemm_kq::Q4KMinsMma, Q5KMinsMma) + 1000 without the occupancy hint + 10000 for 8 warps a
// block, 20000 for 6 (2 stages, the hint) + 100000 for each warp its own rows (4 warps, 2 or 3
// stages, the hint) + 1000000 for 2 row tiles a warp (2 stages, the hint; 4 warps, 2 for Q6_K and
// Q8_0: gemm_kq::fit_warps). The engine's: 102 for Q4_K / Q5_K, 2 for Q6_K / Q8_0; rows of
// gemm_kq::kLongRowBlocks or more up to 16 columns: 10102 for Q4_K / Q5_K (10002 for Q6_K, its stages in
// dynamic shared memory: DFLASH_MMA_Q6K_LONG_8=1; 11002 without the hint: =2); tall matrices 1000102
// for Q4_K / Q5_K, 1000002 for Q6_K / Q8_0.
bool code_two_tiles(int code) { return code >= 1000000; }

int code_warps(W t, int code) {
    if (code_two_tiles(code)) {
        switch (t) {
            case W::q8_0:
                return gemm_kq::fit_warps<gemm_kq::Q80, 4, 2>();
            case W::q6_K:
                return gemm_kq::fit_warps<gemm_kq::Q6K, 4, 2>();
            case W::q5_K:
                return gemm_kq::fit_warps<gemm_kq::Q5K, 4, 2>();
            default:
                return gemm_kq::fit_warps<gemm_kq::Q4K, 4, 2>();
        }
    }
    const int c = code % 100000;
    return c >= 20000 ? 6 : c >= 10000 ? 8 : 4;
}

bool code_own_rows(int code) { return code >= 100000 && !code_two_tiles(code); }

void run_mma(W t, int code, const char * w, const MmaBuffers & b, int rows, int k, int64_t row_bytes, int ncols) {
    const int stages = code % 100, warps = code_warps(t, code);
    const bool mins_mma = code % 1000 >= 100, occupancy = code % 10000 < 1000, own = code_own_rows(code);
    const bool two = code_two_tiles(code);
    if (t == W::q4_K && mins_mma) {
        run_mma_t<gemm_kq::Q4KMinsMma>(stages, occupancy, warps, own, two, w, b, rows, k, row_bytes, ncols);
#if !defined(GEMV_STANDALONE_SLIM)
    } else if (t == W::q4_K) {
        run_mma_t<gemm_kq::Q4K>(stages, occupancy, warps, own, two, w, b, rows, k, row_bytes, ncols);
    } else if (t == W::q5_K && mins_mma) {
        run_mma_t<gemm_kq::Q5KMinsMma>(stages, occupancy, warps, own, two, w, b, rows, k, row_bytes, ncols);
    } else if (t == W::q5_K) {
        run_mma_t<gemm_kq::Q5K>(stages, occupancy, warps, own, two, w, b, rows, k, row_bytes, ncols);
#endif
    } else if (t == W::q8_0) {
        run_mma_t<gemm_kq::Q80>(stages, occupancy, warps, own, two, w, b, rows, k, row_bytes, ncols);
    } else {
        run_mma_t<gemm_kq::Q6K>(stages, occupancy, warps, own, two, w, b, rows, k, row_bytes, ncols);
    }
}

constexpr int kMmaCodes[] = {0,     2,     3,     1002,   102,    103,    1102,   10102,   10002,
                             11002, 20102, 20002, 100002, 100003, 100102, 100103, 1000002, 1000102};

bool mins_mma_code(int code) { return code % 1000 >= 100; }

// Whether type t runs code: the f16 min term is Q4_K's and Q5_K's; 6 or 8 warps where 2 stages fit.
bool code_runs(W t, int code) {
#if defined(GEMV_STANDALONE_SLIM)
    if (t == W::q5_K || (t == W::q4_K && !mins_mma_code(code))) return false;
#endif
    if (t != W::q4_K && t != W::q5_K && mins_mma_code(code)) return false;
    if ((code == 10002 || code == 11002) && t != W::q6_K) return false;  // 8 warps, no f16 min term: Q6_K's
    if (code_two_tiles(code)) return true;
    const int warps = code_warps(t, code);
    if (warps == 4) return true;
    switch (t) {
        case W::q8_0:
            return warps == 8 ? warps_fit<gemm_kq::Q80, 8>() : warps_fit<gemm_kq::Q80, 6>();
        case W::q6_K:  // 8 warps: the stages in dynamic shared memory (the engine's DFLASH_MMA_Q6K_LONG_8)
            return warps == 8 || warps_fit<gemm_kq::Q6K, 6>();
        case W::q5_K:
            return warps == 8 ? warps_fit<gemm_kq::Q5K, 8>() : warps_fit<gemm_kq::Q5K, 6>();
        default:
            return warps == 8 ? warps_fit<gemm_kq::Q4K, 8>() : warps_fit<gemm_kq::Q4K, 6>();
    }
}

// The engine's default launch with a residual (kRes, ggml's mul_mat + add fused, patches/0008):
// its outputs must be the plain launch's plus the residual, bit for bit (one float addition).
template <typename F>
bool residual_is_added(const char * w, const MmaBuffers & b, int rows, int k, int64_t row_bytes, int ncols,
                       std::mt19937 & gen) {
    const size_t n = (size_t)ncols * rows;
    std::vector<float> res(n), plain(n), fused(n);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto & v : res) v = normal(gen);
    float *dres = nullptr, *dout = nullptr;
    CK(cudaMalloc(&dres, n * 4));
    CK(cudaMalloc(&dout, n * 4));
    CK(cudaMemcpy(dres, res.data(), n * 4, cudaMemcpyHostToDevice));
    gemm_kq::launch<F, 2>(w, b.yq, b.yd, b.ysum, b.dst, rows, k, row_bytes, ncols, rows, 0);
    gemm_kq::launch<F, 2, true, gemm_kq::kWarps, true, 1, true>(w, b.yq, b.yd, b.ysum, dout, rows, k, row_bytes, ncols,
                                                                rows, 0, dres, rows);
    CK(cudaGetLastError());
    CK(cudaMemcpy(plain.data(), b.dst, n * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(fused.data(), dout, n * 4, cudaMemcpyDeviceToHost));
    cudaFree(dres);
    cudaFree(dout);
    for (size_t i = 0; i < n; ++i) {
        const float want = plain[i] + res[i];
        if (std::memcmp(&want, &fused[i], 4) != 0) return false;
    }
    return true;
}

// ref (ncols x rows, column-major like dst) = the columns of x (ncols x k) quantized per `group`
// values (quantized()) times the dequantized rows wf (rows x k), in double; returns max |ref|.
double reference_products(const std::vector<float> & wf, const std::vector<float> & x, int rows, int k, int ncols,
                          int group, std::vector<double> & ref) {
    ref.assign((size_t)ncols * rows, 0.0);
    double ref_max = 0;
    for (int j = 0; j < ncols; ++j) {
        const auto q = quantized(std::vector<float>(x.begin() + (size_t)j * k, x.begin() + (size_t)(j + 1) * k), group);
        for (int r = 0; r < rows; ++r) {
            double s = 0;
            for (int i = 0; i < k; ++i) s += (double)wf[(size_t)r * k + i] * q[i];
            ref[(size_t)j * rows + r] = s;
            ref_max = std::fmax(ref_max, std::fabs(s));
        }
    }
    return ref_max;
}

// The GEMM's activation quantizer (quantize_act_k_kernel) against a host reference of its rule,
// byte for byte: per kBlock values and column d = max |x| / 127 (a half for Q8_0's 32), q =
// round(x / d), the sums per 32 (ints; kWgmma's as halves), at the places the layout's index names; for each layout
// (Q4_K's kRun, Q6_K's kHalves, Q8_0's kHalves per 32, the wgmma form's kWgmma), both forms (a
// value a thread, a super-block a warp), 2..64 columns and 1..9 super-blocks (a grid block's 8
// super-blocks and a part). L2 != L: the bytes also in layout L2, from the same launch (the
// quantizer of a pair of products, rms_norm_fusion.cu).
template <gemm_kq::ActLayout L, int kBlock, int V, gemm_kq::ActLayout L2 = L>
bool quantize_bytes_match(int k, int ncols, std::mt19937 & gen) {
    const int np = std::max(L == gemm_kq::ActLayout::kWgmma ? 16 : 8, gemm_kq::padded_columns(ncols));
    const int nt = np / 8, nkb = k / 256;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x((size_t)ncols * k);
    for (auto & v : x) v = normal(gen) * std::exp2(std::uniform_int_distribution<int>(-4, 4)(gen));
    if (ncols > 1) std::fill(x.begin() + k, x.begin() + k + 256, 0.0f);  // an all-zero block: d = 0, q = 0
    MmaBuffers b;
    b.alloc(k, ncols, 1);
    CK(cudaMemcpy(b.x, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    int8_t * yq2 = nullptr;
    if (L2 != L) CK(cudaMalloc(&yq2, (size_t)np * k));
    DFLASH_LAUNCH(gemm_kq::quantize_act_grid(k, np, V), 256, 0, nullptr,
                  gemm_kq::quantize_act_k_kernel<L, kBlock, V, L2>)(gemm_kq::with_runs16(act_floats(b.x, k)), b.yq,
                                                                    b.yd, b.ysum, k, ncols, nt, yq2);
    CK(cudaDeviceSynchronize());
    std::vector<int8_t> q((size_t)np * k), q2(L2 != L ? (size_t)np * k : 0);
    if (yq2) {
        CK(cudaMemcpy(q2.data(), yq2, q2.size(), cudaMemcpyDeviceToHost));
        cudaFree(yq2);
    }
    std::vector<float> dv((size_t)np * k / 32);
    std::vector<int> sv((size_t)np * k / 32);
    CK(cudaMemcpy(q.data(), b.yq, q.size(), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(dv.data(), b.yd, dv.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(sv.data(), b.ysum, sv.size() * 4, cudaMemcpyDeviceToHost));
    b.free_all();
    bool ok = true;
    for (int col = 0; col < np; ++col) {
        for (int kb = 0; kb < nkb; ++kb) {
            auto value = [&](int j, int v) { return col < ncols ? x[(size_t)col * k + kb * 256 + 32 * j + v] : 0.0f; };
            for (int j = 0; j < 8; ++j) {
                float amax = 0.0f;
                for (int jj = kBlock == 256 ? 0 : j; jj < (kBlock == 256 ? 8 : j + 1); ++jj) {
                    for (int v = 0; v < 32; ++v) amax = std::fmax(amax, std::fabs(value(jj, v)));
                }
                const float dd = amax / 127.0f;
                int sum = 0;
                for (int v = 0; v < 32; ++v) {
                    const int qv = amax == 0.0f ? 0 : (int)std::roundf(value(j, v) / dd);
                    ok &= q[L == gemm_kq::ActLayout::kWgmma ? gemm_kq::wg_act_index(kb, j, v, col, np)
                                                            : gemm_kq::act_q_index<L>(kb, j, v, col, nt)] == qv;
                    if (L2 != L) ok &= q2[gemm_kq::act_q_index<L2>(kb, j, v, col, nt)] == qv;
                    sum += qv;
                }
                // the wgmma layout's sums are halves (act_sum_index)
                const int64_t si = gemm_kq::act_sum_index(kb, col, nt) + j;
                ok &= L == gemm_kq::ActLayout::kWgmma
                          ? reinterpret_cast<const uint16_t *>(sv.data())[si] == float_to_half((float)sum)
                          : sv[si] == sum;
                if (kBlock == 32)
                    ok &= dv[gemm_kq::act_d_index(8 * kb + j, col, nt)] == half_to_float(float_to_half(dd));
                if (kBlock == 256 && j == 0) ok &= dv[gemm_kq::act_d_index(kb, col, nt)] == dd;
            }
        }
    }
    return ok;
}

// Each with the float4 loads of runs of 4 values (ActSource::runs16, the default) and without.
void check_quantize_bytes(std::mt19937 & gen) {
    using gemm_kq::ActLayout;
    bool ok = true;
    int shape = 0;  // a third of the shapes without
    for (int nkb : {1, 3, 9}) {
        for (int ncols : {2, 9, 23, 64}) {
            gemm_kq::quantize_runs16_flag() = shape++ % 3 != 0;
            ok &= quantize_bytes_match<ActLayout::kRun, 256, 1>(256 * nkb, ncols, gen);
            ok &= quantize_bytes_match<ActLayout::kHalves, 256, 1>(256 * nkb, ncols, gen);
            ok &= quantize_bytes_match<ActLayout::kHalves, 32, 1>(256 * nkb, ncols, gen);
            ok &= quantize_bytes_match<ActLayout::kWgmma, 256, 1>(256 * nkb, ncols, gen);
            ok &= quantize_bytes_match<ActLayout::kRun, 256, 8>(256 * nkb, ncols, gen);
            ok &= quantize_bytes_match<ActLayout::kHalves, 256, 8>(256 * nkb, ncols, gen);
            ok &= quantize_bytes_match<ActLayout::kHalves, 32, 8>(256 * nkb, ncols, gen);
            ok &= quantize_bytes_match<ActLayout::kWgmma, 256, 8>(256 * nkb, ncols, gen);
        }
    }
    std::printf("{\"check_quantize_bytes\": \"all layouts\", \"ok\": %s}\n", ok ? "true" : "false");
    ok = true;  // both layouts of a pair (Q4_K's and Q6_K's) from one launch, either one first
    for (int nkb : {1, 9}) {
        for (int ncols : {2, 23, 64}) {
            gemm_kq::quantize_runs16_flag() = shape++ % 3 != 0;
            ok &= quantize_bytes_match<ActLayout::kRun, 256, 1, ActLayout::kHalves>(256 * nkb, ncols, gen);
            ok &= quantize_bytes_match<ActLayout::kRun, 256, 8, ActLayout::kHalves>(256 * nkb, ncols, gen);
            ok &= quantize_bytes_match<ActLayout::kHalves, 256, 8, ActLayout::kRun>(256 * nkb, ncols, gen);
            // the wgmma layout's core matrices beside the others (each half a 4-byte store)
            ok &= quantize_bytes_match<ActLayout::kRun, 256, 8, ActLayout::kWgmma>(256 * nkb, ncols, gen);
            ok &= quantize_bytes_match<ActLayout::kWgmma, 256, 8, ActLayout::kRun>(256 * nkb, ncols, gen);
            ok &= quantize_bytes_match<ActLayout::kWgmma, 256, 8, ActLayout::kHalves>(256 * nkb, ncols, gen);
        }
    }
    gemm_kq::quantize_runs16_flag() = true;
    std::printf("{\"check_quantize_bytes\": \"two layouts\", \"ok\": %s}\n", ok ? "true" : "false");
}

// The wgmma form's activations (ActLayout::kWgmma) hold the same quants, per-32 sums (as halves) and
// scales as Q4_K's tiled ones (kRun), at the places wg_act_index names: 2, 9, 23 and 64 columns, 3
// super-blocks.
void check_wgmma_layout(std::mt19937 & gen) {
    const int k = 768;
    bool ok = true;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int ncols : {2, 9, 23, 64}) {
        const int np = std::max(16, gemm_kq::padded_columns(ncols)), nt = np / 8;
        std::vector<float> x((size_t)ncols * k);
        for (auto & v : x) v = normal(gen);
        MmaBuffers run, wg;
        run.alloc(k, ncols, 1);
        wg.alloc(k, ncols, 1);
        for (MmaBuffers * b : {&run, &wg}) CK(cudaMemcpy(b->x, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
        // both with np columns (the wgmma form's least is 16)
        gemm_kq::launch_quantize_act<gemm_kq::ActLayout::kRun, 256>(act_floats(run.x, k), run.yq, run.yd, run.ysum, k,
                                                                    ncols, np, nullptr);
        gemm_kq::launch_quantize_act<gemm_kq::ActLayout::kWgmma, 256>(act_floats(wg.x, k), wg.yq, wg.yd, wg.ysum, k,
                                                                      ncols, np, nullptr);
        CK(cudaDeviceSynchronize());
        std::vector<int8_t> q_run((size_t)np * k), q_wg((size_t)np * k);
        std::vector<float> d_run((size_t)np * k / 256), d_wg(d_run.size());
        std::vector<int> s_run((size_t)np * k / 32), s_wg(s_run.size());
        CK(cudaMemcpy(q_run.data(), run.yq, q_run.size(), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(q_wg.data(), wg.yq, q_wg.size(), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(d_run.data(), run.yd, d_run.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(d_wg.data(), wg.yd, d_wg.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(s_run.data(), run.ysum, s_run.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(s_wg.data(), wg.ysum, s_wg.size() * 4, cudaMemcpyDeviceToHost));
        for (int kb = 0; kb < k / 256; ++kb) {
            for (int col = 0; col < np; ++col) {
                for (int j = 0; j < 8; ++j) {
                    for (int v = 0; v < 32; ++v) {
                        ok &= q_run[gemm_kq::act_q_index<gemm_kq::ActLayout::kRun>(kb, j, v, col, nt)] ==
                              q_wg[gemm_kq::wg_act_index(kb, j, v, col, np)];
                    }
                }
            }
        }
        ok &= d_run == d_wg;
        const auto * s_wg_halves = reinterpret_cast<const uint16_t *>(s_wg.data());  // act_sum_index
        for (size_t i = 0; i < s_run.size(); ++i) ok &= s_wg_halves[i] == float_to_half((float)s_run[i]);
        run.free_all();
        wg.free_all();
    }
    std::printf("{\"check_wgmma_layout\": \"q4_K\", \"ok\": %s}\n", ok ? "true" : "false");
}

// silu(a) * b into x (columns k apart; a and b columns s apart): the unfused SwiGLU node's output.
__global__ void swiglu_kernel(const float * a, const float * b, float * x, int k, int64_t s) {
    const int col = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < k) x[(int64_t)col * k + i] = ggml_cuda_op_silu_single(a[col * s + i]) * b[col * s + i];
}

template <typename T>
std::vector<T> to_host(const T * p, size_t n) {
    std::vector<T> v(n);
    CK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}

// Whether two GEMM quantizations of ncols columns of k values for type t hold the same bytes: the
// quants, the scales (per 256 values; per 32 for Q8_0) and the sums per 32.
bool same_quantized(const MmaBuffers & a, const MmaBuffers & b, W t, int k, int ncols) {
    CK(cudaDeviceSynchronize());
    const size_t np = gemm_kq::padded_columns(ncols), nq = np * k, ns = np * k / 32;
    const size_t nd = t == W::q8_0 ? ns : np * k / 256;
    return to_host(a.yq, nq) == to_host(b.yq, nq) && to_host(a.yd, nd) == to_host(b.yd, nd) &&
           to_host(a.ysum, ns) == to_host(b.ysum, ns);
}

// The quantizer's values a thread for a check of ncols columns: a value a thread below 24 columns
// (DFLASH_QUANT_V8_FROM=24, the engine's form there before session 36), 8 from 24 (the default
// everywhere now), so the checks of 5 and 40 columns cover both; the default back after.
struct ValuesPerThreadFor {
    explicit ValuesPerThreadFor(int ncols) { gemm_kq::quantize_v8_from() = ncols < 24 ? 24 : 8; }
    ~ValuesPerThreadFor() { gemm_kq::quantize_v8_from() = 8; }
};

// The quantizers reading a SwiGLU's inputs (act_source.cuh; glu_fusion.cu) write the bytes they
// write for the GLU's output: the GEMV's (k = 700: a tail in the last super-block) and the GEMM's
// layouts (Q4_K, Q6_K, Q8_0), 5 columns; gate and up are the halves of a [2k, 5] matrix (the
// stacked [gate; up] product), so their columns are 2k apart.
void check_swiglu_source(std::mt19937 & gen) {
    const int ncols = 5;
    const ValuesPerThreadFor values(ncols);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    for (const char * what : {"gemv", "q4_K", "q6_K", "q8_0"}) {
        const bool gemv = std::string(what) == "gemv";
        const int k = gemv ? 700 : 768, k_pad = (k + 255) / 256 * 256;
        std::vector<float> ab((size_t)ncols * 2 * k);
        for (auto & v : ab) v = normal(gen);
        float *d_ab = nullptr, *x = nullptr;
        CK(cudaMalloc(&d_ab, ab.size() * 4));
        CK(cudaMalloc(&x, (size_t)ncols * k * 4));
        CK(cudaMemcpy(d_ab, ab.data(), ab.size() * 4, cudaMemcpyHostToDevice));
        DFLASH_LAUNCH(dim3((k + 255) / 256, ncols, 1), 256, 0, nullptr, swiglu_kernel)(d_ab, d_ab + k, x, k, 2 * k);
        ActSource glu;
        glu.x = d_ab;
        glu.sx = 2 * k;
        glu.up = d_ab + k;
        glu.sup = 2 * k;
        bool ok = true;
        if (gemv) {
            int8_t *q0 = nullptr, *q1 = nullptr;
            float *d0 = nullptr, *d1 = nullptr;
            CK(cudaMalloc(&q0, (size_t)ncols * k_pad));
            CK(cudaMalloc(&q1, (size_t)ncols * k_pad));
            CK(cudaMalloc(&d0, (size_t)ncols * k_pad / 32 * 4));
            CK(cudaMalloc(&d1, (size_t)ncols * k_pad / 32 * 4));
            for (auto [src, q, d] : {std::tuple{act_floats(x, k), q0, d0}, std::tuple{glu, q1, d1}}) {
                DFLASH_LAUNCH(dim3(k_pad / 256, ncols, 1), 256, 0, nullptr, gemv::quantize_act_kernel)(src, q, d, k,
                                                                                                       k_pad);
            }
            CK(cudaDeviceSynchronize());
            ok = to_host(q0, (size_t)ncols * k_pad) == to_host(q1, (size_t)ncols * k_pad) &&
                 to_host(d0, (size_t)ncols * k_pad / 32) == to_host(d1, (size_t)ncols * k_pad / 32);
            for (void * p : {(void *)q0, (void *)q1, (void *)d0, (void *)d1}) cudaFree(p);
        } else {
            const W t = what[1] == '4' ? W::q4_K : what[1] == '6' ? W::q6_K : W::q8_0;
            MmaBuffers plain, fused;
            plain.alloc(k, ncols, 1);
            fused.alloc(k, ncols, 1);
            CK(cudaMemcpy(plain.x, x, (size_t)ncols * k * 4, cudaMemcpyDeviceToDevice));
            plain.quantize(t, k, ncols);
            fused.quantize(t, k, ncols, &glu);
            ok = same_quantized(plain, fused, t, k, ncols);
            plain.free_all();
            fused.free_all();
        }
        cudaFree(d_ab);
        cudaFree(x);
        std::printf("{\"check_swiglu_source\": \"%s\", \"ok\": %s}\n", what, ok ? "true" : "false");
    }
}

// ggml's rms_norm_f32<T, true> (norm.cu), one column a block: the unfused RMSNorm and weight
// node's output, the bits the quantizer reading the norm's input must reproduce.
template <int T>
__global__ void rms_norm_mul_kernel(const float * x, const float * w, float * dst, int k, float eps) {
    const int col = blockIdx.x, tid = threadIdx.x;
    x += (int64_t)col * k;
    dst += (int64_t)col * k;
    float tmp = 0.0f;
    for (int c = tid; c < k; c += T) {
        const float xi = x[c];
        tmp += xi * xi;
    }
    __shared__ float s_sum[32];
    tmp = warp_reduce_sum(tmp);
    if (tid % WARP_SIZE == 0) s_sum[tid / WARP_SIZE] = tmp;
    __syncthreads();
    tmp = warp_reduce_sum(tid % WARP_SIZE < T / WARP_SIZE ? s_sum[tid % WARP_SIZE] : 0.0f);
    const float mean = tmp / k;
    const float scale = rsqrtf(mean + eps);
    for (int c = tid; c < k; c += T) dst[c] = scale * x[c] * w[c];
}

// fused's quantizer of src writes plain's bytes, scales and sums, with the 16-byte loads of
// ActSource::runs16 (the default) and, where the launch would take them (8 values a thread, not a
// block a column), with a float a load (fused's bytes poisoned before each).
bool quantized_alike_both_loads(MmaBuffers & plain, MmaBuffers & fused, W t, int k, int ncols, const ActSource & src) {
    const bool loads_matter = gemm_kq::quantize_values_per_thread(gemm_kq::padded_columns(ncols)) == 8 &&
                              !gemm_kq::quantize_norm_column(src, k);
    bool ok = true;
    for (bool runs16 : {true, false}) {
        if (!runs16 && !loads_matter) break;
        gemm_kq::quantize_runs16_flag() = runs16;
        CK(cudaMemset(fused.yq, 0x55, (size_t)gemm_kq::padded_columns(ncols) * k));
        fused.quantize(t, k, ncols, &src);
        ok = ok && same_quantized(plain, fused, t, k, ncols);
    }
    gemm_kq::quantize_runs16_flag() = true;  // the default
    return ok;
}

// An RMSNorm source: columns of k floats at x, the norm's weight w, ggml's block for rows of k.
ActSource norm_source(const float * x, const float * w, int k, float eps) {
    ActSource s = act_floats(x, k);
    s.norm_w = w;
    s.norm_eps = eps;
    s.norm_threads = k < 1024 ? 256 : 1024;
    return s;
}

// The GEMM's quantizer reading an RMSNorm's input and weight (act_source.cuh's column_scale;
// rms_norm_fusion.cu) writes the bytes it writes for the norm node's output: ggml's 256-thread
// norm (k = 768) and its 1024-thread one (k = 2304; the 27B's 5120), 5 columns (a value a quantizer
// thread) and 40 (8 a thread), the Q4_K, Q6_K and Q8_0 layouts.
void check_rms_norm_source(std::mt19937 & gen) {
    std::normal_distribution<float> normal(0.0f, 2.0f);
    for (const auto & [what, k, ncols] :
         {std::tuple{"q4_K", 768, 5}, std::tuple{"q4_K", 2304, 5}, std::tuple{"q6_K", 2304, 5},
          std::tuple{"q8_0", 768, 5}, std::tuple{"q4_K", 768, 40}, std::tuple{"q4_K", 5120, 40},
          std::tuple{"q6_K", 5120, 5}, std::tuple{"q6_K", 2304, 40}}) {
        const W t = what[1] == '4' ? W::q4_K : what[1] == '6' ? W::q6_K : W::q8_0;
        const ValuesPerThreadFor values(ncols);
        std::vector<float> xs((size_t)ncols * k), ws(k);
        std::uniform_real_distribution<float> octaves(-6.0f, 6.0f);  // magnitudes far apart: the sum order shows
        for (auto & v : xs) v = normal(gen) * std::exp2(octaves(gen));
        for (auto & v : ws) v = 1.0f + 0.25f * normal(gen);
        float *d_x = nullptr, *d_w = nullptr;
        CK(cudaMalloc(&d_x, xs.size() * 4));
        CK(cudaMalloc(&d_w, ws.size() * 4));
        CK(cudaMemcpy(d_x, xs.data(), xs.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d_w, ws.data(), ws.size() * 4, cudaMemcpyHostToDevice));
        const float eps = 1e-6f;
        MmaBuffers plain, fused;
        plain.alloc(k, ncols, 1);
        fused.alloc(k, ncols, 1);
        if (k < 1024) {
            DFLASH_LAUNCH(ncols, 256, 0, nullptr, rms_norm_mul_kernel<256>)(d_x, d_w, plain.x, k, eps);
        } else {
            DFLASH_LAUNCH(ncols, 1024, 0, nullptr, rms_norm_mul_kernel<1024>)(d_x, d_w, plain.x, k, eps);
        }
        const ActSource norm = norm_source(d_x, d_w, k, eps);
        plain.quantize(t, k, ncols);
        for (bool column : {true, false}) {  // a block a column, or the scale summed by each block
            gemm_kq::quantize_norm_column_flag() = column;
            const bool ok = quantized_alike_both_loads(plain, fused, t, k, ncols, norm);
            std::printf("{\"check_rms_norm_source\": \"%s\", \"k\": %d, \"ncols\": %d, \"column\": %s, \"ok\": %s}\n",
                        what, k, ncols, column ? "true" : "false", ok ? "true" : "false");
        }
        gemm_kq::quantize_norm_column_flag() = false;  // the default
        plain.free_all();
        fused.free_all();
        cudaFree(d_x);
        cudaFree(d_w);
    }
}

// The GEMV's quantizer reading an RMSNorm's input and weight (gemv::quantize_act_norm_kernel;
// rms_norm_fusion.cu at one column) writes the bytes and scales the GEMV's plain quantizer writes
// for the norm node's output: ggml's 256-thread norm (k = 768) and its 1024-thread one (k = 2304,
// the 27B's 5120, and 2560: a k_pad past k), one column and 3.
void check_gemv_rms_norm_source(std::mt19937 & gen) {
    std::normal_distribution<float> normal(0.0f, 2.0f);
    std::uniform_real_distribution<float> octaves(-6.0f, 6.0f);  // magnitudes far apart: the sum order shows
    for (const auto & [k, ncols] : {std::pair{768, 1}, std::pair{768, 3}, std::pair{2304, 1}, std::pair{5120, 1},
                                    std::pair{5120, 3}, std::pair{2400, 1}}) {
        const int k_pad = (k + 255) / 256 * 256;
        std::vector<float> xs((size_t)ncols * k), ws(k);
        for (auto & v : xs) v = normal(gen) * std::exp2(octaves(gen));
        for (auto & v : ws) v = 1.0f + 0.25f * normal(gen);
        float *d_x = nullptr, *d_w = nullptr, *normed = nullptr, *d_plain = nullptr, *d_fused = nullptr;
        int8_t *q_plain = nullptr, *q_fused = nullptr;
        CK(cudaMalloc(&d_x, xs.size() * 4));
        CK(cudaMalloc(&d_w, ws.size() * 4));
        CK(cudaMalloc(&normed, xs.size() * 4));
        CK(cudaMalloc(&q_plain, (size_t)ncols * k_pad));
        CK(cudaMalloc(&q_fused, (size_t)ncols * k_pad));
        CK(cudaMalloc(&d_plain, (size_t)ncols * k_pad / 32 * 4));
        CK(cudaMalloc(&d_fused, (size_t)ncols * k_pad / 32 * 4));
        CK(cudaMemset(q_fused, 0x55, (size_t)ncols * k_pad));
        CK(cudaMemcpy(d_x, xs.data(), xs.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d_w, ws.data(), ws.size() * 4, cudaMemcpyHostToDevice));
        const float eps = 1e-6f;
        const ActSource norm = norm_source(d_x, d_w, k, eps);
        if (k < 1024) {
            DFLASH_LAUNCH(ncols, 256, 0, nullptr, rms_norm_mul_kernel<256>)(d_x, d_w, normed, k, eps);
            DFLASH_LAUNCH(ncols, 256, 0, nullptr, gemv::quantize_act_norm_kernel<256>)(norm, q_fused, d_fused, k,
                                                                                       k_pad);
        } else {
            DFLASH_LAUNCH(ncols, 1024, 0, nullptr, rms_norm_mul_kernel<1024>)(d_x, d_w, normed, k, eps);
            DFLASH_LAUNCH(ncols, 1024, 0, nullptr, gemv::quantize_act_norm_kernel<1024>)(norm, q_fused, d_fused, k,
                                                                                         k_pad);
        }
        DFLASH_LAUNCH(dim3(k_pad / 256, ncols, 1), 256, 0, nullptr, gemv::quantize_act_kernel)(
            act_floats(normed, k), q_plain, d_plain, k, k_pad);
        CK(cudaDeviceSynchronize());
        std::vector<int8_t> qa((size_t)ncols * k_pad), qb(qa.size());
        std::vector<float> da((size_t)ncols * k_pad / 32), db(da.size());
        CK(cudaMemcpy(qa.data(), q_plain, qa.size(), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(qb.data(), q_fused, qb.size(), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(da.data(), d_plain, da.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(db.data(), d_fused, db.size() * 4, cudaMemcpyDeviceToHost));
        const bool ok = qa == qb && std::memcmp(da.data(), db.data(), da.size() * 4) == 0;
        std::printf("{\"check_gemv_rms_norm_source\": %d, \"ncols\": %d, \"ok\": %s}\n", k, ncols,
                    ok ? "true" : "false");
        for (void * p : {(void *)d_x, (void *)d_w, (void *)normed, (void *)d_plain, (void *)d_fused, (void *)q_plain,
                         (void *)q_fused}) {
            cudaFree(p);
        }
    }
}

// The GEMM's quantizer reading a per-head RMSNorm's input o, its weight and the gate z
// (act_source.cuh's head_w; rms_norm_fusion.cu's gated outputs) writes the bytes it writes for
// silu(z) * (rms_norm(o per head) * w) from ggml's norm kernel (one head a block of 256 threads, as
// ggml runs rows shorter than 1024) and the SwiGLU node: heads of 32, 64, 128 (the 27B's) and 256
// values, 5 columns (a value a quantizer thread) and 40 (8 a thread), the Q4_K, Q6_K and Q8_0
// layouts.
void check_head_norm_source(std::mt19937 & gen) {
    std::normal_distribution<float> normal(0.0f, 2.0f);
    for (const auto & [what, head, k, ncols] :
         {std::tuple{"q4_K", 128, 768, 5}, std::tuple{"q4_K", 128, 768, 40}, std::tuple{"q6_K", 128, 768, 5},
          std::tuple{"q6_K", 128, 512, 40}, std::tuple{"q8_0", 128, 512, 5}, std::tuple{"q4_K", 32, 256, 40},
          std::tuple{"q6_K", 64, 512, 5}, std::tuple{"q4_K", 256, 512, 40}, std::tuple{"q8_0", 256, 512, 40}}) {
        const W t = what[1] == '4' ? W::q4_K : what[1] == '6' ? W::q6_K : W::q8_0;
        const ValuesPerThreadFor values(ncols);
        std::vector<float> os((size_t)ncols * k), zs(os.size()), ws(head);
        std::uniform_real_distribution<float> octaves(-6.0f, 6.0f);  // magnitudes far apart: the sum order shows
        for (auto & v : os) v = normal(gen) * std::exp2(octaves(gen));
        for (auto & v : zs) v = normal(gen);
        for (auto & v : ws) v = 1.0f + 0.25f * normal(gen);
        float *d_o = nullptr, *d_z = nullptr, *d_w = nullptr, *normed = nullptr;
        for (auto [dp, hv] : {std::pair{&d_o, &os}, std::pair{&d_z, &zs}, std::pair{&d_w, &ws}}) {
            CK(cudaMalloc(dp, hv->size() * 4));
            CK(cudaMemcpy(*dp, hv->data(), hv->size() * 4, cudaMemcpyHostToDevice));
        }
        CK(cudaMalloc(&normed, os.size() * 4));
        const float eps = 1e-6f;
        MmaBuffers plain, fused;
        plain.alloc(k, ncols, 1);
        fused.alloc(k, ncols, 1);
        DFLASH_LAUNCH(ncols * (k / head), 256, 0, nullptr, rms_norm_mul_kernel<256>)(d_o, d_w, normed, head, eps);
        DFLASH_LAUNCH(dim3((k + 255) / 256, ncols, 1), 256, 0, nullptr, swiglu_kernel)(d_z, normed, plain.x, k, k);
        ActSource src;
        src.x = d_z;
        src.sx = k;
        src.up = d_o;
        src.sup = k;
        src.head_w = d_w;
        src.head = head;
        src.head_eps = eps;
        plain.quantize(t, k, ncols);
        const bool ok = gemm_kq::act_source_ok(src, k) && quantized_alike_both_loads(plain, fused, t, k, ncols, src);
        plain.free_all();
        fused.free_all();
        for (float * ptr : {d_o, d_z, d_w, normed}) cudaFree(ptr);
        std::printf("{\"check_head_norm_source\": \"%s\", \"head\": %d, \"k\": %d, \"ncols\": %d, \"ok\": %s}\n", what,
                    head, k, ncols, ok ? "true" : "false");
    }
}

// The f16 wgmma GEMM's activation converter with 8 values a thread (convert_act_f16_v8_kernel, the
// default) writes the halves the one of a value a thread writes, for every source form: floats, a
// SwiGLU, an RMSNorm, a per-head RMSNorm's SwiGLU and a sigmoid gate; with the 16-byte runs
// (ActSource::runs16) and without; 3 and 9 super-blocks (a block's 8 and a part), 5 and 40 columns.
void check_f16_convert(std::mt19937 & gen) {
    std::normal_distribution<float> normal(0.0f, 2.0f);
    for (int k : {768, 2304}) {
        for (int ncols : {5, 40}) {
            const int np = gemm_kq::wg_padded_columns(ncols), head = 128;
            const int64_t sg = 2 * k + 64;  // a sigmoid gate's rows: [q, gate] heads of 128, then others
            std::vector<float> a((size_t)ncols * sg), b((size_t)ncols * k), w(k);
            for (auto & v : a) v = normal(gen);
            for (auto & v : b) v = normal(gen) * std::exp2(std::uniform_real_distribution<float>(-6.0f, 6.0f)(gen));
            for (auto & v : w) v = 1.0f + 0.25f * normal(gen);
            float *d_a = nullptr, *d_b = nullptr, *d_w = nullptr;
            for (auto [dp, hv] : {std::pair{&d_a, &a}, std::pair{&d_b, &b}, std::pair{&d_w, &w}}) {
                CK(cudaMalloc(dp, hv->size() * 4));
                CK(cudaMemcpy(*dp, hv->data(), hv->size() * 4, cudaMemcpyHostToDevice));
            }
            ActSource glu = act_floats(d_a, k);  // silu(a) * b, a's columns sg apart
            glu.sx = sg;
            glu.up = d_b;
            glu.sup = k;
            ActSource headed = glu;  // silu(a) * (rms_norm(b per head of 128) * w)
            headed.head_w = d_w;
            headed.head = head;
            headed.head_eps = 1e-6f;
            ActSource gated = act_floats(d_b, k);  // sigmoid(gate) * b
            gated.gate = d_a + head;
            gated.sgate = sg;
            gated.gate_block = head;
            gated.gate_stride = 2 * head;
            const std::pair<const char *, ActSource> sources[] = {{"floats", act_floats(d_b, k)},
                                                                  {"swiglu", glu},
                                                                  {"rms_norm", norm_source(d_b, d_w, k, 1e-6f)},
                                                                  {"head_norm", headed},
                                                                  {"sigmoid_gate", gated}};
            __half * out = nullptr;
            const size_t n = (size_t)np * k;
            CK(cudaMalloc(&out, n * 2));
            for (const auto & [what, src_] : sources) {
                const ActSource & src = src_;  // a lambda may not capture a structured binding in C++17
                auto halves = [&](bool v8, bool runs16) {
                    gemm_kq::quantize_runs16_flag() = runs16;
                    CK(cudaMemset(out, 0x55, n * 2));
                    gemm_kq::convert_act_f16_by(v8, src, out, k, ncols, np, nullptr);
                    CK(cudaDeviceSynchronize());
                    return to_host(reinterpret_cast<const uint16_t *>(out), n);
                };
                const std::vector<uint16_t> one = halves(false, true);
                const bool ok =
                    gemm_kq::act_source_ok(src, k) && halves(true, true) == one && halves(true, false) == one;
                std::printf("{\"check_f16_convert\": \"%s\", \"k\": %d, \"ncols\": %d, \"ok\": %s}\n", what, k, ncols,
                            ok ? "true" : "false");
            }
            gemm_kq::quantize_runs16_flag() = true;  // the default
            for (void * ptr : {(void *)out, (void *)d_a, (void *)d_b, (void *)d_w}) cudaFree(ptr);
        }
    }
}

// gemm_kq::quantize_act_and_f16 (one launch, both forms of a pair's source) against the two launches
// it replaces (launch_quantize_act in layout L, convert_act_f16): the same bytes, scales, sums and
// halves, over buffers filled alike first (so a byte written by neither compares too).
template <gemm_kq::ActLayout L>
void check_act_pair(std::mt19937 & gen) {
    std::normal_distribution<float> normal(0.0f, 2.0f);
    const char * layout = L == gemm_kq::ActLayout::kRun ? "run" : "wgmma";
    for (int k : {768, 2304}) {
        for (int ncols : {17, 40, 64}) {
            const int np8 =
                L == gemm_kq::ActLayout::kRun ? gemm_kq::padded_columns(ncols) : gemm_kq::wg_padded_columns(ncols);
            const int np16 = gemm_kq::wg_padded_columns(ncols);
            std::vector<float> x((size_t)ncols * k), w(k);
            for (auto & v : x) v = normal(gen) * std::exp2(std::uniform_real_distribution<float>(-6.0f, 6.0f)(gen));
            for (auto & v : w) v = 1.0f + 0.25f * normal(gen);
            float *d_x = nullptr, *d_w = nullptr, *d = nullptr;
            for (auto [dp, hv] : {std::pair{&d_x, &x}, std::pair{&d_w, &w}}) {
                CK(cudaMalloc(dp, hv->size() * 4));
                CK(cudaMemcpy(*dp, hv->data(), hv->size() * 4, cudaMemcpyHostToDevice));
            }
            const size_t nq = (size_t)64 * k, nd = (size_t)64 * (k / 32), nh = (size_t)64 * k;
            int8_t * qs = nullptr;
            int * sums = nullptr;
            __half * halves = nullptr;
            CK(cudaMalloc(&qs, nq));
            CK(cudaMalloc(&d, nd * 4));
            CK(cudaMalloc(&sums, nd * 4));
            CK(cudaMalloc(&halves, nh * 2));
            const std::pair<const char *, ActSource> sources[] = {{"floats", act_floats(d_x, k)},
                                                                  {"rms_norm", norm_source(d_x, d_w, k, 1e-6f)}};
            for (const auto & [what, src_] : sources) {
                const ActSource & src = src_;  // a lambda may not capture a structured binding in C++17
                auto run = [&](bool fused) {
                    CK(cudaMemset(qs, 0x55, nq));
                    CK(cudaMemset(d, 0x55, nd * 4));
                    CK(cudaMemset(sums, 0x55, nd * 4));
                    CK(cudaMemset(halves, 0x55, nh * 2));
                    if (fused) {
                        gemm_kq::quantize_act_and_f16<L>(src, qs, d, sums, halves, k, ncols, np8, np16, nullptr);
                    } else {
                        gemm_kq::launch_quantize_act<L, gemm_kq::kQk>(src, qs, d, sums, k, ncols, np8, nullptr);
                        gemm_kq::convert_act_f16(src, halves, k, ncols, np16, nullptr);
                    }
                    CK(cudaDeviceSynchronize());
                    return std::make_tuple(to_host(qs, nq), to_host(d, nd), to_host(sums, nd),
                                           to_host(reinterpret_cast<const uint16_t *>(halves), nh));
                };
                const bool ok = run(false) == run(true);
                std::printf("{\"check_act_pair\": \"%s\", \"layout\": \"%s\", \"k\": %d, \"ncols\": %d, \"ok\": %s}\n",
                            what, layout, k, ncols, ok ? "true" : "false");
            }
            for (void * ptr : {(void *)qs, (void *)d, (void *)sums, (void *)halves, (void *)d_x, (void *)d_w}) {
                cudaFree(ptr);
            }
        }
    }
}

// sigmoid(gate) * o into x (columns k apart), the gate's value i of column col at
// gate[col sg + (i / block) stride + i % block]: the unfused graph's copy of the gate and ggml's
// fused sigmoid and multiply.
__global__ void sigmoid_gate_kernel(const float * gate, const float * o, float * x, int k, int block, int stride,
                                    int64_t sg) {
    const int col = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < k) {
        const float g = gate[col * sg + i / block * stride + i % block];
        x[(int64_t)col * k + i] = 1.0f / (1.0f + expf(-g)) * o[(int64_t)col * k + i];
    }
}

// The GEMM's quantizer reading the attention's output and its sigmoid gate in place (act_source.cuh's
// gate; glu_fusion.cu's sigmoid gates) writes the bytes it writes for the gated output: heads of 128
// (the 27B's 256 too) interleaved with the query heads in one product's rows (block hd, stride 2 hd,
// a column of 2 k + 64 floats), 5 and 40 columns, the Q4_K, Q6_K and Q8_0 layouts.
void check_sigmoid_gate_source(std::mt19937 & gen) {
    std::normal_distribution<float> normal(0.0f, 2.0f);
    for (const auto & [what, hd, k, ncols] :
         {std::tuple{"q4_K", 128, 768, 5}, std::tuple{"q4_K", 128, 768, 40}, std::tuple{"q6_K", 256, 512, 5},
          std::tuple{"q6_K", 128, 512, 40}, std::tuple{"q8_0", 256, 512, 40}}) {
        const W t = what[1] == '4' ? W::q4_K : what[1] == '6' ? W::q6_K : W::q8_0;
        const ValuesPerThreadFor values(ncols);
        const int64_t sg = 2 * k + 64;  // [q, gate] heads, then other rows of the product
        std::vector<float> rows((size_t)ncols * sg), os((size_t)ncols * k);
        for (auto & v : rows) v = normal(gen);
        for (auto & v : os) v = normal(gen);
        float *d_rows = nullptr, *d_o = nullptr;
        CK(cudaMalloc(&d_rows, rows.size() * 4));
        CK(cudaMalloc(&d_o, os.size() * 4));
        CK(cudaMemcpy(d_rows, rows.data(), rows.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d_o, os.data(), os.size() * 4, cudaMemcpyHostToDevice));
        MmaBuffers plain, fused;
        plain.alloc(k, ncols, 1);
        fused.alloc(k, ncols, 1);
        DFLASH_LAUNCH(dim3((k + 255) / 256, ncols, 1), 256, 0, nullptr, sigmoid_gate_kernel)(d_rows + hd, d_o, plain.x,
                                                                                             k, hd, 2 * hd, sg);
        ActSource src;
        src.x = d_o;
        src.sx = k;
        src.gate = d_rows + hd;
        src.sgate = sg;
        src.gate_block = hd;
        src.gate_stride = 2 * hd;
        plain.quantize(t, k, ncols);
        const bool ok = gemm_kq::act_source_ok(src, k) && quantized_alike_both_loads(plain, fused, t, k, ncols, src);
        plain.free_all();
        fused.free_all();
        cudaFree(d_rows);
        cudaFree(d_o);
        std::printf("{\"check_sigmoid_gate_source\": \"%s\", \"hd\": %d, \"ncols\": %d, \"ok\": %s}\n", what, hd, ncols,
                    ok ? "true" : "false");
    }
}

// Random rows of type t for a check: their bytes on the device, dequantized on the host (wf).
struct CheckWeights {
    int64_t row_bytes;
    std::vector<float> wf;
    char * dev = nullptr;
    CheckWeights(W t, int rows, int k, std::mt19937 & gen) : row_bytes((int64_t)(k / 256) * superblock_bytes(t)) {
        const auto w = random_rows(t, rows, k, gen);
        wf.resize((size_t)rows * k);
        for (int r = 0; r < rows; ++r) dequant_row(t, w.data() + r * row_bytes, k, wf.data() + (size_t)r * k);
        CK(cudaMalloc(&dev, w.size()));
        CK(cudaMemcpy(dev, w.data(), w.size(), cudaMemcpyHostToDevice));
    }
    ~CheckWeights() { cudaFree(dev); }
    CheckWeights(const CheckWeights &) = delete;
    CheckWeights & operator=(const CheckWeights &) = delete;
};

// FNV-1a of a launch's output bits: equal across the forms and builds that must give the same bits
// (the check lines' out_hash; tools/device/ws64_ab.sh compares builds by it).
uint64_t bits_hash(const std::vector<float> & out) {
    uint64_t hash = 1469598103934665603ull;
    for (const float v : out) {
        uint32_t u;
        std::memcpy(&u, &v, 4);
        hash = (hash ^ u) * 1099511628211ull;
    }
    return hash;
}

// The tensor-core GEMM against the host reference (activations per 256; per 32 for Q8_0), every stage count; and
// the engine's form with a residual.
void check_mma(W t, int rows, int k, std::mt19937 & gen) {
    const CheckWeights cw(t, rows, k, gen);
    const int64_t row_bytes = cw.row_bytes;
    const std::vector<float> & wf = cw.wf;
    const char * dw = cw.dev;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int ncols : {2, 8, 9, 16, 23, 32, 40, 64}) {
        std::vector<float> x((size_t)ncols * k);
        for (auto & v : x) v = normal(gen);
        std::vector<double> ref;
        const double ref_max = reference_products(wf, x, rows, k, ncols, t == W::q8_0 ? 32 : 256, ref);
        MmaBuffers b;
        b.alloc(k, ncols, rows);
        CK(cudaMemcpy(b.x, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
        b.quantize(t, k, ncols);
        for (int stages : kMmaCodes) {
            if (!code_runs(t, stages)) continue;
            std::vector<float> got((size_t)ncols * rows);
            CK(cudaMemset(b.dst, 0, got.size() * 4));
            run_mma(t, stages, dw, b, rows, k, row_bytes, ncols);
            CK(cudaMemcpy(got.data(), b.dst, got.size() * 4, cudaMemcpyDeviceToHost));
            double err = 0;
            for (size_t i = 0; i < got.size(); ++i) err = std::fmax(err, std::fabs(got[i] - ref[i]));
            const uint64_t hash = bits_hash(got);  // equal bits across codes
            std::printf(
                "{\"check_mma\": \"%s\", \"rows\": %d, \"k\": %d, \"ncols\": %d, \"stages\": %d, "
                "\"stages_run\": %d, \"warps\": %d, \"rel_err\": %.3g, \"out_hash\": \"%016llx\", \"ok\": %s}\n",
                type_name(t), rows, k, ncols, stages, stages_run(t, stages), code_warps(t, stages), err / ref_max,
                (unsigned long long)hash,
                err / ref_max <= (mins_mma_code(stages) ? 5e-4 : 1e-4) ? "true" : "false");  // f16 sums: 1 in 4064
        }
        // the engine's form of each type (Q5_K's with the f16 min term, as Q4_K's)
        const bool ok = t == W::q4_K   ? residual_is_added<gemm_kq::Q4KMinsMma>(dw, b, rows, k, row_bytes, ncols, gen)
                        : t == W::q5_K ? residual_is_added<gemm_kq::Q5KMinsMma>(dw, b, rows, k, row_bytes, ncols, gen)
                        : t == W::q8_0 ? residual_is_added<gemm_kq::Q80>(dw, b, rows, k, row_bytes, ncols, gen)
                                       : residual_is_added<gemm_kq::Q6K>(dw, b, rows, k, row_bytes, ncols, gen);
        std::printf("{\"check_mma_residual\": \"%s\", \"rows\": %d, \"k\": %d, \"ncols\": %d, \"ok\": %s}\n",
                    type_name(t), rows, k, ncols, ok ? "true" : "false");
        b.free_all();
    }
}

// codes_only: the codes to time (all of kMmaCodes when null; those a type runs, code_runs).
void bench_mma(const char * name, W t, int rows, int k, std::mt19937 & gen,
               const std::vector<int> * codes_only = nullptr) {
    const int64_t row_bytes = (int64_t)(k / 256) * superblock_bytes(t);
    const size_t bytes = (size_t)rows * row_bytes;
    const int copies = (int)std::max<size_t>(2, (size_t)(400u << 20) / bytes + 1);
    char * dw = weight_copies(t, rows, k, bytes, copies, gen);
    for (int ncols : {8, 16, 24, 32, 48, 64}) {
        MmaBuffers b;
        b.alloc(k, ncols, rows);
        CK(cudaMemset(b.x, 0, (size_t)ncols * k * 4));
        b.quantize(t, k, ncols);
        for (int stages : kMmaCodes) {
            if (!code_runs(t, stages)) continue;
            if (codes_only && std::find(codes_only->begin(), codes_only->end(), stages) == codes_only->end()) continue;
            const int reps = 5;
            for (int c = 0; c < copies; ++c) run_mma(t, stages, dw + bytes * c, b, rows, k, row_bytes, ncols);
            const double us = time_us(reps * copies, [&] {
                for (int i = 0; i < reps; ++i) {
                    for (int c = 0; c < copies; ++c) run_mma(t, stages, dw + bytes * c, b, rows, k, row_bytes, ncols);
                }
            });
            std::printf(
                "{\"bench_mma\": \"%s\", \"type\": \"%s\", \"rows\": %d, \"k\": %d, \"n\": %d, \"stages\": %d, "
                "\"stages_run\": %d, \"warps\": %d, \"us\": %.2f, \"GBps\": %.0f}\n",
                name, type_name(t), rows, k, ncols, stages, stages_run(t, stages), code_warps(t, stages), us,
                bytes / us / 1e3);
        }
        b.free_all();
    }
    cudaFree(dw);
}

// One launch of the engine's GEMM form per shape and column count, for a profiler (ncu): no
// repetitions, no timing.
// codes: those to launch (default: the engine's, 102 for Q4_K / Q5_K, 2 for the others);
// column counts: ncols_list.
// "102,1000102" -> {102, 1000102}
std::vector<int> parse_codes(const char * list) {
    std::vector<int> codes;
    for (const char * p = list; *p;) {
        codes.push_back(std::atoi(p));
        while (*p && *p != ',') ++p;
        if (*p == ',') ++p;
    }
    return codes;
}

void profile_mma(W t, int rows, int k, std::mt19937 & gen, const std::vector<int> & codes = {},
                 const std::vector<int> & ncols_list = {8, 16, 32, 64}) {
    const int64_t row_bytes = (int64_t)(k / 256) * superblock_bytes(t);
    const size_t bytes = (size_t)rows * row_bytes;
    char * dw = weight_copies(t, rows, k, bytes, 1, gen);
    const std::vector<int> run_codes = codes.empty() ? std::vector<int>{t == W::q4_K || t == W::q5_K ? 102 : 2} : codes;
    for (int ncols : ncols_list) {
        MmaBuffers b;
        b.alloc(k, ncols, rows);
        CK(cudaMemset(b.x, 0, (size_t)ncols * k * 4));
        b.quantize(t, k, ncols);
        for (int code : run_codes) {
            if (!code_runs(t, code)) continue;
            run_mma(t, code, dw, b, rows, k, row_bytes, ncols);
            CK(cudaDeviceSynchronize());
        }
        b.free_all();
    }
    cudaFree(dw);
}

// The Q4_K wgmma GEMM (gemm_q4k_wgmma.cuh, sm_90a) against the host reference, in seven forms
// ("swap"): 0 the default (4 stages, 1 warpgroup), 1 3 blocks a multiprocessor and 2 stages, 2 and
// 3 the pipelined kernel (the float step under the next super-block's wgmmas) with 4 and 5 stages,
// 4 the default with the pipelined kernel's staging (kWgEarly), 5 that with 2 warpgroups a block
// (128 rows on one copy of the activations), 6 that waiting a chunk at a time (kWgChunks: 2
// stages, 3 blocks a multiprocessor), 7 that with 3 warpgroups a block (192 rows, 4 stages), 8 the
// warp-specialized kernel (gemm_q4k_wgmma_ws.cuh: a producer warpgroup, mbarriers) with 1 and (9)
// 2 consumer warpgroups; 2..9 must give form 0's bits
// ("same_bits"); then timed against the engine's mma.sync forms (102; 1000102) on the 27B's Q4_K
// matrices.
void check_wgmma(int rows, int k, std::mt19937 & gen,
                 std::initializer_list<int> ncols_list = {2, 9, 16, 23, 32, 40, 64}) {
    const W t = W::q4_K;
    const CheckWeights cw(t, rows, k, gen);
    const int64_t row_bytes = cw.row_bytes;
    const std::vector<float> & wf = cw.wf;
    const char * dw = cw.dev;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int ncols : ncols_list) {
        std::vector<float> x((size_t)ncols * k);
        for (auto & v : x) v = normal(gen);
        std::vector<double> ref;
        const double ref_max = reference_products(wf, x, rows, k, ncols, 256, ref);
        MmaBuffers b;
        b.alloc(k, ncols, rows);
        CK(cudaMemcpy(b.x, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
        gemm_kq::quantize_act_wgmma(act_floats(b.x, k), b.yq, b.yd, b.ysum, k, ncols, nullptr);
        std::vector<float> form0;
        for (int swap = 0; swap < 10; ++swap) {
            std::vector<float> got((size_t)ncols * rows);
            CK(cudaMemset(b.dst, 0, got.size() * 4));
            auto launch = [&](auto s_tag, auto mb_tag, auto form_tag, auto wg_tag) {
                return gemm_kq::launch_q4k_wgmma<decltype(s_tag)::value, decltype(wg_tag)::value,
                                                 decltype(mb_tag)::value, decltype(form_tag)::value>(
                    dw, b.yq, b.yd, b.ysum, b.dst, rows, k, row_bytes, ncols, rows, nullptr);
            };
            constexpr std::integral_constant<int, gemm_kq::kWgPlain> kPlain{};
            constexpr std::integral_constant<int, gemm_kq::kWgPipe> kPipe{};
            constexpr std::integral_constant<int, 1> kOne{};
            bool ran = false;
            switch (swap) {
                case 0:
                    ran = launch(std::integral_constant<int, 4>{}, std::integral_constant<int, 1>{}, kPlain, kOne);
                    break;
                case 1:
                    ran = launch(std::integral_constant<int, 2>{}, std::integral_constant<int, 3>{}, kPlain, kOne);
                    break;
                case 2:
                    ran = launch(std::integral_constant<int, 4>{}, std::integral_constant<int, 1>{}, kPipe, kOne);
                    break;
                case 3:
                    ran = launch(std::integral_constant<int, 5>{}, std::integral_constant<int, 1>{}, kPipe, kOne);
                    break;
                case 4:
                    ran = launch(std::integral_constant<int, 4>{}, std::integral_constant<int, 1>{},
                                 std::integral_constant<int, gemm_kq::kWgEarly>{}, kOne);
                    break;
                case 5:
                    ran = launch(std::integral_constant<int, 4>{}, std::integral_constant<int, 1>{},
                                 std::integral_constant<int, gemm_kq::kWgEarly>{}, std::integral_constant<int, 2>{});
                    break;
                case 6:
                    ran = launch(std::integral_constant<int, 2>{}, std::integral_constant<int, 3>{},
                                 std::integral_constant<int, gemm_kq::kWgChunks>{}, kOne);
                    break;
                case 7:
                    ran = launch(std::integral_constant<int, 4>{}, std::integral_constant<int, 1>{},
                                 std::integral_constant<int, gemm_kq::kWgChunks>{}, std::integral_constant<int, 3>{});
                    break;
                case 8:
                    ran = gemm_kq::launch_q4k_wgmma_ws(dw, b.yq, b.yd, b.ysum, b.dst, rows, k, row_bytes, ncols, rows,
                                                       nullptr);
                    break;
                default:
                    ran = gemm_kq::launch_q4k_wgmma_ws<2>(dw, b.yq, b.yd, b.ysum, b.dst, rows, k, row_bytes, ncols,
                                                          rows, nullptr);
            }
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(got.data(), b.dst, got.size() * 4, cudaMemcpyDeviceToHost));
            double err = 0;
            for (size_t i = 0; i < got.size(); ++i) err = std::fmax(err, std::fabs(got[i] - ref[i]));
            if (swap == 0) form0 = got;
            const bool same = std::memcmp(got.data(), form0.data(), got.size() * 4) == 0;
            std::printf(
                "{\"check_wgmma\": \"q4_K\", \"rows\": %d, \"k\": %d, \"ncols\": %d, \"swap\": %d, "
                "\"ran\": %s, \"rel_err\": %.3g, \"same_bits\": %s, \"out_hash\": \"%016llx\", \"ok\": %s}\n",
                rows, k, ncols, swap, ran ? "true" : "false", err / ref_max, same ? "true" : "false",
                (unsigned long long)bits_hash(got),
                ran && err / ref_max <= 5e-4 && (swap < 2 || same) ? "true" : "false");
        }
        b.free_all();
    }
}

#if !defined(DFLASH_CUDA_EMU)
// One launch of the Q4_K wgmma form on [gate; up] (34816 x 5120) per column count, after one of
// the engine's code 102 when with_102, for a profiler (ncu): no repetitions, no timing.
void profile_gate_up_wgmma(std::mt19937 & gen, std::initializer_list<int> ncols_list, bool with_102) {
    const int rows = 34816, k = 5120;
    const int64_t row_bytes = (int64_t)(k / 256) * superblock_bytes(W::q4_K);
    char * dw = weight_copies(W::q4_K, rows, k, (size_t)rows * row_bytes, 1, gen);
    for (int ncols : ncols_list) {
        MmaBuffers b;
        b.alloc(k, ncols, rows);
        CK(cudaMemset(b.x, 0, (size_t)ncols * k * 4));
        if (with_102) {
            b.quantize(W::q4_K, k, ncols);
            run_mma(W::q4_K, 102, dw, b, rows, k, row_bytes, ncols);
        }
        gemm_kq::quantize_act_wgmma(act_floats(b.x, k), b.yq, b.yd, b.ysum, k, ncols, nullptr);
        gemm_kq::launch_q4k_wgmma(dw, b.yq, b.yd, b.ysum, b.dst, rows, k, row_bytes, ncols, rows, nullptr);
        CK(cudaDeviceSynchronize());
        b.free_all();
    }
    cudaFree(dw);
}

constexpr int kWgmmaBenchCodes[] = {102,      1000102,  90000014, 90002014, 91002014,
                                    91002024, 91003312, 91003134, 91004014, 91004024};

// Times the codes below (all: kWgmmaBenchCodes) at each column count of ncols_list; with
// `profile`, launches each once on one copy of the weights instead (for ncu -k regex:gemm_).
void bench_wgmma(const char * name, int rows, int k, std::mt19937 & gen, const std::vector<int> & codes = {},
                 const std::vector<int> & ncols_list = {16, 24, 32, 48, 64}, bool profile = false) {
    const W t = W::q4_K;
    const int64_t row_bytes = (int64_t)(k / 256) * superblock_bytes(t);
    const size_t bytes = (size_t)rows * row_bytes;
    const int copies = profile ? 1 : (int)std::max<size_t>(2, (size_t)(400u << 20) / bytes + 1);
    char * dw = weight_copies(t, rows, k, bytes, copies, gen);
    const std::vector<int> run_codes =
        codes.empty() ? std::vector<int>(std::begin(kWgmmaBenchCodes), std::end(kWgmmaBenchCodes)) : codes;
    for (int ncols : ncols_list) {
        MmaBuffers b;
        b.alloc(k, ncols, rows);
        CK(cudaMemset(b.x, 0, (size_t)ncols * k * 4));
        // 90000000 + 1000 form (1 pipelined, 2 the committed one with the pipelined staging, 3 that
        // waiting a chunk at a time) + 100 blocks a multiprocessor + 10 warpgroups + stages: the
        // committed form (14), the pipelined one with 4 and 5 stages, and 90002014; the other forms
        // session 19 measured (2 stages, 2 warpgroups, 3-4 blocks) lost everywhere
        // (h200-s19-wgmma-staging.json). 91000000 + the same: with the engine's tail split
        // (wgmma_split_for): the engine's default (91002014), 2 warpgroups a block (91002024,
        // DFLASH_WGMMA_WG=2), the chunk-waiting form (91003312, DFLASH_WGMMA_CHUNKS=1), that with 3
        // warpgroups a block (91003134, DFLASH_WGMMA_WG=3) and the warp-specialized kernel with one and
        // two consumer warpgroups (91004014, 91004024: DFLASH_WGMMA_WS=1, 2). The pipelined codes (x1014,
        // x1015) are left out since session 38 (they tied the committed form in session 30).
        int nsm = 0;
        CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
        const gemm_kq::WgSplit sp_early = gemm_kq::wgmma_split_for<4, 1, 1, gemm_kq::kWgEarly>(rows, k, ncols, nsm);
        const gemm_kq::WgSplit sp_two = gemm_kq::wgmma_split_for<4, 2, 1, gemm_kq::kWgEarly>(rows, k, ncols, nsm);
        const gemm_kq::WgSplit sp_chunks = gemm_kq::wgmma_split_for<2, 1, 3, gemm_kq::kWgChunks>(rows, k, ncols, nsm);
        const gemm_kq::WgSplit sp_three = gemm_kq::wgmma_split_for<4, 3, 1, gemm_kq::kWgChunks>(rows, k, ncols, nsm);
        const gemm_kq::WgSplit sp_ws = gemm_kq::wgmma_ws_split_for(rows, k, ncols, nsm);
        const gemm_kq::WgSplit sp_ws2 = gemm_kq::wgmma_ws_split_for<2>(rows, k, ncols, nsm);
        float * partials = nullptr;
        const size_t nparts = std::max(
            {gemm_kq::wgmma_split_floats(sp_early, ncols), gemm_kq::wgmma_split_floats<2>(sp_two, ncols),
             gemm_kq::wgmma_split_floats(sp_chunks, ncols), gemm_kq::wgmma_split_floats<3>(sp_three, ncols),
             gemm_kq::wgmma_split_floats(sp_ws, ncols), gemm_kq::wgmma_split_floats<2>(sp_ws2, ncols), (size_t)1});
        CK(cudaMalloc(&partials, nparts * sizeof(float)));
        for (int code : run_codes) {
            const bool wg = code >= 90000000;
            if (wg) {
                gemm_kq::quantize_act_wgmma(act_floats(b.x, k), b.yq, b.yd, b.ysum, k, ncols, nullptr);
            } else {
                b.quantize(t, k, ncols);
            }
            auto once = [&](int c) {
                if (wg) {
                    const char * wc = dw + bytes * c;
                    // stages S, warpgroups WG, blocks a multiprocessor MB and form F, with split sp
                    // (WgSplit{}: none)
                    auto launch = [&](auto s_tag, auto wg_tag, auto mb_tag, auto form_tag,
                                      const gemm_kq::WgSplit & sp) {
                        gemm_kq::launch_q4k_wgmma<decltype(s_tag)::value, decltype(wg_tag)::value,
                                                  decltype(mb_tag)::value, decltype(form_tag)::value>(
                            wc, b.yq, b.yd, b.ysum, b.dst, rows, k, row_bytes, ncols, rows, nullptr, 128, 256, sp,
                            partials);
                    };
                    using One = std::integral_constant<int, 1>;
                    using Four = std::integral_constant<int, 4>;
                    using Early = std::integral_constant<int, gemm_kq::kWgEarly>;
                    using Chunks = std::integral_constant<int, gemm_kq::kWgChunks>;
                    switch (code % 10000) {
                        case 2014:
                            launch(Four{}, One{}, One{}, Early{}, code >= 91000000 ? sp_early : gemm_kq::WgSplit{});
                            break;
                        case 2024:
                            launch(Four{}, std::integral_constant<int, 2>{}, One{}, Early{}, sp_two);
                            break;
                        case 3312:
                            launch(std::integral_constant<int, 2>{}, One{}, std::integral_constant<int, 3>{}, Chunks{},
                                   sp_chunks);
                            break;
                        case 3134:
                            launch(Four{}, std::integral_constant<int, 3>{}, One{}, Chunks{}, sp_three);
                            break;
                        case 4014:
                            gemm_kq::launch_q4k_wgmma_ws(wc, b.yq, b.yd, b.ysum, b.dst, rows, k, row_bytes, ncols, rows,
                                                         nullptr, sp_ws, partials);
                            break;
                        case 4024:
                            gemm_kq::launch_q4k_wgmma_ws<2>(wc, b.yq, b.yd, b.ysum, b.dst, rows, k, row_bytes, ncols,
                                                            rows, nullptr, sp_ws2, partials);
                            break;
                        default:
                            launch(Four{}, One{}, One{}, std::integral_constant<int, gemm_kq::kWgPlain>{},
                                   gemm_kq::WgSplit{});
                    }
                } else {
                    run_mma(t, code, dw + bytes * c, b, rows, k, row_bytes, ncols);
                }
            };
            if (profile) {
                once(0);
                CK(cudaDeviceSynchronize());
                continue;
            }
            const int reps = 5;
            for (int c = 0; c < copies; ++c) once(c);
            const double us = time_us(reps * copies, [&] {
                for (int i = 0; i < reps; ++i) {
                    for (int c = 0; c < copies; ++c) once(c);
                }
            });
            std::printf(
                "{\"bench_mma\": \"%s\", \"type\": \"q4_K\", \"rows\": %d, \"k\": %d, \"n\": %d, "
                "\"stages\": %d, \"stages_run\": 2, \"warps\": 4, \"us\": %.2f, \"GBps\": %.0f}\n",
                name, rows, k, ncols, code, us, bytes / us / 1e3);
        }
        CK(cudaFree(partials));
        b.free_all();
    }
    cudaFree(dw);
}
#endif

}  // namespace

struct Shape {
    const char * name;
    W t;
    int rows, k;
};

// A column count's random activations for a Q4_K wgmma check against cw: x, the host reference of
// its products, and the buffers with x quantized for the wgmma forms (freed with it).
struct WgCheckColumns {
    std::vector<float> x;
    std::vector<double> ref;
    double ref_max = 0;
    MmaBuffers b;
    WgCheckColumns(const CheckWeights & cw, int rows, int k, int ncols, std::mt19937 & gen) : x((size_t)ncols * k) {
        std::normal_distribution<float> normal(0.0f, 1.0f);
        for (auto & v : x) v = normal(gen);
        ref_max = reference_products(cw.wf, x, rows, k, ncols, 256, ref);
        b.alloc(k, ncols, rows);
        CK(cudaMemcpy(b.x, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
        gemm_kq::quantize_act_wgmma(act_floats(b.x, k), b.yq, b.yd, b.ysum, k, ncols, nullptr);
    }
    ~WgCheckColumns() { b.free_all(); }
    WgCheckColumns(const WgCheckColumns &) = delete;
    WgCheckColumns & operator=(const WgCheckColumns &) = delete;
};

// The int8 warp-specialized kernel with CW consumer warpgroups under the stream split of `tiles`
// tiles over `slots` (wg_stream_plan): its largest difference from `whole` (the unsplit early
// kernel), whether a second launch gave the same bits, and whether the fused residual in place gave
// its outputs plus `res`, one float addition each (CW 1 only).
struct StreamCheck {
    int workers = 0;
    double vs_whole = 0;
    bool relaunch_same = false, res_same = false;
    bool ok(double ref_max) const { return workers >= 2 && vs_whole / ref_max <= 1e-5 && relaunch_same && res_same; }
};
template <int CW>
StreamCheck check_ws_stream(const CheckWeights & cw, const MmaBuffers & b, int rows, int k, int ncols, int tiles,
                            int slots, int min_piece, const std::vector<float> & whole,
                            const std::vector<float> & res) {
    StreamCheck c;
    const gemm_kq::WgSplit sp = gemm_kq::wg_stream_plan(tiles, k / 256, slots, min_piece);
    c.workers = sp.workers;
    float * partials = nullptr;
    CK(cudaMalloc(&partials, std::max<size_t>(1, gemm_kq::wgmma_split_floats<CW>(sp, ncols)) * sizeof(float)));
    std::vector<float> got[2], with_res(whole.size());
    bool ran = true;
    for (auto & g : got) {
        CK(cudaMemset(b.dst, 0, whole.size() * 4));
        ran = ran && gemm_kq::launch_q4k_wgmma_ws<CW>(cw.dev, b.yq, b.yd, b.ysum, b.dst, rows, k, cw.row_bytes, ncols,
                                                      rows, nullptr, sp, partials);
        CK(cudaDeviceSynchronize());
        g.resize(whole.size());
        CK(cudaMemcpy(g.data(), b.dst, g.size() * 4, cudaMemcpyDeviceToHost));
    }
    c.res_same = true;
    if constexpr (CW == 1) {
        CK(cudaMemcpy(b.dst, res.data(), res.size() * 4, cudaMemcpyHostToDevice));
        ran = ran && gemm_kq::launch_q4k_wgmma_ws(cw.dev, b.yq, b.yd, b.ysum, b.dst, rows, k, cw.row_bytes, ncols, rows,
                                                  nullptr, sp, partials, b.dst, rows);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(with_res.data(), b.dst, with_res.size() * 4, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < whole.size(); ++i) {
            const float want = got[0][i] + res[i];
            c.res_same = c.res_same && std::memcmp(&want, &with_res[i], 4) == 0;
        }
    }
    CK(cudaFree(partials));
    for (size_t i = 0; i < whole.size(); ++i)
        c.vs_whole = std::fmax(c.vs_whole, std::fabs((double)got[0][i] - whole[i]));
    c.relaunch_same = ran && std::memcmp(got[0].data(), got[1].data(), whole.size() * 4) == 0;
    if (!ran) c.workers = 0;
    return c;
}

// The wgmma form's tail split (gemm_q4k_wgmma.cuh's WgSplit) for `slots` block slots: against the
// same kernel unsplit (float rounding: 1e-5 of the scale), the host reference (5e-4), itself on a
// second launch (the same bits: the tile counters are back at zero, the pieces summed in order), and
// the pipelined kernel and the early-staging one split the same way (the same bits: "pipe_same",
// "early_same"), the early one with its residual fused in place (its outputs plus the residual:
// "res_same"), and the warp-specialized kernel split the same way (the early one's bits: "ws_same";
// with the residual in place, the early one's with it: "ws_res_same"; with two consumer warpgroups,
// the 2-warpgroup early form's: "ws2_same"). min_piece: the least super-blocks a piece
// (DFLASH_WG_MIN_PIECE's).
void check_wgmma_split(int rows, int k, int slots, std::mt19937 & gen, int min_piece = gemm_kq::kWgMinPieceBlocks) {
    const CheckWeights cw(W::q4_K, rows, k, gen);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int tiles = (rows + gemm_kq::kWgRows - 1) / gemm_kq::kWgRows;
    const gemm_kq::WgSplit split = gemm_kq::wg_split_plan(tiles, k / 256, slots, min_piece);
    for (int ncols : {16, 40, 64}) {
        const WgCheckColumns c(cw, rows, k, ncols, gen);
        const MmaBuffers & b = c.b;
        const std::vector<double> & ref = c.ref;
        const double ref_max = c.ref_max;
        float * partials = nullptr;
        CK(cudaMalloc(&partials, std::max<size_t>(1, gemm_kq::wgmma_split_floats(split, ncols)) * sizeof(float)));
        std::vector<float> whole((size_t)ncols * rows), got[5];
        bool ran =
            gemm_kq::launch_q4k_wgmma(cw.dev, b.yq, b.yd, b.ysum, b.dst, rows, k, cw.row_bytes, ncols, rows, nullptr);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(whole.data(), b.dst, whole.size() * 4, cudaMemcpyDeviceToHost));
        for (int form = 0; form < 5; ++form) {
            std::vector<float> & g = got[form];
            CK(cudaMemset(b.dst, 0, whole.size() * 4));
            auto launch = [&](auto form_tag) {
                constexpr int kForm = decltype(form_tag)::value, kS = kForm == gemm_kq::kWgChunks ? 2 : 4;
                return gemm_kq::launch_q4k_wgmma<kS, 1, kForm == gemm_kq::kWgChunks ? 3 : 1, kForm>(
                    cw.dev, b.yq, b.yd, b.ysum, b.dst, rows, k, cw.row_bytes, ncols, rows, nullptr, 128, 256, split,
                    partials);
            };
            ran = ran && (form < 2    ? launch(std::integral_constant<int, gemm_kq::kWgPlain>{})
                          : form == 2 ? launch(std::integral_constant<int, gemm_kq::kWgPipe>{})
                          : form == 3 ? launch(std::integral_constant<int, gemm_kq::kWgEarly>{})
                                      : launch(std::integral_constant<int, gemm_kq::kWgChunks>{}));
            CK(cudaDeviceSynchronize());
            g.resize(whole.size());
            CK(cudaMemcpy(g.data(), b.dst, g.size() * 4, cudaMemcpyDeviceToHost));
        }
        // the early form with a residual (kRes), in place as the engine's (res == dst): form 3's
        // outputs plus the residual, one float addition each, bit for bit
        std::vector<float> res(whole.size()), with_res(whole.size());
        for (auto & v : res) v = normal(gen);
        CK(cudaMemcpy(b.dst, res.data(), res.size() * 4, cudaMemcpyHostToDevice));
        ran = ran && gemm_kq::launch_q4k_wgmma<4, 1, 1, gemm_kq::kWgEarly>(cw.dev, b.yq, b.yd, b.ysum, b.dst, rows, k,
                                                                           cw.row_bytes, ncols, rows, nullptr, 128, 256,
                                                                           split, partials, b.dst, rows);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(with_res.data(), b.dst, with_res.size() * 4, cudaMemcpyDeviceToHost));
        bool res_same = true;
        for (size_t i = 0; i < whole.size(); ++i) {
            const float want = got[3][i] + res[i];
            res_same = res_same && std::memcmp(&want, &with_res[i], 4) == 0;
        }
        // the warp-specialized kernel split the same way: the early form's bits, and with the residual
        // in place the early form's with it (DFLASH_WGMMA_WS=4's fused residual)
        std::vector<float> ws(whole.size()), ws_res(whole.size());
        CK(cudaMemset(b.dst, 0, ws.size() * 4));
        ran = ran && gemm_kq::launch_q4k_wgmma_ws(cw.dev, b.yq, b.yd, b.ysum, b.dst, rows, k, cw.row_bytes, ncols, rows,
                                                  nullptr, split, partials);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(ws.data(), b.dst, ws.size() * 4, cudaMemcpyDeviceToHost));
        const bool ws_same = std::memcmp(ws.data(), got[3].data(), ws.size() * 4) == 0;
        CK(cudaMemcpy(b.dst, res.data(), res.size() * 4, cudaMemcpyHostToDevice));
        ran = ran && gemm_kq::launch_q4k_wgmma_ws(cw.dev, b.yq, b.yd, b.ysum, b.dst, rows, k, cw.row_bytes, ncols, rows,
                                                  nullptr, split, partials, b.dst, rows);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(ws_res.data(), b.dst, ws_res.size() * 4, cudaMemcpyDeviceToHost));
        const bool ws_res_same = std::memcmp(ws_res.data(), with_res.data(), ws_res.size() * 4) == 0;
        // persistent (a block a slot, walking the items): the same bits, plain and with the residual
        std::vector<float> wsp(whole.size()), wsp_res(whole.size());
        CK(cudaMemset(b.dst, 0, wsp.size() * 4));
        ran = ran && gemm_kq::launch_q4k_wgmma_ws(cw.dev, b.yq, b.yd, b.ysum, b.dst, rows, k, cw.row_bytes, ncols, rows,
                                                  nullptr, split, partials, nullptr, 0, 1);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(wsp.data(), b.dst, wsp.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(b.dst, res.data(), res.size() * 4, cudaMemcpyHostToDevice));
        ran = ran && gemm_kq::launch_q4k_wgmma_ws(cw.dev, b.yq, b.yd, b.ysum, b.dst, rows, k, cw.row_bytes, ncols, rows,
                                                  nullptr, split, partials, b.dst, rows, 1);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(wsp_res.data(), b.dst, wsp_res.size() * 4, cudaMemcpyDeviceToHost));
        const bool ws_persistent_same = std::memcmp(wsp.data(), ws.data(), wsp.size() * 4) == 0 &&
                                        std::memcmp(wsp_res.data(), ws_res.data(), wsp.size() * 4) == 0;
        // two warpgroups a block (128-row tiles): their own split of the same slots, against the whole
        const gemm_kq::WgSplit split2 = gemm_kq::wg_split_plan((rows + 127) / 128, k / 256, slots, min_piece);
        float * partials2 = nullptr;
        CK(cudaMalloc(&partials2, std::max<size_t>(1, gemm_kq::wgmma_split_floats<2>(split2, ncols)) * sizeof(float)));
        CK(cudaMemset(b.dst, 0, whole.size() * 4));
        ran = ran && gemm_kq::launch_q4k_wgmma<4, 2, 1, gemm_kq::kWgEarly>(cw.dev, b.yq, b.yd, b.ysum, b.dst, rows, k,
                                                                           cw.row_bytes, ncols, rows, nullptr, 128, 256,
                                                                           split2, partials2);
        CK(cudaDeviceSynchronize());
        std::vector<float> two(whole.size()), ws2(whole.size());
        CK(cudaMemcpy(two.data(), b.dst, two.size() * 4, cudaMemcpyDeviceToHost));
        // the warp-specialized kernel with two consumer warpgroups, split as those 128-row tiles
        CK(cudaMemset(b.dst, 0, ws2.size() * 4));
        ran = ran && gemm_kq::launch_q4k_wgmma_ws<2>(cw.dev, b.yq, b.yd, b.ysum, b.dst, rows, k, cw.row_bytes, ncols,
                                                     rows, nullptr, split2, partials2);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(ws2.data(), b.dst, ws2.size() * 4, cudaMemcpyDeviceToHost));
        const bool ws2_same = std::memcmp(ws2.data(), two.data(), ws2.size() * 4) == 0;
        CK(cudaMemset(b.dst, 0, ws2.size() * 4));
        ran = ran && gemm_kq::launch_q4k_wgmma_ws<2>(cw.dev, b.yq, b.yd, b.ysum, b.dst, rows, k, cw.row_bytes, ncols,
                                                     rows, nullptr, split2, partials2, nullptr, 0, 1);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(wsp.data(), b.dst, wsp.size() * 4, cudaMemcpyDeviceToHost));
        const bool ws2_persistent_same = std::memcmp(wsp.data(), ws2.data(), wsp.size() * 4) == 0;
        CK(cudaFree(partials2));
        // the stream split (wg_stream_plan, 1 and 2 consumer warpgroups): against the whole, the same
        // bits on a second launch, and with the residual in place its outputs plus the residual
        const StreamCheck st1 = check_ws_stream<1>(cw, b, rows, k, ncols, tiles, slots, min_piece, whole, res);
        const StreamCheck st2 =
            check_ws_stream<2>(cw, b, rows, k, ncols, (rows + 127) / 128, slots, min_piece, whole, res);
        const bool stream_ok = st1.ok(ref_max) && st2.ok(ref_max);
        double err_whole = 0, err_ref = 0, err_two = 0;
        for (size_t i = 0; i < whole.size(); ++i) {
            err_whole = std::fmax(err_whole, std::fabs((double)got[0][i] - whole[i]));
            err_ref = std::fmax(err_ref, std::fabs(got[0][i] - ref[i]));
            err_two = std::fmax(err_two, std::fabs((double)two[i] - whole[i]));
        }
        const bool same = std::memcmp(got[0].data(), got[1].data(), whole.size() * 4) == 0;
        const bool pipe_same = std::memcmp(got[0].data(), got[2].data(), whole.size() * 4) == 0;
        const bool early_same = std::memcmp(got[0].data(), got[3].data(), whole.size() * 4) == 0;
        const bool chunks_same = std::memcmp(got[0].data(), got[4].data(), whole.size() * 4) == 0;
        std::printf(
            "{\"check_wgmma_split\": \"q4_K\", \"rows\": %d, \"k\": %d, \"ncols\": %d, \"slots\": %d, "
            "\"full_tiles\": %d, \"tail\": %d, \"pieces\": %d, \"vs_whole\": %.3g, \"rel_err\": %.3g, "
            "\"relaunch_same\": %s, \"pipe_same\": %s, \"early_same\": %s, \"chunks_same\": %s, "
            "\"res_same\": %s, \"ws_same\": %s, \"ws_res_same\": %s, \"ws2_same\": %s, \"ws_persistent_same\": %s, "
            "\"ws2_persistent_same\": %s, \"stream_workers\": [%d, %d], \"stream_vs_whole\": [%.3g, %.3g], "
            "\"stream_ok\": %s, \"two_wg_pieces\": %d, "
            "\"two_wg_vs_whole\": %.3g, \"out_hash\": \"%016llx\", \"two_wg_hash\": \"%016llx\", \"ok\": %s}\n",
            rows, k, ncols, slots, split.full_tiles, split.tail, split.pieces, err_whole / ref_max, err_ref / ref_max,
            same ? "true" : "false", pipe_same ? "true" : "false", early_same ? "true" : "false",
            chunks_same ? "true" : "false", res_same ? "true" : "false", ws_same ? "true" : "false",
            ws_res_same ? "true" : "false", ws2_same ? "true" : "false", ws_persistent_same ? "true" : "false",
            ws2_persistent_same ? "true" : "false", st1.workers, st2.workers, st1.vs_whole / ref_max,
            st2.vs_whole / ref_max, stream_ok ? "true" : "false", split2.pieces, err_two / ref_max,
            (unsigned long long)bits_hash(got[0]), (unsigned long long)bits_hash(two),
            ran && same && pipe_same && early_same && chunks_same && res_same && ws_same && ws_res_same && ws2_same &&
                    ws_persistent_same && ws2_persistent_same && stream_ok && split.pieces > 1 && split2.pieces > 1 &&
                    err_whole / ref_max <= 1e-5 && err_two / ref_max <= 1e-5 && err_ref / ref_max <= 5e-4
                ? "true"
                : "false");
        CK(cudaFree(partials));
    }
}

// The f16 wgmma GEMM (gemm_f16_wgmma.cuh): its operands on the host as the kernel forms them (each
// Q6_K weight half(half(d * sc) * (q - 32)), each Q4_K one half(half(d * sc) * q + half(-dmin * m)),
// each activation half(x)), and the products of those in double (ref_ops: what the kernel computes
// but for the f32 accumulation order), and of the exact weights and activations (ref).
std::vector<float> f16_weights(W t, const uint8_t * row, int k) {
    std::vector<float> out((size_t)k);
    for (int kb = 0; kb < k / 256; ++kb) {
        if (t == W::q4_K) {
            const uint8_t * b = row + (size_t)kb * 144;
            uint16_t hd, hm;
            std::memcpy(&hd, b, 2);
            std::memcpy(&hm, b + 2, 2);
            const float d = half_to_float(hd), dmin = half_to_float(hm);
            for (int l = 0; l < 256; ++l) {
                const int j = l / 32, v = l % 32;
                int sc, m;
                scale_min_k4(j, b + 4, sc, m);
                const float s = half_to_float(float_to_half(d * (float)sc));
                const float mb = half_to_float(float_to_half(-dmin * (float)m));
                const int q = (b[16 + 32 * (j / 2) + v] >> (4 * (j % 2))) & 15;
                out[(size_t)kb * 256 + l] = half_to_float(float_to_half((float)((double)s * q + mb)));
            }
            continue;
        }
        const uint8_t * b = row + (size_t)kb * 210;
        uint16_t dh;
        std::memcpy(&dh, b + 208, 2);
        const float d = half_to_float(dh);
        for (int l = 0; l < 256; ++l) {
            const int n = l / 128, q = (l % 128) / 32, p = l % 32;
            const int lo = (b[64 * n + 32 * (q & 1) + p] >> (4 * (q >> 1))) & 15;
            const int hi = (b[128 + 32 * n + p] >> (2 * q)) & 3;
            const int sc = (int8_t)b[192 + l / 16];
            const float s = half_to_float(float_to_half(d * (float)sc));
            out[(size_t)kb * 256 + l] = half_to_float(float_to_half(s * (float)((lo | (hi << 4)) - 32)));
        }
    }
    return out;
}

// The kernel for type t (F: F16Q6K or F16Q4K; 3 and 4 stages, 1 and 2 warpgroups, with a residual,
// with the tail split for `slots` block slots when slots > 0) against ref_ops (5e-5 of the largest
// product: the order and precision of the tensor cores' f32 sums, 2.3e-5 at k = 17408 on the H100)
// and ref (2e-3: the f16 roundings); the f16 activations against the host's, half for half.
template <typename F>
void check_f16_wgmma(W t, int rows, int k, std::mt19937 & gen, std::initializer_list<int> ncols_list, int slots = 0) {
    const int nb = k / 256;
    const int64_t row_bytes = (int64_t)nb * superblock_bytes(t);
    const auto w = random_rows(t, rows, k, gen);
    std::vector<float> wf((size_t)rows * k), wh;
    wh.reserve((size_t)rows * k);
    for (int r = 0; r < rows; ++r) {
        dequant_row(t, w.data() + r * row_bytes, k, wf.data() + (size_t)r * k);
        const auto h = f16_weights(t, w.data() + r * row_bytes, k);
        wh.insert(wh.end(), h.begin(), h.end());
    }
    char * dw = nullptr;
    CK(cudaMalloc(&dw, w.size()));
    CK(cudaMemcpy(dw, w.data(), w.size(), cudaMemcpyHostToDevice));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int ncols : ncols_list) {
        const int np = gemm_kq::wg_padded_columns(ncols);
        std::vector<float> x((size_t)ncols * k), res((size_t)ncols * rows);
        for (auto & v : x) v = normal(gen);
        for (auto & v : res) v = normal(gen);
        std::vector<double> ref((size_t)ncols * rows), ref_ops((size_t)ncols * rows);
        double ref_max = 0;
        for (int j = 0; j < ncols; ++j) {
            for (int r = 0; r < rows; ++r) {
                double s = 0, so = 0;
                for (int i = 0; i < k; ++i) {
                    const float xv = x[(size_t)j * k + i];
                    s += (double)wf[(size_t)r * k + i] * xv;
                    so += (double)wh[(size_t)r * k + i] * half_to_float(float_to_half(xv));
                }
                ref[(size_t)j * rows + r] = s, ref_ops[(size_t)j * rows + r] = so;
                ref_max = std::fmax(ref_max, std::fabs(s));
            }
        }
        float *dx = nullptr, *dst = nullptr, *dres = nullptr, *partials = nullptr;
        __half * act = nullptr;
        CK(cudaMalloc(&dx, x.size() * 4));
        CK(cudaMalloc(&dst, res.size() * 4));
        CK(cudaMalloc(&dres, res.size() * 4));
        CK(cudaMalloc(&act, gemm_kq::f16_act_halves(k, ncols) * 2));
        CK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dres, res.data(), res.size() * 4, cudaMemcpyHostToDevice));
        gemm_kq::convert_act_f16(act_floats(dx, k), act, k, ncols, np, nullptr);
        // the activations, half for half at f16_act_index (padded columns zero)
        std::vector<uint16_t> ah(gemm_kq::f16_act_halves(k, ncols));
        CK(cudaMemcpy(ah.data(), act, ah.size() * 2, cudaMemcpyDeviceToHost));
        bool act_ok = true;
        for (int col = 0; col < np; ++col) {
            for (int v = 0; v < k; ++v) {
                const uint16_t want = col < ncols ? float_to_half(x[(size_t)col * k + v]) : 0;
                act_ok &= ah[gemm_kq::f16_act_index(v / 256, v % 256, col, np)] == want;
            }
        }
        const int tiles = (rows + gemm_kq::kWgRows - 1) / gemm_kq::kWgRows;
        const gemm_kq::WgSplit split = slots > 0 ? gemm_kq::wg_split_plan(tiles, nb, slots) : gemm_kq::WgSplit{};
        CK(cudaMalloc(&partials, std::max<size_t>(1, gemm_kq::wgmma_split_floats(split, ncols)) * 4));
        // 0: 3 stages, 1: 4 stages, 2: 2 warpgroups, 3: residual; the warp-specialized kernel
        // (gemm_f16_wgmma_ws.cuh) as 4: form 0 (its split), 5: form 2 (unsplit), 6: form 3, each
        // with that form's bits
        std::vector<float> outs[7];
        for (int form = 0; form < 7; ++form) {
            CK(cudaMemset(dst, 0, res.size() * 4));
            bool ran = false;
            const int like = form == 4 ? 0 : form == 5 ? 2 : form == 6 ? 3 : form;  // the form it stands for
            const bool ws = form >= 4, with_res = like == 3;
            const float * r = with_res ? dres : nullptr;
            const gemm_kq::WgSplit sp = like == 0 || like == 3 ? split : gemm_kq::WgSplit{};
            if (like == 1) {
                ran = gemm_kq::launch_f16_wgmma<F, 4>(dw, act, dst, rows, k, row_bytes, ncols, rows, nullptr);
            } else if (like == 2) {
                ran = ws ? gemm_kq::launch_f16_wgmma_ws<F, 2>(dw, act, dst, rows, k, row_bytes, ncols, rows, nullptr)
                         : gemm_kq::launch_f16_wgmma<F, 3, 2>(dw, act, dst, rows, k, row_bytes, ncols, rows, nullptr);
            } else if (ws) {
                ran = gemm_kq::launch_f16_wgmma_ws<F, 1>(dw, act, dst, rows, k, row_bytes, ncols, rows, nullptr, r,
                                                         with_res ? rows : 0, sp, partials);
            } else {
                ran = gemm_kq::launch_f16_wgmma<F, 3>(dw, act, dst, rows, k, row_bytes, ncols, rows, nullptr, r,
                                                      with_res ? rows : 0, sp, partials);
            }
            CK(cudaDeviceSynchronize());
            std::vector<float> & got = outs[form];
            got.resize(res.size());
            CK(cudaMemcpy(got.data(), dst, got.size() * 4, cudaMemcpyDeviceToHost));
            double err_ops = 0, err = 0;
            for (size_t i = 0; i < got.size(); ++i) {
                const double base = with_res ? (double)got[i] - res[i] : (double)got[i];
                err_ops = std::fmax(err_ops, std::fabs(base - ref_ops[i]));
                err = std::fmax(err, std::fabs(base - ref[i]));
            }
            const bool same = std::memcmp(got.data(), outs[like].data(), got.size() * 4) == 0;
            std::printf(
                "{\"check_f16_wgmma\": \"%s\", \"rows\": %d, \"k\": %d, \"ncols\": %d, \"form\": %d, \"pieces\": %d, "
                "\"ran\": %s, \"act_ok\": %s, \"rel_err_ops\": %.3g, \"rel_err\": %.3g, \"same_bits\": %s, \"ok\": "
                "%s}\n",
                type_name(t), rows, k, ncols, form, form == 5 ? 1 : split.pieces, ran ? "true" : "false",
                act_ok ? "true" : "false", err_ops / ref_max, err / ref_max, same ? "true" : "false",
                ran && act_ok && same && err_ops / ref_max <= 5e-5 && err / ref_max <= 2e-3 ? "true" : "false");
        }
        cudaFree(dx);
        cudaFree(dst);
        cudaFree(dres);
        cudaFree(act);
        cudaFree(partials);
    }
    cudaFree(dw);
}

#if !defined(DFLASH_CUDA_EMU)
// The f16 wgmma GEMM against the engine's int8 forms (mma.sync code 2 for Q6_K; for Q4_K code 102
// and the int8 wgmma form, the engine's above 32 columns on tall matrices) on the 27B's matrices,
// us a launch (weights cycled through copies past the L2), and each form's activation kernel.
template <typename F>
void bench_f16_wgmma(const char * name, W t, int rows, int k, std::mt19937 & gen, int nsm) {
    const int64_t row_bytes = (int64_t)(k / 256) * superblock_bytes(t);
    const size_t bytes = (size_t)rows * row_bytes;
    const int copies = (int)std::max<size_t>(2, (size_t)(400u << 20) / bytes + 1);
    char * dw = weight_copies(t, rows, k, bytes, copies, gen);
    float * partials = nullptr;
    CK(cudaMalloc(&partials, (size_t)1024 * 64 * 64 * 8 * 4));
    for (int ncols : {16, 24, 32, 48, 64}) {
        MmaBuffers b;
        b.alloc(k, ncols, rows);
        CK(cudaMemset(b.x, 0, (size_t)ncols * k * 4));
        __half * act = nullptr;
        CK(cudaMalloc(&act, gemm_kq::f16_act_halves(k, ncols) * 2));
        const int np = gemm_kq::wg_padded_columns(ncols);
        const int reps = 5;
        auto timed = [&](auto && once) {
            for (int c = 0; c < copies; ++c) once(c);
            return time_us(reps * copies, [&] {
                for (int i = 0; i < reps; ++i) {
                    for (int c = 0; c < copies; ++c) once(c);
                }
            });
        };
        const double us_quant = timed([&](int) { b.quantize(t, k, ncols); });
        const double us_conv =
            timed([&](int) { gemm_kq::convert_act_f16(act_floats(b.x, k), act, k, ncols, np, nullptr); });
        b.quantize(t, k, ncols);
        gemm_kq::convert_act_f16(act_floats(b.x, k), act, k, ncols, np, nullptr);
        const double us_mma =
            timed([&](int c) { run_mma(t, t == W::q6_K ? 2 : 102, dw + bytes * c, b, rows, k, row_bytes, ncols); });
        double us_int8_wgmma = 0;
        if (t == W::q4_K) {
            gemm_kq::quantize_act_wgmma(act_floats(b.x, k), b.yq, b.yd, b.ysum, k, ncols, nullptr);
            const auto sp = gemm_kq::wgmma_split_for<4, 1, 1, gemm_kq::kWgEarly>(rows, k, ncols, nsm);
            us_int8_wgmma = timed([&](int c) {
                gemm_kq::launch_q4k_wgmma<4, 1, 1, gemm_kq::kWgEarly>(dw + bytes * c, b.yq, b.yd, b.ysum, b.dst, rows,
                                                                      k, row_bytes, ncols, rows, nullptr, 128, 256, sp,
                                                                      partials);
            });
        }
        // forms: stages / warpgroups / split
        const auto sp3 = gemm_kq::f16_wgmma_split_for<F, 3, 1, 1>(rows, k, ncols, nsm);
        const auto sp4 = gemm_kq::f16_wgmma_split_for<F, 4, 1, 1>(rows, k, ncols, nsm);
        const auto sp3w2 = gemm_kq::f16_wgmma_split_for<F, 3, 2, 1>(rows, k, ncols, nsm);
        const double us_s3 = timed([&](int c) {
            gemm_kq::launch_f16_wgmma<F, 3>(dw + bytes * c, act, b.dst, rows, k, row_bytes, ncols, rows, nullptr);
        });
        // one f16 form's launch, split as sp, on the weights of copy c
        auto timed_split = [&](auto launch, const gemm_kq::WgSplit & sp) {
            return timed([&](int c) {
                launch(dw + bytes * c, act, b.dst, rows, k, row_bytes, ncols, rows, nullptr, nullptr, 0, sp, partials);
            });
        };
        const double us_s3_split = timed_split(gemm_kq::launch_f16_wgmma<F, 3>, sp3);
        const double us_s4_split = timed_split(gemm_kq::launch_f16_wgmma<F, 4>, sp4);
        const double us_w2_split = timed_split(gemm_kq::launch_f16_wgmma<F, 3, 2>, sp3w2);
        // the warp-specialized kernel (gemm_f16_wgmma_ws.cuh), one and two consumer warpgroups, split
        const auto spws = gemm_kq::f16_wgmma_ws_split_for<F, 1>(rows, k, ncols, nsm);
        const auto spws2 = gemm_kq::f16_wgmma_ws_split_for<F, 2>(rows, k, ncols, nsm);
        const double us_ws_split = timed_split(gemm_kq::launch_f16_wgmma_ws<F, 1>, spws);
        const double us_ws2_split = timed_split(gemm_kq::launch_f16_wgmma_ws<F, 2>, spws2);
        std::printf(
            "{\"bench_f16_wgmma\": \"%s\", \"type\": \"%s\", \"rows\": %d, \"k\": %d, \"n\": %d, \"us_mma\": %.2f, "
            "\"us_int8_wgmma\": %.2f, \"us_wg_s3\": %.2f, \"us_wg_s3_split\": %.2f, \"pieces_s3\": %d, "
            "\"us_wg_s4_split\": %.2f, \"us_wg_2wg_split\": %.2f, \"pieces_2wg\": %d, \"us_quantize_int8\": %.2f, "
            "\"us_convert_f16\": %.2f, \"us_ws_split\": %.2f, \"us_ws2_split\": %.2f, \"GBps_best_wg\": %.0f}\n",
            name, type_name(t), rows, k, ncols, us_mma, us_int8_wgmma, us_s3, us_s3_split, sp3.pieces, us_s4_split,
            us_w2_split, sp3w2.pieces, us_quant, us_conv, us_ws_split, us_ws2_split,
            bytes / std::min({us_s3, us_s3_split, us_s4_split, us_w2_split, us_ws_split, us_ws2_split}) / 1e3);
        CK(cudaGetLastError());
        cudaFree(act);
        b.free_all();
    }
    cudaFree(partials);
    cudaFree(dw);
}
#endif

// The mma.sync GEMM split along K into `pieces` blocks a row tile (gemm_kq's kPieces kernels; the
// engine's DFLASH_MMA_SPLIT) for type t (Q4_K in the engine's min-sum form, or Q6_K): against the
// unsplit kernel (float rounding: 1e-5 of the largest product), the host reference, itself on a
// second launch (the same bits: the tile counters are back at zero, the pieces summed in order) and,
// with a residual, its own outputs plus the residual bit for bit.
template <typename F, bool kSplitK = true, bool kActSmem = false>
void check_mma_split(W t, int rows, int k, int pieces, std::mt19937 & gen) {
    const CheckWeights cw(t, rows, k, gen);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int ncols : {17, 32, 40, 64}) {
        const size_t n = (size_t)ncols * rows;
        std::vector<float> x((size_t)ncols * k), res(n);
        for (auto & v : x) v = normal(gen);
        for (auto & v : res) v = normal(gen);
        std::vector<double> ref;
        const double ref_max = reference_products(cw.wf, x, rows, k, ncols, 256, ref);
        MmaBuffers b;
        b.alloc(k, ncols, rows);
        CK(cudaMemcpy(b.x, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
        b.quantize(t, k, ncols);
        float *partials = nullptr, *dres = nullptr;
        const int nct = gemm_kq::padded_columns(ncols) / 8;
        CK(cudaMalloc(&partials, gemm_kq::mma_split_floats(rows, pieces, gemm_kq::kWarps, kSplitK, 1, nct) * 4));
        CK(cudaMalloc(&dres, n * 4));
        CK(cudaMemcpy(dres, res.data(), n * 4, cudaMemcpyHostToDevice));
        std::vector<float> whole(n), split(n), again(n), with_res(n);
        auto get = [&](std::vector<float> & out) {
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(out.data(), b.dst, n * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemset(b.dst, 0, n * 4));
        };
        bool ran = gemm_kq::launch<F, 2>(cw.dev, b.yq, b.yd, b.ysum, b.dst, rows, k, cw.row_bytes, ncols, rows, 0);
        get(whole);
        for (std::vector<float> * out : {&split, &again}) {
            ran = ran && gemm_kq::launch<F, 2, true, gemm_kq::kWarps, kSplitK, 1, false, kActSmem, true, kActSmem>(
                             cw.dev, b.yq, b.yd, b.ysum, b.dst, rows, k, cw.row_bytes, ncols, rows, 0, nullptr, 0,
                             pieces, partials);
            get(*out);
        }
        ran = ran && gemm_kq::launch<F, 2, true, gemm_kq::kWarps, kSplitK, 1, true, kActSmem, true, kActSmem>(
                         cw.dev, b.yq, b.yd, b.ysum, b.dst, rows, k, cw.row_bytes, ncols, rows, 0, dres, rows, pieces,
                         partials);
        get(with_res);
        double err_whole = 0, err_ref = 0;
        bool res_added = true;
        for (size_t i = 0; i < n; ++i) {
            err_whole = std::fmax(err_whole, std::fabs((double)split[i] - whole[i]));
            err_ref = std::fmax(err_ref, std::fabs(split[i] - ref[i]));
            const float want = split[i] + res[i];
            res_added = res_added && std::memcmp(&want, &with_res[i], 4) == 0;
        }
        const bool same = std::memcmp(split.data(), again.data(), n * 4) == 0;
        const double tol = std::is_same_v<F, gemm_kq::Q6K> ? 1e-4 : 5e-4;  // the min sums in f16: 1 in 4064
        std::printf(
            "{\"check_mma_split\": \"%s\", \"warp_rows\": %s, \"act_smem\": %s, \"rows\": %d, \"k\": %d, \"ncols\": "
            "%d, "
            "\"pieces\": %d, \"vs_whole\": %.3g, \"rel_err\": %.3g, \"relaunch_same\": %s, \"residual_added\": %s, "
            "\"ok\": %s}\n",
            type_name(t), kSplitK ? "false" : "true", kActSmem ? "true" : "false", rows, k, ncols, pieces,
            err_whole / ref_max, err_ref / ref_max, same ? "true" : "false", res_added ? "true" : "false",
            ran && same && res_added && err_whole / ref_max <= 1e-5 && err_ref / ref_max <= tol ? "true" : "false");
        CK(cudaFree(partials));
        CK(cudaFree(dres));
        b.free_all();
    }
}

// The split along K timed against the unsplit kernel (pieces 1) on the 27B's long rows, for the
// column counts of a verify above 16 (what DFLASH_MMA_SPLIT=pieces runs in the engine).
template <typename F>
void bench_mma_split(const char * name, W t, int rows, int k, std::mt19937 & gen) {
    // warp_rows: each warp of a block on rows of its own, the 4 reading the same activations
    const int64_t row_bytes = (int64_t)(k / 256) * superblock_bytes(t);
    const size_t bytes = (size_t)rows * row_bytes;
    const int copies = (int)std::max<size_t>(2, (size_t)(400u << 20) / bytes + 1);
    char * dw = weight_copies(t, rows, k, bytes, copies, gen);
    for (int ncols : {24, 32, 48, 64}) {
        MmaBuffers b;
        b.alloc(k, ncols, rows);
        CK(cudaMemset(b.x, 0, (size_t)ncols * k * 4));
        b.quantize(t, k, ncols);
        const int nct = gemm_kq::padded_columns(ncols) / 8;
        float * partials = nullptr;
        CK(cudaMalloc(&partials, gemm_kq::mma_split_floats(rows, 8, gemm_kq::kWarps, false, 1, nct) * 4));
        for (int form = 0; form < 3 * 6; ++form) {  // the engine's form, warp_rows, warp_rows + act_smem
            const bool warp_rows = form >= 6, act_smem = form >= 12;
            const int pieces = std::array<int, 6>{1, 2, 3, 4, 6, 8}[form % 6];
            if (k / 256 / pieces < (warp_rows ? 1 : gemm_kq::kWarps) || (warp_rows && pieces == 1)) continue;
            auto once = [&](const char * w) {
                if (pieces == 1) {
                    gemm_kq::launch<F, 2>(w, b.yq, b.yd, b.ysum, b.dst, rows, k, row_bytes, ncols, rows, 0);
                } else if (act_smem) {
                    gemm_kq::launch<F, 2, true, gemm_kq::kWarps, false, 1, false, true, true, true>(
                        w, b.yq, b.yd, b.ysum, b.dst, rows, k, row_bytes, ncols, rows, 0, nullptr, 0, pieces, partials);
                } else if (warp_rows) {
                    gemm_kq::launch<F, 2, true, gemm_kq::kWarps, false, 1, false, false, true>(
                        w, b.yq, b.yd, b.ysum, b.dst, rows, k, row_bytes, ncols, rows, 0, nullptr, 0, pieces, partials);
                } else {
                    gemm_kq::launch<F, 2, true, gemm_kq::kWarps, true, 1, false, false, true>(
                        w, b.yq, b.yd, b.ysum, b.dst, rows, k, row_bytes, ncols, rows, 0, nullptr, 0, pieces, partials);
                }
            };
            const int reps = 5;
            for (int c = 0; c < copies; ++c) once(dw + bytes * c);
            const double us = time_us(reps * copies, [&] {
                for (int i = 0; i < reps; ++i) {
                    for (int c = 0; c < copies; ++c) once(dw + bytes * c);
                }
            });
            std::printf(
                "{\"bench_mma_split\": \"%s\", \"type\": \"%s\", \"rows\": %d, \"k\": %d, \"n\": %d, "
                "\"pieces\": %d, \"warp_rows\": %s, \"act_smem\": %s, \"us\": %.2f, \"GBps\": %.0f}\n",
                name, type_name(t), rows, k, ncols, pieces, warp_rows ? "true" : "false", act_smem ? "true" : "false",
                us, bytes / us / 1e3);
        }
        CK(cudaFree(partials));
        b.free_all();
    }
    cudaFree(dw);
}

#ifndef DFLASH_CUDA_EMU
// us a launch of `once` (one quantizer launch on stream st): 200 launches in a CUDA graph (as the
// engine runs them, with PDL), the graph replayed 5 times.
template <typename Fn>
double graph_us(cudaStream_t st, Fn && once) {
    const int launches = 200, reps = 5;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < launches; ++i) once();
    CK(cudaStreamEndCapture(st, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaGraphLaunch(exec, st));  // warm
    CK(cudaStreamSynchronize(st));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0, st));
    for (int r = 0; r < reps; ++r) CK(cudaGraphLaunch(exec, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    return 1000.0 * ms / (reps * launches);
}

// The GEMM's quantizer, us a launch: (1) of an RMSNorm source (the 27B's hidden size, 5120) in one
// form and the other (gemm_kq::quantize_norm_column: a block a column, or the blocks of
// quantize_act_k_kernel that each sum the column's scale) for 8..64 columns and the layouts the
// engine asks for: Q4_K's, Q6_K's, the pair of both (rms_norm_fusion.cu) and the wgmma form's, the
// latter also with a float a load (per_super_block_floats: ActSource::runs16 off); (2) of a SwiGLU
// source (the 27B's ffn_down input, 17408) at 8..64 columns with a value a thread and 8
// (gemm_kq::quantize_v8_from), 8 also with a float a load ("V=8 floats").
void bench_quant(std::mt19937 & gen) {
    using gemm_kq::ActLayout;
    const int k = 5120, kf = 17408;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> xs((size_t)64 * 2 * kf), ws(k);
    for (auto & v : xs) v = normal(gen);
    for (auto & v : ws) v = 1.0f + 0.25f * normal(gen);
    float *d_x = nullptr, *d_w = nullptr, *d = nullptr;
    int8_t *q1 = nullptr, *q2 = nullptr;
    int * sums = nullptr;
    CK(cudaMalloc(&d_x, xs.size() * 4));
    CK(cudaMalloc(&d_w, ws.size() * 4));
    CK(cudaMemcpy(d_x, xs.data(), xs.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_w, ws.data(), ws.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&q1, (size_t)64 * kf));
    CK(cudaMalloc(&q2, (size_t)64 * kf));
    CK(cudaMalloc(&d, (size_t)64 * kf / 32 * 4));
    CK(cudaMalloc(&sums, (size_t)64 * kf / 32 * 4));
    const ActSource x = norm_source(d_x, d_w, k, 1e-6f);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (const std::string layout : {"q4_K", "q6_K", "pair", "wgmma"}) {
        for (int ncols : {8, 16, 32, 64}) {
            const int np = gemm_kq::padded_columns(ncols);
            for (const std::string form : {"per_super_block", "column", "per_super_block_floats"}) {
                gemm_kq::quantize_norm_column_flag() = form == "column";
                gemm_kq::quantize_runs16_flag() = form != "per_super_block_floats";
                const double us = graph_us(st, [&] {
                    if (layout == "q4_K") {
                        gemm_kq::launch_quantize_act<ActLayout::kRun, 256>(x, q1, d, sums, k, ncols, np, st);
                    } else if (layout == "q6_K") {
                        gemm_kq::launch_quantize_act<ActLayout::kHalves, 256>(x, q1, d, sums, k, ncols, np, st);
                    } else if (layout == "pair") {
                        gemm_kq::launch_quantize_act<ActLayout::kRun, 256, ActLayout::kHalves>(x, q1, d, sums, k, ncols,
                                                                                               np, st, q2);
                    } else {
                        gemm_kq::launch_quantize_act<ActLayout::kWgmma, 256>(x, q1, d, sums, k, ncols, np, st);
                    }
                });
                std::printf(
                    "{\"bench_quant\": \"norm\", \"layout\": \"%s\", \"k\": %d, \"n\": %d, "
                    "\"form\": \"%s\", \"us\": %.3f}\n",
                    layout.c_str(), k, ncols, form.c_str(), us);
            }
        }
    }
    gemm_kq::quantize_norm_column_flag() = false;  // the defaults
    gemm_kq::quantize_runs16_flag() = true;
    ActSource glu = act_floats(d_x, kf);
    glu.sx = 2 * kf;
    glu.up = d_x + kf;
    glu.sup = 2 * kf;
    for (const std::string layout : {"q4_K", "q6_K"}) {
        for (int ncols : {8, 16, 32, 64}) {
            for (int from : {24, 8, -8}) {               // -8: V = 8 with the loads of a float each (runs16 off)
                if (ncols > 16 && from == 24) continue;  // the same launch as 8 there
                gemm_kq::quantize_v8_from() = from < 0 ? -from : from;
                gemm_kq::quantize_runs16_flag() = from > 0;
                const int np = gemm_kq::padded_columns(ncols);
                const double us = graph_us(st, [&] {
                    if (layout == "q4_K") {
                        gemm_kq::launch_quantize_act<ActLayout::kRun, 256>(glu, q1, d, sums, kf, ncols, np, st);
                    } else {
                        gemm_kq::launch_quantize_act<ActLayout::kHalves, 256>(glu, q1, d, sums, kf, ncols, np, st);
                    }
                });
                std::printf(
                    "{\"bench_quant\": \"swiglu\", \"layout\": \"%s\", \"k\": %d, \"n\": %d, "
                    "\"form\": \"V=%d%s\", \"us\": %.3f}\n",
                    layout.c_str(), kf, ncols, gemm_kq::quantize_values_per_thread(np), from < 0 ? " floats" : "", us);
            }
        }
    }
    gemm_kq::quantize_v8_from() = 8;  // the default
    gemm_kq::quantize_runs16_flag() = true;
    CK(cudaStreamDestroy(st));
    for (void * p : {(void *)d_x, (void *)d_w, (void *)d, (void *)q1, (void *)q2, (void *)sums}) cudaFree(p);
}
#endif

int main(int argc, char ** argv) {
    const std::string what = argc > 1 ? argv[1] : "all";
    std::mt19937 gen(1);
    if (what == "all" || what == "check" || what == "q6") {
        for (W t : {W::q4_K, W::q6_K, W::q5_K, W::q8_0}) {
            check(t, 70, 256, gen);     // 1 super-block (tiny-c's hidden size)
            check(t, 90, 512, gen);     // 2 (tiny-c's FFN size)
            check(t, 300, 1024, gen);   // 4 super-blocks: short rows, most groups idle
            check(t, 517, 6144, gen);   // 24: odd row count, split 2 by default
            check(t, 130, 17408, gen);  // 68: split 4 by default
        }
    }
    if (what == "check_quick") {  // small shapes of every type, tails included (the emulator under ASan)
        for (W t : {W::q4_K, W::q6_K, W::q5_K, W::q8_0}) {
            check(t, 70, 256, gen);
            check(t, 37, 2304, gen);  // 9 super-blocks: odd, every row's alignment for Q6_K
        }
        check_mma(W::q4_K, 37, 768, gen);
        check_mma(W::q6_K, 37, 768, gen);
        check_mma(W::q5_K, 37, 768, gen);
        check_mma(W::q8_0, 37, 768, gen);
        check_mma_split<gemm_kq::Q4KMinsMma>(W::q4_K, 37, 2304, 2, gen);         // 9 super-blocks: pieces of 4 and 5
        check_mma_split<gemm_kq::Q6K>(W::q6_K, 37, 2304, 3, gen);                // 3 of 3: a warp of each without one
        check_mma_split<gemm_kq::Q4KMinsMma, false>(W::q4_K, 37, 2304, 4, gen);  // a warp on rows of its own
        check_mma_split<gemm_kq::Q6K, false>(W::q6_K, 70, 2304, 2, gen);         // two blocks, the second 58 short
        check_mma_split<gemm_kq::Q4KMinsMma, false, true>(W::q4_K, 37, 2304, 4, gen);  // activations staged a block
        check_mma_split<gemm_kq::Q6K, false, true>(W::q6_K, 70, 2304, 2, gen);
        check_wgmma_layout(gen);
        check_wgmma(70, 1024, gen);          // 2 row tiles, the second 58 rows short
        check_wgmma(70, 256, gen, {9, 64});  // one super-block: the pipelined loop's shortest
        check_wgmma_split(300, 2304, 2,
                          gen);  // 5 tiles over 2 slots: 4 whole, the last (20 rows short) in pieces of 4 and 5
        check_wgmma_split(64 * 7, 3072, 3, gen);   // 7 over 3: 6 whole, the last in 3 pieces of 4
        check_wgmma_split(130, 3072, 7, gen);      // 3 over 7 (a short matrix): every tile in 2 pieces of 6
        check_wgmma_split(128, 2304, 16, gen, 1);  // pieces of 1 super-block or 2: 2 tiles in 8 (9 as 128-row tiles)
        // 2 row tiles, the second 58 short; 3 super-blocks; then 3 tiles over 2 slots: the last in pieces (4, 5)
        check_f16_wgmma<gemm_kq::F16Q6K>(W::q6_K, 70, 768, gen, {9, 64});
        check_f16_wgmma<gemm_kq::F16Q6K>(W::q6_K, 130, 2304, gen, {40}, 2);
        check_f16_wgmma<gemm_kq::F16Q4K>(W::q4_K, 70, 768, gen, {64});
        check_quantize_bytes(gen);
        check_swiglu_source(gen);
        check_rms_norm_source(gen);
        check_gemv_rms_norm_source(gen);
        check_head_norm_source(gen);
        check_sigmoid_gate_source(gen);
        check_f16_convert(gen);
        check_act_pair<gemm_kq::ActLayout::kRun>(gen);
        check_act_pair<gemm_kq::ActLayout::kWgmma>(gen);
    }
    if (what == "mma" || what == "check_mma" ||
        what == "q5q8") {  // the tensor-core GEMMs, every stage count: checked, then timed
        check_mma(W::q4_K, 48, 1024, gen);
        check_mma(W::q4_K, 130, 5120, gen);
        check_mma(W::q6_K, 48, 1024, gen);
        check_mma(W::q6_K, 130, 5120, gen);
        check_mma_split<gemm_kq::Q6K>(W::q6_K, 130, 17408, 4, gen);        // the 27B's ffn_down rows
        check_mma_split<gemm_kq::Q4KMinsMma>(W::q4_K, 130, 6144, 3, gen);  // its ssm_out / attn_output rows
        check_mma(W::q6_K, 37, 768, gen);  // odd super-block count: rows of alternating alignment
        check_mma(W::q5_K, 48, 1024, gen);
        check_mma(W::q5_K, 37, 768, gen);
        check_mma(W::q8_0, 48, 1024, gen);
        check_mma(W::q8_0, 37, 768, gen);
    }
    // The 27B's matrices (name, type, rows, K) that each mode times.
    const std::vector<Shape> mma_shapes = {
        {"ffn_up", W::q4_K, 17408, 5120},  {"ffn_down", W::q4_K, 5120, 17408}, {"attn_q", W::q4_K, 12288, 5120},
        {"gdn_qkv", W::q4_K, 10240, 5120}, {"ssm_out", W::q4_K, 5120, 6144},   {"ffn_down", W::q6_K, 5120, 17408},
        {"attn_v", W::q6_K, 1024, 5120},   {"output", W::q6_K, 248320, 5120},
    };
    const std::vector<Shape> q6_shapes = {
        {"ffn_down", W::q6_K, 5120, 17408}, {"gdn_qkv", W::q6_K, 10240, 5120}, {"output", W::q6_K, 248320, 5120}};
    const std::vector<Shape> gemv_shapes = {
        {"ffn_up", W::q4_K, 17408, 5120},   {"ffn_down", W::q6_K, 5120, 17408}, {"ffn_down", W::q4_K, 5120, 17408},
        {"attn_q", W::q4_K, 12288, 5120},   {"gdn_qkv", W::q4_K, 10240, 5120},  {"gdn_qkv", W::q6_K, 10240, 5120},
        {"attn_gate", W::q4_K, 6144, 5120}, {"ssm_out", W::q4_K, 5120, 6144},   {"attn_k", W::q4_K, 1024, 5120},
        {"output", W::q6_K, 248320, 5120},
    };
    // Q5_K_M and Q8_0 files' matrices
    const std::vector<Shape> q5q8_shapes = {{"ffn_up", W::q5_K, 17408, 5120},
                                            {"ffn_down", W::q5_K, 5120, 17408},
                                            {"ffn_up", W::q8_0, 17408, 5120},
                                            {"ffn_down", W::q8_0, 5120, 17408}};
    if (what == "mma") {
        for (const Shape & m : mma_shapes) bench_mma(m.name, m.t, m.rows, m.k, gen);
    }
    // The engine's codes (102 for Q4_K, 2 for Q6_K) against variants: `long`, warps a block on long
    // rows (8: 10102, 6: 20102 / 20002); `rows`, each warp its own rows (1001xx) on short ones.
#ifndef DFLASH_CUDA_EMU
    if (what == "quant" || what == "split") {  // the norm-fused quantizer's two forms, checked then timed
        check_rms_norm_source(gen);
        bench_quant(gen);
    }
#endif
    if (what == "split") {  // the mma.sync GEMM split along K: checked at the 27B's shapes, then timed
        check_mma_split<gemm_kq::Q6K>(W::q6_K, 130, 17408, 4, gen);
        check_mma_split<gemm_kq::Q4KMinsMma>(W::q4_K, 130, 6144, 3, gen);
        check_mma_split<gemm_kq::Q6K, false>(W::q6_K, 130, 17408, 4, gen);
        bench_mma_split<gemm_kq::Q6K>("ffn_down", W::q6_K, 5120, 17408, gen);
        bench_mma_split<gemm_kq::Q4KMinsMma>("ffn_down", W::q4_K, 5120, 17408, gen);
        bench_mma_split<gemm_kq::Q4KMinsMma>("ssm_out", W::q4_K, 5120, 6144, gen);
        bench_mma_split<gemm_kq::Q4KMinsMma>("attn_q", W::q4_K, 12288, 5120, gen);  // shorter rows (split auto)
        bench_mma_split<gemm_kq::Q6K>("gdn_qkv", W::q6_K, 10240, 5120, gen);
    }
    if (what == "long" || what == "rows") {
        const bool long_rows = what == "long";
        const std::vector<int> codes = long_rows ? std::vector<int>{102, 10102, 20102, 2, 20002}
                                                 : std::vector<int>{102, 100102, 100103, 2, 100002, 100003};
        const std::vector<Shape> shapes = long_rows ? std::vector<Shape>{{"ffn_down", W::q4_K, 5120, 17408},
                                                                         {"ssm_out", W::q4_K, 5120, 6144},
                                                                         {"ffn_down", W::q6_K, 5120, 17408},
                                                                         {"ffn_up", W::q4_K, 17408, 5120},
                                                                         {"ffn_gate_up", W::q4_K, 34816, 5120}}
                                                    : std::vector<Shape>{{"ffn_gate_up", W::q4_K, 34816, 5120},
                                                                         {"gdn_in", W::q4_K, 16480, 5120},
                                                                         {"attn_q", W::q4_K, 12288, 5120},
                                                                         {"gdn_qkv", W::q6_K, 10240, 5120},
                                                                         {"output", W::q6_K, 248320, 5120}};
        for (const Shape & m : shapes) bench_mma(m.name, m.t, m.rows, m.k, gen, &codes);
    }
    // `tiles`: the engine's one row tile a warp (102 / 2) against two (1000102 / 1000002) on the tall
    // matrices the engine gives two, and on a short one (ssm_out) for reference.
    if (what == "tiles") {
        const std::vector<int> codes = {102, 1000102, 2, 1000002};
        const std::vector<Shape> shapes = {{"ffn_gate_up", W::q4_K, 34816, 5120}, {"ffn_up", W::q4_K, 17408, 5120},
                                           {"attn_q", W::q4_K, 12288, 5120},      {"gdn_qkv", W::q6_K, 10240, 5120},
                                           {"output", W::q6_K, 248320, 5120},     {"ssm_out", W::q4_K, 5120, 6144}};
        for (const Shape & m : shapes) bench_mma(m.name, m.t, m.rows, m.k, gen, &codes);
    }
#if !defined(DFLASH_CUDA_EMU)
    if (what == "wgmma") {  // code 90000000: the wgmma form
        check_wgmma(130, 1024, gen);
        check_wgmma(64, 5120, gen);
        check_wgmma_split(64 * 7, 3072, 3, gen);  // every split form against the early one's bits (ws_same)
        const std::vector<Shape> shapes = {{"ffn_gate_up", W::q4_K, 34816, 5120},
                                           {"gdn_in", W::q4_K, 16480, 5120},
                                           {"attn_q", W::q4_K, 12288, 5120},
                                           {"ffn_down", W::q4_K, 5120, 17408},
                                           {"ssm_out", W::q4_K, 5120, 6144}};
        for (const Shape & m : shapes) bench_wgmma(m.name, m.rows, m.k, gen);
    }
    if (what == "ws64") {  // the int8 warp-specialized kernel at 64 columns on the 27B's matrices it takes there
        // (tools/device/ws64_ab.sh: a build with and one without a flag under test)
        check_wgmma(70, 256, gen, {64});
        check_wgmma_split(64 * 7, 3072, 3, gen);
        const std::vector<Shape> shapes = {{"ffn_gate_up", W::q4_K, 34816, 5120},
                                           {"gdn_in", W::q4_K, 16480, 5120},
                                           {"attn_q", W::q4_K, 12288, 5120},
                                           {"ffn_down", W::q4_K, 5120, 17408}};
        for (const Shape & m : shapes) bench_wgmma(m.name, m.rows, m.k, gen, {91004014}, {64});
        // ssm_out / attn_output: the mma.sync GEMM the engine runs there, and the warp-specialized
        // kernel DFLASH_WS_SHORT_FROM would give it
        bench_wgmma("ssm_out_mma", 5120, 6144, gen, {102}, {32, 64});
        bench_wgmma("ssm_out_ws", 5120, 6144, gen, {91004014}, {32, 64});
    }
    if (what == "profile_64") {  // at 64 columns, once each for ncu: the engine's forms of [gate; up] and ffn_down
        // (the int8 warp-specialized kernel, 91004014) and of ssm_out (the mma.sync GEMM, 102; then the
        // warp-specialized kernel DFLASH_WS_SHORT_FROM gives it)
        bench_wgmma("ffn_gate_up", 34816, 5120, gen, {91004014}, {64}, true);
        bench_wgmma("ffn_down", 5120, 17408, gen, {91004014}, {64}, true);
        bench_wgmma("ssm_out", 5120, 6144, gen, {102}, {64}, true);
        bench_wgmma("ssm_out_ws", 5120, 6144, gen, {91004014}, {64}, true);
    }
    if (what == "profile_forms") {  // [gate; up] at 32 and 64 columns, each wgmma-bench code of argv[2] once (ncu)
        bench_wgmma("ffn_gate_up", 34816, 5120, gen, parse_codes(argc > 2 ? argv[2] : "91002014,91004014"), {32, 64},
                    true);
    }
#ifndef DFLASH_CUDA_EMU
    if (what == "q6wg") {  // the f16 wgmma GEMM (Q6_K, Q4_K): checked, then timed against the int8 forms
        check_f16_wgmma<gemm_kq::F16Q6K>(W::q6_K, 130, 5120, gen, {16, 24, 40, 64});
        check_f16_wgmma<gemm_kq::F16Q6K>(W::q6_K, 200, 17408, gen, {32, 64}, 3);
        check_f16_wgmma<gemm_kq::F16Q4K>(W::q4_K, 130, 5120, gen, {16, 40, 64});
        int nsm = 0;
        CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
        for (const Shape & m : q6_shapes) bench_f16_wgmma<gemm_kq::F16Q6K>(m.name, m.t, m.rows, m.k, gen, nsm);
        bench_f16_wgmma<gemm_kq::F16Q6K>("attn_v", W::q6_K, 1024, 5120, gen, nsm);
        const std::vector<Shape> q4 = {{"ffn_gate_up", W::q4_K, 34816, 5120},
                                       {"gdn_in", W::q4_K, 16480, 5120},
                                       {"ffn_down", W::q4_K, 5120, 17408},
                                       {"ssm_out", W::q4_K, 5120, 6144}};
        for (const Shape & m : q4) bench_f16_wgmma<gemm_kq::F16Q4K>(m.name, m.t, m.rows, m.k, gen, nsm);
    }
#endif
    if (what == "profile_wgmma") {  // one launch of 102 and of the wgmma form, [gate; up] at 16 and 64 columns
        profile_gate_up_wgmma(gen, {16, 64}, true);
    }
#endif
    if (what == "profile_engine") {  // the forms the engine runs at 32 and 64 columns, one launch each (ncu)
        profile_mma(W::q4_K, 34816, 5120, gen, {1000102}, {32});  // [gate; up]: two row tiles a warp at 32
        profile_mma(W::q4_K, 5120, 17408, gen, {102}, {32, 64});  // ffn_down
        profile_mma(W::q6_K, 5120, 17408, gen, {2}, {32, 64});
        profile_mma(W::q4_K, 5120, 6144, gen, {102}, {32, 64});  // ssm_out
#if !defined(DFLASH_CUDA_EMU)
        profile_gate_up_wgmma(gen, {32, 64}, false);  // the wgmma form at 32 (not the engine's) and 64 columns
#endif
    }
    if (what == "profile_codes") {  // [gate; up] at 16 and 64 columns, the codes of argv[2] ("102,1000102")
        profile_mma(W::q4_K, 34816, 5120, gen, parse_codes(argc > 2 ? argv[2] : "102"), {16, 64});
    }
    if (what == "profile") {  // ffn_up, ffn_down and the output: one launch each at 16 / 32 / 64 columns
        profile_mma(W::q4_K, 17408, 5120, gen);
        profile_mma(W::q4_K, 5120, 17408, gen);
        profile_mma(W::q6_K, 248320, 5120, gen);
    }
    if (what == "q5q8") {  // the GEMM for Q5_K and Q8_0 (checked above with check_mma)
        for (const Shape & m : q5q8_shapes) bench_mma(m.name, m.t, m.rows, m.k, gen);
    }
    if (what == "profile_q6") profile_q6(gen);
    if (what == "q6") {  // the Q6_K shapes alone
        for (const Shape & m : q6_shapes) bench(m.name, m.t, m.rows, m.k, gen);
    }
    if (what == "all" || what == "bench") {
        for (const Shape & m : gemv_shapes) bench(m.name, m.t, m.rows, m.k, gen);
    }
    if (what == "all" || what == "bench" || what == "q5q8") {
        for (const Shape & m : q5q8_shapes) bench(m.name, m.t, m.rows, m.k, gen);
    }
    return 0;
}
