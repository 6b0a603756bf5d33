"""The declared analysis of the format-speed grid (``docs/format_speed/analysis_plan.md``), on the committed run
records (``docs/format_speed/grid/runs/*.json``, written by :mod:`.grid`).

    python -m experiments.format_speed.analysis [--records docs/format_speed/grid/runs] [--out docs/format_speed/grid]

Writes ``per_seed.json`` (every run's endpoints) and ``analysis.md`` (the primary comparison, the AUC secondary,
the Holm family, the exploratory comparisons, the per-seed tables, the failed runs) and, from the same records,
``instability.md`` (:mod:`.instability`). Every number is the plan's: :func:`run_endpoints` per run,
:func:`compare` per pair of arms, :func:`analyse` for the whole.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from experiments.format_speed import stats
from experiments.format_speed.common import REPO
from experiments.format_speed.results import curve_summary

THRESHOLD, WINDOW, AFTER = 0.8, 3, 10
FORMAT_KEY, CORRECTNESS_KEY = "mrtpo/reward/format/mean", "mrtpo/reward/correctness/mean"

PRIMARY = ("mrtpo", "gdpo")
#: the other orderings on T, one Holm family (a minus b)
FAMILY = (("mrtpo", "grpo"), ("mrtpo", "shuffle"), ("gdpo", "grpo"), ("shuffle", "gdpo"))
#: exploratory: the ablations against MRTPO (seeds 0-7)
ABLATIONS = (("mrtpo-warmup10", "mrtpo"), ("mrtpo-rho0.5", "mrtpo"), ("mrtpo-cap3", "mrtpo"))
ENDPOINTS = ("T", "auc", "format_after", "correctness_gain")


def load_records(records: Path) -> dict[tuple[str, int], dict]:
    """``{(arm, seed): record}`` of every ``<arm>_seed<s>.json`` in ``records``."""
    out = {}
    for p in sorted(Path(records).glob("*_seed*.json")):
        r = json.loads(p.read_text())
        out[(r["arm"], int(r["seed"]))] = r
    return out


def _series(record: dict, key: str) -> dict[int, float]:
    return {int(k): float(v) for k, v in (record.get("metrics", {}).get(key) or {}).items()}


def run_endpoints(record: dict, steps: int) -> dict:
    """One run's endpoints (the plan's definitions): ``failed`` (not all ``steps`` steps logged, or a step's format
    missing), T (steps to format 0.8 over a 3-step running mean, censored at steps + 1), AUC (the mean format rate of
    steps 1..steps), the format after 10 updates (step 11), the correctness gain (last 3 minus first 3)."""
    fmt, cor = _series(record, FORMAT_KEY), _series(record, CORRECTNESS_KEY)
    failed = (not record.get("ok")) or sorted(fmt) != list(range(1, steps + 1))
    out = {"failed": bool(failed), "T": None, "auc": None, "format_after": None, "correctness_gain": None,
           "censored": None}
    if failed:
        return out
    f = curve_summary(fmt, THRESHOLD, WINDOW, AFTER)
    out["T"] = stats.censored_steps(f["first_reach"], steps)
    out["censored"] = f["first_reach"] is None
    out["auc"] = stats.format_auc(fmt, steps)
    out["format_after"] = f["after"]
    if cor:
        c = curve_summary(cor, THRESHOLD, WINDOW, AFTER)
        out["correctness_gain"] = c["final"] - c["start"]
    return out


def pairing(records: dict, a: str, b: str, seeds: Sequence[int]) -> tuple[bool, str]:
    """Do the two arms' runs pair by seed? Yes when, on every common seed, both runs' step-1 samples (the digest of
    their rollout file) exist and are the same multiset; else the reason they do not."""
    if not seeds:
        return False, "no common seed"
    for s in seeds:
        da, db = ((records[(x, s)].get("rollouts") or {}).get("1") for x in (a, b))
        if da is None or db is None:
            return False, f"seed {s}: no step-1 rollout file to check"
        if da != db:
            return False, f"seed {s}: the step-1 samples differ"
    return True, f"the step-1 samples of all {len(seeds)} seeds are the same"


def compare(ends: dict, records: dict, a: str, b: str, endpoint: str) -> Optional[dict]:
    """a minus b on ``endpoint``: paired over the seeds both finished when they pair (:func:`pairing`), else
    unpaired over each arm's finished seeds; the mean difference, its 95% bootstrap interval and the exact p."""
    fin = {arm: {s: e[endpoint] for (x, s), e in ends.items() if x == arm and not e["failed"] and e[endpoint] is not None}
           for arm in (a, b)}
    if not fin[a] or not fin[b]:
        return None
    common = sorted(set(fin[a]) & set(fin[b]))
    paired, why = pairing(records, a, b, common)
    xa, xb = list(fin[a].values()), list(fin[b].values())
    out = {"a": a, "b": b, "endpoint": endpoint, "mean_a": sum(xa) / len(xa), "mean_b": sum(xb) / len(xb),
           "pairing": why}
    if paired:
        d = [fin[a][s] - fin[b][s] for s in common]
        out.update(test="exact paired sign-flip permutation", n=len(d), diff=sum(d) / len(d),
                   mean_a=sum(fin[a][s] for s in common) / len(d), mean_b=sum(fin[b][s] for s in common) / len(d),
                   p=stats.paired_signflip_p(d), ci=stats.bootstrap_interval(d))
    else:
        r = stats.unpaired_permutation_p(xa, xb)
        out.update(test="exact unpaired permutation" if r["exact"] else
                   f"unpaired permutation ({stats.MONTE_CARLO:,} random relabellings)",
                   n=[len(xa), len(xb)], diff=out["mean_a"] - out["mean_b"], p=r["p"], ci=stats.bootstrap_interval(xa, xb))
    if endpoint == "T":
        out["censored"] = [sum(1 for (x, _), e in ends.items() if x == arm and e["censored"]) for arm in (a, b)]
    return out


def analyse(records: dict, steps: int = 30) -> dict:
    """Every endpoint of every run, and the plan's comparisons."""
    ends = {k: run_endpoints(r, steps) for k, r in records.items()}
    primary = compare(ends, records, *PRIMARY, "T")
    auc = compare(ends, records, *PRIMARY, "auc")
    family = [compare(ends, records, a, b, "T") for a, b in FAMILY]
    for c, adj in zip(family, stats.holm([c["p"] if c else None for c in family])):
        if c:
            c["p_holm"] = adj
    pairs = ((PRIMARY,) + FAMILY)
    exploratory = [c for c in (
        *(compare(ends, records, a, b, "auc") for a, b in FAMILY),
        *(compare(ends, records, a, b, e) for a, b in pairs for e in ("format_after", "correctness_gain")),
        *(compare(ends, records, a, b, e) for a, b in ABLATIONS for e in ("T", "auc", "correctness_gain"))) if c]
    return {"steps": steps, "per_run": {f"{a}_seed{s}": {"arm": a, "seed": s, "key": records[(a, s)].get("key"),
                                                          "code": (records[(a, s)].get("key_parts") or {}).get("code"),
                                                          **e} for (a, s), e in sorted(ends.items())},
            "primary": primary, "auc_secondary": auc, "family": [c for c in family if c], "exploratory": exploratory}


def format_p(p: float) -> str:
    """A p-value to 4 decimals, or to 2 significant digits below 0.0001: the exact paired test's smallest p at
    n = 24 is 2 / 2^24, which 4 decimals would print as a p of zero."""
    return f"{p:.4f}" if p >= 1e-4 else f"{p:.1e}"


def _cell(c: Optional[dict], digits: int, holm: bool = False) -> list[str]:
    if not c:
        return ["–"] * (5 + holm)
    lo, hi = c["ci"] if c["ci"] else (float("nan"), float("nan"))
    n = c["n"] if isinstance(c["n"], int) else "/".join(map(str, c["n"]))
    cells = [f"{c['a']} - {c['b']}", str(n), f"{c['diff']:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]",
             format_p(c["p"])] + ([format_p(c["p_holm"])] if holm else []) + [c["test"]]
    return cells


def render(result: dict) -> str:
    steps = result["steps"]
    lines = ["# Format speed: the grid's declared analysis", "",
             "The plan: [`analysis_plan.md`](../analysis_plan.md) (committed before the grid's runs). Per pair: a minus "
             "b over seeds; the 95% interval is the percentile bootstrap over seeds (10,000 resamples).", ""]
    p, a = result["primary"], result["auc_secondary"]
    if p:
        lo, hi = p["ci"]
        lines += [f"**Primary** (MRTPO - GDPO, steps to format 0.8, censored at {steps + 1}): {p['diff']:+.2f} steps, "
                  f"95% interval [{lo:+.2f}, {hi:+.2f}], p = {format_p(p['p'])} ({p['test']}, n = {p['n']}; "
                  f"{p['pairing']}; censored runs {p['censored'][0]} / {p['censored'][1]}).", ""]
    else:
        lines += ["**Primary**: not computable yet (no finished runs of MRTPO and GDPO).", ""]
    if a:
        lo, hi = a["ci"]
        lines += [f"**Censoring-free secondary** (MRTPO - GDPO, area under the format curve, steps 1-{steps}): "
                  f"{a['diff']:+.3f}, 95% interval [{lo:+.3f}, {hi:+.3f}], p = {format_p(a['p'])} ({a['test']}).", ""]
    lines += ["The other orderings on steps to format 0.8 (one family, Holm-adjusted):", "",
              "| pair | n | difference [95% interval] | p | p (Holm) | test |", "| --- | ---: | ---: | ---: | ---: | --- |"]
    lines += ["| " + " | ".join(_cell(c, 2, holm=True)) + " |" for c in result["family"]]
    lines += ["", "Exploratory (unadjusted p):", "", "| pair | endpoint | n | difference [95% interval] | p | test |",
              "| --- | --- | ---: | ---: | ---: | --- |"]
    for c in result["exploratory"]:
        cells = _cell(c, 3)
        lines.append("| " + " | ".join([cells[0], c["endpoint"], *cells[1:]]) + " |")
    runs = result["per_run"]
    arms = list(dict.fromkeys(r["arm"] for r in runs.values()))
    seeds = sorted({r["seed"] for r in runs.values()})
    for endpoint, fmt in (("T", "{:d}"), ("auc", "{:.3f}"), ("format_after", "{:.2f}"), ("correctness_gain", "{:+.2f}")):
        lines += ["", f"Per seed: {endpoint} ({'censored at ' + str(steps + 1) if endpoint == 'T' else ''}"
                  f"{'; ' if endpoint == 'T' else ''}F = failed run):", "",
                  "| arm | " + " | ".join(str(s) for s in seeds) + " |", "| --- |" + " ---: |" * len(seeds)]
        for arm in arms:
            row = []
            for s in seeds:
                r = runs.get(f"{arm}_seed{s}")
                row.append("" if r is None else "F" if r["failed"] else "–" if r[endpoint] is None else fmt.format(r[endpoint]))
            lines.append(f"| {arm} | " + " | ".join(row) + " |")
    failed = [k for k, r in runs.items() if r["failed"]]
    lines += ["", f"Failed runs: {', '.join(failed) if failed else 'none'}.",
              "Codes the runs ran (the run key's code hash): " + ", ".join(sorted({str(r['code']) for r in runs.values()})) + "."]
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.format_speed.analysis", description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=Path, default=REPO / "docs" / "format_speed" / "grid" / "runs")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "format_speed" / "grid")
    ap.add_argument("--steps", type=int, default=30)
    a = ap.parse_args(argv)
    records = load_records(a.records)
    if not records:
        print(f"[format-speed] ERROR: no run records under {a.records}", file=sys.stderr)
        return 2
    result = analyse(records, a.steps)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "per_seed.json").write_text(json.dumps(result, indent=1) + "\n")
    (a.out / "analysis.md").write_text(render(result))
    from experiments.format_speed.instability import render_instability, run_instability

    (a.out / "instability.md").write_text(render_instability({k: run_instability(r) for k, r in records.items()}))
    print((a.out / "analysis.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
