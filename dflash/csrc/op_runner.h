// Runs one ggml_ext tree op on the CPU or the GPU, for op tests (CPU vs CUDA vs a numpy
// reference of every root-to-leaf path).
#pragma once

#include <cstdint>
#include <vector>

namespace dflash {

struct OpInput {
    std::vector<float> data;
    std::vector<int64_t> ne;  // ggml order (ne[0] fastest)
};

// The first GPU backend when gpu is true (EngineError if there is none), else the CPU.
std::vector<float> run_tree_ssm_conv(const OpInput & x, const OpInput & conv_state, const OpInput & w,
                                     const std::vector<int32_t> & parents, bool gpu, int n_threads);
std::vector<float> run_tree_gated_delta_net(const OpInput & q, const OpInput & k, const OpInput & v, const OpInput & g,
                                            const OpInput & beta, const OpInput & state,
                                            const std::vector<int32_t> & parents, bool gpu, int n_threads);
bool gpu_backend_available();

}  // namespace dflash
