// The device standalones' CUDA error check: print what failed and exit.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

inline void check(cudaError_t e, const char * what) {
    if (e != cudaSuccess) {
        std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
        std::exit(1);
    }
}
