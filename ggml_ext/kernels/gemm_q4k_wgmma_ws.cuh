// The Q4_K int8 wgmma GEMM, warp-specialized (session 39; from 33 columns by default since session 40,
// by each matrix's shape and with a fused residual since session 44; DFLASH_WGMMA_WS).
//
// gemm_q4k_wgmma_early_kernel's four warps both stage and compute: each thread issues its share
// of a stage's cp.asyncs, waits for its own groups, fences, and every super-block the block meets
// at a __syncthreads before any warp may read the stage (ncu, sessions 19 and 26: 2 warps a
// scheduler, issue slots ~31-44% busy, the tensor pipe ~26%: latency, not throughput). Here CW
// consumer warpgroups (64 rows each) and a producer warpgroup: the producer's 128 threads stage a
// super-block's weight rows with 16-byte cp.asyncs, each thread arriving on the stage's `full`
// mbarrier once its copies land (cp.async.mbarrier.arrive.noinc), and its first thread the
// activations, their per-32 sums and scales with three bulk copies on the same barrier
// (kernels/mbarrier.cuh); a stage is refilled once every consumer warp has arrived on its `empty`
// barrier. The consumers wait for `full` and compute as the early kernel does (the operands of a
// super-block in registers, its 16 wgmmas, one wait, the float step), with no staging
// instructions and no block barrier in the loop; with CW = 2 the two warpgroups share one copy of
// the activations and need not keep in step (no barrier couples them, unlike DFLASH_WGMMA_WG=2).
//
// Registers (setmaxnreg): the producers give theirs back down to 40 and the consumers take them.
// CW = 1: 8 warps launched at 128 a thread, 2 blocks a multiprocessor, consumers at 216 (the early
// kernel needs 197 at 64 columns; a block of 5 warps would be allocated as 6, capping 2 blocks at
// 168, which spills). CW = 2: 12 warps at 168, one block, consumers at 232.
//
// The same stages, rows and arithmetic as the early kernel with CW warpgroups, so its bits, split
// or not (the emulator: tools/device/gemv_standalone.cu's check_wgmma swaps 8 and 9 and
// check_wgmma_split's ws_same / ws2_same; on the H200 too, session 40).
//
// Session 40 (H200): its first producer, one bulk copy a weight row (144 bytes) from each lane of
// one warp, capped the kernel at ~0.45-0.86 TB/s whatever the column count ([gate; up] at 16
// columns 116 us against the early kernel's 37; halved again with one producer warp a
// multiprocessor, CW = 2): small bulk copies issued lane by lane are slow to issue. A warp's
// cp.async moves 512 bytes in one instruction.
#pragma once

#include <algorithm>
#include <cstdlib>

#include "gemm_q4k_wgmma.cuh"
#include "mbarrier.cuh"

namespace gemm_kq {

// Consumer warpgroups CW (1 or 2): the block's threads, blocks a multiprocessor and registers.
template <int CW>
struct WsShape {
    static_assert(CW == 1 || CW == 2, "one or two consumer warpgroups");
    static constexpr int kConsumers = 128 * CW, kThreads = kConsumers + 128, kBlocksPerSm = CW == 1 ? 2 : 1;
    // launched at 65536 / (kBlocksPerSm x kThreads) registers, rounded down to 8 (128, 168)
    static constexpr int kProducerRegs = 40, kConsumerRegs = CW == 1 ? 216 : 232;
};
constexpr int kWsGatherBarrier = 1;  // the consumers' named barrier in a tail split's gather
constexpr int kWsProducers = 128;    // the producer warpgroup's threads
constexpr int kWsStages = 4;

// A warp-specialized block's work (a tile, or a tail split's piece of one: wg_block_work): its
// super-blocks and the tile's first row (CW warpgroups of 64 rows).
struct WsTile {
    WgBlockWork work;
    int kb_begin, nkb, row_base;
};
template <int CW>
__device__ __forceinline__ WsTile ws_work_tile(const WgBlockWork & work) {
    return {work, work.kb_begin, work.kb_end - work.kb_begin, work.tile * kWgRows * CW};
}
template <int CW>
__device__ __forceinline__ WsTile ws_item_tile(int item, int full_tiles, int pieces, int nblocks) {
    return ws_work_tile<CW>(wg_item_work(item, full_tiles, pieces, nblocks));
}
template <int CW>
__device__ __forceinline__ WsTile ws_tile(int full_tiles, int pieces, int nblocks) {
    return ws_item_tile<CW>((int)blockIdx.x, full_tiles, pieces, nblocks);
}

// The work items of a launch of nrows (its plan's whole tiles, then the pieces of its tail tiles).
// Block b takes items b, b + gridDim.x, ...: one each when the grid has a block an item, several in
// a persistent launch (a grid of the plan's block slots, DFLASH_WS_PERSISTENT), where the producers
// stage the next item's first super-blocks while the consumers finish the one before (the stage
// ring runs on across items), and no block refills its ring from empty. Each item is computed as
// alone, so the bits do not depend on the grid.
template <int CW>
__device__ __forceinline__ int ws_items(const int nrows, const int full_tiles, const int pieces) {
    const int tiles = (nrows + CW * kWgRows - 1) / (CW * kWgRows);
    return full_tiles + (tiles - full_tiles) * pieces;
}

// The items of a block in order (producers and consumers walk the same): with a tail split (or
// none) items blockIdx.x, + gridDim.x, ... of ws_items; with a stream split (full_tiles < 0,
// wg_stream_plan) the tiles its run meets, each whole or its piece of it. With CW = 2 the
// producers (40 registers) spill 12-20 bytes for it (sm_90a; the engine's default is CW = 1, none).
template <int CW>
struct WsWalk {
    int cur, end, step, nblocks, full_tiles, pieces;
    int64_t units;  // a stream split's super-blocks

    __device__ __forceinline__ WsWalk(const int nrows, const int nblocks_, const int full_tiles_, const int pieces_)
        : nblocks(nblocks_), full_tiles(full_tiles_), pieces(pieces_) {
        const int tiles = (nrows + CW * kWgRows - 1) / (CW * kWgRows);
        if (full_tiles < 0) {
            const int w = blockIdx.x, workers = gridDim.x;
            units = (int64_t)tiles * nblocks;
            cur = (int)(wg_stream_begin(w, units, workers) / nblocks);
            end = (int)((wg_stream_begin(w + 1, units, workers) - 1) / nblocks) + 1, step = 1;
        } else {
            units = 0, cur = blockIdx.x, end = ws_items<CW>(nrows, full_tiles, pieces), step = gridDim.x;
        }
    }

    __device__ __forceinline__ bool next(WsTile & tile) {
        if (cur >= end) return false;
        tile = full_tiles < 0 ? ws_work_tile<CW>(wg_stream_work(blockIdx.x, cur, nblocks, units, gridDim.x))
                              : ws_item_tile<CW>(cur, full_tiles, pieces, nblocks);
        cur += step;
        return true;
    }
};

// A warp-specialized kernel's stage barriers at bars: S `full` ones, completed by the producers'
// bulk copies' expect_tx and each producer thread's cp.async arrival, then S `empty` ones, by
// `releases` consumer arrivals. Thread 0 initialises them; then the block's barrier and the wait for
// the kernel that wrote the activations (pdl.cuh).
template <int S>
__device__ __forceinline__ void ws_stage_barriers(uint64_t * bars, int tid, int releases) {
    if (tid == 0) {
        for (int s = 0; s < S; ++s) {
            mbar_init(&bars[s], 1 + kWsProducers);
            mbar_init(&bars[S + s], releases);
        }
        mbar_init_fence();
    }
    __syncthreads();
    pdl_wait();
    pdl_trigger();
}

// Dynamic shared memory: S stages as the early kernel's (WgPlan<N, CW>), then each stage's full
// and empty barriers.
template <int N, int S, int CW>
struct WsPlan {
    static constexpr int kBarOffset = S * WgPlan<N, CW>::kStageBytes;  // a multiple of 16
    static constexpr int kBytes = kBarOffset + 2 * S * (int)sizeof(uint64_t);
};

// The producers' 16-byte weight chunks of a row tile: chunk c = ptid + 128 j of the stage (row c / 9,
// piece c % 9) at stage offset 16 c, read from the tile's first row + off[j] (in super-block 0; a
// super-block adds 144); `last` is the tile's last row in the matrix less its first, so a last tile's
// missing rows read the matrix's last row. Offsets fit 32 bits (launch_q4k_wgmma_ws checks).
template <int N, int CW>
struct WsRows {
    static constexpr int kWChunks = WgPlan<N, CW>::kWBytes / 16;
    static constexpr int kPer = (kWChunks + kWsProducers - 1) / kWsProducers;
};
template <int N, int CW>
__device__ __forceinline__ void ws_row_offsets(int (&off)[WsRows<N, CW>::kPer], const int ptid, const int last,
                                               const int64_t row_bytes) {
#pragma unroll
    for (int j = 0; j < WsRows<N, CW>::kPer; ++j) {
        const int c = ptid + kWsProducers * j, r = c / 9;
        off[j] = min(r, last) * (int)row_bytes + 16 * (c - 9 * r);
    }
}

// The producers' part of a super-block kb in stage s (its use-th fill): once the consumers released
// the use before, the activations, their per-32 sums and scales (thread 0: three bulk copies) and
// this thread's weight chunks of the tile at wtile, each landing on full[s].
template <int N, int CW>
__device__ __forceinline__ void ws_produce(char * st, uint64_t * full_s, uint64_t * empty_s, const unsigned use,
                                           const int kb, const char * wtile, const int (&off)[WsRows<N, CW>::kPer],
                                           const int ptid, const int8_t * qs, const int * ysum, const float * yd) {
    using P = WgPlan<N, CW>;
    using R = WsRows<N, CW>;
    constexpr int kActBytes = P::kBBytes + P::kSumBytes + P::kDBytes;
    mbar_wait_parity(empty_s, (use & 1) ^ 1);  // the consumers are done with its use before
    if (ptid == 0) {
        mbar_arrive_expect_tx(full_s, kActBytes);
        char * a = st + P::kWBytes;
        bulk_copy_g2s(a, reinterpret_cast<const char *>(qs) + (int64_t)kb * P::kBBytes, P::kBBytes, full_s);
        bulk_copy_g2s(a + P::kBBytes, reinterpret_cast<const char *>(ysum) + (int64_t)kb * P::kSumBytes, P::kSumBytes,
                      full_s);
        bulk_copy_g2s(a + P::kBBytes + P::kSumBytes, reinterpret_cast<const char *>(yd) + (int64_t)kb * P::kDBytes,
                      P::kDBytes, full_s);
    }
    const char * wk = wtile + (int64_t)kb * 144;
#pragma unroll
    for (int j = 0; j < R::kPer; ++j) {
        if (R::kWChunks % kWsProducers == 0 || ptid + kWsProducers * j < R::kWChunks)
            cp_async_16(st + 16 * (ptid + kWsProducers * j), wk + off[j]);
    }
    cp_async_mbar_arrive_noinc(full_s);  // counts once this thread's copies have landed
}

// A consumer warp's part of the super-block in stage st once full_s completes its phase `parity`:
// its 16 rows' products into acc (the early kernel's operands, wgmmas and float step), then the
// stage released on empty_s.
template <int N, int CW>
__device__ __forceinline__ void ws_consume(float (&acc)[N / 8][4], const char * st, uint64_t * full_s,
                                           uint64_t * empty_s, const unsigned parity, const int lane, const int wrow,
                                           const int lbo, const int sbo) {
    using P = WgPlan<N, CW>;
    const int g = lane >> 2, t = lane & 3;
    mbar_wait_parity(full_s, parity);
    const char *s0 = st + (wrow + g) * 144, *s1 = s0 + 8 * 144;
    const uint4 h0 = *reinterpret_cast<const uint4 *>(s0), h1 = *reinterpret_cast<const uint4 *>(s1);
    int al[4][2][4], ah[4][2][4];
    int clo[N / 2], chi[N / 2];
#pragma unroll
    for (int c = 0; c < 4; ++c) wg_chunk<N>(st + P::kWBytes, s0, s1, h0, h1, c, t, al[c], ah[c], clo, chi, lbo, sbo);
    wg_commit();
    const WgStep step = wg_step<N>(h0, h1, t);
    wg_wait0();
    wg_pin(clo);
    wg_pin(chi);
    const char * sums = st + P::kWBytes + P::kBBytes;
    wg_float_tiles<N, 0, N / 8>(acc, clo, chi, step, reinterpret_cast<const uint32_t *>(sums),
                                reinterpret_cast<const float *>(sums + P::kSumBytes), g, t);
    // The float step's reads of the stage's sums and scales (generic loads of what the producer's
    // bulk copies, the async proxy, wrote) ordered before the stage is released to the next bulk
    // copies: the proxy fence (sm_90a SASS: MEMBAR.ALL.CTA, FENCE.VIEW.ASYNC.S) drains them. Without
    // it the release (a plain arrive) went out with the last loads in flight, and on the H100
    // (session 42) launches of many super-blocks a block now and then gave one warp's last column
    // tile a stale super-block's sums: ffn_down (5120 x 17408 at 64 columns, split in pieces of
    // 22-23 super-blocks) differed between identical runs in 5-14 of 60, 34816 x 17408 in 25 of 25,
    // [gate; up] (20 super-blocks) in 0 of 60. With the fence none differed on the H100 (session 43:
    // tests/test_gemv_kquant.py's test_cuda_wgmma_gives_the_same_bits_every_run), and [gate; up]
    // cost no more than the run-to-run spread of machines (the 64-token forward's 120 launches 6539
    // against 6431 us, on an H100 1.7% slower in the AR step).
    fence_proxy_async();
    __syncwarp();  // the warp's reads of the stage done before it is released
    if (lane == 0) mbar_arrive(empty_s);
}

// A consumer warp's 16 rows from row0 of acc out to dst (rows past nrows, columns past ncols not);
// kRes: plus the residual res (stride_col_res floats a column; it may be dst itself), one float
// addition each, as the early kernel's kRes (write_outputs: each element read, then written, by one
// thread).
template <int N, bool kRes = false>
__device__ __forceinline__ void ws_write_rows(const float (&acc)[N / 8][4], float * __restrict__ dst, const int row0,
                                              const int lane, const int nrows, const int ncols,
                                              const int stride_col_dst, const float * res = nullptr,
                                              const int stride_col_res = 0) {
    const int g = lane >> 2, t = lane & 3;
    write_outputs<N / 2, kRes>(
        [&](int e) { return make_int2(row0 + g + ((e & 3) < 2 ? 0 : 8), (e >> 2) * 8 + 2 * t + (e & 1)); },
        [&](int e) { return acc[e >> 2][e & 3]; }, dst, stride_col_dst, res, stride_col_res, nrows, ncols);
}

// A warp-specialized block's S stages in dynamic shared memory and their barriers (initialised by
// the constructor, every thread: ws_stage_barriers). The producers' fill i and the consumers' i-th
// super-block use stage i % S, for its (i / S)-th time.
template <int N, int S, int CW>
struct WsStages {
    char * smem;
    uint64_t * full;  // S `full` barriers, then S `empty` ones

    __device__ __forceinline__ WsStages(char * smem_, const int tid)
        : smem(smem_), full(reinterpret_cast<uint64_t *>(smem_ + WsPlan<N, S, CW>::kBarOffset)) {
        ws_stage_barriers<S>(full, tid, 4 * CW);  // one release a consumer warp
    }

    __device__ __forceinline__ char * stage(unsigned i) const { return smem + (i % S) * WgPlan<N, CW>::kStageBytes; }

    __device__ __forceinline__ void produce(const unsigned i, const int kb, const char * wtile,
                                            const int (&off)[WsRows<N, CW>::kPer], const int ptid, const int8_t * qs,
                                            const int * ysum, const float * yd) const {
        ws_produce<N, CW>(stage(i), &full[i % S], &full[S + i % S], i / S, kb, wtile, off, ptid, qs, ysum, yd);
    }

    __device__ __forceinline__ void consume(float (&acc)[N / 8][4], const unsigned i, const int lane, const int wrow,
                                            const int lbo, const int sbo) const {
        ws_consume<N, CW>(acc, stage(i), &full[i % S], &full[S + i % S], (i / S) & 1, lane, wrow, lbo, sbo);
    }
};

// A producer thread's rank among the producers, its warpgroup's registers given back first.
template <int CW>
__device__ __forceinline__ int ws_producer_rank(const int tid) {
    warpgroup_regs_down<WsShape<CW>::kProducerRegs>();
    return tid - WsShape<CW>::kConsumers;
}

template <int N, int S, int CW, bool kRes>
__device__ __forceinline__ void wgmma_ws_body(const char * __restrict__ w, const int8_t * qs, const float * yd,
                                              const int * ysum, float * __restrict__ dst, const int nrows,
                                              const int nblocks, const int64_t row_bytes, const int ncols,
                                              const int stride_col_dst, const int lbo, const int sbo,
                                              const int full_tiles, const int pieces, float * partials,
                                              const float * res, const int stride_col_res) {
    using Shape = WsShape<CW>;
    constexpr int NT = N / 8, kProducer = 4 * CW;  // the producer warpgroup's first warp
    DFLASH_DYNAMIC_SMEM_BYTES(ws_smem);
    const int lane = threadIdx.x, warp = threadIdx.y, tid = warp * WARP_SIZE + lane;
    const WsStages<N, S, CW> stages(ws_smem, tid);
    WsWalk<CW> walk(nrows, nblocks, full_tiles, pieces);
    unsigned i = 0;  // the block's super-blocks so far, over its items (the stage ring's position)
    WsTile tile;
    if (warp >= kProducer) {
        const int ptid = ws_producer_rank<CW>(tid);
        while (walk.next(tile)) {
            int off[WsRows<N, CW>::kPer];
            ws_row_offsets<N, CW>(off, ptid, nrows - 1 - tile.row_base, row_bytes);
            const char * wtile = w + (int64_t)tile.row_base * row_bytes;
            for (int kb = tile.kb_begin; kb < tile.kb_begin + tile.nkb; ++kb, ++i)
                stages.produce(i, kb, wtile, off, ptid, qs, ysum, yd);
        }
        return;  // the consumers' waits cover every copy it issued
    }
    warpgroup_regs_up<Shape::kConsumerRegs>();
    const int wrow = 16 * warp;
    while (walk.next(tile)) {
        float acc[NT][4] = {};
        for (const unsigned end = i + tile.nkb; i < end; ++i) stages.consume(acc, i, lane, wrow, lbo, sbo);
        auto at = [&](int nt, int e) -> float & { return acc[nt][e]; };
        if (tile.work.split &&
            !wg_split_gather<NT, Shape::kConsumers, kWsGatherBarrier>(at, partials, tile.work, tid)) {
            continue;
        }
        ws_write_rows<N, kRes>(acc, dst, tile.row_base + wrow, lane, nrows, ncols, stride_col_dst, res, stride_col_res);
    }
}

// kRes: with a fused residual add (ws_write_rows').
template <int N, int S, int CW, bool kRes = false>
__global__ void __launch_bounds__(WsShape<CW>::kThreads, WsShape<CW>::kBlocksPerSm)
    gemm_q4k_wgmma_ws_kernel(const char * __restrict__ w, const int8_t * qs, const float * yd, const int * ysum,
                             float * __restrict__ dst, const int nrows, const int nblocks, const int64_t row_bytes,
                             const int ncols, const int stride_col_dst, const int lbo, const int sbo,
                             const int full_tiles, const int pieces, float * partials, const float * res,
                             const int stride_col_res) {
#if defined(DFLASH_WGMMA)
    wgmma_ws_body<N, S, CW, kRes>(w, qs, yd, ysum, dst, nrows, nblocks, row_bytes, ncols, stride_col_dst, lbo, sbo,
                                  full_tiles, pieces, partials, res, stride_col_res);
#else
    NO_DEVICE_CODE;
#endif
}

using WsKernel = void (*)(const char *, const int8_t *, const float *, const int *, float *, int, int, int64_t, int,
                          int, int, int, int, int, float *, const float *, int);

// The instance for N padded columns (kRes: with the fused residual), its dynamic shared memory opted
// in once; null when that failed.
template <int S, int CW, int N, bool kRes = false>
WsKernel wgmma_ws_kernel_ready() {
    static const bool ok = smem_opt_in(gemm_q4k_wgmma_ws_kernel<N, S, CW, kRes>, WsPlan<N, S, CW>::kBytes);
    return ok ? gemm_q4k_wgmma_ws_kernel<N, S, CW, kRes> : nullptr;
}

// Whether the launches may take a stream split where it beats the tail split (ws_split_choice):
// `stream` 0 or 1, or -1 for DFLASH_WG_STREAM=1 (off: on the H100 it lost, the 27B's 32 / 64-token
// forwards 11.65 / 14.48 against 11.45 / 14.44 ms of kernels; session 50).
inline bool ws_stream_on(const int stream) {
    static const bool env = [] {
        const char * e = std::getenv("DFLASH_WG_STREAM");
        return e && e[0] == '1';
    }();
    return stream < 0 ? env : stream != 0;
}

// The split of `tiles` tiles of nblocks over `slots`: the tail split (wg_split_plan), or with
// `stream` the stream split (wg_stream_plan) where a block slot's most super-blocks drop by over a
// twentieth (its gathers cost more: a run's ends are pieces); gdn_in's 258 tiles over 264 slots
// stay whole.
inline WgSplit ws_split_choice(int tiles, int nblocks, int slots, int min_piece, bool stream) {
    const WgSplit tail = wg_split_plan(tiles, nblocks, slots, min_piece);
    if (!stream) return tail;
    const WgSplit run = wg_stream_plan(tiles, nblocks, slots, min_piece);
    if (!run.stream()) return tail;
    return 20 * wg_slot_units(tail, tiles, nblocks) > 21 * wg_slot_units(run, tiles, nblocks) ? run : tail;
}

// The split of a launch of nrows x k at ncols columns on nsm multiprocessors (WgSplit; stream:
// ws_stream_on).
template <int CW = 1, int S = kWsStages>
WgSplit wgmma_ws_split_for(int nrows, int k, int ncols, int nsm, int stream = -1) {
    return wg_for_columns(wg_padded_columns(ncols), [&](auto n_tag) {
        constexpr int N = decltype(n_tag)::value;
        static const int per_sm =
            wg_blocks_per_sm(wgmma_ws_kernel_ready<S, CW, N>(), WsShape<CW>::kThreads, WsPlan<N, S, CW>::kBytes);
        return ws_split_choice((nrows + CW * kWgRows - 1) / (CW * kWgRows), k / kQk, per_sm * nsm,
                               wg_min_piece_blocks(), ws_stream_on(stream));
    });
}

// A warp-specialized kernel's instance for ncols's padded column count N (ready(N tag): the instance,
// its shared memory opted in; null where that failed) over `grid` blocks: the arguments every form
// takes, then `tail`, its own. False when it cannot run here.
template <int CW, int S, typename Ready, typename... Tail>
bool ws_launch(Ready && ready, const dim3 grid, cudaStream_t stream, const char * w, const int8_t * qs,
               const float * yd, const int * ysum, float * dst, int nrows, int k, int64_t row_bytes, int ncols,
               int stride_col_dst, Tail... tail) {
    const dim3 block(WARP_SIZE, WsShape<CW>::kThreads / WARP_SIZE, 1);
    return wg_for_columns(wg_padded_columns(ncols), [&](auto n_tag) {
        constexpr int N = decltype(n_tag)::value;
        constexpr int kBytes = WsPlan<N, S, CW>::kBytes;
        auto kernel = ready(n_tag);
        if (!kernel) return false;
        DFLASH_LAUNCH_PDL(dflash_pdl::gemm_kind(N), grid, block, kBytes, stream, kernel)(
            w, qs, yd, ysum, dst, nrows, k / kQk, row_bytes, ncols, stride_col_dst, 128, 256, tail...);
        return true;
    });
}

// Whether a launch with a plan of known block slots runs persistent (ws_items): `persistent` 0 or 1,
// or -1 for DFLASH_WS_PERSISTENT (1: on). Off: on the H100 (session 48, bench/results/h100-s48-c2-*)
// [gate; up] at 64 columns took 69.9 / 70.3 against 70.9 / 70.8 us standalone, ffn_down (one item a
// block) the same, and the 64-token forward 15.18 against 15.20 ms of kernels: a block's refill
// between tiles is not where the time goes.
inline bool ws_persistent(const int persistent) {
    static const bool env = [] {
        const char * e = std::getenv("DFLASH_WS_PERSISTENT");
        return e && e[0] == '1';
    }();
    return persistent < 0 ? env : persistent != 0;
}

// As launch_q4k_wgmma (the same activations, split and partials; a split of 64 CW-row tiles; res,
// when not null, the residual added to each output, stride_col_res floats a column, may be dst; CW
// 1 only);
// false when the kernel cannot run here (its shared memory opt-in failed). The weight rows and activations
// must be 16-byte aligned (the bulk copies'): row_bytes is a multiple of 144, ggml's buffers are
// aligned. persistent (ws_persistent): a grid of the split's block slots, each block taking every
// slots-th work item (split.slots from wgmma_ws_split_for; none known: a block an item).
template <int CW = 1, int S = kWsStages>
bool launch_q4k_wgmma_ws(const char * w, const int8_t * qs, const float * yd, const int * ysum, float * dst, int nrows,
                         int k, int64_t row_bytes, int ncols, int stride_col_dst, cudaStream_t stream,
                         WgSplit split = {}, float * partials = nullptr, const float * res = nullptr,
                         int stride_col_res = 0, int persistent = -1) {
    const int tiles = (nrows + CW * kWgRows - 1) / (CW * kWgRows);
    if ((int64_t)CW * kWgRows * row_bytes > INT32_MAX) return false;  // the producers' 32-bit offsets
    if (!split.splits() || !partials) split = WgSplit{tiles, 0, 1, split.slots};
    const int blocks = !split.stream() && ws_persistent(persistent) && split.slots > 0
                           ? std::min(split.grid(), split.slots)
                           : split.grid();
    auto ready = [res](auto n_tag) -> WsKernel {
        constexpr int N = decltype(n_tag)::value;
        if constexpr (CW == 1) {
            if (res) return wgmma_ws_kernel_ready<S, CW, N, true>();
        } else if (res) {
            return nullptr;  // the residual: one consumer warpgroup only
        }
        return wgmma_ws_kernel_ready<S, CW, N>();
    };
    return ws_launch<CW, S>(ready, dim3((unsigned)blocks, 1, 1), stream, w, qs, yd, ysum, dst, nrows, k, row_bytes,
                            ncols, stride_col_dst, split.full_tiles_arg(), split.pieces, partials, res, stride_col_res);
}

}  // namespace gemm_kq
