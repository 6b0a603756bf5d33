"""The multi-turn trajectory record: round trip, BFCL's decoded view, refusal of anything off its shape."""

from __future__ import annotations

import json

import numpy as np
import pytest

from recipe.mrtpo.tasks.multi_turn.trajectory import (
    MAX_TURNS,
    Step,
    Trajectory,
    TrajectoryError,
    Turn,
    parse_trajectory,
)

RECORD = {"turns": [
    {"steps": [{"text": "<tool_call>...</tool_call>", "calls": ["cd(folder='doc')", "ls()"], "error": None},
               {"text": "<tool_call>{bad", "calls": [], "error": "JSONDecodeError: Expecting value"},
               {"text": "Done.", "calls": [], "error": None}]},
    {"steps": []},
    {"steps": [{"text": "x", "calls": ["pwd()"], "error": None}]},
]}


def test_round_trip_dict_and_json():
    t = Trajectory.from_dict(RECORD)
    assert t.to_dict() == RECORD
    assert parse_trajectory(t.to_json()) == t
    assert parse_trajectory(t) is t
    assert t.turns[0].steps[0] == Step(text="<tool_call>...</tool_call>", calls=("cd(folder='doc')", "ls()"))
    assert t.turns[1] == Turn()


def test_decoded_is_bfcl_eval_runner_view():
    """eval_runner skips steps whose decoding failed or is empty; turns stay, even when empty."""
    assert Trajectory.from_dict(RECORD).decoded() == [[["cd(folder='doc')", "ls()"]], [], [["pwd()"]]]


def test_parquet_values_accepted():
    rec = {"turns": np.array([{"steps": np.array([{"text": "t", "calls": np.array(["ls()"]), "error": None}])}])}
    assert parse_trajectory(rec).decoded() == [[["ls()"]]]


@pytest.mark.parametrize("bad", [
    None, 3, "not json", "[1]", {}, {"turns": 1}, {"turns": [1]}, {"turns": [{"steps": 1}]},
    {"turns": [{"steps": [{"text": 1}]}]}, {"turns": [{"steps": [{"text": "", "calls": "ls()"}]}]},
    {"turns": [{"steps": [{"text": "", "calls": [1]}]}]}, {"turns": [{"steps": [{"text": "", "error": 2}]}]},
    {"turns": [{"steps": [{"text": "", "calls": ["ls()"], "error": "e"}]}]},
    {"turns": [], "extra": 1}, {"turns": [{"steps": [], "x": 1}]}, {"turns": [{"steps": [{"text": "", "y": 1}]}]},
    {"turns": [{"steps": []}] * (MAX_TURNS + 1)}, b"\xff\xfe", json.dumps({"turns": [[]]}),
])
def test_off_shape_is_a_trajectory_error(bad):
    with pytest.raises(TrajectoryError):
        parse_trajectory(bad)


def test_deep_json_is_a_trajectory_error_not_a_crash():
    with pytest.raises(TrajectoryError):
        parse_trajectory("[" * 100_000 + "]" * 100_000)


def test_decoded_skips_a_step_of_one_empty_call_as_bfcl_does():
    """BFCL's ``is_empty_execute_response``: ``[]`` and ``[""]`` are no call."""
    t = parse_trajectory({"turns": [{"steps": [{"text": "", "calls": [""]}, {"text": "", "calls": ["", "ls()"]}]}]})
    assert t.decoded() == [[["", "ls()"]]]
