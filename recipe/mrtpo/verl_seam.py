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

The rollout's per-request seeds (:mod:`recipe.mrtpo.rollout_seed`) rely on verl's agent-loop manager and worker
passing each prompt's fields and its ``session_id`` to ``_run_agent_loop``, on the sampling parameters reaching
vLLM unchanged, and on verl's vLLM server only ``setdefault``-ing its own seed: :data:`ROLLOUT_SEED_SOURCES`
pins those functions. Everything else of the loop is verl's own.

The functions other modules restate or follow are pinned here too, by name -> sha256 of the dedented
source (:func:`named_source`, the one reader of such sources; :func:`changed_sources` compares):
verl's log-prob numerics (:data:`NUMERICS_SOURCES`), verl's agent-loop pieces the BFCL loop builds on
(:data:`AGENT_LOOP_SOURCES`), and bfcl-eval's functions the BFCL environment restates
(:data:`BFCL_SOURCES`, read with ``ast``: its model handlers cannot be imported).
"""

from __future__ import annotations

import hashlib
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


def named_source(name: str, package: str = "") -> str:
    """The dedented source of ``name``, what the pins of this module hash.

    ``module:qualname`` (verl's pins): imported, ``textwrap.dedent(inspect.getsource(obj))``. With ``package``
    (:data:`BFCL_SOURCES`: ``package="bfcl_eval"``), ``file:qualname`` with ``file`` relative to that installed
    package, read with ``ast`` without importing it (bfcl-eval's model handlers cannot be imported without their
    heavy dependencies): the dedented ``ast.get_source_segment`` of the definition (no decorators; its first line
    is not indented, so the dedent leaves the body as in the file).
    """
    import importlib

    where, qual = name.split(":")
    if not package:
        obj = importlib.import_module(where)
        for part in qual.split("."):
            obj = getattr(obj, part)
        return textwrap.dedent(inspect.getsource(obj))
    import ast
    import importlib.util
    from pathlib import Path

    root = Path(list(importlib.util.find_spec(package).submodule_search_locations)[0])
    text = (root / where).read_text()
    node: Any = ast.parse(text)
    for part in qual.split("."):
        node = next(n for n in ast.iter_child_nodes(node)
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == part)
    return textwrap.dedent(ast.get_source_segment(text, node))


def changed_sources(pins: dict[str, str], package: str = "") -> list[str]:
    """The names of ``pins`` (name -> sha256, :func:`named_source`'s forms) whose installed source differs."""
    return [n for n, sha in pins.items() if source_sha256(named_source(n, package)) != sha]


def check_numerics_sources() -> list[str]:
    """The :data:`NUMERICS_SOURCES` whose installed source is not the pinned one (empty: all as in 0.9.1)."""
    return changed_sources(NUMERICS_SOURCES)


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
    return changed_sources(AGENT_LOOP_SOURCES)


#: the bfcl-eval 2026.3.23 functions the BFCL agent loop's environment (``recipe.mrtpo.agent.bfcl_env``)
#: restates or follows, ``file:qualname`` (relative to the package) -> sha256 of the dedented source, read with
#: ``ast`` (:func:`named_source` with ``package="bfcl_eval"``); :func:`check_bfcl_sources` lists those that
#: differ (tests/unit/test_bfcl_loop.py)
BFCL_SOURCES = {
    # the protocol: steps until an empty decode, held-out functions at their turn, MAXIMUM_STEP_LIMIT
    "model_handler/base_handler.py:BaseHandler.inference_multi_turn_FC": "031e178d94ffbbad94bcda40483931ad1a465c6485850f5e08b4b3aa0370fe9f",
    "model_handler/base_handler.py:BaseHandler.inference_multi_turn_prompting": "a6a0c35fbc673652a0f592c5a400ff24b811cafa03c3824fd6fa1ce3421a73d4",
    # the call strings (bfcl_env.call_string) and Qwen FC's decoding into them
    "model_handler/utils.py:convert_to_function_call": "ccf0ea0cc6893051e8ef9b013e7d8373bc9acc5834729812d08cea35418007ed",
    "model_handler/local_inference/qwen_fc.py:QwenFCHandler.decode_execute": "0a77fce82e77981752ae00ae6126711e2017abcfad269e648edb516927018c7a",
    # instances, result strings, refused names (bfcl_env.BFCLEnv)
    "eval_checker/multi_turn_eval/multi_turn_utils.py:execute_multi_turn_func_call": "bbfe4e02aa0a977184f9b0998b6c92937f4a7aa662a220295d03cd0aa25955f1",
}


def check_bfcl_sources() -> list[str]:
    """The :data:`BFCL_SOURCES` whose installed source is not the pinned one (empty: bfcl-eval as pinned)."""
    return changed_sources(BFCL_SOURCES, package="bfcl_eval")


def resume_folder(config) -> Optional[str]:
    """The ``global_step_<N>`` folder verl 0.9.1's v1 ``_load_checkpoint`` will resume from (its step 1, re-stated:
    ``resume_mode`` disable / auto (the latest under ``default_local_dir``) / resume_path), or None. Its source is
    pinned in :data:`SDPO_SOURCES` (``PPOTrainer._load_checkpoint``)."""
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


# ------------------------------------------------------------------ what SDPO relies on (methods/sdpo/, worker.py)
#: verl 0.9.1 code SDPO's loss and EMA teacher rely on, by ``module:qualname`` -> sha256 of the dedented source:
#: - the distillation-loss registry (``register_distillation_loss``) and ``distillation_ppo_loss`` /
#:   ``distillation_loss``: a registered top-k loss is called with the model output the logits processor filled,
#:   aggregated with ``agg_loss`` over the response mask, no policy loss when ``use_task_rewards`` and
#:   ``use_policy_gradient`` are off (``methods.sdpo.loss``);
#: - ``prepare_model_outputs`` (pinned above) calls the loss function as a logits processor
#:   (``student_logits=``) when the micro-batch's ``distillation_use_topk`` is set;
#: - the v1 trainer's ``_save_checkpoint`` / ``_load_checkpoint`` call the actor worker group's
#:   ``save_checkpoint`` / ``load_checkpoint`` with the actor's folder (the EMA teacher is saved in it), and the
#:   worker's ``update_actor`` runs every mini-batch of the step in one call (the EMA update follows it);
#: - ``EngineEvalModeCtx.__exit__`` reshards the root only when ``fsdp_size > 1``, so the EMA swap reshards
#:   itself (:func:`fsdp_reshard`).
SDPO_SOURCES = {
    "verl.trainer.distillation.losses:register_distillation_loss": "45a1074d208fd5971fe7701cdcbaa80c50ecec322bac3e2cc97be2e6bddbed6c",
    "verl.trainer.distillation.losses:distillation_ppo_loss": "7339ada238b21a87fc143d042b0b61a42dd61880f9ef86734fac32d17990db80",
    "verl.trainer.distillation.losses:distillation_loss": "2e6165dd431f2741165a8a3d908d0c314a73f687d953d9ae7600cbb04a95a7bb",
    "verl.trainer.ppo.v1.trainer_base:PPOTrainer._save_checkpoint": "1ceb1e087ce91c9251f98140353938221134f8ee0fe990697de93db975fa82c0",
    "verl.trainer.ppo.v1.trainer_base:PPOTrainer._load_checkpoint": "52b412c5395b2cae290a6cf24c7f981d19b9458cda623170d776be844cb7cbec",
    "verl.workers.engine_workers:ActorRolloutRefWorker.update_actor": "09c49c66ee2fd97a1b6f6737cb22b09360e6af1d6e991650c0339ee917d5a775",
    "verl.workers.engine_workers:ActorRolloutRefWorker.save_checkpoint": "31ecd24c0576b57ca544e60148de26149c2569b8cc0c153b4a656d73a4a804da",
    "verl.workers.engine_workers:ActorRolloutRefWorker.load_checkpoint": "2713c0c8f4705df9d30e610133e80ae0fbf74e2620a6577cbd86151946a6d20a",
    "verl.workers.engine.fsdp.transformer_impl:EngineEvalModeCtx.__exit__": "ecb2bbcc6f3c82d495f73b23565facc9214acdf6a0c4cdacecc2fe664b4a1139",
}


def check_sdpo_sources() -> list[str]:
    """The :data:`SDPO_SOURCES` whose installed source is not the pinned one (empty: all as in 0.9.1)."""
    return changed_sources(SDPO_SOURCES)


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


# ------------------------------------------------------------------ the rollout's per-request seeds
#: verl 0.9.1 functions :mod:`recipe.mrtpo.rollout_seed` relies on, ``module:qualname`` -> sha256 of the dedented
#: source as :func:`file_source` reads it (from the file, without importing: the vLLM server's module imports vLLM):
#: the TransferQueue manager (its worker class set in ``__init__``, the batch split in ``generate_sequences``); its
#: worker (each prompt's fields, tensors included, and ``session_id`` passed to ``_run_agent_loop``); the base
#: ``_run_agent_loop`` (the sampling parameters handed to the agent loop); the task runner loading
#: ``agent_loop_manager_class``; the single-turn loop and the server client passing the parameters on unchanged;
#: the vLLM server's ``generate`` (``setdefault("seed", ...)`` under full_determinism only, so a request's own seed
#: is kept, and ``SamplingParams(**sampling_params)``).
ROLLOUT_SEED_SOURCES = {
    "verl.trainer.ppo.v1.agent_loop_tq:AgentLoopManagerTQ.__init__":
        "43499c2fdf365c089d773c3d5daf403e2606b7fc4cd4db52965f39075a44fde1",
    "verl.trainer.ppo.v1.agent_loop_tq:AgentLoopManagerTQ.generate_sequences":
        "9d8389584e35ec89cfeb0050f0ca45e15cca119e95085832e2d5e41f8443a52a",
    "verl.trainer.ppo.v1.agent_loop_tq:AgentLoopWorkerTQ.generate_sequences":
        "0d4227f490b32c5d10279506c1261e7283f7a0abf9be657c7d8777d9d3f6d7ea",
    "verl.trainer.ppo.v1.agent_loop_tq:AgentLoopWorkerTQ._run_prompt":
        "2adabe2def267da26bfc5fe81d12fa480564344dd68be605056af4a5c887f5c1",
    "verl.experimental.agent_loop.agent_loop:AgentLoopWorker._run_agent_loop":
        "afb90a4a12333ee027a1d2d20a6a39e9cec9cd63418d5215ffe2f8364cc41267",
    "verl.trainer.main_ppo:TaskRunnerV1.init_agent_loop_manager":
        "8a7ec459c8da61e5cc8bd68f13eea3437e35b4c3febbf31bbf3bd7cc4e2c39fc",
    "verl.experimental.agent_loop.single_turn_agent_loop:SingleTurnAgentLoop.run":
        "dc63476eaac81eab586fe9b82fbbd9967f7450ac35b1f36d5f98cafda33f154d",
    "verl.workers.rollout.llm_server:LLMServerClient.generate":
        "bb07a079e6c1db9a63465712014ddff273c77b8c6fcd91cb5ffe084975a50dee",
    "verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMHttpServer.generate":
        "4ec002789c37d6d8368a56a3b1c62b17aa024dec96a904aa36c2f54265620bbc",
    # the batch's row order (MRTPOTrainer._submit_batch_to_rollout / _balance_batch): the prompts' uids (uuid4,
    # no "_") submitted in the dataloader's order, a row's key f"{uid}_{session_id}_{i}", the sampled batch
    # balanced right after the sampling and the reward
    "verl.trainer.ppo.v1.trainer_base:PPOTrainer._fetch_one_gen_batch":
        "37a980de651f5fd662de404e9647c8d9a64256d036d75d25bbf7f8707b22ee39",
    "verl.trainer.ppo.v1.trainer_base:PPOTrainer._submit_batch_to_rollout":
        "eb931056887595df7817c00342afec393ea78b11d82bec9374f55b7817d9f6fc",
    "verl.trainer.ppo.v1.agent_loop_tq:AgentLoopWorkerTQ._agent_loop_postprocess":
        "5386c291e4db91dd926818b8402b16893f1981eff97ee79a57423dc18f381496",
    "verl.trainer.ppo.v1.trainer_base:PPOTrainer._step_once":
        "b82ae0c246dd687f85081b40ad5f28219da8ad859f4a4fb52230fa799ffa122c",
    "verl.trainer.ppo.v1.trainer_base:PPOTrainer._balance_batch":
        "358620695a10c66e9b8409e7e7da3c7a72151cb39022c5f0e06b1ea12d10cdc5",
}


def file_source(name: str) -> str:
    """The dedented source of ``module:qualname`` read from the module's file (decorators left out), without
    importing the module (``verl.workers.rollout.vllm_rollout`` imports vLLM, refused where vLLM is not verl's)."""
    import ast
    import importlib.util
    from pathlib import Path

    mod, qual = name.split(":")
    top, *rest = mod.split(".")
    path = Path(importlib.util.find_spec(top).origin).parent.joinpath(*rest).with_suffix(".py")
    text = path.read_text()
    body, node = ast.parse(text).body, None
    for part in qual.split("."):
        node = next((n for n in body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                     and n.name == part), None)
        if node is None:
            raise LookupError(f"{name}: {part} not found in {path}")
        body = node.body
    return textwrap.dedent("".join(text.splitlines(True)[node.lineno - 1:node.end_lineno]))


def check_rollout_seed_sources() -> list[str]:
    """The :data:`ROLLOUT_SEED_SOURCES` whose installed source is not the pinned one (empty: all as in 0.9.1)."""
    return [n for n, sha in ROLLOUT_SEED_SOURCES.items() if source_sha256(file_source(n)) != sha]
