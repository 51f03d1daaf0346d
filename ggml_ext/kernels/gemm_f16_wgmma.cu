// The engine's entry to the f16 wgmma GEMM for Q6_K and Q4_K (gemm_f16_wgmma.cuh), in a unit of its
// own so that its instances compile beside gemm_kquant_mma.cu's, not after them.
#include "gemm_f16_wgmma.cuh"
#include "gemm_f16_wgmma_ws.cuh"
#include "ggml_ext_gemv_cuda.cuh"

#include <atomic>

// The tail split of the last launch (either form), for tests: the forms' bits agree only where they
// split a matrix alike, and their blocks a multiprocessor (so their splits) can differ.
static std::atomic<int> last_full_tiles{0}, last_tail{0}, last_pieces{1};
static void note_split(const gemm_kq::WgSplit & s, int tiles) {
    const bool split = s.pieces > 1;
    last_full_tiles = split ? s.full_tiles : tiles;
    last_tail = split ? s.tail : 0;
    last_pieces = split ? s.pieces : 1;
}

void ggml_ext_cuda_f16_wgmma_last_split(int & full_tiles, int & tail, int & pieces) {
    full_tiles = last_full_tiles;
    tail = last_tail;
    pieces = last_pieces;
}

bool & ggml_ext_cuda_f16_convert_v8() { return gemm_kq::f16_convert_v8_flag(); }

void ggml_ext_cuda_act_pair(bool wgmma_layout, const ActSource & x, int8_t * qs, float * d, int * sums, int8_t * act16,
                            int k, int ncols, int np8, int np16, cudaStream_t stream) {
    auto * halves = reinterpret_cast<__half *>(act16);
    if (wgmma_layout) {
        gemm_kq::quantize_act_and_f16<gemm_kq::ActLayout::kWgmma>(x, qs, d, sums, halves, k, ncols, np8, np16, stream);
    } else {
        gemm_kq::quantize_act_and_f16<gemm_kq::ActLayout::kRun>(x, qs, d, sums, halves, k, ncols, np8, np16, stream);
    }
}

int ggml_ext_cuda_f16_wgmma(ggml_type t, const ActSource & x, int8_t * act, const char * w, int rows, int k,
                            int64_t row_bytes, int n, float * out, int sd, const float * res, int sr, int nsm, bool ws,
                            ggml_cuda_pool & pool, cudaStream_t stream, bool converted) {
#ifdef DFLASH_HAVE_WGMMA
    // one warpgroup a block up to 32 columns, two (64 rows each, one copy of the activations) above:
    // on the H100 (session 35) the 27B's Q6_K ffn_down 68 against 104 us at 64 columns with 3
    // stages, the output matrix 715 against 954; the warp-specialized form likewise (its consumers)
    auto run = [&](auto f) {
        using F = decltype(f);
        auto * a = reinterpret_cast<__half *>(act);
        // each form its split's partials (a form tried after another that failed allocates again)
        auto go = [&](auto wg_tag) -> int {
            constexpr int WG = decltype(wg_tag)::value;
            ggml_cuda_pool_alloc<float> partials(pool);
            // the kernel's opt-in first: when it fails nothing is launched (x not converted)
            const gemm_kq::WgSplit split = gemm_kq::f16_wgmma_split_for<F, gemm_kq::kF16WgStages, WG>(rows, k, n, nsm);
            if (!gemm_kq::f16_wgmma_ready<F, gemm_kq::kF16WgStages, WG>(n, res != nullptr)) return 0;
            if (!converted) gemm_kq::convert_act_f16(x, a, k, n, gemm_kq::wg_padded_columns(n), stream);
            if (split.pieces > 1) partials.alloc(gemm_kq::wgmma_split_floats<WG>(split, n));
            if (!gemm_kq::launch_f16_wgmma<F, gemm_kq::kF16WgStages, WG>(w, a, out, rows, k, row_bytes, n, sd, stream,
                                                                         res, sr, split, partials.ptr)) {
                return 0;
            }
            note_split(split, (rows + WG * gemm_kq::kWgRows - 1) / (WG * gemm_kq::kWgRows));
            return 1;
        };
        auto go_ws = [&](auto cw_tag) -> int {
            constexpr int CW = decltype(cw_tag)::value;
            ggml_cuda_pool_alloc<float> partials(pool);
            const gemm_kq::WgSplit split = gemm_kq::f16_wgmma_ws_split_for<F, CW>(rows, k, n, nsm);
            if (!gemm_kq::f16_wgmma_ws_ready<F, CW>(n, res != nullptr)) return 0;
            if (!converted) gemm_kq::convert_act_f16(x, a, k, n, gemm_kq::wg_padded_columns(n), stream);
            if (split.pieces > 1) partials.alloc(gemm_kq::wgmma_split_floats<CW>(split, n));
            if (!gemm_kq::launch_f16_wgmma_ws<F, CW>(w, a, out, rows, k, row_bytes, n, sd, stream, res, sr, split,
                                                     partials.ptr)) {
                return 0;
            }
            note_split(split, (rows + CW * gemm_kq::kWgRows - 1) / (CW * gemm_kq::kWgRows));
            return 2;
        };
        if (ws) {
            const int ran = n > 32 ? go_ws(std::integral_constant<int, 2>{}) : go_ws(std::integral_constant<int, 1>{});
            if (ran) return ran;
        }
        return n > 32 ? go(std::integral_constant<int, 2>{}) : go(std::integral_constant<int, 1>{});
    };
    if (t == GGML_TYPE_Q6_K) return run(gemm_kq::F16Q6K{});
    if (t == GGML_TYPE_Q4_K) return run(gemm_kq::F16Q4K{});
    return 0;
#else
    (void)t, (void)x, (void)act, (void)w, (void)rows, (void)k, (void)row_bytes, (void)n, (void)out, (void)sd;
    (void)res, (void)sr, (void)nsm, (void)ws, (void)pool, (void)stream, (void)converted;
    return 0;
#endif
}
