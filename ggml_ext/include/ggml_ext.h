// dflash's extension layer over vendored ggml: helpers and ops that know nothing about models.
#pragma once

#include <cstdint>
#include <vector>

namespace ggml_ext {

// Orthonormal Walsh-Hadamard matrix of size n x n (n a power of two), row-major.
// H * H == I, so the same matrix rotates and un-rotates.
std::vector<float> hadamard(int n);

// Largest power-of-two rotation size >= 64 that divides head_dim (0 when none does).
int hadamard_size_for(int64_t head_dim);

}  // namespace ggml_ext
