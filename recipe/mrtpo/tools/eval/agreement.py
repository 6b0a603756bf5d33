"""Agreement of the recipe's verifiers with the official checkers on generated cases.

``python -m recipe.mrtpo.tools.eval.agreement bfcl [--parquet FILE ...]``

For every BFCL row of the built parquet files (default ``data/bfcl/train.parquet`` and ``test.parquet``, the
two splits ``python -m data_prep.build_offline --out-dir data --only bfcl`` writes of BFCL's 8 AST categories; each row
carries the reference calls with every acceptable value, the tool specs, and the row's original function
docs and possible answer) it writes the gold answer
and systematic perturbations of it (each acceptable alternative of each argument, case/spacing/
punctuation variants of strings, omitted arguments, ``null`` values, a float for an integer and an
integer for a float, a number as a string, a spec default added, an undeclared argument, a wrong
value, calls reordered, dropped or duplicated), reads each through the recipe's
``tool_calling.extract_calls`` and compares the recipe's full credit (``exact_match``, i.e.
``correctness == 1`` with equal counts) with BFCL's own ``ast_checker`` (:mod:`bfcl_official`) on
the same decoded calls. Prints agreement per category and per perturbation kind, and the first
disagreements. Exit status 0 (it is a measurement, not a test).

``python -m recipe.mrtpo.tools.eval.agreement sql --test-suite-dir DIR [--questions FILE --db FILE]``

For every Chinook question (``data_prep/data/chinook_questions.jsonl`` on ``data/chinook/chinook.sqlite`` by
default, the database ``python -m data_prep.chinook_db`` builds)
it writes the gold query and perturbations of it (:func:`sql_cases`: DISTINCT added or removed, in
``count`` too, ORDER BY removed or reversed, columns reversed, the rows doubled with ``UNION ALL``,
values as floats or rounded, ``avg(x)`` as ``sum(x) * 1.0 / count(x)``, LIMIT changed, spaced comparison operators, a second statement, an empty
filter) and compares, in both modes, the recipe's ``execution_match`` with test-suite-sql-eval's own
``exec_eval.eval_exec_match`` imported from ``DIR`` (a checkout of test-suite-sql-eval, with its
requirements such as sqlparse installed). The database is copied alone into a temporary folder, as
test-suite runs every ``.sqlite`` file next to it. It also compares the recipe's ``results_match``
with test-suite's ``result_eq`` on 20,000 random pairs of results (:func:`measure_result_eq`).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

__all__ = ["bfcl_cases", "measure_bfcl", "sql_cases", "measure_sql", "main"]


def _call_json(calls: list[dict]) -> str:
    return "\n".join("<tool_call>\n" + json.dumps({"name": c["name"], "arguments": c["arguments"]},
                                                   ensure_ascii=False) + "\n</tool_call>" for c in calls)


def _string_variants(s: str) -> list[str]:
    out = [s.upper(), s.replace(" ", "  ") + " ", s.replace(" ", "-"), s + ".", s.replace(",", ""), s.title()]
    return [v for v in out if v != s]


def bfcl_cases(calls: list[dict], tools: list[dict]) -> Iterator[tuple[str, list[dict]]]:
    """(kind, predicted calls) for the gold and its perturbations (module docstring)."""
    from recipe.mrtpo.tasks.tool_reference import accepted_values, function_specs

    specs = function_specs(tools)
    gold = [{"name": c["name"], "arguments": copy.deepcopy(c["arguments"])} for c in calls]
    yield "gold", gold

    def with_arg(i: int, key: str, value: Any = None, drop: bool = False) -> list[dict]:
        out = copy.deepcopy(gold)
        if drop:
            out[i]["arguments"].pop(key, None)
        else:
            out[i]["arguments"][key] = value
        return out

    for i, c in enumerate(calls):
        props = ((specs.get(c["name"]) or {}).get("parameters") or {}).get("properties") or {}
        for k, allowed in accepted_values(c).items():
            for alt in allowed[1:] if not (allowed and allowed[0] == "") else allowed[1:]:
                if alt != "" and not isinstance(alt, (dict, list)):
                    yield "alternative", with_arg(i, k, alt)
            if k in c["arguments"]:
                yield "omitted", with_arg(i, k, drop=True)
                yield "null", with_arg(i, k, None)
                v = c["arguments"][k]
                if isinstance(v, str):
                    for s in _string_variants(v):
                        yield "string_variant", with_arg(i, k, s)
                    yield "wrong_value", with_arg(i, k, v + " zzz")
                elif isinstance(v, bool):
                    yield "bool_as_int", with_arg(i, k, int(v))
                    yield "bool_as_string", with_arg(i, k, str(v).lower())
                elif isinstance(v, int):
                    yield "int_as_float", with_arg(i, k, float(v))
                    yield "number_as_string", with_arg(i, k, str(v))
                    yield "wrong_value", with_arg(i, k, v + 1)
                elif isinstance(v, float):
                    if v.is_integer():
                        yield "float_as_int", with_arg(i, k, int(v))
                    yield "number_as_string", with_arg(i, k, str(v))
                elif isinstance(v, list) and v:
                    yield "list_reversed", with_arg(i, k, list(reversed(v)))
                    yield "list_shorter", with_arg(i, k, v[:-1])
                    if all(isinstance(x, str) for x in v):
                        yield "string_variant", with_arg(i, k, [x.upper() for x in v])
            elif k not in c["arguments"] and any(a != "" for a in allowed):
                first = next(a for a in allowed if a != "")
                if not isinstance(first, (dict, list)):
                    yield "optional_given", with_arg(i, k, first)
        for k, p in props.items():
            if k not in c["arguments"] and isinstance(p, dict) and "default" in p and p["default"] is not None:
                yield "default_given", with_arg(i, k, p["default"])
        yield "undeclared_arg", with_arg(i, "zz_undeclared", 1)
        renamed = copy.deepcopy(gold)
        renamed[i]["name"] = c["name"] + "_x"
        yield "wrong_name", renamed
    if len(gold) > 1:
        yield "reordered", list(reversed(gold))
        yield "call_dropped", gold[:-1]
    yield "call_duplicated", gold + gold[-1:]
    yield "no_call", []


#: the repository's root (the default files below are read from it, whatever the working directory)
REPO = Path(__file__).resolve().parents[4]
#: the built BFCL splits, the Chinook questions and database the commands read by default
BFCL_PARQUETS = (REPO / "data" / "bfcl" / "train.parquet", REPO / "data" / "bfcl" / "test.parquet")
CHINOOK_QUESTIONS = REPO / "data_prep" / "data" / "chinook_questions.jsonl"
CHINOOK_DB = REPO / "data" / "chinook" / "chinook.sqlite"


def _missing(path: Path, build: str) -> str:
    return f"{path} not found: build it with `{build}` (or pass the file)"


def _rows_from(parquets: list[Path]) -> list[dict]:
    """The BFCL rows of the built parquet files, in order."""
    import pandas as pd

    rows: list[dict] = []
    for p in parquets:
        rows += [r.to_dict() for _, r in pd.read_parquet(p).iterrows()]
    return rows


def measure_bfcl(rows: list[dict], show: int = 10) -> dict:
    """Agreement counts of recipe vs official on :func:`bfcl_cases` of every row."""
    from recipe.mrtpo.tasks import tool_calling as T
    from recipe.mrtpo.tools.eval.bfcl_official import official_ast_valid

    by_cat: dict[str, Counter] = defaultdict(Counter)
    by_kind: dict[str, Counter] = defaultdict(Counter)
    examples: list[dict] = []
    for row in rows:
        gt = row["reward_model"]["ground_truth"]
        off = json.loads(gt["bfcl"])
        calls, tools = T.parse_ground_truth(gt)
        for kind, pred in bfcl_cases(calls, tools):
            response = _call_json(pred)
            decoded = T.extract_calls(response)
            ours = T.exact_match(response, gt)
            theirs, why = official_ast_valid(off["function"], decoded, off["ground_truth"], off["category"])
            agree = ours == theirs
            for c in (by_cat[off["category"]], by_kind[kind]):
                c["n"] += 1
                c["agree"] += agree
                c["official_valid"] += theirs
                c["recipe_valid"] += ours
            if not agree and len(examples) < show:
                examples.append({"id": off["id"], "kind": kind, "recipe": ours, "official": theirs,
                                 "official_error": why, "response": response[:300]})
    total = Counter()
    for c in by_cat.values():
        total.update(c)
    return {"total": dict(total), "by_category": {k: dict(v) for k, v in sorted(by_cat.items())},
            "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())}, "disagreements": examples}


def sql_cases(gold: str) -> Iterator[tuple[str, str]]:
    """(kind, predicted SQL) for the gold query and its perturbations (module docstring)."""
    import sqlglot
    from sqlglot import exp

    yield "gold", gold
    try:
        tree = sqlglot.parse_one(gold, read="sqlite")
    except Exception:  # noqa: BLE001 - a gold sqlglot cannot parse gets only the text perturbations
        tree = None

    def edited(fn) -> Optional[str]:
        t = tree.copy()
        return t.sql(dialect="sqlite") if fn(t) is not False else None

    if isinstance(tree, exp.Select):
        def toggle_distinct(t):
            t.set("distinct", None if t.args.get("distinct") else exp.Distinct())
        yield ("distinct_removed" if tree.args.get("distinct") else "distinct_added"), edited(toggle_distinct)

        def reverse_columns(t):
            if len(t.expressions) < 2 or any(isinstance(e, exp.Star) for e in t.expressions):
                return False
            t.set("expressions", list(reversed(t.expressions)))
        yield "columns_reversed", edited(reverse_columns)

        def as_float(t):
            if any(isinstance(e, exp.Star) for e in t.expressions):
                return False
            t.set("expressions", [exp.alias_(exp.Mul(this=e.unalias().copy(), expression=exp.Literal.number("1.0")),
                                             e.alias_or_name) for e in t.expressions])
        yield "values_as_float", edited(as_float)

        def rounded(t):
            if any(isinstance(e, exp.Star) for e in t.expressions):
                return False
            t.set("expressions", [exp.alias_(exp.Round(this=e.unalias().copy(), decimals=exp.Literal.number(2)),
                                             e.alias_or_name) for e in t.expressions])
        yield "values_rounded", edited(rounded)

        def empty_filter(t):
            t.where("1 = 0", copy=False)
        yield "empty_filter", edited(empty_filter)
    if tree is not None:
        def toggle_count_distinct(t):
            counts = list(t.find_all(exp.Count))
            if not counts:
                return False
            for c in counts:
                arg = c.this
                if isinstance(arg, exp.Distinct):
                    c.set("this", arg.expressions[0])
                elif not isinstance(arg, exp.Star):
                    c.set("this", exp.Distinct(expressions=[arg]))
        yield "count_distinct_toggled", edited(toggle_count_distinct)

        def avg_as_ratio(t):  # the same mean, computed in another order: the last bits can differ
            avgs = list(t.find_all(exp.Avg))
            if not avgs:
                return False
            for a in avgs:
                x = a.this
                a.replace(exp.Div(this=exp.Mul(this=exp.Sum(this=x.copy()), expression=exp.Literal.number("1.0")),
                                  expression=exp.Count(this=x.copy())))
        yield "avg_as_sum_over_count", edited(avg_as_ratio)
        if tree.args.get("order") is not None:
            yield "order_removed", edited(lambda t: t.set("order", None))

            def reverse_order(t):
                for o in t.args["order"].expressions:
                    o.set("desc", not o.args.get("desc"))
            yield "order_reversed", edited(reverse_order)
        if tree.args.get("limit") is not None:
            def longer(t):
                n = t.args["limit"].expression
                if not (isinstance(n, exp.Literal) and n.is_int):
                    return False
                t.args["limit"].set("expression", exp.Literal.number(int(n.this) + 1))
            yield "limit_plus_one", edited(longer)
    yield "rows_doubled", f"SELECT * FROM ({gold}) UNION ALL SELECT * FROM ({gold})"
    spaced = gold.replace(">=", "> =").replace("<=", "< =").replace("!=", "! =")
    if spaced != gold:
        yield "spaced_operators", spaced
    yield "second_statement", gold + "; SELECT 1"


def measure_sql(questions: list[dict], db: Path, official_dir: Path, show: int = 10) -> dict:
    """Agreement counts of the recipe's ``execution_match`` with test-suite's ``eval_exec_match``, per
    mode and per perturbation kind, over :func:`sql_cases` of every question."""
    import importlib
    import shutil
    import tempfile

    from recipe.mrtpo.tasks.text_to_sql import score

    sys.path.insert(0, str(official_dir))
    exec_eval = importlib.import_module("exec_eval")
    by_mode: dict[str, Counter] = defaultdict(Counter)
    by_kind: dict[str, Counter] = defaultdict(Counter)
    examples: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        db_copy = Path(tmp) / "db.sqlite"
        shutil.copyfile(db, db_copy)
        for q in questions:
            gold = q["gold_sql"]
            for kind, pred in sql_cases(gold):
                if pred is None:
                    continue
                response = f"```sql\n{pred}\n```"
                for mode in ("keep_distinct", "spider_default"):
                    ours = score(response, {"db_path": str(db_copy), "gold_sql": gold},
                                 {"sql_mode": mode, "sql_timeout_s": 60}).scores["execution_match"] == 1.0
                    theirs = bool(exec_eval.eval_exec_match(str(db_copy), pred, gold, plug_value=False,
                                                            keep_distinct=mode == "keep_distinct",
                                                            progress_bar_for_each_datapoint=False))
                    for c in (by_mode[mode], by_kind[f"{mode}/{kind}"]):
                        c["n"] += 1
                        c["agree"] += ours == theirs
                        c["official_valid"] += theirs
                        c["recipe_valid"] += ours
                    if ours != theirs and len(examples) < show:
                        examples.append({"id": q.get("id"), "mode": mode, "kind": kind, "recipe": ours,
                                         "official": theirs, "pred": pred[:300]})
    return {"by_mode": {k: dict(v) for k, v in sorted(by_mode.items())},
            "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
            "result_eq_random_pairs": measure_result_eq(exec_eval), "disagreements": examples}


_FUZZ_VALUES = (None, 0, 1, 1.0, 10, 2, 2.0, 0.1 + 0.2, 0.3, "1", "a", "b", "10", 1.234567890123, 1.2345678901234,
                b"a", -1, 3)


def measure_result_eq(exec_eval, n: int = 20_000, seed: int = 0) -> dict:
    """The recipe's ``results_match`` against test-suite's ``result_eq`` on ``n`` random pairs of results
    (the gold with its columns and rows permuted, values changed or rows repeated, or unrelated rows;
    ints, integral floats, float noise, text, blobs, NULL; ordered and not)."""
    import random

    from recipe.mrtpo.tasks.sql_compare import results_match

    rng = random.Random(seed)
    c: Counter = Counter()
    for _ in range(n):
        width, height = rng.randint(1, 5), rng.randint(0, 5)
        pool = _FUZZ_VALUES[:rng.randint(3, len(_FUZZ_VALUES))]
        gold = [tuple(rng.choice(pool) for _ in range(width)) for _ in range(height)]
        if rng.random() < 0.4:
            perm = rng.sample(range(width), width)
            pred = [tuple(r[i] for i in perm) for r in gold]
            if rng.random() < 0.5:
                rng.shuffle(pred)
            if pred and rng.random() < 0.4:
                row = list(pred[rng.randrange(len(pred))])
                row[rng.randrange(width)] = rng.choice(_FUZZ_VALUES)
                pred[rng.randrange(len(pred))] = tuple(row)
            if pred and rng.random() < 0.2:
                pred[-1] = pred[0]
        else:
            rows = height if rng.random() < 0.8 else rng.randint(0, 5)
            pred = [tuple(rng.choice(_FUZZ_VALUES[:6]) for _ in range(width)) for _ in range(rows)]
        ordered = rng.random() < 0.4
        theirs = bool(exec_eval.result_eq(gold, pred, order_matters=ordered))
        ours = results_match(pred, gold, ordered)[0]
        c["n"] += 1
        c["agree"] += ours == theirs
        c["official_valid"] += theirs
        c["recipe_valid"] += ours
    return dict(c)


def _line(name: str, c: dict) -> str:
    return (f"{name:44s} {c['n']:7d} {c['agree'] / max(1, c['n']):9.4f} {c['n'] - c['agree']:8d} "
            f"{c['official_valid']:9d} {c['recipe_valid']:9d}")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m recipe.mrtpo.tools.eval.agreement", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("task", choices=["bfcl", "sql"])
    ap.add_argument("--parquet", type=Path, action="append", default=None,
                    help="bfcl: a built BFCL parquet, repeatable (default: data/bfcl/train.parquet and test.parquet)")
    ap.add_argument("--test-suite-dir", type=Path, default=None, help="sql: a checkout of test-suite-sql-eval")
    ap.add_argument("--questions", type=Path, default=None, help="sql: JSON lines with gold_sql (default: Chinook's)")
    ap.add_argument("--db", type=Path, default=None, help="sql: the SQLite file (default: data/chinook/chinook.sqlite)")
    ap.add_argument("--show", type=int, default=10, help="disagreements printed")
    ap.add_argument("--out", type=Path, default=None, help="write the counts as JSON")
    args = ap.parse_args(argv)
    print(f"{'':44s} {'cases':>7s} {'agree':>9s} {'differ':>8s} {'official':>9s} {'recipe':>9s}")
    if args.task == "sql":
        if args.test_suite_dir is None:
            ap.error("sql needs --test-suite-dir (a checkout of test-suite-sql-eval)")
        qpath, db = args.questions or CHINOOK_QUESTIONS, args.db or CHINOOK_DB
        if not qpath.is_file():
            ap.error(f"{qpath} not found")
        if not db.is_file():
            ap.error(_missing(db, "python -m data_prep.chinook_db"))
        questions = [json.loads(line) for line in qpath.read_text().splitlines() if line.strip()]
        result = measure_sql(questions, db, args.test_suite_dir, args.show)
        groups = {**result["by_mode"], **{"  " + k: v for k, v in result["by_kind"].items()},
                  "result_eq, random pairs": result["result_eq_random_pairs"]}
    else:
        parquets = args.parquet or list(BFCL_PARQUETS)
        for p in parquets:
            if not p.is_file():
                ap.error(_missing(p, "python -m data_prep.build_offline --out-dir data --only bfcl"))
        result = measure_bfcl(_rows_from(parquets), args.show)
        groups = {"total": result["total"], **result["by_category"],
                  **{"  " + k: v for k, v in result["by_kind"].items()}}
    for k, c in groups.items():
        print(_line(k, c))
    for e in result["disagreements"]:
        print(json.dumps(e, ensure_ascii=False))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
