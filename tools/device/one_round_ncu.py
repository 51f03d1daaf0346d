"""The 27B's delta rule shapes (48 v heads, 16 q/k heads, S 128) through the one-round kernel, for ncu."""

import sys

import numpy as np

from dflash import _core

n = int(sys.argv[1]) if len(sys.argv) > 1 else 64
rng = np.random.default_rng(0)
f = np.float32
q = (rng.standard_normal((n, 16, 128)) / 11).astype(f)
k = rng.standard_normal((n, 16, 128)).astype(f)
k /= np.linalg.norm(k, axis=-1, keepdims=True)
v = rng.standard_normal((n, 48, 128)).astype(f)
g = -np.abs(rng.standard_normal((n, 48, 1))).astype(f) * 0.3
beta = rng.uniform(0.1, 0.9, (n, 48, 1)).astype(f)
state = (rng.standard_normal((48, 128, 128)) * 0.1).astype(f)
for _ in range(2):
    _core.op_gated_delta_net(q, k, v, g, beta, state, gpu=True, reordered=True)
print("ok")
