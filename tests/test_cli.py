"""The `dflash` command line (run as `python -m dflash.cli`, the same entry point as the script)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import dflash

PKG_PARENT = Path(dflash.__file__).resolve().parent.parent
PROMPT = "def fibonacci(n):"
TIMING = re.compile(r"prompt (\d+) tokens at [\d.]+ t/s, generated (\d+) tokens at [\d.]+ t/s")


def _run(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PKG_PARENT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=timeout, env=env)


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return _run("-m", "dflash.cli", *args, timeout=timeout)


@pytest.fixture(scope="module")
def tiny(synth_model: Any) -> str:
    return str(synth_model("tiny-a", "f32"))


def test_generate_prints_prompt_continuation_and_timing(tiny: str) -> None:
    r = _cli("generate", PROMPT, "-m", tiny, "-n", "12", "-c", "256", "-t", "1")
    assert r.returncode == 0, r.stderr
    eng = dflash.Engine(model_path=tiny, n_ctx=256, n_threads=1)
    res = eng.create_completion(PROMPT, max_tokens=12, temperature=0.0)
    assert isinstance(res, dict)
    assert r.stdout == PROMPT + res["choices"][0]["text"] + "\n"
    m = TIMING.search(r.stderr)
    assert m, r.stderr
    assert int(m.group(1)) == res["usage"]["prompt_tokens"]
    assert int(m.group(2)) == res["usage"]["completion_tokens"] == 12


def test_generate_batch_invariant_with_the_packaged_pair() -> None:
    """`--batch-invariant` reaches the engine: the default model and its drafter in the mode give
    the mode's own autoregressive text (CPU: every mode is exact), and a quantized KV cache is
    refused in one line."""
    r = _cli("generate", PROMPT, "-n", "16", "-c", "256", "-t", "2", "--batch-invariant")
    assert r.returncode == 0, r.stderr
    ar = dflash.Engine(default_draft=False, n_ctx=256, n_threads=2, batch_invariant=True)
    assert (
        r.stdout
        == PROMPT + ar.create_completion(PROMPT, max_tokens=16, temperature=0)["choices"][0]["text"] + "\n"
    )
    bad = _cli("generate", PROMPT, "-n", "4", "--batch-invariant", "--kv-type", "q8_0")
    assert bad.returncode == 2 and "batch_invariant needs an f16, bf16 or f32 KV cache" in bad.stderr


def test_generate_chat(tiny: str) -> None:
    r = _cli("generate", "Hi there", "--chat", "-m", tiny, "-n", "8", "-c", "256", "-t", "1")
    assert r.returncode == 0, r.stderr
    eng = dflash.Engine(model_path=tiny, n_ctx=256, n_threads=1)
    res = eng.create_chat_completion([{"role": "user", "content": "Hi there"}], max_tokens=8, temperature=0.0)
    assert isinstance(res, dict)
    assert r.stdout == res["choices"][0]["message"]["content"] + "\n"
    assert TIMING.search(r.stderr)


def test_info_prints_json(tiny: str) -> None:
    r = _cli("info", "-m", tiny, "-c", "256", "-t", "1")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["model"] == tiny
    assert isinstance(doc["backend"], str) and doc["backend"]
    hp = doc["hparams"]
    assert hp["n_embd"] == 64 and hp["n_layer"] == 4 and hp["n_vocab"] == 4096
    assert hp["is_recurrent"] == [True, False, True, False]
    plan = doc["memory_plan"]
    assert plan["weights"] > 0 and plan["compute"] > 0 and plan["free"] > 0
    assert any(k.startswith("kv cache (f16/f16, n_ctx 256)") for k in plan)


@pytest.mark.parametrize("cmd", ["generate", "info"])
def test_bad_model_path_is_one_line_error(tmp_path: Path, cmd: str) -> None:
    missing = tmp_path / "missing.gguf"
    r = _cli(cmd, "-m", str(missing), "-t", "1")
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("dflash: error: ") and str(missing) in lines[0]
    assert "Traceback" not in r.stderr
    assert r.stdout == ""


def test_corrupt_model_and_bad_options_exit_2(tmp_path: Path, tiny: str) -> None:
    bad = tmp_path / "corrupt.gguf"
    bad.write_bytes(Path(tiny).read_bytes()[:5000])
    r = _cli("info", "-m", str(bad), "-t", "1")
    assert r.returncode == 2, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("dflash: error: ") and "GGUF" in last
    assert "Traceback" not in r.stderr
    r = _cli("generate", "x", "-m", tiny, "--kv-type", "q3_x", "-t", "1")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("dflash: error: unknown KV cache type 'q3_x'")
    r = _cli("generate", "x", "-m", tiny, "--temperature", "-1", "-t", "1", "-c", "64")
    assert r.returncode == 2
    assert "temperature" in r.stderr.strip().splitlines()[-1]


def test_synth_list() -> None:
    r = _cli("synth", "model", "--list")
    assert r.returncode == 0, r.stderr
    names = [ln.split()[0] for ln in r.stdout.splitlines() if ln.strip()]
    assert {"tiny-a", "tiny-b", "tiny-c", "small", "qwen36-27b"} <= set(names)


def test_synth_writes_a_loadable_model(tmp_path: Path) -> None:
    out = tmp_path / "s.gguf"
    r = _cli("synth", "model", "--preset", "tiny-a", "--type", "q8_0", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert out.is_file()
    eng = dflash.Engine(model_path=str(out), n_ctx=64, n_threads=1)
    assert eng.hparams["n_embd"] == 64


BENCH_ARGS = ("-p", "16", "-n", "8", "-r", "1", "-c", "128", "-t", "1")


def _check_bench(r: subprocess.CompletedProcess[str], out: Path) -> dict[str, Any]:
    assert r.returncode == 0, r.stderr
    assert f"wrote {out}" in r.stdout
    doc = json.loads(out.read_text())
    for key in ("command", "machine", "commit", "results"):
        assert key in doc, key
    assert doc["command"].startswith("dflash bench ") and "-p 16" in doc["command"]
    assert isinstance(doc["machine"], dict) and doc["machine"].get("cores")
    assert isinstance(doc["commit"], str) and doc["commit"]
    if (PKG_PARENT / ".git").exists() and not os.environ.get("DFLASH_COMMIT"):
        head = subprocess.run(
            ["git", "-C", str(PKG_PARENT), "rev-parse", "HEAD"], capture_output=True, text=True
        )
        assert doc["commit"] == head.stdout.strip()
    for row in doc["results"]:
        assert row["kv_type"] == "f16"
        assert len(row["prefill_tps"]) == 1 and len(row["decode_tps"]) == 1
        assert row["prefill_tps_median"] > 0 and row["decode_tps_median"] > 0
    return dict(doc)


def test_bench_module_with_and_without_upstream(tmp_path: Path, tiny: str) -> None:
    out = tmp_path / "no-up.json"
    doc = _check_bench(
        _run("-m", "dflash.bench", "-m", tiny, *BENCH_ARGS, "--no-upstream", "-o", str(out)), out
    )
    assert [r["engine"] for r in doc["results"]] == ["dflash"]
    out = tmp_path / "up.json"
    doc = _check_bench(_run("-m", "dflash.bench", "-m", tiny, *BENCH_ARGS, "-o", str(out)), out)
    assert [r["engine"] for r in doc["results"]] == ["dflash", "upstream-libllama"]


def test_cli_bench_passes_its_options_through(tmp_path: Path, tiny: str) -> None:
    # CLI BUG (fails until fixed): `dflash bench -m X ...` (the README's command) exits 2 with
    # "dflash: error: unrecognized arguments: -m": the bench/synth subparsers take the rest with
    # nargs=REMAINDER, which argparse does not apply when the first remaining word is an option.
    out = tmp_path / "cli.json"
    doc = _check_bench(_cli("bench", "-m", tiny, *BENCH_ARGS, "--no-upstream", "-o", str(out)), out)
    assert [r["engine"] for r in doc["results"]] == ["dflash"]


@pytest.mark.parametrize("sub", ["bench", "synth"])
def test_cli_subcommand_help(sub: str) -> None:
    # Same bug: the top-level help says "see `dflash bench -h`", which exits 2.
    r = _cli(sub, "-h")
    assert r.returncode == 0, r.stderr
    assert "usage:" in r.stdout
