// ggml_ext's k-quant GEMV for Q8_0 weights (the kernel: gemv_kquant_impl.cuh).
#include "gemv_kquant_impl.cuh"

void ggml_ext_gemv_launch_q8_0(const GemvArgs & args, const GemvShape & shape, cudaStream_t stream) {
    gemv::launch_type<gemv::Q80>(args, shape, stream);
}
