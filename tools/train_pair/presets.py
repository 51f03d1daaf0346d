"""Model shapes and training settings: ``default`` (the shipped pair, minutes on one H200) and
``tiny`` (CPU smoke runs and tests)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from dflash.synth.presets import get_preset
from dflash.synth.qwen35 import Qwen35Config


@dataclass(frozen=True)
class TrainSettings:
    seq_len: int  # target training window
    batch: int  # target windows per step
    lr: float
    weight_decay: float = 0.1
    warmup: float = 0.03  # fraction of the budget
    min_lr_ratio: float = 0.1  # cosine floor
    grad_clip: float = 1.0
    eval_every: float = 0.05  # fraction of the budget between held-out evaluations
    eval_windows: int = 64
    # regeneration: prompts of [prompt_min, prompt_max] tokens continued greedily to regen_len
    regen_len: int = 512
    prompt_min: int = 16
    prompt_max: int = 256
    regen_batch: int = 2048  # decoding is launch-bound: wide batches are nearly free
    val_prompts: int = 128  # fresh training-file prompts: drafter model selection
    # drafter
    d_batch: int = 32  # sequences per step
    d_blocks: int = 32  # anchors (blocks) per sequence
    d_lr: float = 1e-3
    gamma: float = 7.0
    d_val_every: float = 0.1  # fraction of the drafter budget between validations
    eval_prompts: int = 256  # held-out prompts for the acceptance estimate


@dataclass(frozen=True)
class Preset:
    target: Qwen35Config
    train: TrainSettings
    drafter_layers: int = 3
    drafter_heads: int = 8
    drafter_kv_heads: int = 2
    drafter_head_dim: int = 64
    drafter_ffn: int = 1024


VOCAB = 4096  # the committed BPE (dflash/data/bpe-4096.json)

PRESETS: dict[str, Preset] = {
    # The synth "small" shape (about 27M parameters; q8_0 target + drafter stay under 40 MB):
    # 6 GDN + 2 gated-attention layers; a 3-layer drafter (sliding, sliding, full).
    "default": Preset(
        target=replace(get_preset("small").config, name="dflash-pair-target", n_vocab=VOCAB),
        train=TrainSettings(seq_len=1024, batch=64, lr=2e-3),
    ),
    "tiny": Preset(
        target=Qwen35Config(
            name="dflash-pair-tiny",
            hidden=64,
            n_layer=4,
            n_ff=128,
            n_head=2,
            n_head_kv=1,
            head_dim=32,
            rope_dim=16,
            full_attention_interval=2,
            n_v_heads=4,
            n_k_heads=2,
            ssm_state=16,
            n_vocab=VOCAB,
        ),
        train=TrainSettings(
            seq_len=96,
            batch=4,
            lr=3e-3,
            eval_windows=4,
            regen_len=64,
            prompt_min=8,
            prompt_max=24,
            regen_batch=4,
            val_prompts=4,
            d_batch=2,
            d_blocks=4,
            eval_prompts=4,
        ),
        drafter_layers=2,
        drafter_heads=2,
        drafter_kv_heads=1,
        drafter_head_dim=32,
        drafter_ffn=128,
    ),
}


def get(name: str, **train_overrides: object) -> Preset:
    p = PRESETS[name]
    return replace(p, train=replace(p.train, **train_overrides)) if train_overrides else p  # type: ignore[arg-type]
