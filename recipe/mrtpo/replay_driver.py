"""The driver's side of one replay: plan it, hand it to the actor workers, map the answer back.

:func:`run_replay` is what the trainer's advantage step calls for ``adv_estimator=mrtpo``: it plans the
pairs to replay (``core.replay_plan``, ``docs/design.md`` §1.2 and §2), pads the packed rows to the
data-parallel size, calls ``dispatch`` (the worker group's ``compute_replay_relevance``, or any function
with the same contract in tests), and returns a :class:`ReplayResult`. No verl import: the trainer
passes the worker call and the chat-template renderer in.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Optional

import torch

from recipe.mrtpo.config import MRTPOConfig
from recipe.mrtpo.core.replay_plan import build_replay_plan, pad_rows, q_mass_top_share
from recipe.mrtpo.reward_extras import RewardTable

# dispatch(inputs: dict of packed tensors [R', ...], settings: dict) -> {"relevance": [R', K, T], "replay_logprobs": [R', T]}
Dispatch = Callable[[dict, dict], dict]


@dataclass
class ReplayResult:
    """Relevance of every (sample, reward) pair of the batch and what the metrics need."""

    relevance: torch.Tensor  # [B, K, T] fp32, 0 where not replayed
    replayed: torch.Tensor  # [B, K] bool
    rows: list[int] = field(default_factory=list)  # sample index of each replayed row
    replay_logprobs: Optional[torch.Tensor] = None  # [R, T]: log p(y_t | P_all) of the replayed rows
    pall_is_rollout_prompt: list[bool] = field(default_factory=list)  # per replayed row
    metrics: dict = field(default_factory=dict)

    def consistency_metrics(self, response_mask: torch.Tensor, old_log_probs: Optional[torch.Tensor]) -> dict:
        """Replay log p(y_t | P_all) against verl's old_log_probs on rows whose P_all is the rollout prompt.

        Both are the same quantity from the same weights (the replay's forward and verl's), so the
        difference measures numerics only (fp32: < 1e-4; bf16: ~1e-2) and catches rows mapped to the
        wrong sample.
        """
        if not self.rows or self.replay_logprobs is None or old_log_probs is None:
            return {}
        diffs = []
        for r, i in enumerate(self.rows):
            if r < len(self.pall_is_rollout_prompt) and self.pall_is_rollout_prompt[r]:
                m = response_mask[i] > 0
                diffs.append(float((self.replay_logprobs[r][m] - old_log_probs[i][m].float()).abs().max()))
        if not diffs:
            return {"mrtpo/consistency/rows": 0}
        return {"mrtpo/consistency/rows": len(diffs), "mrtpo/consistency/max_abs_logprob_diff": max(diffs)}


def run_replay(
    cfg: MRTPOConfig,
    table: RewardTable,
    index,
    messages: Sequence[Optional[list]],
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_prompts: Sequence[Sequence[int]],
    render: Callable[[list[dict]], list[int]],
    dispatch: Dispatch,
    dp_size: int,
    temperature: float,
    pad_id: int,
) -> ReplayResult:
    """Plan, dispatch and map back the replay of one batch (module docstring)."""
    t0 = time.perf_counter()
    plan = build_replay_plan(
        table.scores, index, table.names, table.contexts, messages, responses, response_mask, render,
        max_prompt_length=cfg.max_replay_prompt_length, joint=cfg.mode == "cort", pad_id=pad_id,
    )
    B, K, T = table.scores.shape[0], len(table.names), responses.shape[1]
    result = ReplayResult(relevance=torch.zeros(B, K, T), replayed=plan.replayed_mask, rows=list(plan.rows))
    result.metrics.update(plan.metrics())
    result.pall_is_rollout_prompt = [
        plan.inputs["variant_ids"][r, 0, -int(plan.inputs["variant_lens"][r, 0]):].tolist() == list(rollout_prompts[i])
        for r, i in enumerate(plan.rows)
    ]
    if plan.rows:
        inputs, _ = pad_rows(plan.inputs, dp_size)
        settings = {
            "temperature": float(temperature),
            "measure": cfg.measure_for_replay,
            "micro_batch_size": cfg.replay_micro_batch_size,
            "chunk_size": int(cfg.chunk_size or 0),
            "pad_token_id": int(pad_id),
            "compile_js": bool(cfg.compile_js),
        }
        out = dispatch(inputs, settings)
        n = len(plan.rows)
        result.relevance[torch.tensor(plan.rows)] = out["relevance"][:n].float()
        result.replay_logprobs = out["replay_logprobs"][:n].float()
    result.metrics["mrtpo/replay_time_s"] = time.perf_counter() - t0
    result.metrics["mrtpo/q_top10_share"] = q_mass_top_share(result.relevance, result.replayed, response_mask)
    return result
