"""Summaries of `dflash bench --pair` results: medians over prompts (all and per prompt kind),
pooled per-depth acceptance, speed-up and greedy identity against our autoregressive run, and a
markdown table of a results JSON (for the model card)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any


def _median(xs: Sequence[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def _group(samples: Sequence[dict[str, Any]], ref: dict[int, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"prompts": len(samples)}
    for key in ("decode_tps", "prefill_tps", "ttft_ms"):
        out[f"{key}_median"] = _median([s[f"{key}_median"] for s in samples if f"{key}_median" in s])
    for key in ("acceptance_length", "tokens_per_forward"):
        out[f"{key}_median"] = _median([s[key] for s in samples if s.get(key) is not None])
    drafts = sum(s.get("drafts", 0) for s in samples)
    if drafts:
        depth = max(len(s.get("accepted_per_pos", [])) for s in samples)
        per = [
            sum(s["accepted_per_pos"][d] for s in samples if d < len(s["accepted_per_pos"]))
            for d in range(depth)
        ]
        out["per_depth_acceptance"] = [c / drafts for c in per]  # pooled: accepted at depth d / drafts
    ratios = [
        s["decode_tps_median"] / ref[s["prompt"]]["decode_tps_median"]
        for s in samples
        if s["prompt"] in ref and ref[s["prompt"]].get("decode_tps_median") and "decode_tps_median" in s
    ]
    out["speedup_vs_ours_ar_median"] = _median(ratios)
    return out


def summarise(samples: Sequence[dict[str, Any]], ref: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """{"all": ..., "<kind>": ...}; `ref` is our autoregressive run's samples (speed-up)."""
    by_prompt = {s["prompt"]: s for s in ref}
    kinds = sorted({s["kind"] for s in samples})
    return {
        "all": _group(samples, by_prompt),
        **{k: _group([s for s in samples if s["kind"] == k], by_prompt) for k in kinds},
    }


def mark_identity(samples: list[dict[str, Any]], ref: Sequence[dict[str, Any]]) -> bool | None:
    """Sets each sample's same_tokens_as_ours_ar (and first_divergence); True when every prompt's
    greedy tokens equal our autoregressive run's, None when the mode reports no tokens."""
    by_prompt = {s["prompt"]: s["tokens"] for s in ref}
    verdicts = []
    for s in samples:
        if "tokens" not in s or s["prompt"] not in by_prompt:
            continue
        want, got = by_prompt[s["prompt"]], s["tokens"]
        same = want == got
        s["same_tokens_as_ours_ar"] = same
        if not same:
            s["first_divergence"] = next(
                (i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b),
                min(len(want), len(got)),
            )
        verdicts.append(same)
    return all(verdicts) if verdicts else None


def _all(doc: dict[str, Any], mode: str) -> dict[str, Any] | None:
    m = next((m for m in doc["modes"] if m["mode"] == mode and m.get("summary")), None)
    return m["summary"]["all"] if m else None


def best_ddtree(doc: dict[str, Any]) -> str | None:
    """Issue 4's comparison in one line: the fastest DDTree mode against our chain and upstream's
    draft-dflash (decode t/s medians, as the table), its acceptance length against the chain's, and
    the highest acceptance length of any budget. None without a DDTree mode or our chain."""
    trees = [
        (m["mode"], m["summary"]["all"])
        for m in doc["modes"]
        if m["mode"].startswith("ours-ddtree")
        and m.get("summary")
        and m["summary"]["all"].get("decode_tps_median")
    ]
    chain = _all(doc, "ours-chain")
    if not trees or not chain or not chain.get("decode_tps_median"):
        return None
    name, best = max(trees, key=lambda t: t[1]["decode_tps_median"])
    tps = best["decode_tps_median"]
    out = f"Best DDTree: {name} {tps:.1f} t/s = {tps / chain['decode_tps_median']:.2f}x ours-chain"
    spec = _all(doc, "upstream-spec")
    if spec and spec.get("decode_tps_median"):
        out += f", {tps / spec['decode_tps_median']:.2f}x upstream-spec"
    al_chain = chain.get("acceptance_length_median")
    if al_chain and best.get("acceptance_length_median"):
        top_name, top = max(trees, key=lambda t: t[1].get("acceptance_length_median") or 0.0)
        out += (
            f"; acceptance length {best['acceptance_length_median']:.2f} = "
            f"{best['acceptance_length_median'] / al_chain:.2f}x the chain's (highest: {top_name} "
            f"{top['acceptance_length_median']:.2f} = {top['acceptance_length_median'] / al_chain:.2f}x)"
        )
    return out + "."


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def markdown(doc: dict[str, Any]) -> str:
    """The results table of a `dflash bench --pair` JSON."""
    cfg, machine = doc["config"], doc["machine"]
    kinds = [k for k in ("code", "prose") if any(k in m.get("summary", {}) for m in doc["modes"])]
    head = ["mode", "decode t/s (all)", *(f"decode t/s ({k})" for k in kinds), "speed-up vs our AR"]
    head += ["acceptance length", "tokens / target forward", "greedy output = our AR"]
    counts = ", ".join(f"{v} {k}" for k, v in doc["prompts"]["kinds"].items())
    lines = [
        f"`{doc['command']}` at commit `{doc['commit'][:12]}`, {machine.get('gpu') or machine.get('cpu')} "
        f"({doc['backend']}); {doc['prompts']['count']} prompts ({counts}), "
        f"{cfg['n_predict']} tokens each, greedy; medians over prompts.",
        "",
        "| " + " | ".join(head) + " |",
        "| --- |" + " ---: |" * (len(head) - 1),
    ]
    for m in doc["modes"]:
        if "error" in m and not m.get("samples"):
            lines.append(f"| {m['mode']} | error: {m['error'][:80]} |" + " |" * (len(head) - 2))
            continue
        s = m["summary"]
        a = s["all"]
        same = m.get("identical_to_ours_ar")
        row = [m["mode"], _fmt(a["decode_tps_median"], ".1f")]
        row += [_fmt(s.get(k, {}).get("decode_tps_median"), ".1f") for k in kinds]
        row += [_fmt(a["speedup_vs_ours_ar_median"], ".2f") + ("x" if a["speedup_vs_ours_ar_median"] else "")]
        row += [_fmt(a["acceptance_length_median"], ".2f"), _fmt(a["tokens_per_forward_median"], ".2f")]
        row += ["-" if same is None else ("yes" if same else "no")]
        lines.append("| " + " | ".join(row) + " |")
    verdict = best_ddtree(doc)
    if verdict:
        lines += ["", verdict]
    chain = next((m for m in doc["modes"] if m["mode"] == "ours-chain"), None)
    depth = chain["summary"]["all"].get("per_depth_acceptance") if chain else None
    if depth:
        lines += [
            "",
            "Per-depth acceptance of ours-chain (share of verify steps whose draft was accepted up to ",
        ]
        lines[-1] += "depth d, pooled over prompts): " + ", ".join(
            f"d{i + 1} {x:.2f}" for i, x in enumerate(depth)
        )
    trained = (doc["pair"].get("training_acceptance") or {}).get("heldout")
    if trained:
        lines += [
            "",
            f"For comparison, the training run's held-out acceptance length (PyTorch simulation, "
            f"{trained['prompts']} prompts): {trained['mean']:.2f}.",
        ]
    return "\n".join(lines) + "\n"
