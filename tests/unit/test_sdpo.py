"""SDPO (docs/opsd.md, SDPO): its loss against SDPO's formulas re-stated here in numpy, its EMA teacher (the update
formula, rate 0, the swap, save and resume through the worker's checkpoint methods), its teacher pass through the
worker class against direct forwards of a tiny Qwen2; no Ray, no FSDP."""

import contextlib
import copy
from functools import partial
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu

from recipe.mrtpo.methods.opsd.driver import TEACHER_SETTINGS
from recipe.mrtpo.methods.opsd.teacher import sequence_teacher_fields
from recipe.mrtpo.methods.sdpo import LOSS_SETTINGS_KEY, SDPO
from recipe.mrtpo.methods.sdpo.ema import EMATeacher
from recipe.mrtpo.methods.sdpo.loss import (
    IS_CLIP,
    SDPO_LOSS_MODE,
    batch_settings,
    sdpo_distillation_config,
    sdpo_loss,
    sdpo_topk_outputs,
)
from recipe.mrtpo.step.worker import SDPO_TEACHER_DIR, MRTPOActorRolloutRefWorker

nested = lambda xs: torch.nested.as_nested_tensor(xs, layout=torch.jagged)  # noqa: E731


# ------------------------------------------------------------------------------------------- SDPO's formulas, in numpy
def sdpo_reference_loss(s_topk: np.ndarray, t_topk: np.ndarray, alpha: float, add_tail: bool) -> np.ndarray:
    """lasgroup/SDPO ``compute_self_distillation_loss`` (full_logit_distillation, distillation_topk) re-stated per token:
    the top-k probabilities plus a tail bucket 1 - sum (add_tail) or the top-k renormalised; then the KL
    F.kl_div(student, teacher) = KL(T || S) at alpha 0, KL(S || T) at alpha 1, else with M = alpha T + (1 - alpha) S
    lerp(KL(S || M), KL(T || M), alpha) = (1 - alpha) KL(S || M) + alpha KL(T || M), summed over the support."""
    def support(lp):
        p = np.exp(lp.astype(np.float64))
        if add_tail:
            return np.concatenate([p, 1.0 - p.sum(-1, keepdims=True)], -1)
        return p / p.sum(-1, keepdims=True)

    def kl(a, b):
        return (a * (np.log(a) - np.log(b))).sum(-1)

    S, T = support(s_topk), support(t_topk)
    if alpha == 0.0:
        return kl(T, S)
    if alpha == 1.0:
        return kl(S, T)
    M = alpha * T + (1 - alpha) * S
    return (1 - alpha) * kl(S, M) + alpha * kl(T, M)


def batch(V=300, k=100, prompt_lens=(3, 2), resp_lens=(4, 6), seed=0):
    """Two packed sequences: student logits [1, N, V], the student's top-k ids at the response positions and a
    teacher's log-probs there, in verl's sequence layout."""
    g = torch.Generator().manual_seed(seed)
    N = sum(prompt_lens) + sum(resp_lens)
    student = torch.randn(1, N, V, generator=g) * 3
    teacher = torch.randn(N, V, generator=g) * 3
    s_lp, t_lp = torch.log_softmax(student[0], -1), torch.log_softmax(teacher, -1)
    fields, start, rows = [], 0, []
    for p, n in zip(prompt_lens, resp_lens):
        pos = torch.arange(start + p - 1, start + p - 1 + n)  # row j predicts token j + 1: the response rows
        ids = torch.topk(s_lp[pos], k, -1).indices
        fields.append(sequence_teacher_fields(t_lp[pos].gather(-1, ids), ids, p, n))
        rows.append(pos)
        start += p + n
    return student, nested([f[0] for f in fields]), nested([f[1] for f in fields]), torch.cat(rows), s_lp, t_lp


@pytest.mark.parametrize("add_tail", [True, False])
@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0, 0.3])
def test_loss_equals_sdpos_jsd_over_the_students_top100_and_a_tail(alpha, add_tail):
    student, t_lp_f, ids_f, rows, s_lp, t_lp = batch()
    out = sdpo_topk_outputs(student, t_lp_f, ids_f, alpha, add_tail)
    got = out["distillation_losses"][0, rows].double().numpy()
    ids = ids_f.values()[rows].long()
    want = sdpo_reference_loss(s_lp[rows].gather(-1, ids).numpy(), t_lp[rows].gather(-1, ids).numpy(), alpha, add_tail)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-6)
    assert (want > 1e-3).all()  # different teacher and student: a real divergence
    np.testing.assert_allclose(out["student_mass"][0, rows].numpy(), s_lp[rows].gather(-1, ids).exp().sum(-1).numpy(), rtol=1e-5)
    assert out["distillation_losses"].shape == student.shape[:2]  # one value per packed token, as verl's processor asks


def test_loss_is_zero_when_the_teacher_is_the_student_and_has_gradient_otherwise():
    student, _, ids_f, rows, s_lp, t_lp = batch(seed=1)
    same = nested([torch.log_softmax(student[0], -1)[r].gather(-1, i.long()) for r, i in
                   zip(torch.split(torch.arange(student.shape[1]), [7, 8]), ids_f.unbind())])
    assert sdpo_topk_outputs(student, same, ids_f, 0.5)["distillation_losses"][0, rows].abs().max() < 1e-6
    student.requires_grad_(True)
    _, t_lp_f, ids_f, rows, _, _ = batch(seed=1)
    loss = sdpo_topk_outputs(student, t_lp_f, ids_f, 0.5)["distillation_losses"][0, rows].sum()
    loss.backward()
    assert student.grad.abs().sum() > 0


def actor_config(**kw):
    from verl.workers.config import FSDPActorConfig

    return FSDPActorConfig(strategy="fsdp2", ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2, rollout_n=1, **kw)


def loss_inputs(seed=2):
    prompt_lens, resp_lens = (3, 2), (4, 6)
    student, t_lp_f, ids_f, rows, s_lp, t_lp = batch(prompt_lens=prompt_lens, resp_lens=resp_lens, seed=seed)
    out = sdpo_topk_outputs(student, t_lp_f, ids_f, 0.5, True)
    cu = torch.tensor([0, 7, 15])
    model_output = {k: torch.nested.nested_tensor_from_jagged(v[0], cu) for k, v in out.items()}
    g = torch.Generator().manual_seed(4)
    log_probs = torch.randn(15, generator=g) * 0.5 - 2
    model_output["log_probs"] = torch.nested.nested_tensor_from_jagged(log_probs, cu)
    old = [torch.randn(n, generator=g) * 0.5 - 2 for n in resp_lens]
    ref = [torch.randn(n, generator=g) * 0.5 - 2 for n in resp_lens]
    data = TensorDict({"prompts": nested([torch.ones(p, dtype=torch.long) for p in prompt_lens]),
                       "responses": nested([torch.ones(n, dtype=torch.long) for n in resp_lens]),
                       "response_mask": nested([torch.ones(n, dtype=torch.long) for n in resp_lens]),
                       "advantages": nested([torch.randn(n, generator=g) for n in resp_lens]),
                       "old_log_probs": nested(old), "ref_log_prob": nested(ref)}, batch_size=[2])
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=sum(resp_lens), global_batch_size=2,
                         **batch_settings({"alpha": 0.5, "add_tail": True, "is_clip": 2.0}))
    D = out["distillation_losses"][0, rows].double()
    return model_output, data, D, log_probs[rows].double(), torch.cat(old).double(), torch.cat(ref).double()


def test_the_full_loss_through_verls_distillation_path_is_the_is_weighted_token_mean():
    """sdpo_loss's final call: verl's distillation_ppo_loss with the registered mode, no policy loss (whatever the
    advantages), token-mean over the response mask of min(pi / pi_old, 2) * D (SDPO's is_clip), re-stated here."""
    model_output, data, D, lp, old, _ = loss_inputs()
    config = actor_config()
    loss, metrics = sdpo_loss(config, sdpo_distillation_config(100), model_output=model_output, data=data)
    w = torch.exp(lp - old).clamp(max=2.0)
    assert (w == 2.0).any() and (w < 1.0).any()  # the clip bites on some tokens
    assert torch.allclose(loss.double(), (w * D).sum() / len(D), rtol=1e-5)
    assert "distillation/teacher_mass" in metrics and "distillation/is_weight" in metrics and "actor/pg_loss" not in metrics
    tu.assign_non_tensor(data, **{IS_CLIP: 0.0})  # is_clip null: plain token mean
    loss, _ = sdpo_loss(config, sdpo_distillation_config(100), model_output=model_output, data=data)
    assert torch.allclose(loss.double(), D.mean(), rtol=1e-5)
    assert sdpo_distillation_config(100).distillation_loss.loss_mode == SDPO_LOSS_MODE


def test_verls_rollout_correction_weights_each_token_as_sdpo_does():
    """ALGO=sdpo's token-level rollout correction: verl's ``rollout_is_weights`` (min(pi_old / pi_rollout, 2), computed
    in the advantage step) multiply SDPO's per-token loss, after the IS weight (SDPO's compute_self_distillation_loss),
    re-stated here; verl's own distillation_loss applies them only on its policy-gradient path."""
    model_output, data, D, lp, old, _ = loss_inputs()
    g = torch.Generator().manual_seed(7)
    rho = [torch.rand(n, generator=g) * 2.0 for n in (4, 6)]
    data.set("rollout_is_weights", nested(rho))
    loss, metrics = sdpo_loss(actor_config(), sdpo_distillation_config(100), model_output=model_output, data=data)
    w = torch.exp(lp - old).clamp(max=2.0)
    r = torch.cat(rho).double()
    assert torch.allclose(loss.double(), (r * w * D).sum() / len(D), rtol=1e-5)
    assert not torch.allclose(loss.double(), (w * D).sum() / len(D), rtol=1e-3)  # the weights act
    assert "distillation/rollout_is_weight" in metrics


def test_verls_kl_loss_is_added_as_sdpos_actor_adds_it():
    """actor.use_kl_loss: + kl_coef * token-mean of verl's low_var_kl (k3, clamped to [-10, 10]) to the reference,
    re-stated here: kl = exp(ref - lp) - (ref - lp) - 1; the advantages still do not enter."""
    model_output, data, D, lp, old, ref = loss_inputs()
    tu.assign_non_tensor(data, **{IS_CLIP: 0.0})
    loss, metrics = sdpo_loss(actor_config(use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="low_var_kl"),
                              sdpo_distillation_config(100), model_output=model_output, data=data)
    kl = (torch.exp(ref - lp) - (ref - lp) - 1).clamp(-10, 10)
    assert torch.allclose(loss.double(), D.mean() + 0.1 * kl.mean(), rtol=1e-5)
    assert "kl_loss" in metrics


# ------------------------------------------------------------------------------------------- the EMA teacher
def small_module(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))


def sgd_step(module, lr=0.5):
    opt = torch.optim.SGD(module.parameters(), lr=lr)
    opt.zero_grad()
    module(torch.randn(8, 4)).pow(2).sum().backward()
    opt.step()


def test_the_ema_update_is_the_formula():
    m = small_module()
    teacher = EMATeacher.from_module(m)
    theta_t = [p.detach().clone() for p in m.parameters()]
    sgd_step(m)
    theta_s = [p.detach().clone() for p in m.parameters()]
    teacher.update(m, 0.05)
    for t, a, b in zip(teacher.shards.values(), theta_t, theta_s):
        assert torch.allclose(t, 0.95 * a + 0.05 * b, atol=1e-7)
        assert not torch.equal(a, b)
    teacher.update(m, 1.0)  # rate 1: the teacher is the student
    assert all(torch.equal(t, s) for t, s in zip(teacher.shards.values(), theta_s))


def test_the_swap_runs_the_body_with_the_teacher_and_restores_the_student_also_on_error():
    m = small_module()
    teacher = EMATeacher.from_module(small_module(seed=1))
    student = [p.detach().clone() for p in m.parameters()]
    saved_t = [t.clone() for t in teacher.shards.values()]
    calls = []
    with teacher.swapped(m, reshard=lambda: calls.append(1)):
        assert all(torch.equal(p, t) for p, t in zip(m.parameters(), saved_t))
    assert all(torch.equal(p, s) for p, s in zip(m.parameters(), student)) and len(calls) == 2
    assert all(torch.equal(t, s) for t, s in zip(teacher.shards.values(), saved_t))
    with pytest.raises(RuntimeError), teacher.swapped(m):
        raise RuntimeError("a failing pass")
    assert all(torch.equal(p, s) for p, s in zip(m.parameters(), student))
    with pytest.raises(ValueError, match="does not match"):
        list(teacher._pairs(torch.nn.Linear(4, 6)))


# ------------------------------------------------------------------------------------------- through the worker
class FakeEngine(SimpleNamespace):
    """verl's engine as the worker and SDPO's part read it: the module, the pass attributes, and ``optimizer_step``
    (one SGD step, skipped where the planted gradient norm is not finite, as verl's; returns the norm)."""

    def optimizer_step(self):
        norm = self.norms.pop(0) if self.norms else 1.0
        if np.isfinite(norm):
            sgd_step(self.module)
        return norm


class FakeTrainingWorker:
    """What the worker reads of verl's TrainingWorker: the engine, a loss setter, ``mini_batches`` optimizer steps
    of the engine as the update (verl's ``train_mini_batch``), and checkpoint methods that save and load the module."""

    def __init__(self, module, mini_batches=1):
        self.engine = FakeEngine(module=module, ulysses_sequence_parallel_size=1, _autocast_dtype=torch.float32,
                                 eval_mode=lambda: contextlib.nullcontext(), norms=[])
        self.loss_fn, self.updates, self.mini_batches = None, 0, mini_batches

    def set_loss_fn(self, fn):
        self.loss_fn = fn

    def train_mini_batch(self, data):
        self.updates += 1
        for _ in range(self.mini_batches):
            self.engine.optimizer_step()
        return None

    def save_checkpoint(self, local_path, *args):
        torch.save(self.engine.module.state_dict(), f"{local_path}/model.pt")

    def load_checkpoint(self, local_path, *args):
        self.engine.module.load_state_dict(torch.load(f"{local_path}/model.pt"))


def fake_worker(module, mini_batches=1):
    w = MRTPOActorRolloutRefWorker.__new__(MRTPOActorRolloutRefWorker)  # no Ray, no FSDP: only the binding
    w.actor, w.role, w.enable_routing_replay = FakeTrainingWorker(module, mini_batches), "actor", False
    w.loss_fn = partial(lambda **kw: None, config=SimpleNamespace(loss_agg_mode="token-mean"))
    return w


def ema(w) -> EMATeacher:
    """The worker's SDPO part's EMA teacher."""
    return w.actor_part(SDPO.actor_part).ema


def sdpo_batch(rate):
    td = TensorDict({"x": torch.zeros(2)}, batch_size=[2])
    tu.assign_non_tensor(td, **{LOSS_SETTINGS_KEY: {"topk": 4, "alpha": 0.5, "add_tail": True, "is_clip": 2.0, "ema_rate": rate}})
    return td


@pytest.mark.parametrize("rate", [0.0, 0.05])
def test_the_worker_updates_the_teacher_after_the_actor_and_a_rate_0_teacher_stays(rate):
    m = small_module()
    w = fake_worker(m)
    initial = [p.detach().clone() for p in m.parameters()]
    data = sdpo_batch(rate)
    w.update_actor(data)
    after = [p.detach().clone() for p in m.parameters()]
    assert w.actor.updates == 1 and any(not torch.equal(a, b) for a, b in zip(initial, after))  # the actor moved
    assert tu.get_non_tensor_data(data=data, key="distillation_use_topk", default=False) is True
    assert w.actor.loss_fn.func is sdpo_loss and w.actor.loss_fn.keywords["distillation_config"].distillation_loss.topk == 4
    for t, a, b in zip(ema(w).shards.values(), initial, after):
        if rate == 0.0:
            assert torch.equal(t, a)  # the teacher is still the initial policy, bit for bit
        else:
            assert torch.allclose(t, (1 - rate) * a + rate * b, atol=1e-7)


@pytest.mark.parametrize("planted, moves", [([float("nan")], False), ([float("inf"), float("nan")], False),
                                            ([float("nan"), 2.0], True), ([3.0], True)],
                         ids=["nan", "inf-then-nan", "nan-then-finite", "finite"])
def test_the_ema_teacher_moves_only_after_an_update_with_a_finite_gradient_norm(planted, moves):
    """SDPO's rule (its dp_actor's ``did_update``): the teacher's EMA step follows an update call only where one of its
    optimizer steps had a finite gradient norm; verl skipped every step otherwise, and the teacher stays bit for bit."""
    m = small_module()
    w = fake_worker(m, mini_batches=len(planted))
    w.update_actor(sdpo_batch(0.3))  # a first, finite update: the teacher is now the EMA of two different weights
    before_teacher = {n: t.clone() for n, t in ema(w).shards.items()}
    before_actor = [p.detach().clone() for p in m.parameters()]
    w.actor.engine.norms = list(planted)
    w.update_actor(sdpo_batch(0.3))
    assert "optimizer_step" not in vars(w.actor.engine)  # the watch is gone after the update
    actor_moved = any(not torch.equal(a, p) for a, p in zip(before_actor, m.parameters()))
    assert actor_moved == moves  # verl's engine (here its stand-in) skipped the non-finite steps
    teacher_moved = any(not torch.equal(before_teacher[n], t) for n, t in ema(w).shards.items())
    assert teacher_moved == moves
    assert w.actor_part(SDPO.actor_part).skipped == (0 if moves else 1)


def test_an_update_without_an_optimizer_step_is_refused():
    """The rule reads verl's ``engine.optimizer_step``: an update that never calls it (verl changed) is refused."""
    w = fake_worker(small_module(), mini_batches=0)
    with pytest.raises(RuntimeError, match="ran no optimizer step"):
        w.update_actor(sdpo_batch(0.3))


def test_the_grad_norm_watch_relies_on_the_pinned_verl():
    from recipe.mrtpo.methods.actor_part import check_grad_norm_sources

    assert check_grad_norm_sources() == [], "verl changed: re-check recipe/mrtpo/methods/actor_part.py (grad_norms)"


def test_the_ema_teacher_survives_save_and_resume_bit_for_bit(tmp_path):
    m = small_module()
    w = fake_worker(m)
    for _ in range(2):
        w.update_actor(sdpo_batch(0.3))
    saved = {n: t.clone() for n, t in ema(w).shards.items()}
    assert any(not torch.equal(saved[n], p) for n, p in m.named_parameters())  # the teacher is not the actor
    w.save_checkpoint(str(tmp_path))
    assert (tmp_path / SDPO_TEACHER_DIR / "rank_0_of_1.pt").exists()

    fresh = fake_worker(small_module(seed=9))  # a new process: other weights, no teacher
    fresh.load_checkpoint(str(tmp_path))
    assert all(torch.equal(ema(fresh).shards[n], t) for n, t in saved.items())
    assert ema(fresh).fingerprint() == EMATeacher(saved).fingerprint()
    for (_, a), (_, b) in zip(fresh.actor.engine.module.named_parameters(), m.named_parameters()):
        assert torch.equal(a, b)
    # a checkpoint without a teacher (another method's): SDPO refuses to go on with a lost teacher
    (tmp_path / SDPO_TEACHER_DIR / "rank_0_of_1.pt").unlink()
    lost = fake_worker(small_module())
    lost.load_checkpoint(str(tmp_path))
    with pytest.raises(RuntimeError, match="holds no EMA teacher"):
        lost.update_actor(sdpo_batch(0.05))


# ------------------------------------------------------------------------------------------- the teacher pass, tiny Qwen2
def direct(model, prompt, response, temp):
    seq = torch.tensor([list(prompt) + response.tolist()])
    with torch.no_grad():
        lg = model(input_ids=seq).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(response)].float()
    return torch.log_softmax(lg / temp, -1)


def test_the_worker_pass_takes_the_students_topk_and_the_ema_teacher_at_them(tiny_lm):
    student = copy.deepcopy(tiny_lm)
    teacher_model = copy.deepcopy(tiny_lm)
    with torch.no_grad():
        for p in teacher_model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    w = fake_worker(student)
    w.actor_part(SDPO.actor_part).ema = EMATeacher.from_module(teacher_model)
    g = torch.Generator().manual_seed(3)
    responses = torch.randint(1, 150_000, (2, 5), generator=g)
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[1, 4:] = 0
    p_all = torch.randint(1, 150_000, (2, 8), generator=g)
    rollout = p_all.clone()
    rollout[:, :3] = 0  # the rollout prompt: the last 5 tokens of P_all (left-padded)
    k, temp = 6, 0.9
    td = TensorDict({"prompt_ids": p_all, "prompt_lens": torch.tensor([8, 8]), "student_prompt_ids": rollout,
                     "student_prompt_lens": torch.tensor([5, 5]), "responses": responses, "response_mask": mask}, batch_size=[2])
    for key in TEACHER_SETTINGS:
        td.set_non_tensor(key, {"temperature": temp, "micro_batch_size": 2, "token_budget": 0, "chunk_size": 0,
                                "pad_token_id": 0, "topk": k, "layout": "auto", "share_prompts": False}[key])
    before = [p.detach().clone() for p in student.parameters()]
    got = w.compute_sdpo_teacher(td)
    assert all(torch.equal(p, b) for p, b in zip(student.parameters(), before))  # the student's weights are back
    for r in range(2):
        n = int(mask[r].sum())
        s_lp = direct(student, rollout[r, 3:].tolist(), responses[r, :n], temp)
        t_lp = direct(teacher_model, p_all[r].tolist(), responses[r, :n], temp)
        ids = torch.topk(s_lp, k, -1).indices
        assert torch.equal(got["teacher_topk_ids"][r, :n].long(), ids)
        assert torch.allclose(got["teacher_topk_logprobs"][r, :n], t_lp.gather(-1, ids), atol=1e-4)
        assert torch.allclose(got["teacher_token_logprobs"][r, :n], t_lp.gather(-1, responses[r, :n, None])[:, 0], atol=1e-4)
        assert (got["teacher_topk_ids"][r, n:] == 0).all()
    assert got["teacher_fingerprint"][0].tolist() == list(ema(w).fingerprint())
