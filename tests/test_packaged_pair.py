"""The packaged target + drafter pair as the embedded default (dflash/data/pair), on a stand-in pair
installed into a temporary package-data folder (conftest `packaged_pair`), never the real files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import dflash
import dflash.models as models

PROMPT = "def fibonacci(n):"


def _text(eng: dflash.Engine, prompt: str = PROMPT, n: int = 40) -> str:
    res = eng.create_completion(prompt, max_tokens=n, temperature=0.0)
    assert isinstance(res, dict)
    return str(res["choices"][0]["text"])


def test_installer_writes_the_package_layout(packaged_pair: Path) -> None:
    names = {p.name for p in packaged_pair.iterdir()}
    want = {"target-q8_0.gguf", "drafter-q8_0.gguf", "summary.json", "heldout_prompts.jsonl"}
    assert want | {"MODEL_CARD.md", "prompts.jsonl"} <= names
    rows = [json.loads(line) for line in (packaged_pair / "prompts.jsonl").read_text().splitlines()]
    kinds = [r["kind"] for r in rows]
    assert kinds.count("code") == 3 and kinds.count("prose") == 2
    assert rows[0]["prompt"].startswith("def fibonacci(n):")  # code prompts: the export's held-out ones
    assert all(r["prompt"] and r["source"] for r in rows)


def test_installer_refuses_a_bad_export(packaged_pair: Path, tmp_path: Path, monkeypatch: Any) -> None:
    from train_pair import install as inst  # on sys.path through the packaged_pair fixture

    export = tmp_path / "export"
    shutil.copytree(packaged_pair, export)
    (export / "drafter-q8_0.gguf").unlink()
    with pytest.raises(inst.InstallError, match="drafter-q8_0.gguf"):
        inst.install(export, tmp_path / "dest")
    shutil.copyfile(packaged_pair / "drafter-q8_0.gguf", export / "drafter-q8_0.gguf")
    monkeypatch.setattr(inst, "MAX_BYTES", 1000)
    with pytest.raises(inst.InstallError, match="package budget"):
        inst.install(export, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


def test_no_packaged_pair_means_the_synthetic_default(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(models, "PAIR_DIR", tmp_path / "empty")
    assert models.packaged_target() is None and models.default_draft_path() is None
    # a drafter alone is not a pair
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / models.PAIR_DRAFTER).write_bytes(b"x")
    monkeypatch.setattr(models, "PAIR_DIR", tmp_path / "half")
    assert models.default_draft_path() is None


def test_default_engine_is_the_pair_with_its_drafter(use_packaged_pair: Path) -> None:
    target = use_packaged_pair / models.PAIR_TARGET
    assert models.default_model_path() == target
    assert models.default_draft_path() == use_packaged_pair / models.PAIR_DRAFTER
    default = dflash.Engine(n_ctx=256, n_threads=1)
    assert default.model_path == str(target) and default.speculative
    assert default.draft_path == str(use_packaged_pair / models.PAIR_DRAFTER)
    # an explicit model path never picks up the packaged drafter
    plain = dflash.Engine(model_path=str(target), n_ctx=256, n_threads=1)
    assert not plain.speculative and plain.draft_path is None
    assert not dflash.Engine(n_ctx=256, n_threads=1, default_draft=False).speculative
    # lossless: greedy text with the drafter (chain, and DDTree when asked) == without
    res = default.create_completion(PROMPT, max_tokens=40, temperature=0.0)
    assert isinstance(res, dict)
    assert res["choices"][0]["text"] == _text(plain) and res["timings"]["draft_n"] > 0
    tree = dflash.Engine(n_ctx=256, n_threads=1, budget=8)
    assert tree.speculative and _text(tree) == _text(plain)


def test_generate_and_cli_use_the_pair(use_packaged_pair: Path, monkeypatch: Any, capsys: Any) -> None:
    from dflash import cli

    monkeypatch.setattr(dflash.api, "_default_engine", None)
    text = dflash.generate(PROMPT, max_tokens=12, n_ctx=256, n_threads=1)
    eng = dflash.api._default_engine
    assert eng is not None and eng.speculative
    plain = dflash.Engine(model_path=str(use_packaged_pair / models.PAIR_TARGET), n_ctx=256, n_threads=1)
    assert text == _text(plain, n=12)
    assert cli.main(["generate", PROMPT, "-n", "12", "-c", "256", "-t", "1"]) == 0
    out = capsys.readouterr()
    assert out.out == PROMPT + text + "\n" and "acceptance length" in out.err
    assert cli.main(["generate", PROMPT, "-n", "12", "-c", "256", "-t", "1", "--no-draft"]) == 0
    out = capsys.readouterr()
    assert out.out == PROMPT + text + "\n" and "acceptance length" not in out.err


def test_pair_files_are_not_ignored_so_the_wheel_ships_them() -> None:
    """scikit-build-core's wheel.packages copies the files git does not ignore (pyproject.toml)."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    names = [f"dflash/data/pair/{n}" for n in ("target-q8_0.gguf", "drafter-q8_0.gguf", "target_loss.png")]
    r = subprocess.run(["git", "-C", str(root), "check-ignore", *names], capture_output=True, text=True)
    assert r.returncode == 1 and not r.stdout, r.stdout  # 1: none of them is ignored
