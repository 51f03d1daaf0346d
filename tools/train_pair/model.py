"""A PyTorch ``qwen35`` target with the math of upstream's graph (src/models/qwen35.cpp).

Shapes come from :class:`dflash.synth.qwen35.Qwen35Config`, the config the GGUF writer takes, so
the trained model exports with the project's writer (export.py). Conventions that the GGUF file
fixes and this module follows:
- RMSNorm gains are trained as offsets from 1 (Qwen3-Next style, weight decay pulls them to 1)
  and exported with the +1 added; the GDN output norm is a plain gain (exported as is).
- GDN: K heads map to V heads tiled (``k_head = v_head % n_k_heads``), q/k L2-normalised as
  ``x / sqrt(sum x^2 + eps)`` (upstream's rms_norm(eps/n)/sqrt(n)), g = -exp(A_log) softplus(a + dt_bias).
- Attention: ``attn_q`` yields Q and an output gate interleaved per head, per-head q/k RMSNorm,
  IMROPE on the first rope_dim dims: with all position axes equal it is NeoX RoPE on those dims.
A :class:`DecodeCache` carries conv/delta states and K/V for incremental greedy decoding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dflash.synth.qwen35 import Qwen35Config

from .delta_rule import chunk_gated_delta_rule, recurrent_gated_delta_rule


class RMSNorm(nn.Module):
    """``x / rms(x) * gain``; with ``offset`` the stored parameter is ``gain - 1``."""

    def __init__(self, n: int, eps: float, offset: bool = True) -> None:
        super().__init__()
        self.eps, self.offset = eps, offset
        self.weight = nn.Parameter(torch.zeros(n) if offset else torch.ones(n))

    def gain(self) -> Tensor:
        return self.weight + 1.0 if self.offset else self.weight

    def forward(self, x: Tensor) -> Tensor:
        xf = _up(x)
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.gain().to(y.dtype)).to(x.dtype)


def _up(x: Tensor) -> Tensor:
    """At least float32 (bf16 activations up, float64 references untouched)."""
    return x if x.dtype == torch.float64 else x.float()


def l2norm(x: Tensor, eps: float) -> Tensor:
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def rope_neox(x: Tensor, pos: Tensor, rope_dim: int, theta: float) -> Tensor:
    """NeoX rotation of the first ``rope_dim`` dims; x: [B, T, H, D], pos: [T] or [B, T]."""
    half = rope_dim // 2
    f = torch.float64 if x.dtype == torch.float64 else torch.float32
    inv = theta ** (-torch.arange(0, half, device=x.device, dtype=f) * 2.0 / rope_dim)
    ang = pos.to(f)[..., None] * inv  # [(B,) T, half]
    if ang.dim() == 2:
        ang = ang[None]
    cos, sin = ang.cos()[:, :, None, :], ang.sin()[:, :, None, :]
    xr = x[..., :rope_dim].to(f)
    x1, x2 = xr[..., :half], xr[..., half:]
    rot = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(x.dtype)
    return torch.cat([rot, x[..., rope_dim:]], -1)


@dataclass
class LayerCache:
    conv: Tensor | None = None  # [B, C, K-1]: the last K-1 conv inputs
    ssm: Tensor | None = None  # [B, Hv, dk, dv] float32
    k: Tensor | None = None  # [B, Hkv, T_max, hd]
    v: Tensor | None = None


@dataclass
class DecodeCache:
    """Per-sequence state for incremental decoding; all sequences share one position."""

    n_layer: int
    max_len: int
    pos: int = 0
    layers: list[LayerCache] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.layers = [LayerCache() for _ in range(self.n_layer)]


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: Qwen35Config, chunk: int = 64) -> None:
        super().__init__()
        self.cfg, self.chunk = cfg, chunk
        h = cfg.hidden
        self.in_qkv = nn.Linear(h, cfg.conv_dim, bias=False)
        self.in_z = nn.Linear(h, cfg.value_dim, bias=False)
        self.in_b = nn.Linear(h, cfg.n_v_heads, bias=False)
        self.in_a = nn.Linear(h, cfg.n_v_heads, bias=False)
        self.conv = nn.Parameter(torch.empty(cfg.conv_dim, cfg.ssm_conv).uniform_(-0.5, 0.5))
        self.dt_bias = nn.Parameter(torch.ones(cfg.n_v_heads))
        self.A_log = nn.Parameter(torch.empty(cfg.n_v_heads).uniform_(1.0, 16.0).log())
        self.norm = RMSNorm(cfg.ssm_state, cfg.rms_eps, offset=False)
        self.out = nn.Linear(cfg.value_dim, h, bias=False)

    def _conv(self, x: Tensor, lc: LayerCache | None) -> Tensor:
        """Causal depthwise conv over time, x: [B, T, C] -> [B, T, C]."""
        k = self.cfg.ssm_conv
        xt = x.transpose(1, 2)
        prev = (
            lc.conv if lc is not None and lc.conv is not None else xt.new_zeros(x.shape[0], x.shape[2], k - 1)
        )
        xt = torch.cat([prev.to(xt.dtype), xt], -1)
        if lc is not None:
            lc.conv = xt[..., -(k - 1) :].detach()
        y = F.conv1d(xt, self.conv.to(xt.dtype)[:, None, :], groups=x.shape[2])
        return y.transpose(1, 2)

    def forward(self, x: Tensor, lc: LayerCache | None = None) -> Tensor:
        cfg = self.cfg
        b, t, _ = x.shape
        hk, hv, d = cfg.n_k_heads, cfg.n_v_heads, cfg.ssm_state
        y = F.silu(self._conv(self.in_qkv(x), lc))
        q, k, v = y.split([cfg.key_dim, cfg.key_dim, cfg.value_dim], -1)
        q = l2norm(_up(q.reshape(b, t, hk, d)), cfg.rms_eps).repeat(1, 1, hv // hk, 1)  # tiled heads
        k = l2norm(_up(k.reshape(b, t, hk, d)), cfg.rms_eps).repeat(1, 1, hv // hk, 1)
        v = v.reshape(b, t, hv, d)
        beta = torch.sigmoid(_up(self.in_b(x)))
        g = -_up(self.A_log).exp() * F.softplus(_up(self.in_a(x)) + _up(self.dt_bias))
        args = (
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            g.transpose(1, 2),
            beta.transpose(1, 2),
        )
        state = lc.ssm if lc is not None else None
        if t == 1 and lc is not None:
            o, state = recurrent_gated_delta_rule(*args, state=state)
        else:
            o, state = chunk_gated_delta_rule(*args, state=state, chunk=self.chunk)
        if lc is not None:
            lc.ssm = state.detach()
        o = self.norm(o.transpose(1, 2)) * F.silu(self.in_z(x).reshape(b, t, hv, d))
        return self.out(o.reshape(b, t, cfg.value_dim))


class GatedAttention(nn.Module):
    def __init__(self, cfg: Qwen35Config) -> None:
        super().__init__()
        self.cfg = cfg
        h, hd = cfg.hidden, cfg.head_dim
        self.q_proj = nn.Linear(h, 2 * cfg.n_head * hd, bias=False)  # per head: [q | gate]
        self.k_proj = nn.Linear(h, cfg.n_head_kv * hd, bias=False)
        self.v_proj = nn.Linear(h, cfg.n_head_kv * hd, bias=False)
        self.o_proj = nn.Linear(cfg.n_head * hd, h, bias=False)
        self.q_norm = RMSNorm(hd, cfg.rms_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_eps)

    def forward(self, x: Tensor, pos: Tensor, lc: LayerCache | None = None, max_len: int = 0) -> Tensor:
        cfg = self.cfg
        b, t, _ = x.shape
        hd = cfg.head_dim
        qg = self.q_proj(x).reshape(b, t, cfg.n_head, 2 * hd)
        q, gate = qg[..., :hd], qg[..., hd:]
        q = rope_neox(self.q_norm(q), pos, cfg.rope_dim, cfg.rope_theta)
        k = self.k_norm(self.k_proj(x).reshape(b, t, cfg.n_head_kv, hd))
        k = rope_neox(k, pos, cfg.rope_dim, cfg.rope_theta)
        v = self.v_proj(x).reshape(b, t, cfg.n_head_kv, hd)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))  # [B, H, T, hd]
        mask = None
        causal = True
        if lc is not None:
            p0 = int(pos.reshape(-1)[0])
            if lc.k is None:
                lc.k = k.new_zeros(b, cfg.n_head_kv, max_len, hd)
                lc.v = v.new_zeros(b, cfg.n_head_kv, max_len, hd)
            assert lc.v is not None
            lc.k[:, :, p0 : p0 + t] = k
            lc.v[:, :, p0 : p0 + t] = v
            k, v = lc.k[:, :, : p0 + t], lc.v[:, :, : p0 + t]
            if p0 > 0:  # queries at p0..p0+t-1 see keys 0..own position (one query: all of them)
                causal = False
                if t > 1:
                    kpos = torch.arange(p0 + t, device=x.device)
                    mask = kpos[None, :] <= (p0 + torch.arange(t, device=x.device))[:, None]
        # GQA: q head i uses kv head i // (n_head / n_head_kv), as ggml's broadcast does
        o = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal and t > 1, enable_gqa=True
        )
        o = o.transpose(1, 2).reshape(b, t, cfg.n_head * hd)
        return self.o_proj(o * torch.sigmoid(gate.reshape(b, t, cfg.n_head * hd)))


class Block(nn.Module):
    def __init__(self, cfg: Qwen35Config, il: int, chunk: int) -> None:
        super().__init__()
        self.recurrent = cfg.is_recurrent(il)
        self.attn_norm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.mixer: nn.Module = GatedDeltaNet(cfg, chunk) if self.recurrent else GatedAttention(cfg)
        self.post_norm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.ffn_gate = nn.Linear(cfg.hidden, cfg.n_ff, bias=False)
        self.ffn_up = nn.Linear(cfg.hidden, cfg.n_ff, bias=False)
        self.ffn_down = nn.Linear(cfg.n_ff, cfg.hidden, bias=False)

    def forward(self, x: Tensor, pos: Tensor, lc: LayerCache | None, max_len: int) -> Tensor:
        h = self.attn_norm(x)
        x = x + (self.mixer(h, lc) if self.recurrent else self.mixer(h, pos, lc, max_len))
        h = self.post_norm(x)
        return x + self.ffn_down(F.silu(self.ffn_gate(h)) * self.ffn_up(h))


class Qwen35(nn.Module):
    def __init__(self, cfg: Qwen35Config, n_vocab: int, chunk: int = 64) -> None:
        super().__init__()
        if cfg.nextn_layers:
            raise ValueError("MTP blocks are not trained here")
        self.cfg, self.n_vocab = cfg, n_vocab
        self.embed = nn.Embedding(n_vocab, cfg.hidden)
        self.layers = nn.ModuleList(Block(cfg, il, chunk) for il in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.lm_head = nn.Linear(cfg.hidden, n_vocab, bias=False)
        if cfg.tied_embeddings:
            self.lm_head.weight = self.embed.weight
        self.reset_parameters()

    def reset_parameters(self, std: float = 0.02) -> None:
        """GPT-2 style: N(0, std), residual-stream writers scaled by 1/sqrt(2 n_layer)."""
        for name, p in self.named_parameters():
            if name.endswith(
                ("proj.weight", "in_qkv.weight", "in_z.weight", "in_a.weight", "in_b.weight")
            ) or (name.endswith(("ffn_gate.weight", "ffn_up.weight", "embed.weight", "lm_head.weight"))):
                nn.init.normal_(p, 0.0, std)
            if name.endswith(("o_proj.weight", "mixer.out.weight", "ffn_down.weight")):
                nn.init.normal_(p, 0.0, std / math.sqrt(2 * self.cfg.n_layer))

    def blocks(self) -> list[Block]:
        return [b for b in self.layers if isinstance(b, Block)]

    def forward(
        self,
        tokens: Tensor,
        cache: DecodeCache | None = None,
        return_hidden: bool = False,
        last_only: bool = False,
    ) -> tuple[Tensor, list[Tensor]]:
        """tokens [B, T] -> (logits [B, T or 1, V], per-layer outputs [B, T, hidden] if asked)."""
        t = tokens.shape[1]
        p0 = cache.pos if cache is not None else 0
        pos = torch.arange(p0, p0 + t, device=tokens.device)
        x = self.embed(tokens)
        hidden: list[Tensor] = []
        for il, layer in enumerate(self.layers):
            lc = cache.layers[il] if cache is not None else None
            x = layer(x, pos, lc, cache.max_len if cache is not None else 0)
            if return_hidden:
                hidden.append(x)
        if cache is not None:
            cache.pos += t
        if last_only:
            x = x[:, -1:]
        return self.lm_head(self.norm(x)), hidden

    def no_decay_names(self) -> set[str]:
        """Kept out of weight decay: norms, GDN dynamics (A_log, dt_bias, conv) and the embedding,
        whose rows for unused tokens (the drafter's <|mask|> among them) then keep their init scale."""
        keep = ("A_log", "dt_bias", "mixer.conv", "embed.weight")
        return {n for n, p in self.named_parameters() if p.dim() < 2 or n.endswith(keep)}


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
