"""What the speculative-decoding tests expect on the GPU machine (DFLASH_TEST_NGL > 0), in one place.

On CUDA a forward of many tokens and a forward of one token run different kernels (cuBLAS or
mmq instead of the vector matmuls, the tiled instead of the vector attention kernel), so the same
position's logits differ by rounding. ggml runs cuBLAS in TF32, which alone moves the tiny f32
models' logits by ~1e-2 of their scale; the tests turn TF32 off (NVIDIA_TF32_OVERRIDE=0, read when
cuBLAS starts) so that what is left is fp32 and f16 rounding. Quantized weights are no better
here: activations are quantized per block, and a rounding flip there moves later layers visibly
(ggml's CPU q8_0 kernels differ between batches of >= 64 rows and single rows in the same way,
upstream included). So on the GPU, logit tolerances are the GPU's, and greedy output must equal
autoregressive output token for token except where the first divergence is a near-tie of the
autoregressive logits (counted, printed and bounded)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

NGL = int(os.environ.get("DFLASH_TEST_NGL", "0"))
ON_GPU = NGL > 0
if ON_GPU:
    os.environ.setdefault("NVIDIA_TF32_OVERRIDE", "0")
# |batched - single-token logits| <= LOGIT_TOL * (1 + max |logit|)
LOGIT_TOL = 3e-2 if ON_GPU else 2e-3
TIE_TOL = 3e-3  # a first divergence is a near-tie when the AR logit gap is below this (relative)


class SameTokens:
    """Collects greedy-equality checks of several prompts: exact on CPU; on the GPU a divergence
    must sit at a near-tie of the autoregressive logits, and most prompts must be exact."""

    def __init__(self, name: str) -> None:
        self.name, self.exact, self.ties = name, 0, []

    def check(self, out: list[int], ref: list[int], target: Any, prompt: list[int]) -> None:
        if out == ref:
            self.exact += 1
            return
        assert ON_GPU, f"{self.name}: output differs from autoregressive output"
        n = min(len(out), len(ref))
        i = next((k for k in range(n) if out[k] != ref[k]), n)
        assert i < len(out) and i < len(ref), f"{self.name}: lengths differ ({len(out)} vs {len(ref)})"
        logits = np.asarray(target.eval_logits(prompt + ref[:i]))[-1]
        gap = float(logits[ref[i]] - logits[out[i]])
        bound = TIE_TOL * (1.0 + float(np.abs(logits).max()))
        assert gap <= bound, f"{self.name}: diverged at token {i}, AR logit gap {gap:.3g} > {bound:.3g}"
        self.ties.append((i, gap))

    def finish(self) -> None:
        n = self.exact + len(self.ties)
        print(f"{self.name}: {self.exact}/{n} identical; near-ties (token, gap): {self.ties}")
        assert self.exact >= n / 2, f"{self.name}: only {self.exact} of {n} prompts identical"
