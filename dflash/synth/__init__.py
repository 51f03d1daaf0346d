"""Synthetic (random-weight) qwen35 GGUF models with a real BPE tokenizer, for tests and benches."""

from .presets import PRESETS, Preset, get_preset
from .qwen35 import WEIGHT_TYPES, Qwen35Config, tensor_specs, write_qwen35_gguf
from .tokenizer import BpeVocab, load_vocab

__all__ = [
    "PRESETS",
    "WEIGHT_TYPES",
    "BpeVocab",
    "Preset",
    "Qwen35Config",
    "get_preset",
    "load_vocab",
    "tensor_specs",
    "write_qwen35_gguf",
]
