// ggml-cuda/unary.cuh's one-value SiLU, for the CPU emulator (the same formula).
#pragma once

#include "common.cuh"

inline float ggml_cuda_op_silu_single(float x) { return x / (1.0f + expf(-x)); }
