// The CPU build's view of rms_norm_fusion.cu's patterns (kernels/norm_fusion_patterns.h), for
// TargetEngine::norm_fusion_patterns and its tests.
#include "../kernels/norm_fusion_patterns.h"

namespace ggml_ext {

NormFusionCounts count_norm_fusion_patterns(const ggml_cgraph * g) {
    const norm_patterns::Counts c = norm_patterns::count(g);
    return {c.single, c.pair, c.head};
}

}  // namespace ggml_ext
