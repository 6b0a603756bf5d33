"""Tests of ``recipe.mrtpo.step.dump``, the relevance-dump schema: write/load round trip, the shipped sample dump
(a real trainer dump of the tiny-model run, written before ``max_realloc_rms`` and ``shuffle`` were added),
finding a step in a folder, and malformed dumps failing with a message that names the problem."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from recipe.mrtpo.step.dump import (
    DUMP_NAME,
    DumpError,
    RelevanceDump,
    check_dump,
    dump_path,
    find_dump,
    load_dump,
    write_dump,
)

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "relevance_dump.pt"


class NotWeightsOnly:
    """A class that ``torch.load(weights_only=True)`` does not allow."""


def _dump(step: int = 7, n: int = 3, K: int = 2, T: int = 5, relevance: bool = True) -> RelevanceDump:
    g = torch.Generator().manual_seed(step)
    mask = torch.ones(n, T, dtype=torch.long)
    mask[0, 3:] = 0
    scores = torch.rand(n, K, generator=g)
    scores[1, 0] = float("nan")
    return RelevanceDump(
        step=step, beta=0.25, max_realloc_rms=None, shuffle=True, reward_names=["format", "é<b>"],
        uid=[f"u{i // 2}" for i in range(n)], scores=scores, replayed=torch.rand(n, K, generator=g) > 0.5,
        relevance=torch.rand(n, K, T, generator=g) if relevance else None, advantages=torch.randn(n, T, generator=g),
        response_mask=mask, response_ids=torch.randint(0, 100, (n, T), generator=g),
        response_tokens=[[f"t{i}.{t}" for t in range(T)] for i in range(n)],
        contexts=[{"format": {"text": "Answer in JSON.", "placement": "system"}} for _ in range(n)],
        metrics={"mrtpo/beta": 0.25, "mrtpo/pairs_replayed": 3.0},
    )


def _same(a: RelevanceDump, b: RelevanceDump) -> None:
    for key, va in a.to_dict().items():
        vb = getattr(b, key)
        if isinstance(va, torch.Tensor):
            assert va.dtype == vb.dtype and torch.equal(va.nan_to_num(-1.0), vb.nan_to_num(-1.0)), key
        else:
            assert va == vb, key


def test_write_then_load_round_trip(tmp_path):
    dump = _dump()
    path = write_dump(dump, tmp_path / "new" / "folder")
    assert path == dump_path(tmp_path / "new" / "folder", 7) and path.name == "step_000007.pt"
    assert DUMP_NAME.match(path.name).group(1) == "000007"
    assert [p.name for p in path.parent.iterdir()] == ["step_000007.pt"]  # no temporary file left
    raw, f = load_dump(path.parent)
    assert f == path and isinstance(raw, dict)
    assert list(raw) == list(dump.to_dict())
    assert raw["max_realloc_rms"] is None and raw["shuffle"] is True
    _same(dump, RelevanceDump.from_dict(raw))
    # the file is a plain dict of weights-only types: torch.load(weights_only=True) reads it
    assert isinstance(torch.load(path, weights_only=True), dict)


def test_dump_without_replay_round_trips(tmp_path):
    dump = _dump(step=1, relevance=False)
    raw, _ = load_dump(write_dump(dump, tmp_path))
    assert raw["relevance"] is None
    assert RelevanceDump.from_dict(raw).relevance is None


def test_shipped_sample_dump_loads():
    raw, f = load_dump(SAMPLE)
    assert f == SAMPLE and raw["step"] == 2
    checked = check_dump(raw)
    n, K, T = checked["relevance"].shape
    assert (n, K) == (16, 4) and checked["mask"].shape == (n, T) and checked["mask"].dtype == torch.bool
    dump = RelevanceDump.from_dict(raw)
    assert dump.step == 2 and math.isclose(dump.beta, 0.078125)
    assert dump.max_realloc_rms == 1.0 and dump.shuffle is False  # older dump: the defaults
    assert len(dump.reward_names) == K and len(dump.uid) == n and len(dump.response_tokens) == n


def test_find_dump_in_a_folder(tmp_path):
    for s in (1, 10, 3):
        write_dump(_dump(step=s), tmp_path)
    (tmp_path / "notes.txt").write_text("not a dump")
    (tmp_path / "step_000099.pt.bak").write_text("not a dump either")
    assert find_dump(tmp_path).name == "step_000010.pt"
    assert find_dump(tmp_path, step=3).name == "step_000003.pt"
    assert find_dump(tmp_path / "step_000001.pt").name == "step_000001.pt"
    with pytest.raises(DumpError, match="available steps: 1, 3, 10"):
        find_dump(tmp_path, step=5)
    with pytest.raises(DumpError, match="no such dump file or folder"):
        find_dump(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DumpError, match=r"no step_XXXXXX\.pt dumps in .*every_n_steps"):
        find_dump(tmp_path / "empty")


def test_unreadable_or_wrong_files(tmp_path):
    (tmp_path / "garbage.pt").write_text("garbage")
    with pytest.raises(DumpError, match="cannot read .*garbage.pt as a relevance dump"):
        load_dump(tmp_path / "garbage.pt")
    torch.save([1, 2, 3], tmp_path / "list.pt")
    with pytest.raises(DumpError, match="holds a list, not the trainer's dump dict"):
        load_dump(tmp_path / "list.pt")

    torch.save({"obj": NotWeightsOnly()}, tmp_path / "code.pt")  # refused, never unpickled
    with pytest.raises(DumpError, match="cannot read"):
        load_dump(tmp_path / "code.pt")
    write_dump(_dump(step=4), tmp_path / "d")
    (tmp_path / "d" / "step_000004.pt").rename(tmp_path / "d" / "step_000005.pt")
    with pytest.raises(DumpError, match="is the dump of step 4, not step 5"):
        load_dump(tmp_path / "d", step=5)


@pytest.mark.parametrize("change, message", [
    (lambda d: d.pop("scores"), r"dump has no 'scores' \(keys: "),
    (lambda d: d.pop("response_mask"), "dump has no 'response_mask'"),
    (lambda d: d.update(scores=torch.zeros(3, 5)), r"scores must be \[n, K=2\], got \(3, 5\)"),
    (lambda d: d.update(scores="high"), "dump field 'scores' is not a tensor"),
    (lambda d: d.update(response_mask=torch.ones(4, 5)), r"response_mask must be \[n=3, T\], got \(4, 5\)"),
    (lambda d: d.update(replayed=torch.ones(3, 3)), r"replayed must be \[n, K\] = \(3, 2\), got \(3, 3\)"),
    (lambda d: d.update(relevance=torch.ones(3, 2, 4)), r"relevance must be \[n, K, T\] = \(3, 2, 5\), got \(3, 2, 4\)"),
    (lambda d: d.update(advantages=torch.ones(3)), r"advantages must be \[n, T\] = \(3, 5\), got \(3,\)"),
])
def test_malformed_dump_names_the_problem(tmp_path, change, message):
    raw = _dump().to_dict()
    change(raw)
    with pytest.raises(DumpError, match=message):
        check_dump(raw)
    with pytest.raises(DumpError, match=message):
        RelevanceDump.from_dict(raw)
    # the trainer cannot write one either
    kwargs = {k: v for k, v in raw.items() if k not in ("scores", "response_mask")}
    if "scores" in raw and "response_mask" in raw:
        bad = RelevanceDump(scores=raw["scores"], response_mask=raw["response_mask"], **kwargs)
        with pytest.raises(DumpError, match=message):
            write_dump(bad, tmp_path)
        assert not list(tmp_path.iterdir())


def test_check_dump_fills_what_is_optional():
    raw = {"reward_names": ["a"], "scores": [[1.0], [0.0]], "response_mask": [[1, 1, 0], [1, 0, 0]]}
    checked = check_dump(raw)
    assert checked["replayed"].shape == (2, 1) and not checked["replayed"].any()
    assert checked["relevance"] is None and checked["advantages"] is None
    assert checked["mask"].tolist() == [[True, True, False], [True, False, False]]
    with pytest.raises(DumpError, match="dump has no 'step'"):
        RelevanceDump.from_dict(raw)
    with pytest.raises(DumpError, match="a dump is a dict, got list"):
        check_dump([raw])


def test_loop_spans_keep_what_the_model_did_not_generate():
    from recipe.mrtpo.step.dump import loop_spans

    loop = [[["model", 0, 3, 0, 0], ["tool", 3, 9, 0, 0], ["model", 9, 12, 0, 1], ["user", 12, 20, 1, -1]],
            [["model", 0, 5, 0, 0]]]
    assert loop_spans(loop, 2, 15) == [[["tool", 3, 9], ["user", 12, 15]], []]  # clipped to T
    assert loop_spans(loop, 1, 15) == [[["tool", 3, 9], ["user", 12, 15]]]  # the first n
    assert loop_spans(None, 2, 15) == []  # no agent loop: nothing
    # hostile entries are left out, never raised on
    assert loop_spans([[["tool", "a", 3], ["evil", 0, 2], "x", ["user", 5, 2], None, ["tool", 1, 2]], "junk"], 3, 9) == [
        [["tool", 1, 2]], [], []]
    import numpy as np

    arr = np.empty(1, dtype=object)  # as verl's non_tensor_batch holds them
    arr[0] = [np.array(["tool", 1, 4], dtype=object)]
    assert loop_spans(arr, 1, 9) == [[["tool", 1, 4]]]
