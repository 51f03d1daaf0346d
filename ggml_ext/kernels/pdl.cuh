// Programmatic dependent launch (PDL, sm_90 and newer) for ggml_ext's matmul kernels: a kernel
// launched with DFLASH_LAUNCH_PDL may start while the kernel before it on the stream is still
// running, so its launch and its first weight loads overlap that kernel's tail.
//
// The contract of a kernel launched this way:
// - pdl_wait() before it reads anything an earlier kernel wrote and before its first global write
//   (griddepcontrol.wait returns when the earlier grid has completed and its writes are visible);
//   only the weights, which no kernel of a graph writes, may be read before it.
// - no `const T * __restrict__` for what an earlier kernel wrote: the compiler may read such memory
//   through the non-coherent path ahead of the wait (ggml-cuda drops __restrict__ with PDL for the
//   same reason).
// - pdl_trigger() once the kernel no longer needs the GPU to itself: the next PDL kernel may then
//   launch and wait for this one in its own pdl_wait().
// ggml-cuda's own kernels follow the same contract (ggml_cuda_pdl_sync / ggml_cuda_pdl_lc), so any
// order of theirs and ours is safe.
//
// Where it is on (dflash_pdl::kDefaultKinds), from the 27B's kernels a step on the H200 with each
// kind alone and together (bench/results/h200-s26-27b-kernels-pdl-*.json, time some kernel runs):
// the decode step 7.55 ms against 7.77 without PDL, the 16-token forward 9.25 against 9.35; the
// GEMM above 16 columns was slower with it at 32 tokens (13.54 against 12.88 with the GEMM
// enrolled, 13.97 with its quantizer too) and at 64 faster with the GEMM alone (18.81 against
// 19.10; 19.81 with its quantizer too). Session 27 split those kinds (17..32 and 33..64 columns,
// the quantizers apart; h200-s27-27b-kernels-f1-*-4ed7d11.json, one run): with the GEMM of 33..64
// columns enrolled the 64-token forward took 18.62 ms against 18.98 (32 tokens 12.73 against
// 12.73), with the 17..32 one too 32 tokens took 13.22, with the wide quantizers too 64 tokens took
// 19.69. So the GEMV, the GEMM up to 16 columns and the GEMM kernel of 33..64 columns.
// DFLASH_PDL=MASK enrolls the kinds in MASK instead (0: none).
#pragma once

#include "launch.cuh"

#ifndef DFLASH_CUDA_EMU
#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>
#endif

__device__ __forceinline__ void pdl_wait() {
#if !defined(DFLASH_CUDA_EMU) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if !defined(DFLASH_CUDA_EMU) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

namespace dflash_pdl {
// The kernels DFLASH_LAUNCH_PDL launches, by kind (DFLASH_PDL's bits): the GEMV and its quantizer
// (1..8 columns), the GEMM and its quantizer up to 16 padded columns, the GEMM of 17..32 and of
// 33..64 padded columns, and the quantizers of those.
enum Kind : unsigned { kGemv = 1, kGemmNarrow = 2, kGemmMid = 4, kGemmWide = 8, kQuantWide = 16 };
constexpr unsigned kDefaultKinds = kGemv | kGemmNarrow | kGemmWide;

// The GEMM kernel's kind for np padded columns.
inline unsigned gemm_kind(int np) { return np <= 16 ? kGemmNarrow : np <= 32 ? kGemmMid : kGemmWide; }
// The kind of the GEMM's activation quantizer for np padded columns.
inline unsigned quant_kind(int np) { return np <= 16 ? kGemmNarrow : kQuantWide; }
}  // namespace dflash_pdl

#ifdef DFLASH_CUDA_EMU
#define DFLASH_LAUNCH_PDL(kind, grid, block, smem, stream, ...) DFLASH_LAUNCH(grid, block, smem, stream, __VA_ARGS__)
#else
namespace dflash_pdl {

inline bool env_enabled(unsigned kind) {
    static const unsigned mask = [] {
        const char * e = std::getenv("DFLASH_PDL");
        return e ? (unsigned)std::atoi(e) : kDefaultKinds;
    }();
    return (mask & kind) != 0;
}

// Whether the code the current device runs for `kernel` was compiled for sm_90 or newer: only there
// do pdl_wait / pdl_trigger exist (a kernel JIT-compiled from older PTX has no wait in it).
inline bool kernel_has_pdl(const void * kernel) {
    static std::mutex mu;
    static std::map<std::pair<const void *, int>, bool> cache;
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return false;
    std::lock_guard<std::mutex> lock(mu);
    const auto key = std::make_pair(kernel, device);
    const auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    cudaFuncAttributes attr = {};
    const bool got = cudaFuncGetAttributes(&attr, kernel) == cudaSuccess;
    if (!got) (void)cudaGetLastError();  // not left for the next error check: the plain launch reports it
    const bool ok = got && attr.ptxVersion >= 90 && attr.binaryVersion >= 90;
    cache.emplace(key, ok);
    return ok;
}

struct Launch {
    unsigned kind;
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;

    template <typename... P>
    struct Bound {
        const Launch & l;
        void (*kernel)(P...);

        template <typename... A>
        void operator()(A &&... args) const {
#if CUDART_VERSION >= 12030  // the launch attribute and griddepcontrol's PTX
            if (env_enabled(l.kind) && kernel_has_pdl(reinterpret_cast<const void *>(kernel))) {
                cudaLaunchAttribute attr[1];
                attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                attr[0].val.programmaticStreamSerializationAllowed = 1;
                cudaLaunchConfig_t cfg = {};
                cfg.gridDim = l.grid;
                cfg.blockDim = l.block;
                cfg.dynamicSmemBytes = l.smem;
                cfg.stream = l.stream;
                cfg.attrs = attr;
                cfg.numAttrs = 1;
                cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
                return;
            }
#endif
            // clang-format off
            kernel<<<l.grid, l.block, l.smem, l.stream>>>(std::forward<A>(args)...);
            // clang-format on
        }
    };

    template <typename... P>
    Bound<P...> operator()(void (*kernel)(P...)) const {
        return {*this, kernel};
    }
};

}  // namespace dflash_pdl

// DFLASH_LAUNCH's form for kernels that keep the contract above.
#define DFLASH_LAUNCH_PDL(kind, grid, block, smem, stream, ...) \
    ::dflash_pdl::Launch{(kind), dim3(grid), dim3(block), (size_t)(smem), (stream)}(__VA_ARGS__)
#endif
