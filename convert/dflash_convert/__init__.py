"""convert-draft: z-lab DFlash drafter (config.json + safetensors) -> GGUF of arch ``dflash``."""

from .config import ConvertError, DraftConfig, load_config, parse_config
from .writer import TargetInfo, convert_draft, read_target

__all__ = [
    "ConvertError",
    "DraftConfig",
    "TargetInfo",
    "convert_draft",
    "load_config",
    "parse_config",
    "read_target",
]
