"""Shared fixtures: tiny synthetic qwen35 models written once per session."""

from __future__ import annotations

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
