"""The issue's oracle: dflash's logits on the exported GGUF == the PyTorch model's, on the same tokens.

The PyTorch side runs in float64 (the reference); dflash runs the f32 GGUF on the CPU with an f32
KV cache, so the difference is ggml's f32 rounding alone. ``python -m train_pair.oracle RUN_DIR``
checks a finished run's target (needs the native module, so on the dev machine).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .model import Qwen35


@dataclass
class OracleResult:
    max_abs_diff: float
    max_abs_logit: float
    n_tokens: int
    argmax_agree: float  # fraction of positions with the same top token

    @property
    def rel(self) -> float:
        return self.max_abs_diff / (1.0 + self.max_abs_logit)


def engine_logits(gguf: Path, tokens: list[int], kv_type: str = "f32", threads: int = 2) -> np.ndarray:
    from dflash import _core

    cfg = _core.EngineConfig()
    cfg.n_ctx = max(256, 1 << (len(tokens) - 1).bit_length())
    cfg.n_threads, cfg.n_gpu_layers = threads, 0
    cfg.k_type = cfg.v_type = kv_type
    return np.asarray(_core.TargetEngine(str(gguf), cfg).eval_logits(tokens))


@torch.no_grad()
def compare(model: Qwen35, gguf: Path, tokens: list[int], kv_type: str = "f32") -> OracleResult:
    ref_model = copy.deepcopy(model).to("cpu", torch.float64).eval()
    ref = ref_model(torch.tensor([tokens]))[0][0].numpy()
    got = engine_logits(gguf, tokens, kv_type)
    return OracleResult(
        max_abs_diff=float(np.abs(got - ref).max()),
        max_abs_logit=float(np.abs(ref).max()),
        n_tokens=len(tokens),
        argmax_agree=float((got.argmax(-1) == ref.argmax(-1)).mean()),
    )


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    from .checkpoint import load_target

    p = argparse.ArgumentParser(prog="python -m train_pair.oracle", description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--tokens", type=int, default=256)
    a = p.parse_args(argv)
    model = load_target(a.run_dir / "target" / "model.pt", torch.device("cpu"))
    held = np.load(a.run_dir / "corpus" / "heldout.npy")[: a.tokens].astype(int).tolist()
    r = compare(model, a.run_dir / "target" / "target-f32.gguf", held)
    print(json.dumps({**vars(r), "rel": r.rel}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
