// Errors that reach Python as exceptions. Every check on user input happens before a
// ggml graph is built, so no GGML_ASSERT/abort is reachable from a bad file or request.
#pragma once

#include <stdexcept>
#include <string>

namespace dflash {

// A model file that is missing, corrupt, of the wrong architecture or does not fit.
struct ModelLoadError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A request that cannot be served as asked (bad parameter, unknown KV type, ...).
struct InvalidParameter : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A prompt (plus the tokens to generate) that does not fit in the context.
struct ContextOverflow : std::runtime_error {
    ContextOverflow(int n_tokens, int n_ctx)
        : std::runtime_error("the request needs " + std::to_string(n_tokens) + " tokens of context but n_ctx is " +
                             std::to_string(n_ctx)),
          n_tokens(n_tokens),
          n_ctx(n_ctx) {}
    int n_tokens;
    int n_ctx;
};

// Anything else that fails inside the engine (a backend error, an allocation).
struct EngineError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

}  // namespace dflash
