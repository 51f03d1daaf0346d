"""The chunked-prefill oracle case on CUDA (tests/test_oracle_upstream.py::
test_chunked_prefill_matches_upstream_chunking: tiny-b f32 weights, f16 KV, 80 tokens in 16-token
forwards against upstream's eval_chunks([16] * 5); the test's switches: ggml_ext's GEMV, GEMM, mmq
launch policy and one-round delta rule off). Prints one JSON line per variant: the largest
|ours - upstream| per 16-token chunk and the test's bound, with the test's switches, then with each
remaining ggml_ext CUDA form off in turn, then with a fresh engine per chunk count, so a failure
names the form (or the chunk) it comes from.

    python3 tools/device/diag_oracle_chunks.py
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from dflash import _core
from dflash.synth import get_preset
from dflash.synth.qwen35 import write_qwen35_gguf

TOL = 2e-3


def engines(path: str) -> tuple[_core.TargetEngine, _core.UpstreamModel]:
    cfg = _core.EngineConfig()
    cfg.n_ctx, cfg.k_type, cfg.v_type, cfg.n_gpu_layers, cfg.n_threads = 256, "f16", "f16", 99, 2
    cfg.n_batch = cfg.n_logits_batch = 64
    cfg.stack_projections = cfg.fuse_gdn_inputs = False
    ucfg = _core.UpstreamConfig()
    ucfg.n_ctx, ucfg.k_type, ucfg.v_type, ucfg.n_gpu_layers, ucfg.n_threads = 256, "f16", "f16", 99, 2
    ucfg.n_batch = 64
    return _core.TargetEngine(path, cfg), _core.UpstreamModel(path, ucfg)


def report(name: str, path: str, tokens: list[int], ref: np.ndarray) -> None:
    ours, _ = engines(path)
    ours.reset()
    got = np.concatenate([ours.forward(tokens[i : i + 16], True)[0] for i in range(0, 80, 16)])
    per_chunk = [float(np.abs(got[i : i + 16] - ref[i : i + 16]).max()) for i in range(0, 80, 16)]
    bound = TOL * (1.0 + float(np.abs(ref).max()))
    print(
        json.dumps(
            {
                "variant": name,
                "per_chunk": [round(e, 5) for e in per_chunk],
                "bound": round(bound, 5),
                "ok": max(per_chunk) <= bound,
            }
        ),
        flush=True,
    )


def main() -> None:
    _core.set_gemv_enabled(False)
    _core.set_mma_enabled(False)
    _core.set_mmq_tiles_enabled(False)
    _core.set_gdn_one_round(False)
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "tiny-b-f32.gguf")
        write_qwen35_gguf(Path(path), get_preset("tiny-b").config, seed=0, weight_type="f32")
        _, up = engines(path)
        n_vocab = _core.TargetEngine(path, _core.EngineConfig()).hparams["n_vocab"]
        tokens = np.random.default_rng(3).integers(0, n_vocab, size=80).tolist()
        ref = up.eval_chunks(tokens, [16] * 5)
        report("test switches", path, tokens, ref)
        report("test switches again", path, tokens, ref)
        offs: list[tuple[str, Callable[[bool], None], Callable[[], bool]]] = [
            ("fuse_rms_norm off", _core.set_fuse_rms_norm_enabled, _core.fuse_rms_norm_enabled),
            ("fuse_glu off", _core.set_fuse_glu_enabled, _core.fuse_glu_enabled),
            ("fuse_add off", _core.set_fuse_add_enabled, _core.fuse_add_enabled),
            ("gdn_chain off", _core.set_gdn_chain_enabled, _core.gdn_chain_enabled),
        ]
        for name, setter, getter in offs:
            was = getter()
            setter(False)
            report(name, path, tokens, ref)
            setter(was)
        up2 = engines(path)[1]
        report("upstream re-run", path, tokens, up2.eval_chunks(tokens, [16] * 5))


if __name__ == "__main__":
    main()
