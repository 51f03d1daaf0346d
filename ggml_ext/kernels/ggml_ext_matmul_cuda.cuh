// ggml_ext's CUDA matmul for tagged MUL_MAT nodes, called from ggml-cuda's dispatch
// (patches/0002). Returns false when it does not take the node (ggml computes it as usual).
#pragma once

#include "ggml-cuda/common.cuh"

bool ggml_ext_cuda_mul_mat_invariant(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
