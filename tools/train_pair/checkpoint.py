"""Save and load the trained models with their configs (plain torch.save of config dicts + weights)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch

from dflash.synth.qwen35 import Qwen35Config

from .drafter import Drafter, DrafterConfig
from .model import Qwen35


def save_target(model: Qwen35, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"config": asdict(model.cfg), "state": model.state_dict()}, path)


def load_target(path: Path, device: torch.device) -> Qwen35:
    ck = torch.load(path, map_location="cpu", weights_only=True)
    cfg = Qwen35Config(**ck["config"])
    model = Qwen35(cfg, cfg.n_vocab)
    model.load_state_dict(ck["state"])
    return model.to(device).eval()


def save_drafter(drafter: Drafter, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"config": asdict(drafter.cfg), "state": drafter.state_dict()}, path)


def load_drafter(path: Path, device: torch.device) -> Drafter:
    ck = torch.load(path, map_location="cpu", weights_only=True)
    d = dict(ck["config"])
    for k in ("target_layer_ids", "layer_types"):
        d[k] = tuple(d[k])
    drafter = Drafter(DrafterConfig(**d))
    drafter.load_state_dict(ck["state"])
    return drafter.to(device).eval()
