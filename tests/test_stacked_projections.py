"""Stacked weights (Qwen35Layer::stacked, ffn_gate_up): a forward computes each layer's adjacent,
alike input projections (attention q/k/v; Gated DeltaNet qkv/z/beta/alpha) as one product over
weights the loader placed back to back; on a GPU forwards of several tokens do so too, and take
the FFN's gate and up as one product. Same rows, same per-row arithmetic: on the CPU (one-token
forwards stacked; a prefill or verify keeps one product per weight, since ggml's CPU products of
several columns pick their f16 kernel by the matrix's height) the logits must equal those of one
product per weight, bit for bit, and stacking must happen.

On CUDA (DFLASH_TEST_NGL > 0): ggml's CUDA buffers pad a quantized weight whose rows are not a
multiple of 512 values (mmq reads past the last row), so such weights are not adjacent and are
not stacked (tiny-c's 256-wide rows; the 27B's 5120 are stacked). Float weights of several
columns go to cuBLAS or ggml's mul_mat_f, whose algorithm depends on the height (H200: 4e-3 of
the largest logit for tiny-a's f32, 1.1e-2 for tiny-b's f16, 40 logits deep): a 2e-2 bound. The
k-quants' products (ggml_ext's GEMM and GEMV: each row's arithmetic its own) must change no bit:
the small preset's 512-wide q4_K_M rows are stacked on CUDA."""

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
    rows = [eng.forward(tokens[:16], True)[0], eng.forward(tokens[16:21], True)[0]]
    rows += [eng.forward([t], True)[0] for t in tokens[21:]]  # decode steps
    return np.concatenate(rows), eng.graph_shapes["stacked_projections"], int(eng.hparams["n_embd"])


@pytest.mark.parametrize(
    ("preset", "wtype"),
    [
        ("tiny-a", "f32"),
        ("tiny-b", "f16"),
        ("tiny-c", "q4_K_M"),
        pytest.param(
            "small",
            "q4_K_M",
            marks=pytest.mark.skipif(NGL == 0, reason="CUDA's stacked k-quants (the CPU: tiny-c)"),
        ),
    ],
)
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
    if NGL > 0 and wtype in ("f16", "f32"):
        scale = float(np.abs(plain).max())
        assert np.abs(stacked - plain).max() <= 2e-2 * scale
    else:
        np.testing.assert_array_equal(stacked, plain)
