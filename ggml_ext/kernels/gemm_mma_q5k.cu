// Q5_K's mma.sync GEMM forms, the min term through an f16 mma (the engine's): a file a form of a
// weight type, so that a build compiles them in parallel (gemm_mma_forms.cuh).
#include "gemm_mma_run.cuh"

template mma_forms::MmaRan mma_forms::run_mma<gemm_kq::Q5KMinsMma>(const Operands &, const MmaForm &);
