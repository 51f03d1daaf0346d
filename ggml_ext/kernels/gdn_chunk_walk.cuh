// What the staged delta-rule kernels (gdn_chain_one_round.cu, gdn_chain_gram.cu) share: their
// inputs' alignment for 16-byte copies, and the walk over a chain in chunks of tokens staged into
// two shared-memory buffers, the next chunk's copies in flight while the current one is applied.
#pragma once

#include "async_copy.cuh"
#include "ggml_ext_gdn_chain_cuda.cuh"

#include <cstdint>

// q, k and v rows (and s0, and the state out when written) start on 16 bytes: cp_async_16 and
// float4 loads take them.
inline bool gdn_rows_aligned16(const GdnChainArgs & a, bool state_out) {
    auto aligned = [](const void * p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
    return a.sq1 % 4 == 0 && a.sq2 % 4 == 0 && a.sq3 % 4 == 0 && a.sv1 % 4 == 0 && a.sv2 % 4 == 0 && a.sv3 % 4 == 0 &&
           aligned(a.q) && aligned(a.k) && aligned(a.v) && aligned(a.s0) && (!state_out || aligned(a.state));
}

// Tokens of the chunk at t0 of a chain of n (kChunk, or fewer for the last; <= 0 past the end).
template <int kChunk>
__device__ __forceinline__ int gdn_chunk_tokens(const int64_t n, const int64_t t0) {
    return (int)(n - t0 < kChunk ? n - t0 : kChunk);
}

// At a chunk's start: stage_next() issues the next chunk's copies (one commit group) when there is
// one (tn1 > 0), then the thread waits for the current chunk's copies; a barrier must follow.
template <class StageNext>
__device__ __forceinline__ void gdn_stage_next_wait_this(const int tn1, StageNext && stage_next) {
    if (tn1 > 0) {
        stage_next();
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
}
