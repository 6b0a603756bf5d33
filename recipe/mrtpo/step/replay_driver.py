"""The driver's side of one replay: plan it, hand it to the workers, map the answer back.

:func:`run_replay` is what the trainer's advantage step calls for a method with a replay pass (its entry's
:class:`~recipe.mrtpo.methods.types.ReplayPass`): it plans the pairs to replay (``core.replay_plan``,
``docs/design.md`` §1.2 and §2; RLSD's pass plans the teacher prompt alone), pads the packed rows to the
data-parallel size, orders them so that each rank's contiguous share holds similar tokens, calls ``dispatch``
(the actor worker group's ``compute_replay_relevance``; ``compute_ref_replay`` for a pass on verl's reference
policy; or any function with the same contract in tests), maps the workers' compact answer (one half-precision relevance row per
replayed variant, §5) to rewards, and returns a :class:`ReplayResult`. No verl import: the trainer
passes the worker call and the chat-template renderer in.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

import torch

from recipe.mrtpo.core.passes import response_lengths  # noqa: F401  (the trainer's)
from recipe.mrtpo.core.replay import expand_relevance
from recipe.mrtpo.core.replay_plan import build_p_all_plan, build_replay_plan, pad_rows, q_mass_top_share
from recipe.mrtpo.methods.registry import replay_pass_of
from recipe.mrtpo.passes.pass_driver import PassRequest, balanced_order, pass_metrics

# dispatch(inputs: dict of packed tensors [R', ...], settings: dict) ->
#   {"variant_relevance": [R', NV', T] (any float dtype; row j - 1 = variant j), "replay_logprobs": [R', T],
#    optionally "replay_forwards": [R', 4] (each row's rank: its pass counts, ``pass_driver.pass_metrics``)}
Dispatch = Callable[[dict, dict], dict]


@dataclass
class ReplayResult:
    """Relevance of every (sample, reward) pair of the batch and what the metrics need."""

    relevance: torch.Tensor  # [B, K, T] fp32, 0 where not replayed
    replayed: torch.Tensor  # [B, K] bool
    rows: list[int] = field(default_factory=list)  # sample index of each replayed row
    replay_logprobs: Optional[torch.Tensor] = None  # [R, T]: log p(y_t | the row's rollout-prompt variant, else P_all)
    logprobs_are_rollout_prompt: list[bool] = field(default_factory=list)  # per replayed row
    privileged: list[bool] = field(default_factory=list)  # per row of a P_all-only pass: P_all differs from the rollout prompt
    reference: bool = False  # the pass ran on verl's reference policy: its log-probs are not the actor's
    metrics: dict = field(default_factory=dict)
    # the fused old_log_prob step (``run_replay(fused=True)``): verl's old_log_probs and entropy of every sample
    # [B, T] fp32 (0 where masked), from the replay's own forwards where a replayed variant is the rollout prompt
    old_log_probs: Optional[torch.Tensor] = None
    entropy: Optional[torch.Tensor] = None

    def consistency_metrics(self, response_mask: torch.Tensor, old_log_probs: Optional[torch.Tensor]) -> dict:
        """|replay log p(y_t | variant) - verl's old_log_probs| over the valid tokens of the rows where that
        variant is the rollout prompt (P_all for prompt-placed Z; the block-free P_minus_k when the only Z is
        appended, as tool calling's): the max, the mean and the 99th percentile, and the rows and tokens compared.

        Both are the same quantity from the same weights (the replay's forward and verl's), so the difference
        measures numerics only and catches rows mapped to the wrong sample. Expected: fp32 ~1e-5 at the max;
        bf16 of the order of 0.1-1 at the max over ~1e6 tokens (a long tail: the mean and p99 are far
        smaller), because the two forwards batch and pad the sequences differently.
        """
        if not self.rows or self.replay_logprobs is None or old_log_probs is None or self.reference:
            return {}
        if self.old_log_probs is not None:
            # fused: old_log_probs of these rows ARE the replay's log-probs, nothing left to compare here (verl's
            # rollout-vs-actor metrics, ``training/rollout_probs_diff_*``, still check the actor's numbers)
            return {"mrtpo/consistency/rows": 0, "mrtpo/consistency/fused_rows": sum(self.logprobs_are_rollout_prompt)}
        diffs = []
        for r, i in enumerate(self.rows):
            if r < len(self.logprobs_are_rollout_prompt) and self.logprobs_are_rollout_prompt[r]:
                m = response_mask[i] > 0
                diffs.append((self.replay_logprobs[r][m] - old_log_probs[i][m].float()).abs())
        if not diffs:
            return {"mrtpo/consistency/rows": 0}
        d = torch.cat(diffs).float()
        out = {"mrtpo/consistency/rows": len(diffs), "mrtpo/consistency/tokens": int(d.numel())}
        if d.numel():
            sample = d if d.numel() <= 1 << 24 else d[torch.randperm(d.numel(), generator=torch.Generator().manual_seed(0))[: 1 << 24]]
            out.update({
                "mrtpo/consistency/max_abs_logprob_diff": float(d.max()),
                "mrtpo/consistency/mean_abs_logprob_diff": float(d.mean()),
                "mrtpo/consistency/p99_abs_logprob_diff": float(torch.quantile(sample, 0.99)),
            })
        return out


def run_replay(request: PassRequest, index, *, fused: bool = False) -> ReplayResult:
    """Plan, dispatch and map back the replay of one batch (module docstring); ``request.dispatch`` has the
    contract of :data:`Dispatch`, ``index``: [B] group ids (verl's uid).

    ``fused``: the same pass also yields verl's old_log_probs and entropy of every sample
    (``result.old_log_probs`` / ``entropy``): a replayed row whose variant is the rollout prompt gets them
    from that variant's forward, every other sample from one forward of its rollout prompt (an extra row).
    """
    t0 = time.perf_counter()
    cfg, table, messages, render, row_render = request.cfg, request.table, request.messages, request.render, request.row_render
    responses, response_mask, rollout_prompts = request.responses, request.response_mask, request.rollout_prompts
    dp_size, pad_id = request.dp_size, request.pad_id
    spec = replay_pass_of(cfg)  # what the method's entry asks of the replay (recipe.mrtpo.methods)
    reference = spec.on_reference(cfg)
    if reference and fused:
        raise ValueError("a pass on verl's reference policy cannot give verl's old_log_probs (fused=True)")
    if spec.p_all_only:  # the teacher prompt alone, its log-probs (RLSD)
        plan = build_p_all_plan(
            len(table.names), table.contexts, messages, responses, response_mask, render, rollout_prompts,
            max_prompt_length=cfg.max_replay_prompt_length, pad_id=pad_id, every_row=reference, row_render=row_render,
            template=cfg.teacher_template,
        )
    else:
        plan = build_replay_plan(
            table.scores, index, table.names, table.contexts, messages, responses, response_mask, render,
            max_prompt_length=cfg.max_replay_prompt_length, joint=spec.joint, pad_id=pad_id,
            rollout_prompts=rollout_prompts, row_render=row_render,
        )
    B, K, T = table.scores.shape[0], len(table.names), responses.shape[1]
    result = ReplayResult(relevance=torch.zeros(B, K, T), replayed=plan.replayed_mask, rows=list(plan.rows),
                          privileged=list(plan.privileged), reference=reference)
    result.metrics.update(plan.metrics())
    # which forwarded variant of each row is the rollout prompt (P_all for prompt-placed Z, tool calling's
    # P_minus_correctness when only the appended block differs): its log-probs are verl's old_log_probs
    lp_variant = torch.zeros(len(plan.rows), dtype=torch.long)
    for r, _i in enumerate(plan.rows):
        v = plan.rollout_variant[r]
        forwarded = v == 0 or v in set(plan.inputs["pair_variant"][r].tolist())
        if spec.p_all_only:  # the row's one variant, the teacher prompt: its log-probs on every row
            v, forwarded = (0, True) if v == 0 else (-1, False)
        lp_variant[r] = v if v >= 0 and forwarded else 0
        result.logprobs_are_rollout_prompt.append(v >= 0 and forwarded and not reference)
    inputs = {**plan.inputs, "logprob_variant": lp_variant}
    rows = list(plan.rows)
    if fused:  # every sample whose old_log_probs no replayed row yields: one row of its rollout prompt
        lp_rows = {i for i, ok in zip(plan.rows, result.logprobs_are_rollout_prompt) if ok}
        extra = [i for i in range(B) if i not in lp_rows]
        inputs = with_rollout_rows(inputs, extra, rollout_prompts, responses, response_mask, pad_id)
        rows += extra
    if rows:
        inputs, _ = pad_rows(inputs, dp_size)
        # rows go to ranks in contiguous chunks: order them so that each chunk holds similar tokens
        order = balanced_order(row_tokens(inputs), dp_size)
        perm = torch.tensor(order, dtype=torch.long)
        settings = {
            **request.settings().to_wire(),
            "measure": spec.measure_of(cfg),
            "compile_js": bool(cfg.compile_js),
            "fused": bool(fused),
        }
        out = request.dispatch({k: v.index_select(0, perm) for k, v in inputs.items()}, settings)
        back = torch.empty_like(perm)
        back[perm] = torch.arange(perm.numel())
        n = len(plan.rows)
        rows_back = back[:n]  # where each planned row came back
        if n:
            rel = expand_relevance(out["variant_relevance"].index_select(0, rows_back), plan.inputs["pair_variant"])
            result.relevance[torch.tensor(plan.rows)] = rel
            result.replay_logprobs = out["replay_logprobs"].index_select(0, rows_back).float()
        if fused:
            result.old_log_probs = torch.zeros(B, T)
            result.entropy = torch.zeros(B, T)
            for k, i in enumerate(rows):  # a planned row first, then the extra ones: each sample written once
                if k < n and not result.logprobs_are_rollout_prompt[k]:
                    continue
                result.old_log_probs[i] = out["replay_logprobs"][back[k]].float()
                result.entropy[i] = out["replay_entropy"][back[k]].float()
        if out.get("replay_forwards", None) is not None:
            result.metrics.update(pass_metrics(out["replay_forwards"], dp_size, "mrtpo/replay"))
    elif fused:
        result.old_log_probs, result.entropy = torch.zeros(B, T), torch.zeros(B, T)
    result.metrics["mrtpo/replay_time_s"] = time.perf_counter() - t0
    result.metrics["mrtpo/q_top10_share"] = q_mass_top_share(result.relevance, result.replayed, response_mask)
    return result


def with_rollout_rows(inputs: dict, samples: list[int], rollout_prompts, responses: torch.Tensor,
                      response_mask: torch.Tensor, pad_id: int) -> dict:
    """``inputs`` plus one row per sample of ``samples``: its rollout prompt as variant 0, nothing replayed,
    its log-probs asked for (``logprob_variant`` 0); prompts re-padded (on the left) to the longest."""
    if not samples:
        return inputs
    R, NV, P = inputs["variant_ids"].shape
    P2 = max(P, max(len(rollout_prompts[i]) for i in samples))
    ids = torch.full((R + len(samples), NV, P2), pad_id, dtype=inputs["variant_ids"].dtype)
    ids[:R, :, P2 - P :] = inputs["variant_ids"]
    lens = torch.zeros(R + len(samples), NV, dtype=inputs["variant_lens"].dtype)
    lens[:R] = inputs["variant_lens"]
    for k, i in enumerate(samples):
        p = list(rollout_prompts[i])
        if p:
            ids[R + k, 0, P2 - len(p) :] = torch.tensor(p, dtype=ids.dtype)
        lens[R + k, 0] = len(p)
    idx = torch.tensor(samples, dtype=torch.long)
    K = inputs["pair_variant"].shape[1]
    return {
        "variant_ids": ids,
        "variant_lens": lens,
        "responses": torch.cat([inputs["responses"], responses.index_select(0, idx).long()]),
        "response_mask": torch.cat([inputs["response_mask"], response_mask.index_select(0, idx).long()]),
        "pair_variant": torch.cat([inputs["pair_variant"], torch.full((len(samples), K), -1, dtype=inputs["pair_variant"].dtype)]),
        "logprob_variant": torch.cat([inputs["logprob_variant"], torch.zeros(len(samples), dtype=torch.long)]),
    }


def row_tokens(inputs: dict) -> list[int]:
    """Tokens each packed row forwards: P_all and every replayed variant (and the ``logprob_variant``
    forwarded for its log-probs alone), each followed by the response up to its last valid token (0 for a
    padding row)."""
    resp = response_lengths(inputs["response_mask"])
    lens = inputs["variant_lens"].long()
    used = torch.zeros_like(lens, dtype=torch.bool)
    pair = inputs["pair_variant"].long()
    used.scatter_(1, pair.clamp(min=0), pair > 0)
    used[:, 0] = (pair > 0).any(-1)
    if "logprob_variant" in inputs:
        lpv = inputs["logprob_variant"].long()
        used[torch.arange(lens.shape[0])[lpv >= 0], lpv[lpv >= 0]] = True
    used &= lens > 0
    used &= (resp > 0).unsqueeze(-1)
    return ((lens + resp.unsqueeze(-1)) * used).sum(-1).tolist()
