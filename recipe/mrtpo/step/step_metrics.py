"""What the trainer's advantage step reports of a batch, and which of its rows are verl's padding.

:func:`padding_rows` (verl's synthetic rows: left out of the metrics and the reward weighting),
:func:`reward_metrics` (per-reward means and counts, verifier / checker / record errors) and
:func:`concentration` (how concentrated the step's final advantage is).
"""

from __future__ import annotations

import re

import torch

from recipe.mrtpo.core.advantage import top_token_share
from recipe.mrtpo.rewards.reward_extras import RewardTable

#: verl 0.9.1's padding rows (``padding_utils.upsample_batch_to_divisible_size``): uid "pad" + uuid4 hex
PAD_UID = re.compile(r"^pad[0-9a-f]{32}$")


def padding_rows(batch, uid=None) -> torch.Tensor:
    """[B] bool: the synthetic rows verl appends to make the batch divisible by the data-parallel size.

    verl copies sample 0 (its reward extras included) under one pad uid, with a one-token response whose
    response_mask is 0, and tags each ``is_padding=True`` (what its own metrics filter on). Recognised by
    the tag, or by the pad uid where the batch meta carries no tags.
    """
    tags = list(getattr(batch, "tags", None) or [])
    n = len(uid) if uid is not None else len(tags) if tags else len(batch)
    out = torch.zeros(n, dtype=torch.bool)
    if len(tags) == n:
        out |= torch.tensor([bool(t.get("is_padding", False)) if isinstance(t, dict) else False for t in tags], dtype=torch.bool)
    if uid is not None:
        out |= torch.tensor([bool(PAD_UID.match(str(u))) for u in uid], dtype=torch.bool)
    return out


def reward_metrics(table: RewardTable, valid=None) -> dict:
    """Per-reward mean and count over the responses that carry the reward, and the verifier errors.

    ``valid`` ([B] bool): rows to count (verl's padding rows, copies of sample 0, are left out).
    """
    keep = torch.ones(table.scores.shape[0], dtype=torch.bool) if valid is None else torch.as_tensor(valid, dtype=torch.bool)
    metrics: dict = {}
    for k, name in enumerate(table.names):
        col = table.scores[keep, k]
        col = col[~torch.isnan(col)]
        metrics[f"mrtpo/reward/{name}/mean"] = float(col.mean()) if col.numel() else float("nan")
        metrics[f"mrtpo/reward/{name}/count"] = int(col.numel())
    # a verifier that raised (the row has no scores) apart from a checker that failed on one reward (scored 0),
    # and apart from no verdict (a file missing on the verifier's node, NoVerdict: the row leaves the step)
    missing, no_verdict, out = table.missing_files, table.no_verdict, table.rows_out.tolist()
    metrics["mrtpo/verifier_errors"] = float(sum(1 for r, o, v in zip(table.raised, out, keep.tolist()) if r and v and not o))
    metrics["mrtpo/missing_files"] = float(sum(1 for m, v in zip(missing, keep.tolist()) if m and v))
    metrics["mrtpo/no_verdict"] = float(sum(1 for m, v in zip(no_verdict, keep.tolist()) if m and v))
    metrics["mrtpo/checker_errors"] = float(sum(1 for e, r, v in zip(table.errors, table.raised, keep.tolist()) if e and not r and v))
    # of those, rows whose agent-loop record (multi-turn) was missing or malformed: every reward 0
    metrics["mrtpo/record_errors"] = float(sum(1 for e, v in zip(table.record_errors, keep.tolist()) if e and v))
    return metrics


def concentration(adv: torch.Tensor, mask: torch.Tensor) -> dict:
    """How concentrated the step's final advantage is (the instability measures of docs/format_speed): the largest
    |A_t| over valid tokens, and the top token's share of a response's sum_t A_t^2 (max and mean over responses)."""
    share = top_token_share(adv, mask)
    share = share[~torch.isnan(share)]
    return {"mrtpo/adv_max_abs": float((adv.abs() * (mask > 0)).max()) if adv.numel() else 0.0,
            "mrtpo/adv_top_share_max": float(share.max()) if share.numel() else float("nan"),
            "mrtpo/adv_top_share_mean": float(share.mean()) if share.numel() else float("nan")}
