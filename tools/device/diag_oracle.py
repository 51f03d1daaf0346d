"""Where our logits and upstream's part on one synthetic GGUF (the oracle test's run: a 64-token
prefill, then 32 one-token decodes), each side on the CPU and on the GPU: max |diff| over the
prefill rows and over the decode rows, per pair of sides. Run it once per environment to test
(e.g. DFLASH_MMQ_FIXUP_ITERS=0, DFLASH_GEMV=0)."""

import sys

import numpy as np

from dflash import _core
from dflash.synth import get_preset, write_qwen35_gguf

preset, wtype = (sys.argv[1], sys.argv[2]) if len(sys.argv) > 2 else ("tiny-c", "q4_K")
config = get_preset(preset).config
path = str(write_qwen35_gguf(f"/tmp/diag-{preset}-{wtype}.gguf", config, seed=0, weight_type=wtype))


def ours(ngl: int, tokens: list[int]) -> np.ndarray:
    cfg = _core.EngineConfig()
    cfg.n_ctx, cfg.k_type, cfg.v_type, cfg.n_gpu_layers, cfg.n_threads = 256, "f16", "f16", ngl, 4
    cfg.n_batch = cfg.n_logits_batch = 64
    e = _core.TargetEngine(path, cfg)
    rows = [e.forward(tokens[:64], True)[0]] + [e.forward([t], True)[0] for t in tokens[64:]]
    return np.concatenate(rows)


def upstream(ngl: int, tokens: list[int]) -> np.ndarray:
    u = _core.UpstreamConfig()
    u.n_ctx, u.k_type, u.v_type, u.n_gpu_layers, u.n_threads, u.n_batch = 256, "f16", "f16", ngl, 4, 64
    return _core.UpstreamModel(path, u).eval_chunks(tokens, [64] + [1] * 32)


tokens = np.random.default_rng(1).integers(0, 1000, size=96).tolist()
got = {"ours-cpu": ours(0, tokens), "up-cpu": upstream(0, tokens)}
if _core.gpu_backend_available():
    got.update({"ours-gpu": ours(99, tokens), "up-gpu": upstream(99, tokens)})
scale = float(np.abs(got["up-cpu"]).max())
print(f"{preset} {wtype}: max |logit| {scale:.3g}")
names = list(got)
for i, a in enumerate(names):
    for b in names[i + 1 :]:
        d = np.abs(got[a] - got[b])
        worst = int(d.max(axis=1).argmax())
        print(f"  {a:>8} vs {b:<8} prefill {d[:64].max():.3g}  decode {d[64:].max():.3g}  worst row {worst}")
