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
- a block counts as a call if that value is an object with a string ``name`` and an ``arguments``
  (alias ``parameters``) that is an object or a JSON string of one; other keys are ignored. A block
  whose JSON is broken is no call (its call is then missing). At most :data:`MAX_CALLS` blocks are read.

Predicted calls are matched to reference calls one-to-one, order-free, by the assignment that
maximises the total pair score (Hungarian algorithm). A pair scores 0 if the names differ (exact
string match after stripping surrounding whitespace); otherwise it scores ``(1 + m) / (1 + u)`` where
``u`` is the number of argument keys in the union of both calls' keys and ``m`` the number of those
keys present in both with matching values: the name counts as one item, each argument key as one.
Keys holding ``null`` are treated as absent (on both sides; this also undoes the padding a parquet
struct column adds). A key present on one side only is left out of ``u`` when the tool spec declares
it optional (not in ``required``) with a ``default`` that matches the value given. Then::

    correctness = sum of matched pair scores / max(n_pred, n_ref)    (1.0 when both are 0)

so missing and extra calls cost. Examples: right name, 1 of 2 argument values wrong: (1+1)/(1+2)=2/3;
wrong name: 0; reference [A, B], prediction [A]: 1/2; prediction [A, B, C]: 2/3.

Value matching (recursive, nesting bounded): strings are compared case-insensitively with runs of
whitespace collapsed (``"New  York " == "new york"``); a string that spells a number matches that
number (``"5" == 5 == 5.0``, floats within 1e-9 relative); ``"true"``/``"false"`` (any case) match the
booleans; booleans never match numbers; lists match element-wise in order (order-sensitive) and
with equal length; objects match when they have the same keys and every value matches.

:func:`exact_match` is the strict evaluation metric (BFCL-style AST accuracy): the calls read as above
are exactly the reference calls, order-free (every pair perfect, no missing or extra call), with
JSON types kept apart (``"5"`` does not match ``5`` there, as in BFCL's type check).

Contexts (Z_k): ``format`` -> ``Context(TOOL_FORMAT_INSTRUCTION, "prompt")`` (``extra_info
["format_instruction"]`` overrides the text); ``correctness`` -> ``Context(render_tool_calls(ref),
"appended")`` (or :data:`NO_CALL_REFERENCE` when the reference has no call).

For the data builder: the system message is ``system + "\n\n" + render_tools_system_prompt(tools)``
(it holds :data:`TOOL_FORMAT_INSTRUCTION` verbatim, so P_minus_format can cut it out), the gold
answer is ``render_tool_calls(calls)``, BFCL rows convert with :func:`calls_from_bfcl_answer`. Store
``calls`` (or each call's ``arguments``) and ``tools`` as JSON strings in parquet: struct columns pad
argument keys with nulls (undone by the null rule above, but JSON keeps the data exact).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Optional

from recipe.mrtpo.tasks.base import Context, RewardResult, as_text, register_task

__all__ = [
    "TOOL_FORMAT_INSTRUCTION",
    "NO_CALL_REFERENCE",
    "MAX_CALLS",
    "MAX_BLOCK_CHARS",
    "MAX_JSON_DEPTH",
    "MAX_INT_DIGITS",
    "score",
    "exact_match",
    "check_format",
    "extract_calls",
    "correctness_score",
    "values_match",
    "normalise_calls",
    "normalise_tools",
    "render_tool_calls",
    "render_tools_system_prompt",
    "calls_from_bfcl_answer",
]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_TAGS = (THINK_OPEN, THINK_CLOSE, CALL_OPEN, CALL_CLOSE)

MAX_CALLS = 64  # blocks read per response (format: more is invalid; correctness: the rest is ignored)
MAX_BLOCK_CHARS = 32_768  # characters of one block's JSON
MAX_JSON_DEPTH = 32  # nesting of [ and { in one block
MAX_INT_DIGITS = 1_000  # digits of a JSON integer (Python's int parser is quadratic beyond)
_NUMBER_STRING_CHARS = 64  # longest string read as a number
_FLOAT_REL_TOL = 1e-9

# The ONE output-format block the data builder puts verbatim into the system prompt (Z_format).
TOOL_FORMAT_INSTRUCTION = (
    "You may first think step by step inside one <think></think> block at the start of your reply.\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n"
    "<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>\n"
    "Write one <tool_call> block per call and nothing after the last block. If none of the "
    "functions fits the query, call none and answer in plain text."
)

# Z_correctness when the reference makes no call (irrelevance rows).
NO_CALL_REFERENCE = "No function call: none of the provided functions fits the query."

_TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)


# --------------------------------------------------------------------------------------------------
# Hardened JSON decoding
# --------------------------------------------------------------------------------------------------


class _Reject(ValueError):
    """JSON that is syntactically fine but refused (NaN, overflow, duplicate keys, too deep)."""


def _object_pairs(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise _Reject(f"duplicate key {k[:40]!r}")
        out[k] = v
    return out


def _parse_float(s: str) -> float:
    v = float(s)
    if not math.isfinite(v):
        raise _Reject("number overflows a float")
    return v


def _parse_int(s: str) -> int:
    if len(s) > MAX_INT_DIGITS + 1:
        raise _Reject("integer has too many digits")
    return int(s)


def _parse_constant(s: str):
    raise _Reject(f"{s} is not standard JSON")


_DECODER = json.JSONDecoder(
    object_pairs_hook=_object_pairs,
    parse_float=_parse_float,
    parse_int=_parse_int,
    parse_constant=_parse_constant,
)
# A JSON string (its closing quote optional, so that the scan never backtracks: linear time) or a bracket.
_DEPTH_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]', re.DOTALL)
_WS = re.compile(r"\s*")


def _json_depth_ok(text: str) -> bool:
    """Whether [ / { nest at most MAX_JSON_DEPTH deep outside strings (checked before decoding)."""
    depth = 0
    for m in _DEPTH_TOKEN.finditer(text):
        tok = m.group()
        if tok[0] == '"':
            continue
        if tok in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return False
        else:
            depth -= 1
    return True


def _load_json(text: str, allow_trailing: bool = False) -> tuple[Any, Optional[str]]:
    """Decode one JSON value; returns (value, None) or (None, reason). Never raises."""
    text = text.strip()
    if len(text) > MAX_BLOCK_CHARS:
        return None, "block too long"
    if not _json_depth_ok(text):
        return None, "JSON nested too deep"
    try:
        if allow_trailing:
            value, _ = _DECODER.raw_decode(text)
        else:
            value = _DECODER.decode(text)
    except (_Reject, ValueError, RecursionError, OverflowError, MemoryError, TypeError) as e:
        return None, f"invalid JSON: {str(e)[:80]}"
    return value, None


# --------------------------------------------------------------------------------------------------
# Normalisation of ground truth and predictions
# --------------------------------------------------------------------------------------------------


def _to_plain(x: Any, depth: int = 0, drop_none: bool = False) -> Any:
    """numpy arrays/scalars and tuples -> plain Python lists/scalars; dict keys -> str.

    ``drop_none`` removes null-valued dict entries at every level (the "null = absent" rule).
    """
    if depth > 4 * MAX_JSON_DEPTH:
        raise ValueError("value nested too deep")
    if x is None or type(x) in (bool, int, str):
        return x
    if isinstance(x, str):  # numpy.str_ and other subclasses
        return str(x)
    if isinstance(x, int):  # int subclasses (enums); bool was handled above
        return int(x)
    if isinstance(x, float):  # includes numpy.float64
        if not math.isfinite(x):
            raise ValueError(f"non-finite number {x!r}")
        return float(x)
    if isinstance(x, dict):
        return {
            str(k): _to_plain(v, depth + 1, drop_none)
            for k, v in x.items()
            if not (drop_none and v is None)
        }
    if isinstance(x, (list, tuple)):
        return [_to_plain(v, depth + 1, drop_none) for v in x]
    if hasattr(x, "tolist") and hasattr(x, "dtype"):  # numpy array or numpy scalar
        return _to_plain(x.tolist(), depth + 1, drop_none)
    if hasattr(x, "item") and callable(x.item):
        return _to_plain(x.item(), depth + 1, drop_none)
    raise ValueError(f"unsupported value type {type(x).__name__}")


def _maybe_json(x: Any, what: str) -> Any:
    if isinstance(x, (str, bytes)):
        try:
            return json.loads(x)
        except ValueError as e:
            raise ValueError(f"{what} is a string but not JSON: {e}") from None
    return x


def _as_list(x: Any, what: str) -> list:
    x = _maybe_json(x, what)
    if x is None:
        return []
    if isinstance(x, (list, tuple)):
        return list(x)
    if hasattr(x, "tolist") and hasattr(x, "dtype"):
        return list(x)  # keep elements as they are (dicts inside an object array)
    raise ValueError(f"{what} must be a list, got {type(x).__name__}")


def normalise_calls(calls: Any) -> list[dict]:
    """Reference calls -> ``[{"name": str, "arguments": dict}, ...]`` (plain Python, nulls dropped).

    Accepts lists / numpy arrays / JSON strings, calls as dicts or JSON strings, OpenAI's
    ``{"type": "function", "function": {...}}`` wrapper, and ``arguments`` as dict, JSON string or
    absent. Raises ``ValueError`` on anything else (a data bug).
    """
    out = []
    for i, c in enumerate(_as_list(calls, "ground_truth['calls']")):
        c = _maybe_json(c, f"call {i}")
        if not isinstance(c, dict):
            raise ValueError(f"call {i} must be a dict, got {type(c).__name__}")
        if "name" not in c and isinstance(c.get("function"), dict):
            c = c["function"]
        name = c.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"call {i} has no function name: {c!r:.200}")
        args = _maybe_json(c.get("arguments", c.get("parameters")), f"call {i} arguments")
        args = _to_plain(args if args is not None else {}, drop_none=True)
        if not isinstance(args, dict):
            raise ValueError(f"call {i} arguments must be an object, got {type(args).__name__}")
        out.append({"name": name.strip(), "arguments": args})
    return out


def normalise_tools(tools: Any) -> list[dict]:
    """Tool specs -> list of plain dicts (bare or OpenAI-wrapped, as given). Absent -> []."""
    out = []
    for i, t in enumerate(_as_list(tools, "ground_truth['tools']")):
        t = _to_plain(_maybe_json(t, f"tool {i}"))
        if not isinstance(t, dict):
            raise ValueError(f"tool {i} must be a dict, got {type(t).__name__}")
        out.append(t)
    return out


def _tool_optional_defaults(tools: list[dict]) -> dict[str, dict[str, Any]]:
    """name -> {param: default} for the optional parameters that declare a default."""
    table: dict[str, dict[str, Any]] = {}
    for t in tools:
        fn = t.get("function") if isinstance(t.get("function"), dict) else t
        name = fn.get("name")
        params = fn.get("parameters")
        if not isinstance(name, str) or not isinstance(params, dict):
            continue
        props = params.get("properties")
        required = params.get("required") or []
        required = set(required) if isinstance(required, list) else set()
        if not isinstance(props, dict):
            continue
        table[name.strip()] = {
            k: p["default"]
            for k, p in props.items()
            if isinstance(p, dict) and "default" in p and k not in required and p["default"] is not None
        }
    return table


# --------------------------------------------------------------------------------------------------
# Reading the response
# --------------------------------------------------------------------------------------------------


def _has_tag(s: str) -> bool:
    return any(t in s for t in _TAGS)


def _strict_call(obj: Any) -> Optional[str]:
    """Reason why a decoded block is not a format-valid call, or None."""
    if not isinstance(obj, dict):
        return "block is not a JSON object"
    if set(obj) != {"name", "arguments"}:
        return f"keys must be exactly name and arguments, got {sorted(obj)[:6]}"
    if not isinstance(obj["name"], str) or not obj["name"].strip():
        return "name must be a non-empty string"
    if not isinstance(obj["arguments"], dict):
        return "arguments must be a JSON object"
    return None


def check_format(response: str, allow_plain_text: bool = False) -> tuple[bool, str]:
    """(valid, reason) for the format reward; ``allow_plain_text`` is the irrelevance rule."""
    text = as_text(response)
    pos = _WS.match(text).end()
    if text.startswith(THINK_OPEN, pos):
        start = pos + len(THINK_OPEN)
        end = text.find(THINK_CLOSE, start)
        if end < 0:
            return False, "unterminated <think>"
        if _has_tag(text[start:end]):
            return False, "tag inside <think>"
        pos = end + len(THINK_CLOSE)
    pos = _WS.match(text, pos).end()
    if pos == len(text):
        return False, "no tool call and no text"
    if not text.startswith(CALL_OPEN, pos):
        if allow_plain_text and not _has_tag(text[pos:]):
            return True, ""
        return False, "text outside <tool_call> blocks"
    n = 0
    while pos < len(text):
        if not text.startswith(CALL_OPEN, pos):
            return False, "text outside <tool_call> blocks"
        if n >= MAX_CALLS:
            return False, f"more than {MAX_CALLS} tool calls"
        start = pos + len(CALL_OPEN)
        end = text.find(CALL_CLOSE, start)
        if end < 0:
            return False, "unterminated <tool_call>"
        inner = text[start:end]
        if _has_tag(inner):
            return False, "nested tag inside <tool_call>"
        obj, err = _load_json(inner)
        if err:
            return False, err
        err = _strict_call(obj)
        if err:
            return False, err
        n += 1
        pos = _WS.match(text, end + len(CALL_CLOSE)).end()
    return True, ""


def _lenient_call(obj: Any) -> Optional[dict]:
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    args = obj.get("arguments", obj.get("parameters"))
    if isinstance(args, str):
        args, err = _load_json(args)
        if err:
            return None
    if not isinstance(args, dict):
        return None
    try:
        args = _to_plain(args, drop_none=True)
    except (ValueError, RecursionError):
        return None
    return {"name": name.strip(), "arguments": args}


def _outside_think(text: str) -> str:
    """The text with think blocks removed (see the module docstring). Linear time."""
    pos = 0
    first_close, first_open = text.find(THINK_CLOSE), text.find(THINK_OPEN)
    if first_close >= 0 and (first_open < 0 or first_close < first_open):
        pos = first_close + len(THINK_CLOSE)  # the think block was opened by the prompt
    parts = []
    while True:
        o = text.find(THINK_OPEN, pos)
        c = text.find(THINK_CLOSE, o + len(THINK_OPEN)) if o >= 0 else -1
        if c < 0:  # no further think block (an unterminated one skips nothing)
            parts.append(text[pos:])
            return "".join(parts)
        parts.append(text[pos:o])
        pos = c + len(THINK_CLOSE)


def extract_calls(response: str) -> list[dict]:
    """The calls ``correctness`` reads (lenient; see the module docstring). Never raises."""
    text = _outside_think(as_text(response))
    pos = 0
    calls: list[dict] = []
    next_close = -2  # cached position of the next </tool_call> at or after the block start
    for _ in range(MAX_CALLS):
        o = text.find(CALL_OPEN, pos)
        if o < 0:
            break
        start = o + len(CALL_OPEN)
        if next_close != -1 and next_close < start:
            next_close = text.find(CALL_CLOSE, start)
        nxt_open = text.find(CALL_OPEN, start, start + MAX_BLOCK_CHARS + len(CALL_OPEN))
        ends = [e for e in (next_close, nxt_open) if e >= 0]
        end = min(ends) if ends else len(text)
        obj, err = _load_json(text[start : min(end, start + MAX_BLOCK_CHARS)], allow_trailing=True)
        call = None if err else _lenient_call(obj)
        if call is not None:
            calls.append(call)
        pos = end
    return calls


# --------------------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------------------

_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def _scalar_key(x: Any) -> tuple:
    """Canonical (kind, value) of a scalar for matching."""
    if isinstance(x, bool):
        return ("bool", x)
    if isinstance(x, (int, float)):
        return ("num", x)
    if isinstance(x, str):
        s = " ".join(x.split()).casefold()
        if s in ("true", "false"):
            return ("bool", s == "true")
        if len(s) <= _NUMBER_STRING_CHARS and _NUMBER.fullmatch(s):
            if any(c in s for c in ".eE"):
                v = float(s)
                if math.isfinite(v):
                    return ("num", v)
            else:
                return ("num", int(s))
        return ("str", s)
    return ("other", repr(type(x)))


def _numbers_equal(a, b) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    try:
        fa, fb = float(a), float(b)
    except OverflowError:
        return a == b  # Python compares a huge int with a float exactly
    if not (math.isfinite(fa) and math.isfinite(fb)):
        return False
    return math.isclose(fa, fb, rel_tol=_FLOAT_REL_TOL, abs_tol=1e-12)


def values_match(a: Any, b: Any, strict_types: bool = False, depth: int = 0) -> bool:
    """Whether two argument values match under the documented normalisation.

    ``strict_types`` (used by :func:`exact_match`) keeps JSON types apart, as BFCL's type check does:
    a string never matches a number or a boolean (ints and floats still match each other).
    """
    if depth > 4 * MAX_JSON_DEPTH:
        return False
    if isinstance(a, dict) or isinstance(b, dict):
        if not (isinstance(a, dict) and isinstance(b, dict)) or set(a) != set(b):
            return False
        return all(values_match(a[k], b[k], strict_types, depth + 1) for k in a)
    if isinstance(a, list) or isinstance(b, list):
        if not (isinstance(a, list) and isinstance(b, list)) or len(a) != len(b):
            return False
        return all(values_match(x, y, strict_types, depth + 1) for x, y in zip(a, b))
    if a is None or b is None:
        return a is None and b is None
    if strict_types and isinstance(a, str) != isinstance(b, str):
        return False
    ka, kb = _scalar_key(a), _scalar_key(b)
    if ka[0] != kb[0]:
        return False
    if ka[0] == "num":
        return _numbers_equal(ka[1], kb[1])
    return ka[1] == kb[1]


def _pair_score(pred: dict, ref: dict, defaults: dict[str, dict[str, Any]], strict_types: bool = False) -> float:
    if pred["name"] != ref["name"]:
        return 0.0
    pa, ra = pred["arguments"], ref["arguments"]
    dflt = defaults.get(ref["name"], {})
    items = matched = 0
    for k in set(pa) | set(ra):
        if k in pa and k in ra:
            items += 1
            matched += values_match(pa[k], ra[k], strict_types)
            continue
        given = pa[k] if k in pa else ra[k]
        if k in dflt and values_match(given, dflt[k]):
            continue  # an optional argument spelled out (or left out) at its default value
        items += 1
    return (1.0 + matched) / (1.0 + items)


def _max_assignment(w: list[list[float]]) -> float:
    """Maximum total weight of a one-to-one matching (weights >= 0; Hungarian, O(n^2 m))."""
    if not w or not w[0]:
        return 0.0
    if len(w) > len(w[0]):
        w = [list(col) for col in zip(*w)]
    n, m = len(w), len(w[0])
    inf = float("inf")
    u, v = [0.0] * (n + 1), [0.0] * (m + 1)
    p, way = [0] * (m + 1), [0] * (m + 1)
    for i in range(1, n + 1):
        p[0], j0 = i, 0
        minv, used = [inf] * (m + 1), [False] * (m + 1)
        while True:
            used[j0] = True
            i0, delta, j1 = p[j0], inf, 0
            row = w[i0 - 1]
            for j in range(1, m + 1):
                if not used[j]:
                    cur = -row[j - 1] - u[i0] - v[j]
                    if cur < minv[j]:
                        minv[j], way[j] = cur, j0
                    if minv[j] < delta:
                        delta, j1 = minv[j], j
            for j in range(m + 1):
                if used[j]:
                    u[p[j]] += delta
                    v[j] -= delta
                else:
                    minv[j] -= delta
            j0 = j1
            if p[j0] == 0:
                break
        while j0:
            j1 = way[j0]
            p[j0] = p[j1]
            j0 = j1
    return sum(w[p[j] - 1][j - 1] for j in range(1, m + 1) if p[j])


def correctness_score(
    pred: list[dict], ref: list[dict], tools: Optional[list[dict]] = None, strict_types: bool = False
) -> float:
    """Best order-free matching of predicted to reference calls, normalised by max(n_pred, n_ref)."""
    if not pred and not ref:
        return 1.0
    if not pred or not ref:
        return 0.0
    defaults = _tool_optional_defaults(tools or [])
    w = [[_pair_score(p, r, defaults, strict_types) for r in ref] for p in pred]
    total = _max_assignment(w)
    return min(1.0, max(0.0, total / max(len(pred), len(ref))))


def _ground_truth(ground_truth: Any) -> tuple[list[dict], list[dict]]:
    gt = _maybe_json(ground_truth, "ground_truth")
    if not isinstance(gt, dict) or "calls" not in gt:
        raise ValueError(f"tool_calling ground_truth must be a dict with 'calls', got {gt!r:.200}")
    return normalise_calls(gt["calls"]), normalise_tools(gt.get("tools"))


def score(response: str, ground_truth: dict, extra_info: dict | None = None) -> RewardResult:
    """Rewards ``format`` and ``correctness`` of one response (see the module docstring)."""
    ref, tools = _ground_truth(ground_truth)
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
        fmt, corr = float(ok), correctness_score(pred, ref, tools)
        info.update(n_pred_calls=len(pred), format_error=reason or None)
    except Exception as e:  # defensive: untrusted output must never crash the reward manager
        fmt, corr = 0.0, 0.0
        info["error"] = f"{type(e).__name__}: {str(e)[:200]}"
    return RewardResult(scores={"format": fmt, "correctness": corr}, contexts=contexts, info=info)


def exact_match(response: str, ground_truth: dict, require_format: bool = False) -> bool:
    """Strict evaluation metric: the calls read from ``response`` are exactly the reference calls
    (order-free, same count, every argument matching with JSON types kept apart, see
    :func:`values_match`). ``require_format`` also demands format 1."""
    ref, tools = _ground_truth(ground_truth)
    try:
        text = as_text(response)
        if require_format and not check_format(text, allow_plain_text=not ref)[0]:
            return False
        pred = extract_calls(text)
        if len(pred) != len(ref):
            return False
        return correctness_score(pred, ref, tools, strict_types=True) >= 1.0 - 1e-12
    except Exception:
        return False


# --------------------------------------------------------------------------------------------------
# Rendering for the data builder
# --------------------------------------------------------------------------------------------------


def render_tool_calls(calls: Any) -> str:
    """Calls in the response format (the gold answer, and Z_correctness): one ``<tool_call>`` block
    per call, ``name`` then ``arguments`` with argument keys sorted (deterministic). [] -> ""."""
    blocks = []
    for c in normalise_calls(calls):
        body = (
            '{"name": ' + json.dumps(c["name"], ensure_ascii=False)
            + ', "arguments": ' + json.dumps(c["arguments"], ensure_ascii=False, sort_keys=True, allow_nan=False)
            + "}"
        )
        blocks.append(f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}")
    return "\n".join(blocks)


def render_tools_system_prompt(tools: Any) -> str:
    """The tools section of the system prompt, as Qwen2.5's chat template writes it (``# Tools`` ...
    ``<tools></tools>`` with one JSON spec per line, bare specs wrapped as ``{"type": "function",
    "function": spec}``), followed by :data:`TOOL_FORMAT_INSTRUCTION` verbatim. The builder appends it
    to the system message after a blank line (``system + "\\n\\n" + section``)."""
    lines = []
    for t in normalise_tools(tools):
        if not (t.get("type") == "function" and isinstance(t.get("function"), dict)):
            t = {"type": "function", "function": t}
        lines.append("\n" + json.dumps(t, ensure_ascii=False))
    return _TOOLS_HEADER + "".join(lines) + "\n</tools>\n\n" + TOOL_FORMAT_INSTRUCTION


def _first_allowed(allowed: Any, required: bool = False) -> tuple[bool, Any]:
    """(present, value) from a BFCL allowed-values list: the first value, where a leading ``""``
    (BFCL: the argument may be omitted) means omitted unless ``required`` (then the first other
    value). An empty list gives nothing (a BFCL data quirk)."""
    if isinstance(allowed, (list, tuple)) or (hasattr(allowed, "dtype") and hasattr(allowed, "tolist")):
        allowed = list(allowed)
    else:  # a bare value (some converted sets store it without the list)
        allowed = [allowed]
    if required:
        allowed = [a for a in allowed if not (isinstance(a, str) and a == "")]
    if not allowed or (isinstance(allowed[0], str) and allowed[0] == ""):
        return False, None
    return True, _bfcl_value(allowed[0])


def _bfcl_value(v: Any) -> Any:
    """A chosen BFCL value; dicts inside hold allowed-value lists per key again (nested params)."""
    if isinstance(v, dict):
        out = {}
        for k, allowed in v.items():
            present, val = _first_allowed(allowed)
            if present:
                out[str(k)] = val
        return out
    if isinstance(v, (list, tuple)):
        return [_bfcl_value(x) for x in v]
    return _to_plain(v)


def calls_from_bfcl_answer(answer: Any, functions: Any = None) -> list[dict]:
    """BFCL ``possible_answer`` -> reference calls ``[{"name", "arguments"}, ...]``.

    ``answer`` is the ``ground_truth`` list ``[{func_name: {arg: [allowed values...]}}, ...]`` (or the
    whole possible_answer row holding it). Each argument takes its first allowed value; an argument
    whose first allowed value is ``""`` (BFCL: optional, may be omitted) is left out, except when
    ``functions`` (the row's function docs) lists it as required: then it takes its first other value.
    """
    if isinstance(answer, dict) and "ground_truth" in answer:
        answer = answer["ground_truth"]
    required: dict[str, set] = {}
    for f in normalise_tools(functions):
        f = f.get("function") if isinstance(f.get("function"), dict) else f
        params = f.get("parameters") if isinstance(f.get("parameters"), dict) else {}
        req = params.get("required")
        required[str(f.get("name"))] = set(req) if isinstance(req, list) else set()
    calls = []
    for i, entry in enumerate(_as_list(answer, "BFCL answer")):
        if not isinstance(entry, dict) or len(entry) != 1:
            raise ValueError(f"BFCL answer entry {i} must be {{func_name: {{arg: [allowed]}}}}, got {entry!r:.200}")
        ((name, args),) = entry.items()
        if not isinstance(args, dict):
            raise ValueError(f"BFCL answer entry {i}: arguments of {name!r} must be a dict")
        out = {}
        for k, allowed in args.items():
            present, val = _first_allowed(allowed, required=k in required.get(str(name), ()))
            if present:
                out[str(k)] = val
        calls.append({"name": str(name), "arguments": out})
    return normalise_calls(calls)


register_task("tool_calling", score)
register_task("bfcl", score)
