"""ggml's CPU backend as this package builds it: no AMX, whatever the build machine has.

ggml's AMX matmul segfaults on the first inference on some Sapphire Rapids machines (upstream
llama.cpp issue 20824); CMakeLists.txt compiles ggml-cpu with -mno-amx-*, so neither our engine
nor the libllama oracle in the same module can place weights in the AMX layout."""

from dflash import _core


def test_cpu_backend_reports_its_features() -> None:
    features = dict(_core.cpu_features())
    # Every x86-64 or ARM build reports at least one SIMD level; an empty list would mean the
    # proc-address lookup failed and the AMX check below proved nothing.
    assert features, "ggml's CPU backend reported no features"


def test_cpu_backend_has_no_amx() -> None:
    features = dict(_core.cpu_features())
    amx = {k: v for k, v in features.items() if k.startswith("AMX")}
    assert all(v in ("0", "") for v in amx.values()), f"AMX compiled into ggml-cpu: {amx}"
