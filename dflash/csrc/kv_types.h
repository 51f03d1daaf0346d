// KV cache element types the engine accepts, checked before any graph is built.
#pragma once

#include "ggml.h"

#include <string>

namespace dflash {

// "f16", "q8_0", "q4_0" (and "f32", "bf16"); throws InvalidParameter for anything else.
ggml_type parse_kv_type(const std::string & name);
// Upstream rotates quantised K/V with a Walsh-Hadamard matrix (better quality, same cost);
// we do the same so logits match upstream for every KV type.
bool kv_type_rotated(ggml_type t);

}  // namespace dflash
