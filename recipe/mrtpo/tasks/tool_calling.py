"""Tool-calling verifier (BFCL-style function calls in Qwen2.5's ``<tool_call>`` convention).

Response format (what :data:`TOOL_FORMAT_INSTRUCTION` asks for)::

    <think>
    optional reasoning, at most one block, only at the start
    </think>
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
    <tool_call>
    ...
    </tool_call>

Ground truth: ``{"calls": [{"name": str, "arguments": dict}, ...], "tools": [spec, ...]}``. ``tools``
(JSON-schema function specs, bare as in BFCL or wrapped ``{"type": "function", "function": spec}``
as in OpenAI's format) may be absent. After a parquet round trip, lists may be numpy arrays, scalars
numpy scalars, and ``calls`` / a call / its ``arguments`` / a tool may be JSON strings: all are
normalised. A malformed ground truth (data bug, not model output) raises ``ValueError``.

Rewards
-------
``format`` in {0, 1}: 1 iff the response is, apart from surrounding whitespace,

- an optional single leading ``<think>...</think>`` whose content holds none of the four tags
  (``<think>``, ``</think>``, ``<tool_call>``, ``</tool_call>``), then
- one or more ``<tool_call>...</tool_call>`` blocks (at most :data:`MAX_CALLS`), separated only by
  whitespace and followed by nothing but whitespace, each holding no nested tag and exactly one
  standard JSON object (no NaN/Infinity, no duplicate keys, no float that overflows, no integer
  over :data:`MAX_INT_DIGITS` digits, nesting at most :data:`MAX_JSON_DEPTH`, at most
  :data:`MAX_BLOCK_CHARS` characters) with exactly the keys ``name`` (non-empty string) and
  ``arguments`` (object).
- Irrelevance rule: when the reference has zero calls, a response with no tool call is also
  format-valid if, after the optional think block, it holds some non-whitespace text and none of the
  four tags (the model declines in plain text). Well-formed tool calls remain format-valid there
  (the wrong decision costs ``correctness``, not ``format``). When the reference has calls, a
  plain-text answer is format 0.

``correctness`` in [0, 1]: calls are read *leniently*, independently of ``format``, so that one defect
costs only the reward it concerns:

- think blocks are skipped: every ``<think>...</think>`` span, and all text before a ``</think>`` that
  has no ``<think>`` before it (a template that opens the think block in the prompt); an unterminated
  ``<think>`` skips nothing. In the remaining text each ``<tool_call>`` opens a block that ends at
  the next ``</tool_call>``, the next ``<tool_call>`` or the end of the response (so a missing closing
  tag is forgiven); the first JSON value of the block is decoded and text after it is ignored;
- a block counts as a call if that value is an object with a string ``name`` (kept exactly as
  written) and an ``arguments`` (alias ``parameters``) that is an object or a JSON string of one;
  other keys are ignored. Null-valued arguments are kept (BFCL rejects them). A block whose JSON is
  broken is no call (its call is then missing). At most :data:`MAX_CALLS` blocks are read.

Ground truth (:mod:`recipe.mrtpo.tasks.tool_reference`): each reference call may carry ``accepted``,
every acceptable value of every argument in BFCL's possible-answer notation (``""`` = may be
omitted); the plain shape ``{"name", "arguments"}`` means each value is the only acceptable one.

Full credit is exactly BFCL validity (:mod:`recipe.mrtpo.tasks.tool_match`): names equal; required
and non-omittable arguments present; every argument declared, of the spec's type (a float for an
``integer`` parameter fails, an integer for a ``number`` passes; ``null`` fails) and among the
acceptable values after BFCL's string normalisation (case, spaces and ``,./-_*^`` ignored); no
forgiveness for a parameter's ``default``. Partial credit keeps its shape below that: predicted calls
are matched to reference calls one-to-one, order-free, by the assignment that maximises the total
pair score (Hungarian algorithm); a pair scores 0 if the names differ, else ``(1 + m) / (1 + u)``
(``u``: given arguments plus missing mandatory ones, ``m``: the valid given ones)::

    correctness = sum of matched pair scores / max(n_pred, n_ref)    (1.0 when both are 0)

so missing and extra calls cost. Examples: right name, 1 of 2 argument values wrong: (1+1)/(1+2)=2/3;
wrong name: 0; reference [A, B], prediction [A]: 1/2; prediction [A, B, C]: 2/3.

:func:`exact_match` (the recipe's AST accuracy in evaluation) is ``correctness == 1`` with as many
calls as the reference. The evaluation also runs BFCL's own checker
(:mod:`recipe.mrtpo.tools.eval.bfcl_official`); ``docs/benchmarks.md`` lists where they can differ.

Contexts (Z_k): ``format`` -> ``Context(TOOL_FORMAT_INSTRUCTION, "prompt")`` (``extra_info
["format_instruction"]`` overrides the text); ``correctness`` -> ``Context(render_tool_calls(ref),
"appended")`` (or :data:`NO_CALL_REFERENCE` when the reference has no call).

For the data builder: the system message is ``system + "\n\n" + render_tools_system_prompt(tools)``
(it holds :data:`TOOL_FORMAT_INSTRUCTION` verbatim, so P_minus_format can cut it out), the gold
answer is ``render_tool_calls(calls)``, BFCL rows convert with :func:`calls_from_bfcl_answer`
(keeping every acceptable value; undeclared arguments dropped and counted). Store
``calls`` (or each call's ``arguments``) and ``tools`` as JSON strings in parquet: struct columns pad
argument keys with nulls (undone by the null rule above, but JSON keeps the data exact).
"""

from __future__ import annotations

from typing import Any

from recipe.mrtpo.tasks.base import Context, RewardResult, as_text, register_task
from recipe.mrtpo.tasks.tool_json import (
    CALL_CLOSE,
    CALL_OPEN,
    MAX_BLOCK_CHARS,
    MAX_CALLS,
    MAX_INT_DIGITS,
    MAX_JSON_DEPTH,
    THINK_CLOSE,
    THINK_OPEN,
    check_format,
    extract_calls,
    maybe_json,
)
from recipe.mrtpo.tasks.tool_match import correctness_score as _correctness
from recipe.mrtpo.tasks.tool_match import param_valid, standardize_string
from recipe.mrtpo.tasks.tool_reference import (
    NO_CALL_REFERENCE,
    TOOL_FORMAT_INSTRUCTION,
    calls_from_bfcl_answer,
    function_specs,
    normalise_calls,
    normalise_tools,
    render_tool_calls,
    render_tools_system_prompt,
)

__all__ = [
    "TOOL_FORMAT_INSTRUCTION",
    "NO_CALL_REFERENCE",
    "MAX_CALLS",
    "MAX_BLOCK_CHARS",
    "MAX_JSON_DEPTH",
    "MAX_INT_DIGITS",
    "THINK_OPEN",
    "THINK_CLOSE",
    "CALL_OPEN",
    "CALL_CLOSE",
    "score",
    "exact_match",
    "check_format",
    "extract_calls",
    "correctness_score",
    "param_valid",
    "standardize_string",
    "normalise_calls",
    "normalise_tools",
    "function_specs",
    "parse_ground_truth",
    "render_tool_calls",
    "render_tools_system_prompt",
    "calls_from_bfcl_answer",
]


def parse_ground_truth(ground_truth: Any) -> tuple[list[dict], list[dict]]:
    """(reference calls, tool specs) of a ground truth; ValueError when malformed (a data bug)."""
    gt = maybe_json(ground_truth, "ground_truth")
    if not isinstance(gt, dict) or "calls" not in gt:
        raise ValueError(f"tool_calling ground_truth must be a dict with 'calls', got {gt!r:.200}")
    return normalise_calls(gt["calls"]), normalise_tools(gt.get("tools"))


def correctness_score(pred: list[dict], ref: Any, tools: Any = None) -> float:
    """The ``correctness`` reward of already extracted calls against reference calls (any accepted
    shape, normalised here) and optional tool specs."""
    return _correctness(pred, normalise_calls(ref), function_specs(normalise_tools(tools)))


def score(response: str, ground_truth: dict, extra_info: dict | None = None) -> RewardResult:
    """Rewards ``format`` and ``correctness`` of one response (see the module docstring)."""
    ref, tools = parse_ground_truth(ground_truth)
    instr = (extra_info or {}).get("format_instruction") if isinstance(extra_info, dict) else None
    contexts = {
        "format": Context(instr if isinstance(instr, str) and instr else TOOL_FORMAT_INSTRUCTION, "prompt"),
        "correctness": Context(render_tool_calls(ref) or NO_CALL_REFERENCE, "appended"),
    }
    info: dict[str, Any] = {"n_ref_calls": len(ref)}
    try:
        text = as_text(response)
        ok, reason = check_format(text, allow_plain_text=not ref)
        pred = extract_calls(text)
        fmt, corr = float(ok), _correctness(pred, ref, function_specs(tools))
        info.update(n_pred_calls=len(pred), format_error=reason or None)
    except Exception as e:  # defensive: untrusted output must never crash the reward manager
        fmt, corr = 0.0, 0.0
        info["error"] = f"{type(e).__name__}: {str(e)[:200]}"
    return RewardResult(scores={"format": fmt, "correctness": corr}, contexts=contexts, info=info)


def exact_match(response: str, ground_truth: dict, require_format: bool = False) -> bool:
    """The recipe's AST match: as many calls as the reference and ``correctness == 1`` (every pair
    BFCL-valid, order-free). ``require_format`` also demands format 1."""
    ref, tools = parse_ground_truth(ground_truth)
    try:
        text = as_text(response)
        if require_format and not check_format(text, allow_plain_text=not ref)[0]:
            return False
        pred = extract_calls(text)
        if len(pred) != len(ref):
            return False
        return _correctness(pred, ref, function_specs(tools)) >= 1.0 - 1e-12
    except Exception:
        return False


register_task("tool_calling", score)
register_task("bfcl", score)
