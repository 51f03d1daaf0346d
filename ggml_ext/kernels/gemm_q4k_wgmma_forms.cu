// Q4_K's wgmma GEMM forms for one launch (gemm_mma_forms.cuh's run_q4k_wgmma; gemm_kquant_mma.cu
// chose the form): the warp-specialized kernel (gemm_q4k_wgmma_ws.cuh) first where asked, else the
// plain, pipelined, early-staging or chunk-waiting kernel (gemm_q4k_wgmma.cuh), each split along K
// where its grid would be under a wave.
#include "gemm_mma_forms.cuh"
#include "gemm_q4k_wgmma.cuh"
#include "gemm_q4k_wgmma_ws.cuh"

#include <type_traits>

namespace {

// Stages and blocks a multiprocessor of a wgmma form's instance (WG warpgroups a block).
constexpr int wgmma_stages(int form, int wg) { return form == gemm_kq::kWgChunks && wg == 1 ? 2 : 4; }
constexpr int wgmma_min_blocks(int form, int wg) { return form == gemm_kq::kWgChunks && wg == 1 ? 3 : 1; }

}  // namespace

mma_forms::WgmmaRan mma_forms::run_q4k_wgmma(const Operands & o, const WgmmaForm & f) {
    WgmmaRan ran;
    const bool with_res = o.res != nullptr;
    if (f.ws) {
        auto ws = [&](auto cw_tag) {
            constexpr int kCW = decltype(cw_tag)::value;
            ggml_cuda_pool_alloc<float> partials(*o.pool);  // its own: a form tried after it allocates again
            const gemm_kq::WgSplit split =
                f.split ? gemm_kq::wgmma_ws_split_for<kCW>(o.rows, o.k, o.n, o.nsm) : gemm_kq::WgSplit{};
            if (split.splits()) partials.alloc(gemm_kq::wgmma_split_floats<kCW>(split, o.n));
            const bool ok = gemm_kq::launch_q4k_wgmma_ws<kCW>(o.w, o.qs, o.d, o.sums, o.out, o.rows, o.k, o.row_bytes,
                                                              o.n, o.sd, o.stream, split, partials.ptr, o.res, o.sr);
            ran.split = ok && split.splits();
            return ok;
        };
        if (f.ws_mode == 2 ? ws(std::integral_constant<int, 2>{}) : ws(std::integral_constant<int, 1>{})) {
            ran.ran = ran.ws = true;
            return ran;
        }
    }
    ggml_cuda_pool_alloc<float> partials(*o.pool);
    auto run = [&](auto form_tag, auto wg_tag) {
        constexpr int kForm = decltype(form_tag)::value, kWG = decltype(wg_tag)::value;
        constexpr int kS = wgmma_stages(kForm, kWG), kMB = wgmma_min_blocks(kForm, kWG);
        gemm_kq::WgSplit split{};
        if (f.split) {
            if constexpr (kForm == gemm_kq::kWgEarly && kWG == 1) {
                split = with_res ? gemm_kq::wgmma_split_for<kS, kWG, kMB, kForm, true>(o.rows, o.k, o.n, o.nsm)
                                 : gemm_kq::wgmma_split_for<kS, kWG, kMB, kForm>(o.rows, o.k, o.n, o.nsm);
            } else {
                split = gemm_kq::wgmma_split_for<kS, kWG, kMB, kForm>(o.rows, o.k, o.n, o.nsm);
            }
        }
        if (split.pieces > 1) partials.alloc(gemm_kq::wgmma_split_floats<kWG>(split, o.n));
        const bool ok =
            gemm_kq::launch_q4k_wgmma<kS, kWG, kMB, kForm>(o.w, o.qs, o.d, o.sums, o.out, o.rows, o.k, o.row_bytes, o.n,
                                                           o.sd, o.stream, 128, 256, split, partials.ptr, o.res, o.sr);
        ran.split = ok && split.pieces > 1;
        ran.two_wg = ok && kWG >= 2;
        return ok;
    };
    using One = std::integral_constant<int, 1>;
    using Early = std::integral_constant<int, gemm_kq::kWgEarly>;
    if (f.form == gemm_kq::kWgPipe) {
        ran.ran = run(std::integral_constant<int, gemm_kq::kWgPipe>{}, One{});
    } else if (f.form == gemm_kq::kWgPlain) {
        ran.ran = run(std::integral_constant<int, gemm_kq::kWgPlain>{}, One{});
    } else if (f.form == gemm_kq::kWgChunks) {
        using Chunks = std::integral_constant<int, gemm_kq::kWgChunks>;
        ran.ran = f.warpgroups == 3 ? run(Chunks{}, std::integral_constant<int, 3>{}) : run(Chunks{}, One{});
    } else {  // two warpgroups a block: the early form only (the default; the others as measured)
        ran.ran = f.warpgroups == 2 && !with_res ? run(Early{}, std::integral_constant<int, 2>{}) : run(Early{}, One{});
    }
    return ran;
}
