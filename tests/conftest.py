"""Shared fixtures: tiny synthetic qwen35 models written once per session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

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
