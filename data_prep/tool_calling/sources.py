"""Tool-calling training sets of the paper's peers -> verl parquet.

``python -m data_prep.tool_calling <source> --input NAME_OR_PATH --out-dir DIR`` (``--input``: a hub name,
or a local file or folder in the same schema, read by :func:`data_prep.public_sources.load_records`:
malformed local records are skipped with their file and line):

- ``toolrl``: ToolRL's RL mix (``dataset/rlla_4k_raw/rlla_rl.json`` of the ToolRL release, 4,000 rows: 2k
  ToolACE, 1k Hammer (masked), 1k xLAM; the data GDPO's published tool-calling run trains on). A JSON
  array of ``{"instruction": system prompt listing the tools as "N. Name: ...\\nDescription: ...\\n
  Parameters: {json}" and ToolRL's output format, "input": "**Dialogue Records History**\\n<user> ...
  </user>" (earlier turns, tool calls and ``<obs>`` included), "output": "<think> ... </think>\\n
  <tool_call>\\n{"name", "parameters"} per line\\n</tool_call>" and/or "<response> ... </response>"}``.
  ``--reward toolrl`` keeps ToolRL's prompt verbatim (system = instruction, user = input) and writes
  data_source ``toolrl`` (:mod:`recipe.mrtpo.tasks.toolrl`: format 0/1 + correctness in [-3, 3], as
  GDPO's run); every row is kept, answer-only rows included. ``--reward mrtpo`` (default) rewrites
  the single-turn rows with a tool call into this project's prompt and reward (data_source
  ``tool_calling``: the tools as JSON schema, Qwen2.5's ``<tool_call>`` convention); multi-turn
  histories and answer-only rows are skipped and counted there.
- ``toolace`` (``Team-ACE/ToolACE``): ``{"system": text holding the JSON tool list after "...in JSON
  format that you can invoke:", "conversations": [{"from": "user"|"assistant"|"tool", "value"}]}``.
  The row is the conversation up to its first assistant turn; that turn, in Python call syntax
  (``[get_weather(city="Paris"), f(x=1)]``, names with spaces or dots allowed), gives the reference
  calls; a plain-text first assistant turn gives a no-call row (category ``irrelevance``). Tool
  parameter types are mapped as for BFCL (``dict`` -> ``object``, ...).
- ``xlam`` (``Salesforce/xlam-function-calling-60k``, also Hammer's data): ``{"id", "query", "tools":
  JSON string (or list), "answers": JSON string (or list)}``: xLAM parameter maps become JSON schema
  (``str`` -> ``string``, ``List[...]`` -> ``array``, ...; a parameter without ``default`` and without
  ", optional" is required; :func:`data_prep.tool_calling.rows.xlam_tool_to_schema`); Hammer's irrelevance
  rows (``answers: []``) become no-call rows whose gold answer is a plain-text refusal.

Ground truth of ``tool_calling`` rows: ``{"calls": JSON [{"name", "arguments"}], "tools": JSON}`` (the
verifier's plain shape); of ``toolrl`` rows the same plus ``answer`` (ToolRL's reference output).
Every row's gold answer is scored by its verifier and must get full marks (``tool_calling``: format 1
and correctness 1; ``toolrl``: format 1 and correctness 3, or 0 for answer-only rows, ToolRL's
maximum there); anything else (malformed call, missing tools, broken JSON, failing gold) is skipped
with its reason and counted in the data card. Split: ``--test-fraction`` (toolrl 0.02, as ToolRL's
3,920/80; others 0.05) by the seeded hash rule on the row id.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path
from typing import Any, Optional

from data_prep.common import SkipLog, fraction, make_row
from data_prep.public_sources import assign_splits, finish, load_or_exit
from data_prep.tool_calling.rows import (
    ABILITY,
    DEFAULT_SYSTEM,
    bfcl_schema,
    card_columns,
    gold_check,
    tool_messages,
    tool_row,
    xlam_tool_to_schema,
)

__all__ = ["SOURCES", "parse_python_calls", "toolrl_tools", "build_rows", "add_arguments", "run"]

#: source -> (default input, default test fraction)
SOURCES = {
    "toolrl": ("rlla_rl.json", 0.02),
    "toolace": ("Team-ACE/ToolACE", 0.05),
    "xlam": ("Salesforce/xlam-function-calling-60k", 0.05),
}
TITLES = {"toolrl": "ToolRL's RL mix (ToolACE, Hammer, xLAM)", "toolace": "ToolACE",
          "xlam": "xLAM function calling 60k / Hammer ({'query', 'tools', 'answers'})"}
REWARDS = ("mrtpo", "toolrl")


class Skip(ValueError):
    """A record that yields no row; ``kind`` is the data card's reason."""

    def __init__(self, kind: str, detail: str = ""):
        super().__init__(f"{kind}: {detail}"[:300] if detail else kind)
        self.kind = kind


# --------------------------------------------------------------------------------------------------
# rows
# --------------------------------------------------------------------------------------------------


def _dumps(x: Any) -> str:
    return json.dumps(x, ensure_ascii=False, sort_keys=True, allow_nan=False)


def _category(calls: list) -> str:
    return "irrelevance" if not calls else ("simple" if len(calls) == 1 else "parallel")


def mrtpo_row(tools: list, user_turns: list[dict], calls: list, rid: str, system: str) -> dict:
    """A ``tool_calling`` row whose gold answer scores full marks (Skip otherwise)."""
    from recipe.mrtpo.tasks.tool_calling import normalise_calls, normalise_tools

    try:
        tools, calls = normalise_tools(tools), normalise_calls(calls)
        gt = {"calls": _dumps(calls), "tools": _dumps(tools)}
    except ValueError as e:
        raise Skip("malformed tools or calls", str(e)) from None
    why = gold_check(gt)
    if why is not None:
        raise Skip("gold answer fails the verifier", why.split(": ", 1)[-1])
    return tool_row("tool_calling", tool_messages(tools, user_turns, system), calls, tools, rid, _category(calls))


def toolrl_row(instruction: str, user: str, answer: str, tools: list, rid: str) -> dict:
    """A ``toolrl`` row (ToolRL's prompt verbatim) whose gold answer gets ToolRL's full marks."""
    from recipe.mrtpo.tasks.toolrl import CORRECT_MAX, FORMAT_MAX, reference_calls, score

    try:
        calls, _ = reference_calls({"answer": answer})
    except ValueError as e:
        raise Skip("malformed call in the reference output", str(e)) from None
    gt = {"calls": _dumps([{"name": c["name"], "arguments": c["parameters"]} for c in calls]),
          "tools": _dumps(tools), "answer": answer}
    fmt_block = _format_block(instruction)
    extra = {"split": "", "index": 0, "id": rid, "category": _category(calls) if calls else "answer only",
             "format_instruction": fmt_block}
    result = score(answer, gt, extra)
    want = CORRECT_MAX if calls else 0.0
    if result.scores["format"] != FORMAT_MAX or abs(result.scores["correctness"] - want) > 1e-9:
        raise Skip("gold answer fails the verifier", f"{result.scores}")
    return make_row("toolrl", [{"role": "system", "content": instruction}, {"role": "user", "content": user}], ABILITY, gt, extra)


def _format_block(instruction: str) -> str:
    """The ``**Output Format**`` block of a ToolRL system prompt (to its closing fence), or ""."""
    m = re.search(r"\*\*Output Format\*\*\n```.*?\n```", instruction, re.DOTALL)
    return m.group(0) if m else ""


# --------------------------------------------------------------------------------------------------
# ToolRL
# --------------------------------------------------------------------------------------------------

_TOOL_ENTRY = re.compile(r"^\d+\.\s*Name:\s*(?P<name>.+?)\s*\nDescription:\s*(?P<desc>.*?)\s*\nParameters:\s*"
                         r"(?P<params>\{.*\})\s*$", re.MULTILINE)
_SINGLE_USER = re.compile(r"^\s*\*\*Dialogue Records History\*\*\s*<user>(?P<q>.*)</user>\s*$", re.DOTALL)


def toolrl_tools(instruction: str) -> list[dict]:
    """The tools listed in a ToolRL system prompt, as JSON-schema specs (Skip when one is malformed)."""
    tools = []
    for m in _TOOL_ENTRY.finditer(instruction):
        try:
            params = json.loads(m.group("params"))
        except ValueError as e:
            raise Skip("malformed tool parameters", f"{m.group('name')}: {e}") from None
        if not isinstance(params, dict):
            raise Skip("malformed tool parameters", m.group("name"))
        tools.append(xlam_tool_to_schema({"name": m.group("name"), "description": m.group("desc"),
                                          "parameters": params}))
    return tools


def _toolrl(rec: dict, rid: str, reward: str, system: str) -> dict:
    instruction, user, output = rec.get("instruction"), rec.get("input"), rec.get("output")
    for key, v in (("instruction", instruction), ("input", user), ("output", output)):
        if not isinstance(v, str) or not v.strip():
            raise Skip(f"missing field {key!r}")
    tools = toolrl_tools(instruction)
    if reward == "toolrl":
        return toolrl_row(instruction, user, output, tools, rid)
    if not tools:
        raise Skip("no tools in the instruction")
    m = _SINGLE_USER.match(user)
    if m is None or user.count("<user>") != 1 or "<obs>" in user:
        raise Skip("multi-turn history (kept with --reward toolrl)")
    if "<tool_call>" not in output:
        raise Skip("answer without tool call (kept with --reward toolrl)")
    from recipe.mrtpo.tasks.toolrl import reference_calls

    try:
        calls, _ = reference_calls({"answer": output})
    except ValueError as e:
        raise Skip("malformed call in the reference output", str(e)) from None
    return mrtpo_row(tools, [{"role": "user", "content": m.group("q").strip()}], calls, rid, system)


# --------------------------------------------------------------------------------------------------
# ToolACE
# --------------------------------------------------------------------------------------------------


def _split_top(text: str, sep: str = ",") -> list[str]:
    """``text`` split at ``sep`` outside brackets and quotes."""
    parts, depth, quote, start, i = [], 0, "", 0, 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth < 0:
                raise ValueError("unbalanced brackets")
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    if quote or depth:
        raise ValueError("unbalanced brackets or quotes")
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def parse_python_calls(text: str) -> list[dict]:
    """``[f(a=1), Get Weather(city="Paris")]`` -> ``[{"name", "arguments"}]``; ValueError if malformed."""
    body = text.strip()
    if not (body.startswith("[") and body.endswith("]")):
        raise ValueError("not a bracketed call list")
    calls = []
    for part in _split_top(body[1:-1]):
        m = re.fullmatch(r"(?P<name>[^()\[\]{}\"',=]+?)\s*\((?P<args>.*)\)", part, re.DOTALL)
        if m is None:
            raise ValueError(f"not a call: {part[:80]!r}")
        try:
            node = ast.parse(f"f({m.group('args')})", mode="eval").body
        except SyntaxError as e:
            raise ValueError(f"arguments of {m.group('name')!r}: {e.msg}") from None
        if not isinstance(node, ast.Call) or node.args or any(k.arg is None for k in node.keywords):
            raise ValueError(f"{m.group('name')!r} needs keyword arguments only")
        try:
            args = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
        except (ValueError, TypeError, SyntaxError, RecursionError) as e:
            raise ValueError(f"non-literal argument of {m.group('name')!r}: {e}") from None
        calls.append({"name": m.group("name").strip(), "arguments": args})
    if not calls:
        raise ValueError("empty call list")
    return calls


def _toolace_tools(system: str) -> list[dict]:
    marker = system.find("that you can invoke:")
    start = system.find("[", marker if marker >= 0 else 0)
    if start < 0:
        raise Skip("no tool list in 'system'")
    try:
        tools, _ = json.JSONDecoder().raw_decode(system, start)
    except ValueError as e:
        raise Skip("malformed tool list in 'system'", str(e)) from None
    if not isinstance(tools, list) or not tools or not all(isinstance(t, dict) and t.get("name") for t in tools):
        raise Skip("malformed tool list in 'system'")
    out = []
    for t in tools:
        t = {k: v for k, v in t.items() if v is not None}
        if isinstance(t.get("parameters"), dict):
            t["parameters"] = bfcl_schema(t["parameters"])
        out.append(t)
    return out


def _toolace(rec: dict, rid: str, reward: str, system: str) -> dict:
    sys_text, conv = rec.get("system"), rec.get("conversations")
    if not isinstance(sys_text, str) or not sys_text.strip():
        raise Skip("missing field 'system'")
    if not isinstance(conv, list) or not conv:
        raise Skip("missing field 'conversations'")
    tools = _toolace_tools(sys_text)
    turns, target = [], None
    for t in conv:
        if not isinstance(t, dict) or not isinstance(t.get("value"), str):
            raise Skip("malformed conversation turn")
        if t.get("from") == "assistant":
            target = t["value"]
            break
        if t.get("from") != "user":
            raise Skip("tool output before the first assistant turn")
        turns.append({"role": "user", "content": t["value"]})
    if target is None or not turns:
        raise Skip("no user turn followed by an assistant turn")
    stripped = target.strip()
    if stripped.startswith("[") and "(" in stripped:
        try:
            calls = parse_python_calls(stripped)
        except ValueError as e:
            raise Skip("malformed call", str(e)) from None
    else:
        calls = []
    return mrtpo_row(tools, turns, calls, rid, system)


# --------------------------------------------------------------------------------------------------
# xLAM / Hammer
# --------------------------------------------------------------------------------------------------


def _xlam(rec: dict, rid: str, reward: str, system: str) -> dict:
    query = rec.get("query")
    if not isinstance(query, str) or not query.strip():
        raise Skip("missing field 'query'")
    try:
        tools = json.loads(rec["tools"]) if isinstance(rec.get("tools"), str) else rec.get("tools")
        calls = json.loads(rec["answers"]) if isinstance(rec.get("answers"), str) else rec.get("answers")
    except ValueError as e:
        raise Skip("broken JSON in 'tools' or 'answers'", str(e)) from None
    if not isinstance(tools, list) or not tools or not all(isinstance(t, dict) for t in tools):
        raise Skip("missing field 'tools' (a non-empty list of objects)")
    if calls is None:
        raise Skip("missing field 'answers'")
    return mrtpo_row([xlam_tool_to_schema(t) for t in tools], [{"role": "user", "content": query.strip()}],
                     calls, rid, system)


_CONVERTERS = {"toolrl": _toolrl, "toolace": _toolace, "xlam": _xlam}


def build_rows(source: str, records: list[tuple[str, int, dict]], skips: SkipLog, reward: str = "mrtpo",
               system: Optional[str] = None) -> list[dict]:
    """Rows from the loaded ``(file or hub name, line or row, record)`` triples of ``source`` (module
    docstring); bad records go to ``skips``."""
    if reward not in REWARDS:
        raise ValueError(f"reward must be one of {REWARDS}, got {reward!r}")
    if reward == "toolrl" and source != "toolrl":
        raise ValueError("--reward toolrl needs ToolRL's own prompt: use it with the 'toolrl' source")
    convert = _CONVERTERS[source]
    rows, seen = [], set()
    for k, (name, n, rec) in enumerate(records, start=1):  # k: the record's ordinal, n: its line
        rid_raw = rec.get("id") if isinstance(rec, dict) else None
        rid = str(rid_raw) if isinstance(rid_raw, (str, int)) and not isinstance(rid_raw, bool) \
            and str(rid_raw).strip() else f"{source}-{k}"
        if rid in seen:
            skips.skip(name, n, f"duplicate id: {rid}")
            continue
        try:
            row = convert(rec if isinstance(rec, dict) else {}, rid, reward, system or DEFAULT_SYSTEM)
        except Skip as e:
            skips.skip(name, n, str(e))
            continue
        seen.add(rid)
        rows.append(row)
    return rows


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The options of the ``toolrl`` / ``toolace`` / ``xlam`` commands of ``python -m data_prep.tool_calling``."""
    ap.add_argument("--input", default=None, help="hub name or local .json/.jsonl/.parquet file or folder "
                    "(default: the source's hub name; toolrl: rlla_rl.json)")
    ap.add_argument("--out-dir", type=Path, required=True, help="folder for train.parquet / test.parquet")
    ap.add_argument("--reward", choices=REWARDS, default="mrtpo",
                    help="mrtpo (default): this project's prompt and reward; toolrl: ToolRL's prompt and reward "
                    "(data_source toolrl; toolrl source only)")
    ap.add_argument("--split", default="train", help="hub split to read (default train)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the hash split (default 0)")
    ap.add_argument("--test-fraction", type=fraction, default=None, help="held-out share (toolrl 0.02, else 0.05)")
    ap.add_argument("--system", default=None, help="system message before the tools section (mrtpo reward)")
    ap.add_argument("--limit", type=int, default=None, help="read only the first N records")
    ap.add_argument("--cache-dir", default=None, help="datasets cache folder (default: the library's)")


def run(args: argparse.Namespace) -> int:
    """Build one public set from parsed ``tool_calling`` arguments (``args.command``: the source)."""
    source = args.command
    if args.reward == "toolrl" and source != "toolrl":
        print("error: --reward toolrl needs ToolRL's own prompt: use it with the 'toolrl' source", file=sys.stderr)
        return 2
    name = args.input or SOURCES[source][0]
    skips = SkipLog()
    loaded = load_or_exit(name, skips, split=args.split, cache_dir=args.cache_dir, limit=args.limit)
    if loaded is None:
        return 1
    records, malformed = loaded
    rows = build_rows(source, records, skips, args.reward, args.system)
    test_fraction = SOURCES[source][1] if args.test_fraction is None else args.test_fraction
    assign_splits(rows, args.seed, test_fraction)
    return finish(f"{source} ({name}, reward {args.reward})", rows, args.out_dir, skips, len(records) + malformed,
                  card_columns())
