// CPU kernels of ggml_ext's tree ops, the fused GDN inputs (ggml_ext_gdn.h) and the path attention
// (ggml_ext_attn.h), called from ggml-cpu's dispatch (patches/0001).
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

struct ggml_compute_params;
struct ggml_tensor;

void ggml_ext_compute_forward_tree_ssm_conv(const struct ggml_compute_params * params, struct ggml_tensor * dst);
void ggml_ext_compute_forward_tree_gated_delta_net(const struct ggml_compute_params * params, struct ggml_tensor * dst);
void ggml_ext_compute_forward_gdn_decode_inputs(const struct ggml_compute_params * params, struct ggml_tensor * dst);
void ggml_ext_compute_forward_attn_paths(const struct ggml_compute_params * params, struct ggml_tensor * dst);

#ifdef __cplusplus
}
#endif
