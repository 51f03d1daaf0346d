#include "kv_types.h"

#include "errors.h"

namespace dflash {

ggml_type parse_kv_type(const std::string & name) {
    if (name == "f16") return GGML_TYPE_F16;
    if (name == "q8_0") return GGML_TYPE_Q8_0;
    if (name == "q4_0") return GGML_TYPE_Q4_0;
    if (name == "bf16") return GGML_TYPE_BF16;
    if (name == "f32") return GGML_TYPE_F32;
    throw InvalidParameter("unknown KV cache type '" + name + "' (expected one of f16, q8_0, q4_0, bf16, f32)");
}

bool kv_type_rotated(ggml_type t) { return ggml_is_quantized(t); }

}  // namespace dflash
