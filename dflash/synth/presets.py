"""Named model shapes for synthetic GGUFs.

The tiny shapes differ in every ratio the engine must get right (GQA ratio, GDN v/k head
ratio, full-attention interval, head and state sizes, tied vs separate output, MTP block) and
all run a CPU forward in milliseconds. Attention head dims are 64/128/256 and GDN state sizes
16/32/64/128 so that CUDA flash-attention and gated-delta-net kernels have instances for them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .qwen35 import Qwen35Config


@dataclass(frozen=True)
class Preset:
    config: Qwen35Config
    weight_type: str
    note: str


PRESETS: dict[str, Preset] = {
    "tiny-a": Preset(
        Qwen35Config(
            name="synth-tiny-a",
            hidden=64,
            n_layer=4,
            n_ff=128,
            n_head=2,
            n_head_kv=1,
            head_dim=64,
            rope_dim=16,
            full_attention_interval=2,
            n_v_heads=4,
            n_k_heads=2,
            ssm_state=16,
            tied_embeddings=True,
        ),
        "f32",
        "interval 2, GQA 2, GDN v/k 2, state 16, tied output",
    ),
    "tiny-b": Preset(
        Qwen35Config(
            name="synth-tiny-b",
            hidden=128,
            n_layer=8,
            n_ff=256,
            n_head=4,
            n_head_kv=1,
            head_dim=64,
            rope_dim=16,
            full_attention_interval=4,
            n_v_heads=6,
            n_k_heads=2,
            ssm_state=32,
        ),
        "f32",
        "interval 4 (27B layout), GQA 4, GDN v/k 3 (27B ratio), state 32",
    ),
    "tiny-c": Preset(
        Qwen35Config(
            name="synth-tiny-c",
            hidden=256,
            n_layer=6,
            n_ff=512,
            n_head=4,
            n_head_kv=2,
            head_dim=128,
            rope_dim=32,
            full_attention_interval=3,
            n_v_heads=4,
            n_k_heads=4,
            ssm_state=64,
            nextn_layers=1,
        ),
        "f32",
        "interval 3, GQA 2, GDN v/k 1, state 64, MTP block; all rows fit 256-blocks (K-quants)",
    ),
    "small": Preset(
        Qwen35Config(
            name="synth-small",
            hidden=512,
            n_layer=8,
            n_ff=1024,
            n_head=8,
            n_head_kv=2,
            head_dim=128,
            rope_dim=32,
            full_attention_interval=4,
            n_v_heads=8,
            n_k_heads=4,
            ssm_state=64,
            context_length=32768,
        ),
        "q8_0",
        "about 27M parameters, the default small model",
    ),
    "qwen36-27b": Preset(
        Qwen35Config(
            name="synth-qwen3.6-27b",
            hidden=5120,
            n_layer=64,
            n_ff=17408,
            n_head=24,
            n_head_kv=4,
            head_dim=256,
            rope_dim=64,
            rope_sections=(11, 11, 10, 0),
            full_attention_interval=4,
            n_v_heads=48,
            n_k_heads=16,
            ssm_state=128,
            context_length=262144,
            n_vocab=248320,
        ),
        "q4_K_M",
        "Qwen3.6-27B shapes, vocab padded to 248320, no MTP block (the 15.4 GiB bench file)",
    ),
}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}") from None
