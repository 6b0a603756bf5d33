"""Benchmark: the multi-turn task against BFCL's official multi-turn checker on the whole shipped set.

    python benchmarks/bench_multi_turn_agreement.py [--every 1] [--categories base,long_context,miss_func,miss_param]

For every question (or every ``--every``-th scenario) of the installed ``bfcl-eval``'s four multi-turn
categories (800 questions), the row is built by ``data_prep.multi_turn`` and scored through the task
(``recipe.mrtpo.tasks.multi_turn.verifier.score``) on the gold record and on each corruption of
:func:`corruptions`; BFCL's ``multi_turn_checker`` and ``multi_turn_irrelevance_checker`` are called
directly on the same decoded calls. A case agrees when the task's ``bfcl_valid`` / ``bfcl_error_type``
equal the checker's verdict, ``state`` and ``response`` are both 1 exactly when it is valid, the reward
its error type names is 0, and ``irrelevance`` equals the irrelevance checker's verdict. The gold must
also score 1 on every reward. One row per category, then ``agreement: <agreed>/<cases> ...``; exit
status 1 on any disagreement. ``tests/unit/test_multi_turn_verifier.py`` runs the same comparison on a
declared subset (every 10th scenario) and the gold on all 800.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from typing import Optional

CATEGORIES = ("base", "long_context", "miss_func", "miss_param")
KINDS = ("dropped_call", "wrong_argument", "extra_call", "unknown_function", "call_in_no_call_turn")


def _render(name: str, args: tuple, kwargs: tuple) -> str:
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs]
    return f"{name}({', '.join(parts)})"


def _changed(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 7
    if isinstance(value, str):
        return value + "_corrupted"
    if isinstance(value, (list, tuple)):
        return [*value, "corrupted"]
    if isinstance(value, dict):
        return {**value, "corrupted": 1}
    return "corrupted"


def _wrong_argument(call: str) -> Optional[str]:
    from recipe.mrtpo.tasks.multi_turn.calls import parse_call

    c = parse_call(call)
    if c.args:
        return _render(c.name, (_changed(c.args[0]), *c.args[1:]), c.kwargs)
    if c.kwargs:
        (k, v), rest = c.kwargs[0], c.kwargs[1:]
        return _render(c.name, c.args, ((k, _changed(v)), *rest))
    return None


def corruptions(gold: list[list[str]]) -> dict[str, list[list[str]]]:
    """Corrupted copies of the gold turns, by kind, each changing the first turn whose gold calls (t):

    - ``dropped_call``: t's last call removed;
    - ``wrong_argument``: t's first call with an argument gets its first argument changed (str + suffix,
      number + 7, bool negated, list/dict extended);
    - ``extra_call``: t's last call made twice;
    - ``unknown_function``: ``nonexistent_function(x=1)`` appended to t;
    - ``call_in_no_call_turn`` (questions with a no-call turn): t's first call made in the first turn whose
      gold makes no call.

    A kind that cannot apply (no argument anywhere in t) is left out."""
    t = next((i for i, calls in enumerate(gold) if calls), None)
    if t is None:
        return {}
    out: dict[str, list[list[str]]] = {}

    def edit(fn):
        turns = copy.deepcopy(gold)
        fn(turns)
        return turns

    out["dropped_call"] = edit(lambda g: g[t].pop())
    for j, call in enumerate(gold[t]):
        wrong = _wrong_argument(call)
        if wrong is not None:
            out["wrong_argument"] = edit(lambda g, j=j, wrong=wrong: g[t].__setitem__(j, wrong))
            break
    out["extra_call"] = edit(lambda g: g[t].append(g[t][-1]))
    out["unknown_function"] = edit(lambda g: g[t].append("nonexistent_function(x=1)"))
    empty = next((i for i, calls in enumerate(gold) if not calls), None)
    if empty is not None:
        out["call_in_no_call_turn"] = edit(lambda g: g[empty].append(gold[t][0]))
    return out


def record_of(turns: list[list[str]]) -> dict:
    """The trajectory record of one call list per turn (one step per non-empty turn)."""
    from data_prep.multi_turn import gold_record

    return gold_record(turns)


def official(decoded: list[list[list[str]]], gold: list[list[str]], entry: dict) -> tuple[dict, dict]:
    """BFCL's own verdicts: ``multi_turn_checker`` and ``multi_turn_irrelevance_checker``, called directly."""
    from recipe.mrtpo.tasks.multi_turn.official import irrelevance_verdict, official_verdict

    return official_verdict(decoded, gold, entry), irrelevance_verdict(decoded, gold)


def disagreement(result, verdict: dict, irrelevance: dict) -> Optional[str]:
    """None if the task's result agrees with BFCL's verdicts (module docstring), else what differs."""
    s, info = result.scores, result.info
    if bool(info["bfcl_valid"]) != bool(verdict["valid"]) or info["bfcl_error_type"] != verdict.get("error_type"):
        return f"verdict {info['bfcl_valid']}/{info['bfcl_error_type']} vs {verdict['valid']}/{verdict.get('error_type')}"
    if (s["state"] == 1.0 and s["response"] == 1.0) != bool(verdict["valid"]):
        return f"state {s['state']} response {s['response']} vs valid {verdict['valid']}"
    et = verdict.get("error_type")
    if et == "multi_turn:instance_state_mismatch" and s["state"] != 0.0:
        return "state mismatch but state reward 1"
    if et in ("multi_turn:execution_response_mismatch", "multi_turn:empty_turn_model_response") and s["response"] != 0.0:
        return f"{et} but response reward 1"
    if "irrelevance" in s and (s["irrelevance"] == 1.0) != bool(irrelevance["valid"]):
        return f"irrelevance {s['irrelevance']} vs {irrelevance['valid']}"
    return None


def run(categories=CATEGORIES, every: int = 1) -> tuple[list[tuple], list[str]]:
    """Rows ``(category, questions, gold full marks, cases, agreed, seconds)`` and the disagreements."""
    from data_prep.multi_turn import multi_turn_row
    from recipe.mrtpo.tasks.multi_turn.official import load_category
    from recipe.mrtpo.tasks.multi_turn.trajectory import parse_trajectory
    from recipe.mrtpo.tasks.multi_turn.verifier import score

    table, problems = [], []
    for c in categories:
        start = time.perf_counter()
        n = full = cases = agreed = 0
        for entry, gold in load_category(c):
            if int(entry["id"].rsplit("_", 1)[1]) % every:
                continue
            n += 1
            row = multi_turn_row(entry, gold, c)
            gt, extra = row["reward_model"]["ground_truth"], row["extra_info"]
            res = score(record_of(gold), gt, extra)
            if all(v == 1.0 for v in res.scores.values()):
                full += 1
            else:
                problems.append(f"{entry['id']} gold: {res.scores} {res.info}")
            for kind, turns in {"gold": gold, **corruptions(gold)}.items():
                rec = record_of(turns)
                result = score(rec, gt, extra)
                why = disagreement(result, *official(parse_trajectory(rec).decoded(), gold, entry))
                cases += 1
                if why is None:
                    agreed += 1
                else:
                    problems.append(f"{entry['id']} {kind}: {why}")
        table.append((c, n, full, cases, agreed, time.perf_counter() - start))
    return table, problems


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--every", type=int, default=1, help="every N-th scenario (default 1: all 800 questions)")
    ap.add_argument("--categories", default=",".join(CATEGORIES))
    args = ap.parse_args(argv)
    table, problems = run([c for c in args.categories.split(",") if c], max(1, args.every))
    print(f"{'category':<14} | questions | gold full marks | cases | agreed | seconds")
    print("-" * 68)
    for c, n, full, cases, agreed, sec in table:
        print(f"{c:<14} | {n:>9} | {full:>15} | {cases:>5} | {agreed:>6} | {sec:>7.1f}")
    for p in problems[:20]:
        print("DISAGREE", p)
    total = [sum(r[i] for r in table) for i in (1, 2, 3, 4)]
    print(json.dumps({"questions": total[0], "gold_full_marks": total[1], "cases": total[2], "agreed": total[3]}))
    print(f"agreement: {total[3]}/{total[2]} cases, gold full marks {total[1]}/{total[0]} questions")
    return 0 if not problems else 1


if __name__ == "__main__":
    raise SystemExit(main())
