// Global loads of weights that bypass L1: weights are read once per product, so L1 is left to the
// activations, which every row reuses (ggml_ext's GEMV and tensor-core GEMM).
#pragma once

#include <cstdint>

#ifdef DFLASH_CUDA_EMU  // the CPU emulator (ggml_ext/emu): plain loads
#include <cstring>

template <typename T>
inline T load_stream_emu(const void * p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
}
inline uint4 load_stream_16(const void * p) { return load_stream_emu<uint4>(p); }
inline uint32_t load_stream_4(const void * p) { return load_stream_emu<uint32_t>(p); }
inline uint2 load_stream_8(const void * p) { return load_stream_emu<uint2>(p); }
inline uint32_t load_stream_2(const void * p) { return load_stream_emu<uint16_t>(p); }
#else

__device__ __forceinline__ uint4 load_stream_16(const void * p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ uint32_t load_stream_4(const void * p) {
    uint32_t v;
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ uint2 load_stream_8(const void * p) {
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

__device__ __forceinline__ uint32_t load_stream_2(const void * p) {
    unsigned short v;
    asm volatile("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}
#endif  // DFLASH_CUDA_EMU
