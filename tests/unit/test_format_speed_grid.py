"""The format-speed grid's runner (experiments/format_speed/grid.py), its analysis (analysis.py) and the
instability measures (instability.py) on synthetic run records and a fake verl launch: the plan's numbers
re-computed directly here."""

import itertools
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from experiments.format_speed import analysis, grid, instability, stats


# ------------------------------------------------------------------ the grid
def test_the_grid_has_the_plans_arms_and_seeds_seed_major():
    runs = grid.planned_runs(list(grid.ARMS))
    assert len(runs) == 24 * 3 + 16 + 8 + 8 + 8 == 112
    assert runs[:7] == [(a, 0) for a in grid.ARMS]  # seed-major: an interrupted grid has whole seeds
    assert {s for a, s in runs if a == "shuffle"} == set(range(16))
    assert grid.ARMS["mrtpo-warmup10"][1] == 10 and "mrtpo.max_realloc_rms=0.5" in grid.ARMS["mrtpo-rho0.5"][2]
    assert "mrtpo.max_token_weight=3" in grid.ARMS["mrtpo-cap3"][2] and grid.SEEDS["mrtpo-cap3"] == tuple(range(8))
    assert grid.planned_runs(["mrtpo"], seeds=[0]) == [("mrtpo", 0)]
    with pytest.raises(grid.ExperimentError):
        grid.planned_runs(["nope"])


def test_the_code_fingerprint_follows_the_recipes_code_and_not_its_tools(tmp_path):
    for rel in ("recipe/mrtpo/core/a.py", "recipe/mrtpo/tools/report.py", "verl_patches/p.py", "docs/x.py",
                "recipe/mrtpo/methods/sdpo/loss.py", "recipe/mrtpo/agent/bfcl_loop.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    base = grid.code_fingerprint(tmp_path)
    assert base["files"] == 2  # core/a.py and the patch; the tools and docs are not the numbers' code
    (tmp_path / "recipe/mrtpo/tools/report.py").write_text("x = 2\n")
    assert grid.code_fingerprint(tmp_path)["sha256"] == base["sha256"]
    (tmp_path / "recipe/mrtpo/methods/sdpo/loss.py").write_text("x = 2\n")  # a method the grid never runs
    assert grid.code_fingerprint(tmp_path)["sha256"] == base["sha256"]
    (tmp_path / "recipe/mrtpo/core/a.py").write_text("x = 2\n")
    assert grid.code_fingerprint(tmp_path)["sha256"] != base["sha256"]


def _fake_run(calls):
    def run_cpu(module, overrides, out_dir, timeout_s, on_line=None):
        calls.append(list(overrides))
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "main_mrtpo.log").write_text("step:1 - mrtpo/reward/format/mean:0.5\n")
        return SimpleNamespace(timed_out=False, returncode=0, steps={1: {}}, wall_s=1.0, first_step_at_s=0.5,
                               peak_pss_gib=0.1, log_path=out_dir / "main_mrtpo.log", tail=lambda n: "")
    return run_cpu


def test_a_finished_run_is_kept_only_while_its_code_is_unchanged(tmp_path, monkeypatch):
    from experiments.mini_credit.runs import run_verl
    from recipe.mrtpo.cpu import launcher

    calls, logs = [], []
    monkeypatch.setattr(launcher, "run_cpu", _fake_run(calls))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.safetensors").write_bytes(b"w")
    args = ("mrtpo", 0, ["a=1"], tmp_path / "model", tmp_path / "run", 1, 10.0, {"method": "mrtpo"})
    r1 = run_verl(*args, log=logs.append, key_parts={"code": "c1", "data": "d1"})
    assert r1["ok"] and r1["key_parts"] == {"code": "c1", "data": "d1"} and len(calls) == 1
    run_verl(*args, log=logs.append, key_parts={"code": "c1", "data": "d1"})
    assert len(calls) == 1 and "kept" in logs[-1]  # same key: not re-run
    r3 = run_verl(*args, log=logs.append, key_parts={"code": "c2", "data": "d1"})
    assert len(calls) == 2 and r3["key"] != r1["key"]
    assert any("code changed" in m for m in logs)
    # without key parts the key is the one the stored control runs were keyed by
    import hashlib

    from data_prep.common import sha256_file
    old = run_verl(*args[:4], tmp_path / "run_old", *args[5:], log=logs.append)
    assert old["key"] == hashlib.sha256(json.dumps([["a=1"], sha256_file(tmp_path / "model" / "model.safetensors")])
                                        .encode()).hexdigest()[:16]
    # an ablation's lines name its arm, the folder's name, not the method it runs
    run_verl(*args[:4], tmp_path / "run_arm", *args[5:7], {"method": "mrtpo", "arm": "mrtpo-warmup10"}, log=logs.append)
    assert any("mrtpo-warmup10 seed 0: starting verl" in m for m in logs)


def test_a_committed_record_stands_for_its_run_across_sessions(tmp_path, monkeypatch):
    """The run folders die with a session; the committed record (grid.export_run) is kept when it finished under
    the run's key, and never rewritten from a run folder that is not there."""
    from experiments.mini_credit.runs import run_verl
    from recipe.mrtpo.cpu import launcher

    calls, logs = [], []
    monkeypatch.setattr(launcher, "run_cpu", _fake_run(calls))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.safetensors").write_bytes(b"w")
    args = ("mrtpo", 0, ["a=1"], tmp_path / "model", tmp_path / "run", 1, 10.0, {"method": "mrtpo"})
    first = run_verl(*args, log=logs.append, key_parts={"code": "c1"})
    rec = json.loads(grid.export_run(tmp_path / "run", "mrtpo", 0, first, tmp_path / "docs").read_text())
    assert grid.committed_record(tmp_path / "docs", "mrtpo", 0) == rec
    import shutil

    shutil.rmtree(tmp_path / "run")  # a new session: the run folder is gone, the record is committed
    kept = run_verl(*args, log=logs.append, key_parts={"code": "c1"}, prior=rec)
    assert kept is rec and len(calls) == 1 and "earlier session" in logs[-1]
    rerun = run_verl(*args, log=logs.append, key_parts={"code": "c2"}, prior=rec)  # the code changed: run again
    assert rerun is not rec and len(calls) == 2
    # the checkout's place is not part of a grid run's key (the runs live under the checkout)
    from experiments.mini_credit import runs as mc

    here = run_verl("mrtpo", 0, [f"m={mc.REPO}/outputs/x"], *args[3:], log=logs.append, key_parts={"code": "c1"})
    monkeypatch.setattr(mc, "REPO", Path("/elsewhere/checkout"))
    there = run_verl("mrtpo", 0, ["m=/elsewhere/checkout/outputs/x"], *args[3:], log=logs.append, key_parts={"code": "c1"})
    assert there["key"] == here["key"] and len(calls) == 3  # and its result.json kept it: not run again
    failed = dict(rec, ok=False)
    assert run_verl(*args, log=logs.append, key_parts={"code": "c1"}, prior=failed) is not failed and len(calls) == 4
    (tmp_path / "docs" / "mrtpo_seed1.json").write_text("{not json")
    assert grid.committed_record(tmp_path / "docs", "mrtpo", 1) is None
    assert grid.committed_record(tmp_path / "docs", "gdpo", 0) is None


def test_rollout_digest_ignores_verls_uid_order(tmp_path):
    rows = [{"input": "p", "output": o, "score": s, "uid": u} for o, s, u in (("a", 1.0, "x"), ("b", 0.0, "y"))]
    (tmp_path / "1.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (tmp_path / "2.jsonl").write_text("\n".join(json.dumps(dict(r, uid=r["uid"] * 2)) for r in reversed(rows)))
    assert grid.rollout_digest(tmp_path / "1.jsonl") == grid.rollout_digest(tmp_path / "2.jsonl")
    rows[0]["output"] = "c"
    (tmp_path / "3.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    assert grid.rollout_digest(tmp_path / "3.jsonl") != grid.rollout_digest(tmp_path / "1.jsonl")
    assert grid.rollout_digest(tmp_path / "none.jsonl") is None


def test_export_run_writes_the_committable_record(tmp_path):
    run = tmp_path / "mrtpo_seed3"
    (run / "rollouts").mkdir(parents=True)
    (run / "main_mrtpo.log").write_text("step:1 - mrtpo/reward/format/mean:0.5 - actor/grad_norm:0.2 - timing_s/gen:3\n"
                                        "step:2 - mrtpo/reward/format/mean:0.75 - actor/grad_norm:0.4\n")
    (run / "rollouts" / "1.jsonl").write_text(json.dumps({"input": "p", "output": "o", "score": 1.0}))
    res = {"ok": True, "key": "k", "key_parts": {"code": "c"}, "wall_s": 5.0, "steps_logged": [1, 2], "log": "main_mrtpo.log"}
    rec = json.loads(grid.export_run(run, "mrtpo", 3, res, tmp_path / "out").read_text())
    assert rec["metrics"]["mrtpo/reward/format/mean"] == {"1": 0.5, "2": 0.75} and "timing_s/gen" not in rec["metrics"]
    assert rec["rollouts"]["1"] is not None and rec["rollouts"]["2"] is None and rec["key_parts"] == {"code": "c"}


# ------------------------------------------------------------------ the analysis
def record(arm, seed, fmt, cor=None, digest="same", ok=True):
    metrics = {analysis.FORMAT_KEY: {str(k + 1): v for k, v in enumerate(fmt)}}
    if cor is not None:
        metrics[analysis.CORRECTNESS_KEY] = {str(k + 1): v for k, v in enumerate(cor)}
    return {"arm": arm, "seed": seed, "ok": ok, "key": f"{arm}{seed}", "key_parts": {"code": "c"},
            "rollouts": {"1": f"{digest}{seed}"}, "metrics": metrics}


def ramp(reach: int, steps: int = 10) -> list[float]:
    """A format curve whose 3-step running mean first reaches 0.8 at ``reach`` (never when reach > steps)."""
    return [0.9 if k + 1 >= reach - 2 else 0.3 for k in range(steps)]


def test_run_endpoints_are_the_plans_definitions():
    fmt = ramp(6)
    e = analysis.run_endpoints(record("mrtpo", 0, fmt, [1.0] * 3 + [2.0] * 7), steps=10)
    assert e["T"] == 6 and not e["censored"] and e["auc"] == pytest.approx(sum(fmt) / 10)
    assert e["correctness_gain"] == pytest.approx(1.0)
    e = analysis.run_endpoints(record("mrtpo", 0, [0.3] * 10), steps=10)
    assert e["T"] == 11 and e["censored"]
    assert analysis.run_endpoints(record("mrtpo", 0, [0.3] * 9), steps=10)["failed"]  # a step missing
    assert analysis.run_endpoints(record("mrtpo", 0, [0.3] * 10, ok=False), steps=10)["failed"]


def grid_records(gdpo_digest="same"):
    reach = {"mrtpo": [4, 5, 6, 11], "gdpo": [6, 8, 7, 9], "grpo": [7, 7, 9, 11], "shuffle": [9, 6, 11, 8]}
    recs = {}
    for arm, ts in reach.items():
        for s, t in enumerate(ts):
            recs[(arm, s)] = record(arm, s, ramp(t), [0.0] * 10, digest=gdpo_digest if arm == "gdpo" else "same")
    return recs, reach


def test_the_primary_comparison_is_paired_exact_and_the_family_holm_adjusted():
    recs, reach = grid_records()
    res = analysis.analyse(recs, steps=10)
    p = res["primary"]
    d = [a - b for a, b in zip(reach["mrtpo"], reach["gdpo"])]
    brute = sum(abs(sum(e * x for e, x in zip(sg, d))) >= abs(sum(d)) for sg in itertools.product((1, -1), repeat=4)) / 16
    assert p["test"].startswith("exact paired") and p["n"] == 4 and p["diff"] == pytest.approx(sum(d) / 4)
    assert p["p"] == pytest.approx(brute) and p["ci"] == pytest.approx(stats.bootstrap_interval(d))
    assert p["censored"] == [1, 0]
    raw = [c["p"] for c in res["family"]]
    assert [c["p_holm"] for c in res["family"]] == pytest.approx(stats.holm(raw))
    assert [(c["a"], c["b"]) for c in res["family"]] == list(analysis.FAMILY)
    assert res["auc_secondary"]["endpoint"] == "auc"
    md = analysis.render(res)
    assert "**Primary** (MRTPO - GDPO" in md and "p (Holm)" in md and "| mrtpo | 4 | 5 | 6 | 11 |" in md


def test_seeds_that_did_not_sample_the_same_first_batch_are_compared_unpaired():
    recs, reach = grid_records(gdpo_digest="other")
    p = analysis.analyse(recs, steps=10)["primary"]
    assert p["test"] == "exact unpaired permutation" and "differ" in p["pairing"]
    assert p["p"] == pytest.approx(stats.unpaired_permutation_p(reach["mrtpo"], reach["gdpo"])["p"])


def test_a_failed_run_leaves_its_seed_out_of_that_arms_comparisons():
    recs, _ = grid_records()
    recs[("gdpo", 3)]["ok"] = False
    res = analysis.analyse(recs, steps=10)
    assert res["primary"]["n"] == 3 and res["per_run"]["gdpo_seed3"]["failed"]
    assert "Failed runs: gdpo_seed3" in analysis.render(res)


def test_the_command_writes_the_json_and_the_tables(tmp_path):
    recs, _ = grid_records()
    (tmp_path / "runs").mkdir()
    for (arm, s), r in recs.items():
        (tmp_path / "runs" / f"{arm}_seed{s}.json").write_text(json.dumps(r))
    assert analysis.main(["--records", str(tmp_path / "runs"), "--out", str(tmp_path), "--steps", "10"]) == 0
    out = json.loads((tmp_path / "per_seed.json").read_text())
    assert out["per_run"]["mrtpo_seed0"]["T"] == 4 and (tmp_path / "analysis.md").is_file()
    assert (tmp_path / "instability.md").read_text().startswith("# Format speed: the instability")


# ------------------------------------------------------------------ the instability
def test_spikes_drops_and_precedence_on_a_synthetic_run():
    grad = {k: 1.0 for k in range(1, 13)}
    grad[6] = 5.0  # a spike (5 > 2 x median 1)
    cor = {k: 2.5 for k in range(1, 13)}
    cor[8] = 1.0  # a drop two steps after the spike: preceded
    cor[12] = 1.0  # a drop with no spike before it
    assert instability.spikes(grad) == [6]
    assert instability.drops(cor) == [8, 12]
    assert instability.preceded([8, 12], [6]) == 1
    # of the steps 4..12, those with a spike at j-1 or j-2: 7 and 8
    assert instability.base_rate(list(cor), [6]) == pytest.approx(2 / 9)
    rec = {"arm": "mrtpo", "seed": 0, "ok": True, "metrics": {
        "actor/grad_norm": {str(k): v for k, v in grad.items()}, instability.CORRECTNESS: {str(k): v for k, v in cor.items()},
        "critic/advantages/max": {"1": 2.0, "2": 11.5}, "critic/advantages/min": {"1": -13.0, "2": -3.0},
        "mrtpo/adv_top_share_max": {"1": 0.4, "2": 0.9}, "mrtpo/adv_top_share_mean": {"1": 0.1, "2": 0.3, "3": float("nan")},
        "actor/pg_clipfrac": {"1": 0.0, "2": 0.5}}}
    r = instability.run_instability(rec)
    assert r["max_abs_adv"] == 13.0 and r["top_share_max"] == 0.9 and r["clipfrac_mean"] == 0.25
    assert r["top_share_mean"] == pytest.approx(0.2)  # the mean over steps of the per-response mean; NaN steps left out
    assert r["drops_after_spike"] == 1 and r["grad_norm_max"] == 5.0
    table = instability.render_instability({"mrtpo_seed0": r})
    assert "| mrtpo | 1 | 13.00 (13.00) | 0.200 (0.200) | 90% (90%) |" in table and "| 0.200 / 90% |" in table


def test_format_floor_sees_a_format_learned_then_lost():
    fmt = dict(enumerate([0.1, 0.1, 0.1, 0.9, 0.9, 0.9, 0.6, 0.6, 0.6, 0.9], start=1))
    # running means from step 3: 0.1, 0.37, 0.63, 0.9 (step 6: reached), 0.8, 0.7, 0.6 (step 9), 0.7: held
    step, floor = instability.format_floor(fmt)
    assert (step, round(floor, 6)) == (9, 0.6)
    fmt.update({8: 0.3, 9: 0.3})  # then 0.8, 0.6, 0.4 (step 9), 0.5: lost
    step, floor = instability.format_floor(fmt)
    assert (step, round(floor, 6)) == (9, 0.4)
    assert instability.format_floor({k: 0.5 for k in range(1, 11)}) is None  # never reached
    assert instability.format_floor({**{k: 0.0 for k in range(1, 8)}, 8: 1.0, 9: 1.0, 10: 1.0}) is None  # reached last
    rec = {"arm": "mrtpo", "seed": 1, "ok": True, "metrics": {instability.FORMAT: {str(k): v for k, v in fmt.items()}}}
    r = instability.run_instability(rec)
    assert r["format_lost"] and r["format_floor_step"] == 9
    held = dict(rec, seed=2, metrics={instability.FORMAT: {str(k): 0.9 for k in range(1, 11)}})
    table = instability.render_instability({"a": r, "b": instability.run_instability(held)})
    assert "| 1 of 2 |" in table and "0.40 (9) lost" in table and "0.90 (4) |" in table


def test_the_warm_start_is_the_committed_one_in_every_session(tmp_path):
    """The first session commits the warm start it built; a later one starts from it (its preparation finds it
    cached) and refuses to run on other weights."""
    committed, logs = tmp_path / "docs" / "warm_start", []

    def build_into(sft_dir, weights):
        def build():
            if not (sft_dir / "model.safetensors").is_file():  # the SFT's own cache: kept when present
                sft_dir.mkdir(parents=True, exist_ok=True)
                (sft_dir / "model.safetensors").write_bytes(weights)
                (sft_dir / ".format-speed-sft-key").write_text("k\n")
        return build

    first = tmp_path / "session1" / "sft_model"
    h1 = grid.pin_warm_start(committed, first, build_into(first, b"weights of machine 1"), logs.append)
    assert (committed / "model.safetensors").read_bytes() == b"weights of machine 1" and "commit it" in logs[-1]
    assert (committed / ".format-speed-sft-key").is_file()
    second = tmp_path / "session2" / "sft_model"  # a fresh machine: its SFT would build other weights
    assert grid.pin_warm_start(committed, second, build_into(second, b"weights of machine 2"), logs.append) == h1
    assert (second / "model.safetensors").read_bytes() == b"weights of machine 1"
    third = tmp_path / "session3" / "sft_model"  # a preparation that rebuilds anyway (its key changed) is refused
    with pytest.raises(grid.ExperimentError, match="not the committed one"):
        grid.pin_warm_start(committed, third, lambda: (third.mkdir(parents=True, exist_ok=True),
                                                       (third / "model.safetensors").write_bytes(b"other")), logs.append)


def test_records_of_other_code_are_named_before_a_grid_would_rerun_them(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    for name, parts, ok in (("grpo_seed0", {"code": "c1", "data": "d1"}, True), ("gdpo_seed0", {"code": "c0", "data": "d1"}, True),
                            ("mrtpo_seed0", {"code": "c0", "data": "d1"}, False)):
        (runs / f"{name}.json").write_text(json.dumps({"ok": ok, "key_parts": parts}))
    (runs / "broken_seed1.json").write_text("{")
    assert grid.stale_records(runs, {"code": "c1", "data": "d1"}) == {"code c0": ["gdpo_seed0"]}  # a failed run is re-run anyway
    assert grid.stale_records(runs, {"code": "c0", "data": "d2"}) == {"code c1": ["grpo_seed0"],
                                                                      "data d1": ["gdpo_seed0", "grpo_seed0"]}
    assert grid.stale_records(tmp_path / "none", {"code": "c1"}) == {}


def test_the_key_parts_hold_the_warm_start_and_records_of_another_are_named(tmp_path):
    """A grid on another warm start (same code, same RL data) names the records it would re-run: the key parts hold
    the weights' hash, and a record from before that (no warm_start part) is another warm start's too."""
    import hashlib

    data, weights = tmp_path / "train.parquet", tmp_path / "docs" / "warm_start" / "model.safetensors"
    data.write_bytes(b"rows")
    sft = tmp_path / "sft_model"
    pinned = grid.pin_warm_start(weights.parent, sft, lambda: (sft.mkdir(exist_ok=True),
                                 (sft / "model.safetensors").write_bytes(b"weights")), lambda m: None)
    parts = grid.key_parts(data, pinned)
    assert parts["warm_start"] == hashlib.sha256(b"weights").hexdigest()[:16]
    assert parts["data"] == hashlib.sha256(b"rows").hexdigest()[:16] and "warm_start" not in grid.key_parts(data)
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "grpo_seed0.json").write_text(json.dumps({"ok": True, "key_parts": {**parts, "warm_start": "other"}}))
    (runs / "gdpo_seed0.json").write_text(json.dumps({"ok": True, "key_parts": {"code": parts["code"], "data": parts["data"]}}))
    (runs / "mrtpo_seed0.json").write_text(json.dumps({"ok": True, "key_parts": parts}))
    assert grid.stale_records(runs, parts) == {"warm_start other": ["grpo_seed0"], "warm_start None": ["gdpo_seed0"]}


def test_the_grid_warm_start_follows_the_plans_demonstrations(monkeypatch):
    """The grid's warm start is built from demonstrations that follow the response instruction at the plan's rate
    (grid.P_FOLLOW_RESPONSE, 0.4 since the 2026-12-03 amendment), not the data builder's default (the pilot's 0.2)."""
    from data_prep import format_speed as builder

    a = SimpleNamespace(n_sft=4000, sft_gold_steps=None, sft_demo_steps=None, sft_full_steps=None)
    ns = grid._warm_start_args(a)
    assert ns.p_follow_response == grid.P_FOLLOW_RESPONSE == 0.4 != builder.P_FOLLOW_RESPONSE
    assert ns.p_follow_call == builder.P_FOLLOW_CALL and ns.p_arg == builder.P_ARG
    assert "2026-12-03" in (grid.REPO / "docs" / "format_speed" / "analysis_plan.md").read_text()


def test_the_grid_refuses_to_void_committed_records_unless_told(tmp_path, monkeypatch):
    from experiments.format_speed import runs as fs_runs

    docs = tmp_path / "docs"
    (docs / "runs").mkdir(parents=True)
    (docs / "runs" / "grpo_seed0.json").write_text(json.dumps({"ok": True, "key_parts": {"code": "old", "data": "d", "warm_start": "w"}}))
    monkeypatch.setattr(grid, "pin_warm_start", lambda *a, **k: "w")
    monkeypatch.setattr(grid, "key_parts", lambda data, warm_start=None: {"code": "new", "data": "d", "warm_start": "w"})
    ran = []
    monkeypatch.setattr(fs_runs, "run_method", lambda method, seed, *a, **k: ran.append((method, seed)) or {"ok": True})
    ns = SimpleNamespace(out=tmp_path / "out", docs=docs, arms=["grpo"], seeds=[0], dry_run=False, no_lock=True,
                         steps=2, retries=1, timeout=10.0, n_sft=4, sft_gold_steps=1, sft_demo_steps=1, sft_full_steps=1,
                         rerun_changed=False)
    with pytest.raises(grid.ExperimentError, match="--rerun-changed") as e:
        grid.run_grid(ns, log=lambda m: None)
    assert "1 under code old (grpo_seed0)" in str(e.value) and ran == []
    ns.rerun_changed = True
    assert grid.run_grid(ns, log=lambda m: None) == 0 and ran == [("grpo", 0)]


def test_a_p_value_below_the_fourth_decimal_is_printed_not_rounded_to_zero():
    assert analysis.format_p(0.03125) == "0.0312" and analysis.format_p(1e-4) == "0.0001"
    smallest = 2 / 2 ** 24  # the exact paired sign-flip test's smallest p at 24 seeds
    assert analysis.format_p(smallest) == "1.2e-07" and float(analysis.format_p(smallest)) > 0


def _rollout(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"output": o, "gts": {"answer": a}}) + "\n" for o, a in rows))


def test_response_block_rate_counts_only_the_rows_whose_reference_has_the_block(tmp_path):
    from experiments.format_speed import response_block as rb

    want, call = "<tool_call>x</tool_call>\n<response>y</response>", "<tool_call>x</tool_call>"
    for k in range(1, 13):  # steps 1-2 emit the block for half the wanted rows, then never
        emitted = "<response>y</response>" if k <= 2 else ""
        _rollout(tmp_path / "runs" / "a_seed0" / "rollouts" / f"{k}.jsonl",
                 [(emitted, want), ("", want), ("<response>stray</response>", call)])
        _rollout(tmp_path / "runs" / "b_seed0" / "rollouts" / f"{k}.jsonl", [("<response>y</response>", want)])
    (tmp_path / "runs" / "c_seed0" / "rollouts").mkdir(parents=True)  # no rollout files: left out
    rates = rb.run_rates(tmp_path / "runs" / "a_seed0", 12)
    assert rates[:2] == [0.5, 0.5] and rates[2:] == [0.0] * 10  # the stray block under `call` is not counted
    s = rb.summary(rates)
    assert s["unlearned"] and s["first5"] == pytest.approx(0.2) and s["min_after5"] == 0.0
    assert rb.summary(rb.run_rates(tmp_path / "runs" / "b_seed0", 12))["unlearned"] is False
    out = rb.table(tmp_path / "runs", steps=12)
    assert "| a_seed0 | 0.20 | 0.00 | 0.00 | yes |" in out and "| b_seed0 | 1.00 | 1.00 | 1.00 | no |" in out
    assert "c_seed0" not in out
