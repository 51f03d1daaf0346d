"""Export the trained pair the way users get models.

- Target: GGUF through the project's writer (:func:`dflash.synth.write_qwen35_gguf` with given
  weights), with the committed BPE in it; values converted to the file's conventions here.
- Drafter: z-lab's layout (config.json + bf16 model.safetensors, no embedding/head), then
  ``convert-draft`` (:func:`dflash_convert.convert_draft`) exactly as a user would run it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dflash.synth import write_qwen35_gguf
from dflash.synth.tokenizer import BpeVocab

from .drafter import Drafter
from .model import GatedAttention, GatedDeltaNet, Qwen35

_REPO = Path(__file__).resolve().parents[2]


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float32).numpy()


def target_weights(model: Qwen35) -> dict[str, np.ndarray]:
    """GGUF tensor name -> f32 array in the writer's numpy shape (rows = outputs)."""
    w = {"token_embd.weight": _np(model.embed.weight), "output_norm.weight": _np(model.norm.gain())}
    if not model.cfg.tied_embeddings:
        w["output.weight"] = _np(model.lm_head.weight)
    for il, blk in enumerate(model.blocks()):
        p = f"blk.{il}."
        w[p + "attn_norm.weight"] = _np(blk.attn_norm.gain())
        w[p + "post_attention_norm.weight"] = _np(blk.post_norm.gain())
        m = blk.mixer
        if isinstance(m, GatedDeltaNet):
            w[p + "attn_qkv.weight"] = _np(m.in_qkv.weight)
            w[p + "attn_gate.weight"] = _np(m.in_z.weight)
            w[p + "ssm_conv1d.weight"] = _np(m.conv)
            w[p + "ssm_dt.bias"] = _np(m.dt_bias)
            w[p + "ssm_a"] = _np(-m.A_log.float().exp())
            w[p + "ssm_beta.weight"] = _np(m.in_b.weight)
            w[p + "ssm_alpha.weight"] = _np(m.in_a.weight)
            w[p + "ssm_norm.weight"] = _np(m.norm.gain())  # the one norm without the +1
            w[p + "ssm_out.weight"] = _np(m.out.weight)
        else:
            assert isinstance(m, GatedAttention)
            w[p + "attn_q.weight"] = _np(m.q_proj.weight)
            w[p + "attn_k.weight"] = _np(m.k_proj.weight)
            w[p + "attn_v.weight"] = _np(m.v_proj.weight)
            w[p + "attn_output.weight"] = _np(m.o_proj.weight)
            w[p + "attn_q_norm.weight"] = _np(m.q_norm.gain())
            w[p + "attn_k_norm.weight"] = _np(m.k_norm.gain())
        w[p + "ffn_gate.weight"] = _np(blk.ffn_gate.weight)
        w[p + "ffn_up.weight"] = _np(blk.ffn_up.weight)
        w[p + "ffn_down.weight"] = _np(blk.ffn_down.weight)
    return w


def export_target(model: Qwen35, path: Path, weight_type: str, vocab: BpeVocab | None = None) -> Path:
    return write_qwen35_gguf(
        path, model.cfg, weight_type=weight_type, vocab=vocab, weights=target_weights(model)
    )


def drafter_state(drafter: Drafter) -> dict[str, torch.Tensor]:
    """z-lab safetensors names (embedding and head are the target's and are not stored)."""
    sd = {"fc.weight": drafter.fc.weight, "hidden_norm.weight": drafter.hidden_norm.weight}
    sd["norm.weight"] = drafter.norm.weight
    for i, layer in enumerate(drafter.draft_layers()):
        p = f"layers.{i}."
        sd[p + "input_layernorm.weight"] = layer.input_layernorm.weight
        sd[p + "post_attention_layernorm.weight"] = layer.post_attention_layernorm.weight
        for n in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"):
            sd[p + f"self_attn.{n}.weight"] = getattr(layer.self_attn, n).weight
        for n in ("gate_proj", "up_proj", "down_proj"):
            sd[p + f"mlp.{n}.weight"] = getattr(layer.mlp, n).weight
    return {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in sd.items()}


def export_drafter_dir(drafter: Drafter, out_dir: Path, name: str = "dflash-pair-drafter") -> Path:
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    cfg: dict[str, Any] = drafter.cfg.hf_config()
    cfg["_name_or_path"] = name
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    save_file(drafter_state(drafter), str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "model.safetensors").chmod(0o644)  # save_file creates it owner-only
    return out_dir


def convert_drafter(draft_dir: Path, out: Path, outtype: str, target_gguf: Path) -> Path:
    """Run convert-draft on the exported directory (the installed package, else the source tree)."""
    try:
        from dflash_convert import convert_draft
    except ImportError:
        sys.path.insert(0, str(_REPO / "convert"))
        from dflash_convert import convert_draft
    return convert_draft(draft_dir, out, outtype, target_gguf, force=True)
