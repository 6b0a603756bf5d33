"""One run of the real-model learning experiment, from the data to its committed record, and the ``plan`` check.

``run --arm A --seed S``: builds the data once (``OUT/data``: train and held-out), runs verl's loop through
``python -m recipe.mrtpo.main_mrtpo`` (:func:`experiments.mini_credit.runs.run_verl`: resumable by key, under the
machine-wide lock), exports the step-``STEPS`` checkpoint, evaluates it on the held-out rows and on IFEval with
``python -m recipe.mrtpo.tools.eval`` and writes, under ``--docs`` (``docs/real_model_learning``):

- ``runs/<arm>_seed<s>.json``: the record (key and its parts, attempts, walls, per-step metrics, the held-out
  pass counts per constraint, IFEval's metrics, the step-1 and step-2 rollout digests that show the pairing);
- ``report_runs/<run name>/``: ``run.json``, ``metrics.jsonl`` (verl's file-logger shape) and ``eval/ifeval.json``,
  ``tools.report``'s input for the paper's table and the curves;
- ``report_heldout/<run name>/``: ``run.json`` and ``eval/ifeval.json`` of the held-out rows;
- the confirmatory seeds' two report folders under ``confirmatory/`` instead, with the base model's linked in: one
  ``tools.report`` over a set's folder never pools the pilot's runs with the confirmatory set's.

A run whose committed record finished under the same key is kept; records of another key (code, data, weights) are
refused rather than mixed (``--rerun-changed`` re-runs them).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from experiments.mini_credit.common import REPO, ExperimentError
from experiments.real_model_learning import settings as C

LOG_PREFIX = "[real-model-learning]"
DOCS = REPO / "docs" / "real_model_learning"
#: the per-step metrics a record keeps besides every ``mrtpo/reward/<id>/mean``
RECORD_METRICS = ("critic/score/mean", "actor/grad_norm", "actor/pg_clipfrac", "actor/ppo_kl", "response_length/mean",
                  "mrtpo/beta", "mrtpo/adv_max_abs", "mrtpo/weight_max", "mrtpo/replay_time_s", "timing_s/step")
#: the verifier this experiment's rewards run: unlike the format-speed grid's key, its code is part of the key
CODE_INCLUDE = ("recipe/mrtpo/tasks/instruction_following.py", "recipe/mrtpo/tasks/if_")


def code_key() -> str:
    """The hash of the code that computes a run's numbers: the grid's fingerprint with the IF verifier kept in."""
    from experiments.format_speed.grid import CODE_EXCLUDE, code_fingerprint

    return code_fingerprint(exclude=tuple(e for e in CODE_EXCLUDE if not e.startswith(CODE_INCLUDE)))["sha256"]


def build_data(out: Path, log=print) -> tuple[Path, Path]:
    """(train.parquet, held-out test.parquet) under ``out/data``, built once with the plan's arguments."""
    data = Path(out) / "data"
    if not (data / "train.parquet").is_file() or not (data / "test.parquet").is_file():
        cmd = [sys.executable, "-m", "data_prep.instruction_following", "train", "--out-dir", str(data), *C.DATA_ARGS]
        log(f"{LOG_PREFIX} $ {' '.join(cmd)}")
        r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if r.returncode != 0:
            raise ExperimentError(f"building the data failed:\n{r.stderr[-2000:]}")
    return data / "train.parquet", data / "test.parquet"


def key_parts(train: Path, model: Path) -> dict:
    from data_prep.common import sha256_file

    return {"code": code_key(), "data": sha256_file(train)[:16], "weights": sha256_file(Path(model) / "model.safetensors")[:16]}


def pass_counts(eval_json: dict) -> dict[str, list[int]]:
    """Per instruction id of an IF eval result: [passed, total] over its items (strict)."""
    out: dict[str, list[int]] = {}
    for item in eval_json.get("items") or []:
        for iid, ok in ((item.get("scores") or {}).get("strict") or {}).items():
            c = out.setdefault(iid.split("#", 1)[0], [0, 0])  # a repeated id is scored as "<id>#2"
            c[0] += int(bool(ok))
            c[1] += 1
    return dict(sorted(out.items()))


#: tools.eval's vLLM engine on CPU: the share of memory it may reserve (the rollout's, ``cpu_overrides``); its default
#: 0.9 is refused on a machine where other processes hold memory
VLLM_CPU_MEMORY = "0.3"


def evaluate(model: Path, data: Path, out: Path, tokens: int, backend: str = "vllm", log=print) -> dict:
    """``python -m recipe.mrtpo.tools.eval --task ifeval`` of ``model`` on ``data`` (greedy, fp32) into ``out``, in the
    CPU runs' environment (``cpu_env``: vLLM's fixed KV cache, no thread pinning); returns the result."""
    from recipe.mrtpo.cpu.runtime import cpu_env

    argv = ["--task", "ifeval", "--model", str(model), "--data", str(data), "--max-new-tokens", str(tokens),
            "--backend", backend, "--dtype", "float32", "--overwrite", "--out", str(out)]
    if backend == "vllm":
        argv += ["--gpu-memory-utilization", VLLM_CPU_MEMORY]
    log(f"{LOG_PREFIX} $ python -m recipe.mrtpo.tools.eval {' '.join(argv)}")
    r = subprocess.run([sys.executable, "-m", "recipe.mrtpo.tools.eval", *argv], cwd=REPO, env=cpu_env(REPO))
    if r.returncode != 0:
        raise ExperimentError(f"evaluating {model} on {data} failed (exit {r.returncode}; its output above)")
    return json.loads(Path(out).read_text())


def write_report_folder(folder: Path, arm: str, seed: int, steps: dict, eval_json: Optional[dict]) -> None:
    """What ``tools.report`` reads for one run: run.json, metrics.jsonl (verl's file-logger lines), eval/ifeval.json."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "run.json").write_text(json.dumps({"method": arm, "task": C.TASK, "seed": seed, "model": C.MODEL_NAME}) + "\n")
    if steps:
        (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": k, "data": v}) + "\n" for k, v in sorted(steps.items())))
    if eval_json is not None:
        (folder / "eval").mkdir(exist_ok=True)
        (folder / "eval" / "ifeval.json").write_text(json.dumps(eval_json, indent=0) + "\n")


def link_base(docs: Path, kind: str, seed: int) -> None:
    """Link the base model's report folder into the confirmatory set's (relative, so that the link survives a
    clone): its table shows the reference line without a second copy of the base model's files."""
    root, target = C.report_folder(docs, kind, seed), Path(docs) / kind / C.BASE_NAME
    link = root / C.BASE_NAME
    if root != Path(docs) / kind and target.is_dir() and not (link.exists() or link.is_symlink()):
        link.symlink_to(os.path.relpath(target, root), target_is_directory=True)


def record_of(arm: str, seed: int, result: dict, attempts: int, steps: dict, run_dir: Path, heldout: Optional[dict],
              ifeval: Optional[dict], walls: dict) -> dict:
    from experiments.format_speed.grid import rollout_digest

    keep = [m for m in sorted({k for v in steps.values() for k in v}) if m in RECORD_METRICS
            or (m.startswith("mrtpo/reward/") and m.endswith("/mean"))]
    counts = pass_counts(heldout) if heldout else {}
    return {"arm": arm, "seed": seed, "ok": bool(result.get("ok")) and heldout is not None, "attempts": attempts,
            "key": result.get("key"), "key_parts": result.get("key_parts"), "walls_s": walls,
            "steps_logged": result.get("steps_logged"),
            "rollouts": {str(k): rollout_digest(Path(run_dir) / "rollouts" / f"{k}.jsonl") for k in (1, 2)},
            "metrics": {m: {str(k): v[m] for k, v in sorted(steps.items()) if m in v} for m in keep},
            "heldout": {"by_instruction": counts, "span_read": C.span_read_share(counts),
                        "global": C.span_read_share(counts, C.GLOBAL), "metrics": (heldout or {}).get("metrics")},
            "ifeval": (ifeval or {}).get("metrics")}


def stale_records(runs: Path, seed: int, parts: dict) -> list[str]:
    """The finished records of ``seed``'s set (the pilot's seeds, or the confirmatory set's) whose key parts are not
    ``parts``: a set runs one commit, and the pilot's commit need not be the confirmatory set's (the plan)."""
    pilot = seed in C.PILOT_SEEDS
    out = []
    for p in sorted(Path(runs).glob("*.json")):
        rec = json.loads(p.read_text())
        if rec.get("ok") and (rec.get("seed") in C.PILOT_SEEDS) == pilot and rec.get("key_parts") != parts:
            out.append(p.stem)
    return out


def run_one(a, log=print) -> int:
    from experiments.format_speed.grid import committed_record
    from experiments.format_speed.runs import heavy_lock
    from experiments.mini_credit.runs import run_verl
    from recipe.mrtpo.cpu import smollm2
    from recipe.mrtpo.tools.export import export_checkpoint
    from recipe.mrtpo.tools.verl_log import parse_console_log

    out, docs = Path(a.out).resolve(), Path(a.docs)
    model = smollm2.require()
    train, heldout_data = build_data(out, log)
    parts = key_parts(train, model)
    stale = stale_records(docs / "runs", a.seed, parts)
    if stale and not a.rerun_changed:
        raise ExperimentError(f"committed records ran another code, data or model than this checkout's ({parts}): "
                              f"{stale[:5]}; run from a checkout of their commit, or pass --rerun-changed")
    name, run_dir = C.run_name(a.arm, a.seed), out / "runs" / C.run_name(a.arm, a.seed)
    overrides = C.run_overrides(a.arm, a.seed, model, train, run_dir, a.steps)
    prior = committed_record(docs / "runs", a.arm, a.seed)
    t0, attempts, res = time.monotonic(), 0, {"ok": False}
    while attempts < a.retries and not res["ok"]:
        attempts += 1
        res = run_verl(a.arm, a.seed, overrides, model, run_dir, a.steps, a.timeout,
                       {"method": a.arm, "task": C.TASK, "seed": a.seed, "model": C.MODEL_NAME}, log=log,
                       prefix=LOG_PREFIX, lock=(lambda: heavy_lock(log=log)) if not a.no_lock else None,
                       key_parts=parts, prior=prior)
    if res is prior:
        return 0
    walls = {"train": res.get("wall_s")}
    log_path = run_dir / str(res.get("log") or "main_mrtpo.log")
    steps = parse_console_log(log_path.read_text(errors="replace"))[0] if log_path.is_file() else {}
    heldout = ifeval = None
    if res["ok"]:
        t1 = time.monotonic()
        export_checkpoint(run_dir / "checkpoints", run_dir / "model_trained", a.steps, overwrite=True)
        heldout = evaluate(run_dir / "model_trained", heldout_data, run_dir / "eval_heldout" / "ifeval.json",
                           C.RESPONSE_LENGTH, a.eval_backend, log)
        walls["heldout_eval"] = time.monotonic() - t1
        if not a.no_ifeval:
            t2 = time.monotonic()
            ifeval = evaluate(run_dir / "model_trained", ifeval_data(out, log), run_dir / "eval" / "ifeval.json",
                              C.IFEVAL_TOKENS, a.eval_backend, log)
            walls["ifeval_eval"] = time.monotonic() - t2
    walls["total"] = time.monotonic() - t0
    record = {**record_of(a.arm, a.seed, res, attempts, steps, run_dir, heldout, ifeval, walls), "eval_backend": a.eval_backend}
    (docs / "runs").mkdir(parents=True, exist_ok=True)
    (docs / "runs" / f"{a.arm}_seed{a.seed}.json").write_text(json.dumps(record, indent=1) + "\n")
    for kind, run_steps, result in (("report_runs", steps, ifeval), ("report_heldout", {}, heldout)):
        write_report_folder(C.report_folder(docs, kind, a.seed) / name, a.arm, a.seed, run_steps, result)
        link_base(docs, kind, a.seed)
    log(f"{LOG_PREFIX} {name}: {'finished' if record['ok'] else 'FAILED'} (attempts {attempts}); held-out span-read "
        f"{record['heldout']['span_read']}; record {docs / 'runs' / (a.arm + '_seed' + str(a.seed) + '.json')}")
    return 0 if record["ok"] else 1


def evaluate_base(a, log=print) -> int:
    """The initial model on the held-out rows and IFEval, once: ``--docs``/base.json and the report folders (method
    ``base``), the reference line beside the arms."""
    from recipe.mrtpo.cpu import smollm2

    out, docs = Path(a.out).resolve(), Path(a.docs)
    model = smollm2.require()
    train, heldout_data = build_data(out, log)
    heldout = evaluate(model, heldout_data, out / "base" / "eval_heldout" / "ifeval.json", C.RESPONSE_LENGTH, a.eval_backend, log)
    ifeval = None if a.no_ifeval else evaluate(model, ifeval_data(out, log), out / "base" / "eval" / "ifeval.json",
                                                  C.IFEVAL_TOKENS, a.eval_backend, log)
    counts = pass_counts(heldout)
    record = {"model": C.MODEL_NAME, "weights": key_parts(train, model)["weights"], "eval_backend": a.eval_backend,
              "heldout": {"by_instruction": counts, "span_read": C.span_read_share(counts),
                          "global": C.span_read_share(counts, C.GLOBAL), "metrics": heldout.get("metrics")},
              "ifeval": (ifeval or {}).get("metrics")}
    docs.mkdir(parents=True, exist_ok=True)
    (docs / "base.json").write_text(json.dumps(record, indent=1) + "\n")
    write_report_folder(docs / "report_runs" / C.BASE_NAME, "base", 0, {}, ifeval)
    write_report_folder(docs / "report_heldout" / C.BASE_NAME, "base", 0, {}, heldout)
    log(f"{LOG_PREFIX} base: held-out span-read {record['heldout']['span_read']}, global {record['heldout']['global']}")
    return 0


def ifeval_data(out: Path, log=print) -> Path:
    """IFEval's 541 prompts as a verl parquet under ``out/data/ifeval`` (built once)."""
    path = Path(out) / "data" / "ifeval" / "test.parquet"
    if not path.is_file():
        cmd = [sys.executable, "-m", "data_prep.instruction_following", "eval", "--benchmark", "ifeval", "--out-dir", str(path.parent)]
        log(f"{LOG_PREFIX} $ {' '.join(cmd)}")
        r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if r.returncode != 0:
            raise ExperimentError(f"building the IFEval set failed:\n{r.stderr[-2000:]}")
    return path


def print_summary(a, log=print) -> int:
    """``summary``: :func:`experiments.real_model_learning.analysis.summary` of ``--docs`` as JSON."""
    from experiments.real_model_learning.analysis import summary

    log(json.dumps(summary(Path(a.docs)), indent=1))
    return 0


def show_plan(a, log=print) -> int:
    """Print the settings and each arm's overrides for ``--seed`` and compose each launch's config as the run would
    (``run_scripts/dry_run.py``: the recipe's and verl's checks before Ray starts; nothing runs). 2 if one is refused."""
    from recipe.mrtpo.cpu.runtime import cpu_overrides, with_cpu_overrides

    out = Path(a.out).resolve()
    model = Path(a.model) if a.model else REPO / ".assets" / "smollm2-135m-instruct"
    train = out / "data" / "train.parquet"
    log(f"{LOG_PREFIX} pool: span-read {list(C.SPAN_READ)}, global {list(C.GLOBAL)}; data: {' '.join(C.DATA_ARGS)}")
    log(f"{LOG_PREFIX} {a.steps} steps of {C.prompts_per_step(a.seed)} x {C.RESPONSES_PER_PROMPT} responses <= "
        f"{C.RESPONSE_LENGTH} tokens, lr {C.LR}; pilot seeds {list(C.PILOT_SEEDS)}; code {code_key()}")
    refused = 0
    for arm in a.arms:
        ov = C.run_overrides(arm, a.seed, model, train, out / "runs" / C.run_name(arm, a.seed), a.steps)
        log(f"{LOG_PREFIX} {arm}: " + " ".join(ov))
        r = subprocess.run([sys.executable, str(REPO / "run_scripts" / "dry_run.py"), *with_cpu_overrides(ov, cpu_overrides())],
                           cwd=REPO, capture_output=True, text=True)
        log(f"{LOG_PREFIX} {arm}: composed and checked" if r.returncode == 0 else f"{LOG_PREFIX} {arm}: REFUSED: {r.stderr.strip()[-600:]}")
        refused += r.returncode != 0
    return 2 if refused else 0


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.real_model_learning", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("plan", "run", "base"):
        p = sub.add_parser(name)
        p.add_argument("--out", type=Path, default=REPO / "outputs" / "real_model_learning")
        p.add_argument("--steps", type=int, default=C.STEPS)
    plan, run, base = sub.choices["plan"], sub.choices["run"], sub.choices["base"]
    for p in (run, base):
        p.add_argument("--docs", type=Path, default=DOCS, help="where the record and the report folders are written")
        p.add_argument("--eval-backend", choices=("vllm", "hf"), default="vllm", help="tools.eval's backend (default vllm)")
        p.add_argument("--no-ifeval", action="store_true", help="skip the IFEval evaluation (a smoke)")
    summ = sub.add_parser("summary", help="the plan's numbers from the committed records (the pilot's n, the test)")
    summ.add_argument("--docs", type=Path, default=DOCS, help="where the records are")
    plan.add_argument("--arms", nargs="+", default=list(C.ARMS), choices=list(C.ARMS))
    plan.add_argument("--seed", type=int, default=C.PILOT_SEEDS[0])
    plan.add_argument("--model", default=None, help="the model folder named in the overrides (default the asset's)")
    run.add_argument("--arm", required=True, choices=list(C.ARMS))
    run.add_argument("--seed", type=int, required=True)
    run.add_argument("--retries", type=int, default=3, help="attempts of a failing run (default 3)")
    run.add_argument("--timeout", type=float, default=6 * 3600, help="hard limit of the verl run, seconds")
    run.add_argument("--no-lock", action="store_true", help="do not take the machine-wide lock around the run")
    run.add_argument("--rerun-changed", action="store_true", help="re-run committed records of another key")
    a = ap.parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    try:
        return {"plan": show_plan, "run": run_one, "base": evaluate_base, "summary": print_summary}[a.cmd](
            a, log=lambda m: print(m, flush=True))
    except (ExperimentError, FileNotFoundError) as e:
        print(f"{LOG_PREFIX} ERROR: {e}", file=sys.stderr)
        return 2
