"""A relevance dump made ready for display: fields checked (:func:`recipe.mrtpo.step.dump.check_dump`), optional
ones filled, token text decoded and sanitised, rho resolved, and the trainer's weights recomputed."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from recipe.mrtpo.core.advantage import relevance_weights
from recipe.mrtpo.step.dump import SPAN_KINDS, DumpError, as_tensor, check_dump, loop_spans
from recipe.mrtpo.tools.viz.tokens import decode_byte_level, looks_byte_level, sanitize_text

TOKEN_MODES = ("auto", "bytelevel", "text")


@dataclass
class DumpView:
    """A relevance dump as the page shows it: shapes checked, defaults filled, ``tokens`` display text."""

    step: Optional[int]
    beta: float
    rho: Optional[float]
    names: list[str]
    uids: list[str]
    scores: torch.Tensor  # [n, K] float, NaN = absent
    replayed: torch.Tensor  # [n, K] bool
    relevance: Optional[torch.Tensor]  # [n, K, T] float
    advantages: Optional[torch.Tensor]  # [n, T] float
    mask: torch.Tensor  # [n, T] bool
    tokens: list[list[str]]  # [n][T] display text
    raw_tokens: list[list[str]]  # [n][T] as in the dump
    contexts: list[dict]
    metrics: dict
    shuffle: Optional[bool] = None
    source: str = ""
    notes: list[str] = field(default_factory=list)
    #: c, the cap on one token's weight the trainer applied (the dump's ``max_token_weight``); None: no cap
    cap: Optional[float] = None
    #: [n][T]: ``tool`` / ``user`` where an agent loop put text the model did not generate (the dump's ``spans``), else ""
    kinds: list[list[str]] = field(default_factory=list)


def resolve_rho(raw: dict, override: Any = "dump") -> Optional[float]:
    """rho of the RMS constraint (docs/design.md §1.5): ``override`` (a number, or None = disabled) if given, else the dump's
    ``max_realloc_rms`` (None = disabled), else metric ``mrtpo/max_realloc_rms``, else 1.0 (the default)."""
    if override != "dump":
        return None if override is None else float(override)
    if "max_realloc_rms" in raw:
        v = raw["max_realloc_rms"]
        return None if v is None else float(v)
    v = (raw.get("metrics") or {}).get("mrtpo/max_realloc_rms")
    if isinstance(v, (int, float)) and math.isfinite(v) and v >= 0:
        return float(v)
    return 1.0


def normalise_dump(raw: dict, source: str = "", rho: Any = "dump", tokens: str = "auto") -> DumpView:
    """Check a raw dump dict and fill what is optional; raises :class:`DumpError` with the reason."""
    if tokens not in TOKEN_MODES:
        raise DumpError(f"tokens must be one of {TOKEN_MODES}, got {tokens!r}")
    checked = check_dump(raw)
    names = [sanitize_text(n) for n in raw["reward_names"]]
    scores, mask, replayed = checked["scores"], checked["mask"], checked["replayed"]
    relevance, advantages = checked["relevance"], checked["advantages"]
    n, T = mask.shape

    raw_tokens = raw.get("response_tokens")
    if raw_tokens is None:
        ids = raw.get("response_ids")
        if ids is None:
            raise DumpError("dump has neither 'response_tokens' nor 'response_ids'")
        ids = as_tensor(ids, "response_ids", torch.long)
        raw_tokens = [[f"⟨{int(t)}⟩" for t in row.tolist()] for row in ids]
        tokens = "text"
    if len(raw_tokens) != n:
        raise DumpError(f"response_tokens has {len(raw_tokens)} rows for {n} samples")
    raw_tokens = [[t if isinstance(t, str) else sanitize_text(t) for t in list(row)[:T]] for row in raw_tokens]
    raw_tokens = [row + [""] * (T - len(row)) for row in raw_tokens]
    byte_level = tokens == "bytelevel" or (tokens == "auto" and looks_byte_level(raw_tokens))
    shown = [[sanitize_text(decode_byte_level(t) if byte_level else t) for t in row] for row in raw_tokens]

    beta = raw.get("beta", (raw.get("metrics") or {}).get("mrtpo/beta", 0.0))
    try:
        beta = float(beta)
    except (TypeError, ValueError) as e:
        raise DumpError(f"beta is not a number: {beta!r}") from e
    if not 0.0 <= beta <= 1.0:
        raise DumpError(f"beta must be in [0, 1], got {beta}")
    rho_v = resolve_rho(raw, rho)
    if rho_v is not None and (not math.isfinite(rho_v) or rho_v < 0):
        raise DumpError(f"rho (max_realloc_rms) must be >= 0, got {rho_v}")
    cap = raw.get("max_token_weight")
    if cap is not None and (not isinstance(cap, (int, float)) or not math.isfinite(cap) or cap < 1):
        raise DumpError(f"max_token_weight must be a number >= 1 or None, got {cap!r}")

    uids = raw.get("uid")
    uids = [str(i) for i in range(n)] if uids is None else list(uids)
    uids = [sanitize_text(u) for u in uids[:n]] + [""] * max(0, n - len(uids))
    contexts = list(raw.get("contexts") or [])
    contexts = [c if isinstance(c, dict) else {} for c in contexts[:n]] + [{}] * max(0, n - len(contexts))
    metrics = raw.get("metrics") if isinstance(raw.get("metrics"), dict) else {}
    step = raw.get("step")
    notes = []
    if byte_level:
        notes.append("tokens are raw byte-level BPE pieces, decoded for display (tooltips show the raw piece)")
    if relevance is None:
        notes.append("no replay at this step (relevance is None): every row is uniform")
    kinds = span_kinds(raw.get("spans"), mask)
    if any(k for row in kinds for k in row):
        notes.append("agent-loop responses: tool results and injected user turns are marked; the model did not "
                     "generate them, they are attended but never measured or trained")
    return DumpView(
        step=None if step is None else int(step), beta=beta, rho=rho_v, names=names, uids=uids, scores=scores,
        replayed=replayed, relevance=relevance, advantages=advantages, mask=mask, tokens=shown,
        raw_tokens=raw_tokens, contexts=contexts, metrics=metrics,
        shuffle=raw.get("shuffle") if isinstance(raw.get("shuffle"), bool) else None, source=source, notes=notes,
        kinds=kinds, cap=None if cap is None else float(cap),
    )


def span_kinds(raw_spans: object, mask: torch.Tensor) -> list[list[str]]:
    """Per response and position, the kind of the agent-loop span covering it (``tool`` / ``user``) or "".

    Only masked positions are marked (a span over a measured position is a contradiction, shown as measured);
    the dump's spans pass :func:`recipe.mrtpo.step.dump.loop_spans` again (hostile input: off-shape entries dropped)."""
    n, T = mask.shape
    kinds = [[""] * T for _ in range(n)]
    if not isinstance(raw_spans, (list, tuple)):
        return kinds
    valid = mask.tolist()
    for i, row in enumerate(loop_spans(list(raw_spans), n, T)):
        for kind, start, end in row:
            for t in range(start, end):
                if not valid[i][t] and kind in SPAN_KINDS:
                    kinds[i][t] = kind
    return kinds


def row_weights(d: DumpView, i: int, k: int) -> torch.Tensor:
    """w_{i,k,t} as the trainer computed it (docs/design.md §1.3, §1.5): :func:`relevance_weights` of row
    (i, k), [T] (1 where uniform)."""
    if d.relevance is None:
        return d.mask[i].to(torch.float32)
    return relevance_weights(d.relevance[i : i + 1, k], d.mask[i : i + 1], d.beta, d.rho, max_token_weight=d.cap)[0]


def select_samples(d: DumpView, max_samples: Optional[int] = None, only_replayed: bool = False) -> list[int]:
    """Indices of the responses to show: in dump order, those with a replayed row if ``only_replayed``, at most ``max_samples``."""
    idx = [i for i in range(d.scores.shape[0]) if not only_replayed or bool(d.replayed[i].any())]
    return idx if max_samples is None else idx[: max(0, int(max_samples))]
