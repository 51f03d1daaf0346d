"""One forward of N tokens of the 27B-shaped target with the drafter's captures, for ncu.

A verify's GEMMs under Nsight Compute without kernel_profile.py's PyTorch profiler (its CUPTI
session and ncu's would compete) and without a prompt (a prefill would launch the same kernels
at 64 columns first). Session 33 on the H100:

    ncu --graph-profiling node -k regex:"gemm_kquant_mma|wgmma" --launch-count 9 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section SchedulerStats --section MemoryWorkloadAnalysis \
      python3 tools/device/ncu_forward.py 32 > $OUT/ncu-forward32.txt
"""

from __future__ import annotations

import argparse

import dflash._core as _core
import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", type=int, help="tokens in the forward (1..64)")
    ap.add_argument("-m", "--model", default="/tmp/q27.gguf")
    ap.add_argument("--draft", default="/tmp/d27.gguf")
    a = ap.parse_args()
    cfg = _core.EngineConfig()
    cfg.n_ctx, cfg.n_gpu_layers = 4096, 99
    cfg.n_verify_max = max(a.n, 16)
    cfg.n_logits_batch = max(cfg.n_logits_batch, cfg.n_verify_max)
    target = _core.TargetEngine(a.model, cfg)
    draft = _core.DraftEngine(a.draft, target, _core.DraftEngineConfig())
    layers = [int(x) for x in draft.hparams["target_layers"]]
    toks = np.random.default_rng(0).integers(0, int(target.hparams["n_vocab"]), size=a.n).tolist()
    target.reset()
    target.time_forward(toks, True, layers)
    print(f"one forward of {a.n} tokens")


if __name__ == "__main__":
    main()
