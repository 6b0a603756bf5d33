"""The runs of the format-speed experiment: per seed the data and the warm start (:func:`prepare_seed`),
then one verl run per method (:func:`run_method`) through ``python -m recipe.mrtpo.main_mrtpo`` on CPU,
with the overrides of the slots miniature (:func:`experiments.mini_credit.runs.method_overrides`: 4
prompts x 4 responses of <= 24 tokens a step, relevance dumps of every response of every step for the
replay methods) under this experiment's project name; a :class:`.common.Condition` other than the
control sets the prompts a step (one update a step: the PPO mini-batch is the batch) and the response
length.

Each verl run holds the machine-wide lock (:data:`HEAVY_LOCK`, ``flock``) while it runs, and only then,
so that other heavy jobs on the machine interleave between runs. A run that finished with the same
overrides and weights is kept (``result.json`` holds its key): an interrupted experiment resumes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional

from experiments.format_speed.common import LOG_PREFIX, PROJECT, Condition
from experiments.mini_credit.runs import method_overrides, run_verl, warm_start_seed

HEAVY_LOCK = Path(os.environ.get("MRTPO_HEAVY_LOCK", "/tmp/mrtpo-heavy.lock"))


@contextlib.contextmanager
def heavy_lock(path: Path = HEAVY_LOCK, log: Callable[[str], None] = print):
    """Hold an exclusive ``flock`` on ``path`` (waits for it; logs how long)."""
    t0 = time.monotonic()
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"{LOG_PREFIX}   waiting for {path} ...")
            fcntl.flock(f, fcntl.LOCK_EX)
            log(f"{LOG_PREFIX}   got {path} after {time.monotonic() - t0:.0f} s")
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def run_overrides(method: str, model: Path, data: Path, run_dir: Path, seed: int, steps: int, lr: float, beta: float,
                  warmup: int, condition: Optional[Condition] = None) -> list[str]:
    """The slots miniature's overrides for ``method`` (the actor in fp32 among them) with this experiment's
    project name; under a ``condition`` other than the control, its prompts a step (batch = PPO
    mini-batch: one update a step), response length and dumped samples."""
    cond = condition or Condition()
    ov = method_overrides(method, model, data, run_dir, seed, steps, lr, beta, warmup)
    changed = {"trainer.project_name": PROJECT}
    if not cond.control:
        changed.update({"data.train_batch_size": cond.prompts_per_step,
                        "actor_rollout_ref.actor.ppo_mini_batch_size": cond.prompts_per_step,
                        "data.max_response_length": cond.max_response_length,
                        "mrtpo.dump.max_samples": cond.responses_per_step})
    out = []
    for o in ov:
        key = o.split("=", 1)[0]
        out.append(f"{key}={changed[key]}" if key in changed else o)
    return out


def run_method(method: str, seed: int, model: Path, data: Path, runs_dir: Path, steps: int, lr: float, beta: float,
               warmup: int, timeout_s: float, model_name: str, log: Callable[[str], None] = print,
               lock: bool = True, condition: Optional[Condition] = None, arm: Optional[str] = None,
               extra: Sequence[str] = (), key_parts: Optional[dict] = None, prior: Optional[dict] = None) -> dict:
    """Run one (method, seed) unless ``result.json`` says the same run already finished; returns it
    (:func:`experiments.mini_credit.runs.run_verl`, under :func:`heavy_lock` when ``lock``). The grid
    (:mod:`.grid`) names the run's folder by its ``arm`` (a method, or an ablation of one), appends the arm's
    ``extra`` overrides and verl's rollout files (``OUT/.../<arm>_seed<s>/rollouts/<step>.jsonl``, what the
    pairing check reads), and keys the run also by ``key_parts`` (the code's and the data's hashes); ``prior`` (the
    run's committed record) is kept when its key is the run's."""
    cond = condition or Condition()
    run_dir = Path(runs_dir) / f"{arm or method}_seed{seed}"
    overrides = run_overrides(method, model, data, run_dir, seed, steps, lr, beta, warmup, cond)
    if arm is not None:
        overrides += [*extra, f"trainer.rollout_data_dir={run_dir / 'rollouts'}"]
    info = {"method": method, "task": cond.reward, "seed": seed, "model": model_name}
    if arm is not None:
        info["arm"] = arm
    if not cond.control:
        info["prompts_per_step"] = cond.prompts_per_step
    return run_verl(method, seed, overrides, model, run_dir, steps, timeout_s, info, log=log, prefix=LOG_PREFIX,
                    lock=(lambda: heavy_lock(log=log)) if lock else None, key_parts=key_parts, prior=prior)


def prepare_seed(sdir: Path, seed: int, args, log: Callable[[str], None] = print,
                 condition: Optional[Condition] = None) -> dict:
    """Data (``sdir/data``), the task vocabulary when the condition has one (``sdir/tokenizer``), the
    random init (``sdir/init``) and the warm-started model (``sdir/sft_model``)."""
    from data_prep import format_speed as builder
    from experiments.format_speed.warm_start import sft_warm_start, task_tokenizer

    cond = condition or Condition()
    if cond.reward == "toolrl":
        build_args = ["--reward", "toolrl", "--p-follow-call", str(args.p_follow_call),
                      "--p-follow-response", str(args.p_follow_response), "--p-arg", str(args.p_arg)]
    else:
        build_args = ["--p-format", str(args.p_format), "--p-arg", str(args.p_arg)]
    tokenizer = None if cond.task_vocab is None else task_tokenizer(cond.task_vocab)
    return warm_start_seed(sdir, seed, args, builder.main, build_args, sft_warm_start, log, tokenizer)
