"""Stacked input projections (Qwen35Layer::stacked): a one-token forward computes each layer's
adjacent, alike input projections (attention q/k/v; Gated DeltaNet qkv/z/beta/alpha) as one
product over weights the loader placed back to back. Same rows, same per-row arithmetic: on the
CPU the logits must equal those of one product per weight, bit for bit, and stacking must happen.

On CUDA (DFLASH_TEST_NGL > 0): ggml's CUDA buffers pad a quantized weight whose rows are not a
multiple of 512 values (mmq reads past the last row), so such weights are not adjacent and are
not stacked (tiny-c's 256-wide rows; the 27B's 5120 are stacked). The stacked graph's row slices
feed ggml's CUDA ops as strided views, which some of them handle with other kernels than the
contiguous tensors of the plain graph (seen on the H200 with tiny-b's f16 weights: 5e-4 of the
logit scale), so there the logits must agree to 1e-3 of the largest one."""

from __future__ import annotations

import os

import numpy as np
import pytest

from dflash import _core

NGL = int(os.environ.get("DFLASH_TEST_NGL", "0"))


def _decode_logits(path: str, stack: bool) -> tuple[np.ndarray, int, int]:
    cfg = _core.EngineConfig()
    cfg.n_ctx, cfg.n_threads, cfg.n_gpu_layers = 256, 2, NGL
    cfg.stack_projections = stack
    eng = _core.TargetEngine(path, cfg)
    tokens = np.random.default_rng(4).integers(0, eng.hparams["n_vocab"], size=40).tolist()
    rows = [eng.forward(tokens[:16], True)[0]]  # a prefill (never stacked), then decode steps
    rows += [eng.forward([t], True)[0] for t in tokens[16:]]
    return np.concatenate(rows), eng.graph_shapes["stacked_projections"], int(eng.hparams["n_embd"])


@pytest.mark.parametrize(("preset", "wtype"), [("tiny-a", "f32"), ("tiny-b", "f16"), ("tiny-c", "q4_K_M")])
def test_stacked_projections_change_no_logit(synth_model, preset: str, wtype: str) -> None:
    path = str(synth_model(preset, wtype))
    stacked, n_stacked, hidden = _decode_logits(path, True)
    plain, n_plain, _ = _decode_logits(path, False)
    assert n_plain == 0
    if NGL > 0 and wtype.startswith("q") and hidden % 512 != 0:
        assert n_stacked == 0, "CUDA pads these weights: they cannot be adjacent"
        np.testing.assert_array_equal(stacked, plain)
        return
    assert n_stacked > 0, "no layer's input projections were stacked"
    if NGL > 0:
        scale = float(np.abs(plain).max())
        assert np.abs(stacked - plain).max() <= 1e-3 * scale
    else:
        np.testing.assert_array_equal(stacked, plain)
