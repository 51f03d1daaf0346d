#include "ggml_ext_matmul.h"

namespace ggml_ext {

ggml_tensor * mul_mat_invariant(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x) {
    ggml_tensor * t = ggml_mul_mat(ctx, w, x);
    t->op_params[kMulMatTagSlot] = kMulMatInvariantTag;  // ggml.h exposes op_params as int32_t[]
    return t;
}

ggml_tensor * mul_mat_tiles(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x) {
    ggml_tensor * t = ggml_mul_mat(ctx, w, x);
    t->op_params[kMulMatTagSlot] = kMulMatTilesTag;
    return t;
}

// ggml's own op_params of the nodes flagged here: MUL_MAT 0 (accumulator precision), 1 (hint), 3
// (src1 precision, which CUDA's mmq asserts on; slot 2 would be src0's, which ggml refuses to set);
// FLASH_ATTN_EXT 0..2 (scale, max_bias, softcap), 3 (precision), 4 (n_kv_max).
static_assert(kMulMatTagSlot == 2 && GGML_EXT_MUL_MAT_CPU_SLOT > 3 && GGML_EXT_MUL_MAT_CPU_SLOT != kMulMatTagSlot,
              "ggml_ext's MUL_MAT flags must stay out of ggml's op_params slots");
static_assert(GGML_EXT_FLASH_ATTN_CPU_SLOT > 4, "ggml's FLASH_ATTN_EXT op_params take slots 0..4");

void mark_batch_invariant_on_cpu(ggml_cgraph * gf) {
    for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) {
        ggml_tensor * t = ggml_graph_node(gf, i);
        if (is_mul_mat_tiles(t) || is_mul_mat_invariant(t)) {
            t->op_params[GGML_EXT_MUL_MAT_CPU_SLOT] = GGML_EXT_CPU_INVARIANT_FLAG;
        } else if (t->op == GGML_OP_FLASH_ATTN_EXT) {
            t->op_params[GGML_EXT_FLASH_ATTN_CPU_SLOT] = GGML_EXT_CPU_INVARIANT_FLAG;
        }
    }
}

#ifndef DFLASH_HAS_CUDA
void set_gemv_enabled(bool) {}
bool gemv_enabled() { return false; }
void set_q80_enabled(bool) {}
bool q80_enabled() { return false; }
void set_mma_enabled(bool) {}
bool mma_enabled() { return false; }
void set_mma_q80_enabled(bool) {}
bool mma_q80_enabled() { return false; }
void set_mma_max_columns(int) {}
int mma_max_columns() { return 0; }
void set_wgmma_enabled(bool) {}
bool wgmma_enabled() { return false; }
bool wgmma_built() { return false; }
int64_t wgmma_launches() { return 0; }
void set_wgmma_split_enabled(bool) {}
bool wgmma_split_enabled() { return false; }
int64_t wgmma_split_launches() { return 0; }
void set_wgmma_pipe(int) {}
int wgmma_pipe() { return 0; }
int64_t wgmma_pipe_launches() { return 0; }
void set_wgmma_early_enabled(bool) {}
bool wgmma_early_enabled() { return false; }
int64_t wgmma_early_launches() { return 0; }
void set_wgmma_short_enabled(bool) {}
bool wgmma_short_enabled() { return false; }
void set_wgmma_short_mode(int) {}
int wgmma_short() { return 0; }
void set_wgmma_tall_from(int) {}
int wgmma_tall_from_columns() { return 0; }
void set_mma_tall_two_tiles(bool) {}
bool mma_tall_two_tiles() { return false; }
int64_t mma_tall_two_tiles_launches() { return 0; }
void set_mma_tma(bool) {}
bool mma_tma() { return false; }
int64_t mma_tma_launches() { return 0; }
void set_wgmma_warpgroups(int) {}
int wgmma_warpgroups() { return 0; }
int64_t wgmma_two_wg_launches() { return 0; }
void set_wgmma_chunks_enabled(bool) {}
bool wgmma_chunks_enabled() { return false; }
void set_wgmma_chunks_mode(int) {}
int wgmma_chunks() { return 0; }
int64_t wgmma_chunks_launches() { return 0; }
void set_wgmma_res_mode(int) {}
int wgmma_res() { return 0; }
int64_t wgmma_res_launches() { return 0; }
void set_wgmma_ws_mode(int) {}
int wgmma_ws() { return 0; }
int64_t wgmma_ws_launches() { return 0; }
void set_mma_q6k_long_8(int) {}
int mma_q6k_long_8() { return 0; }
void set_mma_split(int) {}
void set_mma_act_smem(bool) {}
bool mma_act_smem() { return false; }
int mma_split() { return 0; }
int64_t mma_split_launches() { return 0; }
void set_q6k_wgmma_from(int) {}
int q6k_wgmma_from_columns() { return 0; }
void set_q4k_f16_from(int) {}
int q4k_f16_from_columns() { return 0; }
void set_q4k_f16_tall_from(int) {}
int q4k_f16_tall_from_columns() { return 0; }
void set_q6k_output_from(int) {}
int q6k_output_from_columns() { return 0; }
void set_q6k_other_from(int) {}
int q6k_other_from_columns() { return 0; }
int64_t f16_wgmma_launches() { return 0; }
void set_f16_wgmma_all(bool) {}
bool f16_wgmma_all() { return false; }
void set_f16_ws_enabled(bool) {}
bool f16_ws_enabled() { return false; }
int64_t f16_ws_launches() { return 0; }
GemmSplit f16_wgmma_last_split() { return {}; }
void set_f16_convert_v8(bool) {}
bool f16_convert_v8() { return false; }
void set_mmq_tiles_enabled(bool) {}
bool mmq_tiles_enabled() { return false; }
void set_fuse_add_enabled(bool) {}
bool fuse_add_enabled() { return false; }
void set_fuse_add_max_columns(int) {}
int fuse_add_max_columns() { return 0; }
int64_t mul_mat_add_fusions() { return 0; }
void set_fuse_glu_enabled(bool) {}
bool fuse_glu_enabled() { return false; }
int64_t mul_mat_glu_fusions() { return 0; }
void set_fuse_rms_norm_enabled(bool) {}
bool fuse_rms_norm_enabled() { return false; }
int64_t mul_mat_rms_norm_fusions() { return 0; }
void set_fuse_rms_norm_gemv_enabled(bool) {}
bool fuse_rms_norm_gemv_enabled() { return false; }
int64_t mul_mat_rms_norm_gemv_fusions() { return 0; }
void set_fuse_rms_norm_pair_enabled(bool) {}
bool fuse_rms_norm_pair_enabled() { return false; }
int64_t mul_mat_rms_norm_pair_fusions() { return 0; }
void set_fuse_pair_act_enabled(bool) {}
bool fuse_pair_act_enabled() { return false; }
int64_t mul_mat_pair_act_fusions() { return 0; }
void set_fuse_head_norm_enabled(bool) {}
bool fuse_head_norm_enabled() { return false; }
int64_t mul_mat_head_norm_fusions() { return 0; }
void set_fuse_sigmoid_gate_enabled(bool) {}
bool fuse_sigmoid_gate_enabled() { return false; }
int64_t mul_mat_sigmoid_gate_fusions() { return 0; }
#endif

}  // namespace ggml_ext
