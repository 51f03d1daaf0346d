"""Target-regenerated data (the DFlash recipe): corpus prompts continued greedily by the trained target.

Prompts start right after a newline token (like a user's code prompt) at random places of a token
stream; a batch shares one prompt length, drawn from [prompt_min, prompt_max], and every row is
continued to ``regen_len`` tokens, so rows stack into one [N, regen_len] array with per-row prompt
lengths.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from dflash.synth.tokenizer import load_vocab

from .loop import autocast
from .model import DecodeCache, Qwen35


@dataclass
class Regenerated:
    tokens: np.ndarray  # [N, L] uint16: prompt then greedy continuation
    prompt_len: np.ndarray  # [N] int32
    seconds: float

    @property
    def generated_tokens(self) -> int:
        return int((self.tokens.shape[1] - self.prompt_len).sum())


def newline_starts(ids: np.ndarray) -> np.ndarray:
    """Positions just after a token whose text contains a newline (byte-level 'Ċ')."""
    has_nl = np.array(["Ċ" in t for t in load_vocab().all_tokens], dtype=bool)
    return np.flatnonzero(has_nl[ids]) + 1


def sample_prompts(
    ids: np.ndarray, starts: np.ndarray, n: int, length: int, rng: np.random.Generator
) -> np.ndarray:
    ok = starts[starts + length <= ids.size]
    pick = ok[rng.integers(0, ok.size, n)]
    return ids[pick[:, None] + np.arange(length)]


@torch.no_grad()
def greedy(model: Qwen35, prompts: torch.Tensor, total_len: int) -> torch.Tensor:
    """Greedy continuation of equal-length prompts [B, P] to [B, total_len] with a decode cache."""
    device = prompts.device
    cache = DecodeCache(model.cfg.n_layer, max_len=total_len)
    out = [prompts]
    with autocast(device):
        logits, _ = model(prompts, cache, last_only=True)
    for i in range(total_len - prompts.shape[1]):
        nxt = logits[:, -1].float().argmax(-1, keepdim=True)
        out.append(nxt)
        if i + 1 < total_len - prompts.shape[1]:
            with autocast(device):
                logits, _ = model(nxt, cache)
    return torch.cat(out, 1)


def regenerate(
    model: Qwen35,
    ids: np.ndarray,
    n_seqs: int,
    minutes: float,
    total_len: int,
    prompt_min: int,
    prompt_max: int,
    batch: int,
    device: torch.device,
    seed: int,
) -> Regenerated:
    """Up to ``n_seqs`` rows (0: no limit), stopping after ``minutes`` (0: no limit); at least one batch."""
    rng = np.random.default_rng(seed)
    starts = newline_starts(ids)
    rows: list[np.ndarray] = []
    plens: list[np.ndarray] = []
    t0 = time.time()
    while True:
        p = int(rng.integers(prompt_min, prompt_max + 1))
        b = batch if n_seqs <= 0 else min(batch, n_seqs - sum(r.shape[0] for r in rows))
        prompts = torch.from_numpy(sample_prompts(ids, starts, b, p, rng).astype(np.int64)).to(device)
        rows.append(greedy(model, prompts, total_len).cpu().numpy().astype(np.uint16))
        plens.append(np.full(b, p, np.int32))
        n = sum(r.shape[0] for r in rows)
        if (n_seqs > 0 and n >= n_seqs) or (minutes > 0 and time.time() - t0 >= 60 * minutes):
            break
        if n_seqs <= 0 and minutes <= 0:
            break
        if len(rows) % 10 == 0:
            print(f"[regen] {n} sequences, {time.time() - t0:.0f}s", flush=True)
    return Regenerated(np.concatenate(rows), np.concatenate(plens), time.time() - t0)
