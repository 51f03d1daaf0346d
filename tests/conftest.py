"""Shared fixtures: tiny synthetic qwen35 models written once per session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dflash.synth import get_preset, write_qwen35_gguf


class ModelFactory:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._cache: dict[tuple[str, str, int], Path] = {}

    def __call__(self, preset: str, weight_type: str = "f32", seed: int = 0) -> Path:
        key = (preset, weight_type, seed)
        if key not in self._cache:
            path = self.root / f"{preset}-{weight_type}-s{seed}.gguf"
            write_qwen35_gguf(path, get_preset(preset).config, seed=seed, weight_type=weight_type)
            self._cache[key] = path
        return self._cache[key]


@pytest.fixture(scope="session")
def synth_model(tmp_path_factory: pytest.TempPathFactory) -> ModelFactory:
    return ModelFactory(tmp_path_factory.mktemp("models"))


@pytest.fixture(autouse=True, scope="session")
def _run_outside_the_source_tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """`python -c` / `python -m` subprocesses put their working folder first on sys.path; from the
    repository root that is the source `dflash/` without the built extension, not the installed
    package under test. Every test runs from a scratch folder instead."""
    old = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    yield
    os.chdir(old)


MASK_TOKEN = 4091  # <|mask|> of the committed 4096-token vocabulary


@pytest.fixture(scope="session")
def drafter_pair(synth_model: ModelFactory, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """drafter_pair(seed, **drafter_fields) -> (tiny-b target, f32 drafter GGUF) for speculative
    tests: a synthetic z-lab drafter (hidden 128, 2 layers, reading target layers 1, 4, 6) run
    through convert-draft as users do; cached per arguments."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "convert"))
    from dflash_convert import convert_draft
    from dflash_convert.synthetic import write_synthetic_drafter

    cache: dict[str, tuple[Path, Path]] = {}

    def make(seed: int = 1, **fields: Any) -> tuple[Path, Path]:
        key = f"{seed}-{sorted(fields.items())}"
        if key not in cache:
            target = synth_model("tiny-b", "f32")
            d = tmp_path_factory.mktemp("drafter") / "drafter"
            write_synthetic_drafter(
                d,
                seed=seed,
                hidden=128,
                vocab=4096,
                mask_token_id=MASK_TOKEN,
                num_target_layers=8,
                target_layer_ids=(1, 4, 6),
                n_layers=2,
                **fields,
            )
            cache[key] = (target, convert_draft(d, d.parent / "drafter.gguf", outtype="f32", target=target))
        return cache[key]

    return make


@pytest.fixture(scope="session")
def packaged_pair(drafter_pair: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A package-data pair folder (as tools/train_pair/install.py writes dflash/data/pair) made from
    the synthetic tiny-b target and drafter: a stand-in export (GGUFs under the shipped names, a
    summary, held-out code prompts, a card) run through the installer."""
    import json
    import shutil
    import sys

    tools = str(Path(__file__).resolve().parents[1] / "tools")
    if tools not in sys.path:
        sys.path.append(tools)
    from train_pair.install import install

    target, drafter = drafter_pair(seed=1)
    export = tmp_path_factory.mktemp("export")
    shutil.copyfile(target, export / "target-q8_0.gguf")
    shutil.copyfile(drafter, export / "drafter-q8_0.gguf")
    (export / "summary.json").write_text(json.dumps({"corpus": {"heldout_permille": 20}}))
    code = [
        "def fibonacci(n):\n    if n < 2:\n",
        "class Stack:\n    def __init__(self):\n",
        "import os\n\n\ndef main():\n",
    ]
    with open(export / "heldout_prompts.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"prompt": p, "prompt_tokens": 0}) + "\n" for p in code)
    (export / "MODEL_CARD.md").write_text("# test pair\n")
    dest = tmp_path_factory.mktemp("package-data") / "pair"
    install(export, dest, n_code=3, n_prose=2)
    return dest


@pytest.fixture
def use_packaged_pair(packaged_pair: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """dflash.models' package-data pair folder pointed at `packaged_pair` for one test."""
    import dflash.models

    monkeypatch.setattr(dflash.models, "PAIR_DIR", packaged_pair)
    return packaged_pair


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """How long the upstream programs built during this session took (test_upstream_draft_dflash)."""
    import sys

    built = getattr(sys.modules.get("dflash.upstream_tools"), "BUILD_SECONDS", {})
    for name, seconds in built.items():
        terminalreporter.write_line(f"dflash: built upstream {name} in {seconds:.0f} s")
