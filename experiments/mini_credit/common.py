"""What every part of the miniature experiment shares: the compared methods, the task and the error type."""

from __future__ import annotations

from pathlib import Path

from recipe.mrtpo.methods import Method, get

REPO = Path(__file__).resolve().parents[2]

#: the compared methods (entries of the recipe's registry, recipe/mrtpo/methods/)
METHODS: dict[str, Method] = {name: get(name) for name in ("grpo", "gdpo", "mrtpo", "shuffle")}
#: the methods that replay the prompts, and so write relevance dumps
REPLAY_METHODS = tuple(name for name, m in METHODS.items() if m.replay is not None)
TASK = "synthetic_slots"


class ExperimentError(RuntimeError):
    """A step of the experiment cannot go on (bad input, a failed data build, no finished runs)."""
