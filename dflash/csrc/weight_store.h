// The weights of one GGUF model on the device: tensor metadata copied from the file, each
// weight's buffer type chosen (the device's "extra" types, e.g. the CPU's repacked layouts,
// where they take the weight's matmul, as upstream does), the bytes counted for the memory
// plan, then one buffer per type allocated and filled from the file.
#pragma once

#include "backend.h"

#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

struct ggml_context;
struct ggml_tensor;

namespace dflash {

class GgufFile;

using ProgressFn = std::function<void(size_t done_bytes, size_t total_bytes)>;

class WeightStore {
  public:
    WeightStore() = default;
    ~WeightStore();
    WeightStore(const WeightStore &) = delete;
    WeightStore & operator=(const WeightStore &) = delete;

    // A weight with the file tensor's shape and type; data arrives in load().
    ggml_tensor * add(const ggml_tensor * file_tensor, const std::string & name);
    // `matmul_weight` says which weights are used as the first operand of a matmul (only those
    // may go to an extra buffer type); the rest stay in the device's default type.
    void assign_buffers(const Backends & backends,
                        const std::function<bool(const ggml_tensor *, const std::string &)> & matmul_weight);
    size_t bytes() const;
    std::vector<std::string> names() const;
    void load(const GgufFile & file, const ProgressFn & progress, const std::string & what);
    // After load: one weight whose rows are those of `parts` in order, when they lie back to
    // back in one buffer of the device's default type (no repacked layout) with the same type,
    // row length and row stride (the loader places weights in the order they were added); else
    // null. It shares their memory: a matmul with it computes theirs in one product.
    ggml_tensor * stacked(const std::vector<ggml_tensor *> & parts, const std::string & name);

  private:
    ggml_context * ctx_ = nullptr;
    std::vector<std::pair<ggml_tensor *, std::string>> tensors_;  // ours -> name in the file
    std::vector<ggml_backend_buffer_type_t> buft_of_;
    ggml_backend_buffer_type_t default_buft_ = nullptr;
    size_t n_stacked_ = 0;  // stacked() views in ctx_
    std::vector<ggml_backend_buffer_t> bufs_;
};

}  // namespace dflash
