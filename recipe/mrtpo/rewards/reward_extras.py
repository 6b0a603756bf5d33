"""What the ``mrtpo`` reward manager leaves per sample and how the trainer reads it back.

verl's reward loop requires every sample of a batch to carry the same extra keys, while rewards are
ragged (an instruction-following prompt has 1 to 5+ constraints). So each sample's per-reward scores
and contexts travel as one JSON object under fixed keys of ``reward_extra_info``:

    mrtpo_rewards   JSON {reward_name: score}
    mrtpo_contexts  JSON {reward_name: {"text": Z_k, "placement": "prompt" | "appended"}}
    mrtpo_task      the data_source
    mrtpo_error     "" or "ExceptionType: message" when the verifier raised; "record: why" when the
                    agent loop's record a task judges was missing or malformed (every reward 0)

:func:`read_reward_table` parses them once, on the driver, into a :class:`RewardTable` of tensors that
the advantage step uses directly. No verl import.

A verifier that raised because a file it reads was not on its node (the error holds
:func:`recipe.mrtpo.cluster.node_files.missing_line`: a database that vanished mid-run), or raised ``NoVerdict`` (the error
holds ``verdict.NO_VERDICT_MARK``: an asset of the node missing, a database it cannot read, a gold query that
failed), did not judge the response at all: the row is not scored 0 but taken out (``RewardTable.rows_out``): its
scores stay absent (NaN), so it enters no group's statistics, its advantage is exactly 0 and its response mask 0
(:func:`advantage_mask`: the trainer writes that mask back, so the row leaves the loss, its KL and entropy terms and
the token-mean denominator too). Counted: ``mrtpo/missing_files``, ``mrtpo/no_verdict``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from recipe.mrtpo.cluster.node_files import is_missing_file
from recipe.mrtpo.cluster.verdict import is_no_verdict

SCORES_KEY = "mrtpo_rewards"
CONTEXTS_KEY = "mrtpo_contexts"
TASK_KEY = "mrtpo_task"
ERROR_KEY = "mrtpo_error"
#: how ``mrtpo_error`` begins when the row's agent-loop record was missing or malformed
RECORD_ERROR_PREFIX = "record: "


def _parse(obj: Any) -> dict:
    if isinstance(obj, dict):
        return obj
    if isinstance(obj, (bytes, str)):
        return json.loads(obj) if obj else {}
    if obj is None:
        return {}
    raise TypeError(f"per-reward scores must be a JSON object or dict, got {type(obj).__name__}")


def reward_extras(extra_fields: Sequence[Any]) -> list[dict]:
    """Per sample ``reward_extra_info`` dicts from TransferQueue's ``extra_fields`` (missing -> {})."""
    out = []
    for ef in extra_fields:
        ef = getattr(ef, "data", ef)
        info = ef.get("reward_extra_info", {}) if isinstance(ef, dict) else {}
        out.append(info if isinstance(info, dict) else {})
    return out


def reward_names_of(per_sample: Sequence[Any]) -> list[str]:
    """Sorted union of the reward names over a batch (ragged rewards: each sample has a subset)."""
    names: set[str] = set()
    for s in per_sample:
        names.update(_parse(s).keys())
    return sorted(names)


def scores_matrix(per_sample: Sequence[Any], reward_names: Sequence[str]) -> torch.Tensor:
    """[B, K] float32 scores; NaN where a sample has no such reward."""
    out = torch.full((len(per_sample), len(reward_names)), float("nan"))
    col = {n: j for j, n in enumerate(reward_names)}
    for i, s in enumerate(per_sample):
        for name, v in _parse(s).items():
            if name in col and v is not None:
                out[i, col[name]] = float(v)
    return out


def fill_errored_samples(scores: torch.Tensor, errored: Sequence[bool], index) -> torch.Tensor:
    """A sample whose verifier raised scores 0 on every reward its group has (never NaN, never dropped)."""
    if not any(errored):
        return scores
    scores = scores.clone()
    index = np.asarray(index, dtype=object).astype(str)
    present = ~torch.isnan(scores)
    for i, bad in enumerate(errored):
        if not bad:
            continue
        group = torch.as_tensor(index == index[i])
        cols = present[group].any(0)
        scores[i, cols & torch.isnan(scores[i])] = 0.0
    return scores


@dataclass
class RewardTable:
    """The batch's per-reward scores and verifier information, parsed once.

    names: the K reward names (sorted union over the batch); scores: [B, K] (NaN = absent; a sample whose
    verifier raised has 0 on its group's rewards, unless it raised without a verdict, a missing file or
    ``NoVerdict``: NaN on every reward);
    contexts: per sample {name: {"text", "placement"}}; errors: per sample verifier error ("" if none); raised:
    per sample, the verifier raised (no scores at all; a checker that failed on one reward leaves an error but
    its scores).
    """

    names: list[str]
    scores: torch.Tensor
    contexts: list[dict]
    errors: list[str]
    raised: list[bool] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.raised:
            self.raised = [False] * len(self.errors)

    @property
    def n_errors(self) -> int:
        return sum(1 for e in self.errors if e)

    @property
    def record_errors(self) -> list[bool]:
        """Per sample: the agent loop's record was missing or malformed (scored 0 on every reward)."""
        return [e.startswith(RECORD_ERROR_PREFIX) for e in self.errors]

    @property
    def missing_files(self) -> list[bool]:
        """Per sample: the verifier raised on a file missing on its node (module docstring): taken out."""
        return [bool(r) and is_missing_file(e) for e, r in zip(self.errors, self.raised)]

    @property
    def no_verdict(self) -> list[bool]:
        """Per sample: the verifier raised ``NoVerdict`` (not a missing file; module docstring): taken out."""
        return [bool(r) and is_no_verdict(e) and not is_missing_file(e) for e, r in zip(self.errors, self.raised)]

    @property
    def rows_out(self) -> torch.Tensor:
        """[B] bool: the rows without a verdict (:attr:`missing_files` or :attr:`no_verdict`), taken out of the step."""
        return torch.tensor([a or b for a, b in zip(self.missing_files, self.no_verdict)], dtype=torch.bool)


def advantage_mask(response_mask: torch.Tensor, out_rows) -> torch.Tensor:
    """The response mask with the rows ``out_rows`` ([B] bool) zeroed: mask'[i, t] = mask[i, t] * (1 - out_i).

    Every method's advantage is masked by it (0 on those rows) and verl's batch whitening runs over the other
    rows' tokens only, so a row whose verifier could not judge it moves no other row's advantage; written back as
    the batch's ``response_mask`` it also takes the row out of the update's loss (policy, KL, entropy terms and
    the token-mean denominator all read that mask)."""
    out = torch.as_tensor(out_rows, dtype=torch.bool, device=response_mask.device).reshape(-1)
    if out.numel() != response_mask.shape[0]:
        raise ValueError(f"out_rows has {out.numel()} entries for {response_mask.shape[0]} rows")
    return response_mask * (~out).to(response_mask.dtype).unsqueeze(-1)


def read_reward_table(extras: Sequence[dict], index) -> RewardTable:
    """Parse the reward manager's extras of a batch (see module docstring) into a :class:`RewardTable`."""
    per_sample = [e.get(SCORES_KEY, "{}") for e in extras]
    names = reward_names_of(per_sample)
    scores = scores_matrix(per_sample, names)
    errors = [str(e.get(ERROR_KEY) or "") for e in extras]
    errored = [bool(err) and not _parse(s) for err, s in zip(errors, per_sample)]
    # no verdict (a missing file, NoVerdict): no score (NaN: out of its group's statistics), never a 0
    judged = [not (is_missing_file(e) or is_no_verdict(e)) for e in errors]
    scores = fill_errored_samples(scores, [r and j for r, j in zip(errored, judged)], index)
    contexts = [_parse(e.get(CONTEXTS_KEY) or "{}") for e in extras]
    return RewardTable(names=names, scores=scores, contexts=contexts, errors=errors, raised=errored)
