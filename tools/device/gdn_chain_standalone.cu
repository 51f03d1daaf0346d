// GPU: ggml_ext's delta rule kernels for a chain (ggml_ext/kernels/gdn_chain.cu: the decode's bits;
// gdn_chain_one_round.cu and gdn_chain_gram.cu: the reordered forms a verify's marked nodes take)
// on their own, at the 27B's shapes (S = 128, 48 v heads over 16 q/k heads, q / k / v interleaved
// per token as the engine's fused inputs lay them out), one launch a layer over 48 layers' states,
// for 1 / 16 / 32 / 64 tokens. Each line of JSON: the time of 48 layers, checksums of the outputs
// and states (equal checksums: equal bits), and a reordered form's largest difference from the
// chain kernel relative to the outputs' scale. Built against a kernel tree given by -I (the current
// one, or an older commit's archive), so two builds time two versions in one call.
//
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o gdn_chain_sa \
//     tools/device/gdn_chain_standalone.cu -I<upstream>/ggml/src -I<upstream>/ggml/include \
//     -I<upstream>/ggml/src/ggml-cuda -I<tree>/ggml_ext/include -I<tree>/ggml_ext/kernels -DGGML_USE_CUDA
//   ./gdn_chain_sa <label> [chain|one_round|gram|all]
#include "gdn_chain.cu"
#include "gdn_chain_gram.cu"
#include "gdn_chain_one_round.cu"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <cstring>
#include <vector>

#include "cuda_check.h"
#include "ggml_cuda_device_query.h"

namespace {

uint64_t checksum(const std::vector<float> & x) {
    uint64_t h = 1469598103934665603ull;
    for (float f : x) {
        uint32_t b;
        std::memcpy(&b, &f, 4);
        h = (h ^ b) * 1099511628211ull;
    }
    return h;
}

}  // namespace

int main(int argc, char ** argv) {
    const char * label = argc > 1 ? argv[1] : "kernel";
    const std::string which = argc > 2 ? argv[2] : "chain";
    constexpr int64_t S = 128, Hv = 48, Hk = 16, layers = 48, n_max = 64;
    const int64_t row = 2 * S * Hk + S * Hv;  // q, k, v of one token, interleaved as the fused inputs
    std::vector<float> h_in(row * n_max), h_gb(2 * Hv * n_max), h_s0(layers * Hv * S * S);
    uint32_t seed = 12345;
    auto rnd = [&] {
        seed = seed * 1664525u + 1013904223u;
        return ((seed >> 8) & 0xffff) / 65536.0f - 0.5f;
    };
    for (auto & x : h_in) x = rnd() * 0.2f;
    for (int64_t i = 0; i < Hv * n_max; ++i) h_gb[i] = -0.05f + 0.04f * rnd();            // gate before expf
    for (int64_t i = 0; i < Hv * n_max; ++i) h_gb[Hv * n_max + i] = 0.5f + rnd() * 0.5f;  // beta
    for (auto & x : h_s0) x = rnd() * 0.1f;

    float *in, *gb, *s0, *dst, *state;
    check(cudaMalloc(&in, h_in.size() * 4), "malloc");
    check(cudaMalloc(&gb, h_gb.size() * 4), "malloc");
    check(cudaMalloc(&s0, h_s0.size() * 4), "malloc");
    check(cudaMalloc(&state, h_s0.size() * 4), "malloc");
    check(cudaMalloc(&dst, layers * n_max * Hv * S * 4), "malloc");
    check(cudaMemcpy(in, h_in.data(), h_in.size() * 4, cudaMemcpyHostToDevice), "copy");
    check(cudaMemcpy(gb, h_gb.data(), h_gb.size() * 4, cudaMemcpyHostToDevice), "copy");
    check(cudaMemcpy(s0, h_s0.data(), h_s0.size() * 4, cudaMemcpyHostToDevice), "copy");
    cudaStream_t stream;
    check(cudaStreamCreate(&stream), "stream");
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);

    const char * forms[] = {"chain", "one_round", "gram"};
    for (int64_t n : {1, 16, 32, 64}) {
        std::vector<float> chain_out;
        for (const char * form : forms) {
            if (which != "all" && which != form) continue;
            const bool reordered = std::string(form) != "chain";
            if (reordered && n < 2) continue;
            ggml_ext::set_gdn_gram(std::string(form) == "gram");
            auto run_layers = [&] {
                for (int64_t l = 0; l < layers; ++l) {
                    GdnChainArgs a = {};
                    a.q = in;
                    a.k = in + S * Hk;
                    a.v = in + 2 * S * Hk;
                    a.g = gb;
                    a.beta = gb + Hv * n;
                    a.s0 = s0 + l * Hv * S * S;
                    a.state = state + l * Hv * S * S;
                    a.dst = dst + l * n * Hv * S;
                    a.S = S, a.H = Hv, a.n_tokens = n, a.n_seqs = 1;
                    a.sq1 = S, a.sq2 = row, a.sq3 = row * n;
                    a.sv1 = S, a.sv2 = row, a.sv3 = row * n;
                    a.sb1 = 1, a.sb2 = Hv, a.sb3 = Hv * n;
                    a.neqk1 = Hk, a.rq3 = 1, a.scale = 0.0884f;
                    const bool ran = reordered ? ggml_ext_cuda_gated_delta_net_one_round(a, stream)
                                               : ggml_ext_cuda_gated_delta_net(a, stream);
                    if (!ran) {
                        std::fprintf(stderr, "%s declined S = %d, %d tokens\n", form, (int)S, (int)n);
                        std::exit(1);
                    }
                }
            };
            for (int w = 0; w < 3; ++w) run_layers();
            check(cudaStreamSynchronize(stream), "warm");
            const int reps = 20;
            std::vector<float> ms(reps);
            for (int r = 0; r < reps; ++r) {
                cudaEventRecord(e0, stream);
                run_layers();
                cudaEventRecord(e1, stream);
                check(cudaEventSynchronize(e1), "run");
                cudaEventElapsedTime(&ms[r], e0, e1);
            }
            std::sort(ms.begin(), ms.end());
            std::vector<float> out(layers * n * Hv * S), st(h_s0.size());
            check(cudaMemcpy(out.data(), dst, out.size() * 4, cudaMemcpyDeviceToHost), "read");
            check(cudaMemcpy(st.data(), state, st.size() * 4, cudaMemcpyDeviceToHost), "read");
            double diff = -1.0;  // a reordered form against the chain kernel, relative to the outputs' scale
            if (!reordered) {
                chain_out = out;
            } else if (!chain_out.empty()) {
                double mx = 1e-30, d = 0.0;
                for (size_t i = 0; i < out.size(); ++i) {
                    mx = std::max(mx, (double)std::fabs(chain_out[i]));
                    d = std::max(d, (double)std::fabs(out[i] - chain_out[i]));
                }
                diff = d / mx;
            }
            std::printf(
                "{\"bench\": \"gdn_chain\", \"label\": \"%s\", \"form\": \"%s\", \"S\": %d, \"heads\": %d, "
                "\"layers\": %d, \"tokens\": %d, \"us_48_layers_median\": %.1f, \"us_48_layers_min\": %.1f, "
                "\"max_rel_diff_vs_chain\": %.3g, \"samples_ms\": [",
                label, form, (int)S, (int)Hv, (int)layers, (int)n, 1000 * ms[reps / 2], 1000 * ms[0], diff);
            for (int r = 0; r < reps; ++r) std::printf("%s%.4f", r ? ", " : "", ms[r]);
            std::printf("], \"checksum_out\": \"%016llx\", \"checksum_state\": \"%016llx\"}\n",
                        (unsigned long long)checksum(out), (unsigned long long)checksum(st));
        }
    }
    return 0;
}
