// Matmuls whose per-column arithmetic does not depend on how many columns they have
// (ggml_ext/BATCH_INVARIANCE.md): a verify of many tokens then computes every token's
// projections bit for bit as a one-token decode does.
#pragma once

#include "ggml.h"
#include "ggml_ext_cpu_invariant.h"

namespace ggml_ext {

// Marks a MUL_MAT node (op_params slot 2; ggml uses 0 for precision and 1 for hints).
constexpr int kMulMatTagSlot = 2;
constexpr int32_t kMulMatInvariantTag = 0x44465331;  // "DFS1"

// ggml_mul_mat(w, x) tagged for ggml_ext's CUDA kernel: on CUDA, for a quantized w with the
// vector-kernel layout and 2..64 columns, each column gets the arithmetic of ggml's one-column
// mul_mat_vec_q. Other backends and shapes compute it as ggml does (it is the same op).
ggml_tensor * mul_mat_invariant(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x);

inline bool is_mul_mat_invariant(const ggml_tensor * t) {
    return t->op == GGML_OP_MUL_MAT && t->op_params[kMulMatTagSlot] == kMulMatInvariantTag;
}

// ggml_mul_mat(w, x) tagged for ggml_ext's faster CUDA kernels, the engine's weight matmuls: for
// quantized w and more than 8 columns, ggml's tensor-core kernel (mmq) under ggml_ext's launch
// policy (patches/0003): one block per output tile, with no stream-k fixup pass, when the fixup
// would cost more than the balance it buys (small matrices, short K); Q4_K / Q6_K w with 1..8
// columns: ggml_ext's GEMV (below). Same result up to the order of float sums; other backends and
// shapes as ggml does.
constexpr int32_t kMulMatTilesTag = 0x44465332;  // "DFS2"
ggml_tensor * mul_mat_tiles(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x);

inline bool is_mul_mat_tiles(const ggml_tensor * t) {
    return t->op == GGML_OP_MUL_MAT && t->op_params[kMulMatTagSlot] == kMulMatTilesTag;
}

// Marks a decode or verify graph batch-invariant on the CPU (ggml_ext_cpu_invariant.h): its
// tagged products take the one-column kernel for every column, its attention the reference path
// (one query at a time, never split over threads), so that greedy speculative output equals
// decoding there bit for bit. No effect on CUDA. A prefill keeps ggml's faster batched CPU
// kernels (it is the same graph on both sides).
void mark_batch_invariant_on_cpu(ggml_cgraph * gf);

// ggml_ext's small-batch GEMV for Q4_K / Q6_K (and Q5_K / Q8_0) weights and 1..8 columns on CUDA
// (kernels/gemv_kquant.cu, patches/0005): it computes the products tagged mul_mat_tiles or
// mul_mat_invariant that ggml would give its mul_mat_vec_q, fused forms included (residual add,
// SwiGLU gate); the invariant matmul runs more columns through it in chunks. On by default
// (DFLASH_GEMV=0 starts it off); switching it lets benches and tests compare with ggml's own
// kernel in one process. No effect without CUDA.
void set_gemv_enabled(bool on);
bool gemv_enabled();
// ggml_ext's GEMV for Q8_0 weights too (Q8_0 files and drafters; the GEMM: mma_q80_enabled). Off by
// default: on the H200 its GEMV read at ~0.8 TB/s, below ggml's mul_mat_vec_q (session 8,
// bench/results/h200-s8-gemv-standalone-all-a092eca.json.gz); DFLASH_Q80=1 starts it on. Q5_K (Q5_K_M files)
// is always on with the GEMV: 2.5-2.7 TB/s, AR 114 t/s against 92 with mmvq on the 27B. No effect
// without CUDA.
void set_q80_enabled(bool on);
bool q80_enabled();

// ggml_ext's tensor-core GEMM for Q4_K / Q5_K / Q6_K / Q8_0 weights (kernels/gemm_kquant_mma.cu):
// tagged mul_mat_tiles products of 2..mma_max_columns() columns go to it instead of ggml's mmq or
// its GEMV when on (the default; DFLASH_MMA=0 starts it off). No effect without CUDA.
void set_mma_enabled(bool on);
bool mma_enabled();
// Q8_0 weights through that GEMM (activations quantized per 32 values, as ggml's q8_1): on by
// default, DFLASH_MMA_Q80=0 starts it off (q80_enabled turns it on too).
void set_mma_q80_enabled(bool on);
bool mma_q80_enabled();
// The most columns the GEMM takes: 16, 32, 64, 128 or 256 (the default; DFLASH_MMA_MAX_COLUMNS);
// above 64 it runs launches of 64 columns. Other values round up to the next of those.
void set_mma_max_columns(int n);
int mma_max_columns();
// Within that GEMM, Q4_K x 25..64 columns of the tall matrices (16384 rows or more: [gate; up],
// the stacked GDN projections; 33+ columns from 32768 rows) through Hopper's wgmma
// (kernels/gemm_q4k_wgmma.cuh) on an sm_90a build on an sm_90 GPU: on by default there
// (DFLASH_WGMMA=0 starts it off); wgmma_built says whether this build has it, wgmma_launches
// counts its launches (tests). No effect elsewhere.
void set_wgmma_enabled(bool on);
bool wgmma_enabled();
bool wgmma_built();
int64_t wgmma_launches();
// The wgmma form's last wave of row tiles split along K (kernels/gemm_q4k_wgmma.cuh, WgSplit) where
// the grid runs more than one wave and its last holds few tiles
// (on by default since session 30; DFLASH_WGMMA_SPLIT=0 turns it off); wgmma_split_launches counts
// the launches that split (tests).
void set_wgmma_split_enabled(bool on);
bool wgmma_split_enabled();
int64_t wgmma_split_launches();
// The wgmma form pipelined (a super-block's float step while the next one's wgmmas run; the same
// bits): 0 off (the default until measured), 1 on, 2 on and also for 25..32 columns of the
// tallest matrices ([gate; up]); DFLASH_WGMMA_PIPE sets it. wgmma_pipe_launches counts (tests).
void set_wgmma_pipe(int mode);
int wgmma_pipe();
int64_t wgmma_pipe_launches();
// The unpipelined wgmma kernel with the pipelined one's staging (the next stage's copies after a
// super-block's first wgmmas; the same bits), where the pipe mode is 0: on by default since
// session 30 (DFLASH_WGMMA_EARLY=0 turns it off); wgmma_early_launches counts (tests).
void set_wgmma_early_enabled(bool on);
bool wgmma_early_enabled();
int64_t wgmma_early_launches();
// Q4_K matrices of fewer than 16384 rows at 33..64 columns (no fused residual) through the wgmma
// form as well, split along K to fill the GPU: mode 0 off, 1 every such matrix, 2 (the default
// on CUDA) only rows of 64 super-blocks or more (the 27B's ffn_down); DFLASH_WGMMA_SHORT
// sets it. set_wgmma_short_enabled(on) is mode 1 or 0, wgmma_short_enabled() mode 1.
void set_wgmma_short_enabled(bool on);
bool wgmma_short_enabled();
void set_wgmma_short_mode(int mode);
int wgmma_short();
// Columns from which Q4_K matrices of 32768 rows or more ([gate; up]) take the wgmma form: 25 by
// default, 25..64 (DFLASH_WGMMA_TALL_FROM); anything else restores 25.
void set_wgmma_tall_from(int n);
int wgmma_tall_from_columns();
// Whether Q4_K / Q5_K matrices of 32768 rows or more ([gate; up]) take two row tiles a warp at up to
// 16 columns in the mma.sync GEMM (DFLASH_MMA_TALL_TWO_TILES=1; off by default); false without CUDA.
void set_mma_tall_two_tiles(bool on);
bool mma_tall_two_tiles();
// Launches it put on two row tiles so far (tests); 0 without CUDA.
int64_t mma_tall_two_tiles_launches();
// Whether Q4_K's mma.sync GEMM of up to 32 columns fills its stages with 2D bulk tensor copies on a
// Hopper GPU (on by default; DFLASH_MMA_TMA=1 up to 16 columns, =0 off); false without CUDA or an
// sm_90 build.
void set_mma_tma(bool on);
bool mma_tma();
// Launches it ran so far (tests); 0 without CUDA.
int64_t mma_tma_launches();
// Warpgroups a block of the early-staging wgmma kernel: 1 (the default) or 2 (DFLASH_WGMMA_WG=2:
// 128 rows a block on one copy of the activations; the same bits unsplit), or 3 (the chunk-waiting
// kernel with 192 rows a block);
// wgmma_two_wg_launches counts the launches with 2 or 3 (tests).
void set_wgmma_warpgroups(int n);
int wgmma_warpgroups();
int64_t wgmma_two_wg_launches();
// The early wgmma kernel waiting for its wgmmas a chunk at a time (two chunks' operands live), with
// 2 stages and 3 blocks a multiprocessor (the same bits): mode 1 every wgmma launch, mode 2 (the
// default) only matrices of 32768 rows or more at 32 columns or fewer ([gate; up]), 0 none;
// DFLASH_WGMMA_CHUNKS sets it. wgmma_chunks_launches counts it (tests). set_wgmma_chunks_enabled(on)
// is mode 1 or 0, wgmma_chunks_enabled() mode 1.
void set_wgmma_chunks_enabled(bool on);
bool wgmma_chunks_enabled();
void set_wgmma_chunks_mode(int mode);
int wgmma_chunks();
int64_t wgmma_chunks_launches();
// Q4_K products with a fused residual (9 columns up to the fusion's limit) through the early wgmma
// kernel with the residual added as it writes, split along K: 0 off (the default: slower on the
// H100, session 39), 1 rows of 64 super-blocks or more only (the 27B's ffn_down), 2 every one (ssm_out, attn_output
// too); DFLASH_WGMMA_RES sets it. wgmma_res_launches counts those launches (tests).
void set_wgmma_res_mode(int mode);
int wgmma_res();
int64_t wgmma_res_launches();
// The warp-specialized wgmma kernel (a producer warpgroup staging with cp.asyncs and bulk copies on
// mbarriers) in place of the early form with one warpgroup and no residual: 0 off, 1 one consumer
// warpgroup a block (the same bits), 2 two, at every column count; 3 one from 33 columns; 4 (the
// default) one by each matrix's shape, from 17..49 columns, with a fused residual too
// (DFLASH_WGMMA_WS); wgmma_ws_launches counts it (tests).
void set_wgmma_ws_mode(int mode);
int wgmma_ws();
int64_t wgmma_ws_launches();
// Long rows (24 super-blocks or more: the 27B's ffn_down) of Q6_K at up to 16 columns with 8 warps
// a block, their stages in dynamic shared memory (56 KB, over the 48 KB of static): 0 off (the
// default until measured), 1 at 3 blocks a multiprocessor (80 registers), 2 with the compiler's
// registers (2 blocks); DFLASH_MMA_Q6K_LONG_8 sets it. Q4_K and Q5_K already take 8 warps there.
void set_mma_q6k_long_8(int mode);
int mma_q6k_long_8();
// Long rows (24 super-blocks or more: the 27B's ffn_down, ssm_out, attn_output) at 17..64 columns
// in the mma.sync GEMM by blocks of 4 warps on 64 rows (each warp 16 of its own, the 4 reading the
// same activations), split along K into `pieces` blocks a tile, the last to finish adding the
// pieces' sums in piece order (no second launch; another float order than unsplit, the same for any
// arrival order): 0 or 1 off (the default until measured), 2..8 the pieces (2 super-blocks a piece
// at least), -1 (DFLASH_MMA_SPLIT=auto) every matrix of 4 super-blocks a row or more in the pieces
// that fill one wave; DFLASH_MMA_SPLIT sets it. mma_split_launches counts them.
void set_mma_split(int pieces);
int mma_split();
// That split's activations staged in shared memory once a block (its warps read them there; the
// same bits): off until timed, DFLASH_MMA_ACT_SMEM=1 starts it on.
void set_mma_act_smem(bool on);
bool mma_act_smem();
int64_t mma_split_launches();
// Q6_K / Q4_K products of n..64 columns through the f16 wgmma GEMM (gemm_f16_wgmma.cuh; sm_90a builds
// on sm_90 GPUs): 0 off (until measured), n in 2..64 from n columns (DFLASH_Q6K_WGMMA=n,
// DFLASH_Q4K_F16=n). f16_wgmma_launches counts them (tests).
void set_q6k_wgmma_from(int n);
int q6k_wgmma_from_columns();
void set_q4k_f16_from(int n);
int q4k_f16_from_columns();
// Q4_K matrices of 16384 rows or more (the 27B's [gate; up], [gdn q; k; v; z]) through it from n
// columns whatever the above (DFLASH_Q4K_F16_TALL=n, 2..64; 33 by default since session 54; 0 off).
void set_q4k_f16_tall_from(int n);
int q4k_f16_tall_from_columns();
// The output matrix (65536 rows or more) takes Q6_K's f16 form from max(that, n) columns
// (DFLASH_Q6K_WGMMA_OUTPUT; 17 by default); Q4_K's long rows are ffn_down's only (64 super-blocks or more).
void set_q6k_output_from(int n);
int q6k_output_from_columns();
// Q6_K's other matrices (neither long rows nor the output matrix) take it from max(that, n) columns
// (DFLASH_Q6K_WGMMA_OTHER; 25 by default since session 45; 0: never).
void set_q6k_other_from(int n);
int q6k_other_from_columns();
int64_t f16_wgmma_launches();
// Which matrices it takes: long rows (24 super-blocks or more) and the output matrix (65536 rows or
// more) by default; every matrix with DFLASH_F16_WGMMA_ALL=1 (or on).
void set_f16_wgmma_all(bool on);
bool f16_wgmma_all();
// The f16 wgmma GEMM through its warp-specialized form (a producer warpgroup staging on mbarriers;
// the same bits where both forms split alike): on by default, DFLASH_F16_WS=0 starts it off;
// f16_ws_launches counts it (tests).
void set_f16_ws_enabled(bool on);
bool f16_ws_enabled();
int64_t f16_ws_launches();
// The last f16 wgmma launch's tail split (either form; tests): row tiles in full, tiles split and
// pieces a split tile; {tiles, 0, 1} unsplit, {0, 0, 1} before any launch or without CUDA.
struct GemmSplit {
    int full_tiles = 0, tail = 0, pieces = 1;
};
GemmSplit f16_wgmma_last_split();
// Its activations converted to f16 with 8 values a thread above 16 columns (DFLASH_F16_CONVERT_V8; on
// by default; off: a value a thread at every column count). The same halves either way. No effect
// without CUDA (false).
void set_f16_convert_v8(bool on);
bool f16_convert_v8();

// ggml-cuda's mul_mat + add fusion for the GEMM's products of up to fuse_add_max_columns() columns
// (patches/0008): the residual added as the GEMM writes its outputs, the same float addition as the
// add node's. On by default (DFLASH_FUSE_ADD=0 starts it off); mul_mat_add_fusions counts the adds
// it took (tests). The column limit: 48 or 64 (DFLASH_FUSE_ADD_MAX_COLUMNS; default 64). No effect
// without CUDA (0).
void set_fuse_add_enabled(bool on);
bool fuse_add_enabled();
void set_fuse_add_max_columns(int n);
int fuse_add_max_columns();
int64_t mul_mat_add_fusions();

// A SwiGLU node read only by the engine's tagged matmul after it is skipped, that matmul's
// activation quantizer computing silu(a) * b from its inputs (patches/0009, kernels/glu_fusion.cu;
// the same quantized values, so the same outputs): on by default (DFLASH_FUSE_GLU=0 starts it off);
// mul_mat_glu_fusions counts the GLU nodes it took (tests). No effect without CUDA.
void set_fuse_glu_enabled(bool on);
bool fuse_glu_enabled();
int64_t mul_mat_glu_fusions();

// An RMSNorm and its weight read only by the engine's tagged matmul after them, of 2..64 columns,
// are skipped, the tensor-core GEMM's quantizer computing the norm from their inputs in ggml's
// order (patches/0010, kernels/rms_norm_fusion.cu; the same quantized values, so the same
// outputs): on by default (DFLASH_FUSE_RMS_NORM=0 starts it off); mul_mat_rms_norm_fusions counts
// the norms it took (tests). No effect without CUDA.
void set_fuse_rms_norm_enabled(bool on);
bool fuse_rms_norm_enabled();
int64_t mul_mat_rms_norm_fusions();

// Two more forms of that fusion (rms_norm_fusion.cu), on by default since session 33 (below):
// - pairs: an RMSNorm and its weight read by exactly two tagged matmuls right after them (the
//   27B's layers whose attn_qkv / attn_v is Q6_K beside the Q4_K stack of their other input
//   projections): one quantizer launch for both products (both types' layouts), the norm node
//   skipped. DFLASH_FUSE_RMS_NORM_PAIR=0 turns it off; mul_mat_rms_norm_pair_fusions counts them.
// - head norms: the delta rule's gated output, silu(z) * (rms_norm(o per head) * w), before
//   ssm_out: the GEMM's quantizer computes each head's norm too, so the norm node is skipped with
//   the SwiGLU (and the residual add after the product is taken as glu_fusion.cu takes it; only
//   with the SwiGLU fusion on). DFLASH_FUSE_HEAD_NORM=0 turns it off; mul_mat_head_norm_fusions
//   counts them.
// Both give the unfused graph's bits (the same float operations). With the sigmoid gate below, on
// the H100 (session 33, bench/results/h100-s33-27b-kernels-*): the 27B's forwards of 16 / 32 / 64
// tokens 10.23 / 13.34 / 17.96 ms of kernels against 10.47 / 13.65 / 18.44. No effect without CUDA.
// - one column (a decode step): the norm read by the GEMV's quantizer (a block of ggml's 1024
//   norm threads a column, gemv::quantize_act_norm_kernel; the same bits), the norm kernel skipped
//   for the products the GEMM form takes at 2..64 columns, but not before a GLU's two products
//   (ggml-cuda's gated GEMV reads the activations once for both), and the FFN norm before that
//   GLU by the gated GEMV's quantizer (fuse_gemv_glu). On by default since session 52
//   (DFLASH_FUSE_RMS_NORM_GEMV=0 starts it off); mul_mat_rms_norm_gemv_fusions counts them. On
//   the H100 (session 52, same run) the 27B's decode step took 8.064 ms of kernels against 8.532
//   (853 launches against 1014), 122.7 against 116.4 t/s.
void set_fuse_rms_norm_gemv_enabled(bool on);
bool fuse_rms_norm_gemv_enabled();
int64_t mul_mat_rms_norm_gemv_fusions();
void set_fuse_rms_norm_pair_enabled(bool on);
bool fuse_rms_norm_pair_enabled();
int64_t mul_mat_rms_norm_pair_fusions();
// Such a pair where one product takes the f16 wgmma form and the other an int8 form with a scale a
// super-block (up to 64 columns on an sm_90a build on Hopper; in the 27B's forwards of 17..64 tokens
// a Q6_K attn_qkv beside its Q4_K z, or a Q6_K attn_v beside its Q4_K [q; k]): both
// activation forms in one launch (the same bytes and halves). Off until timed on the GPU
// (DFLASH_FUSE_PAIR_ACT=1 starts it on); mul_mat_pair_act_fusions counts them.
void set_fuse_pair_act_enabled(bool on);
bool fuse_pair_act_enabled();
int64_t mul_mat_pair_act_fusions();
void set_fuse_head_norm_enabled(bool on);
bool fuse_head_norm_enabled();
int64_t mul_mat_head_norm_fusions();

// The attention's sigmoid output gate, copied out of the [q; gate] product rows, read in place by
// o_proj's quantizer instead (patches/0011, kernels/glu_fusion.cu; the copy and the fused sigmoid
// and multiply skipped; the same bits): on by default since session 33 (DFLASH_FUSE_SIGMOID_GATE=0
// turns it off); mul_mat_sigmoid_gate_fusions counts them. No effect without CUDA.
void set_fuse_sigmoid_gate_enabled(bool on);
bool fuse_sigmoid_gate_enabled();
int64_t mul_mat_sigmoid_gate_fusions();

// The nodes of graph g in each form the norm and sigmoid-gate fusions take, as far as the graph's
// structure and shapes decide it (kernels/fusion_patterns.h; the products' types and column counts
// are judged on CUDA): RMS_NORMs read by one product, by two, per-head norms of a gated output, and
// the attention's sigmoid output gates; glu: the pairs whose products a SwiGLU right after reads.
struct FusionCounts {
    int single = 0, pair = 0, head = 0, gate = 0, glu = 0;
};
FusionCounts count_fusion_patterns(const ggml_cgraph * g);

// ggml_ext's mmq launch policy for tagged products (kernels/mmq_tiles.cu: one block per output
// tile where the stream-k fixup would cost more). Off: ggml's own launch for every product (the
// GPU oracle test compares graphs on ggml's kernels). On by default. No effect without CUDA.
void set_mmq_tiles_enabled(bool on);
bool mmq_tiles_enabled();

}  // namespace ggml_ext
