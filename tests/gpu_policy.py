"""What the speculative-decoding tests expect on the GPU machine (DFLASH_TEST_NGL > 0), in one place.

On CUDA a forward of many tokens and a forward of one token run different kernels, so the same
position's logits differ by rounding. ggml runs cuBLAS in TF32; the tests turn that off
(NVIDIA_TF32_OVERRIDE=0), which does not reach ggml's own tensor-core kernels (for f32 weights
and a few columns most likely mmf). Measured on the H200 with it off (bench/results/
h200-s3-cuda-tests.log): verify vs single-token logits differ by up to 0.084 on the tiny models,
about 5e-3 of their scale; 0 when both sides run the same number of columns. Quantized weights are
no better: activations are quantized per block and a rounding flip there moves later layers
visibly (ggml's CPU q8_0 kernels differ between batches of >= 64 rows and single rows the same
way, upstream included). So on the GPU, logit and state tolerances are the GPU's, and greedy
output must equal autoregressive output token for token except where the first divergence is a
near-tie of the autoregressive logits (counted, printed and bounded). Exact equality on CUDA is
what the batch-invariant mode gives (EngineConfig.invariant_matmul, ggml_ext/BATCH_INVARIANCE.md),
and `test_cuda_chain_with_invariant_matmuls_equals_decoding` requires it (20/20 on the H200,
bench/results/h200-s4-cuda-tests.log); the default mode's near-tie flips depend on which kernel a
column count picks (e.g. mmvq with 5..8 columns runs 2 warps, with 1 column 4), so their number
is reported, not bounded."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

NGL = int(os.environ.get("DFLASH_TEST_NGL", "0"))
ON_GPU = NGL > 0
if ON_GPU:
    os.environ.setdefault("NVIDIA_TF32_OVERRIDE", "0")
# |batched - single-token logits| <= LOGIT_TOL * (1 + max |logit|)
LOGIT_TOL = 6e-2 if ON_GPU else 2e-3
STATE_TOL = 5e-2 if ON_GPU else 1e-4  # recurrent state after commit vs AR (see assert_state_close)
TIE_TOL = 1e-2  # a first divergence is a near-tie when the AR logit gap is below this (relative, GPU)


def assert_state_close(got: Any, want: Any, what: str = "state") -> None:
    """Recurrent state after a commit vs the autoregressive one. CPU: elementwise (rtol STATE_TOL,
    atol STATE_TOL / 10). GPU: rounding differences scale with the state's largest entries, not
    each entry (near-zero entries differ by more than their own size), so the bound is
    STATE_TOL x max(1, max |want|) on the largest difference."""
    got, want = np.asarray(got), np.asarray(want)
    if not ON_GPU:
        np.testing.assert_allclose(got, want, rtol=STATE_TOL, atol=STATE_TOL / 10, err_msg=what)
        return
    err, bound = float(np.abs(got - want).max()), STATE_TOL * max(1.0, float(np.abs(want).max()))
    assert err <= bound, f"{what}: max |difference| {err:.3g} > {bound:.3g}"


def assert_argmax_matches(got: Any, ref_logits: Any, what: str = "argmax") -> list[tuple[int, float]]:
    """Argmax per row of a batched forward vs the autoregressive logits `ref_logits` (rows x vocab):
    equal on the CPU; on the GPU a differing row must be a near-tie of the reference logits (gap
    below TIE_TOL relative). Returns the near-ties (row, gap), printed by the caller."""
    ref_logits = np.asarray(ref_logits)
    ties = []
    for i, (g, row) in enumerate(zip(got, ref_logits, strict=True)):
        want = int(np.argmax(row))
        if int(g) == want:
            continue
        assert ON_GPU, f"{what}: row {i} argmax {int(g)}, autoregressive {want}"
        gap = float(row[want] - row[int(g)])
        bound = TIE_TOL * (1.0 + float(np.abs(row).max()))
        assert gap <= bound, f"{what}: row {i} argmax {int(g)} vs {want}, AR gap {gap:.3g} > {bound:.3g}"
        ties.append((i, gap))
    return ties


class SameTokens:
    """Collects greedy-equality checks of several prompts: exact on CPU; on the GPU a divergence
    must sit at a near-tie of the autoregressive logits (the exact count is printed)."""

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
        assert ON_GPU or self.exact == n
