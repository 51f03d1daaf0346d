// Where each tap of a node's conv window comes from, shared by the CPU and CUDA tree conv.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define GGML_EXT_HOST_DEVICE __host__ __device__
#else
#define GGML_EXT_HOST_DEVICE
#endif

// src[j] for taps j = 0..K-1 (tap K-1 multiplies the node itself, tap K-2 its parent, ...): an x
// column when >= 0, else -1 - c for column c of the cached conv state [K-1, C] (K-2 = newest),
// used once the path to the root runs out.
GGML_EXT_HOST_DEVICE inline void tree_conv_taps(const int32_t * parent, int64_t node, int K, int64_t * src) {
    int64_t a = node, m = 0;
    for (int o = 0; o < K; ++o) {
        if (a >= 0) {
            src[K - 1 - o] = a;
            ++m;
            a = parent[a];
        } else {
            src[K - 1 - o] = -1 - (K - 2 - (o - m));
        }
    }
}
