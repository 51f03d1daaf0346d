"""ggml is linked statically into dflash._core with hidden symbols, so another ggml/libllama in the
same process (llama-cpp-python, a system libggml.so) cannot capture our calls, nor we theirs.

(a) The extension exports no ggml_*/gguf_*/llama_* symbol and needs no shared ggml/llama library.
(b) The proof: a shared library of impostors (every public ggml/gguf/llama function of the pinned
    headers, each of which aborts when called) is loaded RTLD_GLOBAL into a fresh interpreter,
    before or after importing dflash._core; dflash then loads, tokenizes and generates exactly as
    without it, on both our engine and the in-module upstream libllama. A positive control shows
    that an ordinary library with unresolved ggml references does hit the impostors.
(c) The same with a real shared upstream build (llama-cpp-python if installed; libggml*.so found
    in site-packages, /usr/lib, /usr/local/lib or $DFLASH_TEST_SHARED_GGML), when one exists.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from dflash import _core
from dflash.vendor_files import VendorFileError, upstream_files

REPO = Path(__file__).resolve().parent.parent
PKG_PARENT = str(Path(_core.__file__).resolve().parent.parent)  # dflash/ may be a symlinked build
CORE = Path(_core.__file__).resolve()
PREFIXES = ("ggml_", "gguf_", "llama_")

# Always impersonated, even without the upstream headers: what the engine calls on every path.
CORE_CALLS = """
    ggml_init ggml_free ggml_new_tensor_2d ggml_mul_mat ggml_tensor_overhead ggml_nbytes ggml_blck_size
    ggml_type_name ggml_graph_compute ggml_backend_sched_new ggml_backend_sched_graph_compute
    ggml_backend_sched_reserve ggml_backend_cpu_set_n_threads ggml_backend_init_by_type ggml_backend_dev_count
    ggml_backend_tensor_set ggml_backend_tensor_get ggml_backend_buft_alloc_buffer gguf_init_from_file
    gguf_free gguf_find_key gguf_get_n_tensors llama_model_load_from_file llama_model_default_params
    llama_tokenize llama_detokenize llama_log_set llama_backend_init llama_vocab_n_tokens llama_decode
    llama_init_from_model
""".split()
HEADERS = [
    "ggml/include/ggml.h",
    "ggml/include/gguf.h",
    "ggml/include/ggml-alloc.h",
    "ggml/include/ggml-backend.h",
    "ggml/include/ggml-cpu.h",
    "ggml/include/ggml-opt.h",
    "include/llama.h",
]
API_RE = re.compile(r"\b(?:GGML_API|GGML_BACKEND_API|LLAMA_API)\b[^;{]*?\b((?:ggml|gguf|llama)_\w+)\s*\(")


# ---- (a) the symbol table ---------------------------------------------------------------------


def _dynamic_symbols(path: Path) -> list[str]:
    nm = shutil.which("nm")
    if nm:
        out = subprocess.run(
            [nm, "-D", "--defined-only", str(path)], capture_output=True, text=True, check=True
        )
        return [ln.split()[-1] for ln in out.stdout.splitlines() if ln.strip()]
    try:
        from elftools.elf.elffile import ELFFile
    except ImportError:
        pytest.fail("neither `nm` (binutils) nor pyelftools is available to read the symbol table")
    with path.open("rb") as f:
        dynsym = ELFFile(f).get_section_by_name(".dynsym")
        return [s.name for s in dynsym.iter_symbols() if s.name and s["st_shndx"] != "SHN_UNDEF"]


def test_extension_exports_no_ggml_symbols() -> None:
    syms = _dynamic_symbols(CORE)
    assert "PyInit__core" in syms
    leaked = [s for s in syms if s.startswith(PREFIXES) or re.search(r"ggml|gguf|llama", s, re.I)]
    assert not leaked, f"{CORE.name} exports {len(leaked)} ggml/llama symbols, e.g. {leaked[:10]}"


def test_extension_needs_no_shared_ggml() -> None:
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf not available")
    out = subprocess.run([readelf, "-d", str(CORE)], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)
    assert needed, out
    assert not [n for n in needed if re.search(r"ggml|llama", n)], needed


# ---- (b) impostors ----------------------------------------------------------------------------


def _api_names() -> list[str]:
    names = set(CORE_CALLS)
    try:
        files = upstream_files(HEADERS, REPO, download=False)
    except VendorFileError:
        return sorted(names)
    for p in files.values():
        names.update(m.group(1) for m in API_RE.finditer(p.read_text(errors="replace")))
    return sorted(names)


def _compiler() -> str:
    for cc in (os.environ.get("CC", ""), "cc", "gcc", "clang"):
        if cc and shutil.which(cc):
            return cc
    pytest.skip("no C compiler to build the impostor library")


def _build_so(cc: str, src: str, out: Path) -> Path:
    c = out.with_suffix(".c")
    c.write_text(src)
    subprocess.run([cc, "-shared", "-fPIC", "-O0", "-o", str(out), str(c)], check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def impostor(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    names = _api_names()
    lines = [
        "#include <stdio.h>",
        "#include <stdlib.h>",
        "static void impostor(const char * n) {",
        '    fprintf(stderr, "IMPOSTOR %s called\\n", n);',
        "    fflush(stderr);",
        "    abort();",
        "}",
    ]
    lines += [f'void * {n}(void) {{ impostor("{n}"); return (void *) 0x1; }}' for n in names]
    path = _build_so(_compiler(), "\n".join(lines) + "\n", tmp_path_factory.mktemp("impostor") / "libggml.so")
    return path, len(names)


@pytest.fixture(scope="module")
def model(synth_model: Any) -> str:
    return str(synth_model("tiny-a", "f32"))


RUN = textwrap.dedent(
    """
    import ctypes, json, sys
    libs, when, model = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]

    def load_libs():
        for p in libs:
            ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL)
        if "import-llama-cpp" in sys.argv[4:]:
            import llama_cpp
            llama_cpp.llama_backend_init()

    if when == "before":
        load_libs()
    from dflash import _core
    import dflash
    if when == "after":
        load_libs()

    cfg = _core.EngineConfig()
    cfg.n_ctx, cfg.n_threads, cfg.n_gpu_layers = 128, 1, 0
    eng = _core.TargetEngine(model, cfg)
    voc = _core.Vocab(model)
    toks = list(voc.tokenize("Hello world, side by side", False, False))
    out = []
    eng.generate(toks, 16, 0.0, 0, 1.0, 0, [], lambda t: out.append(t) or True)
    logits = eng.eval_logits(toks)
    ucfg = _core.UpstreamConfig()
    ucfg.n_ctx, ucfg.n_threads, ucfg.n_gpu_layers = 128, 1, 0
    up, _ = _core.UpstreamModel(model, ucfg).greedy(toks, 16)
    api = dflash.Engine(model_path=model, n_ctx=128, n_threads=1)
    text = api.create_completion(toks, max_tokens=16, temperature=0)["choices"][0]["text"]
    print(json.dumps({"toks": toks, "out": out, "up": list(up), "text": text,
                      "logits": [round(float(x), 4) for x in logits[-1][:64]]}))
    """
)


def _child_run(libs: list[str], when: str, model: str, *extra: str) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([PKG_PARENT, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run(
        [sys.executable, "-c", RUN, json.dumps(libs), when, model, *extra],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert r.returncode == 0, f"rc {r.returncode} ({when}, {libs}):\n{r.stderr[-3000:]}"
    assert "IMPOSTOR" not in r.stderr, r.stderr[-3000:]
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def baseline(model: str) -> dict[str, Any]:
    res = _child_run([], "none", model)
    assert len(res["out"]) == 16 and res["out"] == res["up"]  # our engine agrees with upstream here too
    return res


def test_impostor_control_catches_global_binding(impostor: tuple[Path, int], tmp_path: Path) -> None:
    """Positive control: a library that binds ggml_init through the global scope gets the impostor."""
    lib, n = impostor
    assert n >= len(CORE_CALLS)
    victim = _build_so(
        _compiler(),
        "extern void * ggml_init(void *);\nint victim(void) { ggml_init(0); return 0; }\n",
        tmp_path / "libvictim.so",
    )
    code = (
        "import ctypes, sys; ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL); "
        "ctypes.CDLL(sys.argv[2]).victim()"
    )
    r = subprocess.run([sys.executable, "-c", code, str(lib), str(victim)], capture_output=True, text=True)
    assert r.returncode == -signal.SIGABRT, (r.returncode, r.stderr)
    assert "IMPOSTOR ggml_init called" in r.stderr


@pytest.mark.parametrize("when", ["before", "after"])
def test_dflash_ignores_global_impostors(
    impostor: tuple[Path, int], model: str, baseline: dict[str, Any], when: str
) -> None:
    lib, _ = impostor
    got = _child_run([str(lib)], when, model)
    assert got == baseline


# ---- (c) a real shared ggml / llama-cpp-python ------------------------------------------------


def _shared_upstream_libs() -> list[list[str]]:
    """Sets of real shared upstream libraries to load together, one set per folder."""
    import site

    deep = [Path(p) for p in os.environ.get("DFLASH_TEST_SHARED_GGML", "").split(os.pathsep) if p]
    deep += [Path(p) for p in [*site.getsitepackages(), site.getusersitepackages()]]
    shallow = [Path("/usr/lib"), Path("/usr/local/lib"), Path("/usr/lib64")]
    hits: list[Path] = []
    for root in deep:
        hits += [Path(p) for p in glob.glob(str(root / "**" / "libggml*.so*"), recursive=True)]
    for root in shallow:
        hits += [
            Path(p)
            for p in glob.glob(str(root / "libggml*.so*")) + glob.glob(str(root / "*" / "libggml*.so*"))
        ]
    found: list[list[str]] = []
    for d in sorted({h.parent for h in hits if h.is_file()}):
        libs = []
        for stem in ("libggml-base", "libggml-cpu", "libggml", "libllama"):
            cands = sorted(p for p in d.glob(f"{stem}.so*") if p.is_file())
            if cands:
                libs.append(str(cands[0]))
        if libs:
            found.append(libs)
    return found


def _llama_cpp_importable() -> bool:
    r = subprocess.run([sys.executable, "-c", "import llama_cpp"], capture_output=True)
    return r.returncode == 0


def test_with_llama_cpp_python_imported_first(model: str, baseline: dict[str, Any]) -> None:
    if not _llama_cpp_importable():
        pytest.skip("llama-cpp-python is not installed (the impostor test above is the proof)")
    assert _child_run([], "before", model, "import-llama-cpp") == baseline


def test_with_real_shared_ggml_loaded_global(model: str, baseline: dict[str, Any]) -> None:
    sets = _shared_upstream_libs()
    if not sets:
        pytest.skip("no shared libggml on this system (the impostor test above is the proof)")
    for libs in sets:
        for when in ("before", "after"):
            assert _child_run(libs, when, model) == baseline, libs
