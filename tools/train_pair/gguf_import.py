"""Read a qwen35 GGUF back into the PyTorch model (the inverse of export.target_weights).

Lets the oracle run on a shipped file (q8_0 included: weights are dequantized) on a machine that
has no training checkpoint, and proves the export conventions invert exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize

from dflash.synth.qwen35 import ARCH, Qwen35Config, imrope_sections

from .model import GatedAttention, GatedDeltaNet, Qwen35


def _field(r: GGUFReader, key: str, default: Any = None) -> Any:
    f = r.fields.get(key)
    return default if f is None else f.contents()


def read_config(r: GGUFReader) -> Qwen35Config:
    a = f"{ARCH}."
    names = {t.name for t in r.tensors}
    rope_dim = _field(r, a + "rope.dimension_count")
    sections = list(_field(r, a + "rope.dimension_sections"))
    return Qwen35Config(
        name=_field(r, "general.name", "imported"),
        hidden=_field(r, a + "embedding_length"),
        n_layer=_field(r, a + "block_count") - _field(r, a + "nextn_predict_layers", 0),
        n_ff=_field(r, a + "feed_forward_length"),
        n_head=_field(r, a + "attention.head_count"),
        n_head_kv=_field(r, a + "attention.head_count_kv"),
        head_dim=_field(r, a + "attention.key_length"),
        rope_dim=rope_dim,
        rope_sections=() if sections == imrope_sections(rope_dim) else tuple(sections),
        full_attention_interval=_field(r, a + "full_attention_interval", 4),
        n_v_heads=_field(r, a + "ssm.time_step_rank"),
        n_k_heads=_field(r, a + "ssm.group_count"),
        ssm_state=_field(r, a + "ssm.state_size"),
        ssm_conv=_field(r, a + "ssm.conv_kernel"),
        rope_theta=_field(r, a + "rope.freq_base"),
        rms_eps=float(f"{_field(r, a + 'attention.layer_norm_rms_epsilon'):.6g}"),  # undo the f32 rounding
        context_length=_field(r, a + "context_length"),
        n_vocab=len(r.fields["tokenizer.ggml.tokens"].data),
        tied_embeddings="output.weight" not in names,
    )


def read_weights(r: GGUFReader) -> dict[str, np.ndarray]:
    """GGUF name -> f32 array in numpy order (rows = outputs), quantized types dequantized."""
    out = {}
    for t in r.tensors:
        shape = tuple(int(x) for x in reversed(t.shape))
        out[t.name] = dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32).reshape(shape)
    return out


def load_target_gguf(path: Path) -> Qwen35:
    r = GGUFReader(path)
    cfg = read_config(r)
    w = read_weights(r)
    model = Qwen35(cfg, cfg.n_vocab)

    def put(p: torch.Tensor, name: str, fn: Any = None) -> None:
        v = torch.from_numpy(w[name])
        p.data.copy_(fn(v) if fn is not None else v)

    def minus1(v: torch.Tensor) -> torch.Tensor:
        return v - 1.0

    put(model.embed.weight, "token_embd.weight")
    put(model.norm.weight, "output_norm.weight", minus1)
    if not cfg.tied_embeddings:
        put(model.lm_head.weight, "output.weight")
    for il, blk in enumerate(model.blocks()):
        p = f"blk.{il}."
        put(blk.attn_norm.weight, p + "attn_norm.weight", minus1)
        put(blk.post_norm.weight, p + "post_attention_norm.weight", minus1)
        m = blk.mixer
        if isinstance(m, GatedDeltaNet):
            put(m.in_qkv.weight, p + "attn_qkv.weight")
            put(m.in_z.weight, p + "attn_gate.weight")
            put(m.conv, p + "ssm_conv1d.weight")
            put(m.dt_bias, p + "ssm_dt.bias")
            put(m.A_log, p + "ssm_a", lambda v: (-v).log())
            put(m.in_b.weight, p + "ssm_beta.weight")
            put(m.in_a.weight, p + "ssm_alpha.weight")
            put(m.norm.weight, p + "ssm_norm.weight")
            put(m.out.weight, p + "ssm_out.weight")
        else:
            assert isinstance(m, GatedAttention)
            put(m.q_proj.weight, p + "attn_q.weight")
            put(m.k_proj.weight, p + "attn_k.weight")
            put(m.v_proj.weight, p + "attn_v.weight")
            put(m.o_proj.weight, p + "attn_output.weight")
            put(m.q_norm.weight, p + "attn_q_norm.weight", minus1)
            put(m.k_norm.weight, p + "attn_k_norm.weight", minus1)
        put(blk.ffn_gate.weight, p + "ffn_gate.weight")
        put(blk.ffn_up.weight, p + "ffn_up.weight")
        put(blk.ffn_down.weight, p + "ffn_down.weight")
    return model.eval()
