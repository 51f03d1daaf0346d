// dflash._core's switches of ggml_ext's CUDA kernels (forms, fusions, thresholds) and their
// launch counters; no effect without CUDA.
#include "bindings_common.h"

using namespace dflash;

namespace dflash::bindings {

namespace {

// A GEMM form's mode switch and its launch counter, named from one stem: set_<stem>_mode(mode),
// <stem>() and <stem>_launches() (the count so far, for tests). doc: what the modes select.
void def_form_mode(py::module_ & m, const std::string & stem, void (*set)(int), int (*get)(), int64_t (*launches)(),
                   const char * doc) {
    m.def(("set_" + stem + "_mode").c_str(), set, py::arg("mode"), doc);
    m.def(stem.c_str(), get);
    m.def((stem + "_launches").c_str(), launches, ("launches of " + stem + "'s GEMM form so far (tests)").c_str());
}

// The same for a form switched on or off: set_<stem>_enabled(on), <stem>_enabled(), <stem>_launches().
void def_form_switch(py::module_ & m, const std::string & stem, void (*set)(bool), bool (*get)(), int64_t (*launches)(),
                     const char * doc) {
    m.def(("set_" + stem + "_enabled").c_str(), set, py::arg("on"), doc);
    m.def((stem + "_enabled").c_str(), get);
    m.def((stem + "_launches").c_str(), launches, ("launches of " + stem + "'s GEMM form so far (tests)").c_str());
}

// A fusion's switch and counter: set_fuse_<stem>_enabled(on), fuse_<stem>_enabled() and
// mul_mat_<stem>_fusions() (the count so far, for tests). doc: what is fused; count_doc: what is counted.
void def_fusion(py::module_ & m, const std::string & stem, void (*set)(bool), bool (*get)(), int64_t (*count)(),
                const char * doc, const char * count_doc) {
    m.def(("set_fuse_" + stem + "_enabled").c_str(), set, py::arg("on"), doc);
    m.def(("fuse_" + stem + "_enabled").c_str(), get);
    m.def(("mul_mat_" + stem + "_fusions").c_str(), count, count_doc);
}

// A column threshold: set_<stem>_from(n) and <stem>_from_columns().
void def_from_columns(py::module_ & m, const std::string & stem, void (*set)(int), int (*get)(), const char * doc) {
    m.def(("set_" + stem + "_from").c_str(), set, py::arg("n"), doc);
    m.def((stem + "_from_columns").c_str(), get);
}

}  // namespace

void bind_switches(py::module_ & m) {
    m.def("set_gemv_enabled", &ggml_ext::set_gemv_enabled, py::arg("on"),
          "ggml_ext's Q4_K / Q6_K GEMV for 1..8 columns on CUDA (on by default; DFLASH_GEMV=0 starts it off); "
          "off: ggml's mul_mat_vec_q");
    m.def("gemv_enabled", &ggml_ext::gemv_enabled);
    m.def("set_q80_enabled", &ggml_ext::set_q80_enabled, py::arg("on"),
          "ggml_ext's GEMV for Q8_0 weights too (off by default: slower than ggml's mul_mat_vec_q on the H200; "
          "DFLASH_Q80=1 starts it on; on, it also sends Q8_0 to the tensor-core GEMM, see set_mma_q80_enabled); "
          "no effect without CUDA");
    m.def("q80_enabled", &ggml_ext::q80_enabled);
    m.def("set_gdn_columns", &ggml_ext::set_gdn_columns, py::arg("columns"),
          "CUDA delta rule kernels (chain and tree): state columns a warp, 0 (by the grid, the default) or 1, 2, 4 "
          "forced (DFLASH_GDN_COLUMNS; states of fewer than 64 rows take 1); no effect without CUDA");
    m.def("gdn_columns", &ggml_ext::gdn_columns);
    m.def("set_gdn_chain_enabled", &ggml_ext::set_gdn_chain_enabled, py::arg("on"),
          "ggml_gated_delta_net on CUDA through ggml_ext's chain kernel (on by default; DFLASH_GDN_CHAIN=0) or "
          "ggml's; no effect without CUDA");
    m.def("gdn_chain_enabled", &ggml_ext::gdn_chain_enabled);
    m.def("set_gdn_staged", &ggml_ext::set_gdn_staged, py::arg("on"),
          "CUDA chain delta rule: stage a chunk of tokens' inputs in shared memory (S >= 64; on by default, "
          "DFLASH_GDN_STAGED=0 starts it off; the same bits; no effect without CUDA)");
    m.def("gdn_staged", &ggml_ext::gdn_staged);
    m.def("set_tree_gdn_mode", &ggml_ext::set_tree_gdn_mode, py::arg("mode"),
          "CUDA tree delta rule: 0 by the grid (default), 1 the walk (a warp every node), 2 the paths (a warp a "
          "preorder segment; DFLASH_TREE_GDN=walk|paths); the same bits; no effect without CUDA");
    m.def("tree_gdn_mode", &ggml_ext::tree_gdn_mode);
    m.def("set_gdn_chunked", &ggml_ext::set_gdn_chunked, py::arg("on"),
          "CUDA: marked ggml_gated_delta_net nodes (a verify's or a prefill's chain outside the batch-invariant "
          "mode) take the chunked delta rule, 64 tokens at a time as matrix products (off by default: slower than "
          "the chain kernel on the H200 so far; DFLASH_GDN_CHUNKED=1 starts it on); no effect without CUDA");
    m.def("gdn_chunked", &ggml_ext::gdn_chunked);
    m.def("set_gdn_chunked_min_tokens", &ggml_ext::set_gdn_chunked_min_tokens, py::arg("n"),
          "the fewest tokens that take the chunked delta rule (<= 0: the default, 8; DFLASH_GDN_CHUNKED_MIN)");
    m.def("gdn_chunked_min_tokens", &ggml_ext::gdn_chunked_min_tokens);
    m.def("set_gdn_one_round", &ggml_ext::set_gdn_one_round, py::arg("on"),
          "CUDA: marked ggml_gated_delta_net nodes take the chain with one round of warp reductions a token "
          "(on by default; DFLASH_GDN_ONE_ROUND=0 starts it off: the chain kernel's bits); no effect without CUDA");
    m.def("gdn_one_round", &ggml_ext::gdn_one_round);
    m.def("set_gdn_one_round_columns", &ggml_ext::set_gdn_one_round_columns, py::arg("columns"),
          "state columns a lane of the one-round kernel: 1, 2 or 4 (DFLASH_GDN_ONE_ROUND_COLUMNS); 0, the default: "
          "by the form (a chain 2, a tree 1)");
    m.def("gdn_one_round_columns", &ggml_ext::gdn_one_round_columns);
    m.def("set_gdn_one_round_lanes", &ggml_ext::set_gdn_one_round_lanes, py::arg("lanes"),
          "lanes a state column of the one-round kernel: 8 or 16 (DFLASH_GDN_ONE_ROUND_LANES); 0, the default (8)");
    m.def("gdn_one_round_lanes", &ggml_ext::gdn_one_round_lanes);
    m.def("set_gdn_one_round_step", &ggml_ext::set_gdn_one_round_step, py::arg("tokens"),
          "tokens a step of the one-round kernel (one round of reductions a step; a tree's runs of parent-child "
          "links): 1 (the default), 2 or 4 (DFLASH_GDN_ONE_ROUND_STEP), with 8 lanes a column; 0 without CUDA");
    m.def("gdn_one_round_step", &ggml_ext::gdn_one_round_step);
    m.def("set_gdn_inputs_tokens", &ggml_ext::set_gdn_inputs_tokens, py::arg("tokens"),
          "tokens a block of the CUDA kernel of the n-token and tree GDN inputs: 1, 4, 8 or 16, or 0 (the default: 8 "
          "from 48 tokens, else 1; DFLASH_GDN_INPUTS_TOKENS; the same bits); 0 without CUDA");
    m.def("gdn_inputs_tokens", &ggml_ext::gdn_inputs_tokens);
    m.def("set_gdn_gram", &ggml_ext::set_gdn_gram, py::arg("on"),
          "CUDA: marked chains of 2 tokens or more take 16 tokens at a time in parallel (gdn_chain_gram.cu) in place "
          "of the one-round kernel, which must be on (off by default; DFLASH_GDN_GRAM=1 starts it on)");
    m.def("gdn_gram", &ggml_ext::gdn_gram);
    m.def("set_mma_enabled", &ggml_ext::set_mma_enabled, py::arg("on"),
          "ggml_ext's tensor-core GEMM for Q4_K / Q5_K / Q6_K / Q8_0 x 2..mma_max_columns() columns on CUDA instead of "
          "ggml's mmq (on by default; DFLASH_MMA=0 starts it off)");
    m.def("mma_enabled", &ggml_ext::mma_enabled);
    m.def("set_mma_q80_enabled", &ggml_ext::set_mma_q80_enabled, py::arg("on"),
          "Q8_0 weights through ggml_ext's tensor-core GEMM too (on by default; DFLASH_MMA_Q80=0 starts it off)");
    m.def("mma_q80_enabled", &ggml_ext::mma_q80_enabled);
    m.def("set_mma_max_columns", &ggml_ext::set_mma_max_columns, py::arg("n"),
          "the most columns ggml_ext's GEMM takes: 16, 32, 64, 128 or 256 (the default; DFLASH_MMA_MAX_COLUMNS); "
          "above 64 it runs launches of 64; 0 without CUDA");
    m.def("mma_max_columns", &ggml_ext::mma_max_columns);
    m.def("set_wgmma_enabled", &ggml_ext::set_wgmma_enabled, py::arg("on"),
          "within the tensor-core GEMM, Q4_K x 25..64 columns of matrices of 16384 rows or more through Hopper's "
          "wgmma (an sm_90a build on an sm_90 GPU; on by default there, DFLASH_WGMMA=0 starts it off)");
    m.def("wgmma_enabled", &ggml_ext::wgmma_enabled);
    m.def("wgmma_built", &ggml_ext::wgmma_built, "whether this build has the wgmma GEMM (CUDA for sm_90a)");
    m.def("wgmma_launches", &ggml_ext::wgmma_launches, "launches of the wgmma GEMM so far (tests)");
    m.def("set_wgmma_split_enabled", &ggml_ext::set_wgmma_split_enabled, py::arg("on"),
          "the wgmma GEMM's last wave of row tiles split along K where it holds few tiles (on by default; "
          "DFLASH_WGMMA_SPLIT=0 turns it off)");
    m.def("wgmma_split_enabled", &ggml_ext::wgmma_split_enabled);
    m.def("set_mma_q6k_long_8", &ggml_ext::set_mma_q6k_long_8, py::arg("mode"),
          "CUDA: Q6_K rows of 24 super-blocks or more at up to 16 columns with 8 warps a block, the stages in dynamic "
          "shared memory: 0 off (the default until measured), 1 at 3 blocks a multiprocessor, 2 with the compiler's "
          "registers (DFLASH_MMA_Q6K_LONG_8)");
    m.def("mma_q6k_long_8", &ggml_ext::mma_q6k_long_8);
    m.def("set_mma_split", &ggml_ext::set_mma_split, py::arg("pieces"),
          "CUDA: rows of 24 super-blocks or more at 17..64 columns in the mma.sync GEMM split along K into this many "
          "blocks a row tile, the last adding their sums in order: 0 or 1 off (the default: slower on the H100), 2..8, "
          "or -1: every matrix of 4 super-blocks a row or more, in the pieces that fill a wave (DFLASH_MMA_SPLIT, "
          "auto for -1)");
    m.def("mma_split", &ggml_ext::mma_split);
    m.def("set_mma_act_smem", &ggml_ext::set_mma_act_smem, py::arg("on"),
          "CUDA: that split's activations staged in shared memory once a block (the same outputs; off: slower than "
          "the unsplit GEMM on the H100, DFLASH_MMA_ACT_SMEM=1)");
    m.def("mma_act_smem", &ggml_ext::mma_act_smem);
    m.def("mma_split_launches", &ggml_ext::mma_split_launches, "launches of the split mma.sync GEMM so far (tests)");
    def_from_columns(
        m, "q6k_wgmma", &ggml_ext::set_q6k_wgmma_from, &ggml_ext::q6k_wgmma_from_columns,
        "CUDA (sm_90a build, sm_90 GPU): Q6_K products of n..64 columns through the f16 wgmma GEMM (scales folded "
        "into f16 weight operands): 0 off, 2..64 (DFLASH_Q6K_WGMMA; 9 by default, through its warp-specialized "
        "form: on the H100 the 16-, 32- and 64-token forwards gained; the output matrix from 17 at least)");
    def_from_columns(
        m, "q4k_f16", &ggml_ext::set_q4k_f16_from, &ggml_ext::q4k_f16_from_columns,
        "CUDA (sm_90a build, sm_90 GPU): Q4_K products of n..64 columns through the f16 wgmma GEMM (scales and "
        "mins folded into f16 weight operands) instead of the int8 forms: 0 off (the default: slower on the H100), "
        "2..64 (DFLASH_Q4K_F16)");
    def_from_columns(
        m, "q4k_f16_tall", &ggml_ext::set_q4k_f16_tall_from, &ggml_ext::q4k_f16_tall_from_columns,
        "CUDA (sm_90a build, sm_90 GPU): Q4_K matrices of 16384 rows or more through the f16 wgmma GEMM from n "
        "columns whatever set_q4k_f16_from says: 33 by default (session 54), 0 off, 2..64 "
        "(DFLASH_Q4K_F16_TALL)");
    def_from_columns(
        m, "q6k_output", &ggml_ext::set_q6k_output_from, &ggml_ext::q6k_output_from_columns,
        "CUDA (sm_90a build, sm_90 GPU): the output matrix (65536 rows or more) takes Q6_K's f16 wgmma form from "
        "max(q6k_wgmma_from_columns, n) columns: 2..64 (DFLASH_Q6K_WGMMA_OUTPUT, 17 by default), 0 for no floor");
    def_from_columns(
        m, "q6k_other", &ggml_ext::set_q6k_other_from, &ggml_ext::q6k_other_from_columns,
        "CUDA (sm_90a build, sm_90 GPU): Q6_K's other matrices (neither long rows nor the output matrix) take its "
        "f16 wgmma form from max(q6k_wgmma_from_columns, n) columns: 2..64 (DFLASH_Q6K_WGMMA_OTHER, 25 by default), "
        "0 never");
    m.def("set_f16_wgmma_all", &ggml_ext::set_f16_wgmma_all, py::arg("on"),
          "the f16 wgmma GEMM for every matrix of its types, not only long rows (24 super-blocks or more) and the "
          "output matrix (65536 rows or more) (DFLASH_F16_WGMMA_ALL=1)");
    m.def("f16_wgmma_all", &ggml_ext::f16_wgmma_all);
    m.def("set_f16_convert_v8", &ggml_ext::set_f16_convert_v8, py::arg("on"),
          "the f16 wgmma GEMM's activations converted with 8 values a thread above 16 columns (on by default; "
          "DFLASH_F16_CONVERT_V8=0 starts it off: a value a thread; the same halves); no effect without CUDA");
    m.def("f16_convert_v8", &ggml_ext::f16_convert_v8);
    def_form_switch(m, "f16_ws", &ggml_ext::set_f16_ws_enabled, &ggml_ext::f16_ws_enabled, &ggml_ext::f16_ws_launches,
                    "the f16 wgmma GEMM through its warp-specialized form (a producer warpgroup staging on mbarriers; "
                    "the same bits where both split alike): on by default (DFLASH_F16_WS=0 starts it off); no effect "
                    "without CUDA");
    m.def(
        "f16_wgmma_last_split",
        [] {
            const ggml_ext::GemmSplit s = ggml_ext::f16_wgmma_last_split();
            return py::make_tuple(s.full_tiles, s.tail, s.pieces);
        },
        "the last f16 wgmma launch's tail split, (row tiles in full, tiles split, pieces a split tile): (tiles, 0, "
        "1) unsplit; the two forms' bits agree where their splits do (tests)");
    m.def("f16_wgmma_launches", &ggml_ext::f16_wgmma_launches,
          "launches of the f16 wgmma GEMM (Q6_K, Q4_K) so far (tests)");
    m.def("wgmma_split_launches", &ggml_ext::wgmma_split_launches,
          "launches of the wgmma GEMM with a split tail so far (tests)");
    m.def("set_wgmma_pipe", &ggml_ext::set_wgmma_pipe, py::arg("mode"),
          "the wgmma GEMM pipelined (a super-block's float step while the next one's wgmmas run; the same bits): 0 "
          "off (the default until measured), 1 on, 2 on and also for 25..32 columns of [gate; up] "
          "(DFLASH_WGMMA_PIPE)");
    m.def("wgmma_pipe", &ggml_ext::wgmma_pipe);
    m.def("wgmma_pipe_launches", &ggml_ext::wgmma_pipe_launches, "launches of the pipelined wgmma GEMM so far (tests)");
    def_form_switch(m, "wgmma_early", &ggml_ext::set_wgmma_early_enabled, &ggml_ext::wgmma_early_enabled,
                    &ggml_ext::wgmma_early_launches,
                    "the unpipelined wgmma GEMM with the pipelined one's staging (the next stage's copies after a "
                    "super-block's first wgmmas; the same bits), where the pipe mode is 0 (on by default; "
                    "DFLASH_WGMMA_EARLY=0 turns it off)");
    m.def("set_wgmma_short_enabled", &ggml_ext::set_wgmma_short_enabled, py::arg("on"),
          "Q4_K matrices of fewer than 16384 rows at 33..64 columns through the wgmma GEMM too, split along K to "
          "fill the GPU (mode 1; the default is mode 2; DFLASH_WGMMA_SHORT=1 starts mode 1)");
    m.def("wgmma_short_enabled", &ggml_ext::wgmma_short_enabled);
    m.def("set_wgmma_short_mode", &ggml_ext::set_wgmma_short_mode, py::arg("mode"),
          "Q4_K matrices of fewer than 16384 rows at 33..64 columns through the wgmma GEMM: 0 none, 1 all, 2 rows of "
          "64 super-blocks or more only (DFLASH_WGMMA_SHORT; 2 by default); 0 without CUDA");
    m.def("wgmma_short", &ggml_ext::wgmma_short);
    m.def("set_wgmma_tall_from", &ggml_ext::set_wgmma_tall_from, py::arg("n"),
          "columns from which Q4_K matrices of 32768 rows or more take the wgmma GEMM: 25 by default, 25..64 "
          "(DFLASH_WGMMA_TALL_FROM); 0 without CUDA");
    m.def("wgmma_tall_from", &ggml_ext::wgmma_tall_from_columns);
    def_form_switch(m, "mma_tall_two_tiles", &ggml_ext::set_mma_tall_two_tiles, &ggml_ext::mma_tall_two_tiles,
                    &ggml_ext::mma_tall_two_tiles_launches,
                    "Q4_K / Q5_K matrices of 32768 rows or more at up to 16 columns on two row tiles a warp in the "
                    "mma.sync GEMM (DFLASH_MMA_TALL_TWO_TILES=1; off by default); false without CUDA");
    def_form_switch(m, "mma_tma", &ggml_ext::set_mma_tma, &ggml_ext::mma_tma, &ggml_ext::mma_tma_launches,
                    "Q4_K's mma.sync GEMM of up to 32 columns with its stages filled by 2D bulk tensor copies on a "
                    "Hopper GPU (on by default; DFLASH_MMA_TMA=1 up to 16 columns, =0 off); false without CUDA or an "
                    "sm_90 build");
    m.def("set_wgmma_warpgroups", &ggml_ext::set_wgmma_warpgroups, py::arg("n"),
          "warpgroups a block of the wgmma GEMM: 1 (the default), 2 (the early-staging kernel) or 3 (the "
          "chunk-waiting kernel; DFLASH_WGMMA_WG); 0 without CUDA");
    m.def("wgmma_warpgroups", &ggml_ext::wgmma_warpgroups);
    m.def("wgmma_two_wg_launches", &ggml_ext::wgmma_two_wg_launches,
          "launches of the wgmma GEMM with two or three warpgroups a block so far (tests)");
    m.def("set_wgmma_chunks_enabled", &ggml_ext::set_wgmma_chunks_enabled, py::arg("on"),
          "the early wgmma GEMM waiting a chunk at a time, 2 stages and 3 blocks a multiprocessor, on every wgmma "
          "launch (mode 1; DFLASH_WGMMA_CHUNKS=1; the same bits); off: mode 0");
    m.def("wgmma_chunks_enabled", &ggml_ext::wgmma_chunks_enabled);
    def_form_mode(m, "wgmma_chunks", &ggml_ext::set_wgmma_chunks_mode, &ggml_ext::wgmma_chunks,
                  &ggml_ext::wgmma_chunks_launches,
                  "the chunk-waiting wgmma GEMM: 0 off, 1 every wgmma launch, 2 matrices of 32768 rows or more at 32 "
                  "columns or fewer only (the default; DFLASH_WGMMA_CHUNKS); 0 without CUDA");
    def_form_mode(m, "wgmma_res", &ggml_ext::set_wgmma_res_mode, &ggml_ext::wgmma_res, &ggml_ext::wgmma_res_launches,
                  "Q4_K products with a fused residual through the wgmma GEMM with the residual fused: 0 off (the "
                  "default), 1 rows of 64 super-blocks or more only, 2 every one (DFLASH_WGMMA_RES); 0 without CUDA");
    def_form_mode(m, "wgmma_ws", &ggml_ext::set_wgmma_ws_mode, &ggml_ext::wgmma_ws, &ggml_ext::wgmma_ws_launches,
                  "the warp-specialized wgmma GEMM (a producer warpgroup's copies on mbarriers) in place of the "
                  "early form: 0 off, 1 one consumer warpgroup a block, 2 two, at every column count, 3 one from 33 "
                  "columns, 4 one by each Q4_K matrix's shape, a fused residual too (the default; "
                  "DFLASH_WGMMA_WS); 0 without CUDA");
    m.def("set_mmq_tiles_enabled", &ggml_ext::set_mmq_tiles_enabled, py::arg("on"),
          "ggml_ext's mmq launch policy for the engine's products on CUDA (on by default); off: ggml's own");
    m.def("mmq_tiles_enabled", &ggml_ext::mmq_tiles_enabled);
    def_fusion(m, "add", &ggml_ext::set_fuse_add_enabled, &ggml_ext::fuse_add_enabled, &ggml_ext::mul_mat_add_fusions,
               "ggml-cuda's mul_mat + add fusion for the tensor-core GEMM's products (the residual added as it "
               "writes; on by default; DFLASH_FUSE_ADD=0 starts it off); no effect without CUDA",
               "how many mul_mat + add pairs the GEMM took fused in this process (0 without CUDA)");
    m.def("set_fuse_add_max_columns", &ggml_ext::set_fuse_add_max_columns, py::arg("n"),
          "the most columns of a product the mul_mat + add fusion takes: 64 (the default) or 48 "
          "(DFLASH_FUSE_ADD_MAX_COLUMNS=48); 0 without CUDA");
    m.def("fuse_add_max_columns", &ggml_ext::fuse_add_max_columns);
    def_fusion(
        m, "glu", &ggml_ext::set_fuse_glu_enabled, &ggml_ext::fuse_glu_enabled, &ggml_ext::mul_mat_glu_fusions,
        "a SwiGLU read only by the engine's matmul after it is computed by that matmul's activation quantizer "
        "(the same outputs, one kernel fewer; on by default; DFLASH_FUSE_GLU=0 starts it off); no effect without "
        "CUDA",
        "how many SwiGLU nodes the matmuls' quantizers took in this process (0 without CUDA)");
    def_fusion(m, "rms_norm", &ggml_ext::set_fuse_rms_norm_enabled, &ggml_ext::fuse_rms_norm_enabled,
               &ggml_ext::mul_mat_rms_norm_fusions,
               "an RMSNorm and its weight read only by the engine's matmul after them (2..64 columns) are computed by "
               "that matmul's activation quantizer (the same outputs, one kernel fewer; on by default; "
               "DFLASH_FUSE_RMS_NORM=0 starts it off); no effect without CUDA",
               "how many RMSNorm nodes the matmuls' quantizers took in this process (0 without CUDA)");
    def_fusion(m, "rms_norm_gemv", &ggml_ext::set_fuse_rms_norm_gemv_enabled, &ggml_ext::fuse_rms_norm_gemv_enabled,
               &ggml_ext::mul_mat_rms_norm_gemv_fusions,
               "at one column (a decode step) that RMSNorm is computed by the GEMV's activation quantizer (the same "
               "outputs; on by default; DFLASH_FUSE_RMS_NORM_GEMV=0 starts it off); no effect without CUDA",
               "how many RMSNorm nodes the GEMV's quantizer took at one column in this process (0 without CUDA)");
    def_fusion(m, "rms_norm_pair", &ggml_ext::set_fuse_rms_norm_pair_enabled, &ggml_ext::fuse_rms_norm_pair_enabled,
               &ggml_ext::mul_mat_rms_norm_pair_fusions,
               "an RMSNorm and its weight read by exactly two tagged matmuls right after them (2..64 columns): one "
               "quantizer for both products computes the norm (the same outputs; on by default; "
               "DFLASH_FUSE_RMS_NORM_PAIR=0 starts it off); no effect without CUDA",
               "how many RMSNorm nodes the quantizers of matmul pairs took in this process (0 without CUDA)");
    def_fusion(m, "pair_act", &ggml_ext::set_fuse_pair_act_enabled, &ggml_ext::fuse_pair_act_enabled,
               &ggml_ext::mul_mat_pair_act_fusions,
               "in such a pair where one product takes the f16 wgmma form and the other an int8 form, both activation "
               "forms come from one launch (the same outputs; on by default; DFLASH_FUSE_PAIR_ACT=0 starts it off); no "
               "effect without CUDA",
               "how many matmul pairs took both activation forms from one launch in this process (0 without CUDA)");
    def_fusion(m, "head_norm", &ggml_ext::set_fuse_head_norm_enabled, &ggml_ext::fuse_head_norm_enabled,
               &ggml_ext::mul_mat_head_norm_fusions,
               "a per-head RMSNorm (and weight) whose SwiGLU feeds a tagged matmul (2..256 columns: the delta rule's "
               "gated output) is computed by that matmul's quantizer with the SwiGLU (the same outputs; on by "
               "default; DFLASH_FUSE_HEAD_NORM=0 starts it off); no effect without CUDA",
               "how many per-head RMSNorm nodes the matmuls' quantizers took in this process (0 without CUDA)");
    def_fusion(m, "sigmoid_gate", &ggml_ext::set_fuse_sigmoid_gate_enabled, &ggml_ext::fuse_sigmoid_gate_enabled,
               &ggml_ext::mul_mat_sigmoid_gate_fusions,
               "the attention's sigmoid output gate is read in place by o_proj's quantizer (2..256 columns; the copy "
               "and the sigmoid-multiply kernels skipped, the same outputs; on by default; "
               "DFLASH_FUSE_SIGMOID_GATE=0 starts it off); no effect without CUDA",
               "how many sigmoid gates the matmuls' quantizers took in this process (0 without CUDA)");
}

}  // namespace dflash::bindings
