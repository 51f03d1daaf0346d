// DFLASH_LAUNCH(grid, block, smem, stream, kernel)(args...): a kernel launch that also builds for
// the CPU emulator (ggml_ext/emu/cuda_emu.h, -DDFLASH_CUDA_EMU), where the <<<...>>> syntax does
// not exist. The kernel comes last so that template arguments may hold commas.
#pragma once

#ifdef DFLASH_CUDA_EMU
#define DFLASH_LAUNCH(grid, block, smem, stream, ...) ::cuda_emu::launch(grid, block, smem, stream, __VA_ARGS__)
#else
#define DFLASH_LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<grid, block, smem, stream>>>
#endif

// DFLASH_DYNAMIC_SMEM(name): `char * name`, the launch's dynamic shared memory (16-byte aligned).
// dflash_allow_dynamic_smem(kernel, bytes): what a launch with more than 48 KB of it needs first
// (per kernel and device; a no-op on the emulator).
#ifdef DFLASH_CUDA_EMU
#define DFLASH_DYNAMIC_SMEM(name) char * name = ::cuda_emu::dynamic_smem()
template <typename K>
inline void dflash_allow_dynamic_smem(K, int) {}
#else
#define DFLASH_DYNAMIC_SMEM(name) extern __shared__ __align__(16) char name[]
template <typename K>
inline void dflash_allow_dynamic_smem(K kernel, int bytes) {
    // a failure is also the launch's error (cudaGetLastError after it)
    if (bytes > 48 * 1024) (void)cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}
#endif
