"""What every part of the format-speed experiment shares: the methods (those of the slots miniature), the
task, the tag-token definition's name and the error type."""

from __future__ import annotations

from experiments.mini_credit.common import METHODS, REPLAY_METHODS, REPO, ExperimentError

__all__ = ["METHODS", "REPLAY_METHODS", "REPO", "ExperimentError", "TASK", "PROJECT", "FORMAT", "CORRECTNESS",
           "LOG_PREFIX"]

TASK = "tool_calling"
PROJECT = "mrtpo_format_speed"
FORMAT, CORRECTNESS = "format", "correctness"
LOG_PREFIX = "[format-speed]"
