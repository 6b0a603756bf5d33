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
Everything else of the loop is verl's own.
"""

from __future__ import annotations

import hashlib
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import transfer_queue as tq
from tensordict import TensorDict
from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import agg_loss
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.utils.debug.metrics import calculate_debug_metrics
from verl.workers.utils.padding import response_to_nested

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


def source_sha256(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


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


def named_source(name: str) -> str:
    """The dedented source of ``module:qualname`` (what :data:`NUMERICS_SOURCES` hashes)."""
    import importlib

    mod, qual = name.split(":")
    obj = importlib.import_module(mod)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return textwrap.dedent(inspect.getsource(obj))


def check_numerics_sources() -> list[str]:
    """The :data:`NUMERICS_SOURCES` whose installed source is not the pinned one (empty: all as in 0.9.1)."""
    return [n for n, sha in NUMERICS_SOURCES.items() if source_sha256(named_source(n)) != sha]


# ------------------------------------------------------------------ the agent loop's reliance on verl
#: verl 0.9.1 pieces the BFCL agent loop (``recipe.mrtpo.agent.bfcl_loop``) builds on or restates, by
#: ``module:qualname`` -> sha256 of the dedented source: the registry it registers with; the keyword arguments
#: the worker passes to a loop (``_VERL_KWARGS``); the Continuous Token calls that build the prompt and append
#: assistant / context tokens, and the mask rule they apply (assistant 1, context and inserted boundary 0);
#: the tool loop's cut of a long tool response (``truncate_tool_text``).
AGENT_LOOP_SOURCES = {
    "verl.experimental.agent_loop.agent_loop:register": "d4713a91cdbbbe838a94a77d7089c113f63b95b0d635796db0b24c5fb25389bb",
    "verl.experimental.agent_loop.agent_loop:AgentLoopWorker._run_agent_loop": "afb90a4a12333ee027a1d2d20a6a39e9cec9cd63418d5215ffe2f8364cc41267",
    "verl.experimental.agent_loop.agent_loop:AgentLoopBase.ct_build_initial_tokens": "03e5d1170097a843a4b05dabf195020d8e407d37bce3231998bcd865b36d9dc8",
    "verl.experimental.agent_loop.agent_loop:AgentLoopBase.ct_merge_context_msg": "a72fe5cc792fa5f87d9efb6f879b042beaa6a431b37b20e60c039aaa00aff595",
    "verl.experimental.agent_loop.agent_loop:AgentLoopBase.ct_merge_assistant_token": "91c7a99fc40779a1594684d0530da262ec4017adc7580192333abdcffe0798c7",
    "verl.utils.tokenizer.continuous_token:ContinuousTokenBuilder.align_response_metadata": "eb906d3082c9c27bf4780c759b080eeeb36c867742c08f406f9c9cdef95d0677",
    "verl.experimental.agent_loop.tool_agent_loop:ToolAgentLoop._call_tool": "571416855e7616759ce5b9f4e9ae6ea52274c6dd37147c9bf7689fa747dfd7dd",
}


def check_agent_loop_sources() -> list[str]:
    """The :data:`AGENT_LOOP_SOURCES` whose installed source is not the pinned one (empty: all as in 0.9.1)."""
    return [n for n, sha in AGENT_LOOP_SOURCES.items() if source_sha256(named_source(n)) != sha]


def verl_old_log_probs(config, batch, actor_rollout_wg) -> torch.Tensor:
    """verl's own old log-probs of ``batch``, padded [B, T] as :func:`read_old_log_prob_batch` pads: step 1 of
    ``_compute_old_log_prob`` (the same ``extra_info`` and ``compute_log_prob`` call), then its step 2's
    ``response_from_nested``, without writing ``old_log_probs`` (the fused step writes its own). verl's call
    also leaves its ``log_probs`` / ``entropy`` fields in TransferQueue, as its own step does; the fused step
    writes ``entropy`` after it."""
    from verl.workers.utils.padding import response_from_nested

    batch.extra_info.update({"calculate_entropy": True, "compute_loss": False,
                             "temperature": config.actor_rollout_ref.rollout.temperature})
    output = actor_rollout_wg.compute_log_prob(batch)
    assert len(output) == len(batch)
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["log_probs", "response_mask"])
    return torch.nested.to_padded_tensor(response_from_nested(data["log_probs"], data["response_mask"]), 0.0).float()
