// ggml_ext's k-quant GEMV for Q5_K weights (the kernel: gemv_kquant_impl.cuh).
#include "gemv_kquant_impl.cuh"

void ggml_ext_gemv_launch_q5_k(const GemvArgs & args, const GemvShape & shape, cudaStream_t stream) {
    gemv::launch_type<gemv::Q5K>(args, shape, stream);
}
