// ggml_ext's Q4_K GEMM through Hopper's warpgroup tensor-core products (wgmma, sm_90a), for 16..64
// activation columns: a block is one warpgroup (4 warps) and owns 64 rows; per super-block it
// stages the rows' weights and every column's int8 activations with cp.async, each warp unpacks
// its 16 rows into two u8 operands per sub-block (the 6-bit scale split as sc = 8 hi + lo: q * lo and
// q * hi, bytes <= 105, one 32-bit multiply for four), and two wgmma m64nNk32 per sub-block take
// those from registers and the activations from shared memory, accumulating the super-block in
// int32 (C_lo + 8 C_hi = the sum of sc * q * y that Q4KT's integer multiply-adds form). One instruction does 64 rows x
// N columns x 32 values, where gemm_kquant_mma_kernel needs N / 8 mma.sync, their activation loads and 4 integer
// multiply-adds each (session 15's SASS: ~20 instructions an mma at 64 columns). The min term and the float step per
// super-block are Q4KT's.
//
// Engaged since session 20 for the shapes where it wins (gemm_kquant_mma.cu's wgmma_shape, on an
// sm_90a build on an sm_90 GPU): the 27B's 64-token forward 10.56 ms of Q4_K GEMM against 11.52
// (bench/results/h200-s20-27b-kernels-chunked-v2-wgmma.json). Measured alone in
// tools/device/gemv_standalone.cu `wgmma` (session 19, bench/results/h200-s19-wgmma-*). Exact on the H200 (the integer
// sums are Q4KT's). With the staging addressed once (h200-s19-wgmma-staging.json) it beats the engine's mma.sync forms
// on the tall matrices: [gate; up] (34816 rows) 74.4 / 88.4 us at 48 / 64 columns against 83.5 / 96.4, [gdn q; k; v; z]
// (16480) 28.2 / 32.8 / 35.5 at 32 / 48 / 64 against 31.1 / 38.5 / 48.0; it is slower at 16..24 columns and on matrices
// of few 64-row blocks (ffn_down, ssm_out: 5120 rows walk all of K in 80 blocks). ncu at 64 columns: 29.1 M
// instructions against 44.8 M, the tensor pipe the busiest (26%), issue slots 31% busy with 2 warps a scheduler (214
// registers): latency with too few warps. Next: fewer registers, TMA bulk staging, the min term as a wgmma, split-K for
// the short matrices.
// Session 28: the last wave's row tiles split along K (WgSplit below; DFLASH_WGMMA_SPLIT, on since session 30), and the
// kernel runs on the CPU emulator (cuda_emu::wgmma_m64k32_u8s8), where CI checks it against a host reference.
// Session 29: gemm_q4k_wgmma_pipe_kernel (DFLASH_WGMMA_PIPE=1, not yet timed) takes the float step off
// the tensor cores' critical path: above, a super-block's 16 wgmmas must all finish (wait_group 0)
// before its float step, and the next super-block's first wgmma waits for that step and a barrier,
// so with 2 warpgroups a multiprocessor the tensor pipe idles between super-blocks (ncu: 26% busy,
// issue slots 44%). Pipelined, each chunk's wgmmas are committed as a group, the warp waits only
// for the group before (wait_group 1), and the super-block before's float step runs a quarter at a
// time between the chunks, on a second set of integer sums. Registers (sm_90a): 254 / 209 / 168 at
// 64 / 48 / 32 columns against 215 / 193 / 163; no spills; the same blocks a multiprocessor (shared
// memory). The emulator runs wgmma asynchronously (at the wait), so CI checks the pipeline's
// waits: reading sums early or reusing an operand too soon changes the bits it checks.
// Session 30: the pipelined kernel issues the next stage's copies after a super-block's first
// wgmma group, not between the barrier and it, each copy at an immediate offset from one address
// pair (cp_async_16_at): sm_90a SASS (tools/device/sass_loops.py) at 64 columns, 1359 instructions
// a warp per two super-blocks against 1486, and 57 from the stage barrier to the first wgmma against
// 206; 246 registers (254). gemm_q4k_wgmma_early_kernel is the unpipelined kernel with that
// staging (DFLASH_WGMMA_EARLY): 678 instructions a super-block against 702, 67 to the first
// wgmma against 200, 197 registers against 215; the same bits. On the H200 (the 27B's 64-token
// forward, 88 launches): 6223 us unpipelined, 6222 pipelined, 6066 early; with the tail split
// 5705 / 5679 / 5520 (bench/results/h200-s30-f1-*, -f2-*). The early form with the split is the
// default since; the pipelined kernel stays off (its float-step overlap bought nothing). The emulator poisons a
// cp.async's destination until its wait, so CI also catches a copy issued into a stage still
// being read.
#pragma once

#include <cstdlib>

#include "gemm_kquant_mma_impl.cuh"
#include "mbarrier.cuh"

namespace gemm_kq {

constexpr int kWgRows = 64;  // rows per warpgroup: its m64

// DFLASH_WGMMA: the kernel's body is compiled (sm_90a, or the CPU emulator, whose wgmma is
// cuda_emu::wgmma_m64k32_u8s8); DFLASH_WGMMA_PTX: through the PTX instructions.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DFLASH_WGMMA 1
#define DFLASH_WGMMA_PTX 1
#elif defined(DFLASH_CUDA_EMU)
#define DFLASH_WGMMA 1
#endif

// Every instance reads its scales as byte-permute words (scale_word, mins_half2). Until session 47
// the 64-column instances took them sub-block by sub-block (ggml's get_scale_min_k4): session 23
// had the words slower there in the early kernel (a 27B 64-token forward's Q4_K GEMMs 7.24 ms
// against 6.45 on the H200, 217 registers against 220, scheduled worse). The warp-specialized
// kernel, which takes [gate; up], gdn_in, attn_q and ffn_down at 64 columns (session 44), runs its
// loop in 487 sm_90a instructions a super-block a warp with the words against 551, and on the H200
// (session 47, the standalone's `ws64` mode, two runs each) [gate; up] took 66.5 against 67.2 us,
// gdn_in 28.7 against 29.1, attn_q 27.4 against 27.8, ffn_down 40.3 against 40.8: the same bits
// (the check lines' out_hash).

// Shared-memory matrix descriptor (no swizzle): address, leading (K) and stride (M/N) byte offsets.
__device__ __forceinline__ uint64_t wg_desc(const void * smem, int lbo, int sbo) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
}

// wg_desc(smem + bytes, ...) from d = wg_desc(smem, ...): its address field (bits 0..13) advanced by
// bytes / 16 (bytes a multiple of 16 within the same shared memory, so the field does not carry).
// One 32-bit add where rebuilding the descriptor took five uniform instructions a wgmma (sm_90a
// SASS: the add, the mask, the shift, the OR and a move).
__device__ __forceinline__ uint64_t wg_desc_plus(const uint64_t d, const int bytes) {
    const uint32_t lo = (uint32_t)d + (uint32_t)(bytes >> 4);
    return (d & 0xFFFFFFFF00000000ull) | lo;
}

// d (+)= a (64 x 32 u8, registers: mma_s8's A layout, warp w rows 16w..) * B (32 x N s8, shared
// memory at desc_b); accumulate = 0 overwrites d. d: mma's C layout per 8-column tile i, d[4i..].
#if defined(DFLASH_CUDA_EMU)
template <int N>
void wgmma_u8s8(int (&d)[N / 2], const int (&a)[4], uint64_t desc_b, int accumulate) {
    cuda_emu::wgmma_m64k32_u8s8(N, d, a, desc_b, accumulate != 0);
}
#else
template <int N>
__device__ __forceinline__ void wgmma_u8s8(int (&d)[N / 2], const int (&a)[4], uint64_t desc_b, int accumulate);
#endif

#if defined(DFLASH_WGMMA_PTX)
template <>
__device__ __forceinline__ void wgmma_u8s8<16>(int (&d)[8], const int (&a)[4], uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %12, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k32.s32.u8.s8 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %13, p;\n}\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(accumulate), "l"(desc_b));
}

template <>
__device__ __forceinline__ void wgmma_u8s8<24>(int (&d)[12], const int (&a)[4], uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %16, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n24k32.s32.u8.s8 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11}, {%12,%13,%14,%15}, "
        "%17, p;\n}\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]),
          "+r"(d[9]), "+r"(d[10]), "+r"(d[11])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(accumulate), "l"(desc_b));
}

template <>
__device__ __forceinline__ void wgmma_u8s8<32>(int (&d)[16], const int (&a)[4], uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %20, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k32.s32.u8.s8 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, "
        "{%16,%17,%18,%19}, %21, p;\n}\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]),
          "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(accumulate), "l"(desc_b));
}

template <>
__device__ __forceinline__ void wgmma_u8s8<48>(int (&d)[24], const int (&a)[4], uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %28, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n48k32.s32.u8.s8 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23}, {%24,%25,%26,%27}, "
        "%29, p;\n}\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]),
          "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]),
          "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(accumulate), "l"(desc_b));
}

template <>
__device__ __forceinline__ void wgmma_u8s8<64>(int (&d)[32], const int (&a)[4], uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %36, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.s32.u8.s8 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%"
        "29,%30,%31}, {%32,%33,%34,%35}, %37, p;\n}\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]),
          "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]),
          "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]),
          "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(accumulate), "l"(desc_b));
}

#endif

__device__ __forceinline__ void wg_fence() {
#if defined(DFLASH_WGMMA_PTX)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_commit() {
#if defined(DFLASH_WGMMA_PTX)
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#elif defined(DFLASH_CUDA_EMU)
    cuda_emu::wgmma_commit();
#endif
}
// Until at most n committed groups of this warp's wgmmas are still running.
template <int n>
__device__ __forceinline__ void wg_wait() {
#if defined(DFLASH_WGMMA_PTX)
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(n) : "memory");
#elif defined(DFLASH_CUDA_EMU)
    cuda_emu::wgmma_wait(n);
#endif
}
__device__ __forceinline__ void wg_wait0() { wg_wait<0>(); }
// The registers stay where the asm left them (no reads of d moved above the wait).
template <int n>
__device__ __forceinline__ void wg_pin(int (&d)[n]) {
#pragma unroll
    for (int i = 0; i < n; ++i) asm volatile("" : "+r"(d[i])::"memory");
}
__device__ __forceinline__ void fence_proxy_async() {
#if defined(DFLASH_WGMMA_PTX)
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#elif defined(DFLASH_CUDA_EMU)
    cuda_emu::fence_proxy_async();  // the emulator checks that wgmma reads only fenced copies
#endif
}

// A stage: one super-block's weights of the block's rows, then its activations: quants, per-32
// sums (N x 8 halves), scales (N floats), each as contiguous in global memory as in the stage.
template <int N, int WG>
struct WgPlan {
    static constexpr int kWBytes = WG * kWgRows * 144;  // Q4_K rows of one super-block
    static constexpr int kBBytes = N * kQk;             // the columns' int8 quants
    static constexpr int kSumBytes = N * 8 * (int)sizeof(__half);
    static constexpr int kDBytes = N * (int)sizeof(float);
    static constexpr int kStageBytes = kWBytes + kBBytes + kSumBytes + kDBytes;
};

// The last wave's row tiles split along K (a tail split): a grid of T row tiles over P block slots
// (blocks a multiprocessor x multiprocessors) runs ceil(T / P) waves, and a last wave of a few
// tiles costs a whole tile's time: the 27B's [gate; up] at 64 columns, 544 tiles over 264 slots,
// kept the multiprocessors 77% busy (ncu, session 26). Here the first full_tiles tiles run whole
// and each of the `tail` tiles after them runs as `pieces` blocks of consecutive super-blocks
// (blocks full_tiles + tail_index * pieces + piece). Each piece writes its sums to partials; the
// last to arrive (a counter a tile) adds them in piece order, so the result does not depend on
// which finished last, and resets the counter for the next launch.
// workers > 0: a stream split instead (wg_stream_plan; the int8 warp-specialized kernel's only).
struct WgSplit {
    int full_tiles = 0, tail = 0, pieces = 1;  // pieces == 1: no split
    int slots = 0;                             // the block slots planned for (0: not known)
    int workers = 0;                           // a stream split's blocks
    bool stream() const { return workers > 0; }
    bool splits() const { return stream() || pieces > 1; }
    int grid() const { return stream() ? workers : full_tiles + tail * pieces; }
    int full_tiles_arg() const { return stream() ? -1 : full_tiles; }  // the kernels': -1 a stream split
};
constexpr int kWgMaxSplitTiles = 1024;  // counters (a tail is under one wave of blocks)
constexpr int kWgMinPieceBlocks = 4;    // super-blocks a piece at least (wg_min_piece_blocks)
// Zero at load; the last piece of a tile puts its counter back to 0. Launches on one device are
// ordered (a stream; under PDL a GEMM touches them only after its griddepcontrol.wait).
static __device__ unsigned int wg_tile_arrivals[kWgMaxSplitTiles];

// The split for `tiles` row tiles of `nblocks` super-blocks over `slots` block slots: none when
// they fill their last wave; else the tiles of the last wave (all of them when there is only one:
// a short matrix, the 27B's 5120 rows are 80 tiles) in pieces that fit the slots and keep
// min_piece super-blocks each.
inline WgSplit wg_split_plan(int tiles, int nblocks, int slots, int min_piece = kWgMinPieceBlocks) {
    WgSplit p;
    p.full_tiles = tiles, p.slots = std::max(slots, 0);
    const int tail = slots > 0 ? tiles % slots : 0;
    if (tail == 0 || tail > kWgMaxSplitTiles) return p;
    const int pieces = std::min(slots / tail, nblocks / std::max(min_piece, 1));
    if (pieces < 2) return p;
    p.full_tiles = tiles - tail, p.tail = tail, p.pieces = pieces;
    return p;
}

// A stream split (stream-K's): the launch's tiles x nblocks super-blocks in one sequence cut into
// `workers` equal runs, block w taking super-blocks [w U / W, (w + 1) U / W) of it in tile order:
// the tiles inside its run whole, the ones at its ends as pieces that meet as a tail split's do
// (wg_gather_pieces, in piece order: the same bits every launch of the same grid). Every block then
// does within one super-block of the same work, where a tail split leaves a wave of whole tiles
// and a last wave in pieces (the 27B's attn_q at 64 columns: 192 tiles of 20 super-blocks over 264
// slots, so 20 super-blocks a block against 14.5; ffn_down's 80 tiles of 68 in 3 pieces, 23
// against 20.6). Workers: the slots, fewer when a run would keep under min_piece super-blocks;
// none when there are under 2, or more tiles than counters.
inline WgSplit wg_stream_plan(int tiles, int nblocks, int slots, int min_piece = kWgMinPieceBlocks) {
    WgSplit p;
    p.full_tiles = tiles, p.slots = std::max(slots, 0);
    const int64_t units = (int64_t)tiles * nblocks;
    const int workers = (int)std::min<int64_t>(slots, units / std::max(min_piece, 1));
    if (workers < 2 || tiles > kWgMaxSplitTiles) return p;
    p.workers = workers;
    return p;
}

// The most super-blocks a block slot runs under split sp of `tiles` tiles of nblocks (the hardware
// hands whole tiles out a wave at a time).
inline int wg_slot_units(const WgSplit & sp, int tiles, int nblocks) {
    const int slots = std::max(sp.slots, 1);
    if (sp.stream()) return (int)(((int64_t)tiles * nblocks + sp.workers - 1) / sp.workers);
    const int whole = (sp.full_tiles + slots - 1) / slots * nblocks;
    return whole + (sp.pieces > 1 ? (nblocks + sp.pieces - 1) / sp.pieces : 0);
}

// The engine's least super-blocks a piece: kWgMinPieceBlocks, or DFLASH_WG_MIN_PIECE (1..8; an A/B
// switch). Smaller pieces split a last wave of few tiles finer: the 27B's [gate; up] at 64 columns
// (16 tail tiles of 20 super-blocks over 264 slots) runs 5 pieces of 4 a tile, 2 would give 10 of 2.
// 4 since the split came in; 1 lost on the H100 (session 50: the 27B's 32 / 64-token forwards
// 11.62 / 14.51 against 11.45 / 14.44 ms of kernels, bench/results/h100-s50-*).
inline int wg_min_piece_blocks() {
    static const int v = [] {
        const char * e = std::getenv("DFLASH_WG_MIN_PIECE");
        const int n = e ? std::atoi(e) : kWgMinPieceBlocks;
        return n >= 1 && n <= 8 ? n : kWgMinPieceBlocks;
    }();
    return v;
}

// A block's row tile and super-blocks [kb_begin, kb_end) under a split (WgSplit): all of them, or
// its piece of a split tile: piece `piece` of `pieces`, counted on wg_tile_arrivals[counter], piece
// p's sums at partials slot part0 for p = 0, part_base + part_step p after (wg_split_gather).
struct WgBlockWork {
    bool split;
    int tile, piece, kb_begin, kb_end;
    int pieces = 1, counter = 0, part0 = 0, part_base = 0, part_step = 1;
};

// Work item `item` of a tail split (items 0 .. full_tiles - 1 the whole tiles, then the pieces; a
// tail tile's pieces at partials slots (tail index) x pieces + piece).
__device__ __forceinline__ WgBlockWork wg_item_work(const int item, const int full_tiles, const int pieces,
                                                    const int nblocks) {
    WgBlockWork b{item >= full_tiles, item, 0, 0, nblocks};
    if (b.split) {
        const int p = item - full_tiles;
        b.tile = full_tiles + p / pieces, b.piece = p % pieces;
        b.kb_begin = b.piece * nblocks / pieces, b.kb_end = (b.piece + 1) * nblocks / pieces;
        b.pieces = pieces, b.counter = b.tile - full_tiles;
        b.part0 = b.part_base = b.counter * pieces;
    }
    return b;
}

// A stream split's run boundaries (wg_stream_plan): the first super-block of worker w's run of
// `units` over `workers`, and the worker whose run holds super-block u.
__device__ __forceinline__ int64_t wg_stream_begin(const int w, const int64_t units, const int workers) {
    return (int64_t)w * units / workers;
}
__device__ __forceinline__ int wg_stream_worker(const int64_t u, const int64_t units, const int workers) {
    return (int)(((u + 1) * workers - 1) / units);
}

// Worker w's part of tile t under a stream split: its super-blocks of the tile, and the tile's
// pieces (one a worker whose run meets it). A worker's sums of its first tile go to partials slot
// 2 w, of its last to 2 w + 1 (the tiles between are whole), so piece 0 is at 2 wf (+1 when the
// tile is not the first worker's first) and piece p > 0 at 2 (wf + p): each later worker's run
// starts inside the tile.
__device__ __forceinline__ WgBlockWork wg_stream_work(const int w, const int t, const int nblocks, const int64_t units,
                                                      const int workers) {
    const int64_t ts = (int64_t)t * nblocks, te = ts + nblocks;
    const int64_t lo = wg_stream_begin(w, units, workers), hi = wg_stream_begin(w + 1, units, workers);
    const int wf = wg_stream_worker(ts, units, workers), wl = wg_stream_worker(te - 1, units, workers);
    WgBlockWork b{wl > wf, t, w - wf, (int)((lo > ts ? lo : ts) - ts), (int)((hi < te ? hi : te) - ts)};
    b.pieces = wl - wf + 1, b.counter = t;
    b.part0 = 2 * wf + (wg_stream_begin(wf, units, workers) / nblocks == t ? 0 : 1);
    b.part_base = 2 * wf, b.part_step = 2;
    return b;
}

__device__ __forceinline__ WgBlockWork wg_block_work(const int full_tiles, const int pieces, const int nblocks) {
    return wg_item_work((int)blockIdx.x, full_tiles, pieces, nblocks);
}

// The end of one of `pieces` pieces of a tile (piece `mine`; every thread of the block calls it):
// this thread's NT x 4 sums (at(nt, i)) out to its place, float4 nt at sums_of(mine) + nt x
// kSumStride; the tile's last piece to arrive on *counter adds every piece's in piece order into
// them and returns true (it writes the tile), the others false. kThreads: the block's threads, or
// with kNamedBar (1..15) the threads that meet at that named barrier instead (a warp-specialized
// block's consumers; its producer warp has left). The pieces meet as cooperative groups' grid sync
// does: a barrier orders every thread's stores before thread 0's fence and count, and the last
// piece's fence after its count orders its reads after the other pieces' stores; the same sums in
// the same order whichever piece is last. Session 48 (H100, ws64_ab.sh): against a fence by every
// thread after its stores, and each thread's float4s together (16 of a sector's 32 bytes read),
// ffn_down at 64 columns 34.8 against 41.9 us and [gate; up] 64.0 against 70.9, the same bits; the
// 64-token forward 14.28 against 15.20 ms of kernels (bench/results/h100-s48-*).
template <int NT, int kThreads, int kNamedBar, int kSumStride, typename At, typename SumsOf>
__device__ __forceinline__ bool wg_gather_pieces(At && at, SumsOf && sums_of, const int mine, unsigned int * counter,
                                                 const int pieces, const int tid) {
    float4 * own = sums_of(mine);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) own[nt * kSumStride] = make_float4(at(nt, 0), at(nt, 1), at(nt, 2), at(nt, 3));
    // thread 0, between the barriers: whether this piece is the last
    auto count = [&]() -> int {
        __threadfence();  // the block's sums (ordered before by the barrier) out first
        const bool is_last = atomicAdd(counter, 1u) == (unsigned)(pieces - 1);
        if (is_last) __threadfence();  // the other pieces' sums in before the barrier after
        return is_last;
    };
    bool last = false;
    if constexpr (kNamedBar == 0) {
        __syncthreads();  // every thread's sums written before the count
        int is_last = 0;
        if (tid == 0) is_last = count();
        last = __syncthreads_or(is_last);
    } else {
        __shared__ int last_piece;
        named_bar_sync(kNamedBar, kThreads);  // every thread's sums written before the count
        if (tid == 0) last_piece = count();
        named_bar_sync(kNamedBar, kThreads);
        last = last_piece != 0;
    }
    if (!last) return false;
    for (int p = 0; p < pieces; ++p) {
        const float4 * sums = sums_of(p);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const float4 v = __ldcg(sums + nt * kSumStride);
            if (p == 0) {
                at(nt, 0) = v.x, at(nt, 1) = v.y, at(nt, 2) = v.z, at(nt, 3) = v.w;
            } else {
                at(nt, 0) += v.x, at(nt, 1) += v.y, at(nt, 2) += v.z, at(nt, 3) += v.w;
            }
        }
    }
    if (tid == 0) *counter = 0u;
    return true;
}

// The end of a split tile's piece (wg_gather_pieces): piece p's sums at partials slot
// b.part0 / b.part_base + b.part_step p (WgBlockWork), float4 nt of a piece's threads side by side
// (coalesced), counted on b.counter.
template <int NT, int kThreads, int kNamedBar = 0, typename At>
__device__ __forceinline__ bool wg_split_gather(At && at, float * partials, const WgBlockWork & b, const int tid) {
    auto piece_sums = [&](int p) {
        const int part = p == 0 ? b.part0 : b.part_base + b.part_step * p;
        return reinterpret_cast<float4 *>(partials) + (int64_t)part * kThreads * NT + tid;
    };
    return wg_gather_pieces<NT, kThreads, kNamedBar, kThreads>(at, piece_sums, b.piece, &wg_tile_arrivals[b.counter],
                                                               b.pieces, tid);
}

// Sub-blocks 2c and 2c + 1 of this lane's rows (g at s0, g + 8 at s1; their scale words h0, h1) as
// the u8 operands of their wgmmas: al = q * lo, ah = q * hi for the scale split sc = 8 hi + lo
// (scale_word's bytes).
template <int N>
__device__ __forceinline__ void wg_operands(const char * s0, const char * s1, const uint4 & h0, const uint4 & h1,
                                            const int c, const int t, int (&al)[2][4], int (&ah)[2][4]) {
    const uint2 q0 = *reinterpret_cast<const uint2 *>(s0 + 16 + 32 * c + 8 * t);
    const uint2 q1 = *reinterpret_cast<const uint2 *>(s1 + 16 + 32 * c + 8 * t);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int j = 2 * c + h, sh = 4 * h;
        const uint32_t w0 = scale_word(h0.y, h0.w, j >> 2), w1 = scale_word(h1.y, h1.w, j >> 2);
        const uint32_t lo0 = (q0.x >> sh) & 0x0F0F0F0F, hi0 = (q0.y >> sh) & 0x0F0F0F0F;
        const uint32_t lo1 = (q1.x >> sh) & 0x0F0F0F0F, hi1 = (q1.y >> sh) & 0x0F0F0F0F;
        const uint32_t l0 = byte_at(w0 & 0x07070707u, j & 3), u0 = byte_at((w0 >> 3) & 0x07070707u, j & 3);
        const uint32_t l1 = byte_at(w1 & 0x07070707u, j & 3), u1 = byte_at((w1 >> 3) & 0x07070707u, j & 3);
        al[h][0] = (int)(lo0 * l0), al[h][1] = (int)(lo1 * l1), al[h][2] = (int)(hi0 * l0);
        al[h][3] = (int)(hi1 * l1);
        ah[h][0] = (int)(lo0 * u0), ah[h][1] = (int)(lo1 * u1), ah[h][2] = (int)(hi0 * u0);
        ah[h][3] = (int)(hi1 * u1);
    }
}

// The pipelined kernel's staging copies (wgmma_gemm_body's copy_chunks, stage_w): thread tid's
// copies i = 0, 1, ... of a stage are its chunks c = tid + kThreads i, byte 16 c of their part of
// the stage; dst and src are already at chunk tid, and each copy's offset is an immediate.
// Contiguous chunks (the activations): copy i from src + 16 kThreads i.
template <int kN, int kThreads, int i = 0>
__device__ __forceinline__ void wg_copy_strided(char * dst, const char * src, const int tid) {
    if constexpr (i * kThreads < kN) {
        if (kN % kThreads == 0 || tid + i * kThreads < kN)
            cp_async_16_at<16 * kThreads * i, 16 * kThreads * i>(dst, src);
        wg_copy_strided<kN, kThreads, i + 1>(dst, src, tid);
    }
}

// Weight rows (144 bytes, 9 chunks, so a row's chunks are contiguous in the stage too): copy i
// from wk + off[i], the chunk's offset from the tile's first row in this super-block.
template <int kN, int kThreads, int i = 0, int kCopies>
__device__ __forceinline__ void wg_copy_rows(char * dst, const char * wk, const uint32_t (&off)[kCopies],
                                             const int tid) {
    if constexpr (i < kCopies) {
        if (kN % kThreads == 0 || tid + i * kThreads < kN) cp_async_16_at<16 * kThreads * i, 0>(dst, wk + off[i]);
        wg_copy_rows<kN, kThreads, i + 1>(dst, wk, off, tid);
    }
}

// Chunk c of a super-block: the operands of sub-blocks 2c and 2c + 1 of this lane's rows into al /
// ah, then their 4 wgmmas on the stage's activations at b (the fence orders this warp's operand
// writes before the wgmmas read them; sub-block 0's overwrite clo / chi).
template <int N>
__device__ __forceinline__ void wg_chunk(const char * b, const char * s0, const char * s1, const uint4 & h0,
                                         const uint4 & h1, const int c, const int t, int (&al)[2][4], int (&ah)[2][4],
                                         int (&clo)[N / 2], int (&chi)[N / 2], const int lbo, const int sbo) {
    wg_operands<N>(s0, s1, h0, h1, c, t, al, ah);
    wg_fence();
    const uint64_t d0 = wg_desc(b, lbo, sbo);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int j = 2 * c + h;
        const uint64_t desc = wg_desc_plus(d0, j * N * 32);
        wgmma_u8s8<N>(clo, al[h], desc, j);
        wgmma_u8s8<N>(chi, ah[h], desc, j);
    }
}

// A super-block's float step for this lane's rows: their d and dmin, and the mins as an f16 mma A.
struct WgStep {
    float2 dm0, dm1;
    uint32_t a_min[4];
};

template <int N>
__device__ __forceinline__ WgStep wg_step(const uint4 & h0, const uint4 & h1, const int t) {
    WgStep s;
    s.dm0 = __half22float2(*reinterpret_cast<const half2 *>(&h0.x));
    s.dm1 = __half22float2(*reinterpret_cast<const half2 *>(&h1.x));
    s.a_min[0] = mins_half2(h0.z, h0.w, t), s.a_min[1] = mins_half2(h1.z, h1.w, t);
    s.a_min[2] = s.a_min[3] = 0u;
    return s;
}

// Column tiles [nt0, nt1) of a super-block into acc: its integer sums (clo + 8 chi), less the min
// term (an f16 mma of the mins and the columns' per-32 sums), scaled (Q4KT's float step).
template <int N, int nt0, int nt1>
__device__ __forceinline__ void wg_float_tiles(float (&acc)[N / 8][4], const int (&clo)[N / 2], const int (&chi)[N / 2],
                                               const WgStep & s, const uint32_t * s_sums, const float * s_d,
                                               const int g, const int t) {
    // sub-blocks 2t and 2t + 1 of column 8 nt + g: one word of two halves (act_sum_index), 32 words
    // a column tile from this lane's first (an immediate offset each)
    const uint32_t * lane_sums = s_sums + 4 * g + t;
#pragma unroll
    for (int nt = nt0; nt < nt1; ++nt) {
        const int col0 = nt * 8 + 2 * t;
        const uint32_t b[2] = {lane_sums[32 * nt], 0u};
        float mc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        mma_f16(mc, s.a_min, b);
        const float2 dy = *reinterpret_cast<const float2 *>(s_d + col0);
        const int c0 = clo[4 * nt + 0] + 8 * chi[4 * nt + 0], c1 = clo[4 * nt + 1] + 8 * chi[4 * nt + 1];
        const int c2 = clo[4 * nt + 2] + 8 * chi[4 * nt + 2], c3 = clo[4 * nt + 3] + 8 * chi[4 * nt + 3];
        acc[nt][0] += dy.x * (s.dm0.x * (float)c0 - s.dm0.y * mc[0]);
        acc[nt][1] += dy.y * (s.dm0.x * (float)c1 - s.dm0.y * mc[1]);
        acc[nt][2] += dy.x * (s.dm1.x * (float)c2 - s.dm1.y * mc[2]);
        acc[nt][3] += dy.y * (s.dm1.x * (float)c3 - s.dm1.y * mc[3]);
    }
}

// N: padded columns (16, 24, 32, 48, 64); S: stages; WG: warpgroups a block (each its 64 rows; one
// copy of the activations for all). Block (32, 4 WG).
// full_tiles, pieces, partials: the tail split (WgSplit; pieces 1 and full_tiles = the grid without).
// kPipe (gemm_q4k_wgmma_pipe_kernel): a super-block's float step runs while the next one's wgmmas
// do, a quarter of its column tiles after each of that super-block's 4 wgmma groups (two sets of
// integer sums; the stage of the super-block before stays, so S - 2 are staged ahead, not S - 1).
// The same float operations in the same order: the same bits as without.
// kEarly (the pipelined kernel's, and gemm_q4k_wgmma_early_kernel's for the unpipelined loop): the
// next stage's copies go out after the super-block's first wgmmas, each at an immediate offset.
// kChunkWait (gemm_q4k_wgmma_chunks_kernel, with kEarly): each chunk's wgmmas are a commit group
// and the warp waits for the chunk before (wait_group 1) before building the next chunk's operands,
// so two chunks' operands are live instead of four (32 registers fewer at 64 columns: room for a
// third block a multiprocessor, with 2 stages for shared memory). The same operations: the same
// bits.
// kRes (the early kernel's only): res (stride_col_res floats a column; it may be dst itself) is added
// to each output as the tile is written, one float addition, as the mma.sync GEMM's kRes does. With
// res == dst each element is read and then written by the same thread, after its last read of
// anything else, so dst's __restrict__ holds for every access that could be reordered.
template <int N, int S, int WG, bool kPipe, bool kEarly = kPipe, bool kChunkWait = false, bool kRes = false>
__device__ __forceinline__ void wgmma_gemm_body(const char * __restrict__ w, const int8_t * qs, const float * yd,
                                                const int * ysum, float * __restrict__ dst, const int nrows,
                                                const int nblocks, const int64_t row_bytes, const int ncols,
                                                const int stride_col_dst, const int lbo, const int sbo,
                                                const int full_tiles, const int pieces, float * partials,
                                                const float * res, const int stride_col_res) {
    using P = WgPlan<N, WG>;
    constexpr int kThreads = 128 * WG, kBlockRows = WG * kWgRows;
    constexpr int NT = N / 8;
    constexpr int kAhead = kPipe ? S - 2 : S - 1;  // super-blocks staged ahead of the one computed
    static_assert(kAhead >= 1, "too few stages");
    DFLASH_DYNAMIC_SMEM_BYTES(wg_smem);
    const int lane = threadIdx.x, warp = threadIdx.y, tid = warp * WARP_SIZE + lane;
    const int g = lane >> 2, t = lane & 3;
    // this block's row tile and super-blocks [kb_begin, kb_end): all of them, or a piece of a tail tile
    const WgBlockWork work = wg_block_work(full_tiles, pieces, nblocks);
    const int kb_begin = work.kb_begin, nkb = work.kb_end - work.kb_begin;
    const int row_base = work.tile * kBlockRows;
    const int wq = warp & 3, wrow = 64 * (warp >> 2) + 16 * wq;  // the warp's rank in its warpgroup, first row
    // This thread's 16-byte chunks of the block's 144-byte weight rows, addressed once (super-block
    // 0; a super-block adds 144): the staging is a few adds and cp.asyncs a super-block.
    constexpr int kWTotal = kBlockRows * 9, kWChunks = (kWTotal + kThreads - 1) / kThreads;
    // (The pipelined kernel keeps 32-bit offsets from the tile's first row, for registers: the tile's
    // rows span kBlockRows * row_bytes bytes, under 4 GB for any K below 2^25.)
    using WSrc = std::conditional_t<kEarly, uint32_t, const char *>;
    const char * wtile = w + (int64_t)row_base * row_bytes;
    WSrc wsrc[kWChunks];
    int wdst[kWChunks];
#pragma unroll
    for (int i = 0; i < kWChunks; ++i) {
        const int c = min(tid + i * kThreads, kWTotal - 1), r = c / 9, ch = c - 9 * r;
        if constexpr (kEarly) {
            wsrc[i] = (uint32_t)((int64_t)(min(row_base + r, nrows - 1) - row_base) * row_bytes + 16 * ch);
        } else {
            wsrc[i] = w + (int64_t)min(row_base + r, nrows - 1) * row_bytes + 16 * ch;
        }
        wdst[i] = r * 144 + 16 * ch;
    }
    auto w_chunk = [&](int i) -> const char * {
        if constexpr (kEarly) {
            return wtile + wsrc[i];
        } else {
            return wsrc[i];
        }
    };
    // n 16-byte chunks from src to dst, spread over the block's threads (trip counts known here).
    // The early form moves both pointers to this thread's first chunk once, so its copies take
    // immediate offsets; the form below built a 64-bit address a copy (sm_90a SASS: ~115 of the
    // ~740 instructions a warp spends on a super-block at 64 columns went to staging).
    auto copy_chunks = [&](char * dst, const char * src, auto n_tag) {
        constexpr int n = decltype(n_tag)::value;
        if constexpr (kEarly) {
            wg_copy_strided<n, kThreads>(dst + 16 * tid, src + 16 * tid, tid);
        } else {
#pragma unroll
            for (int i = 0; i < (n + kThreads - 1) / kThreads; ++i) {
                const int c = tid + i * kThreads;
                if (n % kThreads == 0 || c < n) cp_async_16(dst + 16 * c, src + 16 * c);
            }
        }
    };
    auto stage_w = [&](int s, int kb) {
        char * st = wg_smem + s * P::kStageBytes;
        const char * wk = nullptr;  // the early form's super-block base, once for its copies
        if constexpr (kEarly) wk = wtile + (int64_t)kb * 144;
        if constexpr (kEarly) {
            wg_copy_rows<kWTotal, kThreads>(st + 16 * tid, wk, wsrc, tid);
        } else {
#pragma unroll
            for (int i = 0; i < kWChunks; ++i) {
                if (kWTotal % kThreads == 0 || tid + i * kThreads < kWTotal)
                    cp_async_16(st + wdst[i], w_chunk(i) + kb * 144);
            }
        }
    };
    auto stage_act = [&](int s, int kb) {
        char * st = wg_smem + s * P::kStageBytes;
        copy_chunks(st + P::kWBytes, reinterpret_cast<const char *>(qs) + (int64_t)kb * P::kBBytes,
                    std::integral_constant<int, P::kBBytes / 16>{});
        copy_chunks(st + P::kWBytes + P::kBBytes, reinterpret_cast<const char *>(ysum) + (int64_t)kb * P::kSumBytes,
                    std::integral_constant<int, P::kSumBytes / 16>{});
        copy_chunks(st + P::kWBytes + P::kBBytes + P::kSumBytes,
                    reinterpret_cast<const char *>(yd) + (int64_t)kb * P::kDBytes,
                    std::integral_constant<int, P::kDBytes / 16>{});
    };
    auto stage_in = [&](int s, int kb) {
        stage_w(s, kb);
        stage_act(s, kb);
    };
    auto stage_at = [&](int s) -> const char * { return wg_smem + s * P::kStageBytes; };
    auto sums_of = [&](const char * st) { return reinterpret_cast<const uint32_t *>(st + P::kWBytes + P::kBBytes); };
    auto d_of = [&](const char * st) {
        return reinterpret_cast<const float *>(st + P::kWBytes + P::kBBytes + P::kSumBytes);
    };
    // the first stages' weights, then (pdl.cuh) the wait for the kernel that wrote the activations
#pragma unroll
    for (int s = 0; s < kAhead; ++s) {
        if (s < nkb) stage_w(s, kb_begin + s);
    }
    pdl_wait();
    pdl_trigger();
#pragma unroll
    for (int s = 0; s < kAhead; ++s) {  // group 0 holds every prologue weight copy: waited for first
        if (s < nkb) stage_act(s, kb_begin + s);
        cp_async_commit();
    }
    // super-block i's stage landed (every thread's copies, visible to the wgmma's async reads); the
    // stage kAhead on is free (its wgmmas waited for, its float step done): stage it
    auto stage_ready = [&]() {
        cp_async_wait<kAhead - 1>();
        fence_proxy_async();
        __syncthreads();
    };
    auto stage_ahead = [&](int i) {
        if (i + kAhead < nkb) stage_in((i + kAhead) % S, kb_begin + i + kAhead);
        cp_async_commit();
    };
    auto next_stage = [&](int i) {
        stage_ready();
        stage_ahead(i);
    };
    auto lane_row = [&](const char * st) { return st + (wrow + g) * 144; };  // this lane's first row in a stage
    float acc[NT][4] = {};
    if constexpr (!kPipe) {
        for (int i = 0; i < nkb; ++i) {
            if constexpr (kEarly) {
                stage_ready();
            } else {
                next_stage(i);
            }
            const char * st = stage_at(i % S);
            const char *s0 = lane_row(st), *s1 = s0 + 8 * 144;
            const uint4 h0 = *reinterpret_cast<const uint4 *>(s0), h1 = *reinterpret_cast<const uint4 *>(s1);
            constexpr int kSets = kChunkWait ? 2 : 4;  // operand sets: a chunk's each, or two in turn
            int al[kSets][2][4], ah[kSets][2][4];
            int clo[N / 2], chi[N / 2];
            // two sub-blocks' operands, then their 4 wgmmas (the tensor cores start while the next two
            // are unpacked; the fence orders this warp's operand writes before the wgmmas read them)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int set = c % kSets;
                wg_chunk<N>(st + P::kWBytes, s0, s1, h0, h1, c, t, al[set], ah[set], clo, chi, lbo, sbo);
                if constexpr (kChunkWait) wg_commit();
                if constexpr (kEarly) {
                    if (c == 0) stage_ahead(i);
                }
                if constexpr (kChunkWait) {
                    if (c < 3) wg_wait<1>();  // chunk c - 1 done: its operand set is free for chunk c + 1
                }
            }
            if constexpr (!kChunkWait) wg_commit();
            const WgStep step = wg_step<N>(h0, h1, t);
            wg_wait0();
            wg_pin(clo);
            wg_pin(chi);
            wg_float_tiles<N, 0, NT>(acc, clo, chi, step, sums_of(st), d_of(st), g, t);
        }
    } else {
        // sums of even super-blocks in x, of odd ones in y (registers: the loop runs in pairs)
        int xlo[N / 2], xhi[N / 2], ylo[N / 2], yhi[N / 2];
        // chunk c's operands in [c & 1], read by its wgmmas until its group is done: the last chunk's
        // into the next super-block's first wait
        int al[2][2][4], ah[2][2][4];
        // The copies of super-block i + kAhead go out after chunk 0's wgmmas (their stage is free
        // from the barrier on), so the tensor cores start a super-block ~115 instructions sooner.
        auto iteration = [&](int i, int (&clo)[N / 2], int (&chi)[N / 2], int (&plo)[N / 2], int (&phi)[N / 2]) {
            stage_ready();
            const char * st = stage_at(i % S);
            const char *s0 = lane_row(st), *s1 = s0 + 8 * 144;
            const uint4 h0 = *reinterpret_cast<const uint4 *>(s0), h1 = *reinterpret_cast<const uint4 *>(s1);
            const char * pst = stage_at((i + S - 1) % S);  // super-block i - 1's, kept for its float step
            WgStep prev{};
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                wg_operands<N>(s0, s1, h0, h1, c, t, al[c & 1], ah[c & 1]);
                wg_fence();
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int j = 2 * c + h;
                    const uint64_t desc = wg_desc_plus(wg_desc(st + P::kWBytes, lbo, sbo), j * N * 32);
                    wgmma_u8s8<N>(clo, al[c & 1][h], desc, j);
                    wgmma_u8s8<N>(chi, ah[c & 1][h], desc, j);
                }
                wg_commit();
                if (c == 0) stage_ahead(i);
                wg_wait<1>();  // chunk c - 1 done; at c == 0 the whole of super-block i - 1
                if (i > 0) {
                    if (c == 0) {
                        wg_pin(plo);
                        wg_pin(phi);
                        const char * p0 = lane_row(pst);
                        prev = wg_step<N>(*reinterpret_cast<const uint4 *>(p0),
                                          *reinterpret_cast<const uint4 *>(p0 + 8 * 144), t);
                    }
                    const uint32_t * ps = sums_of(pst);
                    const float * pd = d_of(pst);
                    if (c == 0) wg_float_tiles<N, 0, NT / 4>(acc, plo, phi, prev, ps, pd, g, t);
                    if (c == 1) wg_float_tiles<N, NT / 4, NT / 2>(acc, plo, phi, prev, ps, pd, g, t);
                    if (c == 2) wg_float_tiles<N, NT / 2, 3 * NT / 4>(acc, plo, phi, prev, ps, pd, g, t);
                    if (c == 3) wg_float_tiles<N, 3 * NT / 4, NT>(acc, plo, phi, prev, ps, pd, g, t);
                }
            }
        };
        // the last super-block's float step, after its wgmmas
        auto last = [&](int i, int (&clo)[N / 2], int (&chi)[N / 2]) {
            wg_wait0();
            wg_pin(clo);
            wg_pin(chi);
            const char * st = stage_at(i % S);
            const char * s0 = lane_row(st);
            const WgStep step =
                wg_step<N>(*reinterpret_cast<const uint4 *>(s0), *reinterpret_cast<const uint4 *>(s0 + 8 * 144), t);
            wg_float_tiles<N, 0, NT>(acc, clo, chi, step, sums_of(st), d_of(st), g, t);
        };
        // nkb >= 1 (the caller's k is 256 or more; a split piece has kWgMinPieceBlocks). A guard
        // for nkb == 0 here made ptxas serialize the wgmmas (C7514), so there is none.
        int i = 0;
        for (; i + 1 < nkb; i += 2) {
            iteration(i, xlo, xhi, ylo, yhi);
            iteration(i + 1, ylo, yhi, xlo, xhi);
        }
        if (i < nkb) {
            iteration(i, xlo, xhi, ylo, yhi);
            last(i, xlo, xhi);
        } else {
            last(nkb - 1, ylo, yhi);
        }
    }
    cp_async_wait<0>();
    // a piece of a split tile: its sums out; the tile's last piece adds every piece's and writes
    auto at = [&](int nt, int i) -> float & { return acc[nt][i]; };
    if (work.split && !wg_split_gather<NT, kThreads>(at, partials, work, tid)) return;
    write_outputs<4 * NT, kRes>(
        [&](int e) { return make_int2(row_base + wrow + g + ((e & 3) < 2 ? 0 : 8), (e >> 2) * 8 + 2 * t + (e & 1)); },
        [&](int e) { return acc[e >> 2][e & 3]; }, dst, stride_col_dst, res, stride_col_res, nrows, ncols);
}

// MB: blocks a multiprocessor should hold (registers).
template <int N, int S, int WG, int MB>
__global__ void __launch_bounds__(128 * WG, MB)
    gemm_q4k_wgmma_kernel(const char * __restrict__ w, const int8_t * qs, const float * yd, const int * ysum,
                          float * __restrict__ dst, const int nrows, const int nblocks, const int64_t row_bytes,
                          const int ncols, const int stride_col_dst, const int lbo, const int sbo, const int full_tiles,
                          const int pieces, float * partials, const float *, const int) {
#if defined(DFLASH_WGMMA)
    wgmma_gemm_body<N, S, WG, false>(w, qs, yd, ysum, dst, nrows, nblocks, row_bytes, ncols, stride_col_dst, lbo, sbo,
                                     full_tiles, pieces, partials, nullptr, 0);
#else
    NO_DEVICE_CODE;
#endif
}

// The committed kernel with the pipelined one's staging (kEarly): the engine's default since session 30.
// kRes: with a fused residual add (wgmma_gemm_body's).
template <int N, int S, int WG, int MB, bool kRes = false>
__global__ void __launch_bounds__(128 * WG, MB)
    gemm_q4k_wgmma_early_kernel(const char * __restrict__ w, const int8_t * qs, const float * yd, const int * ysum,
                                float * __restrict__ dst, const int nrows, const int nblocks, const int64_t row_bytes,
                                const int ncols, const int stride_col_dst, const int lbo, const int sbo,
                                const int full_tiles, const int pieces, float * partials, const float * res,
                                const int stride_col_res) {
#if defined(DFLASH_WGMMA)
    wgmma_gemm_body<N, S, WG, false, true, false, kRes>(w, qs, yd, ysum, dst, nrows, nblocks, row_bytes, ncols,
                                                        stride_col_dst, lbo, sbo, full_tiles, pieces, partials, res,
                                                        stride_col_res);
#else
    NO_DEVICE_CODE;
#endif
}

// The early kernel waiting a chunk at a time (kChunkWait): fewer live operand registers.
template <int N, int S, int WG, int MB>
__global__ void __launch_bounds__(128 * WG, MB)
    gemm_q4k_wgmma_chunks_kernel(const char * __restrict__ w, const int8_t * qs, const float * yd, const int * ysum,
                                 float * __restrict__ dst, const int nrows, const int nblocks, const int64_t row_bytes,
                                 const int ncols, const int stride_col_dst, const int lbo, const int sbo,
                                 const int full_tiles, const int pieces, float * partials, const float *, const int) {
#if defined(DFLASH_WGMMA)
    wgmma_gemm_body<N, S, WG, false, true, true>(w, qs, yd, ysum, dst, nrows, nblocks, row_bytes, ncols, stride_col_dst,
                                                 lbo, sbo, full_tiles, pieces, partials, nullptr, 0);
#else
    NO_DEVICE_CODE;
#endif
}

template <int N, int S, int WG, int MB>
__global__ void __launch_bounds__(128 * WG, MB)
    gemm_q4k_wgmma_pipe_kernel(const char * __restrict__ w, const int8_t * qs, const float * yd, const int * ysum,
                               float * __restrict__ dst, const int nrows, const int nblocks, const int64_t row_bytes,
                               const int ncols, const int stride_col_dst, const int lbo, const int sbo,
                               const int full_tiles, const int pieces, float * partials, const float *, const int) {
#if defined(DFLASH_WGMMA)
    wgmma_gemm_body<N, S, WG, true>(w, qs, yd, ysum, dst, nrows, nblocks, row_bytes, ncols, stride_col_dst, lbo, sbo,
                                    full_tiles, pieces, partials, nullptr, 0);
#else
    NO_DEVICE_CODE;
#endif
}

// Padded columns of the wgmma form: 16, 24, 32, 48 or 64.
inline int wg_padded_columns(int ncols) { return ncols <= 16 ? 16 : padded_columns(ncols); }

// quantize_act_k_kernel's quants, scales and sums per 32 (Q4_K's), the quants in the wgmma layout
// (ActLayout::kWgmma) of wg_padded_columns(ncols) columns.
inline void quantize_act_wgmma(const ActSource & x, int8_t * qs, float * d, int * sums, int k, int ncols,
                               cudaStream_t stream) {
    const int np = wg_padded_columns(ncols);
    launch_quantize_act<ActLayout::kWgmma, kQk>(x, qs, d, sums, k, ncols, np, stream);
}

// The kernel forms (kForm): the committed one, the pipelined one, the committed one with the
// pipelined one's staging (kEarly; the engine's default since session 30), and that waiting a chunk
// at a time (kChunkWait; with 2 stages and 3 blocks a multiprocessor in the engine, not yet timed).
enum : int { kWgPlain = 0, kWgPipe = 1, kWgEarly = 2, kWgChunks = 3 };

// The kernel's instance for N padded columns (16, 24, 32, 48 or 64) and form (kRes: with the fused
// residual, the early form only), and its dynamic shared memory, opted in once; null when the
// opt-in failed.
using WgKernel = void (*)(const char *, const int8_t *, const float *, const int *, float *, int, int, int64_t, int,
                          int, int, int, int, int, float *, const float *, int);

template <int S, int WG, int MB, int N, int kForm = kWgPlain, bool kRes = false>
WgKernel wgmma_kernel_ready() {
    static_assert(!kRes || kForm == kWgEarly, "the fused residual is the early form's");
    constexpr int kBytes = S * WgPlan<N, WG>::kStageBytes;
    WgKernel kernel = nullptr;
    if constexpr (kRes) {
        kernel = gemm_q4k_wgmma_early_kernel<N, S, WG, MB, true>;
    } else if constexpr (kForm == kWgPipe) {
        kernel = gemm_q4k_wgmma_pipe_kernel<N, S, WG, MB>;
    } else if constexpr (kForm == kWgChunks) {
        kernel = gemm_q4k_wgmma_chunks_kernel<N, S, WG, MB>;
    } else if constexpr (kForm == kWgEarly) {
        kernel = gemm_q4k_wgmma_early_kernel<N, S, WG, MB>;
    } else {
        kernel = gemm_q4k_wgmma_kernel<N, S, WG, MB>;
    }
    static const bool ok =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes) == cudaSuccess;
    return ok ? kernel : nullptr;
}

// Whether kernel may now take `bytes` of dynamic shared memory (its opt-in; callers keep the answer
// in a static, once an instance).
template <typename K>
bool smem_opt_in(K kernel, int bytes) {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) == cudaSuccess;
}

// Blocks of `threads` threads and `smem` bytes of dynamic shared memory a multiprocessor holds of
// kernel (null: its opt-in failed), 0 when the runtime cannot say: a tail split's block slots.
template <typename Kernel>
int wg_blocks_per_sm(Kernel kernel, int threads, int smem) {
    int b = 0;
    if (!kernel || cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, threads, smem) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return b;
}

template <typename Fn>
auto wg_for_columns(int np, Fn && fn) {
    switch (np) {
        case 16:
            return fn(std::integral_constant<int, 16>{});
        case 24:
            return fn(std::integral_constant<int, 24>{});
        case 32:
            return fn(std::integral_constant<int, 32>{});
        case 48:
            return fn(std::integral_constant<int, 48>{});
        default:
            return fn(std::integral_constant<int, 64>{});
    }
}

// The tail split (WgSplit) of a launch of nrows x k at ncols columns on nsm multiprocessors: the
// block slots from the occupancy of its instance (asked once an instance).
template <int S = 4, int WG = 1, int MB = 1, int kForm = kWgPlain, bool kRes = false>
WgSplit wgmma_split_for(int nrows, int k, int ncols, int nsm) {
    return wg_for_columns(wg_padded_columns(ncols), [&](auto n_tag) {
        constexpr int N = decltype(n_tag)::value;
        static const int per_sm =
            wg_blocks_per_sm(wgmma_kernel_ready<S, WG, MB, N, kForm, kRes>(), 128 * WG, S * WgPlan<N, WG>::kStageBytes);
        return wg_split_plan((nrows + WG * kWgRows - 1) / (WG * kWgRows), k / kQk, per_sm * nsm, wg_min_piece_blocks());
    });
}

// Floats of the pieces' sums a split needs (partials).
template <int WG = 1>
inline size_t wgmma_split_floats(const WgSplit & sp, int ncols) {
    const size_t tile = (size_t)WG * kWgRows * wg_padded_columns(ncols);
    if (sp.stream()) return 2 * (size_t)sp.workers * tile;  // two slots a worker (wg_stream_work)
    return sp.pieces > 1 ? (size_t)sp.tail * sp.pieces * tile : 0;
}

// Returns false when the kernel cannot run here (the smem opt-in failed). split / partials: a tail
// split from wgmma_split_for and wgmma_split_floats(split) floats for it; by default none. kForm:
// kWgPipe runs gemm_q4k_wgmma_pipe_kernel (the float step overlapped with the next super-block's
// wgmmas), kWgEarly gemm_q4k_wgmma_early_kernel. res: a residual added as the outputs are written
// (stride_col_res floats a column; it may be dst), the early form of one warpgroup only (false for
// the others).
template <int S = 4, int WG = 1, int MB = 1, int kForm = kWgPlain>
bool launch_q4k_wgmma(const char * w, const int8_t * qs, const float * yd, const int * ysum, float * dst, int nrows,
                      int k, int64_t row_bytes, int ncols, int stride_col_dst, cudaStream_t stream, int lbo = 128,
                      int sbo = 256, WgSplit split = {}, float * partials = nullptr, const float * res = nullptr,
                      int stride_col_res = 0) {
    const int tiles = (nrows + WG * kWgRows - 1) / (WG * kWgRows);
    if (split.pieces < 2 || !partials) split = WgSplit{tiles, 0, 1};
    const dim3 grid((unsigned)split.grid(), 1, 1), block(WARP_SIZE, 4 * WG, 1);
    return wg_for_columns(wg_padded_columns(ncols), [&](auto n_tag) {
        constexpr int N = decltype(n_tag)::value;
        constexpr int kBytes = S * WgPlan<N, WG>::kStageBytes;
        WgKernel kernel = nullptr;
        if constexpr (kForm == kWgEarly && WG == 1) {
            kernel = res ? wgmma_kernel_ready<S, WG, MB, N, kForm, true>() : wgmma_kernel_ready<S, WG, MB, N, kForm>();
        } else {
            if (res) return false;
            kernel = wgmma_kernel_ready<S, WG, MB, N, kForm>();
        }
        if (!kernel) return false;
        DFLASH_LAUNCH_PDL(dflash_pdl::gemm_kind(N), grid, block, kBytes, stream, kernel)(
            w, qs, yd, ysum, dst, nrows, k / kQk, row_bytes, ncols, stride_col_dst, lbo, sbo, split.full_tiles,
            split.pieces, partials, res, stride_col_res);
        return true;
    });
}

}  // namespace gemm_kq
