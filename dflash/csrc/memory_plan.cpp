#include "memory_plan.h"

#include "errors.h"

#include <cstdio>

namespace dflash {

static std::string mib(size_t b) {
    char s[32];
    snprintf(s, sizeof s, "%.1f MiB", b / 1048576.0);
    return s;
}

size_t MemoryPlan::sum() const {
    size_t n = 0;
    for (auto & it : items) n += it.second;
    return n;
}

std::string MemoryPlan::describe() const {
    std::string s;
    for (auto & it : items) s += it.first + " " + mib(it.second) + ", ";
    s += "total " + mib(sum()) + "; " + device + " has " + mib(free_bytes) + " free of " + mib(total_bytes);
    return s;
}

void MemoryPlan::check() const {
    // Keep a small margin for the backend's own allocations (CUDA context, cuBLAS workspace).
    const size_t margin = 256ull << 20;
    if (sum() + margin > free_bytes) {
        throw ModelLoadError("the configuration does not fit in memory: " + describe() +
                             " (a 256 MiB margin is kept); lower n_ctx, use a smaller KV type or a smaller model");
    }
}

}  // namespace dflash
