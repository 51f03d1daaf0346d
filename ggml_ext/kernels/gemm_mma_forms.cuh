// The tensor-core GEMM's launches, split by weight type across translation units so that a build
// compiles their kernels in parallel: gemm_kquant_mma.cu picks a launch's form from its switches
// and calls these; gemm_mma_<type>.cu hold the mma.sync forms of a weight type (gemm_mma_run.cuh;
// Q4_K and Q5_K in two files each, the min term through an f16 mma and the integer min sums),
// gemm_q4k_wgmma_forms.cu Q4_K's wgmma forms.
// Why: in one file they were ~450 kernels and 154 s of nvcc on one core (sm_90a, session 56),
// about three times ggml-cuda's slowest files (46-58 s); listed after them all, that file was the
// one a 16-job build ended on (tools/device/build_schedule.py: 306 s of compiles against 202 s split,
// bench/results/cpu-s56-build-schedule.json). Split, they take 8-40 s each.
#pragma once

#include "act_source.cuh"
#include "ggml-cuda/common.cuh"

#include <cstddef>
#include <cstdint>

namespace mma_forms {

// One launch's operands: out (sd floats a column) = w (rows x k, row_bytes a row) x columns 0..n-1
// of x, through the activations qs / d / sums; res (sr floats a column) a residual added as the
// outputs are written, or null. nsm, smem_optin: the device's multiprocessors and opt-in shared
// memory a block.
struct Operands {
    int n = 0, rows = 0, k = 0;
    const ActSource * x = nullptr;
    const char * w = nullptr;
    int64_t row_bytes = 0;
    float * out = nullptr;
    int sd = 0;
    const float * res = nullptr;
    int sr = 0;
    int8_t * qs = nullptr;
    float * d = nullptr;
    int * sums = nullptr;
    int nsm = 0;
    size_t smem_optin = 0;
    ggml_cuda_pool * pool = nullptr;
    cudaStream_t stream = nullptr;
};

// mma_split's "auto" (gemm_kquant_mma.cu's DFLASH_MMA_SPLIT)
constexpr int kMmaSplitAuto = -1;

// The mma.sync forms' choice for one launch (gemm_kquant_mma.cu's switches and shape rules).
struct MmaForm {
    bool quantize = true;    // quantize x first (else qs, d and sums hold it in the type's layout)
    bool tma = false;        // Q4_K's stages filled by bulk tensor copies (gemm_kq's kTma), where they run
    int tma_stages = 2;      // their stages a warp: 2 or 3
    bool long_rows = false;  // 8 warps a block
    bool two_tiles = false;  // two row tiles a warp (Q4_K, Q5_K)
    int q6k_long_8 = 0;      // Q6_K's long rows on 8 warps from dynamic shared memory: 0 off, 1, 2
    int split = 0;           // pieces along K above 16 columns: 0 off, 2..8, kMmaSplitAuto
    bool act_smem = false;   // the split's activations staged in shared memory
};
// Which of the counted forms ran.
struct MmaRan {
    bool tma = false, split = false;
};

// The mma.sync forms for weight type F (gemm_kq::Q4KMinsMma, Q4K, Q5KMinsMma, Q5K, Q6K, Q80): defined
// in gemm_mma_run.cuh, instantiated in the type's file.
template <typename F>
MmaRan run_mma(const Operands & o, const MmaForm & f);

// The wgmma forms' choice (gemm_kquant_mma.cu's gemm_chunk): form (gemm_kq::kWg*), warpgroups a
// block (1..3), split along K where a grid is under a wave, and the warp-specialized kernel first
// (ws; ws_mode 2: two consumer warpgroups).
struct WgmmaForm {
    int form = 0, warpgroups = 1;
    bool split = true, ws = false;
    int ws_mode = 1;
};
struct WgmmaRan {
    bool ran = false, ws = false, split = false, two_wg = false;
};

// Q4_K's wgmma forms on activations quantize_act_wgmma wrote (gemm_q4k_wgmma_forms.cu); ran false
// when none could run (nothing launched).
WgmmaRan run_q4k_wgmma(const Operands & o, const WgmmaForm & f);

}  // namespace mma_forms
