// The engine's entry to the Q6_K f16 wgmma GEMM (gemm_q6k_wgmma.cuh), in a unit of its own so that
// its instances compile beside gemm_kquant_mma.cu's, not after them.
#include "gemm_q6k_wgmma.cuh"
#include "ggml_ext_gemv_cuda.cuh"

bool ggml_ext_cuda_q6k_wgmma(const ActSource & x, int8_t * act, const char * w, int rows, int k, int64_t row_bytes,
                             int n, float * out, int sd, const float * res, int sr, int nsm, ggml_cuda_pool & pool,
                             cudaStream_t stream) {
#ifdef DFLASH_HAVE_WGMMA
    auto * a = reinterpret_cast<__half *>(act);
    // the kernel first: its shared-memory opt-in may fail (nothing launched, x not converted)
    const gemm_kq::WgSplit split = gemm_kq::q6k_wgmma_split_for(rows, k, n, nsm);
    if (!gemm_kq::q6k_wgmma_ready(n, res != nullptr)) return false;
    gemm_kq::convert_act_f16(x, a, k, n, gemm_kq::wg_padded_columns(n), stream);
    ggml_cuda_pool_alloc<float> partials(pool);
    if (split.pieces > 1) partials.alloc(gemm_kq::q6k_wgmma_split_floats(split, n));
    return gemm_kq::launch_q6k_wgmma(w, a, out, rows, k, row_bytes, n, sd, stream, res, sr, split, partials.ptr);
#else
    (void)x, (void)act, (void)w, (void)rows, (void)k, (void)row_bytes, (void)n, (void)out, (void)sd, (void)res;
    (void)sr, (void)nsm, (void)pool, (void)stream;
    return false;
#endif
}
