// The CPU build's view of the fusion patterns (kernels/fusion_patterns.h), for
// TargetEngine::fusion_patterns and its tests.
#include "../kernels/fusion_patterns.h"

namespace ggml_ext {

FusionCounts count_fusion_patterns(const ggml_cgraph * g) {
    const fusion_patterns::Counts c = fusion_patterns::count(g);
    return {c.single, c.pair, c.head, c.gate, c.glu};
}

}  // namespace ggml_ext
