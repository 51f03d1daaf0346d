// Backend selection: the best available device (CUDA when built and present) plus the CPU.
#pragma once

#include "ggml-backend.h"

#include <string>
#include <vector>

namespace dflash {

// One result to copy back after a graph: bytes from the start of tensor into dst.
struct Readback {
    const ggml_tensor * tensor;
    void * dst;
    size_t bytes;
};

// Computes gf and copies reads back with a single synchronisation: the copies are queued on the
// stream behind the graph (each read otherwise waits for the device on its own, which on a tiny
// model's millisecond step is a visible share). False when the backend failed.
bool compute_and_read(ggml_backend_sched_t sched, ggml_cgraph * gf, const std::vector<Readback> & reads);

// Where the engine's graph computes spend host time, summed since the last reset (diagnostics for
// tools/device/kernel_profile.py: a step's wall time less these is graph preparation and the loop's
// own work). launch: ggml_backend_sched_graph_compute_async (scheduling, input uploads, the CUDA
// graph or kernel launches); wait: the synchronisation and the result copies behind it; sync: the
// commit graphs, computed synchronously (launch and wait in one). One thread.
struct ComputeTiming {
    double launch_ms = 0, wait_ms = 0, sync_ms = 0;
    int64_t graphs = 0;
};
ComputeTiming & compute_timing();

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

    // Backends and buffer types for a scheduler: the main device first, then the CPU (when the
    // main device is a GPU). Graph inputs live with the CPU backend; on a GPU they get pinned
    // host memory (as llama.cpp does), so the scheduler's uploads are fast, asynchronous copies.
    std::vector<ggml_backend_t> sched_backends() const;
    std::vector<ggml_backend_buffer_type_t> sched_bufts() const;
    // Creates a scheduler over sched_backends() for graphs of up to max_nodes nodes.
    ggml_backend_sched_t new_sched(size_t max_nodes) const;

    std::string description() const;
    // Free and total memory of the main device in bytes.
    void memory(size_t & free, size_t & total) const;
};

}  // namespace dflash
