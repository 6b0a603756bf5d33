"""What every part of the format-speed experiment shares: the methods (those of the slots miniature), the
task, the tag-token definition's name, the error type, and the condition a grid runs under
(:class:`Condition`: which rewards, how many prompts a step)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from experiments.mini_credit.common import METHODS, REPLAY_METHODS, REPO, ExperimentError

__all__ = ["METHODS", "REPLAY_METHODS", "REPO", "ExperimentError", "TASK", "PROJECT", "FORMAT", "CORRECTNESS",
           "LOG_PREFIX", "REWARDS", "RESPONSES_PER_PROMPT", "Condition"]

TASK = "tool_calling"
PROJECT = "mrtpo_format_speed"
FORMAT, CORRECTNESS = "format", "correctness"
LOG_PREFIX = "[format-speed]"
#: --reward: the verifier of the task (its data_source)
REWARDS = ("tool_calling", "toolrl")
RESPONSES_PER_PROMPT = 4


@dataclass(frozen=True)
class Condition:
    """The condition of a grid: ``reward`` (``tool_calling``: the recipe's tool-calling verifier on one
    frame broken after the object, the first grid's task; ``toolrl``: ToolRL's rewards on the layout the
    instruction names, ``data_prep.format_speed --reward toolrl``) and ``prompts_per_step`` (x 4
    responses).

    The first grid's condition (``tool_calling``, 4 prompts) keeps its folders (``OUT/warm_start``,
    ``OUT/runs``, ``OUT/results.md``): it is the control row set and its stored runs stay valid. Any
    other condition lives in ``OUT/<tag>/`` (e.g. ``OUT/toolrl-p32``), its warm start in
    ``OUT/warm_start-<reward>`` (shared by every prompts-per-step of that reward)."""

    reward: str = "tool_calling"
    prompts_per_step: int = 4

    def __post_init__(self):
        if self.reward not in REWARDS:
            raise ExperimentError(f"unknown reward {self.reward!r}; known: {list(REWARDS)}")
        if self.prompts_per_step < 1:
            raise ExperimentError(f"prompts_per_step must be >= 1, got {self.prompts_per_step}")

    @property
    def control(self) -> bool:
        return self.reward == "tool_calling" and self.prompts_per_step == 4

    @property
    def tag(self) -> str:
        return "" if self.control else f"{self.reward}-p{self.prompts_per_step}"

    def root(self, out: Path) -> Path:
        return Path(out) if self.control else Path(out) / self.tag

    def warm_start_dir(self, out: Path) -> Path:
        return Path(out) / ("warm_start" if self.reward == "tool_calling" else f"warm_start-{self.reward}")

    @property
    def deciding(self) -> str:
        """The token role (:func:`.tokens.token_roles`) where the frame is decided: the closing position
        for the one broken frame, the position after the closing tag where the instruction names the layout."""
        return "close" if self.reward == "tool_calling" else "after_close"

    @property
    def task_vocab(self) -> Optional[int]:
        """The size bound of the task vocabulary the model is built on (``None``: the real Qwen2
        tokenizer, as in the control, whose stored runs used it). Under ToolRL's rewards a 1,024-token
        bound over the task's texts (the corpus fills 449): at 32 prompts a step the 151,936-row LM head
        made a step ~77 s, against ~7 s on the task vocabulary (:mod:`recipe.mrtpo.cpu.tiny_model`)."""
        return None if self.reward == "tool_calling" else 1024

    @property
    def max_response_length(self) -> int:
        return 24 if self.reward == "tool_calling" else 40

    @property
    def responses_per_step(self) -> int:
        return self.prompts_per_step * RESPONSES_PER_PROMPT
