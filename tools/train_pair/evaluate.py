"""Held-out chain acceptance, simulated exactly as the greedy decode loop walks (REFERENCE.md section 3).

For greedy decoding the target's output is fixed, so on a greedy continuation ``seq`` the loop is:
anchor at p (the prompt end first); draft slots 1..bs-1 from context features < p; accept the
longest prefix equal to seq[p+1..]; AL = accepted + 1 and the next anchor is p + AL.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .drafter import Drafter, accepted, block_inputs
from .loop import autocast
from .model import Qwen35


@dataclass
class Acceptance:
    mean: float  # mean acceptance length (tau) over all verify steps
    steps: int
    histogram: list[int]  # index AL-1 -> count, AL in 1..bs

    def as_dict(self) -> dict[str, object]:
        return dict(vars(self))


@torch.no_grad()
def chain_acceptance(
    target: Qwen35, drafter: Drafter, tokens: np.ndarray, prompt_len: np.ndarray, device: torch.device
) -> Acceptance:
    bs = drafter.cfg.block_size
    seqs = torch.from_numpy(tokens.astype(np.int64)).to(device)
    pos = torch.from_numpy(prompt_len.astype(np.int64)).to(device)
    length = seqs.shape[1]
    feats = []
    for i in range(0, seqs.shape[0], 64):
        with autocast(device):
            _, hidden = target(seqs[i : i + 64], return_hidden=True)
        feats.append(drafter.features(hidden))
    feat = torch.cat(feats)
    als: list[int] = []
    while True:
        act = torch.nonzero(pos + bs <= length).flatten()
        if act.numel() == 0:
            break
        anchors = pos[act, None]
        ids, labels = block_inputs(seqs[act], anchors, bs, drafter.cfg.mask_token_id)
        with autocast(device):
            h = drafter(feat[act], anchors, target.embed(ids))
            drafts = target.lm_head(h).float().argmax(-1).reshape(labels.shape)
        al = accepted(drafts, labels).flatten()
        als += al.tolist()
        pos[act] += al
    hist = np.bincount(np.asarray(als, dtype=np.int64) - 1, minlength=bs).tolist() if als else [0] * bs
    mean = float(np.mean(als)) if als else 0.0
    return Acceptance(mean=mean, steps=len(als), histogram=hist)
