// The int8 warp-specialized wgmma GEMM with every block given an even share of the work (stream-K;
// DFLASH_WGMMA_EVEN, off until timed).
//
// gemm_q4k_wgmma_ws_kernel runs one row tile a block and splits only the last wave's tiles along K
// (WgSplit): on the H100 (session 41's ncu, [gate; up] at 64 columns: 544 tiles of 20 super-blocks
// over 264 block slots) the multiprocessors were busy 85% of the kernel's cycles (106 k of 125 k):
// the last wave runs 16 tiles in pieces of 4 super-blocks on 80 of the 264 slots, and each of the
// 608 blocks fills its pipeline from empty. Here the grid is the slots, and the tiles' super-blocks
// (tile-major, U = tiles x nblocks units) are cut into G equal runs, block g taking units
// [g U / G, (g + 1) U / G): each block's producer streams its run without a gap at tile edges, and
// every block ends together. A tile whose units two or more blocks share is summed as the tail
// split's pieces are (wg_split_gather): each piece's sums to partials, the last to arrive adds them
// in piece order (the bits do not depend on which finished last) and writes the tile. A block has
// at most two partial pieces (its run's first and last tile), so partials hold 2 G of them; a split
// tile's counter is its first block's (the one block whose run ends inside it).
#pragma once

#include "gemm_q4k_wgmma_ws.cuh"

namespace gemm_kq {

// The run of units of block g of G over U units, and the block that holds unit u.
struct WsEvenRuns {
    int64_t units;
    int grid;
    __host__ __device__ int64_t begin(int g) const { return (int64_t)g * units / grid; }
    __host__ __device__ int block_of(int64_t u) const { return (int)(((u + 1) * grid + units - 1) / units) - 1; }
};

// A piece's slot in partials (2 a block: its run's first tile, then its last) for tile t of block g.
__device__ __forceinline__ int ws_even_slot(const WsEvenRuns & runs, int g, int t, int nblocks) {
    return 2 * g + (runs.begin(g) / nblocks == t ? 0 : 1);
}

// The end of a consumer's piece of tile t (wg_gather_pieces among the kConsumers threads of
// kWsGatherBarrier): piece p is block first + p's, in its slot; the count on the first's counter.
template <int NT, int kConsumers>
__device__ __forceinline__ bool ws_even_gather(float (&acc)[NT][4], float * partials, const WsEvenRuns & runs,
                                               const int t, const int nblocks, const int ctid) {
    const int first = runs.block_of((int64_t)t * nblocks);
    const int pieces = runs.block_of((int64_t)t * nblocks + nblocks - 1) - first + 1;
    auto piece_sums = [&](int p) {
        const int slot = ws_even_slot(runs, first + p, t, nblocks);
        return reinterpret_cast<float4 *>(partials) + ((int64_t)slot * kConsumers + ctid) * NT;
    };
    auto at = [&](int nt, int i) -> float & { return acc[nt][i]; };
    return wg_gather_pieces<NT, kConsumers, kWsGatherBarrier>(at, piece_sums, (int)blockIdx.x - first,
                                                              &wg_tile_arrivals[first], pieces, ctid);
}

template <int N, int S, int CW>
__device__ __forceinline__ void wgmma_ws_even_body(const char * __restrict__ w, const int8_t * qs, const float * yd,
                                                   const int * ysum, float * __restrict__ dst, const int nrows,
                                                   const int nblocks, const int64_t row_bytes, const int ncols,
                                                   const int stride_col_dst, const int lbo, const int sbo,
                                                   float * partials) {
    using Shape = WsShape<CW>;
    constexpr int NT = N / 8, kProducer = 4 * CW, kTileRows = CW * kWgRows;
    DFLASH_DYNAMIC_SMEM_BYTES(ws_smem);
    const int lane = threadIdx.x, warp = threadIdx.y, tid = warp * WARP_SIZE + lane;
    const int tiles = (nrows + kTileRows - 1) / kTileRows;
    const WsEvenRuns runs{(int64_t)tiles * nblocks, (int)gridDim.x};
    const int64_t u0 = runs.begin(blockIdx.x), u1 = runs.begin(blockIdx.x + 1);
    const WsStages<N, S, CW> stages(ws_smem, tid);
    if (warp >= kProducer) {
        const int ptid = ws_producer_rank<CW>(tid);
        int off[WsRows<N, CW>::kPer];
        int tile = -1;
        const char * wtile = w;
        for (int64_t u = u0; u < u1; ++u) {
            const int t = (int)(u / nblocks);
            if (t != tile) {  // a new tile: its rows' offsets (a last tile's missing rows clamped)
                tile = t;
                wtile = w + (int64_t)t * kTileRows * row_bytes;
                ws_row_offsets<N, CW>(off, ptid, nrows - 1 - t * kTileRows, row_bytes);
            }
            stages.produce((int)(u - u0), (int)(u - (int64_t)t * nblocks), wtile, off, ptid, qs, ysum, yd);
        }
        return;  // the consumers' waits cover every copy it issued
    }
    warpgroup_regs_up<Shape::kConsumerRegs>();
    const int wrow = 16 * warp;
    float acc[NT][4] = {};
    int64_t piece_begin = u0;  // the first unit of the tile piece being summed
    for (int64_t u = u0; u < u1; ++u) {
        const int t = (int)(u / nblocks);
        stages.consume(acc, (int)(u - u0), lane, wrow, lbo, sbo);
        const int64_t tile_end = (int64_t)(t + 1) * nblocks;
        if (u + 1 != tile_end && u + 1 != u1) continue;
        // the piece ends: a whole tile is written, a part of one gathered with its other pieces
        const bool whole = piece_begin == (int64_t)t * nblocks && u + 1 == tile_end;
        if (whole || ws_even_gather<NT, Shape::kConsumers>(acc, partials, runs, t, nblocks, tid)) {
            ws_write_rows<N>(acc, dst, t * kTileRows + wrow, lane, nrows, ncols, stride_col_dst);
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
        piece_begin = u + 1;
    }
}

template <int N, int S, int CW>
__global__ void __launch_bounds__(WsShape<CW>::kThreads, WsShape<CW>::kBlocksPerSm)
    gemm_q4k_wgmma_ws_even_kernel(const char * __restrict__ w, const int8_t * qs, const float * yd, const int * ysum,
                                  float * __restrict__ dst, const int nrows, const int nblocks, const int64_t row_bytes,
                                  const int ncols, const int stride_col_dst, const int lbo, const int sbo,
                                  float * partials) {
#if defined(DFLASH_WGMMA)
    wgmma_ws_even_body<N, S, CW>(w, qs, yd, ysum, dst, nrows, nblocks, row_bytes, ncols, stride_col_dst, lbo, sbo,
                                 partials);
#else
    NO_DEVICE_CODE;
#endif
}

using WsEvenKernel = void (*)(const char *, const int8_t *, const float *, const int *, float *, int, int, int64_t, int,
                              int, int, int, float *);

// The instance for N padded columns, its dynamic shared memory opted in once; null when that failed.
template <int S, int CW, int N>
WsEvenKernel wgmma_ws_even_kernel_ready() {
    static const bool ok = smem_opt_in(gemm_q4k_wgmma_ws_even_kernel<N, S, CW>, WsPlan<N, S, CW>::kBytes);
    return ok ? gemm_q4k_wgmma_ws_even_kernel<N, S, CW> : nullptr;
}

constexpr int kWsEvenMinUnits = 4;  // super-blocks a block at least

// The grid of an even launch of nrows x k at ncols columns on nsm multiprocessors: the resident
// block slots, fewer where the units would give a block under kWsEvenMinUnits; 0 when the kernel
// cannot run here (its shared memory opt-in failed) or a split tile's counter would not fit.
template <int CW = 1, int S = kWsStages>
int wgmma_ws_even_grid(int nrows, int k, int ncols, int nsm) {
    return wg_for_columns(wg_padded_columns(ncols), [&](auto n_tag) {
        constexpr int N = decltype(n_tag)::value;
        auto kernel = wgmma_ws_even_kernel_ready<S, CW, N>();
        if (!kernel) return 0;
        static const int per_sm = wg_blocks_per_sm(kernel, WsShape<CW>::kThreads, WsPlan<N, S, CW>::kBytes);
        const int64_t units = (int64_t)((nrows + CW * kWgRows - 1) / (CW * kWgRows)) * (k / kQk);
        const int64_t grid = std::min<int64_t>((int64_t)per_sm * nsm, std::max<int64_t>(1, units / kWsEvenMinUnits));
        return grid <= kWgMaxSplitTiles ? (int)grid : 0;
    });
}

// Floats of partials an even launch of `grid` blocks needs (two pieces a block).
template <int CW = 1>
inline size_t wgmma_ws_even_floats(int grid, int ncols) {
    return (size_t)grid * 2 * CW * kWgRows * wg_padded_columns(ncols);
}

// As launch_q4k_wgmma_ws, over `grid` blocks (wgmma_ws_even_grid) with wgmma_ws_even_floats(grid)
// floats of partials; false when it cannot run here.
template <int CW = 1, int S = kWsStages>
bool launch_q4k_wgmma_ws_even(const char * w, const int8_t * qs, const float * yd, const int * ysum, float * dst,
                              int nrows, int k, int64_t row_bytes, int ncols, int stride_col_dst, cudaStream_t stream,
                              int grid, float * partials) {
    if ((int64_t)CW * kWgRows * row_bytes > INT32_MAX || grid < 1 || grid > kWgMaxSplitTiles || !partials) {
        return false;
    }
    auto ready = [](auto n_tag) { return wgmma_ws_even_kernel_ready<S, CW, decltype(n_tag)::value>(); };
    return ws_launch<CW, S>(ready, dim3((unsigned)grid, 1, 1), stream, w, qs, yd, ysum, dst, nrows, k, row_bytes, ncols,
                            stride_col_dst, partials);
}

}  // namespace gemm_kq
