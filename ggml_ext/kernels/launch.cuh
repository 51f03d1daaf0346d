// DFLASH_LAUNCH(grid, block, smem, stream, kernel)(args...): a kernel launch that also builds for
// the CPU emulator (ggml_ext/emu/cuda_emu.h, -DDFLASH_CUDA_EMU), where the <<<...>>> syntax does
// not exist. The kernel comes last so that template arguments may hold commas.
#pragma once

#ifdef DFLASH_CUDA_EMU
#define DFLASH_LAUNCH(grid, block, smem, stream, ...) ::cuda_emu::launch(grid, block, smem, stream, __VA_ARGS__)
#else
#define DFLASH_LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<grid, block, smem, stream>>>
#endif

// DFLASH_DYNAMIC_SMEM(name): `float * name` over the block's dynamic shared memory (the launch's
// smem bytes; 16-byte aligned).
// DFLASH_DYNAMIC_SMEM_BYTES(name): `char * name` over it, 128-byte aligned on a GPU.
#ifdef DFLASH_CUDA_EMU
#define DFLASH_DYNAMIC_SMEM(name) float * name = static_cast<float *>(::cuda_emu::dynamic_smem())
#define DFLASH_DYNAMIC_SMEM_BYTES(name) char * name = static_cast<char *>(::cuda_emu::dynamic_smem())
#else
#define DFLASH_DYNAMIC_SMEM(name) extern __shared__ __align__(16) float name[]
#define DFLASH_DYNAMIC_SMEM_BYTES(name) extern __shared__ __align__(128) char name[]
#endif
