"""Next-token training of the qwen35 target on random corpus windows, within a time budget."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from dflash.synth.qwen35 import Qwen35Config

from .loop import Budget, adamw, autocast, lr_at, set_lr, sync
from .model import Qwen35, count_params
from .presets import TrainSettings


@dataclass
class TargetLog:
    steps: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    eval_loss: list[float] = field(default_factory=list)
    seconds: float = 0.0
    params: int = 0
    tokens_per_second: float = 0.0


def windows(data: torch.Tensor, offsets: torch.Tensor, length: int) -> torch.Tensor:
    return data[offsets[:, None] + torch.arange(length, device=data.device)]


@torch.no_grad()
def heldout_loss(model: Qwen35, heldout: torch.Tensor, seq_len: int, n: int, device: torch.device) -> float:
    """Mean next-token loss over the first ``n`` non-overlapping held-out windows (a fixed set)."""
    n = max(1, min(n, (heldout.numel() - 1) // seq_len))
    total = 0.0
    model.eval()
    for i in range(0, n, 16):
        offs = torch.arange(i, min(n, i + 16), device=device) * seq_len
        w = windows(heldout, offs, seq_len + 1)
        with autocast(device):
            logits, _ = model(w[:, :-1])
        total += F.cross_entropy(logits.float().flatten(0, 1), w[:, 1:].flatten(), reduction="sum").item()
    model.train()
    return total / (n * seq_len)


def train_target(
    cfg: Qwen35Config,
    settings: TrainSettings,
    train_ids: np.ndarray,
    heldout_ids: np.ndarray,
    budget: Budget,
    device: torch.device,
    seed: int,
    compile_model: bool = False,
    log_every: int = 10,
) -> tuple[Qwen35, TargetLog]:
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = Qwen35(cfg, cfg.n_vocab).to(device)
    log = TargetLog(params=count_params(model))
    opt = adamw(model.named_parameters(), settings.lr, settings.weight_decay, model.no_decay_names())
    fwd = torch.compile(model) if compile_model else model
    data = torch.from_numpy(train_ids.astype(np.int64)).to(device)
    held = torch.from_numpy(heldout_ids.astype(np.int64)).to(device)
    s = settings
    next_eval = 0.0
    t_start = time.time()
    while True:
        p = budget.progress()
        if p >= next_eval or budget.done():
            log.eval_steps.append(budget.step)
            log.eval_loss.append(heldout_loss(model, held, s.seq_len, s.eval_windows, device))
            print(f"[target] step {budget.step} held-out loss {log.eval_loss[-1]:.4f}", flush=True)
            next_eval += s.eval_every
        if budget.done():
            break
        lr = lr_at(p, s.lr, s.warmup, s.min_lr_ratio)
        set_lr(opt, lr)
        offs = torch.randint(0, data.numel() - s.seq_len - 1, (s.batch,), generator=gen).to(device)
        w = windows(data, offs, s.seq_len + 1)
        with autocast(device):
            logits, _ = fwd(w[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), w[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
        opt.step()
        budget.step += 1
        if budget.step % log_every == 0 or budget.step == 1:
            val = loss.item()
            if not math.isfinite(val):
                raise FloatingPointError(f"target loss is {val} at step {budget.step}")
            log.steps.append(budget.step)
            log.tokens.append(budget.step * s.batch * s.seq_len)
            log.loss.append(val)
            log.lr.append(lr)
            if budget.step % (log_every * 10) == 0:
                print(
                    f"[target] step {budget.step} loss {val:.4f} lr {lr:.2e} {budget.elapsed():.0f}s",
                    flush=True,
                )
    sync(device)
    log.seconds = time.time() - t_start
    log.tokens_per_second = budget.step * s.batch * s.seq_len / max(log.seconds, 1e-9)
    return model.eval(), log


def to_dict(log: Any) -> dict[str, Any]:
    return dict(vars(log))
