"""The actor's loss of the self-teachers as the worker installs it (``methods/opsd/loss.py``), on a small packed batch,
called as verl's FSDP engine calls it (once as the logits processor with the student's logits, once on the model
outputs), against the objectives written out here in numpy / plain torch, not with the recipe's code:

- OPSD: siyan-zhao/OPSD's ``generalized_jsd_loss`` with ``top_k`` (the teacher's top-k, both distributions
  renormalised over it, JSD_beta with the mixture beta p_T + (1 - beta) p_S; forward KL at beta 0, reverse KL at
  1), token-mean over the response, no policy loss;
- gdpo-distill: verl's vanilla PPO policy loss on GDPO's advantage + coef x the top-k forward KL
  sum_{v in K_T} p_T(v) (log p_T(v) - log p_S(v)), clamped at 0, token-mean.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_module
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu

from recipe.mrtpo.config import mrtpo_config
from recipe.mrtpo.methods.opsd.driver import distillation_loss_settings
from recipe.mrtpo.methods.opsd.loss import opsd_loss_fn, uses_topk_logits

V, K = 13, 4
PROMPT_LENS, RESP_LENS = [3, 5], [4, 2]
TEMP = 0.8


def composed(*overrides):
    with initialize_config_module(config_module="recipe.mrtpo.config", version_base=None):
        return compose(config_name="mrtpo_trainer", overrides=["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                                                               "algorithm.adv_estimator=gdpo", *overrides])


def actor_config(cfg):
    from verl.utils.config import omega_conf_to_dataclass

    return omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)


def verl_group(cfg) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg.distillation.distillation_loss, resolve=True)


def nested(xs):
    return torch.nested.as_nested_tensor(xs, layout=torch.jagged)


def batch(seed: int = 0):
    """Student logits over the packed sequences [total, V], the teacher's full log-probs at each row (row j: the
    distribution of token j + 1), its top-k in verl's per-sequence layout, and the micro-batch verl hands the loss."""
    g = torch.Generator().manual_seed(seed)
    lens = [p + n for p, n in zip(PROMPT_LENS, RESP_LENS)]
    total = sum(lens)
    student = (torch.randn(total, V, generator=g) * 2.0 / TEMP).requires_grad_(True)  # verl divides by tau before
    teacher_full = torch.log_softmax(torch.randn(total, V, generator=g) * 2.0 / TEMP, -1)
    tlp, tid = teacher_full.topk(K, -1)
    lp_rows, id_rows, start = [], [], 0
    for p, n in zip(PROMPT_LENS, RESP_LENS):
        L = p + n
        lp, ids = torch.zeros(L, K), torch.zeros(L, K, dtype=torch.int32)  # verl's padding off the response rows
        lp[p - 1 : p - 1 + n] = tlp[start + p - 1 : start + p - 1 + n]
        ids[p - 1 : p - 1 + n] = tid[start + p - 1 : start + p - 1 + n].int()
        lp_rows.append(lp)
        id_rows.append(ids)
        start += L
    data = TensorDict({
        "prompts": nested([torch.ones(p, dtype=torch.long) for p in PROMPT_LENS]),
        "responses": nested([torch.ones(n, dtype=torch.long) for n in RESP_LENS]),
        "response_mask": nested([torch.ones(n, dtype=torch.long) for n in RESP_LENS]),
        "input_ids": nested([torch.ones(L, dtype=torch.long) for L in lens]),
        "teacher_logprobs": nested(lp_rows), "teacher_ids": nested(id_rows),
    }, batch_size=[2])
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=None, global_batch_size=None)
    return student, teacher_full, tid, data


def response_rows() -> list[int]:
    """The packed rows whose logits predict a response token (row p - 1 + t of each sequence)."""
    rows, start = [], 0
    for p, n in zip(PROMPT_LENS, RESP_LENS):
        rows += [start + p - 1 + t for t in range(n)]
        start += p + n
    return rows


def metric(m) -> float:
    """A verl ``Metric``'s value (one micro-batch) or a plain number."""
    return float(m.aggregate()) if hasattr(m, "aggregate") else float(m)


def run_installed(fn, student, data, extra_outputs=None):
    """The engine's two calls (``FSDPEngineWithLMHead.prepare_model_outputs`` then the loss)."""
    cu = data["input_ids"].offsets()
    out = fn(student_logits=student.unsqueeze(0), data=data)
    model_output = {k: torch.nested.nested_tensor_from_jagged(v.squeeze(0), cu) for k, v in out.items()}
    model_output.update(extra_outputs or {})
    return fn(model_output=model_output, data=data, dp_group=None)


# ------------------------------------------------------------------------------ the references' formulas, restated
def jsd_numpy(z_s: np.ndarray, lp_t_full: np.ndarray, ids: np.ndarray, beta: float) -> float:
    """OPSD's generalized_jsd_loss at one position, top-k: gather both at the teacher's top-k, softmax over it."""
    s = z_s[ids] - np.log(np.exp(z_s[ids]).sum())
    t = lp_t_full[ids] - np.log(np.exp(lp_t_full[ids]).sum())
    ps, pt = np.exp(s), np.exp(t)
    if beta == 0:
        return float((pt * (t - s)).sum())
    if beta == 1:
        return float((ps * (s - t)).sum())
    m = np.log(beta * pt + (1 - beta) * ps)
    return float(beta * (pt * (t - m)).sum() + (1 - beta) * (ps * (s - m)).sum())


def jsd_torch_reference(student_logits, teacher_logits, beta):
    """siyan-zhao/OPSD ``generalized_jsd_loss`` (top_k branch, reduction per token) in its own F.kl_div form."""
    _, idx = torch.topk(teacher_logits, k=K, dim=-1)
    s = F.log_softmax(torch.gather(student_logits, -1, idx), -1)
    t = F.log_softmax(torch.gather(teacher_logits, -1, idx), -1)
    if beta == 0:
        return F.kl_div(s, t, reduction="none", log_target=True).sum(-1)
    if beta == 1:
        return F.kl_div(t, s, reduction="none", log_target=True).sum(-1)
    b = torch.tensor(beta)
    m = torch.logsumexp(torch.stack([s + torch.log1p(-b), t + torch.log(b)]), dim=0)
    return (b * F.kl_div(m, t, reduction="none", log_target=True) + (1 - b) * F.kl_div(m, s, reduction="none", log_target=True)).sum(-1)


@pytest.mark.parametrize("beta", [0.5, 0.0, 1.0, 0.2])
def test_opsds_installed_loss_is_the_references_renormalised_topk_jsd(beta):
    cfg = composed("mrtpo.mode=opsd", "actor_rollout_ref.actor.use_kl_loss=True", f"mrtpo.opsd_beta={beta}", f"mrtpo.opsd_topk={K}")
    settings = distillation_loss_settings(mrtpo_config(cfg.mrtpo), verl_group(cfg))
    assert settings["use_policy_gradient"] is False and settings["use_task_rewards"] is False and uses_topk_logits(settings)
    fn = opsd_loss_fn(actor_config(cfg), settings)
    student, teacher_full, tid, data = batch()
    loss, metrics = run_installed(fn, student, data)
    rows = response_rows()
    z, t = student.detach().double().numpy(), teacher_full.double().numpy()
    want = np.mean([jsd_numpy(z[r], t[r], tid[r].numpy(), beta) for r in rows])  # token-mean, the actor's default
    assert actor_config(cfg).loss_agg_mode == "token-mean"
    assert float(loss) == pytest.approx(want, rel=1e-5, abs=1e-7)
    assert float(metric(metrics["distillation/loss"])) == pytest.approx(want, rel=1e-5, abs=1e-7)
    assert "actor/pg_loss" not in metrics  # the distillation loss alone
    # the top-k masses before renormalising: the teacher's from its log-probs, the student's from its softmax over V
    assert metrics["distillation/teacher_mass"] == pytest.approx(float(teacher_full[rows].exp().gather(-1, tid[rows]).sum(-1).mean()), rel=1e-5)
    ps = torch.softmax(student.detach()[rows], -1).gather(-1, tid[rows]).sum(-1).mean()
    assert metrics["distillation/student_mass"] == pytest.approx(float(ps), rel=1e-5)
    # the gradient reaching the student's logits is the reference's (its formula under autograd), only at response rows
    loss.backward()
    ref_student = student.detach().clone().requires_grad_(True)
    jsd_torch_reference(ref_student[rows], teacher_full[rows], beta).mean().backward()
    assert torch.allclose(student.grad, ref_student.grad, atol=1e-6)
    assert float(student.grad[rows].abs().sum()) > 0 and float(student.grad[[i for i in range(len(student)) if i not in rows]].abs().sum()) == 0


def test_opsds_loss_is_zero_when_the_student_is_the_teacher():
    cfg = composed("mrtpo.mode=opsd", "actor_rollout_ref.actor.use_kl_loss=True", f"mrtpo.opsd_topk={K}")
    fn = opsd_loss_fn(actor_config(cfg), distillation_loss_settings(mrtpo_config(cfg.mrtpo), verl_group(cfg)))
    _, teacher_full, _, data = batch()
    loss, _ = run_installed(fn, (teacher_full + 3.0).clone().requires_grad_(True), data)  # logits = log p_T + const
    assert abs(float(loss)) < 1e-6


def test_gdpo_distills_installed_loss_is_the_policy_loss_plus_coef_times_the_topk_forward_kl():
    coef = 0.3
    cfg = composed("mrtpo.mode=gdpo-distill", f"mrtpo.opsd_loss_coef={coef}", f"mrtpo.opsd_topk={K}")
    settings = distillation_loss_settings(mrtpo_config(cfg.mrtpo), verl_group(cfg))
    assert settings["use_policy_gradient"] is False and settings["use_task_rewards"] is True and uses_topk_logits(settings)
    actor = actor_config(cfg)
    assert actor.loss_agg_mode == "token-mean" and actor.policy_loss.get("loss_mode", "vanilla") == "vanilla"
    fn = opsd_loss_fn(actor, settings)
    student, teacher_full, tid, data = batch(seed=1)
    g = torch.Generator().manual_seed(4)
    rows = response_rows()
    # the sampled tokens' log-probs of the student (what verl's forward returns at every row) and the old ones
    lp_seq = torch.log_softmax(student.detach(), -1)[:, 0]  # any token: the policy loss reads log-probs only
    old = [lp_seq[r] + 0.05 * torch.randn((), generator=g) for r in rows]  # ratios within the clip range
    adv = torch.randn(len(rows), generator=g)
    split = np.cumsum([0, *RESP_LENS])
    data["old_log_probs"] = nested([torch.stack(old[a:b]) for a, b in zip(split[:-1], split[1:])])
    data["advantages"] = nested([adv[a:b] for a, b in zip(split[:-1], split[1:])])
    log_probs = torch.nested.nested_tensor_from_jagged(lp_seq, data["input_ids"].offsets())
    loss, metrics = run_installed(fn, student, data, {"log_probs": log_probs})
    # vanilla PPO, token-mean: mean_t max(-A r, -A clip(r, 1 - 0.2, 1 + 0.2)) with r = exp(log p - old)
    lp = lp_seq[rows].double().numpy()
    ratio = np.exp(lp - torch.stack(old).double().numpy())
    a = adv.double().numpy()
    assert (np.abs(ratio - 1) < 0.2).all()
    pg = np.mean(np.maximum(-a * ratio, -a * np.clip(ratio, 0.8, 1.2)))
    # verl's top-k forward KL over the teacher's top-k (not renormalised), clamped at 0, token-mean
    ls = np.log(np.exp(student.detach().double().numpy()) / np.exp(student.detach().double().numpy()).sum(-1, keepdims=True))
    t = teacher_full.double().numpy()
    kl = [max(0.0, float((np.exp(t[r][tid[r]]) * (t[r][tid[r]] - ls[r][tid[r]])).sum())) for r in rows]
    assert float(loss) == pytest.approx(pg + coef * np.mean(kl), rel=1e-5, abs=1e-7)
    assert float(metric(metrics["actor/pg_loss"])) == pytest.approx(pg, rel=1e-5, abs=1e-7)


def test_the_settings_pin_use_policy_gradient_against_verls_dataclass_default():
    """verl's DistillationLossConfig defaults use_policy_gradient to True (its YAML to False): the settings pin
    False for both objectives whatever the composed group holds, so no config the loss is built from has True."""
    from verl.workers.config import DistillationLossConfig

    from recipe.mrtpo.methods.opsd.loss import build_distillation_config

    assert DistillationLossConfig.__dataclass_fields__["use_policy_gradient"].default is True  # what could slip in
    for mode in ("opsd", "gdpo-distill"):
        for group in ({}, {"use_policy_gradient": True}, {"use_policy_gradient": False}):
            s = distillation_loss_settings(mrtpo_config({"mode": mode}), group)
            assert build_distillation_config(s).distillation_loss.use_policy_gradient is False, (mode, group)
