// ggml-cuda's device query, which the delta rule kernels' grid choice reads, for the standalone
// builds of tools/device (the engine links ggml-cuda instead): device 0, its multiprocessors and
// compute capability.
#pragma once

int ggml_cuda_get_device() { return 0; }

const ggml_cuda_device_info & ggml_cuda_info() {
    static ggml_cuda_device_info info = [] {
        ggml_cuda_device_info i = {};
        cudaDeviceProp p;
        cudaGetDeviceProperties(&p, 0);
        i.device_count = 1;
        i.devices[0].nsm = p.multiProcessorCount;
        i.devices[0].cc = 100 * p.major + 10 * p.minor;
        return i;
    }();
    return info;
}
