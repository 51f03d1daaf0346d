"""Bad input raises the right dflash exception with a clear message, and the process survives.

Files: missing, a directory, truncated (inside the header and inside the tensor data), random
bytes, a valid GGUF of another architecture, a qwen35 file with a missing or mistyped key, a
missing tensor or one of the wrong shape. Requests: a prompt longer than the context, an unknown
KV type, bad sampling parameters, out-of-vocabulary token ids. Config: one the memory planner
must refuse. After every test a valid engine still generates the same text, and a few cases run
in a child interpreter to prove that no abort() is reachable (exit status 1, not a signal).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from gguf import GGUFValueType
from gguf.gguf_writer import GGUFValue

import dflash
from dflash import _core
from dflash.errors import (
    ContextOverflowError,
    DflashError,
    EngineError,
    InvalidParameterError,
    ModelLoadError,
)
from dflash.synth import get_preset, write_qwen35_gguf
from dflash.synth import qwen35 as synth_qwen35

N_CTX = 64
PKG_PARENT = str(Path(dflash.__file__).resolve().parent.parent)


# ---- a valid engine that must keep working ----------------------------------------------------


@pytest.fixture(scope="module")
def good_path(synth_model: Any) -> Path:
    return Path(synth_model("tiny-a", "f32"))


@pytest.fixture(scope="module")
def good(good_path: Path) -> dflash.Engine:
    return dflash.Engine(model_path=str(good_path), n_ctx=N_CTX, n_threads=1)


def _greedy_text(eng: dflash.Engine, prompt: str | list[int] = "Hello world", n: int = 12) -> str:
    res = eng.create_completion(prompt, max_tokens=n, temperature=0.0)
    assert isinstance(res, dict)
    return str(res["choices"][0]["text"])


@pytest.fixture(scope="module")
def reference(good: dflash.Engine) -> str:
    return _greedy_text(good)


@pytest.fixture(autouse=True)
def still_generates(good: dflash.Engine, reference: str) -> Iterator[None]:
    yield
    assert _greedy_text(good) == reference, "the valid engine changed its output after a failed call"


def _load(path: Path | str, **kw: Any) -> dflash.Engine:
    kw.setdefault("n_ctx", N_CTX)
    return dflash.Engine(model_path=str(path), n_threads=1, **kw)


def _one_line(msg: str) -> None:
    assert msg and msg == msg.strip() and "\n" not in msg, repr(msg)


# ---- files ------------------------------------------------------------------------------------


def _cut(src: Path, dst: Path, n: int) -> Path:
    dst.write_bytes(src.read_bytes()[:n])
    return dst


def test_missing_file_and_directory(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ModelLoadError, match="not found") as ei:
        _load(missing)
    assert str(missing) in str(ei.value)
    _one_line(str(ei.value))
    with pytest.raises(ModelLoadError, match="not a regular file"):
        _load(tmp_path)
    with pytest.raises(ModelLoadError):
        _core.Vocab(str(missing))


def test_truncated_in_tensor_data(good_path: Path, tmp_path: Path) -> None:
    data_off = gguf.GGUFReader(good_path).data_offset
    size = good_path.stat().st_size
    for n in (data_off, data_off + 1000, (data_off + size) // 2, size - 1):
        bad = _cut(good_path, tmp_path / f"cut-{n}.gguf", n)
        with pytest.raises(ModelLoadError, match="truncated") as ei:
            _load(bad)
        msg = str(ei.value)
        assert str(bad) in msg and f"the file has {n} bytes" in msg
        _one_line(msg)


def test_truncated_in_header(good_path: Path, tmp_path: Path) -> None:
    data_off = gguf.GGUFReader(good_path).data_offset
    # Empty, inside the magic, the version, the counts, the key-values, the tensor infos.
    for n in (0, 3, 6, 20, 40, data_off // 3, data_off // 2, data_off - 40, data_off - 1):
        bad = _cut(good_path, tmp_path / f"hdr-{n}.gguf", n)
        with pytest.raises(ModelLoadError, match="GGUF") as ei:
            _load(bad)
        assert str(bad) in str(ei.value)
        _one_line(str(ei.value))
        with pytest.raises(ModelLoadError):
            _core.Vocab(str(bad))


def test_random_bytes(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    for i, blob in enumerate(
        [rng.bytes(1 << 16), b"GGUF" + rng.bytes(1 << 16), b"GGUF\x03\x00\x00\x00" + rng.bytes(4096)]
    ):
        bad = tmp_path / f"rand-{i}.gguf"
        bad.write_bytes(blob)
        with pytest.raises(ModelLoadError, match="not a valid GGUF") as ei:
            _load(bad)
        _one_line(str(ei.value))
        with pytest.raises(ModelLoadError):
            _core.Vocab(str(bad))


def _corrupt_tensor_type(good_path: Path, dst: Path) -> Path:
    """Overwrite the type field of the first tensor info with an invalid ggml type."""
    r = gguf.GGUFReader(good_path)
    t = r.tensors[0]
    raw = bytearray(good_path.read_bytes())
    # A tensor info: name (u64 len + bytes), n_dims u32, dims u64 * n_dims, type u32, offset u64.
    name = t.name.encode()
    at = raw.find(len(name).to_bytes(8, "little") + name)
    assert at > 0
    type_at = at + 8 + len(name) + 4 + 8 * len(t.shape)
    raw[type_at : type_at + 4] = (999).to_bytes(4, "little")
    dst.write_bytes(bytes(raw))
    return dst


def test_corrupt_tensor_info(good_path: Path, tmp_path: Path) -> None:
    bad = _corrupt_tensor_type(good_path, tmp_path / "badtype.gguf")
    with pytest.raises(ModelLoadError, match="not a valid GGUF"):
        _load(bad)


def _write_llama(path: Path) -> Path:
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_embedding_length(16)
    w.add_feed_forward_length(32)
    w.add_head_count(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tensor("token_embd.weight", np.zeros((32, 16), np.float32))
    w.add_tensor("output_norm.weight", np.ones(16, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_wrong_architecture(tmp_path: Path) -> None:
    path = _write_llama(tmp_path / "llama.gguf")
    with pytest.raises(ModelLoadError, match="architecture 'llama'") as ei:
        _load(path)
    assert "qwen35" in str(ei.value)
    _one_line(str(ei.value))


def test_vocab_error_names_the_cause(tmp_path: Path) -> None:
    # ENGINE BUG (fails until fixed): when libllama's vocabulary loader refuses a file that passed
    # our own checks, _core.Vocab reports libllama's *last* error log line, with its trailing
    # newline ("could not load the tokenizer from X: llama_model_load_from_file_impl: failed to
    # load model\n"), not the cause logged just before it ("unknown pre-tokenizer type: ...").
    path = _write_variant(
        tmp_path / "badpre.gguf",
        set_keys={"tokenizer.ggml.pre": lambda w: w.add_string("tokenizer.ggml.pre", "bogus-pre")},
    )
    for make in (lambda: _core.Vocab(str(path)), lambda: _load(path)):
        with pytest.raises(ModelLoadError) as ei:
            make()
        msg = str(ei.value)
        assert str(path) in msg
        assert "bogus-pre" in msg, repr(msg)
        _one_line(msg)


def _write_variant(
    path: Path,
    preset: str = "tiny-a",
    drop_keys: tuple[str, ...] = (),
    set_keys: dict[str, Callable[[gguf.GGUFWriter], None]] | None = None,
    shapes: dict[str, tuple[int, ...]] | None = None,
    drop_tensors: tuple[str, ...] = (),
    edit: Callable[[dict[str, Any]], None] | None = None,
) -> Path:
    """A tiny qwen35 file with keys removed or replaced and tensors removed or reshaped."""
    add_vocab = synth_qwen35.add_vocab_to_gguf  # the last keys written: edit after it
    specs_of = synth_qwen35.tensor_specs

    def add(w: gguf.GGUFWriter, *args: Any) -> None:
        add_vocab(w, *args)
        for k in drop_keys:
            del w.kv_data[0][k]
        for k, fn in (set_keys or {}).items():
            w.kv_data[0].pop(k, None)
            fn(w)
        if edit is not None:
            edit(w.kv_data[0])

    def specs(cfg: Any, n_vocab: int) -> list[Any]:
        out = []
        for s in specs_of(cfg, n_vocab):
            if s.name in drop_tensors:
                continue
            if shapes and s.name in shapes:
                s = dataclasses.replace(s, shape=shapes[s.name])
            out.append(s)
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(synth_qwen35, "add_vocab_to_gguf", add)
        mp.setattr(synth_qwen35, "tensor_specs", specs)
        write_qwen35_gguf(path, get_preset(preset).config, seed=0, weight_type="f32")
    return path


@pytest.mark.parametrize(
    "key",
    [
        "qwen35.block_count",
        "qwen35.embedding_length",
        "qwen35.feed_forward_length",
        "qwen35.attention.head_count",
        "qwen35.attention.layer_norm_rms_epsilon",
        "qwen35.ssm.state_size",
        "qwen35.ssm.group_count",
    ],
)
def test_missing_required_key(tmp_path: Path, key: str) -> None:
    path = _write_variant(tmp_path / "nokey.gguf", drop_keys=(key,))
    with pytest.raises(ModelLoadError, match="is missing") as ei:
        _load(path)
    assert f"'{key}'" in str(ei.value)
    _one_line(str(ei.value))


def test_mistyped_and_implausible_keys(tmp_path: Path) -> None:
    path = _write_variant(
        tmp_path / "strkey.gguf",
        set_keys={"qwen35.block_count": lambda w: w.add_string("qwen35.block_count", "4")},
    )
    with pytest.raises(ModelLoadError, match="'qwen35.block_count' is not an integer"):
        _load(path)
    path = _write_variant(
        tmp_path / "inner.gguf", set_keys={"qwen35.ssm.inner_size": lambda w: w.add_ssm_inner_size(12345)}
    )
    with pytest.raises(ModelLoadError, match="Gated DeltaNet shape"):
        _load(path)


def test_tensor_of_wrong_shape(tmp_path: Path) -> None:
    cfg = get_preset("tiny-a").config
    name = "blk.1.attn_q.weight"  # layer 1 is full attention in tiny-a (interval 2)
    rows = cfg.n_head * cfg.head_dim * 2
    path = _write_variant(tmp_path / "shape.gguf", shapes={name: (rows + 32, cfg.hidden)})
    with pytest.raises(ModelLoadError, match="has shape") as ei:
        _load(path)
    msg = str(ei.value)
    assert (
        f"'{name}'" in msg
        and f"[{cfg.hidden}, {rows + 32}, 1, 1]" in msg
        and f"[{cfg.hidden}, {rows}, 1, 1]" in msg
    )
    _one_line(msg)


def test_missing_tensor(tmp_path: Path) -> None:
    path = _write_variant(tmp_path / "notensor.gguf", drop_tensors=("blk.0.ssm_a",))
    with pytest.raises(ModelLoadError, match="'blk.0.ssm_a' is missing"):
        _load(path)


# ---- requests ---------------------------------------------------------------------------------


def _run(make: Callable[[], Any]) -> Any:
    """Call, and drain the result if it is a stream (errors may surface on the first chunk)."""
    res = make()
    if not isinstance(res, dict):
        res = list(res)
    return res


def test_prompt_longer_than_context(good: dflash.Engine) -> None:
    fits = list(range(100, 100 + N_CTX - 1))  # the prompt plus one generated token fill the context
    res = _run(lambda: good.create_completion(fits, max_tokens=4, temperature=0.0))
    assert res["choices"][0]["finish_reason"] == "length"
    for extra in (0, 1, 200):
        toks = list(range(100, 100 + N_CTX + extra))
        for stream in (False, True):
            with pytest.raises(ContextOverflowError) as ei:
                _run(functools.partial(good.create_completion, toks, max_tokens=4, stream=stream))
            e = ei.value
            assert e.n_ctx == N_CTX  # type: ignore[attr-defined]
            assert e.n_prompt >= len(toks)  # type: ignore[attr-defined]
            assert str(e.n_prompt) in str(e) and str(N_CTX) in str(e)  # type: ignore[attr-defined]
            assert isinstance(e, DflashError) and isinstance(e, RuntimeError)
    # A text prompt and a chat that are too long.
    with pytest.raises(ContextOverflowError):
        good.create_completion("word " * 200, max_tokens=4)
    with pytest.raises(ContextOverflowError):
        good.create_chat_completion([{"role": "user", "content": "word " * 200}], max_tokens=4)
    # The native engine raises the same class, with the same attributes.
    with pytest.raises(ContextOverflowError) as ei:
        good._target.generate(list(range(100, 200)), 4, 0.0, 0, 1.0, 0, [], lambda t: True)
    assert ei.value.n_ctx == N_CTX and ei.value.n_prompt >= 100  # type: ignore[attr-defined]
    with pytest.raises(ContextOverflowError):
        good.eval_logits(list(range(100, 100 + N_CTX + 1)))


@pytest.mark.parametrize(
    "kw", [{"kv_type": "q3_x"}, {"kv_type_k": "q3_x"}, {"kv_type_v": "q3_x"}, {"kv_type": ""}]
)
def test_unknown_kv_type(good_path: Path, kw: dict[str, str]) -> None:
    with pytest.raises(InvalidParameterError, match="unknown KV cache type") as ei:
        _load(good_path, **kw)
    bad = next(iter(kw.values()))
    assert f"'{bad}'" in str(ei.value) and "q8_0" in str(ei.value)
    _one_line(str(ei.value))


@pytest.mark.parametrize(
    "kw,word",
    [
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"max_tokens": -1}, "max_tokens"),
    ],
)
def test_bad_sampling_params(good: dflash.Engine, kw: dict[str, Any], word: str) -> None:
    args: dict[str, Any] = {"max_tokens": 4, "temperature": 0.7, **kw}
    for stream in (False, True):
        with pytest.raises(InvalidParameterError, match=word):
            _run(functools.partial(good.create_completion, "Hello", stream=stream, **args))
        messages = [{"role": "user", "content": "x"}]
        with pytest.raises(InvalidParameterError, match=word):
            _run(functools.partial(good.create_chat_completion, messages, stream=stream, **args))


@pytest.mark.parametrize("bad", [[-1], [4096], [1, 2, 99999], [1, -(2**31)]])
def test_out_of_vocab_token_ids(good: dflash.Engine, bad: list[int]) -> None:
    with pytest.raises(InvalidParameterError, match="outside the vocabulary") as ei:
        good.create_completion(bad, max_tokens=2)
    odd = next(t for t in bad if not 0 <= t < good.n_vocab)
    assert str(odd) in str(ei.value)
    # Every native entry point checks too (never an out-of-bounds get_rows).
    with pytest.raises(InvalidParameterError, match="outside the vocabulary"):
        good._target.generate(bad, 2, 0.0, 0, 1.0, 0, [], lambda t: True)
    with pytest.raises(InvalidParameterError, match="outside the vocabulary"):
        good.eval_logits(bad)
    with pytest.raises(InvalidParameterError, match="outside the vocabulary"):
        good.detokenize(bad)
    with pytest.raises(InvalidParameterError):
        good._vocab.token_to_piece(odd)


def test_other_bad_requests(good: dflash.Engine, good_path: Path) -> None:
    with pytest.raises(InvalidParameterError, match="empty"):
        good.create_completion("", max_tokens=2)
    with pytest.raises(InvalidParameterError, match="empty"):
        good.create_completion([], max_tokens=2)
    with pytest.raises(InvalidParameterError, match="non-empty list"):
        good.create_chat_completion([], max_tokens=2)
    with pytest.raises(InvalidParameterError, match="role"):
        good.create_chat_completion([{"content": "x"}], max_tokens=2)
    with pytest.raises(InvalidParameterError, match="n_ctx"):
        _load(good_path, n_ctx=0)
    with pytest.raises(InvalidParameterError, match="n_batch"):
        _load(good_path, n_batch=0)
    with pytest.raises(InvalidParameterError, match="batch size"):
        good._target.reset()
        good._target.forward(list(range(1, 1 + N_CTX + 1)), True)
    # Everything above derives from one base class, itself a RuntimeError.
    for cls in (ModelLoadError, InvalidParameterError, ContextOverflowError, EngineError):
        assert issubclass(cls, DflashError) and issubclass(cls, RuntimeError)
    assert dflash.ModelLoadError is ModelLoadError and dflash.ContextOverflowError is ContextOverflowError


# ---- the memory planner -----------------------------------------------------------------------


def _meminfo() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        k, v = line.split(":", 1)
        out[k] = int(v.split()[0]) * 1024
    return out


def _kv_bytes_per_token(cfg: Any) -> int:
    n_attn = sum(1 for il in range(cfg.n_layer) if not cfg.is_recurrent(il))
    return n_attn * cfg.n_head_kv * cfg.head_dim * 2 * 4  # K and V, f32


# tiny-c's own shape (f32 KV, 4 KiB per token) can only exceed machines with < 16 GiB of memory
# (n_ctx is capped at 2^22); the same shape with 16 KV heads of 256 and interval 2 can exceed any
# machine with up to ~190 GiB of RAM + swap.
KV_HEAVY: dict[str, Any] = dict(
    n_head=16, n_head_kv=16, head_dim=256, rope_dim=64, full_attention_interval=2, nextn_layers=0
)


@pytest.mark.parametrize("shape", ["tiny-c", "tiny-c-kv-heavy"])
def test_memory_planner_refuses_what_does_not_fit(shape: str, synth_model: Any, tmp_path: Path) -> None:
    if shape == "tiny-c":
        cfg = get_preset("tiny-c").config
        path = Path(synth_model("tiny-c", "f32"))
    else:
        cfg = dataclasses.replace(get_preset("tiny-c").config, name="kv-heavy", **KV_HEAVY)
        path = write_qwen35_gguf(tmp_path / "kv-heavy.gguf", cfg, seed=0, weight_type="f16")
    per_token = _kv_bytes_per_token(cfg)
    mem = _meminfo()
    # Twice RAM + swap: even if the planner let it through, the allocation itself would fail
    # rather than touch the memory (and the attempt runs in a child process).
    n_ctx = math.ceil(2 * (mem["MemTotal"] + mem.get("SwapTotal", 0)) / per_token / 256) * 256
    if n_ctx > 1 << 22:
        pytest.skip(
            f"{shape}: {per_token} B/token of f32 KV cannot exceed this machine's memory below n_ctx 2^22"
        )
    kv_mib = per_token * n_ctx / 1048576
    code = textwrap.dedent(
        f"""
        import dflash
        try:
            dflash.Engine(model_path={str(path)!r}, n_ctx={n_ctx}, kv_type="f32", n_threads=1)
        except dflash.ModelLoadError as e:
            print("REFUSED", e)
        else:
            print("LOADED")
        """
    )
    r = _child(code, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout.strip()
    assert out.startswith("REFUSED"), out
    assert "does not fit" in out
    assert f"n_ctx {n_ctx}) {kv_mib:.1f} MiB" in out, out
    assert "MiB free" in out and "weights" in out
    _one_line(out)
    # A configuration that fits reports its plan.
    eng = _load(path, n_ctx=256, kv_type="f32")
    plan = eng.memory_plan
    assert plan["kv cache (f32/f32, n_ctx 256)"] == per_token * 256
    assert plan["weights"] > 0 and plan["compute"] > 0 and plan["free"] > 0 and plan["total"] >= plan["free"]


# ---- no abort(): failures in a child interpreter end with a Python exception ----------------


def _child(code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([PKG_PARENT, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.fixture(scope="module")
def bad_files(good_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bad")
    data_off = gguf.GGUFReader(good_path).data_offset
    rand = d / "random.gguf"
    rand.write_bytes(np.random.default_rng(3).bytes(1 << 15))

    def dup_tokens(kv: dict[str, Any]) -> None:
        old = kv["tokenizer.ggml.tokens"]
        toks = list(old.value)
        toks[300] = toks[301]
        kv["tokenizer.ggml.tokens"] = GGUFValue(toks, old.type, old.sub_type)

    def no_merges(kv: dict[str, Any]) -> None:
        del kv["tokenizer.ggml.merges"]

    def eos_out_of_range(kv: dict[str, Any]) -> None:
        kv["tokenizer.ggml.eos_token_id"] = GGUFValue(99999, GGUFValueType.UINT32)

    def bogus_pre(kv: dict[str, Any]) -> None:
        kv["tokenizer.ggml.pre"] = GGUFValue("bogus-pre", GGUFValueType.STRING)

    return {
        "header-cut": _cut(good_path, d / "header-cut.gguf", data_off // 2),
        "data-cut": _cut(good_path, d / "data-cut.gguf", data_off + 4096),
        "random": rand,
        "llama": _write_llama(d / "llama.gguf"),
        "badtype": _corrupt_tensor_type(good_path, d / "badtype.gguf"),
        # Tokenizer metadata that libllama asserts on (or refuses): only ever tried in a child.
        "dup-tokens": _write_variant(d / "dup-tokens.gguf", edit=dup_tokens),
        "no-merges": _write_variant(d / "no-merges.gguf", edit=no_merges),
        "eos-out-of-range": _write_variant(d / "eos.gguf", edit=eos_out_of_range),
        "bogus-pre": _write_variant(d / "bogus-pre.gguf", edit=bogus_pre),
    }


@pytest.mark.parametrize(
    "which", ["header-cut", "data-cut", "random", "llama", "dup-tokens", "eos-out-of-range"]
)
def test_corrupt_file_in_child_exits_with_exception(bad_files: dict[str, Path], which: str) -> None:
    r = _child(f"import dflash; dflash.Engine(model_path={str(bad_files[which])!r}, n_ctx=64, n_threads=1)")
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])  # a signal would give a negative code
    assert "ModelLoadError: " in r.stderr.strip().splitlines()[-1]
    assert "Traceback" in r.stderr


def test_every_bad_input_in_one_child(bad_files: dict[str, Path], good_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        import dflash
        from dflash import _core
        good = {str(good_path)!r}
        ok = dflash.Engine(model_path=good, n_ctx=64, n_threads=1)
        want = ok.create_completion("Hello", max_tokens=8, temperature=0)["choices"][0]["text"]
        seen = []
        files = {[str(p) for p in bad_files.values()]!r}
        cases = [lambda p=p: dflash.Engine(model_path=p, n_ctx=64, n_threads=1) for p in files]
        cases += [lambda p=p: _core.Vocab(p) for p in files]
        cases += [
            lambda: dflash.Engine(model_path=good, n_ctx=64, kv_type="q3_x", n_threads=1),
            lambda: ok.create_completion(list(range(100, 200)), max_tokens=4),
            lambda: ok.create_completion("Hello", temperature=-1),
            lambda: ok.create_completion("Hello", top_p=0),
            lambda: ok.create_completion("Hello", top_k=-1),
            lambda: list(ok.create_completion("Hello", top_k=-1, stream=True)),
            lambda: ok.create_completion([5000], max_tokens=2),
            lambda: ok._target.generate([0, 5000], 2, 0.0, 0, 1.0, 0, [], lambda t: True),
            lambda: ok.eval_logits([-3]),
        ]
        for c in cases:
            try:
                c()
            except dflash.DflashError as e:
                seen.append(type(e).__name__)
            else:
                raise SystemExit("no exception")
            assert ok.create_completion("Hello", max_tokens=8, temperature=0)["choices"][0]["text"] == want
        print(" ".join(seen))
        """
    )
    r = _child(code, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-3000:])
    seen = r.stdout.split()
    n_files = len(bad_files)
    assert seen[: 2 * n_files] == ["ModelLoadError"] * (2 * n_files)
    assert (
        seen[2 * n_files :]
        == ["InvalidParameterError", "ContextOverflowError"] + ["InvalidParameterError"] * 7
    )
