"""Reading tool calls out of a response: hardened JSON, the ``format`` check, the lenient extraction.

Part of the tool-calling verifier (:mod:`recipe.mrtpo.tasks.tool_calling`, whose docstring states the
response format and both reading rules). Model output is hostile input: nothing here raises for any
response text; size, nesting and number-length limits keep every step linear or bounded.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Optional

from recipe.mrtpo.tasks.base import as_text

__all__ = [
    "THINK_OPEN", "THINK_CLOSE", "CALL_OPEN", "CALL_CLOSE",
    "MAX_CALLS", "MAX_BLOCK_CHARS", "MAX_JSON_DEPTH", "MAX_INT_DIGITS",
    "to_plain", "maybe_json", "as_list", "load_json", "check_format", "extract_calls", "outside_think",
]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_TAGS = (THINK_OPEN, THINK_CLOSE, CALL_OPEN, CALL_CLOSE)

MAX_CALLS = 64  # blocks read per response (format: more is invalid; correctness: the rest is ignored)
MAX_BLOCK_CHARS = 32_768  # characters of one block's JSON
MAX_JSON_DEPTH = 32  # nesting of [ and { in one block
MAX_INT_DIGITS = 1_000  # digits of a JSON integer (Python's int parser is quadratic beyond)


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


def load_json(text: str, allow_trailing: bool = False) -> tuple[Any, Optional[str]]:
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


def to_plain(x: Any, depth: int = 0, drop_none: bool = False) -> Any:
    """numpy arrays/scalars and tuples -> plain Python lists/scalars; dict keys -> str.

    ``drop_none`` removes null-valued dict entries at every level (the "null = absent" rule).

    Not :func:`recipe.mrtpo.tasks.base.to_plain`, on purpose: this one *validates* tool-call JSON (model
    output and references alike): nesting deeper than ``4 * MAX_JSON_DEPTH``, non-finite numbers and
    types JSON cannot hold raise ValueError, where ``base.to_plain`` converts trusted parquet values
    and passes anything else through.
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
            str(k): to_plain(v, depth + 1, drop_none)
            for k, v in x.items()
            if not (drop_none and v is None)
        }
    if isinstance(x, (list, tuple)):
        return [to_plain(v, depth + 1, drop_none) for v in x]
    if hasattr(x, "tolist") and hasattr(x, "dtype"):  # numpy array or numpy scalar
        return to_plain(x.tolist(), depth + 1, drop_none)
    if hasattr(x, "item") and callable(x.item):
        return to_plain(x.item(), depth + 1, drop_none)
    raise ValueError(f"unsupported value type {type(x).__name__}")


def maybe_json(x: Any, what: str) -> Any:
    if isinstance(x, (str, bytes)):
        try:
            return json.loads(x)
        except ValueError as e:
            raise ValueError(f"{what} is a string but not JSON: {e}") from None
    return x


def as_list(x: Any, what: str) -> list:
    x = maybe_json(x, what)
    if x is None:
        return []
    if isinstance(x, (list, tuple)):
        return list(x)
    if hasattr(x, "tolist") and hasattr(x, "dtype"):
        return list(x)  # keep elements as they are (dicts inside an object array)
    raise ValueError(f"{what} must be a list, got {type(x).__name__}")


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
        obj, err = load_json(inner)
        if err:
            return False, err
        err = _strict_call(obj)
        if err:
            return False, err
        n += 1
        pos = _WS.match(text, end + len(CALL_CLOSE)).end()
    return True, ""


def _lenient_call(obj: Any) -> Optional[dict]:
    """A decoded block as a call, or None. The name is kept exactly as written and null-valued
    arguments are kept (BFCL compares names exactly and rejects ``null`` for an argument)."""
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    args = obj.get("arguments", obj.get("parameters"))
    if isinstance(args, str):
        args, err = load_json(args)
        if err:
            return None
    if not isinstance(args, dict):
        return None
    try:
        args = to_plain(args)
    except (ValueError, RecursionError):
        return None
    return {"name": name, "arguments": args}


def outside_think(text: str) -> str:
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
    text = outside_think(as_text(response))
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
        obj, err = load_json(text[start : min(end, start + MAX_BLOCK_CHARS)], allow_trailing=True)
        call = None if err else _lenient_call(obj)
        if call is not None:
            calls.append(call)
        pos = end
    return calls


