"""How far our CUDA logits are from upstream libllama's on the oracle test's file and tokens
(tests/test_oracle_upstream.py: a 64-token prefill, then 32 decode steps; ggml's own matmuls on
both sides), with each of the engine's reordering forms on and off: the one-round delta rule
(DFLASH_GDN_ONE_ROUND) and the SwiGLU read by the quantizer (DFLASH_FUSE_GLU). Prints one JSON
line per (preset, weight type, form): the largest |ours - upstream| over the prefill rows and
over the decode rows, and the test's bound.

    python3 tools/device/diag_oracle_forms.py [--presets tiny-c:q4_K,tiny-c:q8_0]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from dflash import _core
from dflash.synth import get_preset
from dflash.synth.qwen35 import write_qwen35_gguf


def engine(path: str) -> _core.TargetEngine:
    cfg = _core.EngineConfig()
    cfg.n_ctx, cfg.k_type, cfg.v_type, cfg.n_gpu_layers, cfg.n_threads = 256, "f16", "f16", 99, 2
    cfg.n_batch = cfg.n_logits_batch = 64
    cfg.stack_projections = cfg.fuse_gdn_inputs = False
    return _core.TargetEngine(path, cfg)


def logits(path: str, tokens: list[int]) -> tuple[np.ndarray, np.ndarray]:
    eng = engine(path)
    pre, _, _ = eng.forward(tokens[:64], True)
    dec = np.concatenate([eng.forward([t], True)[0] for t in tokens[64:]])
    return pre, dec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", default="tiny-c:q4_K,tiny-c:q8_0,tiny-c:q4_K_M")
    args = ap.parse_args()
    _core.set_gemv_enabled(False)
    _core.set_mma_enabled(False)
    _core.set_mmq_tiles_enabled(False)
    tmp = Path(tempfile.mkdtemp())
    for spec in args.presets.split(","):
        preset, wtype = spec.split(":")
        path = tmp / f"{preset}-{wtype}.gguf"
        write_qwen35_gguf(path, get_preset(preset).config, seed=0, weight_type=wtype)
        ucfg = _core.UpstreamConfig()
        ucfg.n_ctx, ucfg.k_type, ucfg.v_type, ucfg.n_gpu_layers, ucfg.n_threads = 256, "f16", "f16", 99, 2
        ucfg.n_batch = 64
        up = _core.UpstreamModel(str(path), ucfg)
        n_vocab = engine(str(path)).hparams["n_vocab"]
        tokens = np.random.default_rng(1).integers(0, n_vocab, size=96).tolist()
        ref = up.eval_chunks(tokens, [64] + [1] * 32)
        bound = 2e-2 * (1.0 + float(np.abs(ref).max()))
        for one_round in (True, False):
            for glu in (True, False):
                _core.set_gdn_one_round(one_round)
                _core.set_fuse_glu_enabled(glu)
                pre, dec = logits(str(path), tokens)
                row = {
                    "preset": preset,
                    "wtype": wtype,
                    "one_round": one_round,
                    "fuse_glu": glu,
                    "prefill_err": float(np.abs(pre - ref[:64]).max()),
                    "decode_err": float(np.abs(dec - ref[64:]).max()),
                    "bound": bound,
                }
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
