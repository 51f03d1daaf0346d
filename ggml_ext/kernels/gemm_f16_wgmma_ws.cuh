// The f16 wgmma GEMM for Q6_K and Q4_K (gemm_f16_wgmma.cuh), warp-specialized as the Q4_K int8
// form is (gemm_q4k_wgmma_ws.cuh; session 40, DFLASH_F16_WS, off and untimed).
//
// gemm_f16_wgmma_kernel's warps stage each super-block themselves (cp.async, a wait, a proxy fence
// and a __syncthreads a super-block). Here CW consumer warpgroups (64 rows each) and a producer
// warpgroup: the producer's 128 threads copy the stage's weight blocks with 16-byte cp.asyncs
// (Q6_K's 2-byte aligned blocks as 14 aligned chunks, as there), each arriving on the stage's
// `full` mbarrier once its copies land, and its first thread the super-block's f16 activations
// with one bulk copy on the same barrier. The consumers build their operands and issue a chunk's 4
// wgmmas at a time as the f16 body does, waiting for the chunk before (wait_group 1); so the last
// chunk of super-block i is known done at super-block i + 1's first wait, where each consumer thread
// releases stage i on its `empty` barrier. The activations reach the wgmmas through the async proxy
// (the bulk copy), so no proxy fence; the weights are read with ordinary loads.
//
// Each output's wgmmas run in the same order as the f16 body's, so the same bits with the same
// tiles and pieces: CW = 1 as its one-warpgroup form, CW = 2 as its two-warpgroup form (the
// emulator: tools/device/gemv_standalone.cu's check_f16_wgmma forms 4..6).
#pragma once

#include "gemm_f16_wgmma.cuh"
#include "gemm_q4k_wgmma_ws.cuh"

namespace gemm_kq {

constexpr int kF16WsStages = 3;  // Q6_K at 64 columns with two consumer warpgroups: 60 KB a stage

// setmaxnreg: the f16 consumers need ~150 registers (the f16 body's 147 at 64 columns), so the
// producers keep 56 (40 spilled their address arithmetic for Q6_K's 14 chunks a row):
// 2 blocks x 128 x (56 + 200) and 128 x 56 + 256 x 224 fit the 65536.
template <int CW>
struct F16WsRegs {
    static constexpr int kProducer = 56, kConsumer = CW == 1 ? 200 : 224;
};

template <typename F, int N, int S, int CW>
struct F16WsPlan {
    static constexpr int kBarOffset = S * F16WgPlan<F, N, CW>::kStageBytes;  // a multiple of 16
    static constexpr int kBytes = kBarOffset + 2 * S * (int)sizeof(uint64_t);
};

template <typename F, int N, int S, int CW, bool kRes>
__global__ void __launch_bounds__(WsShape<CW>::kThreads, WsShape<CW>::kBlocksPerSm)
    gemm_f16_wgmma_ws_kernel(const F16GemmArgs args) {
#if defined(DFLASH_WGMMA)
    using P = F16WgPlan<F, N, CW>;
    using Shape = WsShape<CW>;
    DFLASH_DYNAMIC_SMEM_BYTES(ws_smem);
    const int lane = threadIdx.x, warp = threadIdx.y, tid = warp * WARP_SIZE + lane;
    const WsTile tile = ws_tile<CW>(args.full_tiles, args.pieces, args.nblocks);
    const int nkb = tile.nkb, row_base = tile.row_base;
    uint64_t * full = reinterpret_cast<uint64_t *>(ws_smem + F16WsPlan<F, N, S, CW>::kBarOffset);
    uint64_t * empty = full + S;
    ws_stage_barriers<S>(full, tid, Shape::kConsumers);  // one release a consumer thread (below)
    auto stage_at = [&](int s) { return ws_smem + s * P::kStageBytes; };
    if (warp >= 4 * CW) {  // the producer warpgroup
        warpgroup_regs_down<F16WsRegs<CW>::kProducer>();
        // chunk c = ptid + 128 j of the stage (row c / kChunks, chunk c % kChunks of the row's block
        // aligned down to 16 bytes) at stage offset 16 c; a last tile's missing rows read the
        // matrix's last row.
        constexpr int kWChunks = P::kWBytes / 16, kPer = (kWChunks + kWsProducers - 1) / kWsProducers;
        const int ptid = tid - Shape::kConsumers, last = args.nrows - 1 - row_base;
        const char * wtile = args.w + (int64_t)row_base * args.row_bytes;
        const char * act_bytes = reinterpret_cast<const char *>(args.act);
        for (int i = 0; i < nkb; ++i) {
            const int s = i % S, use = i / S, kb = tile.kb_begin + i;
            char * st = stage_at(s);
            mbar_wait_parity(&empty[s], (use & 1) ^ 1);  // the consumers are done with its use before
            if (ptid == 0) {
                mbar_arrive_expect_tx(&full[s], P::kBBytes);
                bulk_copy_g2s(st + P::kWBytes, act_bytes + (int64_t)kb * P::kBBytes, P::kBBytes, &full[s]);
            }
#pragma unroll
            for (int j = 0; j < kPer; ++j) {
                const int c = ptid + kWsProducers * j, r = c / F::kChunks;
                if (kWChunks % kWsProducers == 0 || c < kWChunks) {
                    const char * blk = wtile + (int64_t)min(r, last) * args.row_bytes + (int64_t)kb * F::kBytes;
                    cp_async_16(st + 16 * c, (F::kAligned ? blk : align16_down(blk)) + 16 * (c - F::kChunks * r));
                }
            }
            cp_async_mbar_arrive_noinc(&full[s]);  // counts once this thread's copies have landed
        }
        return;  // the consumers' waits cover every copy it issued
    }
    warpgroup_regs_up<F16WsRegs<CW>::kConsumer>();
    const int g = lane >> 2, t = lane & 3;
    const int wrow = 64 * (warp >> 2) + 16 * (warp & 3);  // the warp's first row in the block
    const char *row0 = f16_row(args, row_base + wrow + g), *row1 = f16_row(args, row_base + wrow + g + 8);
    float acc[N / 2] = {};
    uint32_t a[2][4][4];  // a chunk's 4 groups' operands, two chunks in turn
    int chunk = 0;
    for (int i = 0; i < nkb; ++i) {
        const int s = i % S;
        mbar_wait_parity(&full[s], (i / S) & 1);
        // super-block i - 1's last chunk is done at i's first wait: its stage is free. Every consumer
        // thread arrives: a lane-0 arrival's branch among the wgmmas made ptxas serialize them (C7513).
        f16_superblock<F, N, P::kWBytes>(stage_at(s), tile.kb_begin + i, wrow, g, t, row0, row1, acc, a, chunk, [&] {
            if (i > 0) mbar_arrive(&empty[(i - 1) % S]);
        });
    }
    wg_wait0();
    wg_pin_f(acc);
    f16_finish<N, kRes, Shape::kConsumers, kWsGatherBarrier>(acc, tile.work, args, row_base + wrow, g, t, tid);
#else
    NO_DEVICE_CODE;
#endif
}

// The warp-specialized form for the f16 GEMM's host helpers (F16WgForm's members).
template <typename F, int S, int CW>
struct F16WsForm {
    static constexpr int kThreads = WsShape<CW>::kThreads, kTileRows = CW * kWgRows;
    template <int N>
    static constexpr int bytes() {
        return F16WsPlan<F, N, S, CW>::kBytes;
    }
    template <int N, bool kRes>
    static F16WgKernel kernel() {
        return gemm_f16_wgmma_ws_kernel<F, N, S, CW, kRes>;
    }
};

template <typename F, int CW, int S = kF16WsStages>
WgSplit f16_wgmma_ws_split_for(int nrows, int k, int ncols, int nsm) {
    return f16_split_for<F16WsForm<F, S, CW>>(nrows, k, ncols, nsm);
}

template <typename F, int CW, int S = kF16WsStages>
bool f16_wgmma_ws_ready(int ncols, bool with_res) {
    return f16_ready<F16WsForm<F, S, CW>>(ncols, with_res);
}

// As launch_f16_wgmma (the same activations, residual, split and partials; a split of 64 CW-row
// tiles). The activations must be 16-byte aligned (the bulk copy's).
template <typename F, int CW, int S = kF16WsStages>
bool launch_f16_wgmma_ws(const char * w, const __half * act, float * dst, int nrows, int k, int64_t row_bytes,
                         int ncols, int stride_col_dst, cudaStream_t stream, const float * res = nullptr,
                         int stride_col_res = 0, WgSplit split = {}, float * partials = nullptr) {
    return f16_launch<F16WsForm<F, S, CW>>(w, act, dst, nrows, k, row_bytes, ncols, stride_col_dst, stream, res,
                                           stride_col_res, split, partials);
}

}  // namespace gemm_kq
