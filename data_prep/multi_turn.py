"""BFCL v4 multi-turn builder: the installed ``bfcl-eval``'s multi-turn questions -> verl parquet.

Source: ``bfcl_eval/data`` of the installed package (no network, no copy): ``BFCL_v4_multi_turn_<c>.json``
for the categories ``base``, ``long_context``, ``miss_func``, ``miss_param`` (200 questions each, 1-8
turns), their gold answers in ``possible_answer/``, the function docs in ``multi_turn_func_doc/`` (read by
:mod:`recipe.mrtpo.tasks.multi_turn.official`). This is BFCL's *evaluation* set: see ``docs/data.md``
for what training on its ``train`` split means for claims.

Row (data_source ``bfcl_multi_turn``, ability ``tool_calling_multi_turn``, ``agent_name``
:data:`AGENT_NAME`, the agent loop that plays the turns)::

    prompt        [{"role": "system", "content": system}, *the first turn's user messages]
    reward_model  {"style": "rule", "ground_truth": {"turns": JSON [[gold call, ...] per turn]}}
    extra_info    {"split", "index", "id", "category", "scenario" (the question's index, shared by the
                   four categories), "num_turns",
                   "involved_classes": [class, ...], "initial_config": JSON {class: state} (BFCL's
                   key order kept: its file system's root directory is the first key under "root"),
                   "tools": JSON [OpenAI-style function spec, ...]   offered from the first turn,
                   "missed_function": JSON {turn: [spec, ...]}     held out until that turn (miss_func),
                   "user_turns": JSON [[message, ...] per turn]}   turn 0 is the prompt's

The tools are BFCL's function docs with their types mapped to JSON schema as BFCL's OpenAI handlers map
them (:func:`data_prep.tool_calling.rows.bfcl_schema`; the multi-turn docs use ``string``, ``integer``,
``float``, ``boolean``, ``array``, ``dict``, all mapped one to one), wrapped as ``{"type": "function",
"function": spec}``: the agent loop passes them to the chat template (``tools=``), and ``tools`` plus
``missed_function`` are every function of the question. BFCL's ``miss_func`` protocol is kept: the
held-out docs are removed from ``tools`` and listed under the turn that adds them; that turn's question is
empty in BFCL, and its FC handlers send ``DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC`` ("I have
updated some more functions you can choose from. What about now?") as the user message, which
``user_turns`` holds there. BFCL's ``excluded_function`` field is used by none of its code and is not
carried. The system message is ``--system`` (default "You are a helpful assistant."): BFCL's FC
evaluation has none and its questions bring none.

Split (declared, deterministic): the four categories are variants of the same 200 scenarios (question
``i`` of each category shares its backends and most of its requests), so whole scenarios are split, never
one category's copy: scenario indices, stratified by their set of backends (``involved_classes``), ordered
by ``sha256(f"{seed}:{i}")``; the first ``round(test_fraction * n)`` of each stratum are ``test``
(default 0.5), the others ``train`` (:func:`data_prep.common.hash_split`). Every category of a scenario
goes to that scenario's split.

Every row's gold answer is scored through the task before it is written (state, response, format and,
where present, irrelevance must be 1); a failing or malformed record is reported ``SKIP`` and counted.

The offline set (``--offline``): a few short questions for CPU tests, built by the same code: from each of
``base``, ``miss_func``, ``miss_param`` (``long_context`` loads large states), the
:data:`OFFLINE_PER_CATEGORY` questions of each split with the fewest turns and the shortest requests
(ties by id).

CLI::

    python -m data_prep.multi_turn --out-dir data/bfcl_multi_turn [--seed 0] [--test-fraction 0.5] \\
        [--categories base,long_context,miss_func,miss_param] [--system TEXT] [--offline]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Optional

from data_prep.common import SkipLog, fraction, hash_split, make_row, print_data_card, progress, write_splits
from data_prep.tool_calling.rows import DEFAULT_SYSTEM, bfcl_schema

__all__ = [
    "ABILITY",
    "AGENT_NAME",
    "DATA_SOURCE",
    "CATEGORIES",
    "ADDED_FUNCTIONS_MESSAGE",
    "DEFAULT_TEST_FRACTION",
    "OFFLINE_PER_CATEGORY",
    "scenario_splits",
    "multi_turn_row",
    "gold_record",
    "gold_check",
    "build_rows",
    "offline_rows",
    "card_columns",
    "main",
]

ABILITY = "tool_calling_multi_turn"
AGENT_NAME = "bfcl_multi_turn"
DATA_SOURCE = "bfcl_multi_turn"
CATEGORIES = ("base", "long_context", "miss_func", "miss_param")
DEFAULT_TEST_FRACTION = 0.5
OFFLINE_PER_CATEGORY = {"train": 2, "test": 1}
OFFLINE_CATEGORIES = ("base", "miss_func", "miss_param")
#: BFCL's DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC (bfcl_eval/constants/default_prompts.py)
ADDED_FUNCTIONS_MESSAGE = "I have updated some more functions you can choose from. What about now?"


def _tool(doc: dict) -> dict:
    spec = dict(doc)
    spec["parameters"] = bfcl_schema(doc.get("parameters") or {"type": "dict", "properties": {}})
    return {"type": "function", "function": spec}


def scenario_splits(entries: Sequence[dict], seed: int, test_fraction: float) -> dict[int, str]:
    """``{scenario index: split}``: indices stratified by backend set, split by the seeded hash rule."""
    by_index: dict[int, str] = {}
    for e in entries:
        by_index.setdefault(int(e["id"].rsplit("_", 1)[1]), ",".join(sorted(e["involved_classes"])))
    keys = sorted(by_index)
    splits = hash_split([str(i) for i in keys], seed, test_fraction, strata=[by_index[i] for i in keys])
    return dict(zip(keys, splits))


def multi_turn_row(entry: dict, gold: list[list[str]], category: str, system: str = DEFAULT_SYSTEM) -> dict:
    """One row (module docstring) from a BFCL question entry and its gold turns."""
    from recipe.mrtpo.tasks.multi_turn.official import function_docs

    docs = function_docs(entry["involved_classes"])
    held = {str(t): list(names) for t, names in (entry.get("missed_function") or {}).items()}
    held_names = {n for names in held.values() for n in names}
    by_name = {d["name"]: d for d in docs}
    unknown = sorted(held_names - set(by_name))
    if unknown:
        raise ValueError(f"held-out functions {unknown} are not documented for {entry['involved_classes']}")
    turns = []
    for t, messages in enumerate(entry["question"]):
        if not messages and str(t) in held:
            messages = [{"role": "user", "content": ADDED_FUNCTIONS_MESSAGE}]
        if not messages:
            raise ValueError(f"turn {t} has no message and adds no function")
        turns.append([{"role": str(m["role"]), "content": str(m["content"])} for m in messages])
    if len(turns) != len(gold):
        raise ValueError(f"{len(turns)} question turns for {len(gold)} gold turns")
    extra = {
        "split": "",
        "index": 0,
        "id": entry["id"],
        "category": category,
        "scenario": int(entry["id"].rsplit("_", 1)[1]),
        "num_turns": len(turns),
        "involved_classes": list(entry["involved_classes"]),
        # key order kept: BFCL's file system takes the first key under "root" as its root directory
        "initial_config": json.dumps(entry["initial_config"], ensure_ascii=False),
        "tools": json.dumps([_tool(d) for d in docs if d["name"] not in held_names], ensure_ascii=False),
        "missed_function": json.dumps({t: [_tool(by_name[n]) for n in names] for t, names in held.items()},
                                      ensure_ascii=False, sort_keys=True),
        "user_turns": json.dumps(turns, ensure_ascii=False),
    }
    prompt = [{"role": "system", "content": system}, *turns[0]]
    row = make_row(DATA_SOURCE, prompt, ABILITY, {"turns": json.dumps(gold, ensure_ascii=False)}, extra)
    row["agent_name"] = AGENT_NAME
    return row


def gold_record(gold: list[list[str]]) -> dict:
    """The trajectory record of the gold answer: per turn one step with the gold calls, or a plain-text
    step where the gold makes no call."""
    return {"turns": [{"steps": [{"text": "", "calls": list(calls), "error": None}] if calls
                       else [{"text": "None of the functions can do this.", "calls": [], "error": None}]}
                      for calls in gold]}


def gold_check(row: dict) -> Optional[str]:
    """None if the row's gold scores 1 on every reward through the task, else why not."""
    from recipe.mrtpo.tasks.multi_turn.verifier import score

    gt = row["reward_model"]["ground_truth"]
    try:
        result = score(gold_record(json.loads(gt["turns"])), gt, row["extra_info"])
    except (ValueError, TypeError, KeyError) as e:
        return f"bad row: {e}"[:300]
    failed = {k: v for k, v in result.scores.items() if v != 1.0}
    if failed:
        return f"gold fails the verifier: {failed} {result.info.get('errors') or result.info.get('format_error') or ''}"[:300]
    return None


def build_rows(categories: Sequence[str] = CATEGORIES, seed: int = 0, test_fraction: float = DEFAULT_TEST_FRACTION,
               system: str = DEFAULT_SYSTEM, skips: Optional[SkipLog] = None) -> tuple[list[dict], int]:
    """Rows of the categories, split by scenario (module docstring). Returns (rows, questions read)."""
    from recipe.mrtpo.tasks.multi_turn.official import data_dir, load_category

    skips = skips if skips is not None else SkipLog()
    loaded = {c: load_category(c) for c in categories}
    splits = scenario_splits([q for c in categories for q, _ in loaded[c]], seed, test_fraction)
    rows, read = [], 0
    for c in categories:
        path = data_dir() / f"BFCL_v4_multi_turn_{c}.json"
        for line, (entry, gold) in enumerate(progress(loaded[c], f"bfcl_multi_turn:{c}"), start=1):
            read += 1
            try:
                row = multi_turn_row(entry, gold, c, system)
            except (KeyError, ValueError, TypeError) as e:
                skips.skip(path, line, f"malformed question: {entry.get('id')}: {e}")
                continue
            why = gold_check(row)
            if why is not None:
                skips.skip(path, line, f"{why} ({entry['id']})")
                continue
            row["extra_info"]["split"] = splits[row["extra_info"]["scenario"]]
            rows.append(row)
    return rows, read


def _shortness(row: dict) -> tuple:
    turns = json.loads(row["extra_info"]["user_turns"])
    return (row["extra_info"]["num_turns"], sum(len(m["content"]) for t in turns for m in t), row["extra_info"]["id"])


def offline_rows(rows: list[dict]) -> list[dict]:
    """The offline set (module docstring) chosen among built rows."""
    out = []
    for c in OFFLINE_CATEGORIES:
        for split, n in OFFLINE_PER_CATEGORY.items():
            pool = [r for r in rows if r["extra_info"]["category"] == c and r["extra_info"]["split"] == split]
            out.extend(sorted(pool, key=_shortness)[:n])
    return out


def card_columns():
    """The data card's columns of multi-turn rows."""
    def irrelevance(r):
        return "yes" if any(not t for t in json.loads(r["reward_model"]["ground_truth"]["turns"])) else "no"

    return [
        ("category", lambda r: r["extra_info"]["category"]),
        ("turns", lambda r: r["extra_info"]["num_turns"]),
        ("backends", lambda r: r["extra_info"]["involved_classes"]),
        ("has a no-call turn", irrelevance),
    ]


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m data_prep.multi_turn",
        description="Build BFCL v4 multi-turn parquet (verl layout, split by scenario) from the installed "
        "bfcl-eval. Prints a data card.",
        epilog=__doc__.split("CLI::", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out-dir", required=True, help="folder for train.parquet / test.parquet")
    ap.add_argument("--categories", default=",".join(CATEGORIES), help="comma-separated (default: all four)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the scenario split (default 0)")
    ap.add_argument("--test-fraction", type=fraction, default=DEFAULT_TEST_FRACTION,
                    help=f"share of scenarios in test (default {DEFAULT_TEST_FRACTION})")
    ap.add_argument("--system", default=DEFAULT_SYSTEM, help="the system message of every prompt")
    ap.add_argument("--offline", action="store_true", help="write only the small offline set for CPU tests")
    args = ap.parse_args(argv)
    cats = [c.strip() for c in args.categories.split(",") if c.strip()]
    bad = [c for c in cats if c not in CATEGORIES]
    if bad or not cats:
        print(f"error: unknown categories {bad}; choose from {CATEGORIES}", file=sys.stderr)
        return 2
    skips = SkipLog()
    rows, read = build_rows(cats, args.seed, args.test_fraction, args.system, skips)
    if args.offline:
        rows = offline_rows(rows)
    title = "bfcl_multi_turn" + (" (offline set)" if args.offline else "")
    if not rows:
        print_data_card(title, rows, skips=skips, read=read)
        print("error: no rows built", file=sys.stderr)
        return 1
    written = write_splits(rows, args.out_dir)
    print_data_card(title, rows, card_columns(), skips=skips, read=read, written=written)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
