// A CPU emulator of the part of CUDA that ggml_ext's kernels use, so that their logic (indexing,
// fragment layouts, barriers, tails) is tested where there is no GPU: in CI. Kernel sources
// compile unchanged as C++ with -DDFLASH_CUDA_EMU; launches go through DFLASH_LAUNCH
// (kernels/launch.cuh) and inline PTX through wrappers with an emulated branch.
//
// Each CUDA thread of a block runs as a fiber on one OS thread; a fiber runs until it reaches a
// barrier (__syncthreads, __syncwarp, a shuffle, a warp-wide mma), blocks run one after another,
// so __shared__ is plain static storage. Warp-collective calls check that the lanes they name
// all arrive (a missing lane is reported as a deadlock, as it would hang or be undefined on a
// GPU). Not modelled: timing, races inside a barrier interval, memory ordering, bank conflicts,
// the hardware's rounding of fast-math transcendentals and of tensor-core f16 sums.
#pragma once

#ifndef DFLASH_CUDA_EMU
#error "cuda_emu.h is the CPU emulator: build with -DDFLASH_CUDA_EMU"
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

// ---- keywords ----------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __shared__ static
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

// ---- vector types --------------------------------------------------------------------------------
struct alignas(8) int2 {
    int x, y;
};
struct alignas(16) int4 {
    int x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
inline int2 make_int2(int x, int y) { return {x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

// ---- half precision (IEEE binary16, round to nearest even) ---------------------------------------
struct __half {
    uint16_t bits;
};
struct alignas(4) __half2 {
    __half x, y;
};
using half = __half;
using half2 = __half2;

namespace cuda_emu {
uint16_t float_to_half_bits(float f);
float half_bits_to_float(uint16_t h);
}  // namespace cuda_emu

inline __half __float2half_rn(float f) { return {cuda_emu::float_to_half_bits(f)}; }
inline __half __float2half(float f) { return __float2half_rn(f); }
inline float __half2float(__half h) { return cuda_emu::half_bits_to_float(h.bits); }
inline __half __ushort_as_half(unsigned short u) { return {u}; }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
inline float2 __half22float2(__half2 h) { return {__half2float(h.x), __half2float(h.y)}; }
inline __half2 __floats2half2_rn(float lo, float hi) { return {__float2half_rn(lo), __float2half_rn(hi)}; }
inline __half2 __float22half2_rn(float2 f) { return __floats2half2_rn(f.x, f.y); }
inline __half2 __hsub2(__half2 a, __half2 b) {  // each half's difference, rounded once
    return {__float2half_rn(__half2float(a.x) - __half2float(b.x)),
            __float2half_rn(__half2float(a.y) - __half2float(b.y))};
}
inline __half2 __hmul2(__half2 a, __half2 b) {  // each half's product, rounded once (exact in float)
    return {__float2half_rn(__half2float(a.x) * __half2float(b.x)),
            __float2half_rn(__half2float(a.y) * __half2float(b.y))};
}
inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) {  // a * b + c, each rounded once (in double: exact)
    auto one = [](__half x, __half y, __half z) {
        return __float2half_rn((float)((double)__half2float(x) * __half2float(y) + __half2float(z)));
    };
    return {one(a.x, b.x, c.x), one(a.y, b.y, c.y)};
}
inline float __low2float(__half2 h) { return __half2float(h.x); }
inline float __high2float(__half2 h) { return __half2float(h.y); }

// ---- bfloat16 (the top 16 bits of a float) --------------------------------------------------------
struct __nv_bfloat16 {
    uint16_t bits;
};
using nv_bfloat16 = __nv_bfloat16;
inline float __bfloat162float(__nv_bfloat16 b) {
    const uint32_t u = (uint32_t)b.bits << 16;
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
}

// ---- arithmetic intrinsics -----------------------------------------------------------------------
// Build the emulated code with -ffp-contract=off: these are single IEEE operations, as on the GPU.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fmaf(a, b, c); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __expf(float a) { return std::exp(a); }
inline float __logf(float a) { return std::log(a); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float a) { return a < 0.0f ? 0.0f : a > 1.0f ? 1.0f : a; }
inline float rsqrtf(float a) { return 1.0f / std::sqrt(a); }
inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}
inline int __float_as_int(float f) {
    int i;
    std::memcpy(&i, &f, 4);
    return i;
}
inline unsigned __float_as_uint(float f) { return (unsigned)__float_as_int(f); }
inline float __uint_as_float(unsigned u) { return __int_as_float((int)u); }

// Four signed (or unsigned) byte products added to c.
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
inline unsigned __dp4a(unsigned a, unsigned b, unsigned c) {
    for (int i = 0; i < 4; ++i) c += ((a >> (8 * i)) & 0xFF) * ((b >> (8 * i)) & 0xFF);
    return c;
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
    return (unsigned)((((uint64_t)hi << 32) | lo) >> (shift & 31));
}
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned shift) {
    return (unsigned)(((((uint64_t)hi << 32) | lo) << (shift & 31)) >> 32);
}
// Byte i of the result: byte (s >> 4i) & 7 of the 8 bytes {y, x} (x bytes 0..3, y bytes 4..7).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const uint64_t v = ((uint64_t)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
    return r;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
template <typename T>
inline T __ldg(const T * p) {
    return *p;
}

// CUDA's min/max overloads for mixed integer types.
template <typename A, typename B>
inline std::common_type_t<A, B> min(A a, B b) {
    return b < a ? b : a;
}
template <typename A, typename B>
inline std::common_type_t<A, B> max(A a, B b) {
    return a < b ? b : a;
}

// ---- threads, barriers, warp exchange ------------------------------------------------------------
namespace cuda_emu {

constexpr int kWarpSize = 32;

uint3 & thread_idx();
uint3 & block_idx();
dim3 & block_dim();
dim3 & grid_dim();
int lane();

void syncthreads();
// __syncthreads_or: a block barrier that returns whether any thread's pred was nonzero
int syncthreads_or(int pred);
void syncwarp(unsigned mask);
// All-gather among the lanes of `mask` (the caller's lane included): each writes `bytes` (<= 64)
// of `mine`; afterwards all[l] holds lane l's bytes for every l in mask. A warp barrier on both
// sides, so a lane that does not arrive is reported.
void warp_all_gather(unsigned mask, const void * mine, void * all, size_t bytes);

template <typename T>
T shuffle(unsigned mask, T v, int src_lane) {
    static_assert(sizeof(T) <= 64 && std::is_trivially_copyable_v<T>, "shuffle of a small trivial type");
    T all[kWarpSize];
    warp_all_gather(mask, &v, all, sizeof(T));
    if (src_lane < 0 || src_lane >= kWarpSize || !((mask >> src_lane) & 1u)) return v;  // undefined on a GPU
    return all[src_lane];
}

[[noreturn]] void fail(const char * what);

// cp.async of 16 bytes into shared memory: queued in the calling thread's open group; commit
// closes the group; wait(n) lands every group but the newest n. Until then the destination holds
// poison (0x7B bytes), so a read before the wait, or of a stage a copy was issued into too soon,
// computes something else, as it may on a GPU.
void cp_async_16(void * dst, const void * src);
void cp_async_commit();
void cp_async_wait(int n);
// fence.proxy.async: the calling thread's landed cp.async writes become visible to the async proxy
// (wgmma's reads of B). A wgmma that reads 16 bytes a cp.async wrote, before the thread that
// issued the copy fenced after its wait, fails (on a GPU it may read stale bytes).
void fence_proxy_async();

// Runs kernel(args...) over grid x block threads, blocks one after another.
void run_grid(dim3 grid, dim3 block, const std::function<void()> & body);

// A launch's dynamic shared memory (DFLASH_DYNAMIC_SMEM, kernels/launch.cuh): `bytes` for the
// next run_grid, refilled with 0xFF bytes (NaN floats) before each block, as a block's shared
// memory starts as junk.
void set_dynamic_smem(size_t bytes);
void * dynamic_smem();

// DFLASH_LAUNCH(grid, block, smem, stream, kernel)(args...): arguments converted to the kernel's
// parameter types and copied for every thread, as a CUDA launch does.
template <typename... P>
struct Launch {
    void (*fn)(P...);
    dim3 grid, block;
    template <typename... A>
    void operator()(A &&... a) const {
        const std::tuple<std::decay_t<P>...> args(std::forward<A>(a)...);
        run_grid(grid, block, [&] {
            auto local = args;
            std::apply(fn, local);
        });
    }
};
template <typename... P>
Launch<P...> launch(dim3 grid, dim3 block, size_t smem, void * stream, void (*fn)(P...)) {
    (void)stream;
    set_dynamic_smem(smem);
    return {fn, grid, block};
}

// The warp-wide tensor-core products ggml_ext uses (PTX mma.sync, row.col), with the PTX fragment
// layouts: g = lane / 4, t = lane % 4.
// m16n8k32 s8: A a0 (g, 4t..4t+3), a1 (g+8, 4t..), a2 (g, 16+4t..), a3 (g+8, 16+4t..);
// B b0 (k 4t..4t+3, n g), b1 (k 16+4t.., n g); C c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1).
void mma_m16n8k32_s8(int (&c)[4], const int (&a)[4], const int (&b)[2]);
// m16n8k16 s8: A a0 (g, 4t..4t+3), a1 (g+8, 4t..); B (k 4t..4t+3, n g); C as above.
void mma_m16n8k16_s8(int (&c)[4], const int (&a)[2], int b);
// m16n8k16 f16 -> f32: A a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 8+2t..), a3 (g+8, 8+2t..);
// B b0 (k 2t..2t+1, n g), b1 (k 8+2t.., n g); C as above. Products summed in double, then rounded.
void mma_m16n8k16_f16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);
// Hopper's wgmma.mma_async m64nNk32 .s32.u8.s8 with A (u8) in registers and B (s8) in the dynamic
// shared memory (gemm_q4k_wgmma.cuh's uses): warp w of the warpgroup holds rows 16w.. in
// mma_m16n8k32_s8's A layout; desc is PTX's matrix descriptor without swizzle (bits 0-13 the
// address / 16, 16-29 the leading (K) byte offset / 16, 32-45 the stride (N) byte offset / 16), B
// in core matrices of 8 columns x 16 bytes of K; d per 8-column tile i: d[4i..4i+3] in mma's C
// layout; accumulate false overwrites d. Asynchronous as on the GPU: the call only records the
// product; wgmma_commit closes a group and wgmma_wait(n) runs the groups older than the newest n
// (wgmma.wait_group n), each warp for its own rows, reading a, d and B then. So a kernel that reads
// d, or changes a or B, before its wait computes something else here, as it would on the GPU;
// a thread that ends with products not waited for fails; so does one that reads B bytes a cp.async
// wrote with no fence_proxy_async by its issuer since (wgmma.fence and the warpgroup's joint
// arrival are not modelled).
void wgmma_m64k32_u8s8(int n, int * d, const int (&a)[4], uint64_t desc, bool accumulate);
// The same for .f32.f16.f16 m64nNk16 (B K-major): A in mma_m16n8k16_f16's layout, B's core
// matrices 8 columns x 8 halves; products summed in double, then rounded.
void wgmma_m64k16_f16(int n, float * d, const uint32_t (&a)[4], uint64_t desc, bool accumulate);
void wgmma_commit();
void wgmma_wait(int n);
// The offset of p in the launch's dynamic shared memory (what a shared-space address is there).
uint32_t shared_offset(const void * p);

// Hopper's mbarriers (PTX mbarrier.*, CTA scope), bulk copies into shared memory that complete on
// one (cp.async.bulk ... mbarrier::complete_tx::bytes) and named barriers (bar.sync / bar.arrive):
// what a warp-specialized pipeline (a producer warp staging, consumer warps computing) is built of;
// kernels reach them through kernels/mbarrier.cuh. An mbarrier's state is kept aside, keyed by its
// address (init resets it): `count` arrivals and the transaction bytes expected by arrive's tx
// complete a phase; try_wait_parity(p) is true once the phase of parity p has completed (the current
// phase's parity differs), so a wait on parity 1 before the first phase passes. A bulk copy poisons
// its destination at issue and lands when a thread next tests its barrier, counting its bytes then:
// a read of a stage before the wait for its barrier computes something else here, as it may on a
// GPU. Its bytes need no proxy fence before a wgmma reads them (the async proxy wrote them). A wait
// that nothing can complete is reported as a deadlock.
void mbarrier_init(uint64_t * bar, unsigned count);
// One arrival, after adding tx bytes to the phase's expected transaction count; the phase's parity.
unsigned mbarrier_arrive(uint64_t * bar, unsigned tx_bytes);
bool mbarrier_try_wait_parity(uint64_t * bar, unsigned parity);
void mbarrier_wait_parity(uint64_t * bar, unsigned parity);
void cp_async_bulk_g2s(void * dst, const void * src, unsigned bytes, uint64_t * bar);
// cp.async.bulk.tensor.2d (tile mode) from a row-major byte matrix of `rows` rows of row_bytes: the
// box of box_rows rows x box_bytes at byte x of row y into dst (128-byte aligned), each row as a
// bulk copy above, rows past the matrix as zeros; the box's bytes complete on bar. A box that
// crosses a row's end is not modelled (it fails).
void cp_async_bulk_tensor_2d_g2s(void * dst, const char * base, int64_t row_bytes, int rows, int box_bytes,
                                 int box_rows, int x, int y, uint64_t * bar);
// cp.async.mbarrier.arrive.noinc: an arrival on bar once every cp.async the calling thread issued so
// far has landed (the barrier's count must include it). Those copies land, and the arrival counts,
// when a thread next tests the barrier. They are generic-proxy writes that no thread can fence, so
// a wgmma reading them fails (only a bulk copy's bytes may reach one without a fence).
void cp_async_mbarrier_arrive_noinc(uint64_t * bar);
// bar.sync id, n (id 1..15: 0 is __syncthreads'): waits until n threads arrived at id; bar.arrive
// counts the caller without waiting. Every round of one id names the same n.
void named_barrier_sync(int id, int nthreads);
void named_barrier_arrive(int id, int nthreads);

}  // namespace cuda_emu

#define threadIdx (::cuda_emu::thread_idx())
#define blockIdx (::cuda_emu::block_idx())
#define blockDim (::cuda_emu::block_dim())
#define gridDim (::cuda_emu::grid_dim())

inline void __syncthreads() { cuda_emu::syncthreads(); }
inline int __syncthreads_or(int pred) { return cuda_emu::syncthreads_or(pred); }
inline void __threadfence() {}  // fibers take turns on one OS thread: memory is always in order
template <typename T>
T __ldcg(const T * p) {
    return *p;
}
// atomics: a fiber runs until it reaches a barrier, so a read-modify-write is never interleaved
template <typename T>
T atomicAdd(T * p, T v) {
    const T old = *p;
    *p = old + v;
    return old;
}
inline size_t __cvta_generic_to_shared(const void * p) { return cuda_emu::shared_offset(p); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { cuda_emu::syncwarp(mask); }

template <typename T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    const int l = cuda_emu::lane();
    return cuda_emu::shuffle(mask, v, (l / width) * width + src % width);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    const int l = cuda_emu::lane(), s = l ^ lane_mask;
    return cuda_emu::shuffle(mask, v, s / width == l / width ? s : l);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    const int l = cuda_emu::lane(), s = l + (int)delta;
    return cuda_emu::shuffle(mask, v, s / width == l / width ? s : l);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    const int l = cuda_emu::lane(), s = l - (int)delta;
    return cuda_emu::shuffle(mask, v, s >= 0 && s / width == l / width ? s : l);
}

// ---- the host API ----------------------------------------------------------------------------------
enum cudaError_t { cudaSuccess = 0, cudaErrorMemoryAllocation = 2 };
enum cudaMemcpyKind {
    cudaMemcpyHostToHost,
    cudaMemcpyHostToDevice,
    cudaMemcpyDeviceToHost,
    cudaMemcpyDeviceToDevice,
    cudaMemcpyDefault
};
using cudaStream_t = void *;
using cudaEvent_t = struct cuda_emu_event *;

cudaError_t cudaMalloc(void ** p, size_t bytes);  // filled with 0xFF bytes (NaN floats), as fresh memory is junk
template <typename T>
cudaError_t cudaMalloc(T ** p, size_t bytes) {
    return cudaMalloc(reinterpret_cast<void **>(p), bytes);
}
cudaError_t cudaFree(void * p);
cudaError_t cudaMemcpy(void * dst, const void * src, size_t bytes, cudaMemcpyKind);
cudaError_t cudaMemcpyAsync(void * dst, const void * src, size_t bytes, cudaMemcpyKind, cudaStream_t = nullptr);
cudaError_t cudaMemset(void * p, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void * p, int value, size_t bytes, cudaStream_t = nullptr);
cudaError_t cudaGetLastError();
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaStreamSynchronize(cudaStream_t);
const char * cudaGetErrorString(cudaError_t);
cudaError_t cudaEventCreate(cudaEvent_t * e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float * ms, cudaEvent_t a, cudaEvent_t b);
cudaError_t cudaEventDestroy(cudaEvent_t e);
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
template <typename F>
cudaError_t cudaFuncSetAttribute(F *, cudaFuncAttribute, int) {  // no limit to raise here
    return cudaSuccess;
}
template <typename F>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int * blocks, F *, int, size_t) {  // one a multiprocessor
    *blocks = 1;
    return cudaSuccess;
}
