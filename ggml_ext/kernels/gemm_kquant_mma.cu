// Dispatch of ggml_ext's small-batch tensor-core GEMM (gemm_kquant_mma_impl.cuh) for the engine's
// tagged Q4_K / Q5_K / Q6_K products (Q8_0 too with ggml_ext::set_q80_enabled), 9..32 columns by
// default (a chain verify of 16 tokens, DDTree budgets up to 31).
// - Q4_K (and Q5_K, its layout plus the fifth bits) take the min term through an f16 mma, every
//   type runs 2 cp.async stages: the fastest variant at 16 columns in both standalone runs of
//   session 8 (ffn_up 31-32 us against 41-53 with integer mins and 3 stages; the Q6_K output 580
//   us against 766; bench/results/h200-s8-mma-standalone-*.json). The 27B chain: 373 -> 403 t/s
//   (h200-s8-27b-chain-mins-int-d1886df.json against -chain-vs-upstream-d1886df.json).
// - 17..32 columns run the 32-column tile: the 27B's forward of 17 tokens took 24.6 ms through it
//   against 25.9 with ggml's mmq (h200-s8-27b-tree-steps-mma64-d1886df.json); the tile computes
//   its 32 columns whatever the real count, so 18..32 cost the same; 17..24 now run a 24-column tile,
//   20-25% less than the 32-column one in the standalone (not yet timed in the engine). At 33..64
//   mmq stays faster (33 tokens 32.5 ms against 44.3).
// DFLASH_MMA=0 (or ggml_ext::set_mma_enabled(false)) turns it off; DFLASH_MMA_MAX_COLUMNS (16, 32,
// 64) sets the range and DFLASH_MMA_MINS_INT=1 keeps the integer min sums (exact), for benches.
// tools/device/gemv_standalone.sh mma checks and times it.
#include "gemm_kquant_mma_impl.cuh"
#include "ggml_ext_gemv_cuda.cuh"
#include "ggml_ext_matmul.h"

#include <cstdlib>

namespace {

bool mma_enabled_flag = [] {
    const char * e = std::getenv("DFLASH_MMA");
    return !(e && e[0] == '0');
}();

int mma_max_columns() {
    static const int v = [] {
        const char * e = std::getenv("DFLASH_MMA_MAX_COLUMNS");
        const int n = e ? std::atoi(e) : 32;
        return n == 16 || n == 64 ? n : 32;
    }();
    return v;
}

}  // namespace

namespace ggml_ext {
void set_mma_enabled(bool on) { mma_enabled_flag = on; }
bool mma_enabled() { return mma_enabled_flag; }
}  // namespace ggml_ext

bool ggml_ext_cuda_gemm_mma(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ggml_tensor * src1,
                            ggml_tensor * dst) {
    const int64_t n = src1->ne[1], k = src0->ne[0];
    const int cc = ggml_cuda_info().devices[ctx.device].cc;
    const ggml_type t = src0->type;
    const bool type_ok = t == GGML_TYPE_Q4_K || t == GGML_TYPE_Q5_K || t == GGML_TYPE_Q6_K ||
                         (ggml_ext::q80_enabled() && t == GGML_TYPE_Q8_0);
    if (!mma_enabled_flag || !type_ok || n <= kGemvMaxColumns || n > mma_max_columns() || k % 256 != 0 ||
        !GGML_CUDA_CC_IS_NVIDIA(cc) || ggml_cuda_highest_compiled_arch(cc) < GGML_CUDA_CC_AMPERE || src0->ne[2] != 1 ||
        src0->ne[3] != 1 || src0->nb[1] % (t == GGML_TYPE_Q6_K ? 2 : 16) != 0 ||
        reinterpret_cast<uintptr_t>(src0->data) % 16 != 0 ||
        ggml_backend_buffer_get_usage(src0->buffer) == GGML_BACKEND_BUFFER_USAGE_COMPUTE ||
        src1->type != GGML_TYPE_F32 || src1->nb[0] != sizeof(float) || src1->ne[2] != 1 || src1->ne[3] != 1 ||
        dst->type != GGML_TYPE_F32 || dst->nb[0] != sizeof(float)) {
        return false;
    }
    cudaStream_t stream = ctx.stream();
    const int np = gemm_kq::padded_columns((int)n);
    ggml_cuda_pool_alloc<int8_t> qs(ctx.pool(), (size_t)np * k);
    ggml_cuda_pool_alloc<float> d(ctx.pool(), (size_t)np * (k / 256));
    ggml_cuda_pool_alloc<int> sums(ctx.pool(), (size_t)np * (k / 32));
    gemm_kq::quantize_act_k_kernel<<<dim3((unsigned)(k / 256), (unsigned)np, 1), 256, 0, stream>>>(
        (const float *)src1->data, qs.get(), d.get(), sums.get(), (int)k, (int)k, (int)n, src1->nb[1] / sizeof(float));
    constexpr int kS = gemm_kq::kDefaultStages;
    static const bool mins_int = [] {
        const char * e = std::getenv("DFLASH_MMA_MINS_INT");
        return e && e[0] == '1';
    }();
    const auto launch = t == GGML_TYPE_Q6_K   ? gemm_kq::launch<gemm_kq::Q6K, kS>
                        : t == GGML_TYPE_Q5_K ? (mins_int ? gemm_kq::launch<gemm_kq::Q5K, kS>
                                                          : gemm_kq::launch<gemm_kq::Q5KMinsMma, kS>)
                        : t == GGML_TYPE_Q8_0 ? gemm_kq::launch<gemm_kq::Q80, kS>
                        : mins_int            ? gemm_kq::launch<gemm_kq::Q4K, kS>
                                              : gemm_kq::launch<gemm_kq::Q4KMinsMma, kS>;
    launch((const char *)src0->data, qs.get(), d.get(), sums.get(), (float *)dst->data, (int)src0->ne[1], (int)k,
           (int64_t)src0->nb[1], (int)k, (int)n, (int)(dst->nb[1] / sizeof(float)), stream);
    CUDA_CHECK(cudaGetLastError());
    return true;
}
