"""Tests of ``python -m recipe.mrtpo.tools.report``: run identification, the table's numbers, the threshold
logic, the PNGs, and robustness to corrupt lines (the log parsing itself: ``tests/unit/test_verl_log.py``).

The real log (``tests/data/report_logs/mrtpo_run.log``) is the tail of a 2-step MRTPO run on CPU, cut to
its ``step:`` lines and the lines around them; its rewards are IF constraint ids such as
``punctuation:no_comma``. ``tests/data/quickstart_runs/`` is the CPU quickstart's own ``runs/`` folder
(``python -m recipe.mrtpo.cpu.quickstart``): its two eval JSONs, its console log cut to the launch command line
and the step lines (the machine's paths replaced by ``/path/to/repo``). ``tests/data/report_wandb/`` is a wandb
offline run written by verl's own ``Tracking`` logger (``default_backend=["console", "wandb"]``,
``WANDB_MODE=offline``, wandb's machine metadata and stats off), without wandb's debug logs.
"""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from recipe.mrtpo.tools.report.build import build_report, main
from recipe.mrtpo.tools.report.discovery import parse_run_name, resolve_meta
from recipe.mrtpo.tools.report.series import first_reach, mean_spread, permutation_p
from recipe.mrtpo.tools.report.table import format_cell

REPO = Path(__file__).resolve().parents[2]
REAL_LOG = Path(__file__).resolve().parents[1] / "data" / "report_logs" / "mrtpo_run.log"
QUICKSTART_RUNS = Path(__file__).resolve().parents[1] / "data" / "quickstart_runs"
WANDB_RUNS = Path(__file__).resolve().parents[1] / "data" / "report_wandb"
MODEL = "Qwen2.5-0.5B"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def console_line():
    """verl's own console-logger formatter (``LocalLogger.log`` prints exactly this)."""
    from verl.utils.logger.aggregate_logger import concat_dict_to_str

    return concat_dict_to_str


def _synthetic_log(console_line, rewards: dict[str, list[float]], extra_lines=()) -> str:
    """A console log: Ray-style prefix + verl's formatting, one line per step from 1."""
    n = len(next(iter(rewards.values())))
    lines = ["\x1b[36m(MRTPOTaskRunner pid=1)\x1b[0m Training Progress:   0%|          | 0/4"]
    for i in range(n):
        data = {"actor/pg_loss": 0.01 * i}
        data.update({f"mrtpo/reward/{name}/mean": vals[i] for name, vals in rewards.items()})
        data.update({f"mrtpo/reward/{name}/count": 8.0 for name in rewards})
        lines.append("\x1b[36m(MRTPOTaskRunner pid=1)\x1b[0m " + console_line(data, step=i + 1))
    return "\n".join([*lines, *extra_lines]) + "\n"


def _eval_json(path: Path, task: str, metrics: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"task": task, "model": "/ckpt/global_step_100/actor/huggingface", "n": 50,
                                "metrics": {"n_responses": 50, **metrics}, "config": {"temperature": 0.0},
                                "items": [{"id": "a", "response": "x", "scores": {}}]}))


# ----------------------------------------------------------------------------------------- numbers, names


def test_first_reach_threshold():
    assert first_reach({1: 0.2, 2: 0.79, 3: 0.8, 4: 0.95}, 0.8) == 3  # reaching counts (>=)
    assert first_reach({4: 0.9, 3: 0.85, 1: 0.1, 2: 0.5}, 0.8) == 3  # step order, not insertion order
    assert first_reach({1: 0.1, 2: 0.79, 3: 0.5}, 0.8) is None  # never -> None, not 0
    assert first_reach({1: float("nan"), 2: 0.81}, 0.8) == 2
    assert first_reach({}, 0.8) is None


def test_mean_spread_and_cells():
    mean, std, n = mean_spread([0.60, 0.62, 0.64])
    assert n == 3 and mean == pytest.approx(0.62) and std == pytest.approx(0.02)  # sample std (ddof 1)
    assert format_cell(mean, std, n, 100.0) == "62.0 ± 2.0 (n=3)"
    assert format_cell(*mean_spread([0.7]), 100.0) == "70.0"
    assert format_cell(*mean_spread([]), 100.0) == "–"
    assert format_cell(*mean_spread([12.0, 14.0, float("nan")]), 1.0) == "13 ± 1.414 (n=2)"


def test_permutation_p():
    assert permutation_p([1.0] * 6, [2.0] * 6) == pytest.approx(2 / 924)  # only the two extreme labellings
    assert permutation_p([10, 11, 12], [6, 8, 8]) == pytest.approx(2 / 20)  # the smallest p with 3 against 3
    assert permutation_p([1, 2, 3], [3, 2, 1]) == 1.0 and permutation_p([], [1.0]) is None
    assert permutation_p([0, 0, 0, 0, 0, 1], [1, 1, 1, 1, 1, 0]) == pytest.approx(74 / 924)  # ties count
    # beyond max_exact: seeded random labellings, close to the exact value and reproducible
    a, b = [0.1 * i for i in range(8)], [0.1 * i + 0.35 for i in range(8)]
    exact = permutation_p(a, b)
    sampled = permutation_p(a, b, max_exact=5000)
    assert sampled == permutation_p(a, b, max_exact=5000) and abs(sampled - exact) < 0.02


def test_run_names_and_run_json(tmp_path):
    assert parse_run_name("Qwen2.5-1.5B-Instruct_ifbench_mrtpo_seed2") == {
        "model": "Qwen2.5-1.5B-Instruct", "task": "ifbench", "method": "mrtpo", "seed": 2}
    assert parse_run_name("qwen_3_instruction_following_gdpo_seed0") == {
        "model": "qwen_3", "task": "instruction_following", "method": "gdpo", "seed": 0}
    assert parse_run_name("mrtpo_run") == {}
    warnings = []
    run = tmp_path / "Qwen_bfcl_gdpo_seed3" / "attempt"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"method": "mrtpo", "seed": "1"}))
    meta = resolve_meta(run / "train.log", tmp_path, warnings)
    assert meta == {"method": "mrtpo", "seed": 1, "model": "Qwen", "task": "bfcl"}  # run.json wins per field
    (run / "run.json").write_text("{not json")
    assert resolve_meta(run / "train.log", tmp_path, warnings)["method"] == "gdpo"
    assert any("unreadable run.json" in w for w in warnings)
    layout = tmp_path / "sweep" / "shuffle" / "seed4"
    layout.mkdir(parents=True)
    assert resolve_meta(layout / "x.log", tmp_path, []) == {"method": "shuffle", "seed": 4}


# -------------------------------------------------------------------------------------------- the report


@pytest.fixture()
def runs_dir(tmp_path, console_line):
    """Two real-log runs (gdpo, mrtpo seed 0), two synthetic ones, eval JSONs for several seeds."""
    root = tmp_path / "runs"
    for method in ("gdpo", "mrtpo"):
        d = root / f"{MODEL}_ifbench_{method}_seed0"
        d.mkdir(parents=True)
        shutil.copy(REAL_LOG, d / "train.log")
    s1 = root / "extra" / "mrtpo_s1"  # identified by run.json only
    s1.mkdir(parents=True)
    (s1 / "run.json").write_text(json.dumps({"method": "mrtpo", "task": "ifbench", "seed": 1, "model": MODEL}))
    (s1 / "train.log").write_text(_synthetic_log(console_line, {
        "punctuation:no_comma": [0.5, 0.7, 0.85, 0.9],  # crosses 0.8 at step 3
        "keywords:letter_frequency": [0.1, 0.2, 0.3, 0.4],  # never
    }, extra_lines=["step:5 - actor/pg_loss:0.1 - mrtpo/reward/punctuation:no_comma/mea"]))
    (root / f"{MODEL}_ifbench_gdpo_seed1").mkdir()
    (root / f"{MODEL}_ifbench_gdpo_seed1" / "train.log").write_text(_synthetic_log(console_line, {
        "punctuation:no_comma": [0.3, 0.4, 0.5, 0.6], "keywords:letter_frequency": [0.2, 0.3, 0.3, 0.3]}))

    ifeval = {("grpo", 0): 0.60, ("grpo", 1): 0.62, ("grpo", 2): 0.64, ("gdpo", 0): 0.655,
              ("mrtpo", 0): 0.70, ("mrtpo", 1): 0.72}
    bfcl = {("grpo", 0): 0.5, ("grpo", 1): 0.5, ("grpo", 2): 0.5, ("shuffle", 0): 0.4,
            ("mrtpo", 0): 0.55, ("mrtpo", 1): 0.65}
    for (method, seed), v in ifeval.items():
        _eval_json(root / f"{MODEL}_ifbench_{method}_seed{seed}" / "eval" / "ifeval.json", "ifeval",
                   {"prompt_level_strict": v, "inst_level_strict": v + 0.1, "by_instruction": {"x": {"strict": 1.0}}})
    for (method, seed), v in bfcl.items():
        _eval_json(root / f"{MODEL}_bfcl_{method}_seed{seed}" / "bfcl.json", "bfcl",
                   {"ast_accuracy": v, "bfcl_official_ast_accuracy": v + 0.1, "format_rate": 1.0,
                    "ast_accuracy_category_mean": None})
    (root / "notes.json").write_text(json.dumps({"unrelated": 1}))  # ignored
    return root


def _table_cells(md: str) -> tuple[list[str], dict[str, list[str]]]:
    rows = [line for line in md.splitlines() if line.startswith("| ") and not line.startswith("| ---")]
    split = [[c.strip() for c in line.strip("|").split("|")] for line in rows]
    return split[0], {r[0]: r[1:] for r in split[1:]}


def test_report_table_threshold_and_pngs(runs_dir):
    summary = build_report(runs_dir)
    out = runs_dir / "report"

    header, rows = _table_cells((out / "table.md").read_text())
    # BFCL: BFCL's own checker is the headline, the recipe's AST match beside it
    assert header == ["method", "IFEval prompt-strict", "BFCL AST (BFCL checker)", "BFCL AST (recipe)"]
    assert list(rows) == ["grpo", "gdpo", "shuffle", "mrtpo"]  # the paper's order, absent methods left out
    assert rows["grpo"] == ["62.0 ± 2.0 (n=3)", "60.0 ± 0.0 (n=3)", "50.0 ± 0.0 (n=3)"]
    assert rows["gdpo"] == ["65.5", "–", "–"]
    assert rows["shuffle"] == ["–", "50.0", "40.0"]
    assert rows["mrtpo"] == ["71.0 ± 1.4 (n=2)", "70.0 ± 7.1 (n=2)", "60.0 ± 7.1 (n=2)"]
    cell = next(c for c in summary["table"] if c["method"] == "mrtpo" and c["task"] == "bfcl"
                and c["metric"] == "ast_accuracy")
    assert cell["metric"] == "ast_accuracy" and cell["seeds"] == [0, 1] and cell["n"] == 2
    assert cell["std"] == pytest.approx(math.sqrt(2 * 0.05 ** 2))

    runs = {(r["method"], r["seed"]): r for r in summary["runs"]}
    assert set(runs) == {("gdpo", 0), ("gdpo", 1), ("mrtpo", 0), ("mrtpo", 1)}
    assert runs[("mrtpo", 1)]["corrupt_lines"] == 1 and runs[("mrtpo", 1)]["steps"] == 4
    assert summary["corrupt_lines"] == 1
    assert any("1 corrupt" in w and "mrtpo_s1" in w for w in summary["warnings"])

    reach = summary["threshold_steps"][MODEL]["ifbench"]
    punct = reach["punctuation:no_comma"]
    assert punct["mrtpo"]["per_run"] == {"0": 1, "1": 3}  # real log: 0.833 at step 1; synthetic: step 3
    assert punct["mrtpo"]["mean_step"] == 2.0 and punct["mrtpo"]["n_reached"] == 2
    assert punct["gdpo"]["per_run"] == {"0": 1, "1": None} and punct["gdpo"]["mean_step"] == 1.0
    kw = reach["keywords:letter_frequency"]
    assert kw["mrtpo"]["mean_step"] is None and kw["mrtpo"]["not_reached"] == ["0", "1"]
    assert kw["mrtpo"]["n_reached"] == 0 and kw["mrtpo"]["n_runs"] == 2
    # a reward only the real log has: one run per method
    assert reach["change_case:capital_word_frequency"]["gdpo"]["n_runs"] == 1

    curve = summary["curves"][MODEL]["ifbench"]["punctuation:no_comma"]["mrtpo"]
    assert curve["steps"] == [1, 2, 3, 4] and curve["n"] == [2, 2, 1, 1]
    assert curve["mean"][0] == pytest.approx((0.8333333333333334 + 0.5) / 2)
    assert curve["std"][2] is None

    pngs = [f for f in summary["files"] if f.endswith(".png")]
    assert sorted(pngs) == [f"curves__{MODEL}__ifbench.png", f"threshold__{MODEL}__ifbench.png"]
    for name in pngs:  # every figure also as vector PDF
        assert (out / name).with_suffix(".pdf").read_bytes()[:5] == b"%PDF-"
    from matplotlib.image import imread

    for name in pngs:
        data = (out / name).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 10_000
        image = imread(out / name)
        assert image.shape[0] > 300 and image.shape[1] > 400
        assert image[..., :3].std() > 0.05  # not a blank canvas

    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["threshold_steps"] == summary["threshold_steps"] and on_disk["table"][0]["n"] == 3


def test_report_again_ignores_its_own_output_and_metric_override(runs_dir, tmp_path):
    build_report(runs_dir)
    summary = build_report(runs_dir, metric_overrides={"ifeval": [("inst-strict", "inst_level_strict")]})
    assert len(summary["evals"]) == 12  # summary.json of the first report was not read as an eval
    header, rows = _table_cells((runs_dir / "report" / "table.md").read_text())
    assert header == ["method", "IFEval inst-strict", "BFCL AST (BFCL checker)", "BFCL AST (recipe)"]
    assert rows["grpo"][0] == "72.0 ± 2.0 (n=3)"
    # a --metric key that no result has: warned (with the near names), not a silently missing column
    summary = build_report(runs_dir, metric_overrides={"ifeval": [("x", "instruction_strict_acc")]})
    header, _ = _table_cells((runs_dir / "report" / "table.md").read_text())
    assert "IFEval x" not in header
    assert any("--metric ifeval=instruction_strict_acc" in w and "column left out" in w for w in summary["warnings"])


def test_unknown_method_is_warned_and_skipped(tmp_path):
    (tmp_path / "misc").mkdir()
    shutil.copy(REAL_LOG, tmp_path / "misc" / "train.log")
    _eval_json(tmp_path / f"{MODEL}_ifeval_mrtpo_seed0" / "e.json", "ifeval", {"prompt_level_strict": 0.5})
    summary = build_report(tmp_path, tmp_path / "out")
    assert summary["runs"] == [] and len(summary["evals"]) == 1
    assert any("misc/train.log" in w and "unknown method" in w for w in summary["warnings"])
    assert not [f for f in summary["files"] if f.endswith(".png")]


def test_cli(runs_dir, tmp_path, capsys):
    assert main([str(tmp_path / "nope")]) == 2
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == 2
    assert "no training logs" in capsys.readouterr().err
    proc = subprocess.run([sys.executable, "-m", "recipe.mrtpo.tools.report.build", str(runs_dir), "--out-dir",
                           str(tmp_path / "rep"), "--threshold", "0.85", "--rewards", "punctuation"],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MPLBACKEND": "Agg"})
    assert proc.returncode == 0, proc.stderr
    assert "| mrtpo | 71.0 ± 1.4 (n=2) | 70.0 ± 7.1 (n=2) | 60.0 ± 7.1 (n=2) |" in proc.stdout
    assert "corrupt/truncated step line" in proc.stderr
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert summary["threshold"] == 0.85
    assert list(summary["threshold_steps"][MODEL]["ifbench"]) == ["punctuation:no_comma"]
    assert summary["threshold_steps"][MODEL]["ifbench"]["punctuation:no_comma"]["mrtpo"]["per_run"] == {
        "0": None, "1": 3}


def test_linked_run_folders_are_followed_once(tmp_path):
    outside = tmp_path / "disk2" / f"{MODEL}_ifbench_MRTPO_seed0"
    _eval_json(outside / "ifeval.json", "ifeval", {"prompt_level_strict": 0.5})
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "linked").symlink_to(tmp_path / "disk2", target_is_directory=True)
    (runs / "loop").symlink_to(runs, target_is_directory=True)
    summary = build_report(runs)
    assert [(e["method"], e["seed"], e["eval_task"]) for e in summary["evals"]] == [("mrtpo", 0, "ifeval")]


# ---------------------------------------------------------------------- runs as the recipe writes them


def test_report_from_the_quickstarts_own_output(tmp_path):
    summary = build_report(QUICKSTART_RUNS, tmp_path / "rep")
    runs = [(r["model"], r["task"], r["method"], r["seed"], r["steps"]) for r in summary["runs"]]
    assert runs == [("tiny-qwen2", "instruction_following", "mrtpo", 0, 3)]
    header, rows = _table_cells((tmp_path / "rep" / "table.md").read_text())
    assert header == ["method", "IFEval prompt-strict"] and list(rows) == ["base", "mrtpo"]
    assert all(cell.endswith("[subset 8/541]") for cells in rows.values() for cell in cells)
    assert "scored on the first k of the N items" in (tmp_path / "rep" / "table.md").read_text()
    curves = summary["curves"]["tiny-qwen2"]["instruction_following"]
    assert curves["punctuation:no_comma"]["mrtpo"]["steps"] == [1, 2, 3]
    assert {f.rsplit(".", 1)[1] for f in summary["files"] if "__" in f} == {"png", "pdf"}


def test_the_run_scripts_names_the_launch_line_and_a_reason_per_skipped_folder(tmp_path):
    log = (QUICKSTART_RUNS / "tiny-qwen2_instruction_following_mrtpo_seed0" / "main_mrtpo.log").read_text()
    step_lines = "\n".join(line for line in log.splitlines() if not line.startswith("$ "))  # no launch line
    assert "step:" in step_lines
    # the run scripts' experiment names, before and after a seed was added to them
    for name in ("qwen2.5-7b-instruct_ifbench_mrtpo_seed0", "qwen2.5-7b-instruct_ifbench_gdpo"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "train.log").write_text(step_lines)
    # any folder name: the launch command line the run scripts echo tells the method, model and name
    (tmp_path / "my_run").mkdir()
    launch = ("[mrtpo] /x/.venv/bin/python -m recipe.mrtpo.main_mrtpo data.train_files=[a] "
              "actor_rollout_ref.model.path=\\'/models/Qwen2.5-3B-Instruct\\' algorithm.adv_estimator=mrtpo "
              "mrtpo.shuffle=True trainer.experiment_name=qwen2.5-3b-instruct_ifbench_shuffle\n")
    (tmp_path / "my_run" / "console.out").write_text(launch + step_lines)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("nothing here")
    (tmp_path / "unnamed").mkdir()
    (tmp_path / "unnamed" / "x.log").write_text(step_lines)
    summary = build_report(tmp_path, tmp_path / "rep")
    got = sorted((r["model"], r["task"], r["method"], str(r["seed"])) for r in summary["runs"])
    assert got == [("qwen2.5-3b-instruct", "ifbench", "shuffle", "my_run"),
                   ("qwen2.5-7b-instruct", "ifbench", "gdpo", "qwen2.5-7b-instruct_ifbench_gdpo"),
                   ("qwen2.5-7b-instruct", "ifbench", "mrtpo", "0")]
    warned = "\n".join(summary["warnings"])
    assert "skipped folder notes/: no training log" in warned
    assert "skipped folder unnamed/: training log of unknown method" in warned
    # nothing readable at all: the reasons are in the error, not dropped
    shutil.rmtree(tmp_path / "rep")
    for name in ("qwen2.5-7b-instruct_ifbench_mrtpo_seed0", "qwen2.5-7b-instruct_ifbench_gdpo", "my_run"):
        shutil.rmtree(tmp_path / name)
    with pytest.raises(FileNotFoundError, match="(?s)unnamed/x.log: training log of unknown method"):
        build_report(tmp_path)


def test_wandb_offline_run_written_by_verls_logger(tmp_path):
    pytest.importorskip("wandb", reason="wandb decodes its own run files")
    summary = build_report(WANDB_RUNS, tmp_path / "rep")
    assert [(r["model"], r["task"], r["method"], r["seed"], r["steps"]) for r in summary["runs"]] == [
        ("qwen2.5-1.5b-instruct", "toolcall", "gdpo", 1, 3)]
    assert summary["runs"][0]["sources"][0].endswith(".wandb")  # files/output.log is not read a second time
    reach = summary["threshold_steps"]["qwen2.5-1.5b-instruct"]["toolcall"]
    assert reach["format"]["gdpo"]["per_run"] == {"1": 3} and reach["correctness"]["gdpo"]["n_reached"] == 0


def test_file_logger_jsonl_where_verl_writes_it(tmp_path, monkeypatch):
    """verl's FileLogger itself, at its default place (<root>/<project>/<experiment>.jsonl)."""
    from verl.utils.tracking import FileLogger

    monkeypatch.delenv("VERL_FILE_LOGGER_PATH", raising=False)
    monkeypatch.setenv("VERL_FILE_LOGGER_ROOT", str(tmp_path))
    logger = FileLogger("mrtpo", "qwen2.5-7b-instruct_text2sql_cort_seed2")
    for step in (1, 2):
        logger.log({"mrtpo/reward/execution_match/mean": 0.4 * step, "timing_s/step": 3}, step=step)
    logger.finish()
    summary = build_report(tmp_path)
    assert [(r["task"], r["method"], r["seed"], r["sources"]) for r in summary["runs"]] == [
        ("text2sql", "cort", 2, ["mrtpo/qwen2.5-7b-instruct_text2sql_cort_seed2.jsonl"])]


def test_help_examples_run(tmp_path, capsys):
    """Every ``--metric`` example in the report's --help names a metric the eval writes for that task."""
    import re

    from recipe.mrtpo.tools.report import build

    parser_help = subprocess.run([sys.executable, "-m", "recipe.mrtpo.tools.report", "--help"], cwd=REPO,
                                 capture_output=True, text=True, timeout=120).stdout
    examples = re.findall(r"--metric\s+([a-z_]+)=([\w/]+)", parser_help + build.__doc__)
    assert examples
    evals = {"ifeval": {"prompt_level_strict": 0.5, "inst_level_strict": 0.6, "prompt_level_loose": 0.5,
                        "inst_level_loose": 0.7}}
    from recipe.mrtpo.tools.eval.metrics import TASK_FAMILY, aggregate

    for task, key in examples:
        written = aggregate(TASK_FAMILY[task], [])
        assert key in written, f"--help example --metric {task}={key}: the eval writes {sorted(written)}"
    _eval_json(tmp_path / f"{MODEL}_ifbench_mrtpo_seed0" / "ifeval.json", "ifeval", evals["ifeval"])
    task, key = examples[0]
    assert main([str(tmp_path), "--metric", f"{task}={key}:col"]) == 0
    assert "| IFEval col |" in capsys.readouterr().out.replace("method | ", "| ")


def test_figures_have_integer_steps_legends_outside_and_nothing_cut(monkeypatch, tmp_path):
    from recipe.mrtpo.tools.report import plots

    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: figures.append(fig) or [path])
    reach = {"format": {"grpo": {"per_run": {"0": 3, "1": 5}, "n_runs": 2, "n_reached": 2, "mean_step": 4.0},
                        "mrtpo": {"per_run": {"0": 2, "1": None}, "n_runs": 2, "n_reached": 1, "mean_step": 2.0}}}
    curves = {"format": {m: {"steps": [1, 2, 3], "mean": [0.2, 0.5, 0.9], "std": [None] * 3, "n": [1] * 3}
                         for m in ("grpo", "mrtpo")}}
    long_title = "qwen2.5-coder-7b-instruct-with-a-long-name · text_to_sql_and_more"
    plots.plot_threshold(reach, long_title, 0.8, tmp_path / "t.png")
    plots.plot_curves(curves, long_title, 0.8, tmp_path / "c.png")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    for fig in figures:
        canvas = FigureCanvasAgg(fig)  # what savefig renders with
        canvas.draw()
        renderer = canvas.get_renderer()
        ax = fig.axes[0]
        ticks = ax.get_yticks() if fig is figures[0] else ax.get_xticks()
        assert all(float(t).is_integer() for t in ticks), ticks  # steps are whole numbers
        legend = fig.legends[0].get_window_extent(renderer)
        for a in fig.axes:
            assert not legend.overlaps(a.get_window_extent(renderer)), "legend over the data"
        title = fig._suptitle.get_window_extent(renderer)
        width, height = fig.bbox.width, fig.bbox.height
        assert title.x0 >= 0 and title.x1 <= width and title.y1 <= height, "title or subtitle cut"


def test_self_teacher_runs_without_privileged_information_are_marked(tmp_path, console_line):
    """An RLSD run whose every step logged mrtpo/rows_privileged = 0 is marked "= GDPO here" in the table, with
    the reason below it; an RLSD run with privileged rows, a GDPO run and a run that never logged the count
    are not; an older log's mrtpo/opsd/rows_privileged counts too."""
    root = tmp_path / "runs"

    def run(method: str, task: str, counts, extra=None, key="mrtpo/rows_privileged"):
        d = root / f"{MODEL}_{task}_{method}_seed0"
        d.mkdir(parents=True)
        lines = []
        for i, c in enumerate(counts):
            data = {"mrtpo/reward/lower/mean": 0.5, **(extra or {})}
            if c is not None:
                data[key] = c
            lines.append(console_line(data, step=i + 1))
        (d / "train.log").write_text("\n".join(lines) + "\n")
        _eval_json(d / "eval" / "ifeval.json", "ifeval", {"prompt_level_strict": 0.5})

    run("rlsd", "ifbench", [0, 0, 0], {"mrtpo/rlsd/teacher_initial": 0.0})
    run("gdpo", "ifbench", [0, 0, 0])  # not a self-teacher: never marked
    run("rlsd", "spider", [0, 3, 0])  # privileged rows on a step
    run("gdpo-distill", "ifbench", [None, 0, 0])
    run("opsd", "ifbench", [None, 0, 0], key="mrtpo/opsd/rows_privileged")  # an older log's name
    run("gdpo-distill", "bfcl", [None, None])  # never logged: not marked
    summary = build_report(root)
    md = (root / "report" / "table.md").read_text()
    header, rows = _table_cells(md)
    assert rows["gdpo"][0] == "50.0"
    marked = {c["method"]: c["no_privileged"] for c in summary["table"]}
    assert marked["gdpo"] is None
    by_task = {(c["method"], tuple(c["train_tasks"])): c for c in summary["table"]}
    assert by_task[("rlsd", ("ifbench", "spider"))]["no_privileged"] is None  # the spider run had privileged rows
    got = {(x["task"], x["method"]): x["mark"] for x in summary["no_privileged"]}
    assert got == {("ifbench", "rlsd"): "= GDPO here", ("ifbench", "gdpo-distill"): "≈ GDPO here",
                   ("ifbench", "opsd"): "no privileged information"}

    # one training task per method: its cells carry the mark and the table says why
    for d in ("Qwen2.5-0.5B_spider_rlsd_seed0", "Qwen2.5-0.5B_bfcl_gdpo-distill_seed0"):
        shutil.rmtree(root / d)
    build_report(root)
    md = (root / "report" / "table.md").read_text()
    header, rows = _table_cells(md)
    assert rows["rlsd"][0] == "50.0 [= GDPO here]" and rows["gdpo-distill"][0] == "50.0 [≈ GDPO here]"
    assert rows["opsd"][0] == "50.0 [no privileged information]"
    assert rows["gdpo"][0] == "50.0"
    assert "[= GDPO here] (rlsd): the run logged mrtpo/rows_privileged = 0 on every step" in md
    assert "advantage is GDPO's exactly" in md


def test_multi_turn_runs_their_rewards_and_the_bfcl_verdict_beside_the_rates(tmp_path, console_line):
    """Runs of the multi-turn scripts (experiment ``<model>_toolcall_multiturn_<method>_seed<k>``): the training task
    is read whole, the curves are the multi-turn task's rewards, and an eval of ``--task bfcl_multi_turn`` (the
    metrics ``tools.eval`` writes) gives BFCL's verdict, its categories and the per-reward rates as columns."""
    root = tmp_path / "runs"
    model = "qwen2.5-3b-instruct"
    rates = {"mrtpo": 0.5, "gdpo": 0.25}
    for method, acc in rates.items():
        d = root / f"{model}_toolcall_multiturn_{method}_seed0"
        d.mkdir(parents=True)
        (d / "train.log").write_text(_synthetic_log(console_line, {
            "state": [0.1, 0.3, 0.5], "response": [0.2, 0.4, 0.9], "format": [0.8, 0.9, 1.0], "irrelevance": [0.5, 0.5, 0.6]}))
        _eval_json(d / "eval" / "bfcl_multi_turn.json", "bfcl_multi_turn", {
            "accuracy": acc, "state_rate": acc + 0.1, "response_rate": acc + 0.2, "format_rate": 1.0,
            "irrelevance_rate": None, "n_irrelevance": 0, "accuracy_category_mean": acc,
            "by_category": {c: {"n": 10, "accuracy": acc, "state_rate": 0.0} for c in ("base", "miss_func")},
            "bfcl_error_types": {"none": 5}, "loop_ends": {"completed": 10}})
    assert parse_run_name(f"{model}_toolcall_multiturn_mrtpo_seed0") == {
        "model": model, "task": "toolcall_multiturn", "method": "mrtpo", "seed": 0}
    summary = build_report(root)
    header, rows = _table_cells((root / "report" / "table.md").read_text())
    label = "BFCL multi-turn"
    # the verdict first, the categories the evals have, then the rates (irrelevance: None in every eval, no column)
    assert header == ["method", f"{label} acc (BFCL checker)", f"{label} base", f"{label} miss_func",
                      f"{label} state", f"{label} response", f"{label} format"]
    assert rows["gdpo"] == ["25.0", "25.0", "25.0", "35.0", "45.0", "100.0"]
    assert rows["mrtpo"] == ["50.0", "50.0", "50.0", "60.0", "70.0", "100.0"]
    assert set(summary["curves"][model]["toolcall_multiturn"]) == {"state", "response", "format", "irrelevance"}
    assert summary["threshold_steps"][model]["toolcall_multiturn"]["response"]["mrtpo"]["per_run"] == {"0": 3}
