"""The runs of the miniature experiment: per seed the data and the warm-started model
(:func:`prepare_seed`), then one verl run per method (:func:`run_method`, with the overrides of
:func:`method_overrides`) through ``python -m recipe.mrtpo.main_mrtpo`` on CPU.

A run that finished with the same overrides and weights is kept (``result.json`` holds its key), so an
interrupted experiment resumes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Optional

from data_prep.common import sha256_file
from experiments.mini_credit.common import METHODS, REPLAY_METHODS, REPO, TASK, ExperimentError
from experiments.mini_credit.warm_start import SFTConfig, sft_warm_start
from recipe.mrtpo.tools.verl_log import STEP_LINE


def method_overrides(method: str, model: Path, data: Path, run_dir: Path, seed: int, steps: int, lr: float,
                     beta: float, warmup: int, samples_per_step: int = 16) -> list[str]:
    """The verl overrides of one run: :func:`recipe.mrtpo.cpu.launcher.tiny_run_overrides` (4 prompts x 4
    responses of <= 24 tokens) plus the method's estimator and switches, the seed, relevance dumps
    of every response for the replay methods, and the actor in fp32 (last)."""
    from recipe.mrtpo.cpu.launcher import tiny_run_overrides
    from recipe.mrtpo.cpu.runtime import FP32_ACTOR

    if method not in METHODS:
        raise ExperimentError(f"unknown method {method!r}; known: {sorted(METHODS)}")
    m = METHODS[method]
    knobs = {"seed": seed, "beta": beta, "warmup_steps": warmup}  # set only where the method reads them (else refused)
    ov = [
        *tiny_run_overrides(model, data, run_dir, m.estimator, steps, lr=lr),
        *m.overrides[1:],
        "trainer.save_freq=-1",
        "trainer.project_name=mrtpo_mini_credit",
        f"trainer.experiment_name={method}_seed{seed}",
        f"actor_rollout_ref.rollout.seed={seed}",
        *(f"mrtpo.{k}={v}" for k, v in knobs.items() if m.reads_knob(k)),
    ]
    if method in REPLAY_METHODS:
        ov += ["mrtpo.dump.every_n_steps=1", f"mrtpo.dump.max_samples={samples_per_step}",
               f"mrtpo.dump.dir={Path(run_dir) / 'relevance_dumps'}"]
    # the actor in fp32, as every CPU run (cpu_overrides); named here so that it is part of the run's key:
    # runs measured before it was the CPU default computed in bf16
    return ov + [FP32_ACTOR]


def run_method(method: str, seed: int, model: Path, data: Path, runs_dir: Path, steps: int, lr: float, beta: float,
               warmup: int, timeout_s: float, model_name: str, log: Callable[[str], None] = print) -> dict:
    """Run one (method, seed) unless ``result.json`` says the same run already finished; returns it."""
    run_dir = Path(runs_dir) / f"{method}_seed{seed}"
    overrides = method_overrides(method, model, data, run_dir, seed, steps, lr, beta, warmup)
    return run_verl(method, seed, overrides, model, run_dir, steps, timeout_s,
                    {"method": method, "task": TASK, "seed": seed, "model": model_name}, log=log, prefix="[mini]")


def run_verl(method: str, seed: int, overrides: list[str], model: Path, run_dir: Path, steps: int, timeout_s: float,
             run_info: dict, log: Callable[[str], None] = print, prefix: str = "[mini]",
             lock: Optional[Callable[[], contextlib.AbstractContextManager]] = None,
             key_parts: Optional[dict] = None, prior: Optional[dict] = None) -> dict:
    """One verl run of ``python -m recipe.mrtpo.main_mrtpo overrides`` in ``run_dir`` (``run.json`` =
    ``run_info``), unless ``result.json`` says that the same overrides on the same weights finished (the
    result is kept: an interrupted experiment resumes). ``key_parts`` (e.g. the hash of the code that computes
    the run's numbers, of the data): also part of the key, stored in ``result.json``, and named in the log
    line when a finished run is re-run because one of them changed. ``lock``: a context held around the run only
    (e.g. the machine-wide flock of the format-speed experiment). ``prior``: a record of the run kept elsewhere
    (the grid's committed record, which outlives the run folder): returned as it is when it finished under the
    same key. Returns the result record."""
    from recipe.mrtpo.cpu.launcher import run_cpu

    # keyed with its code (the grid): the checkout's place left out, so that a run is the same run in any checkout
    keyed = [o.replace(str(REPO), "<repo>") for o in overrides] if key_parts else overrides
    parts = [keyed, sha256_file(Path(model) / "model.safetensors")] + ([key_parts] if key_parts else [])
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]
    name = run_info.get("arm", method)  # an ablation's log lines name its arm (mrtpo-warmup10), not its method
    if prior and prior.get("ok") and prior.get("key") == key:
        log(f"{prefix} {name} seed {seed}: finished in an earlier session, its record kept (key {key})")
        return prior
    result_path = run_dir / "result.json"
    if result_path.is_file():
        try:
            old = json.loads(result_path.read_text())
            if old.get("key") == key and old.get("ok"):
                log(f"{prefix} {name} seed {seed}: done before, kept ({run_dir}; key {key})")
                return old
            changed = [k for k, v in (key_parts or {}).items() if (old.get("key_parts") or {}).get(k) != v]
            log(f"{prefix} {name} seed {seed}: {'failed before' if not old.get('ok') else 'key changed'}"
                + (f" ({', '.join(changed)} changed)" if changed and old.get("ok") else "") + ": running it again")
        except ValueError:
            pass
    with lock() if lock else contextlib.nullcontext():
        if run_dir.exists():
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True)
        (run_dir / "run.json").write_text(json.dumps(run_info))
        t0 = time.monotonic()
        log(f"{prefix} {name} seed {seed}: starting verl ({steps} steps) ...")

        def progress(line: str) -> None:
            m = STEP_LINE.search(line)
            if m:
                log(f"{prefix}   {name} seed {seed}: step {m.group(1)} ({time.monotonic() - t0:.0f} s)")

        res = run_cpu("recipe.mrtpo.main_mrtpo", overrides, run_dir, timeout_s, on_line=progress)
    ok = (not res.timed_out) and res.returncode == 0 and sorted(res.steps) == list(range(1, steps + 1))
    result = {"method": method, "seed": seed, "key": key, **({"key_parts": key_parts} if key_parts else {}), "ok": ok, "returncode": res.returncode,
              "timed_out": res.timed_out, "wall_s": res.wall_s, "first_step_at_s": res.first_step_at_s,
              "peak_pss_gib": res.peak_pss_gib, "steps_logged": sorted(res.steps), "log": res.log_path.name}
    result_path.write_text(json.dumps(result, indent=1))
    if not ok:
        log(f"{prefix} {method} seed {seed}: FAILED (exit {res.returncode}, timed out {res.timed_out}, "
            f"steps {sorted(res.steps)}); log {res.log_path}\n{res.tail(25)}")
    else:
        log(f"{prefix} {method} seed {seed}: {res.wall_s:.0f} s, peak {res.peak_pss_gib:.1f} GiB PSS")
    return result


def prepare_seed(sdir: Path, seed: int, args, log: Callable[[str], None] = print) -> dict:
    """Data (``sdir/data``), the random init (``sdir/init``) and the warm-started model (``sdir/sft_model``)."""
    from data_prep import synthetic_slots as builder

    return warm_start_seed(sdir, seed, args, builder.main, ["--slots", str(args.slots), "--p-correct", str(args.p_correct)],
                           sft_warm_start, log)


def warm_start_seed(sdir: Path, seed: int, args, build: Callable[[list[str]], int], build_args: list[str],
                    sft: Callable[..., dict], log: Callable[[str], None] = print,
                    tokenizer: Optional[Callable[[Path], Path]] = None) -> dict:
    """What both miniatures prepare per seed: ``build([--out-dir sdir/data --seed --n-sft, *build_args])``
    (a data builder's ``main``), a random tiny Qwen2 (``args.hidden``, ``args.layers``) in ``sdir/init``,
    and ``sft(...)`` of it into ``sdir/sft_model`` with the SFT phases of ``args``; returns the SFT record.
    The model has the real Qwen2 tokenizer unless ``tokenizer(data_dir)`` returns the folder of another
    (:func:`recipe.mrtpo.cpu.tiny_model.build_task_tokenizer`, trained on the data just built)."""
    from recipe.mrtpo.cpu.tiny_model import build_tiny_qwen2

    data_dir = sdir / "data"
    if build(["--out-dir", str(data_dir), "--seed", str(seed), "--n-sft", str(args.n_sft), *build_args]) != 0:
        raise ExperimentError(f"building the data for seed {seed} failed")
    heads = args.hidden // 32
    base = build_tiny_qwen2(sdir / "init", hidden_size=args.hidden, num_layers=args.layers,
                            num_heads=heads, num_kv_heads=max(1, heads // 2), seed=seed,
                            tokenizer_dir=None if tokenizer is None else tokenizer(data_dir))
    cfg = SFTConfig(gold_steps=args.sft_gold_steps, demo_steps=args.sft_demo_steps, full_steps=args.sft_full_steps)
    return sft(base, data_dir / "sft.parquet", data_dir / "test.parquet", sdir / "sft_model", cfg, seed=seed, log=log)
