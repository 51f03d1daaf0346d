// Q8_0's mma.sync GEMM forms: a file a form of a weight type, so that a build compiles them in
// parallel (gemm_mma_forms.cuh).
#include "gemm_mma_run.cuh"

template mma_forms::MmaRan mma_forms::run_mma<gemm_kq::Q80>(const Operands &, const MmaForm &);
