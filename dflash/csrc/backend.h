// Backend selection: the best available device (CUDA when built and present) plus the CPU.
#pragma once

#include "ggml-backend.h"

#include <string>
#include <vector>

namespace dflash {

struct Backends {
    // n_gpu_layers == 0 forces the CPU; otherwise the first GPU device when there is one.
    Backends(int n_gpu_layers, int n_threads);
    ~Backends();
    Backends(const Backends &) = delete;
    Backends & operator=(const Backends &) = delete;

    ggml_backend_t main = nullptr;  // where weights, caches and compute live
    ggml_backend_t cpu = nullptr;
    ggml_backend_dev_t main_dev = nullptr;
    ggml_backend_buffer_type_t main_buft = nullptr;
    bool is_gpu = false;
    int n_threads = 1;

    std::string description() const;
    // Free and total memory of the main device in bytes.
    void memory(size_t & free, size_t & total) const;
};

}  // namespace dflash
