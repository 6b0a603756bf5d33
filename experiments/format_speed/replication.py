"""The confirmatory replication of the format-speed claim (``docs/format_speed/replication_plan.md``): MRTPO vs GDPO
on fresh seeds 24-63, the grid's condition, code, data and warm start; a rank-based primary.

    python -m experiments.format_speed.replication power      # the plan's power table (from the grid's records)
    python -m experiments.format_speed.replication run        # the 80 runs (resumable; records into --docs/runs)
    python -m experiments.format_speed.replication analyse    # docs/format_speed/replication/{analysis.md,per_seed.json}

``run`` is the grid's runner (:mod:`.grid`) with the replication's arms and seeds, its records in
``docs/format_speed/replication/runs`` and the grid's committed warm start. ``analyse`` computes, on the seeds both
arms finished, the plan's primary (:func:`.stats.signed_rank_p` on T, MRTPO - GDPO), with the sign test, the mean's
sign-flip test, the Hodges-Lehmann estimate and the mean, each with its bootstrap interval, and the stall and
format-loss counts per arm.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import numpy as np

from experiments.format_speed import stats
from experiments.format_speed.common import REPO

ARMS = ("gdpo", "mrtpo")
SEEDS = tuple(range(24, 64))
STEPS = 30
DOCS = REPO / "docs" / "format_speed" / "replication"
GRID = REPO / "docs" / "format_speed" / "grid"
ALPHA = 0.05
#: the conservative scenarios of the power table: P(MRTPO reaches format 0.8 first in a pair)
P_FIRST = (0.9, 0.8, 0.75, 0.7, 0.65)


def grid_differences(records: Path = GRID / "runs") -> list[float]:
    """MRTPO - GDPO on T per seed of the grid (its committed records; the plan's definition of T)."""
    from experiments.format_speed.analysis import load_records, run_endpoints

    recs = load_records(records)
    ends = {k: run_endpoints(r, STEPS) for k, r in recs.items()}
    seeds = sorted(s for (a, s) in ends if a == "mrtpo" and ("gdpo", s) in ends)
    return [float(ends[("mrtpo", s)]["T"] - ends[("gdpo", s)]["T"]) for s in seeds
            if not ends[("mrtpo", s)]["failed"] and not ends[("gdpo", s)]["failed"]]


def flip_draw(diffs: Sequence[float], p_first: float):
    """A scenario for the power: a pair's difference is one of the grid's (drawn with replacement), its sign
    reversed with the probability f that makes P(difference < 0) = ``p_first`` (f = (p_obs - p_first) /
    (p_obs - (1 - p_obs)), p_obs the grid's share of negative differences). f = 0 is the bootstrap of the grid."""
    d = np.asarray(diffs, dtype=float)
    p_obs = float(np.mean(d < 0))
    f = 0.0 if p_first >= p_obs else (p_obs - p_first) / (p_obs - float(np.mean(d > 0)))

    def draw(rng, n):
        x = d[rng.integers(0, d.size, size=n)]
        return np.where(rng.random(n) < f, -x, x)

    return draw, f


def power_table(diffs: Sequence[float], n: int = len(SEEDS), sims: int = 4000, mean_sims: Optional[int] = None) -> list[dict]:
    """Power at ``n`` pairs of the signed-rank test (the primary), the sign test and the mean's sign-flip test
    (``mean_sims`` replications, default sims / 20 and at least 200: its exact enumeration costs ~0.5 s at n = 40;
    0 leaves it out), under the grid's own differences and under each :data:`P_FIRST` scenario (:func:`flip_draw`)."""
    mean_sims = max(200, sims // 20) if mean_sims is None else mean_sims

    def rank(d):
        r = stats.signed_rank_p(d)
        return r["p"] if r else 1.0

    def sign(d):
        r = stats.sign_test_p(d)
        return r["p"] if r else 1.0

    rows = []
    for p_first in (None, *P_FIRST):
        draw, f = flip_draw(diffs, 1.0 if p_first is None else p_first)
        rows.append({"p_first": p_first, "flip": f,
                     "signed_rank": stats.simulated_power(draw, n, rank, ALPHA, sims),
                     "sign": stats.simulated_power(draw, n, sign, ALPHA, sims),
                     "mean_signflip": stats.simulated_power(draw, n, stats.paired_signflip_p, ALPHA, mean_sims)
                     if mean_sims else None})
    return rows


def render_power(rows: list[dict], diffs: Sequence[float], n: int = len(SEEDS)) -> str:
    obs = float(np.mean(np.asarray(diffs) < 0))
    lines = [f"Power at n = {n} pairs, alpha {ALPHA} two-sided (simulated; the grid's {len(diffs)} differences, "
             f"P(MRTPO first) observed {obs:.2f}):", "",
             "| scenario: P(MRTPO first) | signs reversed | signed-rank (primary) | sign test | mean, sign-flip |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        name = "the grid's differences (bootstrap)" if r["p_first"] is None else f"{r['p_first']:.2f}"
        mean = "–" if r["mean_signflip"] is None else f"{r['mean_signflip']:.3f}"
        lines.append(f"| {name} | {r['flip']:.2f} | {r['signed_rank']:.3f} | {r['sign']:.3f} | {mean} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the analysis
def analyse(records: dict, steps: int = STEPS) -> dict:
    """The plan's numbers from the replication's records (``{(arm, seed): record}``)."""
    from experiments.format_speed.analysis import pairing, run_endpoints
    from experiments.format_speed.instability import run_instability

    ends = {k: run_endpoints(r, steps) for k, r in records.items()}
    fin = {a: {s: e for (x, s), e in ends.items() if x == a and not e["failed"]} for a in ARMS}
    finished = sorted(set(fin["mrtpo"]) & set(fin["gdpo"]))
    # a seed is a pair when both runs sampled the same step-1 batch; one that did not is left out and named
    common = [s for s in finished if pairing(records, "mrtpo", "gdpo", [s])[0]]
    unpaired = [s for s in finished if s not in common]
    why = (f"the step-1 samples of all {len(common)} seeds are the same" if not unpaired else
           f"{len(common)} seeds pair; left out, their step-1 samples differ or are missing: {unpaired}")
    out: dict = {"steps": steps, "n": len(common), "unpaired": unpaired, "pairing": why,
                 "failed": sorted(f"{a}_seed{s}" for (a, s), e in ends.items() if e["failed"]),
                 "per_run": {f"{a}_seed{s}": {"arm": a, "seed": s, "code": (records[(a, s)].get("key_parts") or {}).get("code"),
                                              **e, "format_lost": run_instability(records[(a, s)])["format_lost"]}
                             for (a, s), e in sorted(ends.items())}}
    for a in ARMS:
        runs = [r for r in out["per_run"].values() if r["arm"] == a and not r["failed"]]
        out[f"counts_{a}"] = {"finished": len(runs), "stalled": sum(bool(r["censored"]) for r in runs),
                              "format_lost": sum(bool(r["format_lost"]) for r in runs)}
    if not common:
        return out
    d = [float(fin["mrtpo"][s]["T"] - fin["gdpo"][s]["T"]) for s in common]
    out["diffs"] = dict(zip(common, d))
    out["primary"] = {**(stats.signed_rank_p(d) or {"p": 1.0}), "test": "Wilcoxon signed-rank, exact (zeros dropped, mid-ranks)",
                      "hl": stats.hodges_lehmann(d), "hl_ci": stats.bootstrap_hl_interval(d)}
    out["sign"] = stats.sign_test_p(d)
    out["mean"] = {"diff": float(np.mean(d)), "ci": stats.bootstrap_interval(d), "p": stats.paired_signflip_p(d),
                   "test": "exact paired sign-flip permutation"}
    out["median"] = float(np.median(d))
    auc = [float(fin["mrtpo"][s]["auc"] - fin["gdpo"][s]["auc"]) for s in common]
    out["auc"] = {"diff": float(np.mean(auc)), "ci": stats.bootstrap_interval(auc),
                  "p": (stats.signed_rank_p(auc) or {"p": 1.0})["p"]}
    return out


def render(result: dict) -> str:
    from experiments.format_speed.analysis import format_p

    lines = ["# Format speed, the confirmatory replication: the declared analysis", "",
             "The plan: [`../replication_plan.md`](../replication_plan.md) (committed before the first run). MRTPO - GDPO "
             "on T, steps to format 0.8 (censored at 31), paired by seed.", ""]
    if "primary" not in result:
        return "\n".join(lines + ["No seed has finished runs of both arms yet.", ""])
    p, s, m = result["primary"], result["sign"], result["mean"]
    hl_lo, hl_hi = p["hl_ci"]
    lines += [f"**Primary** (Wilcoxon signed-rank, exact, two-sided, n = {result['n']} pairs; {result['pairing']}): "
              f"p = {format_p(p['p'])}, W+ = {p['w_plus']:g} over {p['n_nonzero']} non-zero differences ({p['n_zero']} zero); "
              f"Hodges-Lehmann estimate {p['hl']:+.2f} steps, 95% bootstrap interval [{hl_lo:+.2f}, {hl_hi:+.2f}]. "
              + ("Significant at 0.05." if p["p"] < ALPHA else "Not significant at 0.05."), "",
              "Beside it (declared, not tested for the decision):", "",
              f"- sign test: MRTPO first in {s['negative']}, GDPO first in {s['positive']}, tied {s['zero']}; exact p = {format_p(s['p'])};",
              f"- mean difference {m['diff']:+.2f} steps, 95% bootstrap interval [{m['ci'][0]:+.2f}, {m['ci'][1]:+.2f}], "
              f"exact paired sign-flip p = {format_p(m['p'])}; median {result['median']:+.1f};",
              f"- AUC (mean format rate, steps 1-30) MRTPO - GDPO {result['auc']['diff']:+.3f} "
              f"[{result['auc']['ci'][0]:+.3f}, {result['auc']['ci'][1]:+.3f}], signed-rank p = {format_p(result['auc']['p'])}.", "",
              "| arm | finished runs | stalled (never reached 0.8: T = 31) | format lost after reaching it |",
              "| --- | ---: | ---: | ---: |"]
    for a in ARMS:
        c = result[f"counts_{a}"]
        lines.append(f"| {a} | {c['finished']} | {c['stalled']} | {c['format_lost']} |")
    seeds = sorted({r["seed"] for r in result["per_run"].values()})
    lines += ["", "Per seed: T (31 = censored; F = failed run) and the difference:", "",
              "| seed | " + " | ".join(str(x) for x in seeds) + " |", "| --- |" + " ---: |" * len(seeds)]
    for a in ARMS:
        cells = []
        for x in seeds:
            r = result["per_run"].get(f"{a}_seed{x}")
            cells.append("" if r is None else "F" if r["failed"] else str(r["T"]))
        lines.append(f"| {a} | " + " | ".join(cells) + " |")
    lines.append("| MRTPO - GDPO | " + " | ".join(f"{result['diffs'][x]:+g}" if x in result["diffs"] else "" for x in seeds) + " |")
    lines += ["", f"Failed runs: {', '.join(result['failed']) if result['failed'] else 'none'}.",
              "Codes the runs ran (the run key's code hash): "
              + ", ".join(sorted({str(r["code"]) for r in result["per_run"].values()})) + "."]
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.format_speed.replication", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    pw = sub.add_parser("power", help="the plan's power table from the grid's records")
    pw.add_argument("--sims", type=int, default=4000)
    rn = sub.add_parser("run", help="the replication's runs (extra arguments go to the grid's runner)")
    rn.add_argument("--docs", type=Path, default=DOCS)
    an = sub.add_parser("analyse", help="the declared analysis of the committed records")
    an.add_argument("--records", type=Path, default=DOCS / "runs")
    an.add_argument("--out", type=Path, default=DOCS)
    a, rest = ap.parse_known_args(argv)
    if a.cmd == "power":
        d = grid_differences()
        print(render_power(power_table(d, sims=a.sims), d))
        return 0
    if a.cmd == "run":
        from experiments.format_speed import grid

        return grid.main(["--arms", *ARMS, "--seeds", *map(str, SEEDS), "--docs", str(a.docs),
                          "--warm-start", str(GRID / "warm_start"), *rest])
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    from experiments.format_speed.analysis import load_records

    records = load_records(a.records)
    if not records:
        print(f"[format-speed] ERROR: no run records under {a.records}", file=sys.stderr)
        return 2
    result = analyse(records)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "per_seed.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (a.out / "analysis.md").write_text(render(result))
    print((a.out / "analysis.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
