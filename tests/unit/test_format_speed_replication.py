"""The format-speed replication (docs/format_speed/replication_plan.md): its rank-based tests re-computed by brute
force, its runs' arms and seeds, its analysis on synthetic records."""

import itertools
import json

import numpy as np
import pytest

from experiments.format_speed import replication, stats

# the grid's 24 per-seed differences MRTPO - GDPO on T (docs/format_speed/grid/per_seed.json)
GRID_D = [-2, -2, -1, -2, -3, -2, -2, -2, -2, -1, -1, -2, -3, -2, -2, 1, -3, -2, -2, -2, -1, -2, 20, -2]


def brute_signed_rank_p(d):
    nz = np.asarray([x for x in d if x != 0], dtype=float)
    ranks = stats._midranks(np.abs(nz))
    w, centre = ranks[nz > 0].sum(), ranks.sum() / 2
    hits = sum(abs(sum(r for r, s in zip(ranks, signs) if s) - centre) >= abs(w - centre) - 1e-9
               for signs in itertools.product((0, 1), repeat=len(nz)))
    return hits / 2 ** len(nz)


def test_signed_rank_p_is_the_exact_conditional_test_with_ties_and_zeros():
    rng = np.random.default_rng(3)
    for _ in range(150):
        d = rng.integers(-4, 5, size=int(rng.integers(1, 11))).tolist()
        r = stats.signed_rank_p(d)
        if all(x == 0 for x in d):
            assert r is None
            continue
        assert r["p"] == pytest.approx(brute_signed_rank_p(d), abs=1e-12)
        assert r["n_zero"] == d.count(0) and r["n_nonzero"] == len(d) - d.count(0)
    assert stats.signed_rank_p([]) is None and stats.signed_rank_p([1.0])["p"] == 1.0


def test_the_grids_post_hoc_rank_tests_are_reproduced():
    """The outside recomputation's exploratory figures on the grid: signed-rank p 7.5e-5, sign test p 3.6e-5."""
    assert stats.signed_rank_p(GRID_D)["p"] == pytest.approx(7.4625e-5, rel=1e-3)
    s = stats.sign_test_p(GRID_D)
    assert (s["negative"], s["positive"], s["zero"]) == (22, 2, 0) and s["p"] == pytest.approx(3.588e-5, rel=1e-3)
    assert stats.hodges_lehmann(GRID_D) == -2.0
    from math import comb

    assert s["p"] == pytest.approx(2 * sum(comb(24, k) for k in range(3)) / 2 ** 24)  # two-sided, symmetric


def test_hodges_lehmann_is_the_median_of_the_walsh_averages():
    d = [3.0, -1.0, 7.0]
    walsh = [3, -1, 7, 1, 5, 3]  # (d_i + d_j) / 2, i <= j
    assert stats.hodges_lehmann(d) == float(np.median(walsh))
    lo, hi = stats.bootstrap_hl_interval(d, resamples=500)
    assert -1.0 <= lo <= hi <= 7.0


def test_power_is_high_at_the_grids_effect_and_falls_with_it():
    draw, f = replication.flip_draw(GRID_D, 1.0)
    assert f == 0.0
    _, f75 = replication.flip_draw(GRID_D, 0.75)
    assert f75 == pytest.approx((22 / 24 - 0.75) / (22 / 24 - 2 / 24))
    rows = replication.power_table(GRID_D, n=40, sims=200, mean_sims=0)
    assert rows[0]["mean_signflip"] is None and "| – |" in replication.render_power(rows, GRID_D)
    assert rows[0]["signed_rank"] > 0.95 and rows[-1]["signed_rank"] < rows[0]["signed_rank"]


def test_the_replication_runs_gdpo_and_mrtpo_on_fresh_seeds_from_the_grids_warm_start(monkeypatch):
    from experiments.format_speed import grid

    assert replication.SEEDS == tuple(range(24, 64)) and set(replication.ARMS) == {"gdpo", "mrtpo"}
    assert not set(replication.SEEDS) & set(grid.SEEDS["mrtpo"])  # seeds no analysis has seen
    got = {}
    monkeypatch.setattr(grid, "main", lambda argv: got.setdefault("argv", argv) and 0)
    replication.main(["run", "--dry-run"])
    argv = got["argv"]
    assert argv[argv.index("--warm-start") + 1].endswith("docs/format_speed/grid/warm_start")
    assert argv[argv.index("--docs") + 1].endswith("docs/format_speed/replication") and argv[-1] == "--dry-run"
    assert len(grid.planned_runs(list(replication.ARMS), list(replication.SEEDS))) == 80


def _record(arm, seed, reach, digest="same", steps=30):
    fmt = [0.9 if k + 1 >= reach - 2 else 0.3 for k in range(steps)]
    return {"arm": arm, "seed": seed, "ok": True, "key_parts": {"code": "c"}, "rollouts": {"1": f"{digest}{seed}"},
            "metrics": {"mrtpo/reward/format/mean": {str(k + 1): v for k, v in enumerate(fmt)}}}


def test_the_analysis_is_the_plans_on_synthetic_records(tmp_path):
    reach = {"mrtpo": [10, 11, 12, 40, 9], "gdpo": [12, 12, 12, 11, 11]}
    recs = {(a, 24 + s): _record(a, 24 + s, t) for a, ts in reach.items() for s, t in enumerate(ts)}
    recs[("gdpo", 28)]["rollouts"]["1"] = "other"  # seed 28 did not pair: left out and named
    res = replication.analyse(recs)
    d = [10 - 12, 11 - 12, 12 - 12, 31 - 11]  # seed 27's MRTPO run is censored at 31
    assert res["n"] == 4 and res["unpaired"] == [28]
    assert res["primary"]["p"] == pytest.approx(brute_signed_rank_p(d)) and res["primary"]["n_zero"] == 1
    assert res["mean"]["diff"] == pytest.approx(np.mean(d)) and res["mean"]["p"] == pytest.approx(stats.paired_signflip_p(d))
    assert res["counts_mrtpo"]["stalled"] == 1 and res["counts_gdpo"]["stalled"] == 0
    md = replication.render(res)
    assert "**Primary** (Wilcoxon signed-rank" in md and "left out" in md and "| mrtpo | 5 | 1 | 0 |" in md
    (tmp_path / "runs").mkdir()
    for (a, s), r in recs.items():
        (tmp_path / "runs" / f"{a}_seed{s}.json").write_text(json.dumps(r))
    assert replication.main(["analyse", "--records", str(tmp_path / "runs"), "--out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "per_seed.json").read_text())["n"] == 4
