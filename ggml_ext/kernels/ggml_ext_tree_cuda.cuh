// CUDA kernels of ggml_ext's tree ops, the fused GDN inputs (ggml_ext_gdn.h) and the path attention
// (ggml_ext_attn.h), called from ggml-cuda's dispatch (patches/0001).
#pragma once

#include "ggml-cuda/common.cuh"

void ggml_ext_cuda_tree_ssm_conv(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
void ggml_ext_cuda_tree_gated_delta_net(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
bool ggml_ext_cuda_tree_supports_op(const ggml_tensor * op);
void ggml_ext_cuda_gdn_decode_inputs(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
void ggml_ext_cuda_attn_paths(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
bool ggml_ext_cuda_attn_paths_supported(const ggml_tensor * op);
