"""``MRTPOTrainer``: TRL's ``GRPOTrainer`` with MRTPO's reward-specific token credit (docs/design.md §1).

TRL's own step runs unchanged (generation, reward functions, GDPO's ``normalize_then_sum``, logging); two methods
are extended, the route TRL's maintainers give for a custom advantage (subclass, override
``_generate_and_score_completions``, as TRL's ``GFPOTrainer`` does):

- ``_calculate_rewards`` keeps the batch's per-reward scores [B, K] (every process's) beside TRL's answer;
- ``_generate_and_score_completions``, on training batches, replays each completion under P_all and P_minus_k with
  the policy model itself (eval mode, no grad: no copy of the weights), turns the relevance q into token weights
  and hands TRL (B, T) advantages, which TRL's loss takes as they are (it unsqueezes only a 1-D advantage).

Every equation is the recipe's core (``recipe.mrtpo.core``): the warm-up (``smoothstep_beta``), the replay plan
(``build_replay_plan``: replayed only where a reward varies in its group), the replay (``replay_relevance``), the
weights (``relevance_weights``); the batch normalisation is TRL's (``advantage.trl_token_advantages``) or, with
``mrtpo_normalization="verl"``, the verl recipe's (``compute_mrtpo_advantage_with_stats``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Optional

import torch
from trl import GRPOTrainer

from recipe.mrtpo.core.advantage import compute_mrtpo_advantage_with_stats, group_has_variance, relevance_weights, smoothstep_beta
from recipe.mrtpo.core.replay import expand_relevance, hf_forward, replay_relevance
from recipe.mrtpo.core.replay_plan import build_replay_plan, q_mass_top_share
from recipe.mrtpo.trl_adapter.advantage import trl_token_advantages
from recipe.mrtpo.trl_adapter.config import MRTPOGRPOConfig
from recipe.mrtpo.trl_adapter.rewards import reward_contexts

logger = logging.getLogger(__name__)


@dataclass
class ScoredBatch:
    """What TRL's ``_calculate_rewards`` saw and answered, kept for the advantage."""

    inputs: list
    prompts: list
    completions: list
    completion_ids: list
    rewards: torch.Tensor  # [B_all, K] every process's scores, NaN where a reward function returned None


@dataclass
class Relevance:
    """The replay of one batch (this process's rows)."""

    q: torch.Tensor  # [B, K, T] fp32, 0 where not replayed
    replayed: torch.Tensor  # [B, K] bool
    metrics: dict


class MRTPOTrainer(GRPOTrainer):
    """GRPOTrainer + MRTPO (module docstring); ``args`` an :class:`MRTPOGRPOConfig`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, MRTPOGRPOConfig):
            raise TypeError(f"MRTPOTrainer needs args=MRTPOGRPOConfig(...), got {type(self.args).__name__}")
        if getattr(self, "tools", None) or getattr(self, "environment_factories", None):
            raise ValueError("MRTPOTrainer: tools / environments in the rollout are not supported (the replay would "
                             "measure q on tool output)")
        if self.args.mrtpo_normalization == "verl" and self.accelerator.num_processes > 1:
            raise ValueError("MRTPOTrainer: mrtpo_normalization='verl' whitens over every token of the batch and runs on "
                             "one process only; use 'trl'")
        self._mrtpo_batch: Optional[ScoredBatch] = None
        self._mrtpo_warned: set = set()

    # ------------------------------------------------------------------------------------------------------------
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._mrtpo_batch = ScoredBatch(inputs, prompts, completions, completion_ids_list, rewards)
        return rewards

    def _generate_and_score_completions(self, inputs):
        self._mrtpo_batch = None
        output = super()._generate_and_score_completions(inputs)
        batch, self._mrtpo_batch = self._mrtpo_batch, None
        if not self.model.training or batch is None:  # evaluation keeps TRL's advantage
            return output
        adv = self.mrtpo_advantages(batch, output, self._metrics["train"])
        output["advantages"] = adv.to(output["advantages"].device)
        return output

    # ------------------------------------------------------------------------------------------------------------
    def mrtpo_advantages(self, batch: ScoredBatch, output: dict, metrics) -> torch.Tensor:
        """(B, T) advantages of this process's completions; ``metrics``: name -> list, TRL's ``_metrics[mode]``."""
        args = self.args
        beta_s = smoothstep_beta(int(self.state.global_step), args.mrtpo_beta, args.mrtpo_warmup_steps)
        scores = batch.rewards.detach().float().cpu()
        n = len(batch.prompts)
        rows = slice(self.accelerator.process_index * n, (self.accelerator.process_index + 1) * n)
        mask = output["completion_mask"].detach().float().cpu()
        lam = self.reward_weights.detach().float().cpu()
        metrics["mrtpo/beta"].append(beta_s)
        rel = self.mrtpo_relevance(batch, output, scores[rows], rows.start, mask) if beta_s > 0 else None
        weights = None
        if rel is not None:
            weights = torch.stack([relevance_weights(rel.q[:, k], mask, beta_s, args.mrtpo_max_realloc_rms,
                                                     max_token_weight=args.mrtpo_max_token_weight)
                                   for k in range(scores.shape[1])], dim=1)
            for key, value in {**rel.metrics, **self.reward_metrics(rel, weights, mask)}.items():
                metrics[key].append(value)
        if args.mrtpo_normalization == "verl":
            index = [i // self.num_generations for i in range(scores.shape[0])]
            adv, _ = compute_mrtpo_advantage_with_stats(
                scores, index, mask, rel.q if rel is not None else None, beta=beta_s, max_realloc_rms=args.mrtpo_max_realloc_rms,
                reward_weights=lam.tolist(), max_token_weight=args.mrtpo_max_token_weight)
            return adv
        return trl_token_advantages(scores, self.num_generations, lam, mask, weights, rows)

    def reward_metrics(self, rel: Relevance, weights: torch.Tensor, mask: torch.Tensor) -> dict:
        """Per reward: the share of q's mass on the top 10% of tokens and the largest weight, over its replayed rows."""
        out = {}
        for k, name in enumerate(self.reward_func_names):
            rep = rel.replayed[:, k]
            out[f"mrtpo/{name}/q_top10_share"] = q_mass_top_share(rel.q[:, k : k + 1], rep.unsqueeze(1), mask)
            w = weights[:, k][rep.unsqueeze(1).expand_as(mask) & (mask > 0)]
            out[f"mrtpo/{name}/weight_max"] = float(w.max()) if w.numel() else 1.0
            out[f"mrtpo/{name}/pairs_replayed"] = int(rep.sum())
        return out

    def reward_kwargs(self, batch: ScoredBatch) -> dict:
        """The arguments TRL gives a reward function (its ``_calculate_rewards``), for ``mrtpo_context``."""
        keys = [k for k in batch.inputs[0] if k not in ("prompt", "completion", "completion_ids")]
        return {"prompts": batch.prompts, "completions": batch.completions, "completion_ids": batch.completion_ids,
                "trainer_state": self.state, **{k: [x[k] for x in batch.inputs] for k in keys}}

    def render(self, messages: list[dict]) -> list[int]:
        """Prompt ids of a chat, as TRL renders its rollout prompts (its chat template, tools and kwargs)."""
        out = self.processing_class.apply_chat_template(
            conversation=[messages], tools=getattr(self, "tools", None) or None, chat_template=getattr(self, "chat_template", None),
            add_generation_prompt=True, tokenize=True, return_dict=True, **(getattr(self, "chat_template_kwargs", None) or {}))
        return list(out["input_ids"][0])

    def render_text(self, messages: list[dict]) -> list[int]:
        """Prompt ids of a plain-text prompt (held as one user turn), as TRL tokenizes one."""
        return list(self.processing_class(text=[messages[-1]["content"]])["input_ids"][0])

    def mrtpo_relevance(self, batch: ScoredBatch, output: dict, scores: torch.Tensor, first_row: int,
                        mask: torch.Tensor) -> Relevance:
        """Plan and run the replay of this process's completions (module docstring); q [B, K, T]."""
        t0 = time.perf_counter()
        names = list(self.reward_func_names)
        n, K, T = len(batch.prompts), len(names), mask.shape[1]
        contexts, missing = reward_contexts(self.reward_funcs, names, n, self.reward_kwargs(batch))
        for name in missing:
            if name not in self._mrtpo_warned:
                self._mrtpo_warned.add(name)
                logger.warning("MRTPOTrainer: reward %r has no mrtpo_context (no Z_k): its token weights stay uniform, "
                               "GDPO's spread (counted as mrtpo/%s/pairs_no_context)", name, name)
        chat = isinstance(batch.prompts[0], list)
        messages = [p if chat else [{"role": "user", "content": p}] for p in batch.prompts]
        pm = output["prompt_mask"].detach().cpu().bool()
        rollout = [output["prompt_ids"][i].detach().cpu()[pm[i]].tolist() for i in range(n)]
        index = [(first_row + i) // self.num_generations for i in range(n)]
        responses = output["completion_ids"].detach().cpu()
        plan = build_replay_plan(scores, index, names, contexts, messages, responses, mask,
                                 self.render if chat else self.render_text, max_prompt_length=self.args.mrtpo_max_replay_prompt_length,
                                 pad_id=int(self.processing_class.pad_token_id or 0), rollout_prompts=rollout)
        q = torch.zeros(n, K, T)
        if plan.rows:
            model = self.accelerator.unwrap_model(self.model)
            was_training = model.training
            model.eval()
            try:
                with torch.no_grad():
                    out = replay_relevance(hf_forward(model), **plan.inputs, micro_batch_size=self.args.mrtpo_replay_micro_batch_size,
                                           temperature=float(self.temperature), measure=self.args.mrtpo_measure,
                                           pad_id=int(self.processing_class.pad_token_id or 0), device=self.accelerator.device)
            finally:
                model.train(was_training)
            q[torch.tensor(plan.rows)] = expand_relevance(out["variant_relevance"], plan.inputs["pair_variant"])
        metrics: dict[str, Any] = dict(plan.metrics())
        variance = group_has_variance(scores, index)  # the pairs the replay would measure, had they a Z_k
        for name in missing:
            metrics[f"mrtpo/{name}/pairs_no_context"] = int(variance[:, names.index(name)].sum())
        # P_all is the rollout prompt for prompt-placed Z_k: a row where it is not means the render differs from TRL's
        metrics["mrtpo/rollout_prompt_found"] = (sum(v >= 0 for v in plan.rollout_variant) / len(plan.rollout_variant)
                                                 if plan.rollout_variant else 1.0)
        metrics["mrtpo/replay_time_s"] = time.perf_counter() - t0
        return Relevance(q=q, replayed=plan.replayed_mask, metrics=metrics)
