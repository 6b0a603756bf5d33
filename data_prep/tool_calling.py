"""Tool-calling builder: BFCL's AST-checkable categories and xLAM-style JSON -> verl parquet.

Prompt: a system message ``system + "\\n\\n" + render_tools_system_prompt(tools)`` (the tools section
as Qwen2.5's chat template writes it, ``# Tools`` ... ``<tools></tools>`` with one JSON spec per line,
then :data:`recipe.mrtpo.tasks.tool_calling.TOOL_FORMAT_INSTRUCTION` verbatim as the one output-format
block, the ``format`` reward's Z_k), then the conversation's user turn(s). ``system`` is ``--system``
(default "You are a helpful assistant."); a BFCL question that brings its own system message uses
that instead. Because the tools are already in the system message, do not also pass them to the chat
template. ``reward_model.ground_truth`` is ``{"calls": JSON string, "tools": JSON string}`` (the
verifier reads JSON strings; they keep argument types exact through parquet); the gold answer is
``render_tool_calls(calls)``. ``extra_info``: ``split``, ``index``, ``id``, ``category``.

BFCL (``bfcl``): the categories of :data:`BFCL_CATEGORIES` from a ``bfcl_eval/data`` copy (default
``.assets/bfcl``: ``BFCL_v4_<category>.json`` JSON Lines of ``{"id", "question": [[messages]],
"function": [specs]}``, answers in ``possible_answer/BFCL_v4_<category>.json`` as ``{"id",
"ground_truth": [{func: {arg: [allowed values]}}]}``). The reference calls keep every acceptable value
of every argument (``accepted``, BFCL's notation: ``""`` = may be omitted) and render the first as the
gold answer (:func:`recipe.mrtpo.tasks.tool_calling.calls_from_bfcl_answer`); an answer argument that
the function does not declare (BFCL's own checker rejects it, so the row's gold could never pass) is
dropped, counted and reported (``DROP`` lines and the total on stderr). The ground truth also keeps the
row's original BFCL ``function`` docs and ``possible_answer`` (``bfcl``: JSON string of ``{"id",
"category", "function", "ground_truth"}``) for the evaluation's official checker. Function specs are
shown as JSON schema: BFCL's Python-style types are mapped as BFCL's own OpenAI handlers map them
(``dict`` -> ``object``, ``float`` -> ``number``, ``tuple`` -> ``array``, ``any`` -> ``string``, ...).
Split rule: within each category, rows ordered by ``sha256(f"{seed}:{id}")``; the first
``round(test_fraction * n)`` are ``test`` (default 0.3), the rest ``train``
(:func:`data_prep.common.hash_split`).

xLAM-style JSON (``xlam``): a JSON array or JSON Lines of ``{"id"?, "query": str, "tools": JSON string
(or list) of {"name", "description", "parameters": {param: {"type", "description", "default"?}}},
"answers": JSON string (or list) of {"name", "arguments"}}``, as in Salesforce's
xlam-function-calling-60k and Hammer's training data (which adds irrelevance rows with ``answers:
[]``: the gold answer is then a plain-text refusal). xLAM parameter maps become JSON schema
(``str`` -> ``string``, ``int`` -> ``integer``, ``List[...]`` -> ``array``, ...; a parameter without
``default`` and without ", optional" is required); specs already in JSON-schema form are kept.
Other sources must be brought to this shape first, e.g. ToolACE (``{"system": text holding a JSON
tool list, "conversations": [{"from": "user"|"assistant", "value"}]}``, answers in Python call
syntax ``[f(a=1)]``): take the tool list from the system text, the first user value as ``query``
and parse the first assistant value into ``[{"name", "arguments"}]``. Split as for BFCL (one stratum),
``--test-fraction`` default 0.05; data_source ``tool_calling``.

Every row is checked: the gold answer must score 1 on ``format`` and ``correctness``. A missing
field, a broken JSON line, a tool/answer string that is not JSON, a BFCL question without answer, or
a failing gold is reported as ``SKIP file:line: reason`` and counted in the data card.

CLI::

    python -m data_prep.tool_calling bfcl --out-dir data/bfcl [--bfcl-dir .assets/bfcl] [--seed 0] \\
        [--test-fraction 0.3] [--categories simple_python,multiple,...]
    python -m data_prep.tool_calling xlam --input xlam_function_calling_60k.json --out-dir data/xlam
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from data_prep.chinook_db import assets_dir
from data_prep.common import (
    SkipLog,
    fraction,
    hash_split,
    iter_json_records,
    load_records,
    make_row,
    print_data_card,
    progress,
    write_splits,
)

__all__ = [
    "ABILITY",
    "BFCL_CATEGORIES",
    "DEFAULT_BFCL_DIR",
    "DEFAULT_SYSTEM",
    "bfcl_schema",
    "xlam_tool_to_schema",
    "tool_messages",
    "gold_answer",
    "gold_check",
    "build_bfcl_rows",
    "build_xlam_rows",
    "main",
]

ABILITY = "tool_calling"
DEFAULT_BFCL_DIR = assets_dir() / "bfcl"  # $MRTPO_ASSETS or <repo>/.assets
DEFAULT_SYSTEM = "You are a helpful assistant."
#: BFCL's single-turn categories with AST-checkable answers (possible_answer/).
BFCL_CATEGORIES = (
    "simple_python",
    "multiple",
    "parallel",
    "parallel_multiple",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
)
DEFAULT_BFCL_TEST_FRACTION = 0.3
DEFAULT_XLAM_TEST_FRACTION = 0.05
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


# --------------------------------------------------------------------------------------------------
# tools and messages
# --------------------------------------------------------------------------------------------------


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


def _tool_row(data_source: str, messages: list[dict], calls: list, tools: list, rid: str, category: str,
              official: Optional[dict] = None) -> dict:
    ground_truth = {
        "calls": json.dumps(calls, ensure_ascii=False, sort_keys=True, allow_nan=False),
        "tools": json.dumps(tools, ensure_ascii=False, sort_keys=True, allow_nan=False),
    }
    if official is not None:  # BFCL rows: the original function docs and possible answer
        ground_truth["bfcl"] = json.dumps(official, ensure_ascii=False, sort_keys=True, allow_nan=False)
    extra = {"split": "", "index": 0, "id": rid, "category": category}
    return make_row(data_source, messages, ABILITY, ground_truth, extra)


# --------------------------------------------------------------------------------------------------
# BFCL
# --------------------------------------------------------------------------------------------------


def _bfcl_messages(question: Any) -> Optional[list[dict]]:
    """The first turn's messages of a BFCL question (a list of turns), or None if malformed."""
    if not isinstance(question, list) or not question:
        return None
    turn = question[0]
    if isinstance(turn, dict):  # some copies store one turn without the outer list
        turn = question
    if not isinstance(turn, list) or not turn:
        return None
    for m in turn:
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") \
                or not isinstance(m.get("content"), str):
            return None
    if turn[-1]["role"] != "user":
        return None
    return turn


def build_bfcl_rows(
    bfcl_dir: Path = DEFAULT_BFCL_DIR,
    categories: Sequence[str] = BFCL_CATEGORIES,
    seed: int = 0,
    test_fraction: float = DEFAULT_BFCL_TEST_FRACTION,
    system: str = DEFAULT_SYSTEM,
    skips: Optional[SkipLog] = None,
    limit_per_category: Optional[int] = None,
    dropped: Optional[list] = None,
) -> tuple[list[dict], int]:
    """BFCL rows (data_source ``bfcl``), split train/test by the seeded hash rule. Returns (rows, read).

    ``dropped`` (if given) receives ``(id, function, argument)`` for every undeclared answer argument
    left out of a reference; each is also printed as a ``DROP`` line, the total at the end."""
    from recipe.mrtpo.tasks.tool_calling import calls_from_bfcl_answer, normalise_calls, normalise_tools

    skips = skips if skips is not None else SkipLog()
    bfcl_dir = Path(bfcl_dir)
    rows, read = [], 0
    all_dropped = dropped if dropped is not None else []
    for category in categories:
        qfile = bfcl_dir / f"BFCL_v4_{category}.json"
        afile = bfcl_dir / "possible_answer" / f"BFCL_v4_{category}.json"
        if not qfile.is_file() or not afile.is_file():
            skips.skip(qfile if not qfile.is_file() else afile, 0, f"missing file: category {category}")
            continue
        answers: dict[str, Any] = {}
        for line, rec in iter_json_records(afile, skips):
            if isinstance(rec, dict) and isinstance(rec.get("id"), str) and "ground_truth" in rec:
                answers[rec["id"]] = rec["ground_truth"]
            else:
                skips.skip(afile, line, "missing field 'id' or 'ground_truth'")
        kept = 0
        records, unparsed = load_records(qfile, skips)
        read += unparsed
        for line, rec in progress(records, f"bfcl:{category}"):
            if limit_per_category is not None and kept >= limit_per_category:
                break
            read += 1
            if not isinstance(rec, dict) or not isinstance(rec.get("id"), str):
                skips.skip(qfile, line, "missing field 'id'")
                continue
            rid = rec["id"]
            messages = _bfcl_messages(rec.get("question"))
            if messages is None:
                skips.skip(qfile, line, f"missing field 'question' (or malformed): {rid}")
                continue
            if not isinstance(rec.get("function"), list) or not rec["function"]:
                skips.skip(qfile, line, f"missing field 'function': {rid}")
                continue
            if rid not in answers:
                skips.skip(qfile, line, f"no answer in {afile.name}: {rid}")
                continue
            row_dropped: list = []
            try:
                tools = normalise_tools([_bfcl_function(f) for f in rec["function"] if isinstance(f, dict)])
                calls = normalise_calls(calls_from_bfcl_answer(answers[rid], rec["function"], row_dropped))
            except ValueError as e:
                skips.skip(qfile, line, f"bad answer or functions: {rid}: {e}")
                continue
            own_system = [m["content"] for m in messages if m["role"] == "system"]
            turns = [m for m in messages if m["role"] != "system"]
            sys_text = "\n\n".join(own_system) if own_system else system
            official = {"id": rid, "category": category, "function": rec["function"], "ground_truth": answers[rid]}
            row = _tool_row("bfcl", tool_messages(tools, turns, sys_text), calls, tools, rid, category, official)
            why = gold_check(row["reward_model"]["ground_truth"])
            if why is not None:
                skips.skip(qfile, line, f"{why} ({rid})")
                continue
            for fn, arg in row_dropped:
                print(f"DROP {qfile}:{line}: undeclared argument {fn}({arg}=...) removed from the reference ({rid})",
                      file=sys.stderr)
                all_dropped.append((rid, fn, arg))
            rows.append(row)
            kept += 1
    if all_dropped:
        print(f"DROP total: {len(all_dropped)} undeclared answer argument(s) in "
              f"{len({d[0] for d in all_dropped})} row(s) removed from the references", file=sys.stderr)
    splits = hash_split([r["extra_info"]["id"] for r in rows], seed, test_fraction,
                        strata=[r["extra_info"]["category"] for r in rows])
    for row, split in zip(rows, splits):
        row["extra_info"]["split"] = split
    return rows, read


# --------------------------------------------------------------------------------------------------
# xLAM-style
# --------------------------------------------------------------------------------------------------


def _json_field(rec: dict, key: str) -> Any:
    value = rec.get(key)
    if isinstance(value, str):
        return json.loads(value)
    return value


def build_xlam_rows(
    path: Path,
    seed: int = 0,
    test_fraction: float = DEFAULT_XLAM_TEST_FRACTION,
    system: str = DEFAULT_SYSTEM,
    skips: Optional[SkipLog] = None,
    limit: Optional[int] = None,
    data_source: str = "tool_calling",
) -> tuple[list[dict], int]:
    """Rows from an xLAM-style file (module docstring). Returns (rows, read)."""
    from recipe.mrtpo.tasks.tool_calling import normalise_calls, normalise_tools

    skips = skips if skips is not None else SkipLog()
    path = Path(path)
    records, read = load_records(path, skips)
    rows, seen = [], set()
    for position, (line, rec) in enumerate(progress(records, f"xlam:{path.name}")):
        if limit is not None and len(rows) >= limit:
            break
        read += 1
        if not isinstance(rec, dict):
            skips.skip(path, line, f"not an object: {type(rec).__name__}")
            continue
        query = rec.get("query")
        if not isinstance(query, str) or not query.strip():
            skips.skip(path, line, "missing field 'query'")
            continue
        missing = [k for k in ("tools", "answers") if k not in rec or rec[k] is None]
        if missing:
            skips.skip(path, line, f"missing field {missing[0]!r}")
            continue
        try:
            raw_tools = _json_field(rec, "tools")
            raw_calls = _json_field(rec, "answers")
        except ValueError as e:
            skips.skip(path, line, f"broken JSON in 'tools' or 'answers': {e}")
            continue
        try:
            if not isinstance(raw_tools, list) or not all(isinstance(t, dict) for t in raw_tools) or not raw_tools:
                raise ValueError("'tools' must be a non-empty list of objects")
            tools = normalise_tools([xlam_tool_to_schema(t) for t in raw_tools])
            calls = normalise_calls(raw_calls)
        except ValueError as e:
            skips.skip(path, line, f"bad tools or answers: {e}")
            continue
        rid = str(rec["id"]) if isinstance(rec.get("id"), (str, int)) and not isinstance(rec.get("id"), bool) \
            else f"{path.stem}-{position}"
        if rid in seen:
            skips.skip(path, line, f"duplicate id: {rid}")
            continue
        row = _tool_row(data_source, tool_messages(tools, [{"role": "user", "content": query.strip()}], system),
                        calls, tools, rid, "irrelevance" if not calls else
                        ("simple" if len(calls) == 1 else "parallel"))
        why = gold_check(row["reward_model"]["ground_truth"])
        if why is not None:
            skips.skip(path, line, why)
            continue
        seen.add(rid)
        rows.append(row)
    splits = hash_split([r["extra_info"]["id"] for r in rows], seed, test_fraction)
    for row, split in zip(rows, splits):
        row["extra_info"]["split"] = split
    return rows, read


# --------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------


def _bucket(n: int) -> str:
    return str(n) if n < 10 else "10+"


def card_columns():
    return [
        ("category", lambda r: r["extra_info"]["category"]),
        ("reference calls", lambda r: len(json.loads(r["reward_model"]["ground_truth"]["calls"]))),
        ("tools offered", lambda r: _bucket(len(json.loads(r["reward_model"]["ground_truth"]["tools"])))),
    ]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m data_prep.tool_calling",
        description="Build tool-calling parquet (verl layout) from BFCL's AST-checkable categories ('bfcl') or "
        "an xLAM-style JSON file ('xlam'). Prints a data card.",
        epilog=__doc__.split("CLI::", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bfcl", help="BFCL categories from a bfcl_eval/data copy")
    b.add_argument("--bfcl-dir", type=Path, default=DEFAULT_BFCL_DIR, help="default .assets/bfcl")
    b.add_argument("--categories", default=",".join(BFCL_CATEGORIES),
                   help="comma-separated (default: all AST-checkable single-turn categories)")
    b.add_argument("--test-fraction", type=fraction, default=DEFAULT_BFCL_TEST_FRACTION,
                   help=f"test share per category (default {DEFAULT_BFCL_TEST_FRACTION})")
    b.add_argument("--limit", type=int, default=None, help="at most N rows per category")
    x = sub.add_parser("xlam", help="xLAM / Hammer style JSON ({'query', 'tools', 'answers'})")
    x.add_argument("--input", type=Path, required=True)
    x.add_argument("--test-fraction", type=fraction, default=DEFAULT_XLAM_TEST_FRACTION,
                   help=f"test share (default {DEFAULT_XLAM_TEST_FRACTION})")
    x.add_argument("--limit", type=int, default=None, help="at most N rows")
    for p in (b, x):
        p.add_argument("--out-dir", type=Path, required=True, help="folder for train.parquet / test.parquet")
        p.add_argument("--seed", type=int, default=0, help="seed of the train/test hash split")
        p.add_argument("--system", default=DEFAULT_SYSTEM, help="system message before the tools section")
    return ap


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("toolrl", "toolace", "xlam"):  # public sets by hub name or local files
        from data_prep.tool_sources import main as public_main

        return public_main(argv)
    args = build_parser().parse_args(argv)
    skips = SkipLog()
    if args.command == "bfcl":
        cats = [c.strip() for c in args.categories.split(",") if c.strip()]
        bad = [c for c in cats if c not in BFCL_CATEGORIES]
        if bad:
            print(f"error: unknown categories {bad}; choose from {BFCL_CATEGORIES}", file=sys.stderr)
            return 2
        rows, read = build_bfcl_rows(args.bfcl_dir, cats, args.seed, args.test_fraction, args.system, skips,
                                     args.limit)
    else:
        rows, read = build_xlam_rows(args.input, args.seed, args.test_fraction, args.system, skips, args.limit)
    if not rows:
        print_data_card(args.command, rows, skips=skips, read=read)
        print("error: no rows built", file=sys.stderr)
        return 1
    written = write_splits(rows, args.out_dir)
    print_data_card(args.command, rows, card_columns(), skips=skips, read=read, written=written)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
