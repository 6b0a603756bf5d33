"""The entry point's config: verl's ppo_trainer + the mrtpo group composes, overrides work, bad combos fail early."""

import pytest
from hydra import compose, initialize_config_module

ARR = "actor_rollout_ref"


def compose_cfg(*overrides):
    with initialize_config_module(config_module="recipe.mrtpo.config", version_base=None):
        return compose(config_name="mrtpo_trainer", overrides=list(overrides))


def test_recipe_config_composes_with_verl_and_overrides():
    from verl.trainer.config import AlgoConfig
    from verl.utils.config import omega_conf_to_dataclass

    cfg = compose_cfg("mrtpo.beta=0.3", "algorithm.adv_estimator=gdpo", "actor_rollout_ref.rollout.n=8")
    assert cfg.mrtpo.beta == 0.3 and cfg.algorithm.adv_estimator == "gdpo" and cfg.actor_rollout_ref.rollout.n == 8
    assert cfg.reward.reward_manager.name == "MRTPORewardManager" and cfg.reward.reward_manager.source == "importlib"
    assert cfg.trainer.v1.trainer_mode == "mrtpo" and cfg.trainer.use_v1 and cfg.data.return_raw_chat
    assert isinstance(omega_conf_to_dataclass(cfg.algorithm), AlgoConfig)  # the recipe adds nothing under algorithm.*
    for knob in ("warmup_steps", "max_realloc_rms", "max_token_weight", "measure", "mode", "replay", "shuffle", "reward_weighting",
                 "reward_weights", "replay_micro_batch_size", "chunk_size", "max_replay_prompt_length", "dump"):
        assert knob in cfg.mrtpo


def test_kl_in_reward_is_refused_for_per_reward_estimators():
    """use_kl_in_reward would be silently ignored by mrtpo/gdpo (they read per-reward scores): a clear error."""
    from recipe.mrtpo.main_mrtpo import run

    with pytest.raises(ValueError, match="use_kl_loss"):
        run(compose_cfg("algorithm.use_kl_in_reward=True"))


def test_v0_trainer_is_refused():
    from recipe.mrtpo.main_mrtpo import run

    with pytest.raises(ValueError, match="use_v1"):
        run(compose_cfg("trainer.use_v1=False"))


def test_typed_config_is_the_one_place_of_defaults_and_checks():
    """The YAML's mrtpo group becomes MRTPOConfig (its _target_); bad values and unknown keys fail before Ray."""
    from dataclasses import fields

    from verl.utils.config import omega_conf_to_dataclass

    from recipe.mrtpo.config import MRTPOConfig, mrtpo_config
    from recipe.mrtpo.main_mrtpo import check_config

    cfg = compose_cfg()
    typed = mrtpo_config(cfg.mrtpo)
    assert isinstance(typed, MRTPOConfig) and isinstance(omega_conf_to_dataclass(cfg.mrtpo), MRTPOConfig)
    defaults = MRTPOConfig()
    for f in fields(MRTPOConfig):  # the YAML states the dataclass defaults, never its own
        if f.name not in ("_target_", "dump"):
            assert getattr(typed, f.name) == getattr(defaults, f.name), f.name
    assert typed.dump.every_n_steps == 0 and typed.dump.max_samples == 8
    for bad, msg in (("mrtpo.beta=1.0", r"\[0, 1\)"), ("mrtpo.beta=-0.1", "beta"), ("mrtpo.measure=kl", "measure"),
                     ("mrtpo.mode=x", "mode"), ("mrtpo.replay_micro_batch_size=0", "micro_batch"),
                     ("+mrtpo.bta=0.3", "unknown"), ("mrtpo.dump.max_samples=0", "max_samples"),
                     ("mrtpo.rlsd_lambda=1.5", "rlsd_lambda"), ("mrtpo.rlsd_reweight_clip_range=-0.1", "clip_range"),
                     ("mrtpo.max_token_weight=0.5", "max_token_weight")):
        with pytest.raises(ValueError, match=msg):
            check_config(compose_cfg(bad))
    with pytest.raises(ValueError, match="norm_adv_by_std_in_grpo"):
        check_config(compose_cfg("algorithm.norm_adv_by_std_in_grpo=False"))
    check_config(compose_cfg("algorithm.adv_estimator=grpo", "algorithm.norm_adv_by_std_in_grpo=False"))  # verl's own step


@pytest.mark.parametrize(
    "overrides, setting, method",
    [
        (("algorithm.adv_estimator=gdpo", "mrtpo.mode=cort"), "mrtpo.mode=cort", "cort"),
        (("algorithm.adv_estimator=grpo", "mrtpo.mode=cort"), "mrtpo.mode=cort", "cort"),
        (("algorithm.adv_estimator=grpo", "mrtpo.shuffle=True"), "mrtpo.shuffle=True", "shuffle"),
        (("algorithm.adv_estimator=gdpo", "mrtpo.shuffle=True"), "mrtpo.shuffle=True", "shuffle"),
        (("algorithm.adv_estimator=mrtpo", "mrtpo.mode=cort", "mrtpo.shuffle=True"), "mrtpo.shuffle=True", "cort"),
        (("algorithm.adv_estimator=grpo", "mrtpo.reward_weighting=saw"), "mrtpo.reward_weighting=saw", "grpo"),
        (("algorithm.adv_estimator=grpo", "mrtpo.reward_weights={format: 0.5}"), "mrtpo.reward_weights=", "grpo"),
        (("algorithm.adv_estimator=grpo", "mrtpo.dump.every_n_steps=1"), "mrtpo.dump.every_n_steps=1", "grpo"),
        (("algorithm.adv_estimator=mrtpo", "mrtpo.mode=cort", "mrtpo.measure=js_divergence"), "mrtpo.measure=js_divergence", "cort"),
        (("algorithm.adv_estimator=gdpo", "mrtpo.beta=0.3"), "mrtpo.beta=0.3", "gdpo"),
        (("algorithm.adv_estimator=gdpo", "mrtpo.max_token_weight=3"), "mrtpo.max_token_weight=3", "gdpo"),
        (("algorithm.adv_estimator=gdpo", "mrtpo.replay=False"), "mrtpo.replay=False", "gdpo"),
        (("algorithm.adv_estimator=mrtpo", "mrtpo.seed=3"), "mrtpo.seed=3", "mrtpo"),
        (("algorithm.adv_estimator=mrtpo", "mrtpo.opsd_topk=8"), "mrtpo.opsd_topk=8", "mrtpo"),
        (("algorithm.adv_estimator=gdpo", "mrtpo.mode=opsd", "mrtpo.beta=0.2"), "mrtpo.beta=0.2", "opsd"),
        (("algorithm.adv_estimator=mrtpo", "mrtpo.mode=opsd"), "mrtpo.mode=opsd", "opsd"),
        (("algorithm.adv_estimator=grpo", "mrtpo.mode=opsd"), "mrtpo.mode=opsd", "opsd"),
        (("algorithm.adv_estimator=gdpo", "mrtpo.mode=opsd", f"{ARR}.actor.strategy=megatron"), f"{ARR}.actor.strategy=megatron", "opsd"),
        (("algorithm.adv_estimator=gdpo", "mrtpo.mode=opsd", f"{ARR}.actor.ulysses_sequence_parallel_size=2"),
         f"{ARR}.actor.ulysses_sequence_parallel_size=2", "opsd"),
        (("algorithm.adv_estimator=gdpo", "algorithm.use_kl_in_reward=True"), "algorithm.use_kl_in_reward=True", "gdpo"),
        (("algorithm.adv_estimator=mrtpo", "mrtpo.mode=rlsd"), "mrtpo.mode=rlsd", "rlsd"),
        (("algorithm.adv_estimator=gdpo", "mrtpo.mode=rlsd", "mrtpo.beta=0.3"), "mrtpo.beta=0.3", "rlsd"),
        (("algorithm.adv_estimator=gdpo", "mrtpo.mode=rlsd", "mrtpo.measure=js_divergence"), "mrtpo.measure=js_divergence", "rlsd"),
        (("algorithm.adv_estimator=gdpo", "mrtpo.rlsd_lambda=0.3"), "mrtpo.rlsd_lambda=0.3", "gdpo"),
        (("algorithm.adv_estimator=mrtpo", "mrtpo.rlsd_negative_only=True"), "mrtpo.rlsd_negative_only=True", "mrtpo"),
        (("algorithm.adv_estimator=gdpo", "mrtpo.mode=rlsd", f"{ARR}.model.use_fused_kernels=True"), "use_fused_kernels", "rlsd"),
        (("algorithm.adv_estimator=mrtpo", "mrtpo.mode=sdpo"), "mrtpo.mode=sdpo", "sdpo"),
        (("algorithm.adv_estimator=gdpo", "mrtpo.mode=sdpo", f"{ARR}.actor.strategy=fsdp2", "mrtpo.beta=0.3"), "mrtpo.beta=0.3", "sdpo"),
        (("algorithm.adv_estimator=gdpo", "mrtpo.mode=sdpo", f"{ARR}.actor.strategy=fsdp2", "mrtpo.reward_weighting=saw"),
         "mrtpo.reward_weighting=saw", "sdpo"),  # the advantage is not trained on: its knobs would do nothing
        (("algorithm.adv_estimator=gdpo", "mrtpo.mode=opsd", "mrtpo.sdpo_ema_rate=0.1"), "mrtpo.sdpo_ema_rate=0.1", "opsd"),
        (("algorithm.adv_estimator=gdpo", "mrtpo.mode=sdpo"), f"{ARR}.actor.strategy=fsdp", "sdpo"),
    ],
)
def test_inert_or_contradictory_settings_are_refused_naming_the_setting_and_the_method(overrides, setting, method):
    """A setting the chosen method does not read, or a combination it cannot run, fails before Ray starts."""
    from recipe.mrtpo.main_mrtpo import check_config

    with pytest.raises(ValueError) as err:
        check_config(compose_cfg(*overrides))
    msg = str(err.value)
    assert setting in msg and f"method {method}" in msg, msg


def test_every_method_resolves_from_its_own_overrides():
    """The registry's overrides of each method compose and resolve back to that method (and nothing else)."""
    from recipe.mrtpo import methods
    from recipe.mrtpo.main_mrtpo import check_config

    assert set(methods.names()) >= {"grpo", "gdpo", "mrtpo", "cort", "shuffle", "opsd", "gdpo-distill", "rlsd"}
    for name in methods.names():
        assert check_config(compose_cfg(*methods.get(name).overrides)).name == name
    # the resource presets of the run scripts are accepted by every method (they change no number)
    assert check_config(compose_cfg("algorithm.adv_estimator=grpo", "mrtpo.replay_micro_batch_size=4")).name == "grpo"


@pytest.mark.parametrize(
    "override, message",
    [
        (f"{ARR}.model.use_fused_kernels=True", f"{ARR}.model.use_fused_kernels=False"),
        (f"{ARR}.actor.ulysses_sequence_parallel_size=2", f"{ARR}.actor.ulysses_sequence_parallel_size=1"),
        (f"{ARR}.actor.fsdp_config.ulysses_sequence_parallel_size=4", "fsdp_config.ulysses_sequence_parallel_size=1"),
        (f"{ARR}.actor.strategy=megatron", f"{ARR}.actor.strategy=fsdp2"),
    ],
)
def test_settings_the_replay_cannot_run_with_are_refused_before_ray(override, message):
    """verl settings that would crash the first replay (no logits, sharded sequences, a non-HF module) fail at
    composition, naming the setting to change; GDPO and a run with the replay off accept them."""
    from recipe.mrtpo.main_mrtpo import check_config

    with pytest.raises(ValueError, match="adv_estimator=mrtpo") as err:
        check_config(compose_cfg(override))
    assert message in str(err.value) and "mrtpo.replay=False" in str(err.value)
    check_config(compose_cfg(override, "mrtpo.replay=False"))
    check_config(compose_cfg(override, "algorithm.adv_estimator=gdpo"))


def test_run_script_gpu_settings_pass_the_check():
    """use_remove_padding=True (what the run scripts set) and fsdp2 are accepted with the replay on."""
    from recipe.mrtpo.main_mrtpo import check_config

    check_config(compose_cfg(f"{ARR}.model.use_remove_padding=True", f"{ARR}.actor.strategy=fsdp2",
                             f"{ARR}.model.use_fused_kernels=False", "algorithm.adv_estimator=mrtpo"))


def _packed_old_log_probs(model, seqs: list, prompt_lens: list) -> list:
    """verl's use_remove_padding=True log-prob path on CPU: the FSDP engine's own ``prepare_model_inputs`` packs
    the sequences into one row (position ids restart per sequence, no attention mask), the model runs it once,
    and ``logprobs_from_logits`` reads the rolled ids, as ``compute_log_prob`` does."""
    from types import SimpleNamespace

    import torch
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.utils.torch_functional import logprobs_from_logits
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    nested = lambda xs: torch.nested.as_nested_tensor(xs, layout=torch.jagged)  # noqa: E731
    mb = TensorDict({"input_ids": nested(seqs), "position_ids": nested([torch.arange(len(s)) for s in seqs]),
                     "temperature": torch.ones(len(seqs))}, batch_size=[len(seqs)])
    tu.assign_non_tensor(mb, use_remove_padding=True)
    engine = SimpleNamespace(pad_to_length=False, use_ulysses_sp=False, _get_packed_pad_size=lambda n: 0)
    inputs, out_args = FSDPEngineWithLMHead.prepare_model_inputs(engine, mb)
    assert inputs["attention_mask"] is None and inputs["input_ids"].shape[0] == 1  # the packed (varlen) layout
    with torch.no_grad():
        logits = model(**inputs, use_cache=False).logits[0]
    lp = logprobs_from_logits(logits.float(), out_args["input_ids_rmpad_rolled"])
    out, start = [], 0
    for s, p in zip(seqs, prompt_lens):
        out.append(lp[start + p - 1 : start + len(s) - 1])  # the response tokens' log-probs
        start += len(s)
    return out


def test_use_remove_padding_leaves_the_replay_forward_unchanged(monkeypatch):
    """What use_remove_padding=True changes for the replay, exercised on CPU.

    verl's engine calls ``apply_monkey_patch(use_remove_padding=True)`` on the actor's module. For a text model
    with sequence parallel 1 that replaces only transformers' flash-attention function (by a wrapper that calls
    the original with the same arguments) and leaves the model's forward alone; the replay's plain forward with
    an attention mask then gives the same relevance and log-probs as before the patch, and its P_all log-probs
    equal verl's packed remove-padding old_log_prob (the consistency metric's premise)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from transformers.integrations import flash_attention
    from verl.models.transformers import monkey_patch

    from recipe.mrtpo.core.replay import hf_forward, replay_relevance

    monkeypatch.setattr(flash_attention, "_flash_attention_forward", flash_attention._flash_attention_forward)  # restored after
    # verl's CPU workers load verl_patches.cpu, whose trl_value_head_optional lets apply_monkey_patch run beside the
    # lock's TRL 1.16 (no value-head model); this process has not loaded it, so apply that patch here, restored after
    import verl.utils.import_utils as import_utils

    from verl_patches import trl_value_head

    monkeypatch.setattr(import_utils, "is_trl_available", import_utils.is_trl_available)
    monkeypatch.setattr(monkey_patch, "is_trl_available", monkey_patch.is_trl_available)
    trl_value_head.apply()
    cfg = Qwen2Config(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, max_position_embeddings=256)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)
    g = torch.Generator().manual_seed(1)
    R, NV, P, T = 3, 3, 20, 12
    lens = torch.tensor([[20, 14, 17], [11, 8, 0], [16, 16, 9]])
    ids = torch.zeros(R, NV, P, dtype=torch.long)
    for r in range(R):
        for j in range(NV):
            if lens[r, j]:
                ids[r, j, P - int(lens[r, j]):] = torch.randint(1, 512, (int(lens[r, j]),), generator=g)
    responses = torch.randint(1, 512, (R, T), generator=g)
    resp_lens = [12, 7, 9]
    mask = torch.zeros(R, T, dtype=torch.long)
    for r, n in enumerate(resp_lens):
        mask[r, :n] = 1
    pair = torch.tensor([[1, 2], [1, -1], [2, 1]])

    def replay():
        return replay_relevance(hf_forward(model), ids, lens, responses, mask, pair, micro_batch_size=2)

    forward_before = type(model).forward
    before = replay()
    monkey_patch.apply_monkey_patch(model, ulysses_sp_size=1, use_remove_padding=True, use_fused_kernels=False)
    assert flash_attention._flash_attention_forward is monkey_patch._ulysses_flash_attention_forward  # what it patches
    assert type(model).forward is forward_before  # the model's forward (and its .logits) untouched
    after = replay()
    assert set(before) == set(after) and "replay_logprobs" in after
    for key, value in before.items():  # relevance (per reward or per variant), log-probs, counts: bit-identical
        assert torch.equal(value, after[key]), key
    relevance = [v for k, v in after.items() if "relevance" in k]
    assert relevance and float(relevance[0].max()) > 0

    seqs = [torch.cat([ids[r, 0, P - int(lens[r, 0]):], responses[r, : resp_lens[r]]]) for r in range(R)]
    packed = _packed_old_log_probs(model, seqs, [int(lens[r, 0]) for r in range(R)])
    for r in range(R):
        assert torch.allclose(after["replay_logprobs"][r, : resp_lens[r]], packed[r], atol=1e-4), r


def test_opsd_settings_are_refused_before_ray():
    from recipe.mrtpo import methods
    from recipe.mrtpo.main_mrtpo import check_config

    base = methods.get("opsd").overrides  # with the reference worker its frozen teacher needs
    check_config(compose_cfg(*base))
    for bad, msg in (("actor_rollout_ref.model.use_fused_kernels=True", "use_fused_kernels=False"),
                     ("distillation.enabled=True", "distillation.enabled=False")):
        with pytest.raises(ValueError, match=msg):
            check_config(compose_cfg(*base, bad))


def test_sdpo_settings_are_refused_before_ray():
    from recipe.mrtpo.main_mrtpo import check_config

    base = ("algorithm.adv_estimator=gdpo", "mrtpo.mode=sdpo", f"{ARR}.actor.strategy=fsdp2")
    assert check_config(compose_cfg(*base)).name == "sdpo"
    # a zero KL is accepted (nothing is added); SDPO has no KL term, so a coefficient > 0 is refused (ALGO=sdpo sets
    # use_kl_loss=False over the run scripts' shared 0.001)
    assert check_config(compose_cfg(*base, f"{ARR}.actor.use_kl_loss=True", f"{ARR}.actor.kl_loss_coef=0")).name == "sdpo"
    from recipe.mrtpo import methods

    assert check_config(compose_cfg(*methods.get("sdpo").overrides)).name == "sdpo"
    for bad, msg in ((f"{ARR}.actor.use_kl_loss=True", "SDPO has no KL term"),
                     ("actor_rollout_ref.model.use_fused_kernels=True", "use_fused_kernels=False"),
                     ("distillation.enabled=True", "distillation.enabled=False"),
                     ("algorithm.use_kl_in_reward=True", "use_kl_in_reward=True has no effect with method sdpo"),
                     ("algorithm.norm_adv_by_std_in_grpo=False", "norm_adv_by_std_in_grpo=False has no effect with method sdpo"),
                     ("mrtpo.sdpo_alpha=1.5", "sdpo_alpha must be in")):
        with pytest.raises(ValueError, match=msg):
            check_config(compose_cfg(*base, bad))


def _readme_knobs() -> dict:
    """{dotted knob: default text} of the README's knob table (rows ``| `mrtpo.a` / `b` | x / y | ... |``)."""
    from pathlib import Path

    rows = {}
    for line in (Path(__file__).resolve().parents[2] / "README.md").read_text().splitlines():
        if not line.startswith("| `mrtpo."):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        names = [n.strip().strip("`") for n in cells[0].split(" / ")]
        if not cells[1]:
            continue  # a further value of the row above (mrtpo.mode's choices)
        parent = names[0].rsplit(".", 1)[0]
        defaults = [d.strip().strip("`") for d in cells[1].split(" / ")]
        assert len(names) == len(defaults), line
        for n, d in zip(names, defaults):
            rows[n if n.startswith("mrtpo.") else f"{parent}.{n}"] = d
    return rows


def test_readme_knob_table_is_the_schema():
    """Every mrtpo.* knob in the README's table with the schema's default, and no other (defaults live in the schema)."""
    from dataclasses import fields

    from recipe.mrtpo.config import DumpConfig, MRTPOConfig

    def text(v):
        return "null" if v is None else str(v)

    want = {f"mrtpo.{f.name}": text(f.default) for f in fields(MRTPOConfig) if f.name not in ("_target_", "dump")}
    want.update({f"mrtpo.dump.{f.name}": text(f.default) for f in fields(DumpConfig) if f.name != "_target_"})
    assert _readme_knobs() == want


def test_the_yaml_writes_no_default():
    """mrtpo_trainer.yaml's mrtpo group holds its _target_s and comments only; the values come from the schema."""
    from pathlib import Path

    import yaml

    raw = yaml.safe_load((Path(__file__).resolve().parents[2] / "recipe/mrtpo/config/mrtpo_trainer.yaml").read_text())
    assert raw["mrtpo"] == {"_target_": "recipe.mrtpo.config.schema.MRTPOConfig",
                            "dump": {"_target_": "recipe.mrtpo.config.schema.DumpConfig"}}
    cfg = compose_cfg()
    from recipe.mrtpo.config import MRTPOConfig, mrtpo_config

    assert mrtpo_config(cfg.mrtpo) == MRTPOConfig()  # the composed group is the dataclass's defaults


def test_package_version_is_pyprojects():
    from pathlib import Path

    import tomllib

    import recipe.mrtpo

    meta = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert recipe.mrtpo.__version__ == meta["project"]["version"]


RLSD = ("algorithm.adv_estimator=gdpo", "mrtpo.mode=rlsd")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (("mrtpo.rlsd_teacher=initial",), "use_kl_loss=True"),  # verl builds its reference worker only for the KL loss
        (("mrtpo.rlsd_teacher=initial", f"{ARR}.actor.use_kl_loss=True", f"{ARR}.model.lora_rank=8"), "LoRA"),
        (("mrtpo.rlsd_teacher=initial", f"{ARR}.actor.use_kl_loss=True", f"{ARR}.ref.ulysses_sequence_parallel_size=2"),
         f"{ARR}.ref.ulysses_sequence_parallel_size=2"),
        (("mrtpo.rlsd_teacher=frozen",), "rlsd_teacher"),
    ],
)
def test_rlsds_initial_teacher_needs_verls_reference_worker(overrides, message):
    from recipe.mrtpo.main_mrtpo import check_config

    with pytest.raises(ValueError, match=message):
        check_config(compose_cfg(*RLSD, *overrides))


def test_rlsds_teacher_is_read_by_rlsd_only():
    from recipe.mrtpo.main_mrtpo import check_config

    assert check_config(compose_cfg(*RLSD, "mrtpo.rlsd_teacher=initial", f"{ARR}.actor.use_kl_loss=True",
                                    f"{ARR}.actor.kl_loss_coef=0.0")).name == "rlsd"
    assert check_config(compose_cfg(*RLSD, "mrtpo.rlsd_teacher=live")).name == "rlsd"
    with pytest.raises(ValueError, match="mrtpo.rlsd_teacher=initial is not read by method gdpo"):
        check_config(compose_cfg("algorithm.adv_estimator=gdpo", "mrtpo.rlsd_teacher=initial"))


def test_fused_check_every_is_typed_checked_and_read_by_the_replay_methods():
    from recipe.mrtpo.main_mrtpo import check_config

    assert check_config(compose_cfg("mrtpo.fused_check_every=3")).name == "mrtpo"
    assert check_config(compose_cfg("mrtpo.fused_check_every=0")).name == "mrtpo"
    with pytest.raises(ValueError, match="mrtpo.fused_check_every must be >= 0"):
        check_config(compose_cfg("mrtpo.fused_check_every=-1"))
    with pytest.raises(ValueError, match="mrtpo.fused_check_every=3 is not read by method gdpo"):
        check_config(compose_cfg("mrtpo.fused_check_every=3", "algorithm.adv_estimator=gdpo"))


def test_teacher_template_is_typed_checked_and_read_by_the_self_teachers_only():
    """mrtpo.teacher_template: OPSD and RLSD read it (their teacher prompt), every other method refuses it set;
    a template without {prompt} and {information} once each is refused before Ray starts."""
    from recipe.mrtpo.main_mrtpo import check_config

    own = "mrtpo.teacher_template='Task: {prompt} Known: {information}'"
    assert compose_cfg(own).mrtpo.teacher_template == "Task: {prompt} Known: {information}"
    assert check_config(compose_cfg(*RLSD, own)).name == "rlsd"
    from recipe.mrtpo import methods

    assert check_config(compose_cfg(*methods.get("opsd").overrides, own)).name == "opsd"
    assert check_config(compose_cfg(*methods.get("gdpo-distill").overrides, own)).name == "gdpo-distill"
    for other in (("algorithm.adv_estimator=gdpo",), ("algorithm.adv_estimator=mrtpo",), ("algorithm.adv_estimator=grpo",)):
        with pytest.raises(ValueError, match="mrtpo.teacher_template=Task: .* is not read by method"):
            check_config(compose_cfg(*other, own))
    with pytest.raises(ValueError, match="teacher_template must use"):
        check_config(compose_cfg(*RLSD, "mrtpo.teacher_template='{prompt} alone'"))
