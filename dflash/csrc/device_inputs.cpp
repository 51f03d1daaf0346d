#include "device_inputs.h"

#include "errors.h"
#include "ggml-alloc.h"

#include <cstdlib>
#include <unordered_set>
#include <vector>

namespace dflash {

bool device_inputs_enabled() {
    static const bool on = [] {
        const char * e = std::getenv("DFLASH_DEVICE_INPUTS");
        return !(e && e[0] == '0');
    }();
    return on;
}

namespace {

// The graph's inputs that nothing has allocated yet, each once, in first-use order.
std::vector<ggml_tensor *> unallocated_inputs(ggml_cgraph * gf) {
    std::vector<ggml_tensor *> out;
    std::unordered_set<ggml_tensor *> seen;
    auto visit = [&](ggml_tensor * t) {
        for (; t; t = t->view_src) {
            if ((t->flags & GGML_TENSOR_FLAG_INPUT) && !t->view_src && !t->data && !t->buffer &&
                seen.insert(t).second) {
                out.push_back(t);
            }
        }
    };
    for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) {
        ggml_tensor * node = ggml_graph_node(gf, i);
        visit(node);
        for (ggml_tensor * s : node->src) visit(s);
    }
    return out;
}

}  // namespace

bool DeviceInputs::allocate(ggml_cgraph * gf, ggml_backend_buffer_type_t buft, size_t max_bytes) {
    release();
    const std::vector<ggml_tensor *> inputs = unallocated_inputs(gf);
    const size_t align = ggml_backend_buft_get_alignment(buft);
    size_t total = 0;
    for (ggml_tensor * t : inputs) total += GGML_PAD(ggml_backend_buft_get_alloc_size(buft, t), align);
    if (inputs.empty() || total > max_bytes) return false;
    buf_ = ggml_backend_buft_alloc_buffer(buft, total);
    if (!buf_) return false;
    ggml_backend_buffer_set_usage(buf_, GGML_BACKEND_BUFFER_USAGE_COMPUTE);
    ggml_tallocr alloc = ggml_tallocr_new(buf_);
    for (ggml_tensor * t : inputs) {
        // sized above, so this cannot run out; a failure would leave tensors pointing into a
        // buffer about to be freed
        if (ggml_tallocr_alloc(&alloc, t) != GGML_STATUS_SUCCESS) {
            throw EngineError("could not place a graph input in its device buffer");
        }
    }
    return true;
}

void DeviceInputs::release() {
    if (buf_) ggml_backend_buffer_free(buf_);
    buf_ = nullptr;
}

void set_input(ggml_backend_t upload, ggml_tensor * t, const void * data, size_t bytes) {
    if (upload) {
        ggml_backend_tensor_set_async(upload, t, data, 0, bytes);
    } else {
        ggml_backend_tensor_set(t, data, 0, bytes);
    }
}

}  // namespace dflash
