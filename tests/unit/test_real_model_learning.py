"""The real-model learning experiment's runner (``experiments/real_model_learning``) without a run: the overrides
each arm composes (the plan's fixed settings), the launch's own checks on them, the record's counts, and the report
folders ``tools.report`` reads."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from experiments.real_model_learning import analysis as A
from experiments.real_model_learning import runs as R
from experiments.real_model_learning import settings as C

REPO = Path(__file__).resolve().parents[2]


def _kv(overrides):
    return dict(o.split("=", 1) for o in overrides)


@pytest.mark.parametrize("arm", C.ARMS)
def test_every_arm_runs_the_plans_settings(arm, tmp_path):
    ov = C.run_overrides(arm, 101, tmp_path / "model", tmp_path / "train.parquet", tmp_path / "run")
    kv = _kv(ov)
    assert len(kv) == len(ov)  # no key set twice
    assert kv["data.train_batch_size"] == kv["actor_rollout_ref.actor.ppo_mini_batch_size"] == "8"  # one update a step
    assert (kv["actor_rollout_ref.rollout.n"], kv["data.max_response_length"], kv["trainer.total_training_steps"]) == ("4", "128", "30")
    assert kv["actor_rollout_ref.actor.optim.lr"] == "1e-05" and kv["actor_rollout_ref.actor.use_kl_loss"] == "False"
    assert kv["data.seed"] == kv["actor_rollout_ref.rollout.seed"] == "101" and kv["data.shuffle"] == "True"
    assert kv["mrtpo.share_prompts"] == "False" and kv["mrtpo.compile_js"] == "False"  # pinned, not a default
    assert kv["trainer.save_freq"] == "30" and ov[-1].startswith("+actor_rollout_ref.actor.fsdp_config.mixed_precision")
    assert kv["trainer.experiment_name"] == f"smollm2-135m_instruction_following_{arm}_seed101"
    if arm == "gdpo":
        assert kv["algorithm.adv_estimator"] == "gdpo" and not any(k in kv for k in ("mrtpo.beta", "mrtpo.warmup_steps"))
    else:
        assert (kv["algorithm.adv_estimator"], kv["mrtpo.beta"], kv["mrtpo.warmup_steps"]) == ("mrtpo", "0.5", "1")
        assert kv.get("mrtpo.shuffle") == ("True" if arm == "shuffle" else None)


def test_the_confirmatory_set_takes_the_amendments_prompts_a_step_and_the_pilot_keeps_its_own(tmp_path, monkeypatch):
    monkeypatch.setattr(C, "CONFIRMATORY_PROMPTS_PER_STEP", 4)
    conf = _kv(C.run_overrides("mrtpo", 0, tmp_path / "model", tmp_path / "train.parquet", tmp_path / "run"))
    pilot = _kv(C.run_overrides("mrtpo", 100, tmp_path / "model", tmp_path / "train.parquet", tmp_path / "run"))
    assert conf["data.train_batch_size"] == conf["actor_rollout_ref.actor.ppo_mini_batch_size"] == "4"
    assert pilot["data.train_batch_size"] == pilot["actor_rollout_ref.actor.ppo_mini_batch_size"] == "8"
    assert conf["actor_rollout_ref.rollout.n"] == pilot["actor_rollout_ref.rollout.n"] == "4"

def test_an_unknown_arm_is_refused(tmp_path):
    with pytest.raises(C.ExperimentError, match="unknown arm 'grpo'"):
        C.run_overrides("grpo", 0, tmp_path, tmp_path, tmp_path)


def test_the_launch_checks_pass_on_the_mrtpo_arm(tmp_path):
    """The recipe's and verl's checks before Ray starts (``run_scripts/dry_run.py``), on the CPU launch's overrides."""
    from recipe.mrtpo.cpu.runtime import cpu_overrides, with_cpu_overrides
    from recipe.mrtpo.main_mrtpo import check_launch

    spec = importlib.util.spec_from_file_location("dry_run", REPO / "run_scripts" / "dry_run.py")
    dry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dry)
    ov = C.run_overrides("mrtpo", 100, tmp_path / "model", tmp_path / "train.parquet", tmp_path / "run")
    config = dry.compose_config(with_cpu_overrides(ov, cpu_overrides()))
    assert check_launch(config, local_paths=False).name == "mrtpo"
    assert config.mrtpo.share_prompts is False and config.actor_rollout_ref.rollout.n == 4


def test_the_run_name_is_the_one_tools_report_reads():
    from recipe.mrtpo.tools.report.discovery import RUN_NAME

    m = RUN_NAME.match(C.run_name("mrtpo", 7))
    assert (m["model"], m["task"], m["method"], m["seed"]) == ("smollm2-135m", "instruction_following", "mrtpo", "7")


EVAL = {"task": "ifeval", "model": "m", "n": 2, "metrics": {"prompt_level_strict": 0.5},
        "items": [{"scores": {"strict": {"startend:end_checker": 1.0, "punctuation:no_comma": 0.0}}},
                  {"scores": {"strict": {"startend:end_checker": 0.0, "keywords:existence": 1.0,
                                         "keywords:existence#2": 1.0, "change_case:english_lowercase": 1.0}}}]}


def test_held_out_pass_counts_and_the_span_read_share():
    counts = R.pass_counts(EVAL)
    assert counts == {"change_case:english_lowercase": [1, 1], "keywords:existence": [2, 2],
                      "punctuation:no_comma": [0, 1], "startend:end_checker": [1, 2]}
    assert C.span_read_share(counts) == pytest.approx(3 / 4)
    assert C.span_read_share(counts, C.GLOBAL) == pytest.approx(1 / 2)
    assert C.span_read_share({}) is None


def test_the_report_folders_are_what_tools_report_discovers(tmp_path):
    from recipe.mrtpo.tools.report.discovery import discover

    steps = {1: {"mrtpo/reward/startend:end_checker/mean": 0.25}, 2: {"mrtpo/reward/startend:end_checker/mean": 0.5}}
    R.write_report_folder(tmp_path / C.run_name("mrtpo", 3), "mrtpo", 3, steps, EVAL)
    warnings: list[str] = []
    train, evals = discover(tmp_path, None, warnings)
    assert warnings == []
    assert [(t.method, t.seed, sorted(t.steps)) for t in train] == [("mrtpo", 3, [1, 2])]
    assert [(e.method, e.seed, e.eval_task) for e in evals] == [("mrtpo", 3, "ifeval")]


def test_the_record_keeps_rewards_and_the_held_out_counts(tmp_path):
    steps = {1: {"mrtpo/reward/startend:end_checker/mean": 0.25, "timing_s/step": 90.0, "other/x": 1.0}}
    rec = R.record_of("gdpo", 5, {"ok": True, "key": "k", "key_parts": {"code": "c"}, "steps_logged": [1]}, 1, steps,
                      tmp_path, EVAL, None, {"train": 10.0})
    assert rec["ok"] and rec["heldout"]["span_read"] == pytest.approx(3 / 4)
    assert set(rec["metrics"]) == {"mrtpo/reward/startend:end_checker/mean", "timing_s/step"}
    assert rec["rollouts"] == {"1": None, "2": None}
    assert not R.record_of("gdpo", 5, {"ok": True}, 1, {}, tmp_path, None, None, {})["ok"]  # no held-out eval: not ok


def test_the_code_key_covers_the_if_verifier_the_grids_does_not():
    from experiments.format_speed.grid import CODE_EXCLUDE, code_fingerprint

    assert any(e.startswith(R.CODE_INCLUDE) for e in CODE_EXCLUDE)
    assert R.code_key() != code_fingerprint()["sha256"]
    json.dumps(C.DATA_ARGS)


def test_one_run_writes_its_record_and_refuses_to_mix_keys(tmp_path, monkeypatch):
    """``run`` end to end with verl, the export and the evaluations stubbed: the record, the report folders, and a
    committed record of another key refused (``--rerun-changed`` re-runs it)."""
    from types import SimpleNamespace

    import experiments.mini_credit.runs as mini_runs
    import recipe.mrtpo.cpu.smollm2 as smollm2
    import recipe.mrtpo.tools.export as export

    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"w")
    data = tmp_path / "out" / "data"
    data.mkdir(parents=True)
    for name in ("train", "test"):
        (data / f"{name}.parquet").write_bytes(name.encode())
    monkeypatch.setattr(smollm2, "require", lambda assets=None: model)
    monkeypatch.setattr(R, "code_key", lambda: "code1")
    monkeypatch.setattr(R, "evaluate", lambda *a, **k: EVAL)
    monkeypatch.setattr(R, "ifeval_data", lambda out, log=print: tmp_path / "ifeval.parquet")
    monkeypatch.setattr(export, "export_checkpoint", lambda *a, **k: {})
    ran = []

    def fake_verl(method, seed, overrides, model, run_dir, steps, timeout_s, info, **k):
        ran.append((method, seed))
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "main_mrtpo.log").write_text("step:1 - mrtpo/reward/startend:end_checker/mean:0.250 - timing_s/step:80.0\n")
        return {"ok": True, "key": "k1", "key_parts": k["key_parts"], "steps_logged": [1], "wall_s": 5.0, "log": "main_mrtpo.log"}

    monkeypatch.setattr(mini_runs, "run_verl", fake_verl)
    docs = tmp_path / "docs"
    ns = SimpleNamespace(out=tmp_path / "out", docs=docs, arm="mrtpo", seed=100, steps=1, retries=1, timeout=10.0,
                         no_lock=True, no_ifeval=False, rerun_changed=False, eval_backend="vllm")
    assert R.run_one(ns, log=lambda m: None) == 0 and ran == [("mrtpo", 100)]
    rec = json.loads((docs / "runs" / "mrtpo_seed100.json").read_text())
    assert rec["ok"] and rec["key_parts"]["code"] == "code1" and rec["heldout"]["span_read"] == pytest.approx(3 / 4)
    assert rec["metrics"]["mrtpo/reward/startend:end_checker/mean"] == {"1": 0.25} and rec["eval_backend"] == "vllm"
    name = C.run_name("mrtpo", 100)
    assert (docs / "report_runs" / name / "metrics.jsonl").is_file() and (docs / "report_heldout" / name / "eval" / "ifeval.json").is_file()
    monkeypatch.setattr(R, "code_key", lambda: "code2")
    ns.seed = 101
    assert R.main(["run", "--arm", "gdpo", "--seed", "101", "--out", str(tmp_path / "out"), "--docs", str(docs),
                   "--no-lock", "--steps", "1"]) == 2  # refused: the committed record ran code1
    assert ran == [("mrtpo", 100)]
    # the confirmatory set runs its own commit: the pilot's records (code1) do not refuse it; its own records do
    R.write_report_folder(docs / "report_runs" / C.BASE_NAME, "base", 0, {}, EVAL)
    assert R.main(["run", "--arm", "gdpo", "--seed", "0", "--out", str(tmp_path / "out"), "--docs", str(docs),
                   "--no-lock", "--steps", "1"]) == 0 and ran[-1] == ("gdpo", 0)
    # its report folders are its set's, apart from the pilot's, with the base model linked in (relative) only where
    # the base model's folder exists
    conf = docs / "confirmatory"
    assert (conf / "report_runs" / C.run_name("gdpo", 0) / "metrics.jsonl").is_file()
    assert not (docs / "report_runs" / C.run_name("gdpo", 0)).exists()
    link = conf / "report_runs" / C.BASE_NAME
    assert link.is_symlink() and not Path(os.readlink(link)).is_absolute() and (link / "eval" / "ifeval.json").is_file()
    assert not (conf / "report_heldout" / C.BASE_NAME).exists()
    assert A.load_records(docs)[("gdpo", 0)]["steps"][1]["mrtpo/reward/startend:end_checker/mean"] == pytest.approx(0.25)
    from recipe.mrtpo.tools.report.build import build_report

    seen = build_report(conf / "report_runs", tmp_path / "report")
    assert sorted((e["method"], e["seed"]) for e in seen["evals"]) == [("base", 0), ("gdpo", 0)]
    assert [(r["method"], r["seed"]) for r in seen["runs"]] == [("gdpo", 0)]  # the pilot's mrtpo seed 100 is not pooled
    monkeypatch.setattr(R, "code_key", lambda: "code3")
    assert R.main(["run", "--arm", "gdpo", "--seed", "1", "--out", str(tmp_path / "out"), "--docs", str(docs),
                   "--no-lock", "--steps", "1"]) == 2 and ran[-1] == ("gdpo", 0)
    assert R.stale_records(docs / "runs", 1, {"code": "code3"}) == ["gdpo_seed0"]
    monkeypatch.setattr(R, "code_key", lambda: "code2")
    ns.rerun_changed = True
    assert R.run_one(ns, log=lambda m: None) == 0 and ran[-1] == ("mrtpo", 101)
