"""The gated delta rule of Gated DeltaNet, in two forms that must agree.

Per value head, with state S (dk x dv) and q pre-scaled by 1/sqrt(dk) (REFERENCE.md section 1):
    S <- exp(g) S;  d = beta (v - S^T k);  S <- S + k d^T;  o = S^T q
``recurrent_gated_delta_rule`` runs that literally (the oracle and the one-token decode step);
``chunk_gated_delta_rule`` is the parallel WY form used for training and prefill. Inside a chunk
with cumulative log-decay G, the new values D solve the unit lower-triangular system
(I + A) D = beta V - diag(beta e^G) K S0 with A_ij = beta_i e^(G_i - G_j) k_i.k_j (j < i); only
the chunk-to-chunk state update stays sequential. Both compute in float32 (float64 inputs stay
float64) whatever the input dtype: the decays and the solve are not safe in bf16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _compute_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _no_autocast(x: Tensor) -> torch.autocast:
    # under bf16 autocast the matmuls below would silently run in bf16
    return torch.autocast(x.device.type, enabled=False)


def recurrent_gated_delta_rule(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """q, k: [B, H, T, dk]; v: [B, H, T, dv]; g (log decay, <= 0), beta: [B, H, T].

    Returns (o [B, H, T, dv] in v's dtype, final state [B, H, dk, dv] in the compute dtype)."""
    with _no_autocast(q):
        return _recurrent(q, k, v, g, beta, state)


def _recurrent(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor | None
) -> tuple[Tensor, Tensor]:
    f, out_dtype = _compute_dtype(q), v.dtype
    b, h, t, dk = q.shape
    dv = v.shape[-1]
    q, k, v, g, beta = (x.to(f) for x in (q, k, v, g, beta))
    q = q * dk**-0.5
    s = torch.zeros(b, h, dk, dv, dtype=f, device=q.device) if state is None else state.to(f)
    out = []
    for i in range(t):
        s = s * g[:, :, i].exp()[..., None, None]
        kt = k[:, :, i]
        d = beta[:, :, i, None] * (v[:, :, i] - torch.einsum("bhkv,bhk->bhv", s, kt))
        s = s + kt[..., :, None] * d[..., None, :]
        out.append(torch.einsum("bhkv,bhk->bhv", s, q[:, :, i]))
    return torch.stack(out, 2).to(out_dtype), s


def chunk_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    state: Tensor | None = None,
    chunk: int = 64,
) -> tuple[Tensor, Tensor]:
    """Same contract as :func:`recurrent_gated_delta_rule`, O(T) sequential steps of size ``chunk``."""
    with _no_autocast(q):
        return _chunked(q, k, v, g, beta, state, chunk)


def _chunked(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor | None, chunk: int
) -> tuple[Tensor, Tensor]:
    f, out_dtype = _compute_dtype(q), v.dtype
    b, h, t, dk = q.shape
    dv = v.shape[-1]
    q, k, v, g, beta = (x.to(f) for x in (q, k, v, g, beta))
    q = q * dk**-0.5
    pad = (-t) % chunk
    if pad:  # padded steps have beta = 0 and g = 0: they leave the state unchanged
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    n = (t + pad) // chunk
    q, k, v = (x.reshape(b, h, n, chunk, x.shape[-1]) for x in (q, k, v))
    g, beta = (x.reshape(b, h, n, chunk) for x in (g, beta))

    gc = g.cumsum(-1)  # G_i within each chunk
    incl = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    # e^(G_i - G_j) for j <= i, 0 above the diagonal (masked before exp: G_i - G_j > 0 there)
    decay = (gc[..., :, None] - gc[..., None, :]).masked_fill(~incl, float("-inf")).exp()
    kb = k * beta[..., None]
    a = (kb @ k.transpose(-1, -2) * decay).tril(-1)
    eye = torch.eye(chunk, dtype=f, device=q.device)
    rhs = torch.cat([v * beta[..., None], kb * gc.exp()[..., None]], -1)
    sol = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)
    u, w = sol.split([dv, dk], -1)  # D = U - W S0

    attn = q @ k.transpose(-1, -2) * decay  # inclusive lower triangle
    q_dec = q * gc.exp()[..., None]
    k_dec = k * (gc[..., -1:] - gc).exp()[..., None]  # decay from step j to the chunk end
    last = gc[..., -1].exp()  # [B, H, N]

    s = torch.zeros(b, h, dk, dv, dtype=f, device=q.device) if state is None else state.to(f)
    out = []
    for i in range(n):
        d = u[:, :, i] - w[:, :, i] @ s
        out.append(q_dec[:, :, i] @ s + attn[:, :, i] @ d)
        s = s * last[:, :, i, None, None] + k_dec[:, :, i].transpose(-1, -2) @ d
    o = torch.stack(out, 2).reshape(b, h, n * chunk, dv)[:, :, :t]
    return o.to(out_dtype), s
