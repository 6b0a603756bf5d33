"""The MRTPO trainer: verl 0.9.1's v1 sync trainer with one step changed (the advantage).

``@register_trainer("mrtpo")`` (selected with ``trainer.v1.trainer_mode=mrtpo``, which the recipe's
config sets). Everything else (rollout, reward, old_log_prob, ref, update, checkpoints, logging) is
verl's own loop. What changes:

1. the actor role runs :class:`recipe.mrtpo.worker.MRTPOActorRolloutRefWorker` (verl's worker plus
   the replay method), chosen where verl chooses the worker class (``_init_resource_pool_mgr``);
2. ``_compute_advantage`` (after old_log_prob/ref, before the update) reads the per-reward scores and
   contexts the ``mrtpo`` reward manager left in TransferQueue (verl's own GDPO fails on v1 because it
   fetches no reward extras), runs the replay for ``algorithm.adv_estimator=mrtpo``, and computes the
   ``mrtpo`` / ``gdpo`` advantage; any other estimator (``grpo``...) is verl's own step unchanged.

The warm-up step is s = global_steps - 1 (completed steps); verl restores global_steps from the
checkpoint folder on resume, so the beta schedule continues where it stopped.
"""

from __future__ import annotations

import json
import logging
import os
import time

import numpy as np
import ray
import torch
import transfer_queue as tq
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl.protocol import DataProto
from verl.trainer.ppo.ray_trainer import apply_kl_penalty
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.trainer.ppo.utils import Role
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils import tensordict_utils as tu
from verl.workers.engine_workers import ActorRolloutRefWorker
from verl.workers.utils.padding import response_to_nested

from recipe.mrtpo.core.advantage import smoothstep_beta
from recipe.mrtpo.estimator import (
    CONTEXTS_KEY,
    SCORES_KEY,
    compute_mrtpo_outcome_advantage,
    fill_errored_samples,
    reward_extras,
    reward_names_of,
    scores_matrix,
)
from recipe.mrtpo.core.replay_plan import build_replay_plan, pad_rows, q_mass_top_share
from recipe.mrtpo.worker import MRTPOActorRolloutRefWorker

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

RECIPE_ESTIMATORS = ("mrtpo", "gdpo")


def _rows(x) -> list[list[int]]:
    """Token-id rows of a (nested or padded) tensor field from TransferQueue, as lists."""
    if getattr(x, "is_nested", False):
        return [t.tolist() for t in x.unbind()]
    return [list(t) if not hasattr(t, "tolist") else t.tolist() for t in x]


def _tolist(x) -> list:
    if x is None:
        return []
    if hasattr(x, "tolist"):
        return list(x.tolist())
    return list(x)


@register_trainer("mrtpo")
class MRTPOTrainer(PPOTrainerSync):
    """verl's sync PPO trainer plus the MRTPO replay and estimator (see module docstring)."""

    # verl branches on ``trainer_mode == "sync"`` (replay buffer, checkpoints, prompt dispatch); this
    # trainer *is* the sync trainer, registered under its own name, so it reports "sync" there.
    @property
    def trainer_mode(self) -> str:
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, value: str) -> None:
        self._registered_mode = value

    # ------------------------------------------------------------------ worker class
    def _init_resource_pool_mgr(self):
        super()._init_resource_pool_mgr()
        for role in (Role.ActorRollout, Role.ActorRolloutRef, Role.Actor):
            cls = self.role_worker_mapping.get(role)
            if cls is not None and getattr(cls, "__ray_actor_class__", None) is ActorRolloutRefWorker:
                self.role_worker_mapping[role] = ray.remote(MRTPOActorRolloutRefWorker)

    # ------------------------------------------------------------------ config
    @property
    def mrtpo_cfg(self) -> dict:
        cfg = self.config.get("mrtpo", None)
        return OmegaConf.to_container(cfg, resolve=True) if cfg is not None else {}

    def _render(self, messages: list[dict]) -> list[int]:
        kwargs = dict(self.config.data.get("apply_chat_template_kwargs", None) or {})
        out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kwargs)
        if isinstance(out, dict) or hasattr(out, "keys"):
            out = out["input_ids"]
        return list(out)

    # ------------------------------------------------------------------ the changed step
    def _compute_advantage(self, batch, metrics: dict):
        est = self.config.algorithm.adv_estimator
        est = getattr(est, "value", est)
        self._last_plan_mask, self._last_replay_logprobs = None, ([], None)
        extras = self._fetch_reward_extras(batch)
        self._log_reward_metrics(extras, metrics)
        if est not in RECIPE_ESTIMATORS:
            return super()._compute_advantage(batch, metrics)

        fields = ["uid", "response_mask", "rm_scores", "rollout_log_probs", "old_log_probs", "ref_log_prob", "values", "responses"]
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        response_mask_nested = data["response_mask"]
        data = DataProto(batch=data.to_padded_tensor())
        data.batch["token_level_scores"] = data.batch["rm_scores"]
        data.non_tensor_batch["uid"] = np.array(data.batch.pop("uid").tolist(), dtype=object)
        if self.config.algorithm.use_kl_in_reward:
            data, kl_metrics = apply_kl_penalty(data, kl_ctrl=self.kl_ctrl_in_reward, kl_penalty=self.config.algorithm.kl_penalty)
            metrics.update(kl_metrics)
        else:
            data.batch["token_level_rewards"] = data.batch["token_level_scores"]
        rc = self.config.algorithm.get("rollout_correction", None)
        rollout_correction = rc is not None and "rollout_log_probs" in data.batch and not rc.get("bypass_mode", False)
        if rollout_correction:
            data, is_metrics = compute_rollout_correction_and_add_to_batch(data, rc)
            metrics.update(is_metrics)

        mask = data.batch["response_mask"].float()
        index = data.non_tensor_batch["uid"]
        per_sample_scores = [e.get(SCORES_KEY, "{}") for e in extras]
        names = reward_names_of(per_sample_scores)
        if not names:
            raise RuntimeError(
                "no per-reward scores in the batch: the 'mrtpo' and 'gdpo' estimators of this recipe need the "
                "'mrtpo' reward manager (reward.reward_manager.name=MRTPORewardManager, source=importlib)"
            )
        scores = scores_matrix(per_sample_scores, names)
        scores = fill_errored_samples(scores, [bool(e.get("mrtpo_error")) and not json.loads(e.get(SCORES_KEY) or "{}") for e in extras], index)

        cfg = self.mrtpo_cfg
        step = max(0, int(self.global_steps) - 1)
        beta_s = smoothstep_beta(step, float(cfg.get("beta", 0.5)), int(cfg.get("warmup_steps", 10)))
        relevance = None
        if est == "mrtpo" and cfg.get("replay", True) and beta_s > 0:
            relevance = self._replay(batch, data, extras, scores, names, index, metrics)
        elif est == "mrtpo":
            metrics["mrtpo/replay_skipped"] = 1.0  # beta_s = 0 (warm-up start) or replay disabled: plain GDPO
        mcfg = {
            "beta": beta_s if est == "mrtpo" else 0.0,
            "max_realloc_rms": cfg.get("max_realloc_rms", 1.0),
            "shuffle": bool(cfg.get("shuffle", False)),
            "seed": int(cfg.get("seed", 0)) * 100003 + step,
            "reward_weighting": cfg.get("reward_weighting", "none"),
            "reward_weights": cfg.get("reward_weights", None),
            "reward_names": names,
        }
        # the scores as filled above (errored samples: explicit zeros), NaN (absent) left out
        ntb = {SCORES_KEY: np.array([json.dumps({n: v for n, v in zip(names, row.tolist()) if v == v}) for row in scores], dtype=object)}
        adv, ret = compute_mrtpo_outcome_advantage(
            token_level_rewards=data.batch["token_level_rewards"],
            response_mask=mask,
            index=index,
            epsilon=1e-6,
            norm_adv_by_std_in_grpo=self.config.algorithm.get("norm_adv_by_std_in_grpo", True),
            non_tensor_batch=ntb,
            batch={"mrtpo_relevance": relevance} if relevance is not None else {},
            mrtpo_config=mcfg,
        )
        stats = mcfg["stats"]
        if relevance is not None:
            # how far the token weighting moved the advantage away from GDPO's (same scores, no relevance)
            gdpo_cfg = dict(mcfg, beta=0.0)
            gdpo_adv, _ = compute_mrtpo_outcome_advantage(
                token_level_rewards=data.batch["token_level_rewards"], response_mask=mask, index=index,
                non_tensor_batch=ntb, batch={}, mrtpo_config=gdpo_cfg,
            )
            metrics["mrtpo/adv_max_abs_diff_vs_gdpo"] = float(((adv - gdpo_adv).abs() * mask).max())
            metrics.update(self._consistency_metrics(data, mask))
        metrics.update(
            {
                "mrtpo/beta": beta_s if est == "mrtpo" else 0.0,
                "mrtpo/weight_max": stats.weight_max,
                "mrtpo/weight_min": stats.weight_min,
                "mrtpo/pairs_uniform": stats.uniform_pairs,
                "mrtpo/pairs_weighted": stats.weighted_pairs,
                "mrtpo/num_rewards": len(names),
                "mrtpo/adv_abs_mean": float((adv.abs() * mask).sum() / mask.sum().clamp(min=1)),
            }
        )
        for name, lam in zip(names, stats.reward_weights):
            metrics[f"mrtpo/lambda/{name}"] = lam
        data.batch["advantages"] = adv
        data.batch["returns"] = ret

        out_fields = ["advantages", "returns"]
        if self.config.algorithm.use_kl_in_reward:
            out_fields.append("token_level_rewards")
        if rollout_correction:
            out_fields.append("response_mask")
            if "rollout_is_weights" in data.batch:
                out_fields.append("rollout_is_weights")
        output = {f: response_to_nested(data.batch[f], response_mask_nested) for f in out_fields}
        output = TensorDict(output, batch_size=len(batch))
        batch = tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=output)
        self._maybe_dump(batch, data, extras, names, scores, index, relevance, adv, beta_s, metrics)
        return batch

    def _maybe_dump(self, batch, data, extras, names, scores, index, relevance, adv, beta_s, metrics) -> None:
        """Write what the heatmap viewer needs (``mrtpo.dump``): opt-in, every N steps, bounded size."""
        dcfg = self.mrtpo_cfg.get("dump") or {}
        every = int(dcfg.get("every_n_steps") or 0)
        if every <= 0 or self.global_steps % every != 0:
            return
        n = min(len(index), int(dcfg.get("max_samples") or 8))
        mask = data.batch["response_mask"][:n]
        T = int(mask.sum(-1).max()) if n else 0
        responses = data.batch["responses"][:n, :T]
        replayed = self._last_plan_mask
        if replayed is None:
            replayed = torch.zeros(len(index), len(names), dtype=torch.bool)
        dump = {
            "step": int(self.global_steps),
            "beta": float(beta_s),
            "max_realloc_rms": self.mrtpo_cfg.get("max_realloc_rms", 1.0),
            "shuffle": bool(self.mrtpo_cfg.get("shuffle", False)),
            "reward_names": list(names),
            "uid": [str(u) for u in index[:n]],
            "scores": scores[:n].clone(),
            "replayed": replayed[:n].clone(),
            "relevance": (relevance[:n, :, :T].clone() if relevance is not None else None),
            "advantages": adv[:n, :T].detach().cpu().clone(),
            "response_mask": mask[:, :T].cpu().clone(),
            "response_ids": responses.cpu().clone(),
            "response_tokens": [[self.tokenizer.decode([t]) for t in r.tolist()] for r in responses],
            "contexts": [json.loads(e.get(CONTEXTS_KEY) or "{}") for e in extras[:n]],
            "metrics": {k: float(v) for k, v in metrics.items() if k.startswith("mrtpo/") and isinstance(v, (int, float))},
        }
        out = os.path.join(str(dcfg.get("dir") or os.path.join(self.config.trainer.default_local_dir, "relevance_dumps")))
        os.makedirs(out, exist_ok=True)
        torch.save(dump, os.path.join(out, f"step_{self.global_steps:06d}.pt"))

    # ------------------------------------------------------------------ helpers
    def _fetch_reward_extras(self, batch) -> list[dict]:
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"])
        return reward_extras(_tolist(data["extra_fields"]))

    def _log_reward_metrics(self, extras: list[dict], metrics: dict) -> None:
        per = [json.loads(e.get(SCORES_KEY) or "{}") for e in extras if SCORES_KEY in e]
        if not per:
            return
        sums: dict[str, list[float]] = {}
        for d in per:
            for k, v in d.items():
                sums.setdefault(k, []).append(float(v))
        for k, vs in sums.items():
            metrics[f"mrtpo/reward/{k}/mean"] = float(np.mean(vs))
            metrics[f"mrtpo/reward/{k}/count"] = len(vs)
        metrics["mrtpo/verifier_errors"] = float(sum(1 for e in extras if e.get("mrtpo_error")))

    def _replay(self, batch, data: DataProto, extras, scores, names, index, metrics) -> torch.Tensor:
        cfg = self.mrtpo_cfg
        t0 = time.perf_counter()
        meta = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["raw_prompt"])
        messages = [list(m) if m is not None else None for m in _tolist(meta["raw_prompt"])]
        messages = [[dict(x) for x in m] if m else None for m in messages]
        contexts = [json.loads(e.get(CONTEXTS_KEY) or "{}") for e in extras]
        responses = data.batch["responses"]
        mask = data.batch["response_mask"]
        joint = cfg.get("mode", "mrtpo") == "cort"
        measure = "logprob_contrast" if joint else cfg.get("measure", "js_distance")
        plan = build_replay_plan(
            scores, index, names, contexts, messages, responses, mask, self._render,
            max_prompt_length=cfg.get("max_replay_prompt_length", None), joint=joint,
            pad_id=int(self.tokenizer.pad_token_id or 0),
        )
        metrics.update(plan.metrics())
        prompts = _rows(tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["prompts"])["prompts"])
        self._last_pall_is_rollout_prompt = [
            plan.inputs["variant_ids"][r, 0, -int(plan.inputs["variant_lens"][r, 0]) :].tolist() == prompts[i]
            for r, i in enumerate(plan.rows)
        ]
        B, K, T = scores.shape[0], len(names), responses.shape[1]
        relevance = torch.zeros(B, K, T)
        if plan.rows:
            dp = self._actor_dp_size()
            inputs, n_pad = pad_rows(plan.inputs, dp)
            td = TensorDict(inputs, batch_size=[inputs["pair_variant"].shape[0]])
            tu.assign_non_tensor(
                td,
                temperature=float(self.config.actor_rollout_ref.rollout.temperature),
                measure=measure,
                micro_batch_size=int(cfg.get("replay_micro_batch_size", 8)),
                chunk_size=int(cfg.get("chunk_size") or 0),
                pad_token_id=int(self.tokenizer.pad_token_id or 0),
                compile_js=bool(cfg.get("compile_js", False)),
            )
            out = self.actor_rollout_wg.compute_replay_relevance(td)
            out = out.get() if hasattr(out, "get") and not isinstance(out, TensorDict) else out
            rel = out["relevance"][: len(plan.rows)]
            relevance[torch.tensor(plan.rows)] = rel.float()
            self._last_replay_logprobs = (plan.rows, out["replay_logprobs"][: len(plan.rows)].float())
        self._last_plan_mask = plan.replayed_mask
        metrics["mrtpo/replay_time_s"] = time.perf_counter() - t0
        metrics["mrtpo/q_top10_share"] = q_mass_top_share(relevance, plan.replayed_mask, mask)
        self._last_relevance = relevance
        return relevance

    def _consistency_metrics(self, data: DataProto, mask: torch.Tensor) -> dict:
        """Replay log p(y_t | P_all) vs old_log_probs on rows whose P_all is the rollout prompt itself.

        They are the same quantity from the same weights (the replay's own forward vs verl's), so the
        difference measures only numerics (fp32: < 1e-4; bf16: ~1e-2).
        """
        rows, lp = getattr(self, "_last_replay_logprobs", ([], None))
        same = getattr(self, "_last_pall_is_rollout_prompt", [])
        if not rows or "old_log_probs" not in data.batch:
            return {}
        diffs = []
        for r, i in enumerate(rows):
            if r < len(same) and same[r]:
                m = mask[i] > 0
                diffs.append(float((lp[r][m] - data.batch["old_log_probs"][i][m].float()).abs().max()))
        if not diffs:
            return {"mrtpo/consistency/rows": 0}
        return {"mrtpo/consistency/rows": len(diffs), "mrtpo/consistency/max_abs_logprob_diff": max(diffs)}

    def _actor_dp_size(self) -> int:
        wg = self.actor_rollout_wg
        if "actor" not in wg._dispatch_info:
            wg._dispatch_info["actor"] = wg._query_dispatch_info("actor")
        return max(wg._dispatch_info["actor"]) + 1
