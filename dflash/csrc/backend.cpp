#include "backend.h"

#include "errors.h"
#include "ggml-cpu.h"

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

namespace dflash {

Backends::Backends(int n_gpu_layers, int threads) {
    n_threads = threads > 0 ? threads : (int)std::max(1u, std::thread::hardware_concurrency());
    cpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    if (!cpu) throw EngineError("could not initialise the CPU backend");
    ggml_backend_cpu_set_n_threads(cpu, n_threads);
    if (n_gpu_layers != 0) {
        for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
            ggml_backend_dev_t dev = ggml_backend_dev_get(i);
            if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_GPU) {
                main = ggml_backend_dev_init(dev, nullptr);
                if (main) {
                    main_dev = dev;
                    is_gpu = true;
                    break;
                }
            }
        }
    }
    if (!main) {
        main = cpu;
        main_dev = ggml_backend_get_device(cpu);
    }
    main_buft = ggml_backend_get_default_buffer_type(main);
}

Backends::~Backends() {
    if (main && main != cpu) ggml_backend_free(main);
    if (cpu) ggml_backend_free(cpu);
}

std::vector<ggml_backend_t> Backends::sched_backends() const {
    if (!is_gpu) return {main};
    return {main, cpu};
}

std::vector<ggml_backend_buffer_type_t> Backends::sched_bufts() const {
    if (!is_gpu) return {main_buft};
    ggml_backend_buffer_type_t host = ggml_backend_dev_host_buffer_type(main_dev);
    return {main_buft, host ? host : ggml_backend_get_default_buffer_type(cpu)};
}

ggml_backend_sched_t Backends::new_sched(size_t max_nodes) const {
    auto bks = sched_backends();
    auto bufts = sched_bufts();
    ggml_backend_sched_t s = ggml_backend_sched_new(bks.data(), bufts.data(), (int)bks.size(), max_nodes, false, true);
    if (!s) throw EngineError("could not create a graph scheduler");
    return s;
}

ComputeTiming & compute_timing() {
    static thread_local ComputeTiming t;
    return t;
}

namespace {
double now_ms() {
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}
}  // namespace

bool compute_and_read(ggml_backend_sched_t sched, ggml_cgraph * gf, const std::vector<Readback> & reads) {
    ComputeTiming & timing = compute_timing();
    const double t0 = now_ms();
    if (ggml_backend_sched_graph_compute_async(sched, gf) != GGML_STATUS_SUCCESS) return false;
    const double t1 = now_ms();
    // The device (backend 0 of our schedulers) queues copies of tensors in its own buffers; the
    // rest (host buffers, or the CPU as the device) is read once everything has finished.
    ggml_backend_t dev = ggml_backend_sched_get_backend(sched, 0);
    ggml_backend_buffer_type_t dev_buft = ggml_backend_get_default_buffer_type(dev);
    std::vector<const Readback *> later;
    for (const Readback & r : reads) {
        const ggml_tensor * base = r.tensor->view_src ? r.tensor->view_src : r.tensor;
        if (base->buffer && ggml_backend_buffer_get_type(base->buffer) == dev_buft &&
            !ggml_backend_buffer_is_host(base->buffer)) {
            ggml_backend_tensor_get_async(dev, r.tensor, r.dst, 0, r.bytes);
        } else {
            later.push_back(&r);
        }
    }
    ggml_backend_sched_synchronize(sched);
    for (const Readback * r : later) ggml_backend_tensor_get(r->tensor, r->dst, 0, r->bytes);
    timing.launch_ms += t1 - t0;
    timing.wait_ms += now_ms() - t1;
    timing.graphs++;
    return true;
}

std::string Backends::description() const {
    std::ostringstream s;
    s << ggml_backend_dev_name(main_dev) << " (" << ggml_backend_dev_description(main_dev) << ")";
    if (!is_gpu) s << ", " << n_threads << " threads";
    return s.str();
}

void Backends::memory(size_t & free, size_t & total) const {
    ggml_backend_dev_memory(main_dev, &free, &total);
    if (!is_gpu) {
        // The CPU device reports total RAM as free; MemAvailable is the honest figure.
        std::ifstream f("/proc/meminfo");
        std::string key;
        size_t kb;
        std::string unit;
        while (f >> key >> kb >> unit) {
            if (key == "MemAvailable:") {
                free = kb * 1024;
                break;
            }
        }
    }
}

}  // namespace dflash
