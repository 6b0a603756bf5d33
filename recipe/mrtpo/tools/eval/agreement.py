"""Agreement of the recipe's verifiers with the official checkers on generated cases.

``python -m recipe.mrtpo.tools.eval.agreement bfcl [--parquet data/bfcl/test.parquet | --bfcl-dir .assets/bfcl]``

For every BFCL row (built by ``data_prep.tool_calling``: reference calls with every acceptable value,
the tool specs, and the row's original function docs and possible answer) it writes the gold answer
and systematic perturbations of it (each acceptable alternative of each argument, case/spacing/
punctuation variants of strings, omitted arguments, ``null`` values, a float for an integer and an
integer for a float, a number as a string, a spec default added, an undeclared argument, a wrong
value, calls reordered, dropped or duplicated), reads each through the recipe's
``tool_calling.extract_calls`` and compares the recipe's full credit (``exact_match``, i.e.
``correctness == 1`` with equal counts) with BFCL's own ``ast_checker`` (:mod:`bfcl_official`) on
the same decoded calls. Prints agreement per category and per perturbation kind, and the first
disagreements. Exit status 0 (it is a measurement, not a test).
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

__all__ = ["bfcl_cases", "measure_bfcl", "main"]


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


def _rows_from(parquet: Optional[Path], bfcl_dir: Optional[Path]) -> list[dict]:
    if parquet is not None:
        import pandas as pd

        return [r.to_dict() for _, r in pd.read_parquet(parquet).iterrows()]
    from data_prep.common import SkipLog
    from data_prep.tool_calling import DEFAULT_BFCL_DIR, build_bfcl_rows

    rows, _ = build_bfcl_rows(bfcl_dir or DEFAULT_BFCL_DIR, skips=SkipLog(max_printed=0))
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


def _line(name: str, c: dict) -> str:
    return (f"{name:28s} {c['n']:7d} {c['agree'] / max(1, c['n']):9.4f} {c['n'] - c['agree']:8d} "
            f"{c['official_valid']:9d} {c['recipe_valid']:9d}")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m recipe.mrtpo.tools.eval.agreement", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("task", choices=["bfcl"])
    ap.add_argument("--parquet", type=Path, default=None, help="built BFCL parquet (default: build from --bfcl-dir)")
    ap.add_argument("--bfcl-dir", type=Path, default=None)
    ap.add_argument("--show", type=int, default=10, help="disagreements printed")
    ap.add_argument("--out", type=Path, default=None, help="write the counts as JSON")
    args = ap.parse_args(argv)
    result = measure_bfcl(_rows_from(args.parquet, args.bfcl_dir), args.show)
    print(f"{'':28s} {'cases':>7s} {'agree':>9s} {'differ':>8s} {'official':>9s} {'recipe':>9s}")
    print(_line("total", result["total"]))
    for k, c in result["by_category"].items():
        print(_line(k, c))
    for k, c in result["by_kind"].items():
        print(_line("  " + k, c))
    for e in result["disagreements"]:
        print(json.dumps(e, ensure_ascii=False))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
