"""The record of one multi-turn trajectory: what the agent loop writes and the verifier reads.

Shape (JSON-able, ``to_dict`` / ``from_dict``)::

    {"turns": [{"steps": [{"text": str, "calls": [str, ...], "error": str | None}, ...]}, ...]}

- one entry of ``turns`` per user turn of the question, in order (BFCL's ``question`` list);
- one entry of ``steps`` per model generation inside that turn (the model calls, sees the results,
  calls again, ... until it answers without a call or the loop's step bound ends the turn);
- ``text``: the assistant text the model wrote at that step (what was decoded);
- ``calls``: the step's calls decoded to BFCL's call strings (``"cd(folder='doc')"``), the format of
  BFCL's ``multi_turn_model_result_list_decoded`` (turns -> steps -> calls);
- ``error``: why the step's text did not decode into calls (None when it did, or when the step holds
  no call attempt at all, e.g. the model's final answer in plain text). A step with an error has no
  calls: BFCL's decoder either returns every call of a step or raises.

The record carries no tool output and no injected user turn: the verifier re-executes the calls
against fresh backends, as BFCL's checker does, so nothing the environment wrote can pass as model
text. :meth:`Trajectory.decoded` gives the checker's input the way BFCL's ``eval_runner`` builds it
(steps that did not decode or hold no call, or only ``""``, are left out).

Model output is hostile: :func:`parse_trajectory` refuses anything off this shape (wrong types,
unknown keys, absurd sizes) with :class:`TrajectoryError`, a ``ValueError`` whose message the verifier
counts; it never lets another exception escape.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from recipe.mrtpo.tasks.base import to_plain

__all__ = [
    "MAX_TURNS",
    "MAX_STEPS_PER_TURN",
    "MAX_CALLS_PER_STEP",
    "MAX_RECORD_CHARS",
    "RECORD_FIELD",
    "Step",
    "Turn",
    "Trajectory",
    "TrajectoryError",
    "parse_trajectory",
]

# Generous bounds: BFCL's multi-turn questions have at most 7 user turns, and its own inference stops a
# turn after 20 steps (MAXIMUM_STEP_LIMIT). A record beyond these is not a trajectory the loop can have
# produced; refusing it keeps the verifier's work bounded.
MAX_TURNS = 64
MAX_STEPS_PER_TURN = 256
MAX_CALLS_PER_STEP = 256
MAX_RECORD_CHARS = 20_000_000  # of a record handed over as a JSON string
#: the key of the agent loop's ``extra_fields`` that holds the record (``recipe.mrtpo.agent.bfcl_loop``); the
#: reward manager hands the verifier this field, never the decoded response (``tasks.base.record_field_of``)
RECORD_FIELD = "bfcl_trajectory"

_STEP_KEYS = {"text", "calls", "error"}


class TrajectoryError(ValueError):
    """The record is not of the documented shape (the message says where and why)."""


@dataclass(frozen=True)
class Step:
    """One model generation: its text, the calls decoded from it, or why it did not decode."""

    text: str
    calls: tuple[str, ...] = ()
    error: Optional[str] = None

    def to_dict(self) -> dict:
        return {"text": self.text, "calls": list(self.calls), "error": self.error}

    @classmethod
    def from_dict(cls, d: Any, where: str = "step") -> Step:
        if not isinstance(d, Mapping):
            raise TrajectoryError(f"{where}: expected an object, got {type(d).__name__}")
        unknown = set(d) - _STEP_KEYS
        if unknown:
            raise TrajectoryError(f"{where}: unknown keys {sorted(map(str, unknown))[:5]}")
        text = d.get("text", "")
        calls = d.get("calls", [])
        error = d.get("error")
        if not isinstance(text, str):
            raise TrajectoryError(f"{where}.text: expected str, got {type(text).__name__}")
        if not isinstance(calls, (list, tuple)):
            raise TrajectoryError(f"{where}.calls: expected a list, got {type(calls).__name__}")
        if len(calls) > MAX_CALLS_PER_STEP:
            raise TrajectoryError(f"{where}.calls: {len(calls)} calls, more than {MAX_CALLS_PER_STEP}")
        for j, c in enumerate(calls):
            if not isinstance(c, str):
                raise TrajectoryError(f"{where}.calls[{j}]: expected str, got {type(c).__name__}")
        if error is not None and not isinstance(error, str):
            raise TrajectoryError(f"{where}.error: expected str or null, got {type(error).__name__}")
        if error is not None and calls:
            raise TrajectoryError(f"{where}: a step with an error has no calls (got {len(calls)})")
        return cls(text=text, calls=tuple(calls), error=error)


@dataclass(frozen=True)
class Turn:
    """The model's steps answering one user turn."""

    steps: tuple[Step, ...] = ()

    def to_dict(self) -> dict:
        return {"steps": [s.to_dict() for s in self.steps]}

    @classmethod
    def from_dict(cls, d: Any, where: str = "turn") -> Turn:
        if not isinstance(d, Mapping):
            raise TrajectoryError(f"{where}: expected an object, got {type(d).__name__}")
        unknown = set(d) - {"steps"}
        if unknown:
            raise TrajectoryError(f"{where}: unknown keys {sorted(map(str, unknown))[:5]}")
        steps = d.get("steps", [])
        if not isinstance(steps, (list, tuple)):
            raise TrajectoryError(f"{where}.steps: expected a list, got {type(steps).__name__}")
        if len(steps) > MAX_STEPS_PER_TURN:
            raise TrajectoryError(f"{where}.steps: {len(steps)} steps, more than {MAX_STEPS_PER_TURN}")
        return cls(steps=tuple(Step.from_dict(s, f"{where}.steps[{i}]") for i, s in enumerate(steps)))


@dataclass(frozen=True)
class Trajectory:
    """A whole trajectory: one :class:`Turn` per user turn."""

    turns: tuple[Turn, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        return {"turns": [t.to_dict() for t in self.turns]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_dict(cls, d: Any) -> Trajectory:
        if not isinstance(d, Mapping):
            raise TrajectoryError(f"trajectory: expected an object, got {type(d).__name__}")
        unknown = set(d) - {"turns"}
        if unknown:
            raise TrajectoryError(f"trajectory: unknown keys {sorted(map(str, unknown))[:5]}")
        if "turns" not in d:
            raise TrajectoryError("trajectory: missing 'turns'")
        turns = d["turns"]
        if not isinstance(turns, (list, tuple)):
            raise TrajectoryError(f"trajectory.turns: expected a list, got {type(turns).__name__}")
        if len(turns) > MAX_TURNS:
            raise TrajectoryError(f"trajectory.turns: {len(turns)} turns, more than {MAX_TURNS}")
        return cls(turns=tuple(Turn.from_dict(t, f"turns[{i}]") for i, t in enumerate(turns)))

    def decoded(self) -> list[list[list[str]]]:
        """BFCL's ``multi_turn_model_result_list_decoded``: per turn, the call lists of the steps that
        decoded to at least one call (``eval_runner`` skips steps that fail to decode or are empty)."""
        return [[list(s.calls) for s in t.steps if s.error is None and not _empty(s.calls)] for t in self.turns]


def _empty(calls: tuple) -> bool:
    """BFCL's ``is_empty_execute_response``: no call, or one empty string."""
    return len(calls) == 0 or (len(calls) == 1 and len(calls[0]) == 0)


def parse_trajectory(record: Any) -> Trajectory:
    """A :class:`Trajectory` from a Trajectory, a dict (numpy values from parquet accepted) or a JSON
    string; :class:`TrajectoryError` for anything else, never another exception."""
    if isinstance(record, Trajectory):
        return record
    try:
        if isinstance(record, (bytes, bytearray)):
            record = bytes(record).decode("utf-8", errors="replace")
        if isinstance(record, str):
            if len(record) > MAX_RECORD_CHARS:
                raise TrajectoryError(f"trajectory: JSON longer than {MAX_RECORD_CHARS} characters")
            try:
                record = json.loads(record)
            except ValueError as e:
                raise TrajectoryError(f"trajectory: not JSON ({e})") from None
        return Trajectory.from_dict(to_plain(record))
    except TrajectoryError:
        raise
    except (RecursionError, MemoryError) as e:
        raise TrajectoryError(f"trajectory: too deep or too large ({type(e).__name__})") from None
    except Exception as e:  # any other oddity of hostile input is a refusal, not a crash
        raise TrajectoryError(f"trajectory: unreadable ({type(e).__name__}: {str(e)[:200]})") from None
