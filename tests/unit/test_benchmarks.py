"""The two benchmarks run at a tiny size on CPU and print their tables with the ratio columns.

Only the shape of the output is checked (one row per size, finite positive ratios); timings depend on the
machine and are not asserted. The full-size runs and their figures are in the README ("Performance").
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import bench_relevance, bench_replay

REPO = Path(__file__).resolve().parents[2]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.split("|")]


def _ratio(cell: str) -> float:
    value = float(cell)
    assert math.isfinite(value) and value > 0, cell
    return value


def test_bench_relevance_prints_a_row_of_ratios_per_length(capsys):
    bench_relevance.main(["--vocab", "1000", "--lengths", "8", "32", "--repeats", "1", "--naive-max", "16"])
    out = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(out) if line.lstrip().startswith("T |"))
    assert _cells(out[header])[-2:] == ["js/lp", "js/lp_x2"]
    rows = [_cells(line) for line in out[header + 2:] if line.lstrip()[:1].isdigit()]
    assert [int(r[0]) for r in rows] == [8, 32]
    for r in rows:
        assert len(r) == len(_cells(out[header]))
        for cell in r[-2:]:  # chunked_js / verl_logprob, chunked_js / verl_logprob_x2
            _ratio(cell)
    assert "skipped" not in rows[0][2] and rows[1][2] == "skipped"  # naive JS only up to --naive-max
    assert out[0].startswith("V=1000 ") and out[-1].startswith("(time: best of")


def test_bench_replay_prints_a_row_of_ratios_per_variant_count(capsys):
    bench_replay.main(["--configs", "tiny", "--variants", "2", "3", "--rows", "1", "--prompt-len", "24",
                       "--response-len", "8", "--repeats", "1"])
    out = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(out) if "replay/olp" in line)
    assert _cells(out[header])[-2:] == ["replay/olp", "/NV"]
    rows = [_cells(line) for line in out[header + 1:] if line.lstrip().startswith("tiny |")]
    assert [int(r[2]) for r in rows] == [2, 3]
    for r in rows:
        ratio, per_variant = _ratio(r[-2]), _ratio(r[-1])
        assert per_variant == pytest.approx(ratio / int(r[2]), abs=0.01)
    assert out[-1].startswith("(best of 1; V = 151936;")


@pytest.mark.parametrize("script", ["bench_relevance.py", "bench_replay.py"])
def test_benchmarks_run_as_scripts_from_the_repo_root(script):
    # the recipe installed (``pip install -e .``) is stood in for by PYTHONPATH
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    res = subprocess.run([sys.executable, f"benchmarks/{script}", "--help"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert f"python benchmarks/{script}" in res.stdout
