"""What every part of the miniature experiment shares: the compared methods, the task and the error type."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: method -> (verl estimator, extra overrides); ``docs/design.md`` §1.7 for the switches
METHODS: dict[str, tuple[str, tuple[str, ...]]] = {
    "grpo": ("grpo", ()),
    "gdpo": ("gdpo", ()),
    "mrtpo": ("mrtpo", ()),
    "shuffle": ("mrtpo", ("mrtpo.shuffle=True",)),
}
#: the methods that replay the prompts, and so write relevance dumps
REPLAY_METHODS = ("mrtpo", "shuffle")
TASK = "synthetic_slots"


class ExperimentError(RuntimeError):
    """A step of the experiment cannot go on (bad input, a failed data build, no finished runs)."""
