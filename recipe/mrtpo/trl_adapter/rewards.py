"""Reward functions for TRL that also say what their verifier read: Z_k (docs/design.md §2), per completion.

TRL calls a reward function as ``f(prompts=..., completions=..., completion_ids=..., **columns)`` and takes one
float (or None: absent) per completion. MRTPO also needs, for each completion, reward k's verifier information Z_k,
the part of the prompt the replay removes to build P_minus_k. The protocol is one attribute on the function:

    f.mrtpo_context(prompts=..., completions=..., completion_ids=..., **columns) -> list, one entry per completion:
        str                      Z_k, a verbatim substring of the prompt's system or user turns (removed there)
        Context(text, placement) the recipe's own (``"prompt"``: as a str; ``"appended"``: added to P_all in the
                                 verifier-information block, absent from the rollout prompt)
        {"text", "placement"}    the same as a dict
        None                     no Z_k for this completion: its token weights stay uniform (GDPO's spread)

:func:`with_context` attaches it to any reward function. A reward function without ``mrtpo_context`` keeps GDPO's
uniform spread for every completion (the trainer counts those pairs and logs once which rewards they are).

The recipe's own tasks (instruction following, text-to-SQL, tool calling; ``recipe.mrtpo.tasks``) supply Z_k
through their verifiers, as in verl: :func:`task_rewards` makes one TRL reward function per reward name, each
reading the row's ``data_source``, ``reward_model.ground_truth`` and ``extra_info`` columns (the recipe's parquet
rows as ``datasets`` loads them); one verifier call per completion serves every reward of the row.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any, Optional

from recipe.mrtpo.tasks.base import Context, RewardResult, as_text, get_task, to_plain

logger = logging.getLogger(__name__)

CONTEXT_ATTR = "mrtpo_context"


def as_context(value: Any, reward: str) -> Optional[dict]:
    """One entry of ``mrtpo_context``'s answer as the replay's ``{"text", "placement"}`` dict, or None (no Z_k).

    An empty string is no Z_k. Anything but str / Context / such a dict / None is refused in one line."""
    if value is None:
        return None
    if isinstance(value, str):
        return {"text": value, "placement": "prompt"} if value else None
    if isinstance(value, Context):
        return value.to_dict() if value.text else None
    if isinstance(value, dict) and set(value) == {"text", "placement"}:
        return Context(value["text"], value["placement"]).to_dict() if value["text"] else None
    raise TypeError(f"{CONTEXT_ATTR} of reward {reward!r} gave {type(value).__name__} {value!r}; "
                    "expected str, Context, {'text', 'placement'} or None")


def with_context(reward_func: Callable, context: Callable) -> Callable:
    """``reward_func`` (its name and answers unchanged) carrying ``context`` as its ``mrtpo_context`` (module docstring)."""

    @functools.wraps(reward_func)
    def wrapped(*args, **kwargs):
        return reward_func(*args, **kwargs)

    setattr(wrapped, CONTEXT_ATTR, context)
    return wrapped


def completion_text(completion: Any) -> str:
    """The text of one TRL completion: a string, or a conversational completion (a list of messages; its
    assistant turns' text joined)."""
    if isinstance(completion, list):
        return "".join(as_text(m.get("content")) for m in completion if isinstance(m, dict) and m.get("role") == "assistant")
    return as_text(completion)


def reward_contexts(reward_funcs: Sequence[Callable], names: Sequence[str], n: int, kwargs: dict) -> tuple[list[dict], list[str]]:
    """Per completion ``{reward name: {"text", "placement"}}`` from each reward function's ``mrtpo_context``
    (called with TRL's reward arguments ``kwargs``), and the names of the rewards without the protocol.

    A function answering with the wrong number of entries is refused in one line."""
    out: list[dict] = [{} for _ in range(n)]
    missing = []
    for fn, name in zip(reward_funcs, names):
        ctx_fn = getattr(fn, CONTEXT_ATTR, None)
        if ctx_fn is None:
            missing.append(name)
            continue
        values = list(ctx_fn(**kwargs))
        if len(values) != n:
            raise ValueError(f"{CONTEXT_ATTR} of reward {name!r} gave {len(values)} entries for {n} completions")
        for i, v in enumerate(values):
            ctx = as_context(v, name)
            if ctx is not None:
                out[i][name] = ctx
    return out, missing


class _TaskScorer:
    """One verifier call per completion, shared by the reward functions of :func:`task_rewards`: the last batch's
    results, keyed by the completion and its row (TRL calls the reward functions one after another on one batch)."""

    def __init__(self):
        self._key: Optional[tuple] = None
        self._results: list[Optional[RewardResult]] = []
        self.errors = 0

    def results(self, completions, data_source, reward_model, extra_info) -> list[Optional[RewardResult]]:
        n = len(completions)
        data_source = data_source or [None] * n
        reward_model = reward_model or [None] * n
        extra_info = extra_info or [None] * n
        key = tuple(repr((completion_text(c), d, r, e)) for c, d, r, e in zip(completions, data_source, reward_model, extra_info))
        if key == self._key:
            return self._results
        out = []
        for c, ds, rm, ex in zip(completions, data_source, reward_model, extra_info):
            try:
                rm = to_plain(rm) or {}
                result = get_task(str(ds))(completion_text(c), to_plain(rm.get("ground_truth")),
                                           to_plain(ex) if ex is not None else None)
                if not isinstance(result, RewardResult):
                    raise TypeError(f"verifier for {ds!r} returned {type(result).__name__}, not RewardResult")
            except Exception as e:  # a verifier bug or hostile input: every reward of the row absent (None), as in verl
                self.errors += 1
                logger.warning("mrtpo trl reward: verifier for data_source=%r raised %s: %s", ds, type(e).__name__, e)
                result = None
            out.append(result)
        self._key, self._results = key, out
        return out


def task_rewards(names: Sequence[str]) -> list[Callable]:
    """One TRL reward function per reward name of the recipe's tasks (module docstring), each with ``mrtpo_context``.

    ``names``: the reward keys the verifiers return (``"format"``, ``"correctness"`` for tool calling; an
    instruction id such as ``"punctuation:no_comma"`` for instruction following). A completion whose row has no
    such reward scores None (absent: TRL leaves it out of the reward's group statistics, as verl's recipe does).
    """
    if not names or len(set(names)) != len(names):
        raise ValueError(f"task_rewards needs distinct reward names, got {list(names)}")
    scorer = _TaskScorer()

    def make(name: str) -> Callable:
        def rows(completions, data_source=None, reward_model=None, extra_info=None, **_):
            return scorer.results(completions, data_source, reward_model, extra_info)

        def reward(prompts=None, completions=None, **kwargs):
            return [r.scores.get(name) if r is not None else None for r in rows(completions, **kwargs)]

        def context(prompts=None, completions=None, **kwargs):
            return [r.contexts.get(name) if r is not None else None for r in rows(completions, **kwargs)]

        reward.__name__ = reward.__qualname__ = name  # TRL logs rewards/{__name__}/mean
        setattr(reward, CONTEXT_ATTR, context)
        return reward

    return [make(n) for n in names]
