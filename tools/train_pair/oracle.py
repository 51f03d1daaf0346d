"""The issue's oracle: dflash's logits on the exported GGUF == the PyTorch model's, on the same tokens.

The PyTorch side runs in float64 (the reference); dflash runs the f32 GGUF on the CPU with an f32
KV cache, so the difference is ggml's f32 rounding alone. ``python -m train_pair.oracle T.gguf``
checks a shipped target file (needs the native module, so on the dev machine).
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


def heldout_tokens(n: int) -> list[int]:
    """The first ``n`` tokens of the held-out stdlib files (real text, not random ids)."""
    from .corpus import collect, core_encoder, is_heldout

    docs, _ = collect()
    text = "".join(d.text for d in docs if is_heldout(d.path, 20))
    return core_encoder()([text[: 8 * n]])[0][:n]


def main(argv: list[str] | None = None) -> int:
    """Check a shipped target GGUF: import it (dequantized) into PyTorch, write it back as f32, and
    compare dflash on that f32 file (tight) and on the given file itself (its own quantisation)."""
    import argparse
    import json
    import tempfile

    from .export import export_target
    from .gguf_import import load_target_gguf

    p = argparse.ArgumentParser(prog="python -m train_pair.oracle", description=__doc__.splitlines()[0])
    p.add_argument("gguf", type=Path, help="a qwen35 target GGUF (f32, q8_0, ...)")
    p.add_argument("--tokens", type=int, default=256)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    model = load_target_gguf(a.gguf)
    tokens = heldout_tokens(a.tokens)
    with tempfile.TemporaryDirectory() as d:
        f32 = compare(model, export_target(model, Path(d) / "f32.gguf", "f32"), tokens)
    given = compare(model, a.gguf, tokens)
    report = {"f32_roundtrip": {**vars(f32), "rel": f32.rel}, "given_file": {**vars(given), "rel": given.rel}}
    print(json.dumps(report, indent=1))
    return 0 if f32.rel <= 1e-4 and f32.argmax_agree == 1.0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
