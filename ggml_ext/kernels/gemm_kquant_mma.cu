// Dispatch of ggml_ext's small-batch tensor-core GEMM (gemm_kquant_mma_impl.cuh) for the engine's
// tagged Q4_K / Q5_K / Q6_K / Q8_0 products of 2..256 columns (a chain verify of 16 tokens, DDTree
// verifies; the GEMV keeps one column); above 64 columns, launches of 64. On the H200 (session 18):
// the 27B's 128-token forward 41.6 ms of kernels against 55.4 with ggml's mmq above 64 columns; the
// trained pair's Q8_0 chain step 0.84 ms against 1.38 with mmq.
// - Q4_K (and Q5_K, its layout plus the fifth bits) take the min term through an f16 mma, every
//   type runs 2 cp.async stages (session 8's fastest), with gemm_kq::min_blocks' occupancy and the
//   tiled activations of session 9: on the H200 standalone ffn_up 27 / 37 / 51 us at 16 / 32 / 64
//   columns (session 8's kernel 32 / 62 / 94), the Q6_K output 385 / 522 / 952 us (585 / 949 /
//   1835); bench/results/h200-s9-mma-standalone-*.json.
// - Column tiles of 8, 16, 24, 32, 48 and 64 (padded_columns): a tile costs the same for any count
//   up to its width.
// - Rows of 24 super-blocks or more (ffn_down, ssm_out, attn_output) run 8 warps a block up to 16
//   columns: Q4_K ffn_down 27.6 against 32.3 us at 16 columns, 22.7 against 28.9 at 8, but 42.1
//   against 34.4 at 24 (h200-s10-mma-standalone-long.json). Q6_K's 2 stages of 8 warps do not fit
//   48 KB (6 warps were slower): they run from dynamic shared memory with DFLASH_MMA_Q6K_LONG_8=1
//   or 2 (session 28; not yet timed).
// DFLASH_MMA=0 (or ggml_ext::set_mma_enabled(false)) turns it off; DFLASH_MMA_MAX_COLUMNS (16, 32,
// 64) sets the range and DFLASH_MMA_MINS_INT=1 keeps the integer min sums (exact), for benches.
// tools/device/gemv_standalone.sh mma checks and times it.
// - On an sm_90a build on an sm_90 GPU, Q4_K on the tall matrices at 25..64 columns takes the
//   wgmma form (gemm_q4k_wgmma.cuh; wgmma_shape below; DFLASH_WGMMA=0 keeps the mma.sync forms).
// This file picks each launch's form; the kernels are instantiated a weight type a file
// (gemm_mma_forms.cuh), which a build compiles in parallel.
#include "gemm_kquant_mma_impl.cuh"
#include "gemm_mma_forms.cuh"
#include "gemm_q4k_wgmma.cuh"
#include "ggml_ext_gemv_cuda.cuh"
#include "ggml_ext_matmul.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

namespace {

bool mma_enabled_flag = [] {
    const char * e = std::getenv("DFLASH_MMA");
    return !(e && e[0] == '0');
}();

// Warps per block for long rows (gemm_kq::kLongRowBlocks): 8, or DFLASH_MMA_LONG_WARPS=4 (benches).
bool long_rows_8_warps() {
    static const bool v = [] {
        const char * e = std::getenv("DFLASH_MMA_LONG_WARPS");
        return !(e && std::atoi(e) == 4);
    }();
    return v;
}

// Long rows of Q6_K (whose 2 stages of 8 warps need 56 KB, over the static 48 KB) with 8 warps, the
// stages in dynamic shared memory: 0 off (the default until measured on the H200); 1 with
// gemm_kq::min_blocks' 3 blocks a multiprocessor (80 registers: the 27B's ffn_down in one wave);
// 2 with the compiler's registers (123: 2 blocks, 1.2 waves). DFLASH_MMA_Q6K_LONG_8 sets it; where
// the device's opt-in shared memory allows it.
int q6k_long_8_mode = [] {
    const char * e = std::getenv("DFLASH_MMA_Q6K_LONG_8");
    const int m = e ? std::atoi(e) : 0;
    return m == 1 || m == 2 ? m : 0;
}();

// Pieces along K for long rows at 17..64 columns in the mma.sync forms (gemm_kq's kPieces kernels,
// ggml_ext::set_mma_split): 0 off until timed; DFLASH_MMA_SPLIT=2..8 sets them. The form: blocks
// whose 4 warps each own 16 rows (kSplitK false), so that they read the same activations, from L1.
// Why: at 32 columns a block of the engine's form reads the activations of all its super-blocks
// once for its 16 rows - for the 27B's Q6_K ffn_down 557 KB from L2 a block against 229 KB of
// weights, 178 MB a launch against 73 MB - and the warps wait on those loads (long scoreboard, 35-40%
// of their stalls; ncu on the H100, session 33), while more warps in flight bought nothing: the
// engine's form split into 2..8 pieces (the warps still sharing super-blocks) was slower at every
// shape (Q6_K ffn_down at 32 columns 53.6 us unsplit, 55.6 in 3 pieces, 67.9 in 2; ssm_out 14.8
// against 22..27; bench/results/h100-s33-mma-split-standalone-38d1c49.json).
// DFLASH_MMA_SPLIT=auto (-1, kMmaSplitAuto): every matrix of 4 super-blocks a row or more at 17..64
// columns in that form, in as many pieces (2..8, 2 super-blocks each at least) as fill one wave of
// the resident blocks: at 64 columns a block of the engine's form reads 8 column tiles of
// activations a super-block for its 16 rows (16 KB against Q4_K's 2.3 KB of weights), so the
// shorter rows (attn_q, the GDN projections, ssm_out) pay the same L2 traffic. Measured on the H100
// (session 34, bench/results/h100-s34-*): slower everywhere, the 27B's 32 / 64-token forwards 15.70 /
// 23.20 ms of kernels against 13.49 / 17.87 (alone, unsplit was the fastest at every shape): the
// activations' L2 reads are not what bounds the unsplit kernel.
int mma_split_pieces_flag = [] {
    const char * e = std::getenv("DFLASH_MMA_SPLIT");
    if (e && std::strcmp(e, "auto") == 0) return mma_forms::kMmaSplitAuto;
    const int p = e ? std::atoi(e) : 0;
    return p >= 2 && p <= 8 ? p : 0;
}();
std::atomic<int64_t> mma_split_count{0};
// The split's activations staged in shared memory a block (gemm_kq's kActSmem form; the same bits as
// the split without): off, DFLASH_MMA_ACT_SMEM=1 starts it on. On the H100 (session 34) it beat the
// warp-rows split (forwards of 32 / 64 tokens 15.46 / 21.72 ms against 15.70 / 23.20) but not the
// unsplit kernel (13.49 / 17.87).
bool mma_act_smem_flag = [] {
    const char * e = std::getenv("DFLASH_MMA_ACT_SMEM");
    return e && e[0] == '1';
}();

// 16-row tiles per warp (gemm_kq's R): 2 where it pays (below), or DFLASH_MMA_ROW_TILES=1 (benches).
int mma_row_tiles() {
    static const int v = [] {
        const char * e = std::getenv("DFLASH_MMA_ROW_TILES");
        return e && std::atoi(e) == 1 ? 1 : 2;
    }();
    return v;
}

// Columns the GEMM takes (DFLASH_MMA_MAX_COLUMNS 16, 32, 64, 128 or 256; 256 by default): above 64
// they run in launches of 64 (the weights are read once a launch).
int mma_max_columns_flag = [] {
    const char * e = std::getenv("DFLASH_MMA_MAX_COLUMNS");
    const int n = e ? std::atoi(e) : 256;
    return n == 16 || n == 32 || n == 64 || n == 128 ? n : 256;
}();

// The most columns of a product that takes its residual (DFLASH_FUSE_ADD_MAX_COLUMNS: 48 or 64).
// 64 by default since session 46: with every residual loaded before the first store
// (write_outputs) the kRes launches cost what the plain ones do (ffn_down's int8 warp-specialized
// launches 43.8 against 43.4 us at 64 columns), so the 64-token forward took 14.95 against 15.17 ms
// of kernels on the H100, 128 add nodes fewer (bench/results/h100-s46-*). It was 48 before: the
// kernels then read each residual between their stores (~11 us a launch at 64 columns; session
// 45), and on the H200 in session 27 the Q6_K kernel with the residual lost 0.6 ms.
int fuse_add_max_columns_flag = [] {
    const char * e = std::getenv("DFLASH_FUSE_ADD_MAX_COLUMNS");
    return e && std::atoi(e) < 64 ? 48 : 64;
}();

// A pair of products of one RMSNorm source where one takes the f16 wgmma form and the other an int8
// form with a scale a super-block (the 27B's Q4_K_M at 17..64 columns: a GDN layer's Q6_K attn_qkv
// beside its Q4_K z, 24 layers; an attention layer's Q6_K attn_v beside its Q4_K [q; k], 8): both
// activation forms in one launch (gemm_kq::quantize_act_and_f16; the same bytes and halves as its
// two launches, the emulator's check_act_pair), 32 launches fewer a forward. On by default since
// session 51 (H100, same run: 32 / 64-token forwards of the 27B 11.25 / 14.26 ms of kernels against
// 11.35 / 14.39; bench/results/h100-s51-c1-*); DFLASH_FUSE_PAIR_ACT=0 turns it off.
bool pair_act_flag = [] {
    const char * e = std::getenv("DFLASH_FUSE_PAIR_ACT");
    return !(e && e[0] == '0');
}();
std::atomic<int64_t> pair_act_count{0};

bool mma_q80_flag = [] {
    const char * e = std::getenv("DFLASH_MMA_Q80");
    return !(e && e[0] == '0');
}();

#ifdef DFLASH_HAVE_WGMMA  // ggml_ext/CMakeLists.txt: CMAKE_CUDA_ARCHITECTURES has 90a
constexpr bool kWgmmaBuilt = true;
#else
constexpr bool kWgmmaBuilt = false;
#endif
// Whether the kernels have an sm_90 pass for Hopper's bulk tensor copies (the emulator models them).
#if defined(DFLASH_HAVE_WGMMA) || defined(DFLASH_CUDA_EMU)
constexpr bool kTmaBuilt = true;
#else
constexpr bool kTmaBuilt = false;
#endif
bool wgmma_flag = [] {
    const char * e = std::getenv("DFLASH_WGMMA");
    return kWgmmaBuilt && !(e && e[0] == '0');
}();
std::atomic<int64_t> wgmma_count{0};
// The wgmma form's tail split (gemm_q4k_wgmma.cuh's WgSplit; its logic is checked on the emulator:
// tools/device/gemv_standalone.cu check_wgmma_split). On by default since session 30: on the H200
// the 27B's 64-token forward spent 5705 us in the wgmma GEMM against 6223 unsplit (kernel_profile,
// bench/results/h200-s30-f2-*); DFLASH_WGMMA_SPLIT=0 turns it off.
bool wgmma_split_flag = [] {
    const char * e = std::getenv("DFLASH_WGMMA_SPLIT");
    return !(e && e[0] == '0');
}();
std::atomic<int64_t> wgmma_split_count{0};
// The pipelined wgmma kernel (gemm_q4k_wgmma.cuh's kPipe: a super-block's float step under the
// next one's wgmmas; the same bits): 0 off (the default until measured on the H200), 1 on the
// shapes of wgmma_shape, 2 also on 25..32 columns of every tall matrix ([gate; up] at 32 columns,
// where the unpipelined kernel measured even with the mma.sync form: 59.0 against 58.5 us, session
// 19). DFLASH_WGMMA_PIPE sets it. Measured in session 30 (h200-s30-f1-*): no faster at 64 columns
// (6222 against 6223 us a 64-token forward) and slower at 32 with mode 2 (12.95 against 12.81 ms
// a 32-token forward), so it stays off; the early staging below is what gained.
int wgmma_pipe_mode = [] {
    const char * e = std::getenv("DFLASH_WGMMA_PIPE");
    const int m = e ? std::atoi(e) : 0;
    return m == 1 || m == 2 ? m : 0;
}();
std::atomic<int64_t> wgmma_pipe_count{0};
// The unpipelined wgmma kernel with the pipelined one's staging (gemm_q4k_wgmma.cuh's kEarly: the
// next stage's copies after the super-block's first wgmmas, at immediate offsets; the same bits;
// sm_90a SASS at 64 columns: 678 instructions a super-block against 702, 67 from the stage barrier
// to the first wgmma against 200, 197 registers against 215). On by default since session 30: on
// the H200 6066 against 6223 us a 64-token forward, 5520 against 5705 with the split (the forward
// 17.98 against 18.67 ms of kernels, h200-s30-f2-*); DFLASH_WGMMA_EARLY=0 turns it off (the pipe
// mode, when set, takes precedence).
bool wgmma_early_flag = [] {
    const char * e = std::getenv("DFLASH_WGMMA_EARLY");
    return !(e && e[0] == '0');
}();
std::atomic<int64_t> wgmma_early_count{0};
std::atomic<int64_t> wgmma_two_wg_count{0};
// Q4_K matrices of fewer than 16384 rows at 33..64 columns (without a fused residual: the 27B's
// ffn_down, ssm_out and attn_output at 64, attn_q, the GDN projections) through the wgmma form too,
// a grid under one wave split along K into pieces that fill the resident blocks (WgSplit; 5120
// rows are 80 tiles). Off until measured: session 25's stream-K form of the wgmma GEMM beat the
// mma.sync GEMM on ffn_down at 64 columns (48.9 against 55.6 us) but was slower elsewhere, and was
// not kept. Measured in session 30 with the pipelined kernel: slower (a 64-token forward 19.27
// against 18.62 ms, h200-s30-f1-*), so it stays off. Session 35's standalone on the H100 (early
// staging, split; h100-s35-standalone-f16-wgmma-9370f3d.json) had it ahead on ffn_down only (Q4_K
// 45.7 against 55.4 us at 64 columns; ssm_out 24.0 against 18.0), hence mode 2: only rows of
// kWgmmaLongKBlocks super-blocks or more. With the warp-specialized kernel (DFLASH_WGMMA_WS's
// default from 33 columns) mode 2 was the default in session 41: the 27B's 64-token forward on
// the H100 16.33 against 16.50 ms of kernels (ffn_down's Q4_K layers at 64 columns, where no
// residual is fused; bench/results/h100-s41-*). Off again since session 42: on the H100 that
// kernel gave ffn_down's products different bits from run to run (gemm_q4k_wgmma_ws.cuh), so mode
// 0 until its fix was seen deterministic on a GPU. Mode 2 again since session 43: with the fix, no
// run of 60 differed on the H100 (34816 x 17408 had differed in every run), and the 64-token forward
// took 15.84 / 15.84 / 15.92 ms of kernels in three profiles against 16.00 (48 tokens even;
// bench/results/h100-s43-*). DFLASH_WGMMA_SHORT=0, 1 or 2 sets the mode.
constexpr int kWgmmaLongKBlocks = 64;  // 16384 values: the 27B's ffn_down (68), not ssm_out (24)
int valid_short_mode(int m) { return m == 1 || m == 2 ? m : 0; }
int wgmma_short_mode = [] {
    const char * e = std::getenv("DFLASH_WGMMA_SHORT");
    return e ? valid_short_mode(std::atoi(e)) : 2;
}();
// Columns from which matrices of 32768 rows or more ([gate; up]) take the wgmma form: 25. Session
// 19 measured them even at 32 columns, so it was 33 until session 38: the 27B's 32-token forward on
// the H100 took 12.65 ms of kernels with 25 against 13.08 with 33 (the standalone: 56.0 against
// 63.5 us a launch; bench/results/h100-s38-*). DFLASH_WGMMA_TALL_FROM=25..64 sets it.
constexpr int kWgmmaTallDefaultFrom = 25;
int valid_tall_from(int n) { return n >= 25 && n <= 64 ? n : kWgmmaTallDefaultFrom; }
int wgmma_tall_from = [] {
    const char * e = std::getenv("DFLASH_WGMMA_TALL_FROM");
    return valid_tall_from(e ? std::atoi(e) : kWgmmaTallDefaultFrom);
}();
// Warpgroups a block of the early-staging wgmma kernel: 1, or 2 (DFLASH_WGMMA_WG=2; 128 rows a
// block reading one copy of each super-block's activations, half the staging and L2 reads of them
// a row; the same bits unsplit). With 197 registers a thread either holds 8 warps a multiprocessor.
// Or 3 (DFLASH_WGMMA_WG=3): the chunk-waiting kernel (168 registers, which 384 threads fit) with 192
// rows a block, 4 stages and one block a multiprocessor: 12 warps, a third of the activation reads.
int valid_warpgroups(int n) { return n == 2 || n == 3 ? n : 1; }
// The early kernel waiting for its wgmmas a chunk at a time (gemm_q4k_wgmma.cuh's kChunkWait: two
// chunks' operands live instead of four), with 2 stages and 3 blocks a multiprocessor (12 warps
// against 8; registers and shared memory both allow it). Mode 1 (DFLASH_WGMMA_CHUNKS=1): every
// wgmma launch; on the H100 (session 38) the 27B's forwards were slower (17.83 against 17.42 ms at
// 64 tokens), but in the standalone it was the fastest form on [gate; up] at 32 columns (52.8
// against 56.0 us; slower at 48..64 and on [gdn q; k; v; z]), hence mode 2 (DFLASH_WGMMA_CHUNKS=2):
// matrices of 32768 rows or more at 32 columns or fewer only: the default since session 39, when on
// the H100 the 27B's 32-token forward took 12.43 ms of kernels with it against 12.65
// (bench/results/h100-s39-*); DFLASH_WGMMA_CHUNKS=0 turns it off. The pipe mode takes precedence.
// The same bits.
constexpr int kWgmmaChunksDefault = 2;
int valid_chunks_mode(int m) { return m == 1 || m == 2 ? m : 0; }
int wgmma_chunks_mode = [] {
    const char * e = std::getenv("DFLASH_WGMMA_CHUNKS");
    return e ? valid_chunks_mode(std::atoi(e)) : kWgmmaChunksDefault;
}();
bool takes_chunks_form(int rows, int n) {
    return wgmma_chunks_mode == 1 || (wgmma_chunks_mode == 2 && rows >= 32768 && n <= 32);
}
std::atomic<int64_t> wgmma_chunks_count{0};
int wgmma_warpgroups_flag = [] {
    const char * e = std::getenv("DFLASH_WGMMA_WG");
    return valid_warpgroups(e ? std::atoi(e) : 1);
}();
// Q4_K products that take their residual (up to fuse_add_max_columns_flag columns: the 27B's
// ffn_down, ssm_out and attn_output) through the early wgmma kernel with the residual fused (kRes),
// one warpgroup a block, split along K to fill the GPU (80 row tiles of 5120 rows). Session 38's
// standalone on the H100 had the split wgmma form ahead on ffn_down's Q4_K layers at 16 columns
// (25.9 against 32.5 us for the engine's mma.sync form), where the engine fuses the residual, so
// the mma.sync GEMM kept them. Mode 1 (DFLASH_WGMMA_RES=1): rows of kWgmmaLongKBlocks super-blocks
// or more only (ffn_down), 2 every such product; from kWgmmaResMinColumns columns (the form pads to
// 16). Off (0): on the H100 (session 39, bench/results/h100-s39-27b-kernels-c3-*) the 27B's 16 /
// 32-token forwards took 10.31 / 12.58 ms of kernels with mode 1 against 10.03 / 12.41 (the
// engine's ffn_down at 16 columns runs on 8 warps a block: 23.2 us a launch against the wgmma
// form's 27.3 and its own quantizer), 10.75 / 13.15 with mode 2.
constexpr int kWgmmaResMinColumns = 9;
int valid_res_mode(int m) { return m == 1 || m == 2 ? m : 0; }
int wgmma_res_mode = [] {
    const char * e = std::getenv("DFLASH_WGMMA_RES");
    return valid_res_mode(e ? std::atoi(e) : 0);
}();
std::atomic<int64_t> wgmma_res_count{0};
// The warp-specialized wgmma kernel (gemm_q4k_wgmma_ws.cuh: a producer warpgroup's cp.asyncs and bulk
// copies on mbarriers, no block barrier a super-block) in place of the early form with one warpgroup
// and no residual: mode 1 (DFLASH_WGMMA_WS=1) with one consumer warpgroup a block (the same bits) at
// every column count, 2 with two on 128 rows (the same bits as DFLASH_WGMMA_WG=2 unsplit), 3 (the
// default of sessions 40-43) one consumer warpgroup from kWgmmaWsMinColumns columns; 0 off. On the
// H100 (session 40, bench/results/h100-s40-*): the 27B's 64-token forward took 16.50 ms of kernels
// with mode 1 against 17.26 ([gate; up] at 64 columns 65.1 against 73.1 us a launch in the
// standalone), mode 2 16.94; at 32 tokens mode 1 was 0.04 ms slower (gdn_in at 32 columns 30.7 against
// 27.2 us), so mode 3 starts above 32.
// Mode 4 (by shape; the default since session 44): one consumer warpgroup from the column count of
// each matrix where session 40's standalone on the H100
// (bench/results/h100-s40-standalone-wgmma.jsonl, us a launch) had it ahead of the form the engine ran
// by a microsecond or more, the residual of a fused add written by it (ws_shape_from): [gate; up] from
// 25 columns (51.6 against the chunk-waiting kernel's 52.6 at 32), [gdn q; k; v; z] from 49 (the early
// kernel 27.2 / 29.4 against 30.7 / 30.4 at 32 / 48; 29.5 against 32.8 at 64), attn_q from 25 (23.0
// against 25.5 at 32, 28.3 against the mma.sync GEMM's 32.0 at 64; 27.3 against 26.6 at 48),
// ffn_down's Q4_K layers from 17 (31.5 / 35.4 against 37.5 / 37.8 at 32 / 48; at 16 the mma.sync
// GEMM's 8 warps a block took 23.2 in session 39); never for ssm_out and attn_output (5120 x 6144:
// 15.9 against 14.5 at 32). On the H100 (session 44, bench/results/h100-s44-*; two profiles each) the
// 27B's 32 / 64-token forwards took 12.09 / 15.67 ms of kernels against mode 3's 12.24 / 15.81-15.85
// (48: 14.13 against 14.09-14.11, 16 even).
constexpr int kWgmmaWsMinColumns = 33;
constexpr int kWsByShape = 4;
int valid_ws_mode(int m) { return m >= 1 && m <= kWsByShape ? m : 0; }
int wgmma_ws_mode = [] {
    const char * e = std::getenv("DFLASH_WGMMA_WS");
    return e ? valid_ws_mode(std::atoi(e)) : kWsByShape;
}();
bool takes_ws_form(int n) {
    return wgmma_ws_mode == 1 || wgmma_ws_mode == 2 || (wgmma_ws_mode == 3 && n >= kWgmmaWsMinColumns);
}
// ssm_out and attn_output (5120 x 6144; with them any Q4_K matrix of under 8192 rows and under 64
// super-blocks a row, the 27B's lone z projections) in mode 4 from DFLASH_WS_SHORT_FROM=n columns
// (17..64; 65, never, by default). These launches take the mma.sync GEMM's ~19 us each at 64
// columns on the H100, ~3.6x their weights' read time, but the split warp-specialized kernel was no
// faster there: at 33 the 27B's 64-token forward took 14.41 against 14.44 ms of kernels (H100,
// session 50, bench/results/h100-s50-*; ~18.8 us a launch), so it stays off.
int valid_short_from(int n) { return n >= 17 && n <= 64 ? n : 65; }
int ws_short_from = [] {
    const char * e = std::getenv("DFLASH_WS_SHORT_FROM");
    return valid_short_from(e ? std::atoi(e) : 65);
}();
// Mode 4's first column count for a Q4_K matrix of rows x k (65: never).
int ws_shape_from(int rows, int k) {
    if (rows >= 32768) return 25;                 // [gate; up]
    if (rows >= 16384) return 49;                 // [gdn q; k; v; z]
    if (rows >= 8192) return 25;                  // attn_q
    if (k / 256 >= kWgmmaLongKBlocks) return 17;  // ffn_down
    return ws_short_from;                         // ssm_out, attn_output, the rest
}
bool takes_ws_shape(int rows, int k, int n) { return wgmma_ws_mode == kWsByShape && n >= ws_shape_from(rows, k); }
std::atomic<int64_t> wgmma_ws_count{0};

// Q6_K / Q4_K products through the f16 wgmma form (gemm_f16_wgmma.cuh: the scales folded into f16
// weight operands, no integer multiply-adds, no float step per super-block) from this many
// columns up to 64: 0 off, DFLASH_Q6K_WGMMA=n / DFLASH_Q4K_F16=n (2..64) set them. On an sm_90a
// build on an sm_90 GPU; Q4_K's takes precedence over its int8 wgmma form. Measured on the H100
// (session 35, bench/results/h100-s35-27b-kernels-*-9370f3d.json): Q6_K's (long rows and the
// output matrix) took the 27B's 64-token forward from 17.95 to 17.73 ms of kernels, 16 and 32
// tokens even (10.27 / 13.35 against 10.23 / 13.36); with Q4_K's too 10.91 / 14.10 / 18.06. So
// Q6_K's was on from 33 columns (where it gained; =0 turns it off), Q4_K's off. Through the
// warp-specialized form (below) Q6_K's is on from 17 since session 41: the standalone on the H100
// had Q6_K ffn_down at 24 / 32 columns 42.2 / 42.9 us against the mma.sync form's 47.7 / 53.8, the
// output matrix 454 / 457 against 490 / 544 (at 16: 38.9 against 48.3, but the output matrix 445
// against 405); the 27B's 32-token forward 12.25 against 12.41 ms of kernels
// (bench/results/h100-s41-*). Since session 42 the long rows from 9 and the output matrix from 17
// (its own floor below): the 16-token forward on the H100 9.72 against 9.91 ms of kernels, 32 and 64
// even (bench/results/h100-s42-*).
int columns_from_env(const char * name, int fallback) {
    const char * e = std::getenv(name);
    const int n = e ? std::atoi(e) : fallback;
    return n >= 2 && n <= 64 ? n : 0;
}
constexpr int kQ6kWgmmaDefaultFrom = 9, kQ6kOutputDefaultFrom = 17;
int q6k_wgmma_from = columns_from_env("DFLASH_Q6K_WGMMA", kQ6kWgmmaDefaultFrom);
int q4k_f16_from = columns_from_env("DFLASH_Q4K_F16", 0);
// The output matrix (65536 rows or more) takes Q6_K's f16 form from no fewer columns than this
// (DFLASH_Q6K_WGMMA_OUTPUT, 2..64): the standalone on the H100 had it slower there at 16 columns
// (445 against 405 us) and faster from 24 (454 against 490), where Q6_K ffn_down gained from 16
// (38.9 against 48.3; bench/results/h100-s41-c1-standalone-q6wg.jsonl), so DFLASH_Q6K_WGMMA=9
// moves the long rows alone.
int q6k_output_from = columns_from_env("DFLASH_Q6K_WGMMA_OUTPUT", kQ6kOutputDefaultFrom);
// Q6_K's other matrices (neither long rows nor the output matrix) take the f16 form from no fewer
// columns than this (DFLASH_Q6K_WGMMA_OTHER, 2..64; 0: never, as before session 45). On the H100
// (session 45, bench/results/h100-s45-*; DFLASH_F16_WGMMA_ALL=1, their 32 launches of a forward from
// 9 columns) the 27B's 32 / 48 / 64-token forwards took 11.80 / 13.86 / 15.26 ms of kernels against
// 11.86 / 13.90 / 15.61 (at 64 the f16 form's 28.4 us a launch against the mma.sync GEMM's 42.9,
// with 6.2 more for its activations' conversion), the 16-token one 9.68 against 9.55: from 25.
constexpr int kQ6kOtherDefaultFrom = 25;
int q6k_other_from = columns_from_env("DFLASH_Q6K_WGMMA_OTHER", kQ6kOtherDefaultFrom);
// Q4_K matrices of 16384 rows or more (the 27B's [gate; up] and [gdn q; k; v; z]) through the f16
// form from this many columns (DFLASH_Q4K_F16_TALL, 2..64; 0 off until timed in the engine): session
// 41's standalone on the H100 had [gdn q; k; v; z] at 48 / 64 columns 26.0 / 28.0 us through the
// f16 warp-specialized kernel against 29.4 / 32.7 for the int8 early kernel, [gate; up] 57.6 / 67.8
// against 64.7 / 73.4 (the int8 warp-specialized kernel, the engine's there, 65.1 at 64 in session
// 40; bench/results/h100-s41-c1-standalone-q6wg.jsonl). In the engine from 33 columns it lost 0.3 ms
// at 64 tokens in session 43; in session 54 (H100, bench/results/h100-s54-*) it gained: the 27B's
// 64-token forward 14.07 / 14.08 ms of kernels in two profiles against 14.30-14.31 in three with it
// off, 16 and 32 tokens even (9.54-9.57 / 11.25-11.26 against 9.51-9.56 / 11.24-11.26); from 9
// columns the 16-token forward lost 0.35 ms, from 49 the 64-token one gained less (14.15). So 33 by
// default since session 54; DFLASH_Q4K_F16_TALL=0 turns it off.
// DFLASH_Q4K_F16_TALL_BELOW=r (benches): only matrices of fewer than r rows (32768: [gdn q; k; v; z]
// without [gate; up]).
constexpr int kF16TallRows = 16384;
constexpr int kQ4kF16TallDefaultFrom = 33;
int q4k_f16_tall_from = columns_from_env("DFLASH_Q4K_F16_TALL", kQ4kF16TallDefaultFrom);
int q4k_f16_tall_below = [] {
    const char * e = std::getenv("DFLASH_Q4K_F16_TALL_BELOW");
    return e ? std::atoi(e) : 0;
}();
std::atomic<int64_t> f16_wgmma_count{0};

// Which matrices: by default long rows (gemm_kq::kLongRowBlocks super-blocks or more: the 27B's
// ffn_down, ssm_out, attn_output) and the output matrix (65536 rows or more), where session 35's
// standalone found the f16 form ahead on the H100 (Q6_K ffn_down 39.4 / 49.0 / 68.2 us at 16 / 32 /
// 64 columns against 47.7 / 53.6 / 70.7; the other Q6_K matrices of the 27B as fast or slower);
// DFLASH_F16_WGMMA_ALL=1 every matrix.
bool f16_wgmma_all_flag = [] {
    const char * e = std::getenv("DFLASH_F16_WGMMA_ALL");
    return e && e[0] == '1';
}();

// The f16 GEMM through its warp-specialized form (gemm_f16_wgmma_ws.cuh: a producer warpgroup's
// cp.asyncs and bulk copy on mbarriers; one consumer warpgroup up to 32 columns, two above; the
// same bits where both forms split a matrix alike): on by default since session 41, DFLASH_F16_WS=0
// turns it off. On the H100 the 27B's 64-token forward took 15.82 against 16.50 ms of kernels with
// it (Q6_K ffn_down 50.9 against 66.1 us a launch at 64 columns in the standalone, the output matrix
// 527 against 707; bench/results/h100-s41-*).
bool f16_ws_flag = [] {
    const char * e = std::getenv("DFLASH_F16_WS");
    return !(e && e[0] == '0');
}();
std::atomic<int64_t> f16_ws_count{0};

constexpr int kF16OutputRows = 65536;
bool takes_f16_wgmma(ggml_type t, int n, bool hopper, int rows, int k) {
    if (t == GGML_TYPE_Q4_K && rows >= kF16TallRows && q4k_f16_tall_from > 0 && n >= q4k_f16_tall_from &&
        (q4k_f16_tall_below <= 0 || rows < q4k_f16_tall_below)) {
        return kWgmmaBuilt && hopper && n <= 64;
    }
    int from = t == GGML_TYPE_Q6_K ? q6k_wgmma_from : t == GGML_TYPE_Q4_K ? q4k_f16_from : 0;
    if (t == GGML_TYPE_Q6_K && rows >= kF16OutputRows && from > 0) from = std::max(from, q6k_output_from);
    // Q4_K's long rows: ffn_down's only (ssm_out and attn_output, 24 super-blocks, were slower through
    // it in session 41's standalone: 15.6 against 14.5 us at 32 columns)
    const int long_blocks = t == GGML_TYPE_Q4_K ? kWgmmaLongKBlocks : gemm_kq::kLongRowBlocks;
    const bool named = f16_wgmma_all_flag || k / 256 >= long_blocks || rows >= kF16OutputRows;
    // Q6_K's other matrices from q6k_other_from
    const bool other = !named && t == GGML_TYPE_Q6_K && q6k_other_from > 0 && n >= q6k_other_from;
    return kWgmmaBuilt && hopper && from > 0 && n >= from && n <= 64 && (named || other);
}

// The shapes where the wgmma form beat the mma.sync forms on the H200 (session 19, standalone,
// bench/results/h200-s19-wgmma-staging.json): [gdn q; k; v; z] (16480 rows) from 32 columns
// (28.2 / 32.8 / 35.5 us at 32 / 48 / 64 against 31.1 / 38.5 / 48.0), [gate; up] (34816) from
// 48 (74.4 / 88.4 against 83.5 / 96.4; even at 32; from wgmma_tall_from since, 25 by default).
// Slower on fewer rows and fewer columns.
bool wgmma_shape(int rows, int k, int ncols) {
    if (takes_ws_shape(rows, k, ncols)) return true;
    if (rows < 16384) {
        return ncols > 32 && (wgmma_short_mode == 1 || (wgmma_short_mode == 2 && k / 256 >= kWgmmaLongKBlocks));
    }
    if (rows < 32768) return ncols > 24;
    return ncols >= wgmma_tall_from || (ncols > 24 && wgmma_pipe_mode == 2);
}

// Whether Q4_K / Q5_K rows of up to 16 columns take two row tiles a warp: when the grid of one
// tile a warp needs more than one wave of gemm_kq::min_blocks blocks a multiprocessor and the grid
// of two fits in one. The 27B's GDN input projection [q; k; v; z] (16480 rows) at 16 columns:
// 1030 blocks over 792 slots, 1.3 waves, against 515 over 528; on the H200 21.0 against 25.9 us
// (bench/results/h200-s23-mma-standalone-compare-86c19b2.txt). [gate; up] (2.75 waves) and
// ffn_up (17408 rows: 1.37 waves against 1.03) were slower with two tiles, attn_q (0.97 waves)
// about the same.
bool two_tiles_fill(int rows, int n, int nsm) {
    using F = gemm_kq::Q4KMinsMma;
    const int nct = n <= 8 ? 1 : 2;
    const int64_t one = (rows + 15) / 16, two = (rows + 31) / 32;
    return one > (int64_t)gemm_kq::min_blocks<F, gemm_kq::kWarps, 1>(nct) * nsm &&
           two <= (int64_t)gemm_kq::min_blocks<F, gemm_kq::kWarps, 2>(nct) * nsm;
}

// Q4_K / Q5_K matrices of 32768 rows or more (the 27B's [gate; up]) at up to 16 columns on two row
// tiles a warp too (DFLASH_MMA_TALL_TWO_TILES=1, off): two_tiles_fill keeps them on one (2.75 waves
// of one-tile blocks against 2.06 of two-tile ones), where the 16-token forward's [gate; up] takes
// 44.0 us a launch against the GEMV's 34.6 on the H100; with two tiles the forward took 9.92 against
// 9.57 ms of kernels (session 54, bench/results/h100-s54-c2-*), as on the H200 in session 23.
bool mma_tall_two_tiles_flag = [] {
    const char * e = std::getenv("DFLASH_MMA_TALL_TWO_TILES");
    return e && e[0] == '1';
}();
constexpr int kTallRows = 32768;
std::atomic<int64_t> mma_tall_two_tiles_count{0};  // launches on two tiles only by it

// Q4_K's mma.sync kernels of up to 32 columns with each warp's stages filled by one 2D bulk tensor
// copy a super-block (gemm_kq's kTma; a Hopper GPU and an sm_90 build): by the sm_90a SASS the
// lanes' cp.async staging is ~100-135 of the ~400 instructions a warp issues a super-block at 16
// columns (session 54), where the 16-token forward's [gate; up] took 44.0 us a launch against the
// GEMV's 34.6 on the H100 (bench/results/h100-s54-*); with it the kernel's loop holds 330
// instructions against 474. The same bits: only the staging differs (rows past the matrix land as
// zeros instead of copies of its last row, and their outputs are not written). On by default up to
// 32 columns since session 56 (H100, bench/results/h100-s56-*, two profiles each): the 27B's 16 /
// 32-token forwards 9.14-9.15 / 11.16 ms of kernels against 9.58 / 11.28-11.30, 4 / 8 / 12 / 24
// tokens 0.35-0.50 ms less, 28 0.12 less, 64 even; the DDTree verify of budget 15 9.80 against
// 10.24 ms. DFLASH_MMA_TMA=1 keeps it to 16 columns (9.09 / 11.30 ms), =0 turns it off.
int mma_tma_max_columns = [] {
    const char * e = std::getenv("DFLASH_MMA_TMA");
    const int m = e ? std::atoi(e) : 2;
    return m == 1 ? 16 : m == 2 ? 32 : 0;
}();
bool mma_tma_flag = mma_tma_max_columns > 0;
std::atomic<int64_t> mma_tma_count{0};
// Its stages a warp: 2 (gemm_kq::kDefaultStages, the cp.async form's best), or 3 with
// DFLASH_MMA_TMA_STAGES=3 where they fit the static shared memory (4 warps of one row tile: the
// 27B's [gate; up] runs 5 super-blocks a warp), a copy in flight costing the warp one instruction.
// Slower in session 56 (H100): the 16-token forward 9.37 against 9.14-9.15 ms with 2.
const int mma_tma_stages = [] {
    const char * e = std::getenv("DFLASH_MMA_TMA_STAGES");
    return e && std::atoi(e) == 3 ? 3 : 2;
}();

// Whether a product with a fused residual, rows x k at n columns, takes the wgmma form (wgmma_res_mode).
bool wgmma_res_shape(int k, int n) {
    return n >= kWgmmaResMinColumns && (wgmma_res_mode == 2 || (wgmma_res_mode == 1 && k / 256 >= kWgmmaLongKBlocks));
}

// Whether a product of type t, rows x n, takes the wgmma form (gemm_chunk).
bool takes_wgmma(ggml_type t, bool mins_int, int rows, int k, int n, bool hopper, bool has_res) {
    return kWgmmaBuilt && wgmma_flag && hopper && t == GGML_TYPE_Q4_K && !mins_int &&
           (has_res ? wgmma_res_shape(k, n) || takes_ws_shape(rows, k, n) : wgmma_shape(rows, k, n));
}

// The mma.sync forms' activation layout for type t (its F::kLayout), and whether their scales are
// per 256 values (all but Q8_0's).
gemm_kq::ActLayout mma_layout(ggml_type t) {
    return t == GGML_TYPE_Q6_K || t == GGML_TYPE_Q8_0 ? gemm_kq::ActLayout::kHalves : gemm_kq::ActLayout::kRun;
}
bool mma_scales_per_256(ggml_type t) { return t != GGML_TYPE_Q8_0; }

// The operands of one launch (mma_forms::Operands).
mma_forms::Operands operands(int n, int rows, int k, const ActSource & x, const char * w, int64_t row_bytes,
                             float * out, int sd, const float * r_ptr, int sr, int8_t * qs, float * d, int * sums,
                             int nsm, size_t smem_optin, ggml_cuda_pool & pool, cudaStream_t stream) {
    mma_forms::Operands o;
    o.n = n, o.rows = rows, o.k = k, o.x = &x, o.w = w, o.row_bytes = row_bytes, o.out = out, o.sd = sd;
    o.res = r_ptr, o.sr = sr, o.qs = qs, o.d = d, o.sums = sums, o.nsm = nsm, o.smem_optin = smem_optin;
    o.pool = &pool, o.stream = stream;
    return o;
}

// The mma.sync forms of one launch for nc <= 64 columns: quantize x (when quantize; else qs, d and
// sums already hold x in type t's layout), then the kernel for type t (mma_forms::run_mma, a file a
// type). The form: 8 warps a block for long rows of up to 16 columns (more columns: 4 warps were
// faster; Q8_0's 2 stages of 8 warps would not fit the shared memory); two row tiles a warp (each
// activation load feeds two mmas) for Q4_K / Q5_K at 17..32 columns where the matrix has rows for
// 2 blocks of them per multiprocessor: on the H200 the 27B's [gate; up] 52.1 / 57.8 us at 24 / 32
// columns against 58.1 / 63.5, attn_q 20.3 / 22.5 against 25.1 / 26.6, but slower at 48 and 64
// columns (registers) and for Q6_K (2 warps a block to fit the shared memory) at every count
// (bench/results/h200-s12-mma-standalone-tiles-8222f0f.json); up to 16 columns only where one tile
// a warp would leave the GPU's last wave mostly empty (two_tiles_fill).
void gemm_mma(ggml_type t, bool mins_int, bool quantize, const mma_forms::Operands & o, bool hopper) {
    const int n = o.n, rows = o.rows, k = o.k, nsm = o.nsm;
    mma_forms::MmaForm f;
    f.quantize = quantize;
    f.tma = kTmaBuilt && mma_tma_flag && hopper && n <= mma_tma_max_columns;
    f.tma_stages = mma_tma_stages;
    f.long_rows = k / 256 >= gemm_kq::kLongRowBlocks && n <= 16 && t != GGML_TYPE_Q8_0 && long_rows_8_warps();
    const bool tall_two = n <= 16 && mma_tall_two_tiles_flag && rows >= kTallRows && !two_tiles_fill(rows, n, nsm);
    f.two_tiles = !f.long_rows && mma_row_tiles() == 2 && (t == GGML_TYPE_Q4_K || t == GGML_TYPE_Q5_K) &&
                  (n > 16 ? n <= 32 && rows >= 2 * 32 * nsm : two_tiles_fill(rows, n, nsm) || tall_two);
    f.q6k_long_8 = q6k_long_8_mode;
    f.split = mma_split_pieces_flag;
    f.act_smem = mma_act_smem_flag;
    using mma_forms::run_mma;
    const mma_forms::MmaRan ran = t == GGML_TYPE_Q6_K ? run_mma<gemm_kq::Q6K>(o, f)
                                  : t == GGML_TYPE_Q5_K
                                      ? (mins_int ? run_mma<gemm_kq::Q5K>(o, f) : run_mma<gemm_kq::Q5KMinsMma>(o, f))
                                  : t == GGML_TYPE_Q8_0 ? run_mma<gemm_kq::Q80>(o, f)
                                  : mins_int            ? run_mma<gemm_kq::Q4K>(o, f)
                                                        : run_mma<gemm_kq::Q4KMinsMma>(o, f);
    if (f.two_tiles && tall_two) ++mma_tall_two_tiles_count;
    if (ran.tma) ++mma_tma_count;
    if (ran.split) ++mma_split_count;
}

// One launch of the GEMM for nc <= 64 columns: quantize x, then the kernel for type t. f16_ready /
// int8_ready: qs (d, sums) hold x's activations already in the form the f16 path / the int8 path
// this shape takes would write (a pair's one activation launch, gemm_kq::quantize_act_and_f16); a
// form that cannot run falls to the next, which writes its own.
void gemm_chunk(ggml_type t, bool mins_int, int n, int rows, int k, const ActSource & x, const char * w,
                int64_t row_bytes, float * out, int sd, const float * r_ptr, int sr, int8_t * qs, float * d, int * sums,
                int nsm, bool hopper, size_t smem_optin, ggml_cuda_pool & pool, cudaStream_t stream,
                bool f16_ready = false, bool int8_ready = false) {
    const mma_forms::Operands o =
        operands(n, rows, k, x, w, row_bytes, out, sd, r_ptr, sr, qs, d, sums, nsm, smem_optin, pool, stream);
    // qs holds 2 bytes a value of up to 64 columns then (the caller's)
    if (takes_f16_wgmma(t, n, hopper, rows, k)) {
        const int ran = ggml_ext_cuda_f16_wgmma(t, x, qs, w, rows, k, row_bytes, n, out, sd, r_ptr, sr, nsm,
                                                f16_ws_flag, pool, stream, f16_ready);
        if (ran) {
            ++f16_wgmma_count;
            if (ran == 2) ++f16_ws_count;
            return;
        }
    }
    if (takes_wgmma(t, mins_int, rows, k, n, hopper, r_ptr != nullptr)) {
        if (!int8_ready) gemm_kq::quantize_act_wgmma(x, qs, d, sums, k, n, stream);
        int8_ready = false;  // the mma.sync forms below (when no wgmma form ran) take their own layout
        // three warpgroups a block: the chunk-waiting kernel only (registers); a residual: the early
        // kernel with one warpgroup only (its kRes instance)
        const bool with_res = r_ptr != nullptr;
        const int form = with_res                     ? gemm_kq::kWgEarly
                         : wgmma_warpgroups_flag == 3 ? gemm_kq::kWgChunks
                         : wgmma_pipe_mode != 0       ? gemm_kq::kWgPipe
                         : takes_chunks_form(rows, n) ? gemm_kq::kWgChunks
                         : wgmma_early_flag           ? gemm_kq::kWgEarly
                                                      : gemm_kq::kWgPlain;
        mma_forms::WgmmaForm f;
        f.form = form;
        f.warpgroups = wgmma_warpgroups_flag;
        f.split = wgmma_split_flag || rows < 16384;  // short matrices (wgmma_short_mode): always
        // mode 4: the shapes of ws_shape_from, with or without a residual, in place of the early or
        // chunk-waiting kernel (the pipelined one, when asked, keeps precedence)
        const bool ws_shape = takes_ws_shape(rows, k, n) && (form == gemm_kq::kWgEarly || form == gemm_kq::kWgChunks);
        f.ws = (ws_shape || (takes_ws_form(n) && form == gemm_kq::kWgEarly && !with_res)) && wgmma_warpgroups_flag == 1;
        f.ws_mode = wgmma_ws_mode == 2 ? 2 : 1;
        const mma_forms::WgmmaRan ran = mma_forms::run_q4k_wgmma(o, f);
        if (ran.ran) {
            ++wgmma_count;
            if (ran.split) ++wgmma_split_count;
            if (ran.ws) {
                ++wgmma_ws_count;
                return;
            }
            if (ran.two_wg) ++wgmma_two_wg_count;
            if (with_res) ++wgmma_res_count;
            if (form == gemm_kq::kWgPipe) ++wgmma_pipe_count;
            if (form == gemm_kq::kWgEarly) ++wgmma_early_count;
            if (form == gemm_kq::kWgChunks) ++wgmma_chunks_count;
            return;
        }
    }
    gemm_mma(t, mins_int, !int8_ready, o, hopper);
}

}  // namespace

namespace ggml_ext {
void set_mma_enabled(bool on) { mma_enabled_flag = on; }
bool mma_enabled() { return mma_enabled_flag; }
void set_fuse_pair_act_enabled(bool on) { pair_act_flag = on; }
bool fuse_pair_act_enabled() { return pair_act_flag; }
int64_t mul_mat_pair_act_fusions() { return pair_act_count.load(); }
void set_mma_q80_enabled(bool on) { mma_q80_flag = on; }
bool mma_q80_enabled() { return mma_q80_flag; }
void set_mma_max_columns(int n) {
    mma_max_columns_flag = n <= 16 ? 16 : n <= 32 ? 32 : n <= 64 ? 64 : n <= 128 ? 128 : 256;
}
int mma_max_columns() { return mma_max_columns_flag; }
void set_fuse_add_max_columns(int n) { fuse_add_max_columns_flag = n >= 64 ? 64 : 48; }
int fuse_add_max_columns() { return fuse_add_max_columns_flag; }
void set_wgmma_enabled(bool on) { wgmma_flag = kWgmmaBuilt && on; }
bool wgmma_enabled() { return wgmma_flag; }
bool wgmma_built() { return kWgmmaBuilt; }
int64_t wgmma_launches() { return wgmma_count.load(); }
void set_wgmma_split_enabled(bool on) { wgmma_split_flag = on; }
bool wgmma_split_enabled() { return wgmma_split_flag; }
int64_t wgmma_split_launches() { return wgmma_split_count.load(); }
void set_wgmma_pipe(int mode) { wgmma_pipe_mode = mode == 1 || mode == 2 ? mode : 0; }
int wgmma_pipe() { return wgmma_pipe_mode; }
int64_t wgmma_pipe_launches() { return wgmma_pipe_count.load(); }
void set_wgmma_early_enabled(bool on) { wgmma_early_flag = on; }
bool wgmma_early_enabled() { return wgmma_early_flag; }
int64_t wgmma_early_launches() { return wgmma_early_count.load(); }
void set_wgmma_short_enabled(bool on) { wgmma_short_mode = on ? 1 : 0; }
bool wgmma_short_enabled() { return wgmma_short_mode == 1; }
void set_wgmma_short_mode(int mode) { wgmma_short_mode = valid_short_mode(mode); }
int wgmma_short() { return wgmma_short_mode; }
void set_wgmma_tall_from(int n) { wgmma_tall_from = valid_tall_from(n); }
int wgmma_tall_from_columns() { return wgmma_tall_from; }
void set_mma_tall_two_tiles(bool on) { mma_tall_two_tiles_flag = on; }
bool mma_tall_two_tiles() { return mma_tall_two_tiles_flag; }
int64_t mma_tall_two_tiles_launches() { return mma_tall_two_tiles_count.load(); }
void set_mma_tma(bool on) {
    mma_tma_flag = kTmaBuilt && on;
    if (on && mma_tma_max_columns == 0) mma_tma_max_columns = 16;
}
bool mma_tma() { return mma_tma_flag && kTmaBuilt; }
int64_t mma_tma_launches() { return mma_tma_count.load(); }
void set_wgmma_warpgroups(int n) { wgmma_warpgroups_flag = valid_warpgroups(n); }
int wgmma_warpgroups() { return wgmma_warpgroups_flag; }
int64_t wgmma_two_wg_launches() { return wgmma_two_wg_count.load(); }
void set_wgmma_chunks_enabled(bool on) { wgmma_chunks_mode = on ? 1 : 0; }
bool wgmma_chunks_enabled() { return wgmma_chunks_mode == 1; }
void set_wgmma_chunks_mode(int mode) { wgmma_chunks_mode = valid_chunks_mode(mode); }
int wgmma_chunks() { return wgmma_chunks_mode; }
int64_t wgmma_chunks_launches() { return wgmma_chunks_count.load(); }
void set_wgmma_res_mode(int mode) { wgmma_res_mode = valid_res_mode(mode); }
int wgmma_res() { return wgmma_res_mode; }
int64_t wgmma_res_launches() { return wgmma_res_count.load(); }
void set_wgmma_ws_mode(int mode) { wgmma_ws_mode = valid_ws_mode(mode); }
int wgmma_ws() { return wgmma_ws_mode; }
int64_t wgmma_ws_launches() { return wgmma_ws_count.load(); }
void set_mma_q6k_long_8(int mode) { q6k_long_8_mode = mode == 1 || mode == 2 ? mode : 0; }
int mma_q6k_long_8() { return q6k_long_8_mode; }
void set_mma_split(int pieces) {
    mma_split_pieces_flag = pieces == mma_forms::kMmaSplitAuto || (pieces >= 2 && pieces <= 8) ? pieces : 0;
}
int mma_split() { return mma_split_pieces_flag; }
void set_mma_act_smem(bool on) { mma_act_smem_flag = on; }
bool mma_act_smem() { return mma_act_smem_flag; }
int64_t mma_split_launches() { return mma_split_count.load(); }
void set_q6k_wgmma_from(int n) { q6k_wgmma_from = n >= 2 && n <= 64 ? n : 0; }
int q6k_wgmma_from_columns() { return q6k_wgmma_from; }
void set_q4k_f16_from(int n) { q4k_f16_from = n >= 2 && n <= 64 ? n : 0; }
int q4k_f16_from_columns() { return q4k_f16_from; }
void set_q4k_f16_tall_from(int n) { q4k_f16_tall_from = n >= 2 && n <= 64 ? n : 0; }
int q4k_f16_tall_from_columns() { return q4k_f16_tall_from; }
void set_q6k_output_from(int n) { q6k_output_from = n >= 2 && n <= 64 ? n : 0; }
int q6k_output_from_columns() { return q6k_output_from; }
void set_q6k_other_from(int n) { q6k_other_from = n >= 2 && n <= 64 ? n : 0; }
int q6k_other_from_columns() { return q6k_other_from; }
int64_t f16_wgmma_launches() { return f16_wgmma_count.load(); }
void set_f16_ws_enabled(bool on) { f16_ws_flag = on; }
bool f16_ws_enabled() { return f16_ws_flag; }
int64_t f16_ws_launches() { return f16_ws_count.load(); }
GemmSplit f16_wgmma_last_split() {
    GemmSplit s;
    ggml_ext_cuda_f16_wgmma_last_split(s.full_tiles, s.tail, s.pieces);
    return s;
}
void set_f16_wgmma_all(bool on) { f16_wgmma_all_flag = on; }
bool f16_wgmma_all() { return f16_wgmma_all_flag; }
void set_f16_convert_v8(bool on) { ggml_ext_cuda_f16_convert_v8() = on; }
bool f16_convert_v8() { return ggml_ext_cuda_f16_convert_v8(); }
}  // namespace ggml_ext

bool ggml_ext_cuda_gemm_mma(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ggml_tensor * src1,
                            ggml_tensor * dst, const ggml_tensor * res) {
    if (src1->type != GGML_TYPE_F32 || src1->nb[0] != sizeof(float) || src1->ne[0] != src0->ne[0] || src1->ne[2] != 1 ||
        src1->ne[3] != 1) {
        return false;
    }
    ActSource x;
    x.x = (const float *)src1->data;
    x.sx = (int64_t)(src1->nb[1] / sizeof(float));
    return ggml_ext_cuda_gemm_mma_from(ctx, src0, x, src1->ne[1], dst, res);
}

namespace {

// Whether the GEMM takes src0 x (n columns) into dst: its types, shapes and column range.
bool mma_takes(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, int64_t n, const ggml_tensor * dst) {
    const int64_t k = src0->ne[0];
    const int cc = ggml_cuda_info().devices[ctx.device].cc;
    const ggml_type t = src0->type;
    const bool type_ok = t == GGML_TYPE_Q4_K || t == GGML_TYPE_Q5_K || t == GGML_TYPE_Q6_K ||
                         ((mma_q80_flag || ggml_ext::q80_enabled()) && t == GGML_TYPE_Q8_0);
    return mma_enabled_flag && type_ok && n >= kMmaMinColumns && n <= mma_max_columns_flag && k >= 256 &&
           k % 256 == 0 && GGML_CUDA_CC_IS_NVIDIA(cc) && ggml_cuda_highest_compiled_arch(cc) >= GGML_CUDA_CC_AMPERE &&
           src0->ne[2] == 1 && src0->ne[3] == 1 && src0->nb[1] % (t == GGML_TYPE_Q6_K ? 2 : 16) == 0 &&
           reinterpret_cast<uintptr_t>(src0->data) % 16 == 0 &&
           ggml_backend_buffer_get_usage(src0->buffer) != GGML_BACKEND_BUFFER_USAGE_COMPUTE &&
           dst->type == GGML_TYPE_F32 && dst->nb[0] == sizeof(float) && dst->ne[0] == src0->ne[1] && dst->ne[1] == n &&
           dst->ne[2] == 1 && dst->ne[3] == 1;
}

// DFLASH_MMA_MINS_INT=1: Q4_K / Q5_K keep the integer min sums (exact), for benches.
bool mins_int_flag() {
    static const bool v = [] {
        const char * e = std::getenv("DFLASH_MMA_MINS_INT");
        return e && e[0] == '1';
    }();
    return v;
}

}  // namespace

bool ggml_ext_cuda_gemm_mma_from(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ActSource & x,
                                 int64_t n, ggml_tensor * dst, const ggml_tensor * res) {
    const int64_t k = src0->ne[0];
    if (!mma_takes(ctx, src0, n, dst) || !gemm_kq::act_source_ok(x, (int)k)) return false;
    const ggml_type t = src0->type;
    const int cc = ggml_cuda_info().devices[ctx.device].cc;
    // the residual of a fused add: the output's shape, f32 rows; up to fuse_add_max_columns_flag columns
    if (res && (n > fuse_add_max_columns_flag || res->type != GGML_TYPE_F32 || res->nb[0] != sizeof(float) ||
                res->ne[0] != dst->ne[0] || res->ne[1] != dst->ne[1] || res->ne[2] != 1 || res->ne[3] != 1)) {
        return false;
    }
    cudaStream_t stream = ctx.stream();
    // More than 64 columns: launches of 64 (the last one the rest), one after another on the stream,
    // sharing the activation buffers.
    constexpr int kChunk = 64;
    const int np = gemm_kq::padded_columns((int)std::min<int64_t>(n, kChunk));
    // the Q6_K f16 form's activations: 2 bytes a value, of up to 64 columns
    const int rows0 = (int)src0->ne[1];
    const bool f16 = takes_f16_wgmma(t, (int)std::min<int64_t>(n, kChunk), cc == GGML_CUDA_CC_HOPPER, rows0, (int)k) ||
                     (n > kChunk && takes_f16_wgmma(t, (int)(n % kChunk), cc == GGML_CUDA_CC_HOPPER, rows0, (int)k));
    ggml_cuda_pool_alloc<int8_t> qs(ctx.pool(), f16 ? (size_t)2 * 64 * k : (size_t)np * k);
    ggml_cuda_pool_alloc<float> d(ctx.pool(), (size_t)np * (k / 32));  // per 256 values, or per 32 (Q8_0)
    ggml_cuda_pool_alloc<int> sums(ctx.pool(), (size_t)np * (k / 32));
    const int rows = (int)src0->ne[1], sd = (int)(dst->nb[1] / sizeof(float));
    const char * w = (const char *)src0->data;
    const int sr = res ? (int)(res->nb[1] / sizeof(float)) : 0;
    for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
        const int nc = (int)std::min<int64_t>(kChunk, n - c0);
        float * out = (float *)dst->data + c0 * sd;
        const float * r_ptr = res ? (const float *)res->data + c0 * sr : nullptr;
        gemm_chunk(t, mins_int_flag(), nc, rows, (int)k, x.columns_from(c0), w, (int64_t)src0->nb[1], out, sd, r_ptr,
                   sr, qs.get(), d.get(), sums.get(), ggml_cuda_info().devices[ctx.device].nsm,
                   cc == GGML_CUDA_CC_HOPPER, ggml_cuda_info().devices[ctx.device].smpbo, ctx.pool(), stream);
    }
    CUDA_CHECK(cudaGetLastError());
    return true;
}

bool ggml_ext_cuda_gemm_mma_pair_from(ggml_backend_cuda_context & ctx, const ggml_tensor * w1, ggml_tensor * dst1,
                                      const ggml_tensor * w2, ggml_tensor * dst2, const ActSource & x, int64_t n) {
    const int64_t k = w1->ne[0];
    const ggml_type t1 = w1->type, t2 = w2->type;
    const int cc = ggml_cuda_info().devices[ctx.device].cc;
    const bool hopper = cc == GGML_CUDA_CC_HOPPER;
    const bool mins_int = mins_int_flag();
    if (n > 64 || w2->ne[0] != k || !mma_takes(ctx, w1, n, dst1) || !mma_takes(ctx, w2, n, dst2) ||
        !gemm_kq::act_source_ok(x, (int)k)) {
        return false;
    }
    const int nsm = ggml_cuda_info().devices[ctx.device].nsm;
    const size_t smem_optin = ggml_cuda_info().devices[ctx.device].smpbo;
    cudaStream_t stream = ctx.stream();
    const bool f16_1 = takes_f16_wgmma(t1, (int)n, hopper, (int)w1->ne[1], (int)k);
    const bool f16_2 = takes_f16_wgmma(t2, (int)n, hopper, (int)w2->ne[1], (int)k);
    // one of the pair in the f16 wgmma form, the other in an int8 form with a scale a super-block:
    // both forms' activations in one launch (pair_act_flag)
    if (pair_act_flag && f16_1 != f16_2) {
        const ggml_tensor * wi = f16_1 ? w2 : w1;  // the int8 product
        const bool wg = takes_wgmma(wi->type, mins_int, (int)wi->ne[1], (int)k, (int)n, hopper, false);
        if (wg || (mma_layout(wi->type) == gemm_kq::ActLayout::kRun && mma_scales_per_256(wi->type))) {
            const int np8 = wg ? gemm_kq::wg_padded_columns((int)n) : gemm_kq::padded_columns((int)n);
            const int np16 = gemm_kq::wg_padded_columns((int)n);
            // each product's buffers its own: a form that cannot run falls to one that writes its own
            // activations there (gemm_chunk)
            const size_t nd = (size_t)64 * (k / 32);
            ggml_cuda_pool_alloc<int8_t> act16(ctx.pool(), (size_t)2 * 64 * k), qs(ctx.pool(), (size_t)2 * 64 * k);
            ggml_cuda_pool_alloc<float> d16(ctx.pool(), nd), d(ctx.pool(), nd);
            ggml_cuda_pool_alloc<int> sums16(ctx.pool(), nd), sums(ctx.pool(), nd);
            ggml_ext_cuda_act_pair(wg, x, qs.get(), d.get(), sums.get(), act16.get(), (int)k, (int)n, np8, np16,
                                   stream);
            for (auto [w, dst, is_f16] : {std::tuple{w1, dst1, f16_1}, std::tuple{w2, dst2, f16_2}}) {
                gemm_chunk(w->type, mins_int, (int)n, (int)w->ne[1], (int)k, x, (const char *)w->data,
                           (int64_t)w->nb[1], (float *)dst->data, (int)(dst->nb[1] / sizeof(float)), nullptr, 0,
                           is_f16 ? act16.get() : qs.get(), is_f16 ? d16.get() : d.get(),
                           is_f16 ? sums16.get() : sums.get(), nsm, hopper, smem_optin, ctx.pool(), stream, is_f16,
                           !is_f16);
            }
            ++pair_act_count;
            CUDA_CHECK(cudaGetLastError());
            return true;
        }
    }
    // a Q6_K of the pair in the f16 wgmma form: each product with activations of its own form (two
    // activation kernels from the one source, still no norm kernel)
    if (f16_1 || f16_2) {
        for (auto [w, dst] : {std::pair{w1, dst1}, std::pair{w2, dst2}}) {
            const int np = gemm_kq::padded_columns((int)n);
            ggml_cuda_pool_alloc<int8_t> qs(ctx.pool(), (size_t)2 * 64 * k);
            ggml_cuda_pool_alloc<float> d(ctx.pool(), (size_t)np * (k / 32));
            ggml_cuda_pool_alloc<int> sums(ctx.pool(), (size_t)np * (k / 32));
            gemm_chunk(w->type, mins_int, (int)n, (int)w->ne[1], (int)k, x, (const char *)w->data, (int64_t)w->nb[1],
                       (float *)dst->data, (int)(dst->nb[1] / sizeof(float)), nullptr, 0, qs.get(), d.get(), sums.get(),
                       nsm, hopper, smem_optin, ctx.pool(), stream);
        }
        CUDA_CHECK(cudaGetLastError());
        return true;
    }
    // one launch of each (up to 64 columns), both in the mma.sync forms with scales per 256 values
    if (!mma_scales_per_256(t1) || !mma_scales_per_256(t2) ||
        takes_wgmma(t1, mins_int, (int)w1->ne[1], (int)k, (int)n, hopper, false) ||
        takes_wgmma(t2, mins_int, (int)w2->ne[1], (int)k, (int)n, hopper, false)) {
        return false;
    }
    const int np = gemm_kq::padded_columns((int)n);
    const gemm_kq::ActLayout l1 = mma_layout(t1), l2 = mma_layout(t2);
    // the pool frees in reverse order of allocation: both layouts' bytes in one allocation
    ggml_cuda_pool_alloc<int8_t> qs(ctx.pool(), (size_t)np * k * (l1 == l2 ? 1 : 2));
    ggml_cuda_pool_alloc<float> d(ctx.pool(), (size_t)np * (k / 256));
    ggml_cuda_pool_alloc<int> sums(ctx.pool(), (size_t)np * (k / 32));
    int8_t * q1 = qs.get();
    int8_t * q2 = l1 == l2 ? q1 : q1 + (size_t)np * k;
    using gemm_kq::ActLayout;
    if (l1 == l2) {
        l1 == ActLayout::kRun ? gemm_kq::launch_quantize_act<ActLayout::kRun, gemm_kq::kQk>(x, q1, d.get(), sums.get(),
                                                                                            (int)k, (int)n, np, stream)
                              : gemm_kq::launch_quantize_act<ActLayout::kHalves, gemm_kq::kQk>(
                                    x, q1, d.get(), sums.get(), (int)k, (int)n, np, stream);
    } else {
        int8_t * q_run = l1 == ActLayout::kRun ? q1 : q2;
        int8_t * q_halves = l1 == ActLayout::kRun ? q2 : q1;
        gemm_kq::launch_quantize_act<ActLayout::kRun, gemm_kq::kQk, ActLayout::kHalves>(
            x, q_run, d.get(), sums.get(), (int)k, (int)n, np, stream, q_halves);
    }
    for (auto [w, dst, q] : {std::tuple{w1, dst1, q1}, std::tuple{w2, dst2, q2}}) {
        gemm_mma(w->type, mins_int, false,
                 operands((int)n, (int)w->ne[1], (int)k, x, (const char *)w->data, (int64_t)w->nb[1],
                          (float *)dst->data, (int)(dst->nb[1] / sizeof(float)), nullptr, 0, q, d.get(), sums.get(),
                          nsm, smem_optin, ctx.pool(), stream),
                 hopper);
    }
    CUDA_CHECK(cudaGetLastError());
    return true;
}
