"""Parse and validate a z-lab DFlash drafter ``config.json`` into a typed dataclass."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ConvertError(Exception):
    """A user-facing conversion failure; the CLI prints it as one line and exits with code 2."""


SLIDING = "sliding_attention"
FULL = "full_attention"


@dataclass(frozen=True)
class RopeScaling:
    type: str  # "linear" | "yarn" | "longrope" | ... as in HF ``rope_type``
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    extrapolation_factor: float | None = None
    attention_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None


@dataclass(frozen=True)
class DraftConfig:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    layer_types: tuple[str, ...]
    num_target_layers: int | None = None
    sliding_window: int | None = None
    use_sliding_window: bool = False
    is_causal: bool | None = None
    max_position_embeddings: int | None = None
    rope_scaling: RopeScaling | None = None
    partial_rotary_factor: float | None = None
    hidden_act: str = "silu"
    architectures: tuple[str, ...] = ()
    name: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def n_target_features(self) -> int:
        return len(self.target_layer_ids)

    @property
    def swa_enabled(self) -> bool:
        # Same rule as upstream's converter: the window only exists when the config turns it on.
        return self.use_sliding_window and bool(self.sliding_window)

    @property
    def swa_pattern(self) -> tuple[bool, ...]:
        return tuple(t == SLIDING for t in self.layer_types)

    @property
    def causal_layers(self) -> tuple[bool, ...]:
        # Reference drafter rule: without ``is_causal`` sliding layers are causal inside the block and
        # full layers are bidirectional; an explicit ``is_causal`` applies to every layer.
        if self.is_causal is not None:
            return (self.is_causal,) * self.num_hidden_layers
        return self.swa_pattern


def _req(cfg: dict[str, Any], key: str, where: str = "") -> Any:
    if key not in cfg or cfg[key] is None:
        raise ConvertError(f"config.json is missing required field '{where}{key}'")
    return cfg[key]


def _int(v: Any, name: str, *, min_value: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < min_value:
        raise ConvertError(f"config field '{name}' must be an integer >= {min_value}, got {v!r}")
    return v


def _float(v: Any, name: str, *, positive: bool = True) -> float:
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or not math.isfinite(v)
        or (positive and v <= 0)
    ):
        raise ConvertError(
            f"config field '{name}' must be a {'positive ' if positive else ''}number, got {v!r}"
        )
    return float(v)


def _opt_bool(v: Any, name: str) -> bool | None:
    if v is None:
        return None
    if not isinstance(v, bool):
        raise ConvertError(f"config field '{name}' must be true/false, got {v!r}")
    return v


def _rope(cfg: dict[str, Any]) -> tuple[float, RopeScaling | None, float | None]:
    # transformers v5 moved rope_theta into rope_parameters (older: rope_scaling); accept all three places.
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ConvertError(f"config field 'rope_scaling' must be an object or null, got {params!r}")
    theta = cfg.get("rope_theta")
    if theta is None:
        theta = params.get("rope_theta")
    if theta is None:
        raise ConvertError(
            "config.json is missing required field 'rope_theta' (also looked in rope_parameters)"
        )
    theta_f = _float(theta, "rope_theta")
    prf = cfg.get("partial_rotary_factor", params.get("partial_rotary_factor"))
    prf_f = None if prf is None else _float(prf, "partial_rotary_factor")

    rtype = params.get("rope_type", params.get("type"))
    scaling = None
    if rtype not in (None, "default"):
        factor = params.get("factor")
        orig = params.get("original_max_position_embeddings")
        if rtype == "yarn" and (factor is None or orig is None):
            raise ConvertError("yarn rope_scaling needs 'factor' and 'original_max_position_embeddings'")
        scaling = RopeScaling(
            type=str(rtype),
            factor=None if factor is None else _float(factor, "rope_scaling.factor"),
            original_max_position_embeddings=None
            if orig is None
            else _int(orig, "rope_scaling.orig", min_value=1),
            extrapolation_factor=params.get("extrapolation_factor"),
            attention_factor=params.get("attention_factor", params.get("attn_factor")),
            beta_fast=params.get("beta_fast"),
            beta_slow=params.get("beta_slow"),
        )
    return theta_f, scaling, prf_f


def parse_config(cfg: dict[str, Any], name: str | None = None) -> DraftConfig:
    """Validate a drafter config dict (the content of ``config.json``)."""
    if not isinstance(cfg, dict):
        raise ConvertError("config.json must hold a JSON object")
    if "text_config" in cfg and isinstance(cfg["text_config"], dict):
        cfg = {**cfg, **cfg["text_config"]}
    archs = tuple(str(a) for a in cfg.get("architectures") or ())
    if any(a == "DFlash2DraftModel" for a in archs) or "selector_rank" in (cfg.get("dflash_config") or {}):
        raise ConvertError("DFlash2 (conv/selector) drafters are not supported, only DFlashDraftModel")

    hidden = _int(_req(cfg, "hidden_size"), "hidden_size", min_value=1)
    n_layers = _int(_req(cfg, "num_hidden_layers"), "num_hidden_layers", min_value=1)
    n_head = _int(_req(cfg, "num_attention_heads"), "num_attention_heads", min_value=1)
    n_kv = _int(cfg.get("num_key_value_heads", n_head), "num_key_value_heads", min_value=1)
    if n_head % n_kv:
        raise ConvertError(
            f"num_attention_heads ({n_head}) is not a multiple of num_key_value_heads ({n_kv})"
        )
    head_dim = cfg.get("head_dim")
    if head_dim is None:
        if hidden % n_head:
            raise ConvertError(
                "config.json has no 'head_dim' and hidden_size is not divisible by the head count"
            )
        head_dim = hidden // n_head
    head_dim = _int(head_dim, "head_dim", min_value=1)
    ffn = _int(_req(cfg, "intermediate_size"), "intermediate_size", min_value=1)
    eps = _float(_req(cfg, "rms_norm_eps"), "rms_norm_eps")
    vocab = _int(_req(cfg, "vocab_size"), "vocab_size", min_value=1)
    theta, scaling, prf = _rope(cfg)

    dcfg = _req(cfg, "dflash_config")
    if not isinstance(dcfg, dict):
        raise ConvertError("config field 'dflash_config' must be an object")
    mask = _int(_req(dcfg, "mask_token_id", "dflash_config."), "dflash_config.mask_token_id")
    if mask >= vocab:
        raise ConvertError(
            f"dflash_config.mask_token_id {mask} is outside the vocabulary (vocab_size {vocab})"
        )
    ids_raw = _req(dcfg, "target_layer_ids", "dflash_config.")
    if not isinstance(ids_raw, list) or not ids_raw:
        raise ConvertError("dflash_config.target_layer_ids must be a non-empty list of layer indices")
    ids = tuple(_int(i, "dflash_config.target_layer_ids[]") for i in ids_raw)
    if len(set(ids)) != len(ids):
        raise ConvertError(f"dflash_config.target_layer_ids has duplicates: {list(ids)}")
    n_tgt = cfg.get("num_target_layers")
    if n_tgt is not None:
        n_tgt = _int(n_tgt, "num_target_layers", min_value=1)
        bad = [i for i in ids if i >= n_tgt]
        if bad:
            raise ConvertError(f"target_layer_ids {bad} out of range for num_target_layers {n_tgt}")
    # block_size lives at the top level in z-lab configs, inside dflash_config in newer ones.
    block = _int(dcfg.get("block_size", cfg.get("block_size", 16)), "block_size", min_value=2)

    use_swa = bool(_opt_bool(cfg.get("use_sliding_window"), "use_sliding_window"))
    window = cfg.get("sliding_window")
    window = None if window is None else _int(window, "sliding_window", min_value=1)
    max_window_layers = cfg.get("max_window_layers")
    lt = cfg.get("layer_types")
    if lt is None:
        # transformers' Qwen3 default: layers from max_window_layers on are sliding when a window is set.
        mwl = n_layers if max_window_layers is None else _int(max_window_layers, "max_window_layers")
        lt = [SLIDING if (use_swa and window and i >= mwl) else FULL for i in range(n_layers)]
    if not isinstance(lt, list) or len(lt) != n_layers:
        raise ConvertError(f"config field 'layer_types' must list {n_layers} entries, got {lt!r}")
    for t in lt:
        if t not in (SLIDING, FULL):
            raise ConvertError(
                f"unknown layer type {t!r} in 'layer_types' (expected {SLIDING!r} or {FULL!r})"
            )
    if use_swa and window is None and SLIDING in lt:
        raise ConvertError("use_sliding_window is true but 'sliding_window' is not set")

    is_causal = _opt_bool(cfg.get("is_causal", dcfg.get("causal")), "is_causal")
    max_pos = cfg.get("max_position_embeddings")
    max_pos = None if max_pos is None else _int(max_pos, "max_position_embeddings", min_value=1)
    act = str(cfg.get("hidden_act", "silu"))
    if act != "silu":
        raise ConvertError(f"unsupported hidden_act {act!r} (DFlash Qwen drafters use 'silu')")
    if cfg.get("attention_bias"):
        raise ConvertError("attention_bias=true is not supported (Qwen3 drafters have no attention biases)")

    return DraftConfig(
        hidden_size=hidden,
        num_hidden_layers=n_layers,
        num_attention_heads=n_head,
        num_key_value_heads=n_kv,
        head_dim=head_dim,
        intermediate_size=ffn,
        rms_norm_eps=eps,
        rope_theta=theta,
        vocab_size=vocab,
        block_size=block,
        mask_token_id=mask,
        target_layer_ids=ids,
        layer_types=tuple(lt),
        num_target_layers=n_tgt,
        sliding_window=window,
        use_sliding_window=use_swa,
        is_causal=is_causal,
        max_position_embeddings=max_pos,
        rope_scaling=scaling,
        partial_rotary_factor=prf,
        hidden_act=act,
        architectures=archs,
        name=name or cfg.get("_name_or_path") or None,
        raw=cfg,
    )


def load_config(src_dir: str | Path) -> DraftConfig:
    src = Path(src_dir)
    if not src.is_dir():
        raise ConvertError(f"drafter directory not found: {src}")
    path = src / "config.json"
    if not path.is_file():
        raise ConvertError(f"missing file: {path}")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConvertError(f"cannot read {path}: {e}") from None
    return parse_config(cfg, name=src.resolve().name)
