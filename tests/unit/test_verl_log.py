"""Tests of ``recipe.mrtpo.tools.verl_log``, the one parser of verl's logs: a real console log of the recipe,
verl's own console formatter and file logger, numpy reprs, ANSI colours, cut and interleaved lines.

The real log (``tests/data/report_logs/mrtpo_run.log``) is the tail of a 2-step MRTPO run on CPU, cut to
its ``step:`` lines and the lines around them; its rewards are IF constraint ids such as
``punctuation:no_comma``.
"""

import math
from pathlib import Path

import pytest

from recipe.mrtpo.tools.verl_log import STEP_LINE, parse_console_log, parse_file_logger, parse_steps, parse_value

REAL_LOG = Path(__file__).resolve().parents[1] / "data" / "report_logs" / "mrtpo_run.log"


def _rewards(steps: dict) -> dict:
    prefix, suffix = "mrtpo/reward/", "/mean"
    out: dict = {}
    for step, metrics in steps.items():
        for key, value in metrics.items():
            if key.startswith(prefix) and key.endswith(suffix):
                out.setdefault(key[len(prefix):-len(suffix)], {})[step] = value
    return out


def test_parse_value():
    assert parse_value("0.5") == 0.5
    assert parse_value(" 3 ") == 3.0
    assert math.isnan(parse_value("nan"))
    assert parse_value("inf") == math.inf
    assert parse_value("True") == 1.0 and parse_value("False") == 0.0
    assert parse_value("np.float64(2.0)") == 2.0
    assert parse_value("np.int32(7)") == 7.0
    assert parse_value("np.bool_(True)") == 1.0
    assert parse_value("np.float64(0.") is None
    assert parse_value("abc") is None
    assert parse_value("") is None


def test_step_line_regex():
    m = STEP_LINE.search("(TaskRunner pid=1) step:12 - a/b:0.5 - c:1")
    assert m and m.group(1) == "12" and m.group(2) == "a/b:0.5 - c:1"
    assert STEP_LINE.search("global_step:3 - a:1") is None  # a word boundary before "step"
    assert STEP_LINE.search("step:3") is None


def test_parse_steps_lenient():
    text = "noise\nstep:1 - a:0.5 - b:np.float64(2.0) - c:nan\nstep:2 - a:0.25 - broken\nstep:1 - a:0.75\n"
    steps = parse_steps(text)
    assert sorted(steps) == [1, 2]
    assert steps[1] == {"a": 0.75}  # a later line for a step replaces an earlier one
    assert steps[2] == {"a": 0.25}  # parts that do not parse are dropped, not the line
    first = parse_steps("step:1 - a:0.5 - b:np.float64(2.0) - c:nan")[1]
    assert first["a"] == 0.5 and "b" not in first and math.isnan(first["c"])


def test_real_log_parses_like_parse_steps_plus_numpy_values():
    text = REAL_LOG.read_text()
    steps, corrupt = parse_console_log(text)
    assert corrupt == 0
    assert sorted(steps) == [1, 2]
    ref = parse_steps(text)
    for step in (1, 2):
        assert {k: v for k, v in steps[step].items() if k in ref[step]} == ref[step]
        # verl prints some values as numpy reprs, which parse_steps drops
        assert "num_turns/mean" not in ref[step] and steps[step]["num_turns/mean"] == 2.0
    rewards = _rewards(steps)
    assert set(rewards) == {"length_constraints:number_words", "punctuation:no_comma",
                            "keywords:letter_frequency", "change_case:capital_word_frequency"}
    assert rewards["punctuation:no_comma"] == {1: 0.8333333333333334, 2: 0.8333333333333334}
    assert rewards["keywords:letter_frequency"] == {1: 0.625, 2: 0.6875}


def test_verl_console_formatter_with_ray_prefix_and_colours():
    import numpy as np
    from verl.utils.logger.aggregate_logger import concat_dict_to_str

    data = {"actor/pg_loss": 0.01, "mrtpo/reward/format/mean": np.float64(0.75), "flag": True}
    line = "\x1b[36m(MRTPOTaskRunner pid=1)\x1b[0m " + concat_dict_to_str(data, step=4) + "\x1b[0m"
    steps, corrupt = parse_console_log(line + "\n")
    assert corrupt == 0
    assert steps == {4: {"actor/pg_loss": 0.01, "mrtpo/reward/format/mean": 0.75, "flag": 1.0}}


def test_corrupt_step_lines_are_counted_and_skipped():
    text = REAL_LOG.read_text()
    step1 = next(line for line in text.splitlines() if " step:1 - " in line)
    cut = step1.index("mrtpo/reward/punctuation") + len("mrtpo/rew")
    bad = [
        step1[:cut].replace(" step:1 - ", " step:3 - "),  # truncated inside a key
        "step:4 - actor/pg_loss:0.1 - mrtpo/reward/a/mean:0.5(WorkerDict pid=7) WARNING interleaved",
        "step:5 - ",
        "step:6 - actor/pg_loss:np.float64(0.",  # cut inside a numpy repr
    ]
    steps, corrupt = parse_console_log(text + "\n".join(bad) + "\n")
    assert corrupt == 4
    assert sorted(steps) == [1, 2]


def test_resumed_run_relogging_a_step_wins():
    steps, corrupt = parse_console_log("step:1 - a:0.1\nstep:2 - a:0.2\nstep:2 - a:0.3 - b:1\n")
    assert corrupt == 0 and steps == {1: {"a": 0.1}, 2: {"a": 0.3, "b": 1.0}}


def test_file_logger_jsonl_written_by_verl(tmp_path, monkeypatch):
    import numpy as np
    from verl.utils.tracking import FileLogger

    path = tmp_path / "run.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    logger = FileLogger("mrtpo", "exp")
    for step, value in ((1, 0.5), (2, 0.75), (3, 0.9)):
        logger.log({"mrtpo/reward/format/mean": np.float64(value), "actor/pg_loss": 0.1, "note": "text"}, step=step)
    logger.finish()
    with open(path, "a") as f:
        f.write('{"step": 4, "data": {"mrtpo/reward/format/me')  # crashed mid-write
    steps, corrupt, is_log = parse_file_logger(path.read_text())
    assert is_log and corrupt == 1
    assert _rewards(steps) == {"format": {1: 0.5, 2: 0.75, 3: 0.9}}
    assert "note" not in steps[1]
    # some other JSON-lines file (a rollout dump) is not a training log
    assert parse_file_logger('{"input": "a", "output": "b", "score": 1.0, "step": 1}\n')[2] is False


@pytest.mark.parametrize("line", ['{"step": true, "data": {}}', '{"step": 1.5, "data": {}}', '{"step": 1, "data": []}',
                                  '[1, 2]', '"text"', '{"step": null, "data": {}}'])
def test_file_logger_rejects_malformed_records(line):
    steps, corrupt, is_log = parse_file_logger(line + "\n\n")
    assert steps == {} and corrupt == 1 and is_log is False
