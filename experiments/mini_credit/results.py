"""The outputs of the miniature experiment: per-run reward metrics from verl's console log
(:func:`run_metrics`), the table over methods and seeds with the replay's localisation (:func:`analyse`,
written as ``results.md`` by :func:`render_results` and ``results.json``), the localisation chart
(:func:`plot_localisation`) and the per-reward curves of the report tool.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from experiments.mini_credit.common import REPLAY_METHODS, ExperimentError
from experiments.mini_credit.localisation import load_dumps, localisation_records, summarise_localisation
from recipe.mrtpo.tools.report.series import first_reach, mean_spread, reward_series
from recipe.mrtpo.tools.verl_log import parse_console_log


def _mean_std(values):
    return mean_spread(values)


def _fmt(mean, std, n, pct=False):
    if mean is None:
        return "–"
    f = (lambda v: f"{100 * v:.1f}") if pct else (lambda v: f"{v:.2f}")
    return f(mean) if std is None else f"{f(mean)} ± {f(std)}"


def run_metrics(log_path: Path, threshold: float, window: int) -> dict:
    """Per reward of one run: the batch-mean series; its value at the start and at the end (means of the
    first and of the last ``window`` logged steps); and the first step at which the mean of the last
    ``window`` steps reaches ``threshold`` (a batch of 16 binary scores alone is too noisy to call reached)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    steps, _ = parse_console_log(Path(log_path).read_text(errors="replace"))
    series = reward_series(steps)
    out = {}
    for name, s in sorted(series.items()):
        keys = sorted(s)
        smooth = {k: sum(s[j] for j in keys[i + 1 - window : i + 1]) / window
                  for i, k in enumerate(keys) if i + 1 >= window}
        first, last = [s[k] for k in keys[:window]], [s[k] for k in keys[-window:]]
        out[name] = {"series": {str(k): v for k, v in sorted(s.items())}, "first_reach": first_reach(smooth, threshold),
                     "final": sum(last) / len(last) if last else None, "start": sum(first) / len(first) if first else None}
    return out


def analyse(out: Path, methods: Sequence[str], seeds: Sequence[int], threshold: float, final_window: int,
            log: Callable[[str], None] = print) -> dict:
    """Read every run under ``out/runs`` and write results.md / results.json / localisation.png / report/."""
    runs_dir = out / "runs"
    per_run: dict = {}
    for method in methods:
        for seed in seeds:
            run_dir = runs_dir / f"{method}_seed{seed}"
            res_path = run_dir / "result.json"
            if not res_path.is_file():
                continue
            res = json.loads(res_path.read_text())
            entry = {"ok": res.get("ok"), "wall_s": res.get("wall_s"), "rewards": {}, "localisation": None}
            log_path = run_dir / Path(res.get("log") or "main_mrtpo.log").name  # the folder may have moved
            if log_path.is_file():
                entry["rewards"] = run_metrics(log_path, threshold, final_window)
            if method in REPLAY_METHODS and (run_dir / "relevance_dumps").is_dir():
                dumps, entry["dumps_unreadable"] = load_dumps(run_dir / "relevance_dumps", log)
                recs = [r for d in dumps for r in localisation_records(d)]
                entry["localisation"] = summarise_localisation(recs)
                entry["localisation_by_step"] = {
                    str(s): summarise_localisation([r for r in recs if r["step"] == s])
                    for s in sorted({r["step"] for r in recs})}
            per_run[(method, seed)] = entry
    if not per_run:
        raise ExperimentError(f"no finished runs under {runs_dir}")
    rewards = sorted({r for e in per_run.values() for r in e["rewards"]})
    table = {}
    for method in methods:
        ok_seeds = [s for s in seeds if (method, s) in per_run and per_run[(method, s)]["ok"]]
        runs = [per_run[(method, s)] for s in ok_seeds]
        row = {"seeds": len(runs), "final": {}, "reach": {}, "start": {}}
        for rw in rewards:
            vals = [r["rewards"][rw] for r in runs if rw in r["rewards"]]
            row["final"][rw] = _mean_std([v["final"] for v in vals])
            row["start"][rw] = _mean_std([v["start"] for v in vals])
            reached = [v["first_reach"] for v in vals if v["first_reach"] is not None]
            row["reach"][rw] = {"mean": sum(reached) / len(reached) if reached else None, "k": len(reached),
                                "n": len(vals), "per_seed": [v["first_reach"] for v in vals]}
        complete = [r for r in runs if all(rw in r["rewards"] for rw in rewards)]

        def over_rewards(r, key):
            return sum(r["rewards"][rw][key] for rw in rewards) / len(rewards)

        row["final_mean"] = _mean_std([over_rewards(r, "final") for r in complete])
        row["gain_mean"] = _mean_std([over_rewards(r, "final") - over_rewards(r, "start") for r in complete])
        row["gain_per_seed"] = {str(s): over_rewards(r, "final") - over_rewards(r, "start")
                                for s, r in zip(ok_seeds, runs) if r in complete}
        locs = [r["localisation"] for r in runs if r.get("localisation") and r["localisation"]["pairs"]]
        row["localisation"] = {key: _mean_std([loc[key] for loc in locs]) for key in ("precision", "cross", "chance", "top1")} if locs else None
        if locs:
            row["localisation"]["pairs"] = sum(loc["pairs"] for loc in locs)
            row["localisation"]["absent"] = sum(loc["absent"] for loc in locs)
            row["localisation"]["per_reward"] = {
                rw: _mean_std([loc["per_reward"][rw]["precision"] for loc in locs
                               if rw in loc["per_reward"] and loc["per_reward"][rw]["precision"] is not None])
                for rw in rewards}
        table[method] = row

    md = render_results(table, rewards, threshold, final_window, out)
    (out / "results.md").write_text(md)
    results = {"threshold": threshold, "final_window": final_window, "rewards": rewards, "table": table,
               "runs": {f"{m}_seed{s}": e for (m, s), e in per_run.items()}}
    sft = {}
    for seed in seeds:
        p = out / f"seed{seed}" / "sft_model" / "sft_meta.json"
        if p.is_file():
            sft[str(seed)] = json.loads(p.read_text())
    results["sft"] = sft
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    try:
        plot_localisation(table, rewards, out / "localisation.png")
    except Exception as e:  # noqa: BLE001 - a plot is optional output
        log(f"[mini] localisation plot not written: {type(e).__name__}: {e}")
    try:
        from recipe.mrtpo.tools.report.build import build_report

        build_report(runs_dir, out / "report", threshold=threshold, reward_filter=r"^slot_")
    except Exception as e:  # noqa: BLE001
        log(f"[mini] report plots not written: {type(e).__name__}: {e}")
    return results


def render_results(table: dict, rewards: list[str], threshold: float, final_window: int, out: Path) -> str:
    lines = ["# Mini credit-assignment experiment (synthetic slots)", ""]
    sft = []
    for p in sorted(out.glob("seed*/sft_model/sft_meta.json")):
        m = json.loads(p.read_text())
        acc = ", ".join(f"{k} {v:.2f}" for k, v in m["accuracy_after"].items())
        loss = m["loss"]
        sft.append(f"- {p.parent.parent.name}: {m['train_s']:.0f} s; loss on correct answers "
                   f"{loss['gold']['first']:.2f} -> {loss['gold']['last']:.2f}, on the demonstrations "
                   f"{loss['demo']['first']:.2f} -> {loss['demo']['last']:.2f} (restricted softmax), "
                   f"{loss['full']['first']:.2f} -> {loss['full']['last']:.2f} (full softmax); held-out accuracy "
                   f"(sampled, T=1): {acc}")
    if sft:
        lines += ["Warm start (SFT: correct answers, then demonstrations right per field with probability "
                  "p_correct; see `SFTConfig`):", "", *sft, ""]
    head = ["method", "seeds"] + [f"final {r}" for r in rewards] + ["final mean"] + \
        ["gain (final − start)"] + [f"step ≥{threshold:g} {r}" for r in rewards] + ["q on read tokens", "q on other fields' values", "chance", "top-1 on read"]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("| --- |" + " ---: |" * (len(head) - 1))
    for method, row in table.items():
        cells = [method, str(row["seeds"])]
        cells += [_fmt(*row["final"][r]) for r in rewards]
        cells.append(_fmt(*row["final_mean"]))
        cells.append(_fmt(*row["gain_mean"]))
        for r in rewards:
            rc = row["reach"][r]
            if not rc["n"]:
                cells.append("–")
            elif rc["mean"] is None:
                cells.append(f"not reached (0/{rc['n']})")
            else:
                cells.append(f"{rc['mean']:.1f}" + (f" ({rc['k']}/{rc['n']})" if rc["k"] < rc["n"] else ""))
        loc = row["localisation"]
        if loc:
            cells += [_fmt(*loc[key], pct=True) for key in ("precision", "cross", "chance", "top1")]
        else:
            cells += ["–"] * 4
        lines.append("| " + " | ".join(cells) + " |")
    all_seeds = sorted({int(sd) for row in table.values() for sd in row.get("gain_per_seed", {})})
    if all_seeds:
        lines += ["", "Gain per seed (final mean − start mean; the methods of a seed share the warm start and the prompts):",
                  "", "| method | " + " | ".join(f"seed {sd}" for sd in all_seeds) + " |",
                  "| --- |" + " ---: |" * len(all_seeds)]
        for method, row in table.items():
            g = row.get("gain_per_seed", {})
            lines.append(f"| {method} | " + " | ".join(f"{g[str(sd)]:+.3f}" if str(sd) in g else "–" for sd in all_seeds) + " |")
    lines += [
        "",
        f"final: mean of a slot's training-batch reward over the last {final_window} steps (16 responses a step), "
        "mean ± sample std over seeds; final mean: over the slots; gain: final mean minus the same mean over "
        f"the first {final_window} steps. step ≥ t: first step at which the mean of the last {final_window} steps' "
        "batch means reaches t, mean over the seeds that reached it (k/n when not all did). q on read tokens: share of reward k's relevance mass q on "
        "the value token of field k (the token its verifier compares), mean over replayed pairs whose "
        "response has the field, in %; q on other fields' values: the same share on the value tokens the other "
        "rewards read (what removing Z_k moved that it should not); chance: that token's share of the response (a uniform q); top-1: "
        "pairs whose largest q is on it. Shuffle's dumps hold the unshuffled q (its advantage used a "
        "permutation of it, so its effective localisation is chance).",
    ]
    return "\n".join(lines) + "\n"


def plot_localisation(table: dict, rewards: list[str], path: Path) -> None:
    from matplotlib.figure import Figure

    methods = [m for m, row in table.items() if row.get("localisation")]
    if not methods:
        return
    fig = Figure(figsize=(6.5, 3.8), dpi=110, layout="constrained")
    ax = fig.subplots()
    width = 0.8 / (len(methods) + 1)
    for j, m in enumerate(methods):
        loc = table[m]["localisation"]
        vals = [(loc["per_reward"].get(r) or (None,))[0] for r in rewards]
        xs = [i + (j - len(methods) / 2) * width for i in range(len(rewards))]
        ax.bar(xs, [v if v is not None else 0 for v in vals], width * 0.9, label=f"{m}: q mass on read token")
    chance = table[methods[0]]["localisation"]["chance"][0]
    ax.axhline(chance, color="0.3", ls="--", lw=1, label=f"chance (token share) {chance:.2f}")
    ax.set_xticks(range(len(rewards)))
    ax.set_xticklabels(rewards)
    ax.set_ylim(0, 1)
    ax.set_ylabel("share of q on the read token")
    ax.legend(fontsize=8)
    ax.set_title("Localisation of the replay: relevance mass on the tokens each reward reads", fontsize=9)
    fig.savefig(path)

