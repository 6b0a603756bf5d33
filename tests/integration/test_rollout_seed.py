"""The seeded agent-loop worker and manager (recipe/mrtpo/rollout/rollout_seed.py) without Ray: the request's sampling
parameters get request_seed(rollout.seed, step, position, session) and the position never reaches verl; a request
without them is sampled as verl samples it. (The launch itself: tests/e2e/test_mrtpo_loop.py.)"""

import asyncio

import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

from recipe.mrtpo.core.seeding import request_seed
from recipe.mrtpo.rollout import rollout_seed


def call(monkeypatch, trajectory, **kwargs):
    seen = {}

    async def base(self, sampling_params, trajectory, *, agent_name, trace=True, **kw):
        seen.update(params=sampling_params, kwargs=kw)

    monkeypatch.setattr(AgentLoopWorker, "_run_agent_loop", base)
    worker = object.__new__(rollout_seed.SeededAgentLoopWorker.__ray_actor_class__)
    worker.config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"seed": 7}}})
    params = {"temperature": 1.0}
    asyncio.run(worker._run_agent_loop(params, trajectory, agent_name="single_turn_agent", **kwargs))
    assert params == {"temperature": 1.0}  # the caller's dict is not changed
    return seen


def test_each_request_gets_its_own_seed_and_the_position_stays_with_the_recipe(monkeypatch):
    traj = {"step": 3, "validate": False}
    seen = call(monkeypatch, traj, session_id=2, uid="u", **{rollout_seed.POSITION_FIELD: torch.tensor(5)})
    assert seen["params"]["seed"] == request_seed(7, 3, 5, 2) and seen["params"]["temperature"] == 1.0
    assert rollout_seed.POSITION_FIELD not in seen["kwargs"] and seen["kwargs"]["session_id"] == 2


def test_a_request_the_manager_did_not_number_is_sampled_as_verl_samples_it(monkeypatch):
    seen = call(monkeypatch, {"step": 3, "validate": False}, session_id=0)
    assert "seed" not in seen["params"]
    seen = call(monkeypatch, {"step": -1, "validate": False}, session_id=0, **{rollout_seed.POSITION_FIELD: 1})
    assert "seed" not in seen["params"]  # no step number: no seed, never a crash


def test_the_manager_numbers_a_copy_of_the_batch(monkeypatch):
    got = {}
    monkeypatch.setattr(rollout_seed.AgentLoopManagerTQ, "generate_sequences", lambda self, p: got.update(p=p))
    manager = object.__new__(rollout_seed.SeededAgentLoopManager)
    batch = TensorDict({"input_ids": torch.zeros(4, 3)}, batch_size=[4])
    manager.generate_sequences(batch)
    assert got["p"][rollout_seed.POSITION_FIELD].tolist() == [0, 1, 2, 3]
    assert rollout_seed.POSITION_FIELD not in batch.keys()  # the trainer's batch is unchanged
