"""Smallest CUDA engine run (tiny synthetic target: prefill, decode, verify + commit), for
compute-sanitizer when a CUDA error needs a kernel name."""

import sys

from dflash import _core
from dflash.synth import get_preset, write_qwen35_gguf

preset = sys.argv[1] if len(sys.argv) > 1 else "tiny-a"
path = write_qwen35_gguf(f"/tmp/diag-{preset}.gguf", get_preset(preset).config, seed=0, weight_type="f32")
cfg = _core.EngineConfig()
cfg.n_ctx, cfg.n_gpu_layers, cfg.n_threads, cfg.n_verify_max = 256, 99, 4, 32
eng = _core.TargetEngine(str(path), cfg)
print("loaded", eng.backend, flush=True)
out: list[int] = []
eng.generate([1, 2, 3, 4, 5, 6], 4, 0.0, 0, 1.0, 0, [], lambda t: out.append(t) or True)
print("generate ok", out, flush=True)
