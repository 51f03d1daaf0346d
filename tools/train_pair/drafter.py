"""The DFlash drafter (REFERENCE.md section 2) and its training objective.

A few Qwen3 layers of the target's hidden size. Context: raw outputs of target layers
``target_layer_ids`` (HF convention: output of that layer), concatenated, ``H = hidden_norm(fc(.))``.
Every layer attends over [context K/V from H (own k_proj/v_proj, k_norm, RoPE at true positions);
block K/V]; context rows never go through Q, o_proj, MLP or the residual. A block is
``[anchor, MASK x (B-1)]`` at positions a..a+B-1 and slot k predicts the token at a+k. The block
sees context positions < a only. Sliding layers are causal inside the block and full layers
bidirectional (the reference drafters' default when the config has no ``is_causal``). The
embedding and LM head are the frozen target's.

Training packs many blocks of one sequence into one forward: each block's queries see its own
context prefix and its own block only (a boolean mask), like the paper's random-anchor batches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .model import RMSNorm, rope_neox

SLIDING = "sliding_attention"
FULL = "full_attention"


def spread_layer_ids(n_target: int, n_features: int = 5) -> list[int]:
    """z-lab's rule: ids spread over [1, n_target - 3] ([1, 16, 31, 46, 61] for 64 layers)."""
    start, end = 1, n_target - 3
    n = max(1, min(n_features, end - start + 1))
    if n == 1:
        return [n_target // 2]
    return [int(round(start + i * (end - start) / (n - 1))) for i in range(n)]


@dataclass(frozen=True)
class DrafterConfig:
    hidden: int
    num_target_layers: int
    vocab: int
    mask_token_id: int
    n_layers: int = 3
    n_heads: int = 8
    n_kv_heads: int = 2
    head_dim: int = 64
    ffn: int = 1536
    block_size: int = 16
    target_layer_ids: tuple[int, ...] = ()  # empty: spread_layer_ids(num_target_layers)
    layer_types: tuple[str, ...] = ()  # empty: sliding x (n_layers - 1), then full (like Qwen3.6's)
    sliding_window: int = 2048
    is_causal: bool | None = None  # None: per layer (sliding causal, full bidirectional)
    rope_theta: float = 1.0e7
    rms_eps: float = 1.0e-6
    max_position_embeddings: int = 32768
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def layer_ids(self) -> tuple[int, ...]:
        return self.target_layer_ids or tuple(spread_layer_ids(self.num_target_layers))

    @property
    def types(self) -> tuple[str, ...]:
        return self.layer_types or (SLIDING,) * (self.n_layers - 1) + (FULL,)

    def causal(self, i: int) -> bool:
        return self.is_causal if self.is_causal is not None else self.types[i] == SLIDING

    def hf_config(self) -> dict[str, Any]:
        """z-lab's config.json for this drafter (what convert-draft reads)."""
        cfg: dict[str, Any] = {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "attention_bias": False,
            "block_size": self.block_size,
            "dflash_config": {"mask_token_id": self.mask_token_id, "target_layer_ids": list(self.layer_ids)},
            "dtype": "bfloat16",
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "hidden_size": self.hidden,
            "intermediate_size": self.ffn,
            "layer_types": list(self.types),
            "max_position_embeddings": self.max_position_embeddings,
            "num_attention_heads": self.n_heads,
            "num_hidden_layers": self.n_layers,
            "num_key_value_heads": self.n_kv_heads,
            "num_target_layers": self.num_target_layers,
            "rms_norm_eps": self.rms_eps,
            "rope_scaling": None,
            "rope_theta": self.rope_theta,
            "sliding_window": self.sliding_window,
            "tie_word_embeddings": False,
            "use_sliding_window": SLIDING in self.types,
            "vocab_size": self.vocab,
        }
        if self.is_causal is not None:
            cfg["is_causal"] = self.is_causal
        return {**cfg, **self.extra}


class DraftAttention(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h, hd = cfg.hidden, cfg.head_dim
        self.q_proj = nn.Linear(h, cfg.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(h, cfg.n_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(h, cfg.n_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * hd, h, bias=False)
        self.q_norm = RMSNorm(hd, cfg.rms_eps, offset=False)
        self.k_norm = RMSNorm(hd, cfg.rms_eps, offset=False)

    def forward(self, x: Tensor, ctx: Tensor, q_pos: Tensor, ctx_pos: Tensor, mask: Tensor) -> Tensor:
        """x: [B, Q, h] block rows; ctx: [B, L, h] context rows; mask: [B, 1, Q, L + Q] (True = see)."""
        c = self.cfg
        b, nq, _ = x.shape
        hd, theta = c.head_dim, c.rope_theta
        q = rope_neox(self.q_norm(self.q_proj(x).reshape(b, nq, c.n_heads, hd)), q_pos, hd, theta)
        kv_in = torch.cat([ctx, x], 1)
        n_kv = kv_in.shape[1]
        k = self.k_norm(self.k_proj(kv_in).reshape(b, n_kv, c.n_kv_heads, hd))
        k = rope_neox(k, torch.cat([ctx_pos.expand(b, -1), q_pos], 1), hd, theta)
        v = self.v_proj(kv_in).reshape(b, n_kv, c.n_kv_heads, hd)
        rep = c.n_heads // c.n_kv_heads
        q, k, v = q.transpose(1, 2), k.transpose(1, 2).repeat_interleave(rep, 1), v.transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v.repeat_interleave(rep, 1), attn_mask=mask)
        return self.o_proj(o.transpose(1, 2).reshape(b, nq, c.n_heads * hd))


class DraftMLP(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden, cfg.ffn, bias=False)
        self.up_proj = nn.Linear(cfg.hidden, cfg.ffn, bias=False)
        self.down_proj = nn.Linear(cfg.ffn, cfg.hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps, offset=False)
        self.self_attn = DraftAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps, offset=False)
        self.mlp = DraftMLP(cfg)

    def forward(self, x: Tensor, ctx: Tensor, q_pos: Tensor, ctx_pos: Tensor, mask: Tensor) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), ctx, q_pos, ctx_pos, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class BlockMasks:
    """Attention masks [B, 1, nb*bs, n_ctx + nb*bs] (True = may attend), one per kind of layer.

    Query (block b, slot j) at position a_b + j sees context positions c < a_b (in sliding layers
    only those with a_b + j - c < window) and its own block: all slots, or j' <= j when causal."""

    def __init__(self, cfg: DrafterConfig, anchors: Tensor, n_ctx: int) -> None:
        bs, dev = cfg.block_size, anchors.device
        if cfg.sliding_window < bs:
            raise ValueError("sliding_window must cover a block")
        b, nb = anchors.shape
        j = torch.arange(bs, device=dev)
        a_q = anchors.repeat_interleave(bs, 1)[..., None]  # [B, Q, 1]
        q_pos = a_q + j.repeat(nb)[None, :, None]
        c = torch.arange(n_ctx, device=dev)
        self.ctx = c < a_q  # [B, Q, L]
        self.ctx_swa = self.ctx & (c > q_pos - cfg.sliding_window)
        blk, slot = torch.arange(nb, device=dev).repeat_interleave(bs), j.repeat(nb)
        self.same = (blk[:, None] == blk[None, :]).expand(b, -1, -1)
        self.causal = self.same & (slot[None, :] <= slot[:, None])
        self._cache: dict[tuple[bool, bool], Tensor] = {}

    def get(self, causal: bool, sliding: bool) -> Tensor:
        key = (causal, sliding)
        if key not in self._cache:
            ctx = self.ctx_swa if sliding else self.ctx
            self._cache[key] = torch.cat([ctx, self.causal if causal else self.same], -1)[:, None]
        return self._cache[key]


class Drafter(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.cfg = cfg
        n_feat = len(cfg.layer_ids)
        self.fc = nn.Linear(n_feat * cfg.hidden, cfg.hidden, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden, cfg.rms_eps, offset=False)
        self.layers = nn.ModuleList(DraftLayer(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.hidden, cfg.rms_eps, offset=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layers))

    def draft_layers(self) -> list[DraftLayer]:
        return [layer for layer in self.layers if isinstance(layer, DraftLayer)]

    def features(self, hidden: list[Tensor]) -> Tensor:
        """Per-layer target outputs -> the concatenated raw features the fc reads."""
        return torch.cat([hidden[i] for i in self.cfg.layer_ids], -1)

    def forward(self, feats: Tensor, anchors: Tensor, block_emb: Tensor) -> Tensor:
        """feats: [B, L, n_feat*h] for positions 0..L-1; anchors: [B, nb]; block_emb: [B, nb*bs, h].

        Returns the final-normed hidden states [B, nb*bs, h] (apply the target's LM head)."""
        cfg = self.cfg
        b, n_ctx, _ = feats.shape
        ctx = self.hidden_norm(self.fc(feats))
        ctx_pos = torch.arange(n_ctx, device=feats.device)[None]
        q_pos = (anchors[..., None] + torch.arange(cfg.block_size, device=feats.device)).reshape(b, -1)
        masks = BlockMasks(cfg, anchors, n_ctx)
        x = block_emb
        for i, layer in enumerate(self.layers):
            x = layer(x, ctx, q_pos, ctx_pos, masks.get(cfg.causal(i), cfg.types[i] == SLIDING))
        return self.norm(x)


def block_inputs(
    tokens: Tensor, anchors: Tensor, block_size: int, mask_token_id: int
) -> tuple[Tensor, Tensor]:
    """(block token ids [B, nb*bs] = [anchor, MASK...] per block, labels [B, nb, bs] = tokens at a+k)."""
    b, nb = anchors.shape
    idx = anchors[..., None] + torch.arange(block_size, device=tokens.device)
    labels = torch.gather(tokens, 1, idx.reshape(b, -1)).reshape(b, nb, block_size)
    ids = torch.full_like(labels, mask_token_id)
    ids[..., 0] = labels[..., 0]
    return ids.reshape(b, -1), labels


def accepted(drafts: Tensor, labels: Tensor) -> Tensor:
    """Chain acceptance length per block: 1 + leading slots 1.. whose draft equals the label."""
    return (drafts[..., 1:] == labels[..., 1:]).long().cumprod(-1).sum(-1) + 1


def slot_weights(block_size: int, gamma: float, device: torch.device | None = None) -> Tensor:
    """exp(-(k-1)/gamma) for slots k = 1..bs-1 (slot 0 is the given anchor: weight 0)."""
    k = torch.arange(block_size, device=device, dtype=torch.float32)
    return torch.where(k > 0, torch.exp(-(k - 1) / gamma), torch.zeros_like(k))


def sample_anchors(gen: torch.Generator, lo: Tensor, hi: int, n_blocks: int) -> Tensor:
    """``n_blocks`` distinct anchors per row, uniform in [lo_i, hi] (inclusive), on the CPU."""
    rows = [int(x) + torch.randperm(hi - int(x) + 1, generator=gen)[:n_blocks] for x in lo.tolist()]
    return torch.stack(rows)
