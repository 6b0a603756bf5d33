"""Instruction-following verifier: one reward per constraint (IFEval / IFBench checkers).

The checkers are the maintained ones of ``if-verifiable`` (IFEval's 25 and IFBench's 58; set-up,
registry and constraint drawing in :mod:`recipe.mrtpo.tasks.if_registry`). For a row with
``ground_truth = {"instruction_id_list": [...], "kwargs": [...]}`` the verifier returns one reward per
constraint, keyed by the instruction id (``"punctuation:no_comma"``; a repeated id within one prompt
gets ``"#2"``, ``"#3"``...), scored 1.0 / 0.0.

Semantics are the official ones (Google's ``evaluation_main.py``, as copied in lm-eval's
``tasks/ifeval/utils.py``):

- *strict*: the checker's ``check_following`` on the response **as given** (no stripping), and a
  response that is empty or only whitespace passes nothing;
- *loose*: pass if any of the 8 official variants passes: the response, it without its first line,
  without its last line, without both (each of these three ``.strip()``-ed, as the official code
  does), and the same four with every ``*`` removed (lines split on ``"\\n"``).

Reasoning blocks (``strip_reasoning``): an explicit option, **off** in evaluation (where the response
is checked as the benchmark checks it; turn it on for a thinking model whose reasoning is part of the
generated text). When on, everything up to and including the first ``</think>`` is removed and the
answer's leading whitespace with it (a chat template writes ``</think>\\n\\n``, which would otherwise
be the "first line" of the loose variants); a response that opens ``<think>`` and never closes it has
no answer and passes nothing (``info["errors"]`` says so, counted). The training reward
(:func:`score`, what the reward manager calls) turns it **on**: a constraint is about the answer, and
rewarding a reasoning text that happens to satisfy it (no commas, a word count) would teach the
wrong thing; for a model without reasoning blocks it changes nothing.

Long responses: no length cap. Checks of responses up to
:data:`if_isolation.IN_PROCESS_MAX_CHARS` characters run in the calling process (the worst checker
takes a few seconds there); longer ones run in a worker process with a time limit per check
(:mod:`recipe.mrtpo.tasks.if_isolation`): a check past it fails with a ``CheckTimeout`` error in
``info["errors"]`` (counted) and every other check gets its official verdict.

Z_k of each reward is ``Context(sentence, "prompt")``: the constraint's exact sentence, taken from
``extra_info["constraint_texts"][i]`` (builders record it there, in instruction order). Without it the
sentence falls back to the checker's own ``build_description(**kwargs)``, which is *not* guaranteed
to be verbatim in the prompt (IFEval's prompts paraphrase their constraints): the replay then finds
no substring and gives that reward uniform weights (counted), never a wrong weight.

Robustness: an exception of a checker that is the response's doing (``ValueError``, ``KeyError``,
``RecursionError`` ... on odd text), an unknown instruction id or bad kwargs score that reward 0.0 and are
recorded in ``RewardResult.info["errors"]`` as ``{reward_key: "ExceptionType: message"}``; no such exception
escapes, whatever the response. An exception that is the node's fault, not the response's
(:func:`if_isolation.environment_fault`: ``LookupError`` for NLTK data that is not there, an ``ImportError``, an
``OSError``; the check's worker process that does not start) is no verdict: the training reward
(:func:`score`, what the reward manager calls) raises ``tasks.base.NoVerdict`` naming the constraint and the error,
and the row leaves the training step (counted, never a 0). (``words:start_verb`` needs NLTK's
``averaged_perceptron_tagger_eng``, which ``.assets/nltk_data`` does not hold: such rows leave training until the
node has it.) :func:`evaluate` records the error and scores 0 unless asked to raise (``no_verdict="raise"``): the
evaluation counts it (``n_checker_errors``), as before. In the loose mode a variant that passes still decides (any passing variant is the official verdict);
only a verdict of "fails" needs every variant checked. A ground truth without an ``instruction_id_list`` is a data
bug and raises ``ValueError``. Ground truths read back from parquet (numpy arrays, NaN or None for
absent kwargs, floats for ints) are normalised first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from recipe.mrtpo.tasks import if_isolation
from recipe.mrtpo.tasks.base import Context, NoVerdict, RewardResult, as_text, register_task
from recipe.mrtpo.tasks.if_registry import (  # noqa: F401 - re-exported for builders and tests
    _REFUSED_DOWNLOADS,
    COMPOSABLE_IDS,
    DEFAULT_NLTK_DATA,
    IFBENCH_IDS,
    IFEVAL_IDS,
    NLTK_DATA_ENV,
    RANDOM_PASSABLE_IDS,
    REGISTRY,
    REQUIRED_KWARGS,
    SUPPORTED_IDS,
    TASK_DEFINING_IDS,
    UNSUPPORTED_IDS,
    _build_checker,
    _error,
    _parse_ground_truth,
    _rebuild,
    _to_python,
    clean_kwargs,
    describe_constraint,
    nltk_data_dir,
    reward_keys,
)

Mode = Literal["strict", "loose"]
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
NO_ANSWER = "NoAnswer: the response opens <think> and never closes it (strip_reasoning)"


def loose_variants(response: str) -> list[str]:
    """The 8 official loose variants, in the official order (the response itself first)."""
    r = response.split("\n")
    remove_first = "\n".join(r[1:]).strip()
    remove_last = "\n".join(r[:-1]).strip()
    remove_both = "\n".join(r[1:-1]).strip()
    return [response, response.replace("*", ""), remove_first, remove_last, remove_both,
            remove_first.replace("*", ""), remove_last.replace("*", ""), remove_both.replace("*", "")]


def strip_reasoning_block(response: str) -> str | None:
    """The answer after the first ``</think>`` (leading whitespace removed); the response unchanged
    if it has no ``</think>``; None when it opens ``<think>`` (after whitespace) and never closes it."""
    end = response.find(THINK_CLOSE)
    if end >= 0:
        return response[end + len(THINK_CLOSE):].lstrip()
    if response.lstrip().startswith(THINK_OPEN):
        return None
    return response


def _passes(checker, iid: str, kwargs: dict, text: str) -> bool:
    """Official per-variant test: non-blank and ``check_following``; long texts time-limited."""
    if not text.strip():
        return False
    if len(text) > if_isolation.in_process_max_chars():
        return if_isolation.run_isolated(iid, kwargs, text)
    return bool(checker.check_following(text))


def _check(checker, iid: str, kwargs: dict, response: str, mode: Mode) -> bool:
    """Strict: the response passes. Loose: any official variant passes (a variant whose check raised cannot
    make it fail: its first error is raised, one of the node (no verdict) before any other)."""
    if mode == "strict":
        return _passes(checker, iid, kwargs, response)
    errors: list = []
    for variant in loose_variants(response):
        try:
            if _passes(checker, iid, kwargs, variant):
                return True
        except Exception as exc:  # noqa: BLE001 - one bad variant must not hide a passing one
            errors.append(exc)
    no_verdict = [e for e in errors if isinstance(e, NoVerdict) or if_isolation.environment_fault(e)]
    if no_verdict or errors:
        raise (no_verdict or errors)[0]
    return False


def _constraint_texts(extra_info: Any) -> list:
    if not isinstance(extra_info, Mapping):
        return []
    texts = _to_python(extra_info.get("constraint_texts"))
    if isinstance(texts, str):
        texts = [texts]
    return texts if isinstance(texts, list) else []


def evaluate(
    response: str,
    ground_truth: dict,
    extra_info: dict | None = None,
    *,
    mode: Mode = "strict",
    strip_reasoning: bool = False,
    no_verdict: Literal["raise", "record"] = "record",
) -> RewardResult:
    """One 1.0/0.0 reward per constraint of ``ground_truth`` (see the module docstring).

    ``mode``: ``"strict"`` or ``"loose"`` (official semantics); ``strip_reasoning``: remove a
    reasoning block first (off by default: the response as generated). ``info["errors"]`` maps
    reward keys to the error that zeroed them (empty when none did). ``no_verdict="raise"``: a check that failed
    through its node's fault raises ``NoVerdict`` instead (module docstring).
    """
    if mode not in ("strict", "loose"):
        raise ValueError(f"mode must be 'strict' or 'loose', got {mode!r}")
    if no_verdict not in ("raise", "record"):
        raise ValueError(f"no_verdict must be 'raise' or 'record', got {no_verdict!r}")
    ids, raw_kwargs = _parse_ground_truth(ground_truth)
    texts = _constraint_texts(extra_info)
    keys = reward_keys(ids)
    try:
        text = as_text(response)
    except Exception:  # noqa: BLE001 - str methods only; kept for hostile subclasses of str
        text = ""
    no_answer = None
    if strip_reasoning:
        answer = strip_reasoning_block(text)
        no_answer, text = (NO_ANSWER, "") if answer is None else (None, answer)

    scores: dict[str, float] = {}
    contexts: dict[str, Context] = {}
    errors: dict[str, str] = {}
    for i, (key, iid) in enumerate(zip(keys, ids)):
        given = texts[i] if i < len(texts) and isinstance(texts[i], str) and texts[i] else None
        description = None
        passed = False
        try:
            kwargs = clean_kwargs(raw_kwargs[i])
            checker, description = _build_checker(iid, kwargs)
            if no_answer:
                errors[key] = no_answer
            else:
                passed = _check(checker, iid, kwargs, text, mode)
        except Exception as exc:  # noqa: BLE001 - a checker must never crash the reward
            environment = isinstance(exc, NoVerdict) or if_isolation.environment_fault(exc)
            if environment and no_verdict == "raise":
                if isinstance(exc, NoVerdict):
                    raise
                raise NoVerdict(f"instruction_following: {key}: {_error(exc)}") from exc
            errors[key] = _error(exc)
        scores[key] = 1.0 if passed else 0.0
        sentence = given or (description if isinstance(description, str) and description else iid)
        contexts[key] = Context(sentence, "prompt")
    return RewardResult(scores=scores, contexts=contexts, info={"errors": errors})


def score(response: str, ground_truth: dict, extra_info: dict | None = None) -> RewardResult:
    """Training reward: the strict pass on the answer (reasoning block removed), one reward per constraint; no
    verdict (an error of the node) raises ``NoVerdict``."""
    return evaluate(response, ground_truth, extra_info, mode="strict", strip_reasoning=True, no_verdict="raise")


def score_loose(response: str, ground_truth: dict, extra_info: dict | None = None) -> RewardResult:
    """Loose pass on the answer (reasoning block removed), one reward per constraint; no verdict raises."""
    return evaluate(response, ground_truth, extra_info, mode="loose", strip_reasoning=True, no_verdict="raise")


register_task("instruction_following", score)
register_task("ifeval", score)
register_task("ifbench", score)
