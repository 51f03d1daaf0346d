"""Stacked weights (Qwen35Layer::stacked, ffn_gate_up): a forward computes each layer's adjacent,
alike input projections (attention q/k/v; Gated DeltaNet qkv/z/beta/alpha) as one product over
weights the loader placed back to back, and a forward of several tokens the FFN's gate and up as
one. Same rows, same per-row arithmetic where the kernel does not depend on the matrix's height:
on the CPU the logits of prefills, multi-token forwards and decode steps must equal those of one
product per weight, bit for bit, and stacking must happen. The exception is the CPU's f16
product of several columns: ggml takes llamafile's tinyBLAS (f32 activations) only for heights
that are multiples of 4 and otherwise its own dot product of activations rounded to f16, so
tiny-b's small beta/alpha weights (apart) and the stack (together) get different kernels; there
the logits must agree to 5e-3 of the largest one (measured: 1.3e-3).

On CUDA (DFLASH_TEST_NGL > 0) float weights of several columns go to cuBLAS or ggml's mul_mat_f,
whose algorithm also depends on the height (H200: 4e-3 of the largest logit for tiny-a's f32,
1.1e-2 for tiny-b's f16, 40 logits deep): a 2e-2 bound there. The k-quants' products (ggml_ext's
GEMM and GEMV: each row's arithmetic its own) must change no bit: the small preset's 512-wide
q4_K_M rows are stacked on CUDA. (A verify is unaffected: on the
CPU its products take the one-column kernel of a decode, ggml_ext/BATCH_INVARIANCE.md.)

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
    if wtype == "f16" or (NGL > 0 and wtype == "f32"):
        scale = float(np.abs(plain).max())
        assert np.abs(stacked - plain).max() <= (2e-2 if NGL > 0 else 5e-3) * scale
    else:
        np.testing.assert_array_equal(stacked, plain)
