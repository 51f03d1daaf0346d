// GPU: the chunked delta rule (ggml_ext/kernels/gdn_chunked.cu: prep and apply kernels) beside the
// chain kernel (gdn_chain.cu) at the 27B's shapes (S = 128, 48 v heads over 16 q/k heads, q / k / v
// of a token interleaved as the engine's fused inputs lay them out), one layer, 8..64 tokens.
//   ./gdn_chunked_sa time      JSON lines: us a launch of each kernel, max |chunked - chain| outputs
//   ./gdn_chunked_sa profile   one launch of each at 16 and 64 tokens (for ncu -k regex:gdn_chunk)
// Build (no ggml library: the few symbols the kernels reach are defined below):
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o gdn_chunked_sa \
//     tools/device/gdn_chunked_standalone.cu -I<upstream>/ggml/src -I<upstream>/ggml/include \
//     -I<upstream>/ggml/src/ggml-cuda -Iggml_ext/include -Iggml_ext/kernels -DGGML_USE_CUDA
#include "gdn_chain.cu"
#include "gdn_chunked.cu"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_check.h"
#include "ggml_cuda_device_query.h"

// what the entry point's pool and ggml's checks reach (never called here: the kernels are launched
// directly, and a CUDA error exits in check())
std::unique_ptr<ggml_cuda_pool> ggml_backend_cuda_context::new_pool_for_device(int, int) { return nullptr; }
void ggml_cuda_set_device(int) {}
void ggml_cuda_error(const char * stmt, const char * func, const char * file, int line, const char * msg) {
    std::fprintf(stderr, "CUDA error %s in %s (%s:%d): %s\n", stmt, func, file, line, msg);
    std::exit(1);
}
extern "C" void ggml_abort(const char * file, int line, const char * fmt, ...) {
    std::fprintf(stderr, "ggml_abort %s:%d %s\n", file, line, fmt);
    std::exit(1);
}

namespace {

template <typename F>
float time_us(F && f, int reps) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    f();
    cudaEventRecord(a);
    for (int i = 0; i < reps; ++i) f();
    cudaEventRecord(b);
    check(cudaEventSynchronize(b), "timing");
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    return 1000.0f * ms / reps;
}

}  // namespace

int main(int argc, char ** argv) {
    const std::string mode = argc > 1 ? argv[1] : "time";
    constexpr int64_t S = 128, Hv = 48, Hk = 16, n_max = 64;
    const int64_t row = 2 * S * Hk + S * Hv;
    std::mt19937 rng(7);
    std::normal_distribution<float> nd;
    std::vector<float> h_in(row * n_max), h_g(Hv * n_max), h_b(Hv * n_max), h_s0(Hv * S * S);
    for (int64_t t = 0; t < n_max; ++t) {
        for (int64_t i = 0; i < 2 * Hk; ++i) {  // q and k heads of unit length, as the graph's L2 norm
            float * x = &h_in[t * row + i * S];
            double ss = 0;
            for (int64_t d = 0; d < S; ++d) ss += (x[d] = nd(rng)) * (double)x[d];
            for (int64_t d = 0; d < S; ++d) x[d] = (float)(x[d] / std::sqrt(ss));
        }
        for (int64_t i = 2 * S * Hk; i < row; ++i) h_in[t * row + i] = nd(rng);
    }
    for (auto & x : h_g) x = -std::fabs(nd(rng)) * 0.3f;
    for (auto & x : h_b) x = 0.1f + 0.8f * std::fabs(std::tanh(nd(rng)));
    for (auto & x : h_s0) x = 0.1f * nd(rng);
    float *in, *g, *b, *s0, *out, *prep;
    const int64_t out_floats = S * Hv * n_max + S * S * Hv;
    check(cudaMalloc(&in, h_in.size() * 4), "malloc");
    check(cudaMalloc(&g, h_g.size() * 4), "malloc");
    check(cudaMalloc(&b, h_b.size() * 4), "malloc");
    check(cudaMalloc(&s0, h_s0.size() * 4), "malloc");
    check(cudaMalloc(&out, 2 * out_floats * 4), "malloc");
    check(cudaMalloc(&prep, Hv * kPrepFloats * 4), "malloc");
    cudaMemcpy(in, h_in.data(), h_in.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(g, h_g.data(), h_g.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(b, h_b.data(), h_b.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(s0, h_s0.data(), h_s0.size() * 4, cudaMemcpyHostToDevice);

    for (int64_t n : {8, 16, 32, 64}) {
        auto args = [&](float * dst) {
            return GdnChainArgs{in,
                                in + S * Hk,
                                in + 2 * S * Hk,
                                g,
                                b,
                                s0,
                                dst,
                                dst + S * Hv * n,
                                S,
                                Hv,
                                n,
                                1,
                                S,
                                row,
                                0,
                                S,
                                row,
                                0,
                                1,
                                Hv,
                                0,
                                Hk,
                                1,
                                1.0f / std::sqrt((float)S)};
        };
        const GdnChainArgs chain = args(out), chunked = args(out + out_floats);
        constexpr size_t pb = prep_smem_bytes<128>(), ab = apply_smem_bytes<128>();
        cudaFuncSetAttribute(gdn_chunk_prep_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pb);
        cudaFuncSetAttribute(gdn_chunk_apply_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)ab);
        auto run_prep = [&] { gdn_chunk_prep_kernel<128><<<dim3((unsigned)Hv, 1, 1), kThreads, pb>>>(chunked, prep); };
        auto run_apply = [&] {
            gdn_chunk_apply_kernel<128><<<dim3((unsigned)Hv, 1, S / kApplyColumns), kThreads, ab>>>(chunked, prep);
        };
        auto run_chain = [&] { ggml_ext_cuda_gated_delta_net(chain, nullptr); };
        if (mode == "profile") {
            if (n == 16 || n == 64) {
                run_prep();
                run_apply();
                run_chain();
                check(cudaDeviceSynchronize(), "profile");
            }
            continue;
        }
        const float t_chain = time_us(run_chain, 200), t_prep = time_us(run_prep, 200),
                    t_apply = time_us(run_apply, 200);
        check(cudaDeviceSynchronize(), "runs");
        std::vector<float> h_out(2 * out_floats);
        cudaMemcpy(h_out.data(), out, h_out.size() * 4, cudaMemcpyDeviceToHost);
        float err = 0, scale = 0;
        for (int64_t i = 0; i < S * Hv * n; ++i) {
            err = std::max(err, std::fabs(h_out[i] - h_out[out_floats + i]));
            scale = std::max(scale, std::fabs(h_out[i]));
        }
        std::printf(
            "{\"tokens\": %lld, \"chain_us\": %.2f, \"prep_us\": %.2f, \"apply_us\": %.2f, \"max_abs_diff\": %.3g, "
            "\"scale\": %.3g}\n",
            (long long)n, t_chain, t_prep, t_apply, err, scale);
    }
    return 0;
}
