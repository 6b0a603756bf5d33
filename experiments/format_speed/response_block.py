"""Which part of the format a stalled run failed to learn: per run and step, the share of the responses whose
reference answer has a ``<response>`` block (ToolRL's layout for "call, then answer": the format reward requires
the block exactly when the reference has it, ``recipe/mrtpo/tasks/toolrl.py``) that emitted one.

Exploratory, not in the analysis plan (added after the grid's censored runs were seen to sit at a format rate
near 0.5): it reads verl's rollout files (``<run>/rollouts/<step>.jsonl``: ``output`` and ``gts["answer"]`` per
row), which live in the run folders under ``outputs/``, not in the committed records. A run has **unlearned** the block
when its mean rate over the last :data:`LAST` steps is below :data:`UNLEARNED`.

``python -m experiments.format_speed.response_block [RUNS_DIR]`` prints one markdown row per run folder that has
all its steps' rollout files.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional

BLOCK = "<response>"
LAST = 10
UNLEARNED = 0.1


def block_rate(rollout_file: Path) -> Optional[float]:
    """Share of the rows whose reference answer has the response block that emitted it (None: no such row)."""
    wanted = emitted = 0
    with open(rollout_file) as f:
        for line in f:
            row = json.loads(line)
            answer = (row.get("gts") or {}).get("answer") or ""
            if BLOCK in answer:
                wanted += 1
                emitted += BLOCK in (row.get("output") or "")
    return emitted / wanted if wanted else None


def run_rates(run_dir: Path, steps: int) -> Optional[list[Optional[float]]]:
    """The block rate of each step 1..steps, or None when a step's rollout file is missing."""
    files = [run_dir / "rollouts" / f"{k}.jsonl" for k in range(1, steps + 1)]
    if not all(p.is_file() for p in files):
        return None
    return [block_rate(p) for p in files]


def _mean(xs: list[Optional[float]]) -> Optional[float]:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def summary(rates: list[Optional[float]]) -> dict:
    """First-5-step mean, lowest rate after step 5, last-LAST-step mean and whether the block was unlearned."""
    last = _mean(rates[-LAST:])
    after = [x for x in rates[5:] if x is not None]
    return {"first5": _mean(rates[:5]), "min_after5": min(after) if after else None, "last": last,
            "unlearned": last is not None and last < UNLEARNED}


def table(runs_dir: Path, steps: int = 30) -> str:
    def fmt(x):
        return "–" if x is None else f"{x:.2f}"

    lines = [f"| run | block rate, steps 1-5 | lowest after step 5 | last {LAST} steps | unlearned |",
             "| --- | ---: | ---: | ---: | --- |"]
    for run_dir in sorted(p for p in runs_dir.iterdir() if p.is_dir()):
        rates = run_rates(run_dir, steps)
        if rates is None:
            continue
        s = summary(rates)
        lines.append(f"| {run_dir.name} | {fmt(s['first5'])} | {fmt(s['min_after5'])} | {fmt(s['last'])} | "
                     f"{'yes' if s['unlearned'] else 'no'} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs_dir", nargs="?", default="outputs/format_speed/toolrl-p32/runs", type=Path)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args(argv)
    print(table(args.runs_dir, args.steps))


if __name__ == "__main__":
    main()
