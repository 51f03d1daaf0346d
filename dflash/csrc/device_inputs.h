// Graph inputs kept in the main device's memory and written by copies queued on its stream.
//
// Left to the scheduler, a graph's inputs live in (pinned) host memory and every compute uploads
// each of them with a device synchronisation and a synchronous copy: 28 synchronisations and 15
// copies in a chain step of the trained pair on the H200 (kernel_profile.py's runtime calls,
// session 16). Inputs allocated here are the device's own tensors: the scheduler uploads nothing,
// and set_input() queues the copy on the stream the graph runs on (no wait; the copy is ordered
// before the graph and after the previous one).
//
// On by default (DFLASH_DEVICE_INPUTS=0 starts it off): on the H200 the trained pair's chain step
// went from 28 synchronisations to 3 and 1.27 to 1.16 ms, its decoding 8-20% faster in every mode
// (session 17). Graphs whose inputs need more than kDeviceInputsMaxBytes (a long context's
// prefill mask) keep the scheduler's path; the memory plan counts that much device memory per
// engine when it is on.
#pragma once

#include "ggml-backend.h"

#include <cstddef>

namespace dflash {

constexpr size_t kDeviceInputsMaxBytes = size_t(8) << 20;

bool device_inputs_enabled();

class DeviceInputs {
  public:
    DeviceInputs() = default;
    DeviceInputs(const DeviceInputs &) = delete;
    DeviceInputs & operator=(const DeviceInputs &) = delete;
    ~DeviceInputs() { release(); }

    // Allocates every not yet allocated input tensor of gf (flagged GGML_TENSOR_FLAG_INPUT) in one
    // buffer of buft, before the scheduler allocates the graph. False, with nothing allocated, when
    // they need more than max_bytes or the buffer cannot be had.
    bool allocate(ggml_cgraph * gf, ggml_backend_buffer_type_t buft, size_t max_bytes);
    void release();
    bool allocated() const { return buf_ != nullptr; }

  private:
    ggml_backend_buffer_t buf_ = nullptr;
};

// Writes bytes into input t: queued on upload's stream when upload is set (t in its memory), else
// ggml_backend_tensor_set.
void set_input(ggml_backend_t upload, ggml_tensor * t, const void * data, size_t bytes);

}  // namespace dflash
