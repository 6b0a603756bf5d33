"""RLSD's frozen teacher synced to the policy every N updates (``methods/rlsd/actor.py``, the RLSD authors' shipped
``freeze_teacher_model=True`` + ``rlsd_teacher_sync_interval``): through the worker class with a fake engine (no Ray,
no FSDP), the teacher (verl's reference model) stays bit for bit between syncs, equals the actor right after one
(exactly in the same dtype, bf16-rounded in a bf16 reference), survives save and resume; the hook, the schedule's
count and the checks."""

from __future__ import annotations

import contextlib
import copy
from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu

from recipe.mrtpo.config import mrtpo_config
from recipe.mrtpo.methods.rlsd import LOSS_SETTINGS_KEY, RLSD
from recipe.mrtpo.step.worker import MRTPOActorRolloutRefWorker


def small_module(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))


class FakeTrainingWorker:
    """verl's TrainingWorker as the worker reads it: the engine's module, a loss setter, one SGD step as the update."""

    def __init__(self, module):
        self.engine = SimpleNamespace(module=module, eval_mode=lambda: contextlib.nullcontext())
        self.loss_fn, self.updates = None, 0

    def set_loss_fn(self, fn):
        self.loss_fn = fn

    def train_mini_batch(self, data):
        self.updates += 1
        opt = torch.optim.SGD(self.engine.module.parameters(), lr=0.5)
        opt.zero_grad()
        self.engine.module(torch.randn(8, 4)).pow(2).sum().backward()
        opt.step()

    def save_checkpoint(self, local_path, *args):
        torch.save(self.engine.module.state_dict(), f"{local_path}/model.pt")

    def load_checkpoint(self, local_path, *args):
        self.engine.module.load_state_dict(torch.load(f"{local_path}/model.pt"))


def fake_worker(actor, ref_dtype=torch.float32, with_ref=True):
    w = MRTPOActorRolloutRefWorker.__new__(MRTPOActorRolloutRefWorker)  # no Ray, no FSDP: only the binding
    w.actor, w.role, w.enable_routing_replay = FakeTrainingWorker(actor), "actor_rollout_ref", False
    # verl's reference model: the initial weights, loaded apart (here: a copy before any update)
    w.ref = SimpleNamespace(engine=SimpleNamespace(module=copy.deepcopy(actor).to(ref_dtype))) if with_ref else None
    w.loss_fn = None
    return w


def rlsd_batch(every):
    td = TensorDict({"x": torch.zeros(2)}, batch_size=[2])
    tu.assign_non_tensor(td, **{LOSS_SETTINGS_KEY: {"teacher_sync_steps": every}})
    return td


def params(m):
    return [p.detach().clone() for p in m.parameters()]


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def test_the_teacher_stays_frozen_between_syncs_and_equals_the_actor_right_after_one():
    actor = small_module()
    w = fake_worker(actor)
    ref = w.ref.engine.module
    initial = params(actor)
    seen = []
    for k in range(1, 8):
        w.update_actor(rlsd_batch(3))
        seen.append((k, same(params(ref), params(actor))))
        if k < 3:
            assert same(params(ref), initial)  # frozen at the initial policy until the first sync
        if k in (3, 6):
            assert same(params(ref), params(actor))  # the actor's weights exactly, right after the sync
            synced = params(ref)
        if k in (4, 5, 7):
            assert same(params(ref), synced)  # frozen again between syncs, while the actor moves
            assert not same(params(ref), params(actor))
    assert [k for k, eq in seen if eq] == [3, 6] and w.actor.updates == 7
    assert w.loss_fn is None  # RLSD's part installs no loss: verl's own PPO loss trains on its advantage


def test_a_bf16_reference_holds_the_bf16_rounded_policy():
    """As the RLSD authors' ``copy_`` into their bf16 reference: the teacher is the policy cast to the reference's dtype."""
    actor = small_module()
    w = fake_worker(actor, ref_dtype=torch.bfloat16)
    w.update_actor(rlsd_batch(1))
    for t, a in zip(w.ref.engine.module.parameters(), actor.parameters()):
        assert t.dtype == torch.bfloat16 and torch.equal(t, a.detach().to(torch.bfloat16))


def test_the_synced_teacher_and_the_count_survive_save_and_resume(tmp_path):
    actor = small_module()
    w = fake_worker(actor)
    for _ in range(4):
        w.update_actor(rlsd_batch(3))  # synced after update 3, then one more update of the actor
    teacher = params(w.ref.engine.module)
    w.save_checkpoint(str(tmp_path))
    assert (tmp_path / RLSD.actor_part.checkpoint_dir / "rank_0_of_1.pt").exists()

    fresh = fake_worker(small_module(seed=9))  # a new process: verl reloads the reference from the initial weights
    fresh.load_checkpoint(str(tmp_path))
    assert same(params(fresh.ref.engine.module), teacher)  # the synced teacher, bit for bit
    assert same(params(fresh.actor.engine.module), params(actor))
    fresh.update_actor(rlsd_batch(3))  # update 5: no sync
    assert same(params(fresh.ref.engine.module), teacher)
    fresh.update_actor(rlsd_batch(3))  # update 6: synced, counted across the resume
    assert same(params(fresh.ref.engine.module), params(fresh.actor.engine.module))

    # a checkpoint without the synced teacher (another configuration's): refused before its first update
    for f in (tmp_path / RLSD.actor_part.checkpoint_dir).iterdir():
        f.unlink()
    lost = fake_worker(small_module())
    lost.load_checkpoint(str(tmp_path))
    with pytest.raises(RuntimeError, match="holds no synced teacher"):
        lost.update_actor(rlsd_batch(3))
    assert lost.actor.updates == 0


def test_a_resumed_run_of_another_method_builds_no_part_and_saves(tmp_path):
    """An MRTPO run (verl's own update) resumed from its checkpoint, then saving: no RLSD or SDPO part is built (before,
    the resume built every part, and RLSD's save then needed a reference model an MRTPO worker does not hold)."""
    w = fake_worker(small_module(), with_ref=False)
    w.save_checkpoint(str(tmp_path))
    resumed = fake_worker(small_module(), with_ref=False)
    resumed.load_checkpoint(str(tmp_path))
    resumed.save_checkpoint(str(tmp_path))
    assert not resumed.__dict__.get("_actor_parts")
    assert not (tmp_path / RLSD.actor_part.checkpoint_dir).exists()


def test_a_worker_without_the_reference_model_is_refused():
    w = fake_worker(small_module(), with_ref=False)
    with pytest.raises(RuntimeError, match="does not hold"):
        w.update_actor(rlsd_batch(2))
    assert w.actor.updates == 0


def test_the_hook_asks_for_the_sync_only_where_it_is_on_and_returns_the_written_meta():
    from recipe.mrtpo.methods.rlsd.step import write_rlsd_settings

    for every in (0, 20):
        written, before = SimpleNamespace(extra_info={}), SimpleNamespace(extra_info={})
        ctx = SimpleNamespace(cfg=mrtpo_config({"mode": "rlsd", "rlsd_teacher": "initial", "rlsd_teacher_sync_steps": every}),
                              batch=before, written=written)
        assert write_rlsd_settings(ctx) is written
        assert written.extra_info == ({LOSS_SETTINGS_KEY: {"teacher_sync_steps": 20}} if every else {})
        assert before.extra_info == {}


def test_the_authors_schedule_counts_training_steps_from_one():
    """The RLSD authors' trainer: global_step += 1 before the step, then lambda * max(1 - global_step / decay, 0)."""
    from recipe.mrtpo.methods.rlsd import rlsd_strength

    config = {"data": {"train_batch_size": 512}, "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 128}}}
    cfg = mrtpo_config({"mode": "rlsd", "rlsd_lambda_decay_steps": 60, "rlsd_schedule": "steps"})
    for completed in (0, 1, 29, 58, 59, 100):
        global_step = completed + 1
        assert rlsd_strength(cfg, completed, config) == pytest.approx(0.5 * max(1 - global_step / 60, 0.0))
    ms_swift = mrtpo_config({"mode": "rlsd", "rlsd_lambda_decay_steps": 60})  # optimizer updates, 4 per step, from 0
    assert rlsd_strength(ms_swift, 1, config) == pytest.approx(0.5 * (1 - 4 / 60))


@pytest.mark.parametrize("knobs, message", [
    ({"rlsd_teacher_sync_steps": 20}, "needs mrtpo.rlsd_teacher=initial"),
    ({"rlsd_teacher": "initial", "rlsd_teacher_sync_steps": -1}, "must be >= 0"),
    ({"rlsd_schedule": "epochs"}, "rlsd_schedule"),
])
def test_the_schema_refuses_a_sync_of_the_live_teacher_and_bad_values(knobs, message):
    with pytest.raises(ValueError, match=message):
        mrtpo_config({"mode": "rlsd", **knobs})


@pytest.mark.parametrize("override, message", [
    ("actor_rollout_ref.actor.kl_loss_coef=0.001", "last synced policy"),
    ("trainer.critic_warmup=2", "critic_warmup"),
])
def test_the_sync_refuses_a_kl_to_the_reference_and_a_critic_warmup(override, message):
    from omegaconf import OmegaConf

    from recipe.mrtpo.methods.rlsd import check_rlsd_teacher

    config = OmegaConf.create({"actor_rollout_ref": {"actor": {"use_kl_loss": True, "kl_loss_coef": 0.0},
                                                     "ref": {"ulysses_sequence_parallel_size": 1}},
                               "trainer": {"critic_warmup": 0}})
    cfg = mrtpo_config({"mode": "rlsd", "rlsd_teacher": "initial", "rlsd_teacher_sync_steps": 20})
    key, value = override.split("=")
    OmegaConf.update(config, key, float(value) if "." in value else int(value))
    with pytest.raises(ValueError, match=message):
        check_rlsd_teacher(config, RLSD, cfg)
