"""What both training loops share: a time-or-step budget, the LR schedule, the optimizer, autocast."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class Budget:
    """Progress in [0, 1] by wall time (``minutes``) or by step count (``steps`` > 0 wins).

    A time budget makes the schedule follow the clock, so the LR reaches its floor when time runs out."""

    minutes: float
    steps: int = 0
    start: float = field(default_factory=time.time)
    step: int = 0

    def progress(self) -> float:
        if self.steps > 0:
            return min(1.0, self.step / self.steps)
        return min(1.0, (time.time() - self.start) / (60.0 * self.minutes)) if self.minutes > 0 else 1.0

    def done(self) -> bool:
        return self.progress() >= 1.0

    def elapsed(self) -> float:
        return time.time() - self.start


def lr_at(progress: float, peak: float, warmup: float, min_ratio: float) -> float:
    if progress < warmup:
        return peak * max(progress / warmup, 1e-3)
    t = (progress - warmup) / max(1e-9, 1.0 - warmup)
    return peak * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, t))))


def adamw(
    named: Iterable[tuple[str, nn.Parameter]], lr: float, weight_decay: float, no_decay: set[str]
) -> torch.optim.AdamW:
    decay: list[nn.Parameter] = []
    keep: list[nn.Parameter] = []
    for n, p in named:
        if p.requires_grad:
            (keep if n in no_decay or p.dim() < 2 else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for g in opt.param_groups:
        g["lr"] = lr


def autocast(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """bf16 autocast on CUDA; full precision on the CPU (tests, smoke runs)."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
