"""The worker's no-grad passes (``compute_replay_relevance``, ``compute_opsd_teacher``, their reference twins) through the class
itself, with a stand-in for verl's engine around a tiny Qwen2 (no Ray): what the class adds to the row
functions is eval mode, no gradients, the module's device, the settings check and the refusal of sequence
parallelism; and ``update_actor``'s install of the self-teachers' losses."""

import contextlib
from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict

from recipe.mrtpo.core.passes import PassSettings
from recipe.mrtpo.core.replay import hf_forward
from recipe.mrtpo.methods.opsd.driver import TEACHER_SETTINGS
from recipe.mrtpo.step.worker import REPLAY_SETTINGS, MRTPOActorRolloutRefWorker, opsd_teacher_rows, replay_rows

SETTINGS = {
    "temperature": 0.9,
    "measure": "js_distance",
    "micro_batch_size": 2,
    "token_budget": 0,
    "chunk_size": 0,
    "pad_token_id": 0,
    "share_prompts": False,
    "compile_js": False,
    "topk": 3,
    "layout": "auto",
}


class Engine:
    """What the worker reads of verl's FSDP engine: ``module``, ``eval_mode()``, the sequence-parallel size, the
    autocast dtype (fp32: the module's own, as verl's engine under fp32 mixed precision)."""

    def __init__(self, module, sp=1, autocast_dtype=torch.float32):
        self.module, self.ulysses_sequence_parallel_size, self.entered = module, sp, []
        self._autocast_dtype = autocast_dtype

    @contextlib.contextmanager
    def eval_mode(self):
        self.module.eval()
        self.entered.append(True)
        try:
            yield
        finally:
            self.module.train()


def worker_around(engine):
    w = MRTPOActorRolloutRefWorker.__new__(MRTPOActorRolloutRefWorker)  # no Ray, no FSDP: only the binding
    w.actor = SimpleNamespace(engine=engine)
    return w


def with_settings(tensors, keys, drop=()):
    R = next(iter(tensors.values())).shape[0]
    td = TensorDict(dict(tensors), batch_size=[R])
    for k in keys:
        if k not in drop:
            td.set_non_tensor(k, SETTINGS[k])
    return td


def rows():
    g = torch.Generator().manual_seed(2)
    responses = torch.randint(1, 150_000, (2, 5), generator=g)
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[1, 3:] = 0
    variants = torch.randint(1, 150_000, (2, 2, 6), generator=g)
    variants[1, 1, :2] = 0  # left padding of a shorter P_minus
    replay = {
        "variant_ids": variants,
        "variant_lens": torch.tensor([[6, 6], [6, 4]]),
        "responses": responses,
        "response_mask": mask,
        "pair_variant": torch.tensor([[1, -1], [-1, 1]]),
    }
    prompts = variants[:, 0].clone()
    prompts[1, :1] = 0
    opsd = {"prompt_ids": prompts, "prompt_lens": torch.tensor([6, 5]), "responses": responses, "response_mask": mask}
    return replay, opsd


def test_the_worker_passes_equal_the_row_functions_in_eval_mode_without_grad(tiny_lm):
    replay, opsd = rows()
    engine = Engine(tiny_lm)
    seen = []  # (grad enabled, training) at each forward
    hook = tiny_lm.register_forward_pre_hook(lambda m, _: seen.append((torch.is_grad_enabled(), m.training)))
    tiny_lm.train()
    try:
        got = worker_around(engine).compute_replay_relevance(with_settings(replay, REPLAY_SETTINGS))
    finally:
        hook.remove()
    assert seen and set(seen) == {(False, False)}  # every forward in eval mode without grad
    assert engine.entered == [True] and tiny_lm.training  # through the engine's eval_mode, restored after
    tiny_lm.eval()
    with torch.no_grad():
        want = replay_rows(hf_forward(tiny_lm), with_settings(replay, REPLAY_SETTINGS), "cpu", sync=None)
    for key in ("variant_relevance", "replay_logprobs", "replay_forwards"):
        assert torch.equal(got[key], want[key]), key
    assert got["variant_relevance"].abs().sum() > 0 and got["replay_forwards"][:, :2].tolist() == [[2, 2]] * 2  # 4 sequences, 2 a forward

    got = worker_around(engine).compute_opsd_teacher(with_settings(opsd, TEACHER_SETTINGS))
    with torch.no_grad():
        want = opsd_teacher_rows(hf_forward(tiny_lm), with_settings(opsd, TEACHER_SETTINGS), "cpu", sync=None)
    for key in ("teacher_topk_logprobs", "teacher_topk_ids", "teacher_token_logprobs", "teacher_forwards"):
        assert torch.equal(got[key], want[key]), key
    assert got["teacher_topk_ids"].shape == (2, 5, 3) and len(engine.entered) == 2


def test_the_worker_runs_each_forward_under_the_engines_autocast_and_rounds_as_verl(tiny_lm, monkeypatch):
    import verl.utils.device

    from recipe.mrtpo.step.worker import engine_autocast, verl_numerics

    monkeypatch.setattr(verl.utils.device, "get_device_name", lambda: "cpu")
    replay, _ = rows()
    seen = []
    hook = tiny_lm.register_forward_pre_hook(lambda m, _: seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))))
    try:
        got = worker_around(Engine(tiny_lm, autocast_dtype=torch.bfloat16)).compute_replay_relevance(with_settings(replay, REPLAY_SETTINGS))
    finally:
        hook.remove()
        tiny_lm.eval()
    assert seen and set(seen) == {(True, torch.bfloat16)}
    assert torch.isfinite(got["replay_logprobs"]).all()
    assert isinstance(engine_autocast(Engine(tiny_lm)), contextlib.nullcontext)  # fp32: no autocast, as verl's forward_step
    # verl's CPU fallback log-prob (no flash-attention) is a log-softmax in the logits' dtype
    assert verl_numerics(Engine(tiny_lm, autocast_dtype=torch.bfloat16), "cpu") == {"logprob_dtype": "bfloat16", "entropy_dtype": "bfloat16"}
    assert verl_numerics(Engine(tiny_lm), "cpu") == {"logprob_dtype": "float32", "entropy_dtype": "float32"}


def test_the_worker_refuses_missing_settings_and_sequence_parallel(tiny_lm):
    replay, opsd = rows()
    w = worker_around(Engine(tiny_lm))
    with pytest.raises(ValueError, match=r"compute_replay_relevance: settings \['chunk_size'\] missing"):
        w.compute_replay_relevance(with_settings(replay, REPLAY_SETTINGS, drop=("chunk_size",)))
    with pytest.raises(ValueError, match=r"compute_opsd_teacher: settings \['topk'\] missing"):
        w.compute_opsd_teacher(with_settings(opsd, TEACHER_SETTINGS, drop=("topk",)))
    with pytest.raises(ValueError, match="layout"):
        PassSettings.from_wire({**SETTINGS, "layout": "ragged"}, "compute_replay_relevance")
    sp = worker_around(Engine(tiny_lm, sp=2))
    with pytest.raises(NotImplementedError, match="MRTPO replay .* ulysses"):
        sp.compute_replay_relevance(with_settings(replay, REPLAY_SETTINGS))
    with pytest.raises(NotImplementedError, match="OPSD teacher pass .* ulysses"):
        sp.compute_opsd_teacher(with_settings(opsd, TEACHER_SETTINGS))


def test_the_pass_device_is_verls_and_cpu_without_an_accelerator(monkeypatch):
    import verl.utils.device as device

    from recipe.mrtpo.step.worker import attn_implementation, pass_device

    monkeypatch.setattr(device, "get_device_name", lambda: "cpu")
    assert pass_device() == torch.device("cpu")
    monkeypatch.setattr(device, "get_device_name", lambda: "cuda")  # verl's fallback name on a machine without one
    monkeypatch.setattr(device, "get_device_id", lambda: 3)
    expect = torch.device("cuda", 3) if torch.cuda.is_available() else torch.device("cpu")
    assert pass_device() == expect
    assert attn_implementation(SimpleNamespace(config=SimpleNamespace(_attn_implementation="flash_attention_2"))) == "flash_attention_2"
    assert attn_implementation(SimpleNamespace()) == ""


def test_the_reference_replay_runs_through_the_reference_engine_only(tiny_lm):
    """``compute_ref_replay``: the replay's rows through verl's reference model (``self.ref.engine``), in eval mode
    without grad; the actor's engine is not entered."""
    import copy

    replay, _ = rows()
    reference = copy.deepcopy(tiny_lm)
    with torch.no_grad():
        for p in reference.parameters():  # another model than the actor's
            p.add_(0.01 * torch.randn_like(p))
    actor_engine, ref_engine = Engine(tiny_lm), Engine(reference)
    w = worker_around(actor_engine)
    w.ref = SimpleNamespace(engine=ref_engine)
    got = w.compute_ref_replay(with_settings(replay, REPLAY_SETTINGS))
    assert ref_engine.entered == [True] and actor_engine.entered == []
    reference.eval()
    with torch.no_grad():
        want = replay_rows(hf_forward(reference), with_settings(replay, REPLAY_SETTINGS), "cpu", sync=None)
        actor = replay_rows(hf_forward(tiny_lm.eval()), with_settings(replay, REPLAY_SETTINGS), "cpu", sync=None)
    assert torch.equal(got["replay_logprobs"], want["replay_logprobs"])
    assert not torch.allclose(got["replay_logprobs"], actor["replay_logprobs"], atol=1e-4)
    w.ref = None
    with pytest.raises(RuntimeError, match="no reference model"):
        w.compute_ref_replay(with_settings(replay, REPLAY_SETTINGS))


def test_the_worker_refuses_a_vision_language_module_itself():
    from recipe.mrtpo.step.worker import check_pass_model

    vlm = SimpleNamespace(config=SimpleNamespace(model_type="qwen2_5_vl", vision_config=SimpleNamespace()))
    with pytest.raises(ValueError, match="vision-language"):
        check_pass_model(vlm, "the MRTPO replay")
    check_pass_model(SimpleNamespace(config=SimpleNamespace(model_type="qwen2")), "the MRTPO replay")


def test_update_actor_installs_each_self_teachers_loss_and_gives_verls_back(monkeypatch):
    """worker.update_actor: the batch's loss settings install OPSD's JSD (bound with its beta) or verl's own
    distillation_ppo_loss (gdpo-distill), with distillation_use_topk as verl's registry entry of the loss mode says
    (OPSD's and forward_kl_topk: the logits processor; k3: not); a batch without settings gets verl's ppo_loss back."""
    from functools import partial

    from verl.trainer.distillation import distillation_ppo_loss
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine_workers import ActorRolloutRefWorker
    from verl.workers.utils.losses import ppo_loss

    from recipe.mrtpo.config import mrtpo_config
    from recipe.mrtpo.methods.opsd.driver import LOSS_SETTINGS_KEY, distillation_loss_settings
    from recipe.mrtpo.methods.opsd.loss import opsd_jsd_loss

    seen = []
    monkeypatch.setattr(ActorRolloutRefWorker, "update_actor",
                        lambda self, data: seen.append((self.loss_fn, tu.get_non_tensor_data(data, "distillation_use_topk", None))))
    w = MRTPOActorRolloutRefWorker.__new__(MRTPOActorRolloutRefWorker)
    actor_config = object()
    w.loss_fn = verl_loss = partial(ppo_loss, config=actor_config)
    installed = []
    w.actor = SimpleNamespace(set_loss_fn=installed.append)

    def update(settings):
        td = TensorDict({"x": torch.zeros(2)}, batch_size=[2])
        if settings is not None:
            tu.assign_non_tensor(td, **{LOSS_SETTINGS_KEY: settings})
        w.update_actor(td)
        assert LOSS_SETTINGS_KEY not in td.keys()  # popped: verl's update never sees it
        return seen[-1]

    fn, topk = update(distillation_loss_settings(mrtpo_config({"mode": "opsd", "opsd_beta": 0.3}), {}))
    assert fn.func is opsd_jsd_loss and fn.keywords["beta"] == 0.3 and fn.keywords["config"] is actor_config and topk is True
    assert fn.keywords["distillation_config"].distillation_loss.use_task_rewards is False and installed == [fn]
    fn, topk = update(distillation_loss_settings(mrtpo_config({"mode": "gdpo-distill", "opsd_loss_mode": "k3"}), {}))
    assert fn.func is distillation_ppo_loss and topk is False and installed[-1] is fn
    fn, topk = update(distillation_loss_settings(mrtpo_config({"mode": "gdpo-distill"}), {}))
    assert fn.func is distillation_ppo_loss and topk is True
    fn, _ = update(None)
    assert fn is verl_loss and installed[-1] is verl_loss
