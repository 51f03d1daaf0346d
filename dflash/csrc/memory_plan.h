// Every buffer the engine will allocate, sized before anything is allocated, and checked
// against the device's free memory so that a configuration that cannot fit is refused at
// load with the numbers instead of failing mid-request.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace dflash {

struct MemoryPlan {
    std::vector<std::pair<std::string, size_t>> items;  // name -> bytes
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    std::string device;

    void add(const std::string & name, size_t bytes) { items.emplace_back(name, bytes); }
    size_t sum() const;
    std::string describe() const;
    // Throws ModelLoadError with the breakdown when the plan exceeds the free memory (with a margin).
    void check() const;
};

}  // namespace dflash
