"""What the end-to-end tests' launches share: the hard limit, the check that a launch finished its steps, and
the tiny run of a method (``recipe.mrtpo.cpu.launcher.tiny_run_overrides`` plus MRTPO's knobs and verl's rollout
files). Imported by ``conftest.py`` (the shared launches) and the test modules of this folder."""

from __future__ import annotations

from pathlib import Path

#: one launch's hard limit (each run is a subprocess under it, its process tree killed afterwards)
LAUNCH_TIMEOUT_S = 600
#: the MRTPO launch's strength and warm-up; its step 1 (beta_0 = 0) is GDPO's step
BETA, WARMUP = 0.5, 4


def assert_launch_ok(res, steps: list[int]) -> None:
    assert not res.timed_out, f"run did not finish within {LAUNCH_TIMEOUT_S} s:\n{res.tail()}"
    assert res.returncode == 0, f"exit {res.returncode}:\n{res.tail()}"
    assert sorted(res.steps) == steps, f"steps logged {sorted(res.steps)}, expected {steps}:\n{res.tail()}"


def method_overrides(model: Path, data: Path, out: Path, estimator: str, steps: int, *extra: str, lr: float = 1e-3) -> list[str]:
    """The tiny run of ``estimator`` (``recipe.mrtpo.cpu.launcher.tiny_run_overrides``), MRTPO's knobs where it
    reads them (else refused: unread), its rollouts written as JSON lines (verl's ``rollout_data_dir``)."""
    from recipe.mrtpo.cpu.launcher import tiny_run_overrides

    knobs = [f"mrtpo.beta={BETA}", f"mrtpo.warmup_steps={WARMUP}"] if estimator == "mrtpo" else []
    return [*tiny_run_overrides(model, data, out, estimator, steps, lr=lr), *knobs,
            f"trainer.rollout_data_dir={out / 'rollouts'}", *extra]


