// The Python extension dflash._core: a thin layer; the Python API lives in dflash/api.py. Its
// definitions are split by subject (bindings_*.cpp), each compiled on its own: as one file it was
// a cold CUDA build's last object, 21-34 s alone after ggml's libraries (sessions 56-57's ninja logs).
#include "bindings_common.h"

using namespace dflash;
using namespace dflash::bindings;

PYBIND11_MODULE(_core, m) {
    m.doc() = "dflash native core (qwen35 engine over vendored ggml)";

    // Exception classes as raw, never-freed objects (safe at interpreter shutdown).
    static PyObject * base = PyErr_NewException("dflash._core.DflashError", PyExc_RuntimeError, nullptr);
    static PyObject * load_err = PyErr_NewException("dflash._core.ModelLoadError", base, nullptr);
    static PyObject * param_err = PyErr_NewException("dflash._core.InvalidParameterError", base, nullptr);
    static PyObject * ctx_err = PyErr_NewException("dflash._core.ContextOverflowError", base, nullptr);
    static PyObject * engine_err = PyErr_NewException("dflash._core.EngineError", base, nullptr);
    m.add_object("DflashError", py::handle(base));
    m.add_object("ModelLoadError", py::handle(load_err));
    m.add_object("InvalidParameterError", py::handle(param_err));
    m.add_object("ContextOverflowError", py::handle(ctx_err));
    m.add_object("EngineError", py::handle(engine_err));
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const ContextOverflow & e) {
            py::object exc = py::reinterpret_borrow<py::object>(ctx_err)(e.what());
            exc.attr("n_prompt") = e.n_tokens;
            exc.attr("n_ctx") = e.n_ctx;
            PyErr_SetObject(ctx_err, exc.ptr());
        } catch (const ModelLoadError & e) {
            PyErr_SetString(load_err, e.what());
        } catch (const InvalidParameter & e) {
            PyErr_SetString(param_err, e.what());
        } catch (const EngineError & e) {
            PyErr_SetString(engine_err, e.what());
        }
    });

    m.def("set_log_verbosity", &set_log_verbosity, py::arg("verbose"));

    bind_ops(m);
    bind_switches(m);
    set_log_verbosity(false);
    bind_target(m);
    bind_draft(m);
    bind_upstream(m);
}
