"""The verifier contract shared by every task (docs/design.md §2).

A verifier is a function ``score(response, ground_truth, extra_info=None) -> RewardResult``. It returns
one score per reward and, for each reward k, the verifier information Z_k that the replay removes to
build P_minus_k:

- ``Context(text, "prompt")``: Z_k is a verbatim substring of the prompt's chat messages
  (an instruction-following constraint sentence, an output-format section);
- ``Context(text, "appended")``: Z_k is appended to the last user turn in one verifier-information
  block (an execution error, the gold SQL, the reference tool calls).

Tasks are registered by ``data_source`` with :func:`register_task`; the reward manager dispatches on
the row's ``data_source``. A new task is one function and one line::

    from recipe.mrtpo.tasks import Context, RewardResult, register_task

    def score_json_answer(response, ground_truth, extra_info=None):
        ...
        return RewardResult(scores={"format": f, "answer": a},
                            contexts={"format": Context(FORMAT_TEXT, "prompt"),
                                      "answer": Context(str(ground_truth["answer"]), "appended")})

    register_task("my_json_task", score_json_answer)

A verifier that cannot judge a response through no fault of the response (an asset of its node missing or
unreadable, a database it cannot open, a gold query that fails) raises :class:`NoVerdict` (or, for a file missing
on its node, the one line of ``node_files.missing_line``): the row then leaves the step (no score, no advantage, no
loss tokens; ``reward_extras``), counted, never a reward of 0 (``recipe.mrtpo.cluster.verdict``). An error caused by the response's own content keeps
its task's rule (a reward of 0, or the checker's error counted).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from recipe.mrtpo.cluster.verdict import NO_VERDICT_MARK, NoVerdict, is_no_verdict  # noqa: F401 - the contract's exception

Placement = Literal["prompt", "appended"]
PLACEMENTS = ("prompt", "appended")


@dataclass(frozen=True)
class Context:
    """Verifier information Z_k of one reward for one sample."""

    text: str
    placement: Placement

    def __post_init__(self):
        if self.placement not in PLACEMENTS:
            raise ValueError(f"Context.placement must be one of {PLACEMENTS}, got {self.placement!r}")
        if not isinstance(self.text, str):
            raise TypeError(f"Context.text must be str, got {type(self.text).__name__}")

    def to_dict(self) -> dict:
        return {"text": self.text, "placement": self.placement}

    @classmethod
    def from_dict(cls, d: dict) -> Context:
        return cls(text=d["text"], placement=d["placement"])


@dataclass
class RewardResult:
    """Per-reward scores and contexts of one response.

    ``scores`` and ``contexts`` have the same keys (reward names). ``info`` carries diagnostics
    (e.g. ``{"error": "..."}``) that the reward manager logs and counts; it never changes a score.
    """

    scores: dict[str, float]
    contexts: dict[str, Context]
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if set(self.scores) != set(self.contexts):
            raise ValueError(
                f"RewardResult: scores and contexts must name the same rewards, "
                f"got {sorted(self.scores)} vs {sorted(self.contexts)}"
            )
        for k, v in self.scores.items():
            v = float(v)
            if not math.isfinite(v):
                raise ValueError(f"RewardResult: score {k!r} is not finite ({v})")
            self.scores[k] = v


def to_plain(obj: Any, *, nan_to_none: bool = False, integral_floats_to_int: bool = False) -> Any:
    """Numpy arrays / scalars (parquet rows as pandas hands them) -> plain Python, recursively: verifiers
    get lists, dicts with ``str`` keys and Python scalars; tuples become lists.

    The project's one converter of parquet values (the reward manager, the evaluation's data loading,
    instruction-following kwargs). Options, for what parquet's round trip does to missing values:

    - ``nan_to_none``: NaN -> None (pandas writes a missing value of a numeric column as NaN);
    - ``integral_floats_to_int``: ``3.0`` -> ``3`` (an integer kwarg in a column that also holds
      floats or NaN comes back as float; IFEval's checkers need the int).

    ``tool_json.to_plain`` is a separate function on purpose: it validates model-written JSON (depth
    bound, non-finite numbers and unknown types rejected, ``null`` entries optionally dropped) rather
    than converting trusted data.
    """
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):
        obj = obj.tolist()  # numpy array or numpy scalar
    if isinstance(obj, Mapping):
        return {str(k): to_plain(v, nan_to_none=nan_to_none, integral_floats_to_int=integral_floats_to_int)
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v, nan_to_none=nan_to_none, integral_floats_to_int=integral_floats_to_int) for v in obj]
    if isinstance(obj, float):
        if nan_to_none and math.isnan(obj):
            return None
        if integral_floats_to_int and obj.is_integer():
            return int(obj)
    return obj


def as_text(response: Any) -> str:
    """A verifier's view of a response: str as is, bytes decoded (invalid UTF-8 replaced), None -> ""."""
    if isinstance(response, str):
        return response
    if isinstance(response, (bytes, bytearray)):
        return bytes(response).decode("utf-8", errors="replace")
    return "" if response is None else str(response)


ScoreFn = Callable[[str, dict, Optional[dict]], RewardResult]

_TASKS: dict[str, ScoreFn] = {}
#: data_source -> the agent loop's extra field the verifier reads in place of the response text
_RECORD_FIELDS: dict[str, str] = {}


def register_task(data_source: str, fn: ScoreFn | None = None, *, record_field: Optional[str] = None):
    """Register ``fn`` as the verifier of rows whose ``data_source`` is ``data_source``.

    Usable as a call (``register_task("x", fn)``) or a decorator (``@register_task("x")``).
    Re-registering the same name with a different function is an error (two tasks fighting over a name).

    ``record_field``: the verifier judges a record an agent loop left in its output's ``extra_fields`` under
    this key (a multi-turn trajectory), never the decoded response text: the reward manager hands it that
    record as ``response`` (tool output and injected user turns inside the response are no model text).
    """

    def deco(f: ScoreFn) -> ScoreFn:
        old = _TASKS.get(data_source)
        if old is not None and old is not f:
            raise ValueError(f"task {data_source!r} is already registered to {old.__module__}.{old.__name__}")
        _TASKS[data_source] = f
        if record_field:
            _RECORD_FIELDS[data_source] = str(record_field)
        return f

    return deco(fn) if fn is not None else deco


def record_field_of(data_source: str) -> Optional[str]:
    """The extra field the verifier of ``data_source`` reads instead of the response text, or None (the
    response text; also for an unknown data_source: :func:`get_task` then says why)."""
    from recipe.mrtpo import tasks as _builtin  # noqa: F401  (registers the built-in tasks)

    data_source = str(data_source)
    if data_source in _TASKS:
        return _RECORD_FIELDS.get(data_source)
    return _RECORD_FIELDS.get(data_source.split("/", 1)[0])


def get_task(data_source: str) -> ScoreFn:
    """The verifier registered for ``data_source`` (prefix match on '/' so 'ifeval/train' finds 'ifeval')."""
    from recipe.mrtpo import tasks as _builtin  # noqa: F401  (registers the built-in tasks)

    if data_source in _TASKS:
        return _TASKS[data_source]
    head = data_source.split("/", 1)[0]
    if head in _TASKS:
        return _TASKS[head]
    raise KeyError(f"no MRTPO task registered for data_source {data_source!r}; known: {sorted(_TASKS)}")


def registered_tasks() -> list[str]:
    from recipe.mrtpo import tasks as _builtin  # noqa: F401

    return sorted(_TASKS)
