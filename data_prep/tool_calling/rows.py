"""Tool-calling rows shared by the builders: tool specs as JSON schema, the prompt, the gold check.

A leaf module (it imports only :mod:`data_prep.common`): :mod:`data_prep.tool_calling` (BFCL, the
CLI) and :mod:`data_prep.tool_calling.sources` (the peers' public sets) build their rows here. The prompt is
a system message ``system + "\\n\\n" + render_tools_system_prompt(tools)`` then the user turn(s);
ground truth ``{"calls": JSON string, "tools": JSON string}`` (+ ``bfcl`` for BFCL rows); the gold
answer is ``render_tool_calls(calls)`` or a plain-text refusal when there is no call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Optional

from data_prep.common import make_row

__all__ = [
    "ABILITY",
    "DEFAULT_SYSTEM",
    "REFUSAL",
    "bfcl_schema",
    "xlam_tool_to_schema",
    "tool_messages",
    "gold_answer",
    "gold_check",
    "tool_row",
    "card_columns",
]

ABILITY = "tool_calling"
DEFAULT_SYSTEM = "You are a helpful assistant."
REFUSAL = "None of the provided functions can answer this request."

# BFCL's GORILLA_TO_OPENAPI type map (bfcl_eval/constants/type_mappings.py).
_BFCL_TYPES = {
    "integer": "integer", "number": "number", "float": "number", "string": "string", "boolean": "boolean",
    "bool": "boolean", "array": "array", "list": "array", "dict": "object", "object": "object",
    "tuple": "array", "any": "string", "byte": "integer", "short": "integer", "long": "integer",
    "double": "number", "char": "string", "ArrayList": "array", "Array": "array", "HashMap": "object",
    "Hashtable": "object", "Queue": "array", "Stack": "array", "Any": "string", "String": "string",
    "Bigint": "integer",
}


def bfcl_schema(node: Any) -> Any:
    """A BFCL parameter schema with its types mapped to JSON schema (recursive on properties/items)."""
    if not isinstance(node, dict):
        return node
    out = dict(node)
    if isinstance(out.get("type"), str):
        out["type"] = _BFCL_TYPES.get(out["type"], out["type"])
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: bfcl_schema(v) for k, v in out["properties"].items()}
    if isinstance(out.get("items"), dict):
        out["items"] = bfcl_schema(out["items"])
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = bfcl_schema(out["additionalProperties"])
    return out


def _bfcl_function(spec: dict) -> dict:
    out = dict(spec)
    if isinstance(out.get("parameters"), dict):
        out["parameters"] = bfcl_schema(out["parameters"])
    return out


_XLAM_TYPES = {"str": "string", "string": "string", "int": "integer", "integer": "integer", "float": "number",
               "number": "number", "bool": "boolean", "boolean": "boolean", "list": "array", "array": "array",
               "dict": "object", "object": "object", "tuple": "array", "set": "array"}


def _xlam_type(text: str) -> tuple[str, bool]:
    """(JSON-schema type, optional) from an xLAM type string such as ``"List[int], optional"``."""
    raw = str(text or "").strip()
    optional = bool(re.search(r",\s*optional\s*$", raw, re.IGNORECASE))
    base = re.sub(r",\s*optional\s*$", "", raw, flags=re.IGNORECASE).strip()
    head = re.split(r"[\[\s|]", base, maxsplit=1)[0].lower()
    if head in ("optional",):
        inner = re.search(r"\[(.*)\]", base)
        return _xlam_type(inner.group(1) if inner else "")[0], True
    return _XLAM_TYPES.get(head, "string" if not head else head), optional


def xlam_tool_to_schema(tool: dict) -> dict:
    """An xLAM tool (parameters as ``{name: {type, description, default}}``) as a JSON-schema function
    spec; a spec whose parameters already have ``"type": "object"`` is returned unchanged."""
    params = tool.get("parameters")
    if not isinstance(params, dict) or params.get("type") in ("object", "dict"):
        return dict(tool) if params is not None else {**tool, "parameters": {"type": "object", "properties": {}}}
    properties, required = {}, []
    for name, p in params.items():
        p = p if isinstance(p, dict) else {"description": str(p)}
        typ, optional = _xlam_type(p.get("type", ""))
        prop = {"type": typ}
        if p.get("description"):
            prop["description"] = str(p["description"])
        if "default" in p and p["default"] not in (None, ""):
            prop["default"] = p["default"]
        properties[str(name)] = prop
        if not optional and "default" not in p:
            required.append(str(name))
    out = {k: v for k, v in tool.items() if k != "parameters"}
    out["parameters"] = {"type": "object", "properties": properties, "required": required}
    return out


def tool_messages(tools: list, user_turns: Sequence[dict], system: str = DEFAULT_SYSTEM) -> list[dict]:
    """System message with the tools section and the format block, then the user turn(s)."""
    from recipe.mrtpo.tasks.tool_calling import render_tools_system_prompt

    return [{"role": "system", "content": system.strip() + "\n\n" + render_tools_system_prompt(tools)},
            *[{"role": str(m["role"]), "content": str(m["content"])} for m in user_turns]]


def gold_answer(calls: list) -> str:
    """The gold response: ``render_tool_calls(calls)``, or a plain-text refusal when there is no call."""
    from recipe.mrtpo.tasks.tool_calling import render_tool_calls

    return render_tool_calls(calls) or REFUSAL


def gold_check(ground_truth: dict) -> Optional[str]:
    """None if the gold answer scores 1 on ``format`` and ``correctness``, else why not."""
    from recipe.mrtpo.tasks.tool_calling import normalise_calls, score

    try:
        result = score(gold_answer(normalise_calls(json.loads(ground_truth["calls"]))), ground_truth, None)
    except (ValueError, TypeError, KeyError) as e:
        return f"bad reference calls: {e}"[:300]
    failed = {k: v for k, v in result.scores.items() if v != 1.0}
    if failed:
        return f"gold answer fails the verifier: {failed} {result.info.get('format_error') or ''}"[:300]
    return None


def tool_row(data_source: str, messages: list[dict], calls: list, tools: list, rid: str, category: str,
              official: Optional[dict] = None) -> dict:
    ground_truth = {
        "calls": json.dumps(calls, ensure_ascii=False, sort_keys=True, allow_nan=False),
        "tools": json.dumps(tools, ensure_ascii=False, sort_keys=True, allow_nan=False),
    }
    if official is not None:  # BFCL rows: the original function docs and possible answer
        ground_truth["bfcl"] = json.dumps(official, ensure_ascii=False, sort_keys=True, allow_nan=False)
    extra = {"split": "", "index": 0, "id": rid, "category": category}
    return make_row(data_source, messages, ABILITY, ground_truth, extra)


def _bucket(n: int) -> str:
    return str(n) if n < 10 else "10+"


def card_columns():
    """The data card's columns of tool-calling rows."""
    return [
        ("category", lambda r: r["extra_info"]["category"]),
        ("reference calls", lambda r: len(json.loads(r["reward_model"]["ground_truth"]["calls"]))),
        ("tools offered", lambda r: _bucket(len(json.loads(r["reward_model"]["ground_truth"]["tools"])))),
    ]
