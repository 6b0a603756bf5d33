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
(:mod:`recipe.mrtpo.seams.source_pins` reads and compares them), each group next to the code it guards: here verl's
log-prob numerics (:data:`NUMERICS_SOURCES`) and the self-teachers' distillation path
(:data:`DISTILLATION_SOURCES`); the BFCL agent loop's verl pieces and bfcl-eval's functions in
:mod:`recipe.mrtpo.agent.pins`; the rollout's per-request seeds in :mod:`recipe.mrtpo.rollout.rollout_seed`; SDPO's in
:mod:`recipe.mrtpo.methods.sdpo.pins`; transformers' mask pass-through and attention registry, which the shared
forwards' block-sparse attention relies on, in :mod:`recipe.mrtpo.passes.tree_attention`.
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

from recipe.mrtpo.seams.source_pins import changed_sources, source_sha256

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
        f"verl's PPOTrainer.{method} changed: re-check recipe/mrtpo/seams/verl_seam.py ({what}) against it, then update "
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


def write_advantages(batch, adv_batch: AdvantageBatch, advantages: torch.Tensor, returns: torch.Tensor,
                     response_mask: Optional[torch.Tensor] = None):
    """Step 4 of verl's advantage step: nested ``advantages``/``returns`` (and the rollout-correction
    fields) back to TransferQueue. Returns verl's updated batch meta.

    ``response_mask`` ([B, T]; the recipe's rows taken out zeroed, ``reward_extras.advantage_mask``): written back
    as verl writes the mask its rollout correction's rejection changed, the same field and layout, so that the
    update's loss (its policy, KL and entropy terms, the token-mean denominator) no longer counts those rows."""
    data = adv_batch.data
    data.batch["advantages"] = advantages
    data.batch["returns"] = returns
    fields = ["advantages", "returns"]
    if response_mask is not None:
        data.batch["response_mask"] = response_mask.to(data.batch["response_mask"].dtype)
    if adv_batch.rollout_correction or response_mask is not None:
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


#: the experiments' data order (``experiments/real_model_learning``: every arm of a seed trains on the same prompts in
#: the same order): verl's sampler shuffles with a generator seeded by ``data.seed`` when ``data.shuffle``.
DATA_ORDER_SOURCES = {
    "verl.trainer.ppo.utils:create_rl_sampler": "8ef5762e91157c9fbd12109add871c53b05854c0bbae81e4647f4a48bdfc68a2",
}


def check_data_order_sources() -> list[str]:
    """The :data:`DATA_ORDER_SOURCES` whose installed source is not the pinned one (empty: all as in 0.9.1)."""
    return changed_sources(DATA_ORDER_SOURCES)


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


#: verl 0.9.1 code the checkpoint checks rely on (``checkpoint_shards``, ``trainer._load_checkpoint`` /
#: ``_save_checkpoint``), by ``module:qualname`` -> sha256 of the dedented source: the actor, reference and critic
#: share one "global_pool" of ``[n_gpus_per_node] * nnodes`` (:func:`actor_world_size`); the save writes
#: ``global_step_<N>`` under ``default_local_dir`` and the tracker ``latest_checkpointed_iteration.txt`` there;
#: the resume picks its folder as :func:`resume_folder` re-states, through ``find_latest_ckpt_path`` (None when the
#: tracker or its folder is missing: a silent start at step 0); the FSDP manager saves and loads
#: ``model_world_size_<W>_rank_<r>.pt`` of its own world size, one per rank.
CHECKPOINT_SOURCES = {
    "verl.trainer.ppo.v1.trainer_base:PPOTrainer._init_resource_pool_mgr": "96a4fe09dd4bb9c5083249db21fb79bfe0b79c9f15fb663c4946f154176b1089",
    "verl.trainer.ppo.v1.trainer_base:PPOTrainer._save_checkpoint": "1ceb1e087ce91c9251f98140353938221134f8ee0fe990697de93db975fa82c0",
    "verl.trainer.ppo.v1.trainer_base:PPOTrainer._load_checkpoint": "52b412c5395b2cae290a6cf24c7f981d19b9458cda623170d776be844cb7cbec",
    "verl.utils.checkpoint.checkpoint_manager:find_latest_ckpt_path": "ef7c06afc10f04da2592de51bb84e3e778ea045cbe433b41d267f42ec9ce110c",
    "verl.utils.checkpoint.fsdp_checkpoint_manager:FSDPCheckpointManager.save_checkpoint": "888ddb5dbff4187d087fe7ef5ae2141cc8d56781a6c71a0064f971bbc09b3659",
    "verl.utils.checkpoint.fsdp_checkpoint_manager:FSDPCheckpointManager.load_checkpoint": "8ba8916aef1fa6e4dbd30e8d401d47d162a84090da1aeabd1a338b53b1b559f1",
}


def check_checkpoint_sources() -> list[str]:
    """The :data:`CHECKPOINT_SOURCES` whose installed source is not the pinned one (empty: all as in 0.9.1)."""
    return changed_sources(CHECKPOINT_SOURCES)


def actor_world_size(config) -> int:
    """The actor's world size, the ``W`` of its checkpoint shards: verl 0.9.1's global pool,
    ``trainer.n_gpus_per_node * trainer.nnodes`` (``_init_resource_pool_mgr``, pinned in :data:`CHECKPOINT_SOURCES`)."""
    return int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)


def reordered(batch, order: list[int], extra_info: Optional[dict] = None):
    """A copy of the TransferQueue batch (``KVBatchMeta``: ``keys`` and per-sample ``tags``) with its samples in
    ``order``: the same rows, dispatched and packed otherwise by verl's worker. ``extra_info``: settings of this
    copy's calls only (the copy gets its own ``extra_info``, the batch's updated with them; the batch's stays as
    it was)."""
    import copy

    out = copy.copy(batch)
    out.keys = [batch.keys[i] for i in order]
    tags = getattr(batch, "tags", None)
    if tags is not None and len(tags) == len(batch.keys):
        out.tags = [tags[i] for i in order]
    out.extra_info = {**(batch.extra_info or {}), **(extra_info or {})}
    return out


# ------------------------------------------------------------------ the standing check's floor: verl's pass packed otherwise
#: verl 0.9.1 functions the standing check's floor relies on (``verl_old_log_probs(order=..., max_token_len=...)``),
#: by ``module:qualname`` -> sha256 of the dedented source: the worker's ``infer_batch`` sets its micro-batching
#: settings (``max_token_len_per_gpu``, ...) only where the call's data does not carry them, the call's
#: ``extra_info`` becomes that data's non-tensor fields, and the engine splits a rank's rows into micro-batches by
#: ``prepare_micro_batches`` / ``rearrange_micro_batches`` (sequence balancing by length: the rows' order alone does
#: not change a rank's micro-batches, another token budget does; ``core.standing_check.floor_token_budget``).
FLOOR_SOURCES = {
    "verl.workers.engine_workers:TrainingWorker.infer_batch": "3ebb58da0ac1150216f850d3bf7f7f61f8b3e90610759aabe77ab6362b107fc4",
    "verl.utils.transferqueue_utils:_async_meta_to_realdata": "8fe49350dfdb1351e744c112605278ed58b331e8816dd5f7e4e832e2dc8ba289",
    "verl.workers.engine.utils:prepare_micro_batches": "e3083217530fed22bb8a18b0ca7079b61a88f368a98fb85ebbb613cd1e135597",
    "verl.utils.seqlen_balancing:rearrange_micro_batches": "2e384e734df9f191450ff3173233bae8dd1b0a6423668ee1b4e84ca2be412606",
}

#: verl 0.9.1 functions through which a row whose ``response_mask`` the advantage step wrote 0 leaves the update's
#: loss (``write_advantages(response_mask=...)``): the mask becomes the loss mask, its sum over the data-parallel
#: group the token-mean denominator, and the policy, KL and entropy terms are aggregated under it.
ROW_MASK_SOURCES = {
    "verl.workers.utils.padding:left_right_2_no_padding": "8b09e2ef9bb544fa95661223f7d002e6cd8ec76b250b0ca6335916d5082acf87",
    "verl.workers.utils.losses:ppo_loss": "d7c0f8772b444f55a59975a1fae154c43a2dab4724a88c89d95237e0a128c561",
    "verl.workers.engine.fsdp.transformer_impl:FSDPEngine.forward_backward_batch": "788138f58fb15e9f8e29487119b4c2757c20c217f3a1ab8a48150c6459fae5b0",
}


def check_floor_sources() -> list[str]:
    """The :data:`FLOOR_SOURCES` and :data:`ROW_MASK_SOURCES` whose installed source is not the pinned one."""
    return changed_sources({**FLOOR_SOURCES, **ROW_MASK_SOURCES})


def floor_settings(config, sequence_lengths) -> dict:
    """The floor call's ``extra_info`` settings: under verl's dynamic batch size
    (``rollout.log_prob_use_dynamic_bsz``) a token budget per GPU of ``core.standing_check.floor_token_budget`` of
    verl's (``rollout.log_prob_max_token_len_per_gpu``) and the longest of ``sequence_lengths`` (prompt + response);
    otherwise none (fixed micro-batches: the rows in reverse order change their micro-batch where one holds several)."""
    from recipe.mrtpo.core.standing_check import floor_token_budget

    rollout = config.actor_rollout_ref.rollout
    if not bool(rollout.get("log_prob_use_dynamic_bsz", False)) or not len(sequence_lengths):
        return {}
    budget = int(rollout.log_prob_max_token_len_per_gpu)
    return {"max_token_len_per_gpu": floor_token_budget(budget, int(max(int(n) for n in sequence_lengths)))}


def verl_old_log_probs(config, batch, actor_rollout_wg, order: Optional[list[int]] = None,
                       settings: Optional[dict] = None, entropy: bool = False):
    """verl's own old log-probs of ``batch``, padded [B, T] as :func:`read_old_log_prob_batch` pads: step 1 of
    ``_compute_old_log_prob`` (the same ``extra_info`` and ``compute_log_prob`` call), then its step 2's
    ``response_from_nested``, without writing ``old_log_probs`` (the fused step writes its own). verl's call
    also leaves its ``log_probs`` / ``entropy`` fields in TransferQueue, as its own step does; the fused step
    writes ``entropy`` after it. ``order`` / ``settings``: run verl's call on the samples in that order, with those
    ``extra_info`` settings (:func:`reordered`, :func:`floor_settings`: the standing check's floor), the rows
    returned in the batch's own order. ``entropy``: return ``(log_probs, entropy)``."""
    from verl.workers.utils.padding import response_from_nested

    if order is not None or settings:
        order = list(range(len(batch.keys))) if order is None else order
        out = verl_old_log_probs(config, reordered(batch, order, settings), actor_rollout_wg, entropy=entropy)
        inverse = torch.empty(len(order), dtype=torch.long)
        inverse[torch.tensor(order)] = torch.arange(len(order))
        return tuple(t[inverse] for t in out) if entropy else out[inverse]

    batch.extra_info.update({"calculate_entropy": True, "compute_loss": False,
                             "temperature": config.actor_rollout_ref.rollout.temperature})
    output = actor_rollout_wg.compute_log_prob(batch)
    assert len(output) == len(batch)
    fields = ["log_probs", "response_mask"] + (["entropy"] if entropy else [])
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
    got = [torch.nested.to_padded_tensor(response_from_nested(data[f], data["response_mask"]), 0.0).float()
           for f in fields if f != "response_mask"]
    return tuple(got) if entropy else got[0]


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
