// Q4_K's mma.sync GEMM forms with the integer min sums (exact; DFLASH_MMA_MINS_INT=1): a file a
// form of a weight type, so that a build compiles them in parallel (gemm_mma_forms.cuh).
#include "gemm_mma_run.cuh"

template mma_forms::MmaRan mma_forms::run_mma<gemm_kq::Q4K>(const Operands &, const MmaForm &);
