"""The IFEval / IFBench checkers of ``if-verifiable``: offline set-up, registry, ground-truth reading,
seeded checker construction, and constraint drawing for data builders.

Part of the instruction-following verifier (:mod:`recipe.mrtpo.tasks.instruction_following`, whose
docstring describes the rewards). Offline set-up done at import: NLTK finds its data under the asset
root's rule (:func:`recipe.mrtpo.cluster.node_files.nltk_data_dir`: ``$MRTPO_NLTK_DATA``, else ``$MRTPO_ASSETS/nltk_data``,
else ``<repo>/.assets/nltk_data``; punkt_tab, stopwords, provisioned by ``run_scripts/setup.sh``; the node check
looks for the same resources on every node before the first step), ``nltk.download`` is never called (IFBench's module calls it at import: it
is disabled for that import), and ``langdetect`` is seeded so that language rewards are deterministic.
Checkers that draw random arguments draw them from a generator seeded by the id and kwargs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import nltk

from recipe.mrtpo.cluster.node_files import NLTK_DATA_ENV, nltk_data_dir  # noqa: F401 - NLTK_DATA_ENV re-exported
from recipe.mrtpo.tasks.base import to_plain

_REPO = Path(__file__).resolve().parents[3]
#: where the NLTK data is when neither ``$MRTPO_NLTK_DATA`` nor ``$MRTPO_ASSETS`` is set
DEFAULT_NLTK_DATA = _REPO / ".assets" / "nltk_data"


def _configure_nltk() -> None:
    # first in NLTK's search path: the data the node check found is the data the checkers load
    path = str(nltk_data_dir())
    if path not in nltk.data.path:
        nltk.data.path.insert(0, path)


@contextlib.contextmanager
def _nltk_download_disabled() -> Iterator[list]:
    """Replace ``nltk.download`` by a refusal while the IFBench module is imported (it downloads at import)."""
    refused: list = []
    original = nltk.download

    def _refuse(info_or_id=None, *args, **kwargs):
        refused.append(info_or_id)
        return False

    nltk.download = _refuse
    try:
        yield refused
    finally:
        nltk.download = original


class _TruncateLongRecords(logging.Filter):
    """IFEval's language checkers log the whole response at ERROR when langdetect fails: cap its size."""

    MAX_ARG_CHARS = 200

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith("Unable to detect language") and record.args:
            args = record.args if isinstance(record.args, tuple) else (record.args,)
            record.args = tuple(
                a[: self.MAX_ARG_CHARS] + f"...[{len(a)} chars]"
                if isinstance(a, str) and len(a) > self.MAX_ARG_CHARS
                else a
                for a in args
            )
        return True


_configure_nltk()
if not any(isinstance(f, _TruncateLongRecords) for f in logging.getLogger().filters):
    logging.getLogger().addFilter(_TruncateLongRecords())

import langdetect  # noqa: E402 - after the logging filter

langdetect.DetectorFactory.seed = 0

with _nltk_download_disabled() as _REFUSED_DOWNLOADS:
    from if_verifiable.ifbench.instructions_registry import INSTRUCTION_DICT as _IFBENCH  # noqa: E402
    from if_verifiable.ifeval.instructions_registry import INSTRUCTION_DICT as _IFEVAL  # noqa: E402

if set(_IFEVAL) & set(_IFBENCH):  # pragma: no cover - guards a future package change
    raise ImportError(f"IFEval and IFBench instruction ids overlap: {sorted(set(_IFEVAL) & set(_IFBENCH))}")

#: Every checker of the package, IFEval's and IFBench's, by instruction id.
REGISTRY: dict[str, type] = {**_IFEVAL, **_IFBENCH}
IFEVAL_IDS: tuple[str, ...] = tuple(sorted(_IFEVAL))
IFBENCH_IDS: tuple[str, ...] = tuple(sorted(_IFBENCH))

#: Checkers that cannot run offline: their NLTK data is shipped by no offline package.
UNSUPPORTED_IDS: dict[str, str] = {
    "words:start_verb": "needs NLTK's averaged_perceptron_tagger_eng, which no offline package ships",
}
#: Checkers that score offline (IFEval's 25 and IFBench's 57).
SUPPORTED_IDS: tuple[str, ...] = tuple(i for i in IFEVAL_IDS + IFBENCH_IDS if i not in UNSUPPORTED_IDS)
#: Checkers that need one kwarg a builder must supply (the prompt to repeat, the reference text):
#: describe_constraint raises ValueError without it.
REQUIRED_KWARGS: dict[str, str] = {
    "combination:repeat_prompt": "prompt_to_repeat",
    "repeat:repeat_change": "prompt_to_repeat",
    "repeat:repeat_span": "prompt_to_repeat",
    "ratio:overlap": "reference_text",
}
#: IFBench checkers whose sentence *is* the task (a fixed request: "List the countries of Africa...",
#: "Only output this sentence here..."), meaningless appended to another prompt.
TASK_DEFINING_IDS: tuple[str, ...] = tuple(i for i in IFBENCH_IDS if i.startswith("custom:")) + (
    "repeat:repeat_simple",
)
#: Supported checkers a builder can append to any base prompt.
COMPOSABLE_IDS: tuple[str, ...] = tuple(
    i for i in SUPPORTED_IDS if i not in REQUIRED_KWARGS and i not in TASK_DEFINING_IDS
)

#: Constraints (id, kwargs) that a random-token model passes part of the time, so that GRPO groups
#: have reward variance in tiny end-to-end tests. Pass rates measured on uniformly random Qwen2
#: tokens at 16 / 32 / 64 / 128 tokens: no_comma .94/.83/.73/.50, no all-caps word .73/.62/.39/.12,
#: no letter "z" .82/.69/.48/.18, fewer than 30 words 1.0/1.0/.41/0 (pinned by the tests).
RANDOM_PASSABLE_IDS: tuple[tuple[str, dict], ...] = (
    ("punctuation:no_comma", {}),
    ("change_case:capital_word_frequency", {"capital_frequency": 1, "capital_relation": "less than"}),
    ("keywords:letter_frequency", {"letter": "z", "let_frequency": 1, "let_relation": "less than"}),
    ("length_constraints:number_words", {"num_words": 30, "relation": "less than"}),
)

_SEED_SALT = "mrtpo-if"


# --------------------------------------------------------------------------------------------------
# ground-truth normalisation (parquet round-trips give numpy arrays, numpy scalars, NaN for None)
# --------------------------------------------------------------------------------------------------


def _to_python(value: Any) -> Any:
    """:func:`recipe.mrtpo.tasks.base.to_plain` with NaN -> None and integral floats -> int (IFEval kwargs)."""
    return to_plain(value, nan_to_none=True, integral_floats_to_int=True)


def clean_kwargs(kwargs: Any) -> dict:
    """One instruction's kwargs as a plain dict without None values (IFEval drops them too).

    Accepts None, a mapping (possibly of numpy values) or its JSON string; anything else raises TypeError.
    """
    if kwargs is None:
        return {}
    if isinstance(kwargs, str):
        kwargs = json.loads(kwargs) if kwargs.strip() else {}
    kwargs = _to_python(kwargs)
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise TypeError(f"instruction kwargs must be a mapping, got {type(kwargs).__name__}")
    return {k: v for k, v in kwargs.items() if v is not None}


def _parse_ground_truth(ground_truth: Any) -> tuple[list[str], list[Any]]:
    """The instruction ids and the (raw) kwargs list of a ground truth; ValueError if it has no ids."""
    if isinstance(ground_truth, str):
        ground_truth = json.loads(ground_truth)
    if not isinstance(ground_truth, Mapping) or "instruction_id_list" not in ground_truth:
        raise ValueError(
            "instruction-following ground_truth must be a mapping with 'instruction_id_list' and 'kwargs', "
            f"got {type(ground_truth).__name__}: {str(ground_truth)[:200]}"
        )
    ids = _to_python(ground_truth["instruction_id_list"])
    if isinstance(ids, str):
        ids = [ids]
    if not isinstance(ids, list) or not ids:
        raise ValueError(f"ground_truth['instruction_id_list'] must be a non-empty list, got {ids!r}")
    raw_kwargs = ground_truth.get("kwargs")
    if isinstance(raw_kwargs, str):
        raw_kwargs = json.loads(raw_kwargs)
    if hasattr(raw_kwargs, "tolist"):
        raw_kwargs = list(raw_kwargs)  # numpy object array of dicts: keep the elements as they are
    if raw_kwargs is None:
        raw_kwargs = []
    if not isinstance(raw_kwargs, (list, tuple)):
        raise ValueError(
            f"ground_truth['kwargs'] must be a list (one per instruction), got {type(raw_kwargs).__name__}"
        )
    raw_kwargs = list(raw_kwargs) + [None] * (len(ids) - len(raw_kwargs))
    return [str(i) for i in ids], raw_kwargs


def reward_keys(instruction_ids: list[str]) -> list[str]:
    """Reward names: the instruction id, with ``#2``, ``#3``... for repeats within one prompt."""
    seen: dict[str, int] = {}
    keys = []
    for iid in instruction_ids:
        seen[iid] = seen.get(iid, 0) + 1
        keys.append(iid if seen[iid] == 1 else f"{iid}#{seen[iid]}")
    return keys


_RANDOM_LOCK = threading.Lock()


@contextlib.contextmanager
def _seeded_random(seed: Any) -> Iterator[None]:
    """Seed the global ``random`` (the checkers draw from it) and restore its state afterwards.

    ``seed=None`` leaves the global generator as it is (and advances it). A lock keeps concurrent
    calls of this module from interleaving their draws; other users of the global generator in other
    threads are not stopped, and their draws in between would shift ours (deterministic in one thread).
    """
    if seed is None:
        yield
        return
    with _RANDOM_LOCK:
        state = random.getstate()
        random.seed(seed)
        try:
            yield
        finally:
            random.setstate(state)


def _error(exc: BaseException) -> str:
    """``"ExceptionType: message"``, at most 500 characters."""
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not escape either
        message = "<unprintable>"
    return f"{type(exc).__name__}: {message}"[:500]


def _build_checker(instruction_id: str, kwargs: dict):
    """A checker built with ``kwargs`` and its description; KeyError for an unknown id.

    Missing arguments are drawn by the checker from a generator seeded by the id and kwargs, so the
    same ground truth always gives the same checker.
    """
    cls = REGISTRY.get(instruction_id)
    if cls is None:
        raise KeyError(f"unknown instruction id {instruction_id!r}")
    checker = cls(instruction_id)
    # Always seeded: checkers also draw when a given argument is invalid (IFEval's own data has
    # letter "#" for keywords:letter_frequency, which the checker replaces by a random letter).
    seed = f"{_SEED_SALT}|{instruction_id}|{json.dumps(kwargs, sort_keys=True, default=str)}"
    with _seeded_random(seed):
        description = checker.build_description(**kwargs)
    return checker, description


_MAX_DRAWS = 50


def _rebuild(instruction_id: str, kwargs: dict) -> tuple[str, bool]:
    """The sentence ``kwargs`` build, and whether building it drew from the global ``random``
    (it does when an argument is missing or invalid: the scorer would then draw its own)."""
    checker = REGISTRY[instruction_id](instruction_id)
    with _RANDOM_LOCK:
        state = random.getstate()
        try:
            sentence = checker.build_description(**kwargs)
            drew = random.getstate() != state
        finally:
            random.setstate(state)
    return sentence, drew


def describe_constraint(instruction_id: str, kwargs: dict | None = None, seed: Any = None) -> tuple[str, dict]:
    """Draw a constraint sentence and the kwargs the checker will use, via its ``build_description``.

    ``kwargs=None`` (or missing keys) lets the checker draw random arguments; with ``seed`` the draw
    is deterministic (the global ``random`` is seeded locally and its state restored). The returned
    kwargs (None values dropped; the checker's own normalisation applied, e.g. lower-cased words)
    go in the row's ground truth, the sentence in the prompt and in ``extra_info["constraint_texts"]``.
    The pair is self-consistent: the kwargs rebuild exactly this sentence without any random draw
    (draws the package makes inconsistent, e.g. "There should be 2 paragraphs ... Paragraph 3 must
    start with ...", are redrawn). Ids in :data:`REQUIRED_KWARGS` need that kwarg (e.g.
    ``{"prompt_to_repeat": base_prompt}``).
    Raises KeyError for an unknown or unsupported id, ValueError if no consistent constraint can be
    built from ``kwargs``.
    """
    if instruction_id not in REGISTRY:
        raise KeyError(f"unknown instruction id {instruction_id!r}")
    if instruction_id in UNSUPPORTED_IDS:
        raise KeyError(f"instruction id {instruction_id!r} is not supported offline: {UNSUPPORTED_IDS[instruction_id]}")
    given = clean_kwargs(kwargs)
    required = REQUIRED_KWARGS.get(instruction_id)
    if required and not given.get(required):
        raise ValueError(f"{instruction_id!r} needs kwargs[{required!r}] (text the builder must supply)")
    for attempt in range(_MAX_DRAWS):
        draw_seed = seed if seed is None or attempt == 0 else f"{seed}|redraw{attempt}"
        checker = REGISTRY[instruction_id](instruction_id)
        with _seeded_random(draw_seed):
            sentence = checker.build_description(**given)
        args = clean_kwargs(checker.get_instruction_args() or {})
        again, drew = _rebuild(instruction_id, args)
        if again == sentence and not drew:
            return sentence, args
    raise ValueError(
        f"no self-consistent {instruction_id!r} constraint from kwargs {given} in {_MAX_DRAWS} draws "
        "(an argument is probably invalid for this checker)"
    )
