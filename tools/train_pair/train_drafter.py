"""DFlash drafter training: frozen target, random anchors in the regenerated responses, blocks of
[anchor, MASK...], position-weighted cross-entropy (slot k weighs exp(-(k-1)/gamma)).

A small drafter memorises a small regenerated set quickly (train acceptance near 16, held-out far
lower), so the chain acceptance on fresh validation prompts is measured as training goes and the
best state is kept."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from .drafter import Drafter, DrafterConfig, accepted, block_inputs, sample_anchors, slot_weights
from .evaluate import chain_acceptance
from .loop import Budget, adamw, autocast, lr_at, set_lr, sync
from .model import Qwen35, count_params
from .presets import TrainSettings


@dataclass
class DrafterLog:
    steps: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    accept: list[float] = field(default_factory=list)  # mean leading-correct drafts per block, + 1
    lr: list[float] = field(default_factory=list)
    slot_acc: list[float] = field(default_factory=list)  # last logged step, per slot 1..bs-1
    val_steps: list[int] = field(default_factory=list)
    val_accept: list[float] = field(default_factory=list)  # chain acceptance on validation prompts
    best_step: int = 0
    seconds: float = 0.0
    params: int = 0
    blocks: int = 0  # anchors per sequence
    blocks_per_second: float = 0.0


def block_loss(
    target: Qwen35, drafter: Drafter, tokens: torch.Tensor, anchors: torch.Tensor, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weighted CE over slots 1..bs-1, greedy drafts [B, nb, bs]) for blocks at ``anchors``."""
    cfg = drafter.cfg
    bs = cfg.block_size
    with torch.no_grad():
        _, hidden = target(tokens, return_hidden=True)
        feats = drafter.features(hidden)
        ids, labels = block_inputs(tokens, anchors, bs, cfg.mask_token_id)
        emb = target.embed(ids)
    h = drafter(feats, anchors, emb)
    logits = target.lm_head(h).float().reshape(*labels.shape, -1)  # frozen head, grads reach h
    ce = F.cross_entropy(logits.flatten(0, 2), labels.flatten(), reduction="none").reshape(labels.shape)
    loss = (ce * weights).sum() / (weights.sum() * labels.shape[0] * labels.shape[1])
    return loss, logits.argmax(-1)


def train_drafter(
    target: Qwen35,
    cfg: DrafterConfig,
    settings: TrainSettings,
    tokens: np.ndarray,
    prompt_len: np.ndarray,
    val_data: tuple[np.ndarray, np.ndarray],
    budget: Budget,
    device: torch.device,
    seed: int,
    log_every: int = 10,
) -> tuple[Drafter, DrafterLog]:
    """``val_data``: (tokens, prompt lengths) of validation rows; the returned drafter is the best on them."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    target.eval().requires_grad_(False)
    drafter = Drafter(cfg).to(device)
    s = settings
    opt = adamw(drafter.named_parameters(), s.d_lr, s.weight_decay, set())
    data = torch.from_numpy(tokens.astype(np.int64))
    plen = torch.from_numpy(prompt_len.astype(np.int64))
    length, bs = data.shape[1], cfg.block_size
    hi = length - bs  # last anchor whose block fits
    n_blocks = max(1, min(s.d_blocks, hi - int(plen.max()) + 1))
    weights = slot_weights(bs, s.gamma, device)
    log = DrafterLog(params=count_params(drafter), blocks=n_blocks)
    t_start = time.time()
    next_val, best = 0.0, (-1.0, {k: v.detach().clone() for k, v in drafter.state_dict().items()})
    while True:
        p = budget.progress()
        if p >= next_val or budget.done():
            al = chain_acceptance(target, drafter.eval(), *val_data, device).mean
            drafter.train()
            log.val_steps.append(budget.step)
            log.val_accept.append(al)
            if al > best[0]:
                best = (al, {k: v.detach().clone() for k, v in drafter.state_dict().items()})
                log.best_step = budget.step
            print(f"[drafter] step {budget.step} validation acceptance {al:.2f}", flush=True)
            next_val += s.d_val_every
        if budget.done():
            break
        lr = lr_at(p, s.d_lr, s.warmup, s.min_lr_ratio)
        set_lr(opt, lr)
        rows = torch.randint(0, data.shape[0], (s.d_batch,), generator=gen)
        anchors = sample_anchors(gen, plen[rows], hi, n_blocks).to(device)
        batch = data[rows].to(device)
        with autocast(device):
            loss, drafts = block_loss(target, drafter, batch, anchors, weights)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), s.grad_clip)
        opt.step()
        budget.step += 1
        if budget.step % log_every == 0 or budget.step == 1:
            val = loss.item()
            if not math.isfinite(val):
                raise FloatingPointError(f"drafter loss is {val} at step {budget.step}")
            idx = anchors[..., None] + torch.arange(bs, device=device)
            labels = torch.gather(batch, 1, idx.flatten(1)).reshape(idx.shape)
            log.steps.append(budget.step)
            log.loss.append(val)
            log.accept.append(accepted(drafts, labels).float().mean().item())
            log.lr.append(lr)
            log.slot_acc = (drafts == labels).float().mean((0, 1))[1:].tolist()
            if budget.step % (log_every * 10) == 0:
                print(
                    f"[drafter] step {budget.step} loss {val:.4f} accept {log.accept[-1]:.2f} "
                    f"lr {lr:.2e} {budget.elapsed():.0f}s",
                    flush=True,
                )
    sync(device)
    log.seconds = time.time() - t_start
    log.blocks_per_second = budget.step * s.d_batch * n_blocks / max(log.seconds, 1e-9)
    drafter.load_state_dict(best[1])
    return drafter.eval(), log
