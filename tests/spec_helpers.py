"""Helpers shared by the speculative-decoding tests."""

from __future__ import annotations

from typing import Any

import numpy as np


def corrupted_reference(prompt: list[int], ref: list[int], rng: np.random.Generator) -> Any:
    """A rewrite hook for a chain's drafts or a tree's top-1 candidates (the seeded chain): the
    reference continuation with one random corruption, so that accepts of every length happen
    with a random-weight drafter."""

    def rewrite(start: int, drafts: list[int]) -> list[int]:
        i = start - len(prompt) + 1  # reference index of the first drafted token
        good = ref[i : i + len(drafts)] + [0] * len(drafts)
        bad_at = int(rng.integers(0, 2 * len(drafts)))  # past the end: all good
        return [t if j != bad_at else (t + 1) % 4096 for j, t in enumerate(good[: len(drafts)])]

    return rewrite
