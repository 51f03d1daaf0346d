#include "ggml_ext.h"

#include <cmath>

namespace ggml_ext {

std::vector<float> hadamard(int n) {
    std::vector<float> h((size_t)n * n, 0.0f);
    h[0] = 1.0f / std::sqrt((float)n);
    // Sylvester construction: [[H, H], [H, -H]], doubling the filled block each pass.
    for (int s = 1; s < n; s *= 2) {
        for (int i = 0; i < s; ++i) {
            for (int j = 0; j < s; ++j) {
                const float v = h[(size_t)i * n + j];
                h[(size_t)(i + s) * n + j] = v;
                h[(size_t)i * n + j + s] = v;
                h[(size_t)(i + s) * n + j + s] = -v;
            }
        }
    }
    return h;
}

int hadamard_size_for(int64_t head_dim) {
    if (head_dim % 64 != 0) return 0;
    int n = 64;
    while (head_dim % (2 * n) == 0) n *= 2;
    return n;
}

}  // namespace ggml_ext
