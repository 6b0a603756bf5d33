"""The MRTPO trainer: verl 0.9.1's v1 sync trainer with one step changed, the advantage, and its batch's rows
in a fixed order.

``@register_trainer("mrtpo")`` (selected with ``trainer.v1.trainer_mode=mrtpo``, which the recipe's config
sets). Rollout, reward, old_log_prob, ref, update, checkpoints and logging are verl's own loop. Changed:

1. the actor role (and a standalone reference role) runs :class:`recipe.mrtpo.step.worker.MRTPOActorRolloutRefWorker`
   (verl's worker plus the replay and OPSD-teacher passes, and the replay on the reference model), chosen where
   verl chooses the worker class (``_init_resource_pool_mgr``);
2. ``_compute_advantage``, for the run's method (:mod:`recipe.mrtpo.methods`, resolved once from the config):
   fetch the step's inputs once, read the per-reward scores and contexts the ``mrtpo`` reward manager left in
   TransferQueue (the reward table), run the method's replay pass when its schedule is > 0, compute its token
   advantage, write it, run its after-step hook (OPSD's teacher pass), dump. What it must re-state of verl's
   step is :mod:`recipe.mrtpo.seams.verl_seam`. A method without its own advantage (GRPO) runs verl's step unchanged.
   (verl's own ``gdpo`` cannot run on the v1 path: its step fetches no reward extras.)

3. the sampled batch is put back in the order its prompts were submitted before verl balances it
   (``_submit_batch_to_rollout`` numbers the prompts, ``_balance_batch`` sorts): verl hands the rows over in the
   order their requests finished, so two runs of one seed would update on sums in different orders.

The step is s = global_steps - 1 (completed steps); verl restores ``global_steps`` from the checkpoint on
resume, so the schedules (beta_s, RLSD's lambda) continue where they stopped (§1.4). A method whose pass runs
on verl's reference policy (RLSD's initial teacher, ``ReplayPass.on_reference``) dispatches it to the reference
worker group's ``compute_ref_replay``, with the reference's data-parallel size and token budget (§1.8).
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from typing import Optional

import numpy as np
import ray
import torch
from verl.trainer.ppo.utils import Role
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.workers.engine_workers import ActorRolloutRefWorker

from recipe.mrtpo import methods
from recipe.mrtpo.cluster.checkpoint_shards import RESUME_MARK, record_save, resume_refusal
from recipe.mrtpo.config import MRTPOConfig, mrtpo_config
from recipe.mrtpo.core.seeding import submission_order
from recipe.mrtpo.methods import AdvantageInputs, Method, StepContext, gdpo_advantage
from recipe.mrtpo.passes.pass_driver import PassRequest, dispatch_rows, token_budget
from recipe.mrtpo.rewards.reward_extras import RewardTable, advantage_mask, read_reward_table, reward_extras
from recipe.mrtpo.rollout.rollout_render import RolloutRender
from recipe.mrtpo.seams import verl_seam
from recipe.mrtpo.step.dump import SPANS_KEY, DumpError, RelevanceDump, loop_spans, write_dump
from recipe.mrtpo.step.replay_driver import ReplayResult, run_replay
from recipe.mrtpo.step.standing_step import fused_check_failed, verl_passes
from recipe.mrtpo.step.step_metrics import concentration, padding_rows, reward_metrics
from recipe.mrtpo.step.step_plan import StepPlan, plan_step
from recipe.mrtpo.step.worker import MRTPOActorRolloutRefWorker

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))


def _rows(x) -> list[list[int]]:
    """Token-id rows of a (nested or padded) tensor field from TransferQueue, as lists."""
    if getattr(x, "is_nested", False):
        return [t.tolist() for t in x.unbind()]
    return [t.tolist() if hasattr(t, "tolist") else list(t) for t in x]


def _tolist(x) -> list:
    if x is None:
        return []
    return list(x.tolist()) if hasattr(x, "tolist") else list(x)


#: what the step reads of the batch besides verl's advantage fields, in one fetch (hooks get it in their context)
STEP_FIELDS = ["extra_fields", "raw_prompt", "prompts"]

@register_trainer("mrtpo")
class MRTPOTrainer(PPOTrainerSync):
    """verl's sync PPO trainer plus the MRTPO replay and advantage (see module docstring)."""

    # verl branches on ``trainer_mode == "sync"`` (replay buffer, checkpoints, prompt dispatch); this
    # trainer *is* the sync trainer, registered under its own name, so it reports "sync" there.
    @property
    def trainer_mode(self) -> str:
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, value: str) -> None:
        self._registered_mode = value

    def _init_resource_pool_mgr(self):
        super()._init_resource_pool_mgr()
        for role in (Role.ActorRollout, Role.ActorRolloutRef, Role.Actor, Role.RefPolicy):
            cls = self.role_worker_mapping.get(role)
            if cls is not None and getattr(cls, "__ray_actor_class__", None) is ActorRolloutRefWorker:
                self.role_worker_mapping[role] = ray.remote(MRTPOActorRolloutRefWorker)

    # ------------------------------------------------------------------ the batch in submission order
    #: prompts submitted whose rows may still come back (uid -> place in submission); the oldest are forgotten
    #: past this many (a prompt verl evicted never comes back)
    MAX_PENDING_UIDS = 100_000

    def _pending_ranks(self) -> dict:
        if getattr(self, "_uid_rank", None) is None:
            self._uid_rank = {}
        return self._uid_rank

    def _submit_batch_to_rollout(self, batch) -> int:
        ranks = self._pending_ranks()
        start = getattr(self, "_uids_submitted", 0)
        for k, uid in enumerate(batch["uid"]):
            ranks[str(uid)] = start + k
        self._uids_submitted = start + len(batch["uid"])
        for uid in list(ranks)[: max(0, len(ranks) - self.MAX_PENDING_UIDS)]:
            del ranks[uid]
        return super()._submit_batch_to_rollout(batch)

    def _balance_batch(self, batch, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        """verl's balancing, on the rows put back in submission order first (``core.seeding.submission_order``):
        verl samples them in the order they finished, and the sums over the batch then differ between two runs
        of one seed (``mrtpo/rows_moved_to_submission_order``: how many rows it moved). Rows it cannot place keep
        going, after the others (``mrtpo/rows_unordered``)."""
        ranks = self._pending_ranks()
        order, unplaced = submission_order(list(batch.keys), ranks)
        metrics["mrtpo/rows_moved_to_submission_order"] = float(sum(j != k for k, j in enumerate(order)))
        batch.reorder(order)
        for key in batch.keys:
            ranks.pop(str(key).rsplit("_", 2)[0], None)
        if unplaced:
            metrics["mrtpo/rows_unordered"] = float(unplaced)
        return super()._balance_batch(batch, metrics, logging_prefix=logging_prefix, keep_minibatch=keep_minibatch)

    @property
    def mrtpo(self) -> MRTPOConfig:
        cfg = getattr(self, "_mrtpo_cfg", None)
        if cfg is None:
            cfg = self._mrtpo_cfg = mrtpo_config(self.config.get("mrtpo", None))
        return cfg

    @property
    def method(self) -> Method:
        """The run's method (``recipe.mrtpo.methods``), resolved once (``main_mrtpo.check_config`` did it before Ray)."""
        m = getattr(self, "_method", None)
        if m is None:
            m = self._method = methods.resolve(self.config)
        return m

    # ------------------------------------------------------------------ the step's plan
    def _step_once(self, metrics: dict, timing_raw: dict, sample_batch_size: int):
        """verl's step (``PPOTrainer._step_once``, pinned in ``rollout_seed.ROLLOUT_SEED_SOURCES``), its
        :class:`~recipe.mrtpo.step.step_plan.StepPlan` made first."""
        self._begin_step()
        return super()._step_once(metrics, timing_raw, sample_batch_size)

    def _begin_step(self) -> StepPlan:
        """Decide this step once (``step_plan.plan_step``): replay, fused old_log_prob, standing check, teacher pass."""
        plan = self._plan = plan_step(self.method, self.mrtpo, self.config, int(self.global_steps),
                                      checked_before=getattr(self, "_fused_checked", False))
        if plan.standing_check:
            self._fused_checked = True
        return plan

    @property
    def plan(self) -> StepPlan:
        """This step's plan: made at the start of verl's step, or by the first step method that reads it where the
        step is driven without ``_step_once`` (a new ``global_steps`` makes a new plan)."""
        plan = getattr(self, "_plan", None)
        if plan is None or plan.global_step != int(self.global_steps):
            plan = self._begin_step()
        return plan

    # ------------------------------------------------------------------ the changed step
    def _compute_advantage(self, batch, metrics: dict):
        method, cfg = self.method, self.mrtpo
        fields = verl_seam.fetch_fields(batch, STEP_FIELDS)
        extras = reward_extras(_tolist(fields["extra_fields"]))
        if not method.recipe_step:  # verl's estimator step (GRPO); the recipe only adds its reward metrics
            if any(extras):
                valid = ~padding_rows(batch, None) if len(getattr(batch, "tags", None) or []) == len(extras) else None
                table = read_reward_table(extras, np.arange(len(extras)))
                metrics.update(reward_metrics(table, valid))
                if table.rows_out.any():  # verl's step sees one scalar, 0 for such a row, and cannot leave it out
                    raise RuntimeError(next(e for e, m in zip(table.errors, table.rows_out) if m)
                                       + f" (step {self.global_steps}: verl's {method.estimator} step would train on a 0)")
            return super()._compute_advantage(batch, metrics)

        ab = verl_seam.read_advantage_batch(self.config, batch, metrics)
        table = read_reward_table(extras, ab.uid)
        valid = ~padding_rows(batch, ab.uid)  # verl's padding rows: out of the reward metrics and SAW/DVAO
        metrics["mrtpo/padding_rows"] = int((~valid).sum())
        metrics.update(reward_metrics(table, valid))
        if not table.names and not any(table.raised):
            raise RuntimeError(
                f"no per-reward scores in the batch: method {method.name} needs the 'mrtpo' reward manager "
                "(reward.reward_manager.name=MRTPORewardManager, source=importlib)"
            )
        if not table.names:  # every verifier raised (e.g. a task that was never imported): zero advantage, go on
            logger.warning("mrtpo: every verifier of step %s raised (first: %s); the batch trains with zero advantage",
                           self.global_steps, next(e for e in table.errors if e))
            metrics["mrtpo/batches_without_scores"] = 1
        plan = self.plan
        replay = None
        if plan.replay:
            replay = self._replay(batch, ab, table, fields)
            metrics.update(replay.metrics)
            metrics.update(replay.consistency_metrics(ab.response_mask, ab.data.batch.get("old_log_probs", None)))
        elif plan.replay_skipped:
            metrics["mrtpo/replay_skipped"] = 1.0  # strength 0 (warm-up start) or replay disabled: plain GDPO

        out_rows = table.rows_out  # no verdict: out of the advantage (exactly 0) and of the loss (mask written 0)
        metrics["mrtpo/rows_out"] = int((out_rows & valid).sum())
        if out_rows.any():
            logger.warning("mrtpo: step %s: %d rows taken out of the step, their verifier without a verdict: %s",
                           self.global_steps, int(out_rows.sum()), next(e for e, m in zip(table.errors, out_rows) if m))
        mask = advantage_mask(ab.response_mask.float(), out_rows)
        inputs = AdvantageInputs(cfg, table, ab.uid, mask, valid & ~out_rows, plan.step, plan.strength, replay,
                                 ab.data.batch.get("old_log_probs", None))
        adv = self._advantage(method, inputs, metrics) if (valid & ~out_rows).any() else torch.zeros_like(mask)  # all rows out
        out = verl_seam.write_advantages(batch, ab, adv, adv, response_mask=mask if out_rows.any() else None)
        if plan.teacher_pass:
            _, row_render, _ = self._planner_renders(self._row_tools(batch, len(ab.uid)))  # the rows' tools, as the rollout's
            out = method.after_step(StepContext(self.config, cfg, batch, metrics, table, fields, self.tokenizer,
                                                self._render, self.actor_rollout_wg, self._actor_dp_size, row_render,
                                                reference_group=self._reference_wg, reference_dp_size=lambda: self._dp_size("ref"),
                                                written=out))
        self._maybe_dump(ab, table, replay, adv, metrics.get("mrtpo/beta", 0.0), metrics)
        self._note_no_privileged(method, metrics)
        return out

    def _note_no_privileged(self, method: Method, metrics: dict) -> None:
        """A self-teacher's one line, on the first step it measures ``mrtpo/rows_privileged`` (no later one):
        where it is 0 the run has no privileged information (``methods.no_privileged_line``)."""
        if getattr(self, "_privileged_noted", False) or metrics.get(methods.ROWS_PRIVILEGED, None) is None:
            return
        self._privileged_noted = True
        line = methods.no_privileged_line(method, metrics, self.global_steps)
        if line:
            logger.warning(line)

    def _advantage(self, method: Method, inputs: AdvantageInputs, metrics: dict) -> torch.Tensor:
        """The method's token advantage [B, T] and its metrics (the core's statistics, the difference to GDPO)."""
        adv, stats = method.advantage(inputs)
        mask = inputs.mask
        if inputs.replay is not None:
            gdpo_adv, _ = gdpo_advantage(replace(inputs, replay=None, strength=0.0))
            metrics["mrtpo/adv_max_abs_diff_vs_gdpo"] = float(((adv - gdpo_adv).abs() * mask).max())
        metrics.update(
            {
                "mrtpo/beta": inputs.strength if method.reads_knob("beta") else 0.0,
                "mrtpo/weight_max": stats.weight_max,
                "mrtpo/weight_min": stats.weight_min,
                "mrtpo/pairs_uniform": stats.uniform_pairs,
                "mrtpo/pairs_weighted": stats.weighted_pairs,
                "mrtpo/num_rewards": len(inputs.table.names),
                "mrtpo/adv_abs_mean": float((adv.abs() * mask).sum() / mask.sum().clamp(min=1)),
                **concentration(adv, mask),
                **stats.extra,
            }
        )
        for name, lam in zip(inputs.table.names, stats.reward_weights):
            metrics[f"mrtpo/lambda/{name}"] = lam
        return adv

    # ------------------------------------------------------------------ replay
    def _render(self, messages: list[dict], tools: Optional[list[dict]] = None) -> list[int]:
        """A prompt's ids as verl's rollout renders them (``rollout_render``: its chat-template arguments, the
        row's ``tools``)."""
        return self._rollout_render.render_ids(self.tokenizer, messages, tools)

    @property
    def _rollout_render(self) -> RolloutRender:
        rr = getattr(self, "_rollout_render_obj", None)
        if rr is None:
            rr = self._rollout_render_obj = RolloutRender(self.config)
        return rr

    def _row_tools(self, batch, n: int) -> Optional[list]:
        """Per sample the ``tools=`` the rollout rendered it with; None when no row can have any (no tool config).
        The row's ``agent_name`` and ``extra_info.tool_selection`` are read from the batch where it holds them,
        else the config's default agent loop and no selection."""
        rr = self._rollout_render
        if not rr.has_tools:
            return None
        agents, infos = [None] * n, [None] * n
        try:
            got = verl_seam.fetch_fields(batch, ["agent_name", "extra_info"])
            agents, infos = _tolist(got["agent_name"]) or agents, _tolist(got["extra_info"]) or infos
        except Exception as e:  # fields the batch does not hold: the config's defaults
            logger.warning("mrtpo: the batch holds no agent_name / extra_info (%s); rendering with the default agent loop's tools", e)
        return [rr.tools_of(a, x if isinstance(x, dict) else None) for a, x in zip(agents, infos)]

    def _planner_renders(self, tools: Optional[list]):
        """``(render, row_render, encoder)`` of the rows' ``tools`` (``RolloutRender.planner_renders``)."""
        return self._rollout_render.planner_renders(self.tokenizer, tools)

    def _load_checkpoint(self):
        """verl's resume, refused in one line where it would load nothing or part of the model (``checkpoint_shards``)."""
        refusal = resume_refusal(self.config.trainer, verl_seam.resume_folder(self.config), verl_seam.actor_world_size(self.config))
        if refusal:
            raise RuntimeError(RESUME_MARK + refusal)
        return super()._load_checkpoint()

    def _save_checkpoint(self):
        """verl's save, then the step in the run's own record, which a resume checks (``checkpoint_shards.record_save``)."""
        super()._save_checkpoint()
        record_save(self.config.trainer.default_local_dir, int(self.global_steps), verl_seam.actor_world_size(self.config))

    def _compute_old_log_prob(self, batch, metrics: dict):
        """verl's old_log_prob step, fused with the replay where the replay runs (``StepPlan.fuse_old_log_prob``):
        one pass engine forward per distinct sequence gives the relevance and verl's ``old_log_probs`` and
        ``entropy`` (a replayed variant that is the rollout prompt is not forwarded twice); written back as
        verl writes them (``verl_seam.write_old_log_probs``). ``_replay`` then returns that result. On a standing
        check's step (``StepPlan.standing_check``) verl's own old_log_prob runs first, and again packed otherwise
        (the floor); a failed check trains the step on verl's own log-probs and entropy (``standing_step``)."""
        self._fused_replay = None
        plan = self.plan
        if not plan.fuse_old_log_prob:
            return super()._compute_old_log_prob(batch, metrics)
        ob = verl_seam.read_old_log_prob_batch(self.config, batch)
        meta = verl_seam.fetch_fields(batch, ["raw_prompt", "prompts", "extra_fields"])
        verl = verl_passes(self.config, batch, self.actor_rollout_wg, ob, _rows(meta["prompts"])) if plan.standing_check else None
        table = read_reward_table(reward_extras(_tolist(meta["extra_fields"])), ob.uid)
        result = self._run_replay(batch, ob, table, fused=True, fields=meta)
        self._fused_replay = (list(batch.keys), result)
        log_probs, entropy = result.old_log_probs, result.entropy
        if verl is not None and fused_check_failed(self.config, result.old_log_probs, verl, ob.response_mask,
                                                   ~padding_rows(batch, ob.uid), metrics, self.global_steps):
            log_probs, entropy = verl[0], verl[1]  # the check failed: this step trains on verl's own numbers
        return verl_seam.write_old_log_probs(self.config, batch, ob, log_probs, entropy, metrics)

    def _replay(self, batch, ab: verl_seam.AdvantageBatch, table: RewardTable, fields: Optional[dict] = None) -> ReplayResult:
        fused, self._fused_replay = getattr(self, "_fused_replay", None), None
        if fused is not None:
            keys, result = fused
            B, T = ab.response_mask.shape
            if keys == list(batch.keys) and tuple(result.relevance.shape) == (B, len(table.names), T):
                return result
            logger.warning("mrtpo: the fused replay does not match the advantage step's batch; replaying again")
            result = self._run_replay(batch, ab, table, fields=fields)
            result.metrics["mrtpo/fused_replay_mismatch"] = 1
            return result
        return self._run_replay(batch, ab, table, fields=fields)

    def _run_replay(self, batch, ab: verl_seam.AdvantageBatch, table: RewardTable, fused: bool = False,
                    fields: Optional[dict] = None) -> ReplayResult:
        # the advantage step's own fetch already holds the prompts; the fused old_log_prob step fetches them here
        meta = fields if fields is not None else verl_seam.fetch_fields(batch, ["raw_prompt", "prompts"])
        messages = [[dict(x) for x in m] if m is not None and len(m) else None for m in _tolist(meta["raw_prompt"])]
        # the planning renders each distinct prompt once and tokenizes the batch's distinct line-led pieces of text in one
        # call (the variants of a group share all but a sentence or a block; checked against whole renders), each row
        # rendered as the rollout rendered it (its chat-template arguments and tools, rollout_render)
        render, row_render, encoder = self._planner_renders(self._row_tools(batch, len(messages)))
        on_ref = self.method.replay.on_reference(self.mrtpo)
        request = PassRequest(
            self.mrtpo, table, messages, ab.data.batch["responses"], ab.response_mask,
            rollout_prompts=_rows(meta["prompts"]), render=render,
            dispatch=self._dispatch_reference if on_ref else self._dispatch_replay,
            dp_size=self._dp_size("ref" if on_ref else "actor"),
            temperature=float(self.config.actor_rollout_ref.rollout.temperature), pad_id=int(self.tokenizer.pad_token_id or 0),
            token_budget=token_budget(self.config, reference=on_ref), row_render=row_render,
        )
        result = run_replay(request, ab.uid, fused=fused)
        result.metrics["mrtpo/plan_piece_mismatches"] = encoder.mismatches
        result.metrics["mrtpo/replay_fused_old_log_prob"] = int(fused)
        return result

    def _dispatch_replay(self, inputs: dict, settings: dict) -> dict:
        return dispatch_rows(self.actor_rollout_wg.compute_replay_relevance, inputs, settings)

    def _reference_wg(self):
        wg = getattr(self, "ref_policy_wg", None)
        if wg is None:
            raise RuntimeError("the pass runs on verl's reference policy, but verl built no reference worker "
                               "(actor_rollout_ref.actor.use_kl_loss=True builds it; main_mrtpo.check_config refuses this)")
        return wg

    def _dispatch_reference(self, inputs: dict, settings: dict) -> dict:
        return dispatch_rows(self._reference_wg().compute_ref_replay, inputs, settings)

    def _dp_size(self, mesh: str = "actor") -> int:
        """The data-parallel size of the actor's (``actor``) or the reference's (``ref``) mesh."""
        wg = self._reference_wg() if mesh == "ref" else self.actor_rollout_wg
        if mesh not in wg._dispatch_info:
            wg._dispatch_info[mesh] = wg._query_dispatch_info(mesh)
        return max(wg._dispatch_info[mesh]) + 1

    def _actor_dp_size(self) -> int:
        return self._dp_size("actor")

    # ------------------------------------------------------------------ dump
    def _maybe_dump(self, ab, table: RewardTable, replay, adv: torch.Tensor, beta_s: float, metrics: dict) -> None:
        """Write what the heatmap viewer needs (``mrtpo.dump``): opt-in, every N steps, bounded size."""
        d = self.mrtpo.dump
        if d.every_n_steps <= 0 or self.global_steps % d.every_n_steps != 0:
            return
        index = ab.uid
        n = min(len(index), d.max_samples)
        mask = ab.response_mask[:n]
        # the whole response (tool and user spans of a multi-turn one included), not the model's token count
        lengths = ab.response_lengths[:n]
        T = int(lengths.max()) if n else 0
        responses = ab.data.batch["responses"][:n, :T].cpu()
        replayed = replay.replayed if replay is not None else torch.zeros(len(index), len(table.names), dtype=torch.bool)
        dump = RelevanceDump(
            step=int(self.global_steps),
            beta=float(beta_s),
            max_realloc_rms=self.mrtpo.max_realloc_rms,
            max_token_weight=self.mrtpo.max_token_weight,
            shuffle=self.mrtpo.shuffle,
            reward_names=list(table.names),
            uid=[str(u) for u in index[:n]],
            scores=table.scores[:n].clone(),
            replayed=replayed[:n].clone(),
            relevance=replay.relevance[:n, :, :T].clone() if replay is not None else None,
            advantages=adv[:n, :T].detach().cpu().clone(),
            response_mask=mask[:, :T].cpu().clone(),
            response_lengths=lengths.clone(),
            response_ids=responses.clone(),
            response_tokens=[[self.tokenizer.decode([t]) for t in r.tolist()] for r in responses],
            contexts=list(table.contexts[:n]),
            metrics={k: float(v) for k, v in metrics.items() if k.startswith("mrtpo/") and isinstance(v, (int, float))},
            spans=loop_spans(ab.data.non_tensor_batch.get(SPANS_KEY), n, T),  # the viewer marks tool / user spans
        )
        folder = d.dir or os.path.join(self.config.trainer.default_local_dir, "relevance_dumps")
        try:
            write_dump(dump, folder)
        except (DumpError, OSError) as e:  # a diagnostic must never stop training: log and count it
            logger.warning("mrtpo: relevance dump of step %s not written: %s", self.global_steps, e)
            metrics["mrtpo/dump_errors"] = metrics.get("mrtpo/dump_errors", 0) + 1
