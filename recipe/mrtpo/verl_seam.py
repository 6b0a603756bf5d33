"""The lines of verl 0.9.1's advantage step that the recipe re-states, in one labelled place.

verl's ``PPOTrainer._compute_advantage`` (``verl/trainer/ppo/v1/trainer_base.py``, 0.9.1) does four things:

1. read ``uid, response_mask, rm_scores, rollout_log_probs, old_log_probs, ref_log_prob, values`` from
   TransferQueue into a padded ``DataProto``; ``token_level_rewards = rm_scores`` (or the KL-penalised
   reward when ``algorithm.use_kl_in_reward``);
2. rollout correction (IS weights / rejection) when configured, through
   ``compute_rollout_correction_and_add_to_batch``;
3. ``compute_advantage_for_multi_trajectories(...)``: the estimator;
4. write ``advantages, returns`` (+ ``response_mask``, ``rollout_is_weights`` after a rollout correction)
   back to TransferQueue as nested tensors.

The recipe replaces step 3 only. Steps 1, 2 and 4 are :func:`read_advantage_batch` and
:func:`write_advantages` below, calling the same verl functions; the KL-in-reward branch is not
re-stated because ``main_mrtpo`` refuses ``use_kl_in_reward`` with the recipe's estimators (their
advantage is built from per-reward scores, not from the token-level reward). ``UPSTREAM_SOURCE_SHA256``
pins verl's method: ``tests/integration/test_verl_seam.py`` fails, with a diff, when verl changes it.

verl's ``PPOTrainer._compute_old_log_prob`` (same file) is the other step the trainer overrides, when the
replay runs in it (the old_log_prob forwards fused with the replay's, ``replay_driver.run_replay(fused=True)``):
its step 1 (the worker group's ``compute_log_prob``) is replaced by the pass engine; steps 2-4 (write
``old_log_probs`` and ``entropy`` back to TransferQueue as nested responses, the ``actor/entropy`` metric
through ``agg_loss``, the rollout-vs-actor debug metrics when ``rollout.calculate_log_probs``) are
:func:`read_old_log_prob_batch` and :func:`write_old_log_probs`; the bypass mode (old = rollout log-probs)
is left to verl (the trainer does not fuse then). ``OLD_LOG_PROB_SOURCE_SHA256`` pins that method.

The functions other modules restate or follow are pinned by name -> sha256 of the dedented source
(:mod:`recipe.mrtpo.source_pins` reads and compares them), each group next to the code it guards: here verl's
log-prob numerics (:data:`NUMERICS_SOURCES`) and the self-teachers' distillation path
(:data:`DISTILLATION_SOURCES`); the BFCL agent loop's verl pieces and bfcl-eval's functions in
:mod:`recipe.mrtpo.agent.pins`; the rollout's per-request seeds in :mod:`recipe.mrtpo.rollout_seed`; SDPO's in
:mod:`recipe.mrtpo.methods.sdpo.pins`; transformers' mask pass-through and attention registry, which the shared
forwards' block-sparse attention relies on, in :mod:`recipe.mrtpo.tree_attention`.
"""

from __future__ import annotations

import inspect
import textwrap
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch
import transfer_queue as tq
from tensordict import TensorDict
from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import agg_loss
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.utils.debug.metrics import calculate_debug_metrics
from verl.workers.utils.padding import response_to_nested

from recipe.mrtpo.source_pins import changed_sources, source_sha256

#: the fields verl's step 1 reads (kept in its order), plus what the recipe needs besides
VERL_FIELDS = ["uid", "response_mask", "rm_scores", "rollout_log_probs", "old_log_probs", "ref_log_prob", "values"]
RECIPE_FIELDS = ["responses"]

#: sha256 of ``textwrap.dedent(inspect.getsource(PPOTrainer._compute_advantage))`` in verl 0.9.1
UPSTREAM_SOURCE_SHA256 = "ce9f40b2d0cebe1136e7a57bbc3911002e79804fd47737ffd084cb74e6db0fa7"


#: sha256 of ``textwrap.dedent(inspect.getsource(PPOTrainer._compute_old_log_prob))`` in verl 0.9.1
OLD_LOG_PROB_SOURCE_SHA256 = "e9ee1fc72ac57177ed32c6892b773a4c6e4607e1f439641c6ca4f6c692c639c5"


def upstream_source(method: str = "_compute_advantage") -> str:
    """verl's ``PPOTrainer.<method>`` source, dedented (what the guard test hashes)."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    return textwrap.dedent(inspect.getsource(getattr(PPOTrainer, method)))


def check_upstream(source: str, pinned_copy: str = "", method: str = "_compute_advantage") -> None:
    """Raise when verl's ``<method>`` (``_compute_advantage`` or ``_compute_old_log_prob``) is not the one
    this module re-states (module docstring).

    ``pinned_copy`` (the 0.9.1 source) turns the message into a unified diff of what changed.
    """
    pinned = {"_compute_advantage": UPSTREAM_SOURCE_SHA256, "_compute_old_log_prob": OLD_LOG_PROB_SOURCE_SHA256}[method]
    if source_sha256(source) == pinned:
        return
    import difflib

    diff = "".join(difflib.unified_diff(pinned_copy.splitlines(True), source.splitlines(True), "verl 0.9.1", "installed verl"))
    what = {"_compute_advantage": "read_advantage_batch, write_advantages; UPSTREAM_SOURCE_SHA256",
            "_compute_old_log_prob": "read_old_log_prob_batch, write_old_log_probs; OLD_LOG_PROB_SOURCE_SHA256"}[method]
    raise RuntimeError(
        f"verl's PPOTrainer.{method} changed: re-check recipe/mrtpo/verl_seam.py ({what}) against it, then update "
        "the hash and the pinned copy.\n" + diff
    )


@dataclass
class AdvantageBatch:
    """verl's padded view of the batch for the advantage step (steps 1-2), plus what step 4 needs."""

    data: DataProto  # padded [B, T] tensors; non_tensor_batch["uid"]
    response_mask_nested: Any  # the nested mask, the layout step 4 writes back in
    rollout_correction: bool  # step 2 ran: step 4 also writes response_mask / rollout_is_weights

    @property
    def uid(self) -> np.ndarray:
        return self.data.non_tensor_batch["uid"]

    @property
    def response_mask(self) -> torch.Tensor:
        """[B, T] padded: 1 on the model's tokens only (an agent loop's tool output and injected turns are 0)."""
        return self.data.batch["response_mask"]

    @property
    def response_lengths(self) -> torch.Tensor:
        """[B] tokens of each response, tool and user spans included: the nested mask's lengths (verl's agent loop
        stores the response unpadded; its mask's last 1 is not the response's end when a trajectory ends on a
        tool result or an injected turn)."""
        return self.response_mask_nested.offsets().diff().long().cpu()


def read_advantage_batch(config, batch, metrics: dict) -> AdvantageBatch:
    """Steps 1 and 2 of verl's advantage step (module docstring), without the KL-in-reward branch."""
    if config.algorithm.use_kl_in_reward:  # refused at composition (main_mrtpo); never silently ignored
        raise ValueError("algorithm.use_kl_in_reward is not supported with the recipe's estimators")
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=VERL_FIELDS + RECIPE_FIELDS)
    response_mask = data["response_mask"]
    data = DataProto(batch=data.to_padded_tensor())
    data.batch["token_level_scores"] = data.batch["rm_scores"]
    data.non_tensor_batch["uid"] = np.array(data.batch.pop("uid").tolist(), dtype=object)
    data.batch["token_level_rewards"] = data.batch["token_level_scores"]

    rollout_corr_config = config.algorithm.get("rollout_correction", None)
    bypass_recomputing_logprobs = rollout_corr_config and rollout_corr_config.get("bypass_mode", False)
    rollout_correction = rollout_corr_config is not None and "rollout_log_probs" in data.batch and not bypass_recomputing_logprobs
    if rollout_correction:
        data, is_metrics = compute_rollout_correction_and_add_to_batch(data, rollout_corr_config)
        metrics.update(is_metrics)
    return AdvantageBatch(data=data, response_mask_nested=response_mask, rollout_correction=bool(rollout_correction))


def write_advantages(batch, adv_batch: AdvantageBatch, advantages: torch.Tensor, returns: torch.Tensor):
    """Step 4 of verl's advantage step: nested ``advantages``/``returns`` (and the rollout-correction
    fields) back to TransferQueue. Returns verl's updated batch meta."""
    data = adv_batch.data
    data.batch["advantages"] = advantages
    data.batch["returns"] = returns
    fields = ["advantages", "returns"]
    if adv_batch.rollout_correction:
        fields.append("response_mask")
        if "rollout_is_weights" in data.batch:
            fields.append("rollout_is_weights")
    output = {f: response_to_nested(data.batch[f], adv_batch.response_mask_nested) for f in fields}
    output = TensorDict(output, batch_size=len(batch))
    return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=output)


def fetch_fields(batch, fields: list[str]):
    """Other per-sample fields of the batch from TransferQueue (e.g. ``extra_fields``, ``raw_prompt``)."""
    return tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)


def write_fields(batch, fields: dict):
    """Other per-sample fields (nested over the batch) to TransferQueue, e.g. OPSD's ``teacher_logprobs`` /
    ``teacher_ids`` (``methods/opsd/step.py``). Returns verl's updated batch meta (every persisted field)."""
    return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict(dict(fields), batch_size=len(batch)))


def read_old_log_prob_batch(config, batch) -> AdvantageBatch:
    """What the fused old_log_prob step reads (uid, the response mask, responses; rollout log-probs for the
    debug metrics), padded as the advantage step pads it, so that the replay's rows are the same rows."""
    fields = ["uid", "response_mask", "responses"]
    if config.actor_rollout_ref.rollout.calculate_log_probs:
        fields.append("rollout_log_probs")
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
    response_mask = data["response_mask"]
    data = DataProto(batch=data.to_padded_tensor())
    data.non_tensor_batch["uid"] = np.array(data.batch.pop("uid").tolist(), dtype=object)
    return AdvantageBatch(data=data, response_mask_nested=response_mask, rollout_correction=False)


def write_old_log_probs(config, batch, ob: AdvantageBatch, old_log_probs: torch.Tensor, entropy: torch.Tensor, metrics: dict):
    """Steps 2-4 of verl's ``_compute_old_log_prob`` (module docstring) for padded [B, T] ``old_log_probs`` and
    ``entropy``. Returns verl's updated batch meta."""
    fields = {
        "old_log_probs": response_to_nested(old_log_probs, ob.response_mask_nested),
        "entropy": response_to_nested(entropy, ob.response_mask_nested),
    }
    batch = tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict(fields, batch_size=len(batch)))
    data = ob.data
    data.batch["old_log_probs"], data.batch["entropy"] = old_log_probs, entropy
    actor_config = config.actor_rollout_ref.actor
    entropy_agg = agg_loss(
        loss_mat=data.batch["entropy"],
        loss_mask=data.batch["response_mask"],
        loss_agg_mode=actor_config.loss_agg_mode,
        loss_scale_factor=actor_config.loss_scale_factor,
    )
    metrics.update({"actor/entropy": entropy_agg.detach().item()})
    if config.actor_rollout_ref.rollout.calculate_log_probs:
        metrics.update(calculate_debug_metrics(data))
    return batch


# ------------------------------------------------------------------ the numerics of verl's log-prob forward
#: verl 0.9.1 functions whose arithmetic the pass engine reproduces (``recipe.mrtpo.core.passes``: Numerics;
#: ``worker.engine_autocast`` / ``verl_numerics``), by ``module:qualname`` -> sha256 of the dedented source:
#: ``forward_step``'s autocast, ``prepare_model_outputs``' temperature division, log-prob and entropy calls,
#: the division itself, and the log-prob / entropy functions it calls.
NUMERICS_SOURCES = {
    "verl.workers.engine.fsdp.transformer_impl:_scale_logits_by_temperature": "c5128d4596dc71ada3160cd9bcefc3aced525cb67f79cd074205301a3069db67",
    "verl.workers.engine.fsdp.transformer_impl:_is_scalar_unit_temperature": "4f6d4dd7e72432d31d3496dc3d0ffa4c0111495327d1a5bfda5c4bef6dc17df8",
    "verl.workers.engine.fsdp.transformer_impl:FSDPEngineWithLMHead.forward_step": "35c9ddd611db7d0e53975708e21276d033d31bd46d5c348654666067672b1714",
    "verl.workers.engine.fsdp.transformer_impl:FSDPEngineWithLMHead.prepare_model_outputs": "8c6d3c14a91f44dbfb40089fc1ad6aa1b5f862e12e2f8bda38159279f7dd249e",
    "verl.utils.torch_functional:logprobs_from_logits": "dffd21fe40eb806b45d740d0753a7f969889366c80e32e354988cc20f1e9d726",
    "verl.utils.torch_functional:logprobs_from_logits_v2": "1074be97faf338ae07d3c2351db0752714541a17e0616a785ee65b6fc14ea262",
    "verl.utils.torch_functional:entropy_from_logits": "f69d6578eeb3b2e4375c3db34ef2bf1638b050badc8084feac8f38d5971b7ece",
    "verl.utils.torch_functional:entropy_from_logits_with_chunking": "bde1bbefafdf7c31e3edd208e44941dafebc4b2d0e1f157ff2844c6831c41e93",
}


# ------------------------------------------------------------------ the self-teachers' loss on verl's distillation path
#: verl 0.9.1 functions the self-teachers' actor loss relies on (``methods/opsd/loss.py``, ``worker.update_actor``),
#: by ``module:qualname`` -> sha256 of the dedented source: the loss's two calls (``distillation_ppo_loss``: as the
#: logits processor with ``student_logits``, then the final loss, with no policy loss when neither
#: ``use_task_rewards`` nor ``use_policy_gradient``), the aggregation (``distillation_loss``: the registry's loss,
#: ``loss_max_clamp``, ``agg_loss``), the registry the recipe's JSD is registered in, the config's look-up of a
#: loss mode in it, and ``init_model``'s binding of the loss, which ``update_actor`` repeats. (The FSDP engine's
#: ``prepare_model_outputs``, which calls the logits processor under ``distillation_use_topk``, is pinned above.)
DISTILLATION_SOURCES = {
    "verl.trainer.distillation.losses:distillation_ppo_loss": "7339ada238b21a87fc143d042b0b61a42dd61880f9ef86734fac32d17990db80",
    "verl.trainer.distillation.losses:distillation_loss": "2e6165dd431f2741165a8a3d908d0c314a73f687d953d9ae7600cbb04a95a7bb",
    "verl.trainer.distillation.losses:register_distillation_loss": "45a1074d208fd5971fe7701cdcbaa80c50ecec322bac3e2cc97be2e6bddbed6c",
    "verl.workers.config.distillation:DistillationLossConfig.__post_init__": "9f1e9f7a285448de0391bc3c77b8e3b377ae199723ef66e68429ea760d03fc6c",
    "verl.workers.engine_workers:ActorRolloutRefWorker.init_model": "0d2190a431d5805fd92665c68aac3c0a27245b3ec2e47b5ff24b1ad986755d72",
}


def check_distillation_sources() -> list[str]:
    """The :data:`DISTILLATION_SOURCES` whose installed source is not the pinned one (empty: all as in 0.9.1)."""
    return changed_sources(DISTILLATION_SOURCES)


def check_numerics_sources() -> list[str]:
    """The :data:`NUMERICS_SOURCES` whose installed source is not the pinned one (empty: all as in 0.9.1)."""
    return changed_sources(NUMERICS_SOURCES)


def resume_folder(config) -> Optional[str]:
    """The ``global_step_<N>`` folder verl 0.9.1's v1 ``_load_checkpoint`` will resume from (its step 1, re-stated:
    ``resume_mode`` disable / auto (the latest under ``default_local_dir``) / resume_path), or None. Its source is
    pinned in :data:`recipe.mrtpo.methods.sdpo.pins.SDPO_SOURCES` (``PPOTrainer._load_checkpoint``)."""
    import os

    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    mode = config.trainer.resume_mode
    if mode == "auto":
        folder = config.trainer.default_local_dir
        return find_latest_ckpt_path(folder if os.path.isabs(folder) else os.path.join(os.getcwd(), folder))
    if mode == "resume_path" and isinstance(config.trainer.resume_from_path, str):
        folder = config.trainer.resume_from_path
        return folder if os.path.isabs(folder) else os.path.join(os.getcwd(), folder)
    return None


def reordered(batch, order: list[int]):
    """A copy of the TransferQueue batch (``KVBatchMeta``: ``keys`` and per-sample ``tags``) with its samples in
    ``order``: the same rows, dispatched and packed otherwise by verl's worker."""
    import copy

    out = copy.copy(batch)
    out.keys = [batch.keys[i] for i in order]
    tags = getattr(batch, "tags", None)
    if tags is not None and len(tags) == len(batch.keys):
        out.tags = [tags[i] for i in order]
    return out


def verl_old_log_probs(config, batch, actor_rollout_wg, order: Optional[list[int]] = None) -> torch.Tensor:
    """verl's own old log-probs of ``batch``, padded [B, T] as :func:`read_old_log_prob_batch` pads: step 1 of
    ``_compute_old_log_prob`` (the same ``extra_info`` and ``compute_log_prob`` call), then its step 2's
    ``response_from_nested``, without writing ``old_log_probs`` (the fused step writes its own). verl's call
    also leaves its ``log_probs`` / ``entropy`` fields in TransferQueue, as its own step does; the fused step
    writes ``entropy`` after it. ``order``: run verl's call on the samples in that order (:func:`reordered`; the
    standing check's floor), the rows returned in the batch's own order."""
    from verl.workers.utils.padding import response_from_nested

    if order is not None:
        lp = verl_old_log_probs(config, reordered(batch, order), actor_rollout_wg)
        inverse = torch.empty(len(order), dtype=torch.long)
        inverse[torch.tensor(order)] = torch.arange(len(order))
        return lp[inverse]

    batch.extra_info.update({"calculate_entropy": True, "compute_loss": False,
                             "temperature": config.actor_rollout_ref.rollout.temperature})
    output = actor_rollout_wg.compute_log_prob(batch)
    assert len(output) == len(batch)
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["log_probs", "response_mask"])
    return torch.nested.to_padded_tensor(response_from_nested(data["log_probs"], data["response_mask"]), 0.0).float()


def fsdp_reshard(module) -> None:
    """Reshard an FSDP2 module's parameters (``FSDPModule.reshard``: its unsharded copies are dropped, the next
    forward gathers the local shards again); nothing for a module verl did not wrap. FSDP1 is refused by
    SDPO's checks (``methods.sdpo.check_sdpo``)."""
    from verl.utils.fsdp_utils import fsdp_version

    version = fsdp_version(module)
    if version == 2:
        module.reshard()
    elif version == 1:
        raise NotImplementedError("SDPO's EMA teacher swaps FSDP2 shards; the actor runs FSDP1 (actor.strategy=fsdp2)")
