// The mma.sync forms of one GEMM launch for weight type F (gemm_mma_forms.cuh's run_mma): included
// by the type's file, which instantiates them; gemm_kquant_mma.cu chose the form (MmaForm).
#pragma once

#include "gemm_kquant_mma_impl.cuh"
#include "gemm_mma_forms.cuh"

#include <algorithm>
#include <type_traits>

namespace mma_forms {

// The pieces a product of rows x n columns and k values takes (1: unsplit) under the switch p
// (MmaForm::split): long rows above 16 columns, each piece 2 super-blocks at least; auto: any rows
// of 4 super-blocks or more, the pieces that fill the `slots` resident blocks (a wave) with tiles
// of 64 rows.
inline int mma_split_pieces(int p, int n, int k, int rows, int slots) {
    const int nb = k / 256;
    if (n <= 16 || n > 64) return 1;
    if (p == kMmaSplitAuto) {
        const int tiles = (rows + 16 * gemm_kq::kWarps - 1) / (16 * gemm_kq::kWarps);
        const int fill = std::max(2, std::min({8, slots / std::max(tiles, 1), nb / 2}));
        return nb >= 4 ? fill : 1;
    }
    return p >= 2 && nb >= gemm_kq::kLongRowBlocks && nb / p >= 2 ? p : 1;
}

// gemm_kq::launch with the residual of a fused add (its kernels' kRes variant) or without.
// kDynSmem: the stages in dynamic shared memory (false when its opt-in failed: nothing launched).
// Q4_K's kernels of static stages through bulk tensor copies where they run (f.tma; ran.tma).
template <typename F, int kStages, bool kOccupancy = true, int W = gemm_kq::kWarps, bool kSplitK = true, int R = 1,
          bool kDynSmem = false, bool kPieces = false, bool kActSmem = false>
bool launch_with(const Operands & o, const MmaForm & f, MmaRan & ran, int pieces = 1, float * partials = nullptr) {
    if constexpr (std::is_same_v<F, gemm_kq::Q4KMinsMma> && kStages > 0 && !kDynSmem && !kPieces && !kActSmem) {
        auto tma_launch = [&](auto stages) {
            constexpr int kSt = decltype(stages)::value;
            return o.res
                       ? gemm_kq::launch<F, kSt, kOccupancy, W, kSplitK, R, true, false, false, false, true>(
                             o.w, o.qs, o.d, o.sums, o.out, o.rows, o.k, o.row_bytes, o.n, o.sd, o.stream, o.res, o.sr)
                       : gemm_kq::launch<F, kSt, kOccupancy, W, kSplitK, R, false, false, false, false, true>(
                             o.w, o.qs, o.d, o.sums, o.out, o.rows, o.k, o.row_bytes, o.n, o.sd, o.stream);
        };
        if (f.tma && (f.tma_stages == 3 ? tma_launch(std::integral_constant<int, 3>{})
                                        : tma_launch(std::integral_constant<int, kStages>{}))) {
            ran.tma = true;
            return true;
        }
    }
    if (o.res) {
        return gemm_kq::launch<F, kStages, kOccupancy, W, kSplitK, R, true, kDynSmem, kPieces, kActSmem>(
            o.w, o.qs, o.d, o.sums, o.out, o.rows, o.k, o.row_bytes, o.n, o.sd, o.stream, o.res, o.sr, pieces,
            partials);
    }
    return gemm_kq::launch<F, kStages, kOccupancy, W, kSplitK, R, false, kDynSmem, kPieces, kActSmem>(
        o.w, o.qs, o.d, o.sums, o.out, o.rows, o.k, o.row_bytes, o.n, o.sd, o.stream, nullptr, 0, pieces, partials);
}

// Quantizes x for F's activation layout (when f.quantize), then runs F in the form f names: 8 warps
// a block for long rows, two row tiles a warp, pieces along K, or one row tile a warp (the rest).
template <typename F>
MmaRan run_mma(const Operands & o, const MmaForm & f) {
    static_assert(
        F::kLayout == (std::is_same_v<F, gemm_kq::Q6K> || std::is_same_v<F, gemm_kq::Q80> ? gemm_kq::ActLayout::kHalves
                                                                                          : gemm_kq::ActLayout::kRun),
        "gemm_kquant_mma.cu's mma_layout names F's layout");
    constexpr int kS = gemm_kq::kDefaultStages;
    MmaRan ran;
    if (f.quantize) gemm_kq::quantize_act<F>(*o.x, o.qs, o.d, o.sums, o.k, o.n, o.stream);
    if constexpr (gemm_kq::fit_stages<F, 8>(kS) == kS) {
        if (f.long_rows) {
            launch_with<F, kS, true, 8>(o, f, ran);
            return ran;
        }
    } else if constexpr (std::is_same_v<F, gemm_kq::Q6K> && gemm_kq::fit_stages<F, 8, 1, true>(kS) == kS) {
        constexpr size_t kBytes = gemm_kq::Smem<F, 2, kS, 8, 1>::kBytes;  // the most at up to 16 columns
        if (f.long_rows && f.q6k_long_8 != 0 && o.smem_optin >= kBytes &&
            (f.q6k_long_8 == 1 ? launch_with<F, kS, true, 8, true, 1, true>(o, f, ran)
                               : launch_with<F, kS, false, 8, true, 1, true>(o, f, ran))) {
            return ran;
        }
    }
    if (f.two_tiles) {
        constexpr int kW = gemm_kq::fit_warps<F, gemm_kq::kWarps, 2>();
        launch_with<F, kS, true, kW, true, 2>(o, f, ran);
        return ran;
    }
    const int slots = gemm_kq::min_blocks<F, gemm_kq::kWarps, 1>(gemm_kq::padded_columns(o.n) / 8) * o.nsm;
    if (const int pieces = mma_split_pieces(f.split, o.n, o.k, o.rows, slots); pieces > 1) {
        constexpr bool kSplitK = false;  // each warp on rows of its own (gemm_kquant_mma.cu's DFLASH_MMA_SPLIT)
        ggml_cuda_pool_alloc<float> partials(
            *o.pool,
            gemm_kq::mma_split_floats(o.rows, pieces, gemm_kq::kWarps, kSplitK, 1, gemm_kq::padded_columns(o.n) / 8));
        if ((f.act_smem && launch_with<F, kS, true, gemm_kq::kWarps, kSplitK, 1, true, true, true>(o, f, ran, pieces,
                                                                                                   partials.get())) ||
            launch_with<F, kS, true, gemm_kq::kWarps, kSplitK, 1, false, true>(o, f, ran, pieces, partials.get())) {
            ran.split = true;
            return ran;
        }
    }
    launch_with<F, kS>(o, f, ran);
    return ran;
}

}  // namespace mma_forms
