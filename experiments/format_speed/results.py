"""The outputs of the format-speed experiment: per run the format and correctness curves from verl's console
log (:func:`run_curves`) and, for the replay methods, the diagnostic of their relevance dumps
(:mod:`.diagnostic`) and the layouts they wrote (:mod:`.layouts`); the table over methods and seeds
(:func:`build_table`, :func:`render_results`); the plots (:func:`plot_curves`, :func:`plot_diagnostic`,
:func:`plot_layouts`); :func:`analyse` does all of it for a folder.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional

from experiments.format_speed.common import CORRECTNESS, FORMAT, LOG_PREFIX, REPLAY_METHODS, Condition, ExperimentError
from experiments.format_speed.diagnostic import Q_KEYS, SIGN_KEYS, dump_records, summarise
from experiments.format_speed.layouts import plot_layouts, render_layouts, run_layouts
from recipe.mrtpo.tools.report.series import first_reach, mean_spread, permutation_p, reward_series
from recipe.mrtpo.tools.verl_log import parse_console_log


def run_curves(log_text: str, threshold: float, window: int, after_steps: int) -> dict:
    """Per reward: the batch-mean series, its running mean over ``window`` steps, the first step at which
    that running mean reaches ``threshold``, the value at step ``after_steps + 1`` (the first batch
    sampled after ``after_steps`` updates; None if not logged), and the means of the first and the last
    ``window`` steps."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    steps, _ = parse_console_log(log_text)
    return {name: curve_summary(s, threshold, window, after_steps) for name, s in sorted(reward_series(steps).items())}


def curve_summary(s: dict, threshold: float, window: int, after_steps: int) -> dict:
    """One reward's ``{step: batch mean}``: the series, its running mean over ``window`` steps, the first step at
    which that running mean reaches ``threshold`` (None: never), the value at step ``after_steps + 1`` and the
    means of the first and the last ``window`` steps (:func:`run_curves`, and the grid's analysis of the
    committed per-run series)."""
    s = {int(k): float(v) for k, v in s.items()}
    keys = sorted(s)
    running = {k: sum(s[j] for j in keys[i + 1 - window: i + 1]) / window for i, k in enumerate(keys) if i + 1 >= window}
    return {"series": s, "running": running, "first_reach": first_reach(running, threshold), "after": s.get(after_steps + 1),
            "start": sum(s[k] for k in keys[:window]) / min(window, len(keys)) if keys else None,
            "final": sum(s[k] for k in keys[-window:]) / min(window, len(keys)) if keys else None}


def load_run(run_dir: Path, method: str, threshold: float, window: int, after_steps: int, beta: float,
             log: Callable[[str], None] = print) -> Optional[dict]:
    """One run's entry (``None`` when it has no ``result.json``): ok, wall time, curves and, for the replay
    methods, the diagnostic of its relevance dumps and their per-step layouts (:func:`.layouts.run_layouts`)."""
    res_path = run_dir / "result.json"
    if res_path.is_file():
        res = json.loads(res_path.read_text())
    elif (run_dir / "main_mrtpo.log").is_file():  # stopped before it finished: shown apart, never in the table
        res = {"ok": False, "unfinished": True}
    else:
        return None
    entry = {"ok": bool(res.get("ok")), "unfinished": bool(res.get("unfinished")), "wall_s": res.get("wall_s"),
             "curves": {}, "diagnostic": None, "layouts": []}
    log_path = run_dir / Path(res.get("log") or "main_mrtpo.log").name
    if log_path.is_file():
        entry["curves"] = run_curves(log_path.read_text(errors="replace"), threshold, window, after_steps)
    if method in REPLAY_METHODS and (run_dir / "relevance_dumps").is_dir():
        from experiments.mini_credit.localisation import load_dumps

        dumps, entry["dumps_unreadable"] = load_dumps(run_dir / "relevance_dumps", log)
        records = [r for d in dumps for r in dump_records(d, beta)]
        entry["diagnostic"] = summarise(records)
        entry["layouts"] = run_layouts(dumps)
    return entry


def _ms(values) -> tuple:
    return mean_spread([v for v in values if v is not None])


def build_table(per_run: dict, methods: Sequence[str], seeds: Sequence[int], steps: int) -> dict:
    """Per method, over its finished seeds: steps to the format threshold (mean over the seeds that
    reached it, k/n, and per seed), format after the given steps, format and correctness at the start and
    the end, the correctness gain, and (replay methods) the diagnostic's means over seeds."""
    table = {}
    for method in methods:
        runs = {s: per_run[(method, s)] for s in seeds if (method, s) in per_run and per_run[(method, s)]["ok"]}
        row: dict = {"seeds": sorted(runs), "n": len(runs)}
        fmt = {s: r["curves"].get(FORMAT) for s, r in runs.items() if r["curves"].get(FORMAT)}
        cor = {s: r["curves"].get(CORRECTNESS) for s, r in runs.items() if r["curves"].get(CORRECTNESS)}
        reach = {s: c["first_reach"] for s, c in fmt.items()}
        reached = [v for v in reach.values() if v is not None]
        row["reach"] = {"mean": sum(reached) / len(reached) if reached else None, "k": len(reached), "n": len(reach),
                        "per_seed": {str(s): v for s, v in reach.items()},
                        # not reached counted as steps + 1: a lower bound of the mean over all seeds
                        "censored_mean": (sum(v if v is not None else steps + 1 for v in reach.values()) / len(reach)
                                          if reach else None)}
        row["format_after"] = _ms(c["after"] for c in fmt.values())
        row["format_start"] = _ms(c["start"] for c in fmt.values())
        row["format_final"] = _ms(c["final"] for c in fmt.values())
        row["correctness_start"] = _ms(c["start"] for c in cor.values())
        row["correctness_final"] = _ms(c["final"] for c in cor.values())
        row["correctness_gain"] = _ms(c["final"] - c["start"] for c in cor.values())
        row["format_after_per_seed"] = {str(s): c["after"] for s, c in fmt.items() if c["after"] is not None}
        row["format_gain_per_seed"] = {str(s): c["final"] - c["start"] for s, c in fmt.items()}
        row["correctness_gain_per_seed"] = {str(s): c["final"] - c["start"] for s, c in cor.items()}
        diags = [r["diagnostic"] for r in runs.values() if r.get("diagnostic") and r["diagnostic"]["responses"]]
        if diags:
            d: dict = {key: _ms(x.get(key) for x in diags) for key in (*SIGN_KEYS, *Q_KEYS)}
            d["conflict"] = {key: _ms(x["conflict"].get(key) for x in diags) for key in SIGN_KEYS}
            for key in ("responses", "with_format_advantage", "conflicts"):
                d[key] = sum(x[key] for x in diags)
            row["diagnostic"] = d
        else:
            row["diagnostic"] = None
        table[method] = row
    return table


#: what :func:`compare` tests, per seed: steps to the threshold (not reached = steps + 1), format after N steps,
#: the correctness gain
COMPARED = ("reach", "format_after", "correctness_gain")

#: the paper's orderings, each pair (a, b) tested as a minus b, with the paper's steps to format 0.8 in tool
#: calling (MRTPO 13, GDPO 19, GRPO 34; the shuffle "back to GDPO"): MRTPO faster than GRPO, GDPO and the
#: shuffle, GDPO faster than GRPO, the shuffle no faster than GDPO
ORDERINGS = (("mrtpo", "grpo", "-21 (13 vs 34)"), ("mrtpo", "gdpo", "-6 (13 vs 19)"), ("mrtpo", "shuffle", "< 0"),
             ("gdpo", "grpo", "-15 (19 vs 34)"), ("shuffle", "gdpo", "0"))


def compare(table: dict, steps: int, orderings: Sequence[tuple] = ORDERINGS) -> dict:
    """Each ordering ``(a, b, paper)`` whose methods both have finished seeds: ``{"a - b": {"paper": ..., "n":
    [seeds of a, seeds of b], quantity: {"diff", "p"}}}`` with the difference of the means over seeds (a minus
    b) and the exact two-sided permutation p (:func:`recipe.mrtpo.tools.report.series.permutation_p`) of
    each of :data:`COMPARED`."""
    def per_seed(row: dict, quantity: str) -> list[float]:
        if quantity == "reach":
            return [steps + 1 if v is None else v for v in row["reach"]["per_seed"].values()]
        return list(row[f"{quantity}_per_seed"].values())

    out = {}
    for a, b, paper in orderings:
        if not (table.get(a) or {}).get("n") or not (table.get(b) or {}).get("n"):
            continue
        entry = {"paper": paper, "n": [table[a]["n"], table[b]["n"]]}
        for q in COMPARED:
            x, y = per_seed(table[a], q), per_seed(table[b], q)
            entry[q] = {"diff": sum(x) / len(x) - sum(y) / len(y) if x and y else None, "p": permutation_p(x, y)}
        out[f"{a} - {b}"] = entry
    return out


def render_comparison(comparison: dict, steps: int, after_steps: int) -> list[str]:
    if not comparison:
        return []
    lines = ["", "The paper's orderings (difference of the means over seeds, and the exact two-sided permutation p "
             f"over seeds; a seed that never reached the threshold counts as {steps + 1}; the paper's column is its "
             "difference in steps to format 0.8 in tool calling):", "",
             f"| pair | seeds | steps to format: difference | paper | p | format after {after_steps} steps: difference "
             "| p | correctness gain: difference | p |", "| --- | ---: |" + " ---: |" * 7]
    for pair, c in comparison.items():
        cells = []
        for q, digits in (("reach", 1), ("format_after", 2), ("correctness_gain", 3)):
            d, p = c[q]["diff"], c[q]["p"]
            cells += ["–" if d is None else f"{d:+.{digits}f}"] + ([c["paper"]] if q == "reach" else []) + \
                     ["–" if p is None else f"{p:.2f}"]
        lines.append(f"| {pair} | {c['n'][0]} / {c['n'][1]} | " + " | ".join(cells) + " |")
    return lines


def _fmt(ms: tuple, pct: bool = False, digits: int = 2) -> str:
    mean, std = ms[0], ms[1] if len(ms) > 1 else None
    if mean is None:
        return "–"
    f = (lambda v: f"{100 * v:.0f}%") if pct else (lambda v: f"{v:.{digits}f}")
    return f(mean) if std is None else f"{f(mean)} ± {f(std)}"


def _reach_cell(rc: dict) -> str:
    if not rc["n"]:
        return "–"
    if rc["mean"] is None:
        return f"not reached (0/{rc['n']})"
    cell = f"{rc['mean']:.1f}"
    return cell + (f" ({rc['k']}/{rc['n']}; ≥{rc['censored_mean']:.1f} over all)" if rc["k"] < rc["n"] else "")


def render_unfinished(per_run: dict) -> list[str]:
    """Lines on the runs that stopped before their last step: their per-step rewards and diagnostic."""
    rows = [(k, e) for k, e in sorted(per_run.items()) if e.get("unfinished") or not e["ok"]]
    if not rows:
        return []
    lines = ["", "Runs that did not finish (left out of the tables above; per step: format / correctness batch means):", ""]
    for (method, seed), e in rows:
        f = e["curves"].get(FORMAT, {}).get("series", {})
        c = e["curves"].get(CORRECTNESS, {}).get("series", {})
        per_step = ", ".join(f"step {k}: {f[k]:.2f} / {c.get(k, float('nan')):.2f}" for k in sorted(f))
        lines.append(f"- {method} seed {seed} ({'stopped' if e.get('unfinished') else 'failed'}): {per_step or 'no step logged'}")
        d = e.get("diagnostic")
        if d and d["responses"]:
            def pct(v):
                return "–" if v is None else f"{100 * v:.0f}%"

            lines.append(f"  - dumps: {d['responses']} responses with a decodable call; q_format on tag tokens "
                         f"{pct(d['q_format_on_tag'])} (their share {pct(d['tag_share'])}), on the argument "
                         f"{pct(d['q_format_on_arg'])}; q_correctness on the argument {pct(d['q_correctness_on_arg'])} "
                         f"(its share {pct(d['arg_share'])}), on tag tokens {pct(d['q_correctness_on_tag'])}; tag tokens "
                         f"with A_format's sign: GDPO {pct(d['gdpo_agree'])}, MRTPO {pct(d['mrtpo_agree'])} "
                         f"({d['with_format_advantage']} responses); in the {d['conflicts']} conflicts: GDPO "
                         f"{pct(d['conflict']['gdpo_agree'])}, MRTPO {pct(d['conflict']['mrtpo_agree'])}")
    return lines


#: the deciding position's table per token role: (heading, what the position is)
DECIDING_TITLES = {
    "close": ("The closing position (the token where the closing tag has to begin, where most broken frames break; "
              "same batches):"),
    "after_close": ("The position after the closing tag (the end token or the line break of a <response> block: where "
                    "the layout the instruction names is decided; same batches):"),
}


def render_results(table: dict, threshold: float, window: int, after_steps: int, steps: int, sft: dict,
                   wall: dict, unfinished: Optional[list[str]] = None, deciding: str = "close",
                   responses_per_step: int = 16, title_suffix: str = "", verifier: str = "the tool-calling verifier",
                   layouts: Optional[list[str]] = None) -> str:
    lines = ["# Format speed: how fast a format reward is learned beside a content reward (CPU miniature)" + title_suffix, ""]
    if sft:
        lines += ["The warm start every run starts from (held-out prompts, 4 samples each at T=1, scored by the "
                  f"{verifier}); the seeds of the runs vary the RL sampling:", ""]
        for seed, m in sorted(sft.items(), key=lambda kv: int(kv[0])):
            a = m["after"]
            lines.append(f"- warm-start seed {seed}: {m['train_s']:.0f} s of SFT; format {a['format']:.2f}, correctness "
                         f"{a['correctness']:.2f}, argument right {a['exact']:.2f}")
        lines.append("")
    head = ["method", "seeds", f"steps to format ≥ {threshold:g}", f"format after {after_steps} steps", "format start → final",
            "correctness start → final", "correctness gain"]
    lines += ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    for method, row in table.items():
        lines.append("| " + " | ".join([
            method, str(row["n"]), _reach_cell(row["reach"]), _fmt(row["format_after"]),
            f"{_fmt(row['format_start'])} → {_fmt(row['format_final'])}",
            f"{_fmt(row['correctness_start'])} → {_fmt(row['correctness_final'])}", _fmt(row["correctness_gain"], digits=3),
        ]) + " |")
    all_seeds = sorted({int(s) for r in table.values() for s in r["reach"]["per_seed"]})
    if all_seeds:
        lines += ["", "Steps to format per seed (running mean of the last "
                  f"{window} batches; – = not reached in {steps} steps):", "",
                  "| method | " + " | ".join(f"seed {s}" for s in all_seeds) + " |", "| --- |" + " ---: |" * len(all_seeds)]
        for method, row in table.items():
            ps = row["reach"]["per_seed"]
            lines.append(f"| {method} | " + " | ".join(
                ("–" if ps.get(str(s)) is None else str(ps[str(s)])) if str(s) in ps else "" for s in all_seeds) + " |")
    lines += render_comparison(compare(table, steps), steps, after_steps)
    diag = [(m, r["diagnostic"]) for m, r in table.items() if r.get("diagnostic")]
    if diag:
        lines += ["", f"Localisation of the replay (relevance dumps of every step, all {responses_per_step} responses; mean ± std "
                  "over seeds):", "",
                  "| run | responses | q_format on tag tokens | tag tokens' share | q_format on the argument | "
                  "q_correctness on the argument | argument's share | q_correctness on tag tokens |",
                  "| --- |" + " ---: |" * 7]
        for m, d in diag:
            lines.append(f"| {m} | {d['responses']} | {_fmt(d['q_format_on_tag'], True)} | {_fmt(d['tag_share'], True)} | "
                         f"{_fmt(d['q_format_on_arg'], True)} | {_fmt(d['q_correctness_on_arg'], True)} | "
                         f"{_fmt(d['arg_share'], True)} | {_fmt(d['q_correctness_on_tag'], True)} |")
        lines += ["", "The mechanism on the tag tokens (same batches, both weightings recomputed from the dumps' scores and q):", "",
                  "| dumps of | responses with A_format ≠ 0 | of which conflicts | tag tokens with the sign of A_format: GDPO | MRTPO "
                  "| same, conflicts only: GDPO | MRTPO | format credit kept on tags (signed / abs A_format): GDPO | MRTPO | same, conflicts: GDPO | MRTPO |",
                  "| --- |" + " ---: |" * 10]
        for m, d in diag:
            c = d["conflict"]
            lines.append(f"| {m} | {d['with_format_advantage']} | {d['conflicts']} | {_fmt(d['gdpo_agree'], True)} | "
                         f"{_fmt(d['mrtpo_agree'], True)} | {_fmt(c['gdpo_agree'], True)} | {_fmt(c['mrtpo_agree'], True)} | "
                         f"{_fmt(d['gdpo_signed'])} | {_fmt(d['mrtpo_signed'])} | {_fmt(c['gdpo_signed'])} | {_fmt(c['mrtpo_signed'])} |")
        r = deciding
        lines += ["", DECIDING_TITLES[r], "",
                  "| dumps of | q_format there | its share of the tokens | format credit kept there: GDPO | MRTPO "
                  "| same, conflicts: GDPO | MRTPO |", "| --- |" + " ---: |" * 6]
        for m, d in diag:
            c = d["conflict"]
            lines.append(f"| {m} | {_fmt(d[f'q_format_on_{r}'], True)} | {_fmt(d[f'{r}_share'], True)} | "
                         f"{_fmt(d[f'gdpo_{r}'])} | {_fmt(d[f'mrtpo_{r}'])} | {_fmt(c[f'gdpo_{r}'])} | {_fmt(c[f'mrtpo_{r}'])} |")
    lines += layouts or []
    lines += unfinished or []
    if wall:
        total = sum(v for v in wall.values() if v)
        lines += ["", f"Wall time of the verl runs: {total / 60:.0f} min in all ({len(wall)} runs, "
                  f"{total / max(1, len(wall)):.0f} s each on average)."]
    lines += [
        "",
        f"Steps to format ≥ {threshold:g}: the first step at which the mean of the last {window} batch format rates "
        f"({responses_per_step} responses each) reaches {threshold:g}; mean over the seeds that reached it (k/n when not all did; "
        f"'≥ x over all' counts a seed that never reached it as {steps + 1}). Format after {after_steps} steps: the "
        f"format rate of the batch of step {after_steps + 1}, the first one sampled after {after_steps} updates. "
        f"Start / final: mean of the first / last {window} batches. Mean ± sample std over seeds. Tag tokens: every "
        "response token with a character outside the call's JSON object, and the end token (`experiments/format_speed/tokens.py`). "
        "Conflicts: responses whose format and correctness advantages have opposite signs. Sign agreement and "
        "signed credit use the summed token advantage before the batch whitening; GDPO's is A_format + A_correctness "
        "on every token, MRTPO's weights each A_k by its relevance weights (beta and rho of the run). The "
        "shuffle run's dumps hold the unshuffled q: its MRTPO column says what MRTPO would have done with its batches.",
    ]
    return "\n".join(lines) + "\n"


def plot_curves(per_run: dict, methods: Sequence[str], seeds: Sequence[int], threshold: float, path: Path,
                correctness_range: tuple[float, float] = (0, 1.02)) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.8), dpi=110, layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, reward in zip(axes, (FORMAT, CORRECTNESS)):
        for method in methods:
            series = [per_run[(method, s)]["curves"][reward]["series"] for s in seeds
                      if (method, s) in per_run and per_run[(method, s)]["ok"] and reward in per_run[(method, s)]["curves"]]
            if not series:
                continue
            steps = sorted({k for s in series for k in s})
            mean, lo, hi = [], [], []
            for k in steps:
                m, sd, _ = mean_spread([s[k] for s in series if k in s])
                mean.append(m)
                lo.append(m - (sd or 0.0))
                hi.append(m + (sd or 0.0))
            line = ax.plot(steps, mean, label=f"{method} ({len(series)} seeds)")[0]
            ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.12)
        for (method, seed), e in sorted(per_run.items()):  # stopped runs: dashed, each seed alone
            if not e["ok"] and method in methods and reward in e["curves"]:
                ser = e["curves"][reward]["series"]
                ax.plot(sorted(ser), [ser[k] for k in sorted(ser)], ls="--", marker="o", ms=3,
                        label=f"{method} seed {seed} (did not finish)")
        if reward == FORMAT:
            ax.axhline(threshold, color="0.4", ls="--", lw=1)
        ax.set_title(f"{reward} (batch mean; mean ± std over seeds)", fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylim(*((0, 1.02) if reward == FORMAT else correctness_range))
        ax.legend(fontsize=8)
    fig.savefig(path)


def plot_diagnostic(table: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    diag = [(m, r["diagnostic"]) for m, r in table.items() if r.get("diagnostic")]
    if not diag:
        return
    fig = Figure(figsize=(7, 3.6), dpi=110, layout="constrained")
    ax = fig.subplots()
    groups = [("all", lambda d, k: d[k]), ("conflicts", lambda d, k: d["conflict"][k])]
    labels, gd, mr = [], [], []
    for m, d in diag:
        for gname, get in groups:
            labels.append(f"{m} dumps\n{gname}")
            gd.append(get(d, "gdpo_agree")[0] or 0.0)
            mr.append(get(d, "mrtpo_agree")[0] or 0.0)
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], gd, 0.38, label="GDPO weighting")
    ax.bar([x + 0.2 for x in xs], mr, 0.38, label="MRTPO weighting")
    ax.axhline(0.5, color="0.4", ls="--", lw=1)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("tag tokens whose advantage has A_format's sign")
    ax.legend(fontsize=8)
    ax.set_title("Does the format credit survive on the tag tokens?", fontsize=9)
    fig.savefig(path)


def analyse(out: Path, methods: Sequence[str], seeds: Sequence[int], threshold: float, window: int, after_steps: int,
            steps: int, beta: float, docs: Optional[Path] = None, log: Callable[[str], None] = print,
            condition: Optional[Condition] = None, warm_start: Optional[Path] = None) -> dict:
    """Read every run under ``out/runs``; write results.md, results.json, curves.png and diagnostic.png to
    ``out`` (and copy them to ``docs`` when given). ``condition`` (default the control) names the
    deciding position's table; ``warm_start`` the folder of the warm start (default ``out/warm_start``)."""
    cond = condition or Condition()
    per_run = {}
    for method in methods:
        for seed in seeds:
            entry = load_run(out / "runs" / f"{method}_seed{seed}", method, threshold, window, after_steps, beta, log)
            if entry is not None:
                per_run[(method, seed)] = entry
    if not per_run:
        raise ExperimentError(f"no runs under {out / 'runs'}")
    table = build_table(per_run, methods, seeds, steps)
    sft = {}
    p = Path(warm_start or out / "warm_start") / "sft_model" / "sft_meta.json"
    if p.is_file():
        meta = json.loads(p.read_text())
        sft[str(meta.get("seed", 0))] = meta
    wall = {f"{m}_seed{s}": e["wall_s"] for (m, s), e in per_run.items() if e["ok"]}
    md = render_results(table, threshold, window, after_steps, steps, sft, wall, render_unfinished(per_run),
                        deciding=cond.deciding, responses_per_step=cond.responses_per_step,
                        title_suffix="" if cond.control else f": {cond.reward}, {cond.prompts_per_step} prompts a step",
                        verifier="the tool-calling verifier" if cond.reward == "tool_calling" else "ToolRL's verifier",
                        layouts=render_layouts(per_run, steps, after_steps, threshold))
    (out / "results.md").write_text(md)

    def finite(o):
        if isinstance(o, float) and not math.isfinite(o):
            return None
        if isinstance(o, dict):
            return {str(k): finite(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [finite(v) for v in o]
        return o

    results = {"threshold": threshold, "window": window, "after_steps": after_steps, "steps": steps, "table": table,
               "comparison": compare(table, steps),
               "runs": {f"{m}_seed{s}": e for (m, s), e in per_run.items()}, "sft": sft}
    (out / "results.json").write_text(json.dumps(finite(results), indent=1, default=str))
    c_range = (0, 1.02) if cond.reward == "tool_calling" else (-3.05, 3.05)  # ToolRL's correctness is in [-3, 3]
    for name, fn in (("curves.png", lambda p: plot_curves(per_run, methods, seeds, threshold, p, c_range)),
                     ("diagnostic.png", lambda p: plot_diagnostic(table, p)),
                     ("layouts.png", lambda p: plot_layouts(per_run, methods, p))):
        try:
            fn(out / name)
        except Exception as e:  # noqa: BLE001 - a plot is optional output
            log(f"{LOG_PREFIX} {name} not written: {type(e).__name__}: {e}")
    if docs is not None:
        import shutil

        docs.mkdir(parents=True, exist_ok=True)
        for name in ("results.md", "curves.png", "diagnostic.png", "layouts.png"):
            if (out / name).is_file():
                shutil.copy(out / name, docs / name)
    return results
