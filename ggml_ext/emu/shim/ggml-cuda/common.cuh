// What ggml_ext's kernels take from ggml-cuda/common.cuh, for the CPU emulator (cuda_emu.h):
// the warp size, ggml's small macros and opaque declarations of the types their host-side
// declarations name. The kernels themselves need nothing else from ggml.
#pragma once

#include "../../cuda_emu.h"

#define WARP_SIZE 32
#define GGML_UNUSED(x) (void)(x)
#define NO_DEVICE_CODE ::cuda_emu::fail("NO_DEVICE_CODE reached")

enum ggml_type : int;
struct ggml_tensor;
struct ggml_backend_cuda_context;
struct ggml_cuda_mm_fusion_args_host;
