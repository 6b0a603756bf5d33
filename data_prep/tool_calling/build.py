"""Tool-calling builder: BFCL's AST-checkable categories and the peers' public sets -> verl parquet.

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

The peers' public training sets (``toolrl``, ``toolace``, ``xlam``: ToolRL's RL mix, ToolACE,
xlam-function-calling-60k / Hammer; a hub name or local files in their schema) are built by
:mod:`data_prep.tool_calling.sources`, through the same command, with the same prompt and ground truth.

Every row is checked: the gold answer must score 1 on ``format`` and ``correctness``. A missing
field, a broken JSON line, a tool/answer string that is not JSON, a BFCL question without answer, or
a failing gold is reported as ``SKIP file:line: reason`` and counted in the data card.

CLI::

    python -m data_prep.tool_calling bfcl --out-dir data/bfcl [--bfcl-dir .assets/bfcl] [--seed 0] \\
        [--test-fraction 0.3] [--categories simple_python,multiple,...]
    python -m data_prep.tool_calling toolrl --input rlla_rl.json --out-dir data/toolrl [--reward toolrl]
    python -m data_prep.tool_calling toolace --out-dir data/toolace
    python -m data_prep.tool_calling xlam --input xlam_function_calling_60k.json --out-dir data/xlam
"""

from __future__ import annotations

import argparse
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
    print_data_card,
    progress,
    write_splits,
)
from data_prep.tool_calling import sources as tool_sources
from data_prep.tool_calling.rows import (  # noqa: F401 - the row API, re-exported for callers of this module
    ABILITY,
    DEFAULT_SYSTEM,
    REFUSAL,
    _bfcl_function,
    bfcl_schema,
    card_columns,
    gold_answer,
    gold_check,
    tool_messages,
    tool_row,
    xlam_tool_to_schema,
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
    "build_parser",
    "main",
]

DEFAULT_BFCL_DIR = assets_dir() / "bfcl"  # $MRTPO_ASSETS or <repo>/.assets
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
            row = tool_row("bfcl", tool_messages(tools, turns, sys_text), calls, tools, rid, category, official)
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
# CLI
# --------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m data_prep.tool_calling",
        description="Build tool-calling parquet (verl layout) from BFCL's AST-checkable categories ('bfcl') or "
        "a peer's public training set ('toolrl', 'toolace', 'xlam': hub name or local files). Prints a data card.",
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
    b.add_argument("--out-dir", type=Path, required=True, help="folder for train.parquet / test.parquet")
    b.add_argument("--seed", type=int, default=0, help="seed of the train/test hash split")
    b.add_argument("--system", default=DEFAULT_SYSTEM, help="system message before the tools section")
    for source, (default, _) in tool_sources.SOURCES.items():
        tool_sources.add_arguments(sub.add_parser(source, help=f"{tool_sources.TITLES[source]} "
                                                  f"(default input {default}; local files in its schema)"))
    return ap


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in tool_sources.SOURCES:
        return tool_sources.run(args)
    skips = SkipLog()
    cats = [c.strip() for c in args.categories.split(",") if c.strip()]
    bad = [c for c in cats if c not in BFCL_CATEGORIES]
    if bad:
        print(f"error: unknown categories {bad}; choose from {BFCL_CATEGORIES}", file=sys.stderr)
        return 2
    rows, read = build_bfcl_rows(args.bfcl_dir, cats, args.seed, args.test_fraction, args.system, skips, args.limit)
    if not rows:
        print_data_card(args.command, rows, skips=skips, read=read)
        print("error: no rows built", file=sys.stderr)
        return 1
    written = write_splits(rows, args.out_dir)
    print_data_card(args.command, rows, card_columns(), skips=skips, read=read, written=written)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
