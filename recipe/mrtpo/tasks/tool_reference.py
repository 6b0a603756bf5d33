"""Reference calls and tool specs of the tool-calling verifier: normalisation, BFCL conversion, rendering.

Reference call (one entry of ``ground_truth["calls"]``)::

    {"name": "get_weather",
     "arguments": {"city": "Paris"},                                  # the canonical answer (rendered gold)
     "accepted": {"city": ["Paris", "paris, france"], "unit": ["", "celsius"]}}   # optional

``accepted`` holds, per argument, **every** acceptable value in BFCL's possible-answer notation: a
list of alternatives where ``""`` means the argument may be omitted; an alternative of an
object-typed argument is ``{key: [acceptable values]}`` again (BFCL's nested notation), one of an
array-of-objects argument a list of such objects. When ``accepted`` is present it is authoritative: an
argument not in it is not expected (BFCL: "unexpected parameter"). When it is absent (the plain shape
``{"name", "arguments"}`` that converters emit) every argument's only acceptable value is the one
given and no argument may be omitted. ``arguments`` may be absent when ``accepted`` is present: it is
then derived (each argument's first acceptable value; an argument whose first alternative is ``""``
is left out).

After a parquet round trip lists may be numpy arrays, scalars numpy scalars, and ``calls`` / a call /
its ``arguments`` / a tool may be JSON strings: all are normalised. A malformed reference (a data bug,
not model output) raises ``ValueError``.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from recipe.mrtpo.tasks.tool_json import CALL_CLOSE, CALL_OPEN, as_list, maybe_json, to_plain

__all__ = [
    "TOOL_FORMAT_INSTRUCTION",
    "NO_CALL_REFERENCE",
    "normalise_calls",
    "normalise_tools",
    "function_specs",
    "accepted_values",
    "calls_from_bfcl_answer",
    "render_tool_calls",
    "render_tools_system_prompt",
]

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


def _is_omit(v: Any) -> bool:
    return isinstance(v, str) and v == ""


def _first_allowed(allowed: Any, required: bool = False) -> tuple[bool, Any]:
    """(present, value) from a list of acceptable values: the first one, where a leading ``""``
    (may be omitted) means omitted unless ``required`` (then the first other value)."""
    allowed = list(allowed) if isinstance(allowed, list) else [allowed]
    if required:
        allowed = [a for a in allowed if not _is_omit(a)]
    if not allowed or _is_omit(allowed[0]):
        return False, None
    return True, _canonical_value(allowed[0])


def _canonical_value(v: Any) -> Any:
    """A chosen alternative; dicts inside hold acceptable-value lists per key again (nested notation)."""
    if isinstance(v, dict):
        out = {}
        for k, allowed in v.items():
            present, val = _first_allowed(allowed)
            if present:
                out[str(k)] = val
        return out
    if isinstance(v, list):
        return [_canonical_value(x) for x in v]
    return v


def _accepted(raw: Any, i: int) -> Optional[dict]:
    raw = maybe_json(raw, f"call {i} accepted")
    if raw is None:
        return None
    raw = to_plain(raw)
    if not isinstance(raw, dict):
        raise ValueError(f"call {i} accepted must be an object, got {type(raw).__name__}")
    out = {}
    for k, allowed in raw.items():
        if allowed is None:  # parquet struct padding
            continue
        allowed = allowed if isinstance(allowed, list) else [allowed]
        if not allowed:
            raise ValueError(f"call {i} accepted[{k!r}] is an empty list (nothing acceptable)")
        out[k] = allowed
    return out


def normalise_calls(calls: Any) -> list[dict]:
    """Reference calls -> ``[{"name": str, "arguments": dict[, "accepted": dict]}, ...]`` (plain Python).

    ``accepted`` is kept when given (BFCL notation, see the module docstring); the plain shape stays
    plain (:func:`accepted_values` reads it as ``{arg: [value]}``). Accepts lists / numpy arrays / JSON strings, calls as dicts or JSON
    strings, OpenAI's ``{"type": "function", "function": {...}}`` wrapper, and ``arguments`` as dict,
    JSON string or absent. Null-valued plain arguments are dropped (parquet struct padding). Raises
    ``ValueError`` on anything else (a data bug).
    """
    out = []
    for i, c in enumerate(as_list(calls, "ground_truth['calls']")):
        c = maybe_json(c, f"call {i}")
        if not isinstance(c, dict):
            raise ValueError(f"call {i} must be a dict, got {type(c).__name__}")
        if "name" not in c and isinstance(c.get("function"), dict):
            c = c["function"]
        name = c.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"call {i} has no function name: {c!r:.200}")
        accepted = _accepted(c.get("accepted"), i)
        args = maybe_json(c.get("arguments", c.get("parameters")), f"call {i} arguments")
        if args is None and accepted is not None:
            args = {}
            for k, allowed in accepted.items():
                present, val = _first_allowed(allowed)
                if present:
                    args[k] = val
        args = to_plain(args if args is not None else {}, drop_none=True)
        if not isinstance(args, dict):
            raise ValueError(f"call {i} arguments must be an object, got {type(args).__name__}")
        call = {"name": name.strip(), "arguments": args}
        if accepted is not None:
            if set(args) - set(accepted):
                raise ValueError(f"call {i}: arguments {sorted(set(args) - set(accepted))} are not in accepted")
            call["accepted"] = accepted
        out.append(call)
    return out


def accepted_values(call: dict) -> dict[str, list]:
    """A normalised reference call's acceptable values per argument (``{arg: [value]}`` when plain)."""
    if "accepted" in call:
        return call["accepted"]
    return {k: [v] for k, v in call["arguments"].items()}


def normalise_tools(tools: Any) -> list[dict]:
    """Tool specs -> list of plain dicts (bare or OpenAI-wrapped, as given). Absent -> []."""
    out = []
    for i, t in enumerate(as_list(tools, "ground_truth['tools']")):
        t = to_plain(maybe_json(t, f"tool {i}"))
        if not isinstance(t, dict):
            raise ValueError(f"tool {i} must be a dict, got {type(t).__name__}")
        out.append(t)
    return out


def function_specs(tools: list[dict]) -> dict[str, dict]:
    """name -> bare function spec (the OpenAI wrapper removed); the first spec of a name wins."""
    table: dict[str, dict] = {}
    for t in tools:
        fn = t.get("function") if isinstance(t.get("function"), dict) else t
        name = fn.get("name")
        if isinstance(name, str) and name.strip() and name.strip() not in table:
            table[name.strip()] = fn
    return table


def _declared(fn: Optional[dict]) -> tuple[Optional[set], set]:
    """(declared parameter names or None if the spec declares none, required names) of a function."""
    params = fn.get("parameters") if isinstance(fn, dict) else None
    if not isinstance(params, dict):
        return None, set()
    props = params.get("properties")
    req = params.get("required")
    return (set(props) if isinstance(props, dict) else None), (set(req) if isinstance(req, list) else set())


def calls_from_bfcl_answer(answer: Any, functions: Any = None, dropped: Optional[list] = None) -> list[dict]:
    """BFCL ``possible_answer`` -> reference calls keeping **every** acceptable value.

    ``answer`` is the ``ground_truth`` list ``[{func_name: {arg: [acceptable values...]}}, ...]`` (or
    the whole possible_answer row holding it). ``accepted`` is BFCL's lists verbatim; ``arguments``
    (the canonical, rendered gold) takes each argument's first acceptable value, leaving out an
    argument whose first alternative is ``""`` unless ``functions`` (the row's function docs) lists it
    as required (then its first other value). An argument that ``functions`` does not declare cannot
    be BFCL-valid (its checker rejects it as unexpected): it is dropped from the reference and
    ``(function, argument)`` is appended to ``dropped`` (the builder counts and reports them).
    """
    if isinstance(answer, dict) and "ground_truth" in answer:
        answer = answer["ground_truth"]
    specs = function_specs(normalise_tools(functions))
    calls = []
    for i, entry in enumerate(as_list(answer, "BFCL answer")):
        if not isinstance(entry, dict) or len(entry) != 1:
            raise ValueError(f"BFCL answer entry {i} must be {{func_name: {{arg: [allowed]}}}}, got {entry!r:.200}")
        ((name, args),) = entry.items()
        if not isinstance(args, dict):
            raise ValueError(f"BFCL answer entry {i}: arguments of {name!r} must be a dict")
        declared, required = _declared(specs.get(str(name).strip()))
        canonical, accepted = {}, {}
        for k, allowed in to_plain(args).items():
            if declared is not None and k not in declared:
                if dropped is not None:
                    dropped.append((str(name), k))
                continue
            accepted[k] = allowed if isinstance(allowed, list) else [allowed]
            present, val = _first_allowed(allowed, required=k in required)
            if present:
                canonical[k] = val
        calls.append({"name": str(name), "arguments": canonical, "accepted": accepted})
    return normalise_calls(calls)


def render_tool_calls(calls: Any) -> str:
    """Calls in the response format (the gold answer, and Z_correctness): one ``<tool_call>`` block
    per call, ``name`` then the canonical ``arguments`` with keys sorted (deterministic). [] -> ""."""
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
