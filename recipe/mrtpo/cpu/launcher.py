"""Run a verl entry point on this CPU machine as a subprocess, bounded and fully cleaned up.

Used by the end-to-end tests and the CPU quickstart. :func:`run_cpu` starts ``python -m <module>
<overrides>`` with :func:`recipe.mrtpo.cpu.runtime.cpu_env` and the CPU overrides appended, in a session
of its own and with a unique marker in its environment; it streams the log, samples the tree's memory,
enforces a hard timeout, and afterwards kills every process that carries the marker (Ray's cluster, its
actors and vLLM's processes outlive the driver otherwise: a crash inside a vLLM worker can hang a run
instead of failing it). The console logger's ``step:N - key:value`` lines are parsed into metrics by
:func:`recipe.mrtpo.tools.verl_log.parse_steps`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from recipe.mrtpo.cpu.runtime import cpu_env, cpu_overrides, with_cpu_overrides
from recipe.mrtpo.tools.verl_log import STEP_LINE, parse_steps

REPO_ROOT = Path(__file__).resolve().parents[3]
MARKER = "MRTPO_E2E_RUN_ID"


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


def tiny_run_overrides(model: Path, data: Path, out: Path, estimator: str = "mrtpo", steps: int = 3, lr: float = 1e-3) -> list[str]:
    """What a tiny CPU run of the recipe computes: 4 prompts x n=4, 24-token responses, no KL, console log.

    How it executes (Ray, vLLM-CPU, FSDP2 on gloo) comes from :func:`cpu_overrides`, appended by
    :func:`run_cpu`. Used by the quickstart and the end-to-end tests; callers append their own keys
    (checkpointing, ``mrtpo.*``) but none of these.
    """
    return [
        f"algorithm.adv_estimator={estimator}",
        f"data.train_files={data}",
        f"data.val_files={data}",
        "data.train_batch_size=4",
        "data.max_prompt_length=256",
        "data.max_response_length=24",
        "data.shuffle=False",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.use_kl_loss=False",
        f"actor_rollout_ref.actor.optim.lr={lr}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.rollout.n=4",
        f"trainer.total_training_steps={steps}",
        "trainer.total_epochs=100",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.logger=[console]",
        f"trainer.default_local_dir={Path(out) / 'checkpoints'}",
    ]


@dataclass
class RunResult:
    returncode: Optional[int]
    timed_out: bool
    wall_s: float
    log_path: Path
    steps: dict = field(default_factory=dict)  # step -> {metric: value}
    first_step_at_s: Optional[float] = None
    peak_pss_gib: float = 0.0
    peak_rss_gib: float = 0.0
    leftovers_killed: list = field(default_factory=list)

    @property
    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.log_text.splitlines()[-n:])


def run_cpu(
    module: str,
    overrides: Sequence[str],
    out_dir: Path,
    timeout_s: float = 600,
    on_line: Optional[Callable[[str], None]] = None,
    extra_env: Optional[dict] = None,
) -> RunResult:
    """Run ``python -m module *overrides *cpu_overrides()`` in ``out_dir`` (a CPU override whose key the run
    sets itself left out: :func:`~recipe.mrtpo.cpu.runtime.with_cpu_overrides`); see the module docstring.

    ``on_line`` sees every log line as it arrives (the quickstart prints progress with it).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    marker_value = uuid.uuid4().hex
    env = cpu_env(REPO_ROOT)
    env[MARKER] = marker_value
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra_env or {})
    cmd = [sys.executable, "-m", module, *with_cpu_overrides(overrides, cpu_overrides()), "+ray_kwargs.ray_init.address=local"]
    log_path = out_dir / f"{module.rsplit('.', 1)[-1]}.log"
    first_step = {}
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        proc = subprocess.Popen(cmd, cwd=out_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        sampler = TreeMemorySampler(proc.pid)
        sampler.start()

        def pump():
            for raw in proc.stdout:
                line = raw.decode(errors="replace")
                log.write(line)
                log.flush()
                if STEP_LINE.search(line):
                    first_step.setdefault("t", time.monotonic() - t0)
                if on_line is not None:
                    on_line(line)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        timed_out = False
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out, rc = True, None
        finally:
            sampler.stop()
            wall = time.monotonic() - t0
            leftovers = kill_run(proc, marker_value)
            reader.join(timeout=10)
    res = RunResult(
        returncode=rc, timed_out=timed_out, wall_s=wall, log_path=log_path, first_step_at_s=first_step.get("t"),
        peak_pss_gib=sampler.peak_pss / 2**30, peak_rss_gib=sampler.peak_rss / 2**30, leftovers_killed=leftovers,
    )
    res.steps = parse_steps(res.log_text)
    return res
