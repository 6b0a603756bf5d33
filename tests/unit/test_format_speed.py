"""The format-speed miniature without any verl run:

- the builder (``data_prep.format_speed``): deterministic, disjoint splits, demonstrations that the real
  tool-calling verifier scores as designed (frame broken at the asked rate, costing format only;
  argument right at the asked rate, independently), the SFT variants that teach each Z_k;
- the tag and argument token positions (``experiments.format_speed.tokens``);
- the sign diagnostic and the localisation shares on a hand-made relevance dump (``.diagnostic``), and the
  layouts written under each instruction (``.layouts``);
- the analysis table from fake runs (``.results``), the run overrides and the machine-wide lock (``.runs``);
- the ToolRL condition: its data (the layout the instruction names, followed only part of the time), the
  position after the closing tag, the conditions' folders and run keys, the preflight's replay on a tiny
  model and its gate (passes / stops the grid).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from data_prep import format_speed as builder
from data_prep.common import read_parquet_rows
from experiments.format_speed.cli import main as experiment_main
from experiments.format_speed.diagnostic import dump_records, summarise, summed_advantages
from experiments.format_speed.layouts import OTHER, layout_of, layout_steps, plot_layouts, render_layouts, run_layouts, step_layouts
from experiments.format_speed.results import analyse, run_curves
from experiments.format_speed.runs import heavy_lock, run_overrides
from experiments.format_speed.tokens import call_spans, token_roles
from recipe.mrtpo.tasks import to_plain
from recipe.mrtpo.tasks.tool_calling import score

IM_END = 151645  # special: decoded as "" by the reward manager


@pytest.fixture(scope="module")
def splits():
    return builder.build_splits(seed=3, n_sft=2000, n_train=64, n_test=32, p_arg=0.5)  # the rate checked below


# ------------------------------------------------------------------------------------------------ data


def test_builder_is_deterministic(tmp_path):
    for d in ("a", "b"):
        assert builder.main(["--out-dir", str(tmp_path / d), "--seed", "1", "--n-sft", "50"]) == 0
    for split in ("sft", "train", "test"):
        assert (tmp_path / "a" / f"{split}.parquet").read_bytes() == (tmp_path / "b" / f"{split}.parquet").read_bytes()
    assert builder.main(["--out-dir", str(tmp_path / "c"), "--seed", "2", "--n-sft", "50"]) == 0
    assert (tmp_path / "a" / "train.parquet").read_bytes() != (tmp_path / "c" / "train.parquet").read_bytes()


def test_splits_are_disjoint_and_plain(splits):
    key = lambda r: r["prompt"][0]["content"]  # noqa: E731
    test, train, sft = ({key(r) for r in splits[s]} for s in ("test", "train", "sft"))
    assert len(test) == 32 and len(train) == 64
    assert not test & train and not (test | train) & {key(r) for r in splits["sft"] if r["extra_info"]["variant"] == "plain"}
    for r in splits["train"] + splits["test"]:
        assert r["data_source"] == "tool_calling" and r["extra_info"]["variant"] == "plain"
        assert builder.FORMAT_INSTRUCTION in key(r) and "verifier_information" not in key(r)
        res = score(builder.gold_answer(*_call(r)), to_plain(r["reward_model"]["ground_truth"]), r["extra_info"])
        assert res.scores == {"format": 1.0, "correctness": 1.0}
        # Z_format is the instruction, verbatim in the prompt; Z_correctness the rendered reference call
        assert res.contexts["format"].text == builder.FORMAT_INSTRUCTION and res.contexts["format"].placement == "prompt"
        assert res.contexts["correctness"].text == builder.gold_answer(*_call(r))


def _call(row):
    gt = json.loads(row["reward_model"]["ground_truth"]["calls"])[0]
    (arg, value), = gt["arguments"].items()
    return gt["name"], arg, value


def test_demonstrations_are_scored_as_designed(splits):
    by_variant: dict = {}
    for r in splits["sft"]:
        res = score(r["extra_info"]["demo"], to_plain(r["reward_model"]["ground_truth"]), r["extra_info"])
        f, c = res.scores["format"], res.scores["correctness"]
        # a broken frame costs format only: the lenient reading still finds the call
        assert f == float(r["extra_info"]["demo_corruption"] == "")
        assert c == (1.0 if r["extra_info"]["demo_arg_right"] else 0.5)
        by_variant.setdefault(r["extra_info"]["variant"], []).append((f, c))
    plain = by_variant["plain"]
    assert abs(sum(f for f, _ in plain) / len(plain) - 0.3) < 0.06
    assert abs(sum(c == 1.0 for _, c in plain) / len(plain) - 0.5) < 0.06
    # independent: the argument rate is the same with and without a good frame
    good = [c for f, c in plain if f == 1.0]
    bad = [c for f, c in plain if f == 0.0]
    assert abs(sum(c == 1.0 for c in good) / len(good) - sum(c == 1.0 for c in bad) / len(bad)) < 0.12
    assert all(f == 0.0 for f, _ in by_variant["no_instruction"])  # without the instruction the frame breaks
    assert all(c == 1.0 for _, c in by_variant["with_reference"])  # with the reference the argument is right
    assert 0.15 < sum(f for f, _ in by_variant["with_reference"]) / len(by_variant["with_reference"]) < 0.45


def test_sft_variants_are_what_the_replay_builds(splits):
    from recipe.mrtpo.core.prompt_variants import append_to_last_user, remove_from_messages, verifier_block

    for r in splits["sft"][:200]:
        name, arg, value = _call(r)
        plain = builder.prompt_text(next(t for t in builder.TOOLS if t[0] == name), value)
        variant = r["extra_info"]["variant"]
        if variant == "no_instruction":  # P_minus_format of the plain prompt
            assert r["prompt"] == remove_from_messages([{"role": "user", "content": plain}], builder.FORMAT_INSTRUCTION)
        elif variant == "with_reference":  # P_all of the plain prompt
            block = verifier_block([("correctness", builder.gold_answer(name, arg, value))])
            assert r["prompt"] == append_to_last_user([{"role": "user", "content": plain}], block)
        else:
            assert r["prompt"][0]["content"] == plain


def test_builder_rejects_impossible_requests(tmp_path, capsys):
    assert builder.main(["--out-dir", str(tmp_path), "--n-train", "300", "--n-test", "100"]) == 2
    assert "n_train + n_test" in capsys.readouterr().err
    with pytest.raises(ValueError, match="p_format"):
        builder.build_splits(p_format=1.5)


# ---------------------------------------------------------------------------------------------- tokens

# '<tool_call>\n{"name": "set_timer", "arguments": {"minutes": 27}}\n</tool_call>' as Qwen2 splits it
GOOD = ["<tool_call>", "\n", '{"', "name", '":', ' "', "set", "_timer", '",', ' "', "arguments", '":', ' {"', "minutes",
        '":', " ", "2", "7", "}}\n", "</tool_call>", "<|im_end|>"]
NO_CLOSE = GOOD[:18] + ["}}", "<|im_end|>"]
GARBLED = GOOD[:18] + ["}}\n", "</", "tool", ">", "<|im_end|>"]


def _ids(tokens):
    return [IM_END if t == "<|im_end|>" else 1000 + i for i, t in enumerate(tokens)]


def test_token_roles():
    roles = token_roles(_ids(GOOD), GOOD, len(GOOD))
    assert roles == {"tag": [0, 1, 18, 19, 20], "argument": [16, 17], "close": [19], "after_close": [20]}  # </tool_call>, end
    assert token_roles(_ids(NO_CLOSE), NO_CLOSE, len(NO_CLOSE)) == {"tag": [0, 1, 19], "argument": [16, 17], "close": [19],
                                                                    "after_close": []}  # never closed
    assert token_roles(_ids(GARBLED), GARBLED, len(GARBLED))["tag"] == [0, 1, 18, 19, 20, 21, 22]
    assert token_roles(_ids(GARBLED), GARBLED, len(GARBLED))["close"] == [19]  # </ (then tool>)
    stray = GOOD[:18] + ["}}", "}\n", "</tool_call>", "<|im_end|>"]
    assert token_roles(_ids(stray), stray, len(stray))["close"] == [19]  # the stray } where the tag should begin
    assert token_roles(_ids(GOOD), GOOD, 19)["close"] == []  # cut before the closing position
    assert token_roles(_ids(GOOD), GOOD, 19)["tag"] == [0, 1, 18]  # only the valid prefix
    broken = GOOD[:12] + ["}", "<|im_end|>"]  # no decodable object: nothing to attribute
    assert token_roles(_ids(broken), broken, len(broken)) is None
    assert call_spans("no call here") is None and call_spans("<tool_call>\nx{}") is None
    text = "".join(GOOD[:-1])
    spans = call_spans(text)
    assert text[slice(*spans["object"])].startswith('{"name"') and text[slice(*spans["value"])] == "27"


# ------------------------------------------------------------------------------------------ diagnostic


def _dump(responses, scores, rel, beta=0.5, rho=None):
    T = max(len(r) for r in responses)
    n = len(responses)
    mask = torch.zeros(n, T, dtype=torch.long)
    ids = torch.zeros(n, T, dtype=torch.long)
    toks = []
    for i, r in enumerate(responses):
        mask[i, : len(r)] = 1
        ids[i, : len(r)] = torch.tensor(_ids(r))
        toks.append(list(r) + ["<|endoftext|>"] * (T - len(r)))
    return {"step": 3, "beta": beta, "max_realloc_rms": rho, "reward_names": ["format", "correctness"], "uid": ["g"] * n,
            "scores": torch.tensor(scores, dtype=torch.float32), "replayed": torch.ones(n, 2, dtype=torch.bool),
            "relevance": rel, "response_mask": mask, "response_ids": ids, "response_tokens": toks}


def _localised_q(responses, T):
    """q_format on each response's tag tokens, q_correctness on its argument tokens (plus a little noise)."""
    rel = torch.full((len(responses), 2, T), 0.01)
    for i, r in enumerate(responses):
        roles = token_roles(_ids(r), r, len(r))
        rel[i, 0, roles["tag"]] = 0.5
        rel[i, 1, roles["argument"]] = 0.5
        rel[i, :, len(r):] = 0
    return rel


def test_sign_diagnostic_on_a_hand_made_dump():
    # one group: good tags + wrong argument, good + right, broken + right, broken + wrong
    responses = [GOOD, GOOD, NO_CLOSE, NO_CLOSE]
    scores = [[1, 0.5], [1, 1], [0, 1], [0, 0.5]]
    dump = _dump(responses, scores, _localised_q(responses, len(GOOD)))
    adv = summed_advantages(dump, beta=0.5)
    a = adv["A"].tolist()
    assert a[0][0] == pytest.approx(-a[0][1], rel=1e-4) and a[0][0] > 0  # the conflict of the issue: +A_format, -A_correctness
    assert torch.allclose(adv["gdpo"][0], torch.zeros(len(GOOD)), atol=1e-4)  # GDPO: they cancel on every token
    recs = dump_records(dump, beta=0.5)
    assert [r["conflict"] for r in recs] == [True, False, True, False]
    s = summarise(recs)
    assert s["with_format_advantage"] == 4 and s["conflicts"] == 2
    assert s["conflict"]["gdpo_agree"] == 0.0 and s["conflict"]["mrtpo_agree"] == 1.0  # MRTPO keeps format's sign on tags
    assert s["conflict"]["gdpo_signed"] == pytest.approx(0.0, abs=1e-4) and s["conflict"]["mrtpo_signed"] > 0.5
    assert s["gdpo_agree"] == 0.5 and s["mrtpo_agree"] == 1.0
    # aligned responses: GDPO gives the tags both rewards' credit (signed 2); MRTPO w_format + w_correctness
    # on the tags: w = (1 - beta) + beta q / qbar, format's q mostly on the tags, correctness's elsewhere
    w_f = 0.5 + 0.5 * 0.5 / ((5 * 0.5 + 16 * 0.01) / 21)
    w_c = 0.5 + 0.5 * 0.01 / ((2 * 0.5 + 19 * 0.01) / 21)
    assert recs[1]["gdpo_signed"] == pytest.approx(2.0, rel=1e-4) and recs[1]["mrtpo_signed"] == pytest.approx(w_f + w_c, rel=1e-4)
    assert recs[0]["mrtpo_signed"] == pytest.approx(w_f - w_c, rel=1e-3)  # the conflict: format's share wins on the tags
    # localisation shares: tags hold 0.5 each of q_format, the rest 0.01 per token
    good_tag = 5 * 0.5 / (5 * 0.5 + 16 * 0.01)
    assert recs[0]["q_format_on_tag"] == pytest.approx(good_tag, rel=1e-5)
    assert recs[0]["q_correctness_on_arg"] == pytest.approx(2 * 0.5 / (2 * 0.5 + 19 * 0.01), rel=1e-5)
    assert recs[0]["tag_share"] == pytest.approx(5 / 21) and recs[2]["tag_share"] == pytest.approx(3 / 20)
    # the closing position (</tool_call> of GOOD, the end token of NO_CLOSE) is a tag token here
    assert recs[0]["q_format_on_close"] == pytest.approx(0.5 / (5 * 0.5 + 16 * 0.01), rel=1e-5)
    assert recs[0]["close_share"] == pytest.approx(1 / 21) and recs[2]["close_share"] == pytest.approx(1 / 20)
    assert recs[1]["gdpo_close"] == pytest.approx(2.0, rel=1e-4) and recs[1]["mrtpo_close"] == pytest.approx(w_f + w_c, rel=1e-4)
    assert recs[0]["gdpo_close"] == pytest.approx(0.0, abs=1e-4) and s["conflict"]["mrtpo_close"] > 0.5
    # q_format on the end token alone: the closing position of GOOD gets w_format = 1 - beta, less than GDPO's 1
    late = torch.ones(4, 2, len(GOOD))
    late[:, 0] = 0.0
    late[:, 0, len(GOOD) - 1] = 1.0  # GOOD's end token (NO_CLOSE's is its closing position, index 19)
    good = dump_records(_dump(responses, scores, late), beta=0.5)[1]
    assert good["q_format_on_close"] == 0.0 and good["gdpo_close"] == pytest.approx(2.0, rel=1e-4)
    assert good["mrtpo_close"] == pytest.approx(0.5 + 1.0, rel=1e-4)  # w_format 0.5 + w_correctness 1 (uniform q)
    # uniform q: MRTPO is GDPO
    flat = _dump(responses, scores, torch.ones(4, 2, len(GOOD)))
    s2 = summarise(dump_records(flat, beta=0.5))
    assert s2["mrtpo_agree"] == s2["gdpo_agree"] and s2["conflict"]["mrtpo_agree"] == 0.0


def test_diagnostic_skips_dumps_without_relevance_and_undecodable_calls():
    responses = [GOOD, NO_CLOSE]
    dump = _dump(responses, [[1, 1], [0, 1]], None)
    assert dump_records(dump, 0.5) == [] and summarise([])["gdpo_agree"] is None
    broken = GOOD[:12] + ["}", "<|im_end|>"]
    dump = _dump([GOOD, broken], [[1, 1], [0, 0]], torch.ones(2, 2, len(GOOD)))
    assert [r["sample"] for r in dump_records(dump, 0.5)] == [0]


# ---------------------------------------------------------------------------------------------- layouts


def _layout_dump(step, frames, fmt):
    """A dump of len(frames) responses in groups of 2: the instruction of each frame, its format score."""
    n = len(frames)
    return {"step": step, "reward_names": ["correctness", "format"], "uid": [f"g{i // 2}" for i in range(n)],
            "scores": torch.tensor([[3.0, f] for f in fmt]), "response_mask": torch.ones(n, 2),
            "contexts": [{"format": {"text": builder.FRAMES[fr] if fr in builder.FRAMES else fr, "placement": "prompt"},
                          "correctness": {"text": "ref", "placement": "appended"}} for fr in frames]}


def test_layouts_per_instruction_and_groups_with_format_variance():
    assert [layout_of(builder.FRAMES[k]) for k in sorted(builder.FRAMES)] == sorted(builder.FRAMES)
    assert layout_of("Reply with the call as JSON.") == OTHER and layout_of(None) == OTHER
    # groups: (call 1, call 1) agree; (response 0, response 1) varies; (call 0, response NaN): the NaN left out
    d = _layout_dump(4, ["call", "call", "call_response", "call_response", "call", "call_response"],
                     [1, 1, 0, 1, 0, float("nan")])
    r = step_layouts(d)
    assert r["step"] == 4 and r["responses"] == 5 and r["groups"] == 3 and r["groups_with_format_variance"] == 1
    assert r["format_by_layout"] == {"call": pytest.approx(2 / 3), "call_response": 0.5}
    assert r["n_by_layout"] == {"call": 3, "call_response": 2}
    # a policy that writes the default layout whatever the instruction: no group varies
    stuck_dump = _layout_dump(9, ["call", "call", "call_response", "call_response"], [1, 1, 0, 0])
    stuck = step_layouts(stuck_dump)
    assert stuck["groups_with_format_variance"] == 0 and stuck["format_by_layout"] == {"call": 1.0, "call_response": 0.0}
    # no contexts, or no format reward: nothing to say
    assert step_layouts({**d, "contexts": None}) is None
    assert step_layouts({**d, "reward_names": ["a", "b"]}) is None
    assert [x["step"] for x in run_layouts([stuck_dump, {**d, "contexts": []}, d])] == [4, 9]
    assert layout_steps(30, 10) == [1, 11, 21, 30] and layout_steps(5, 10) == [1, 5]


def test_render_layouts_shows_known_layouts_only(tmp_path):
    d1 = _layout_dump(1, ["call", "call", "call_response", "call_response"], [1, 0, 0, 0])
    d2 = _layout_dump(2, ["call", "call", "call_response", "call_response"], [1, 1, 1, 0])
    run = {"ok": True, "curves": {"format": {"first_reach": None}}, "layouts": run_layouts([d1, d2])}
    lines = render_layouts({("mrtpo", 3): run}, steps=2, after_steps=10, threshold=0.8)
    assert "| mrtpo | 3 | – | 0.50 / 0.00 (1/2) | 1.00 / 0.50 (1/2) |" in lines
    plot_layouts({("mrtpo", 3): run, ("gdpo", 3): {**run, "layouts": []}}, ["gdpo", "mrtpo"], tmp_path / "l.png")
    assert (tmp_path / "l.png").read_bytes()[:4] == b"\x89PNG"
    other = _layout_dump(1, ["Reply with the call.", "Reply with the call."], [1, 0])
    control = {("mrtpo", 0): {**run, "layouts": run_layouts([other])}}
    assert control[("mrtpo", 0)]["layouts"][0]["format_by_layout"] == {OTHER: 0.5}
    assert render_layouts(control, 2, 10, 0.8) == []
    plot_layouts(control, ["mrtpo"], tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()


# --------------------------------------------------------------------------------------------- results


def _log(rewards: dict[str, list[float]]) -> str:
    from verl.utils.logger.aggregate_logger import concat_dict_to_str

    n = len(next(iter(rewards.values())))
    return "\n".join(concat_dict_to_str({f"mrtpo/reward/{k}/mean": v[i] for k, v in rewards.items()}, step=i + 1)
                     for i in range(n)) + "\n"


def _fake_run(runs: Path, method: str, seed: int, fmt: list[float], cor: list[float], dump=None, ok=True):
    d = runs / f"{method}_seed{seed}"
    d.mkdir(parents=True)
    (d / "main_mrtpo.log").write_text(_log({"format": fmt, "correctness": cor}))
    (d / "result.json").write_text(json.dumps({"ok": ok, "log": "main_mrtpo.log", "wall_s": 100.0}))
    if dump is not None:
        (d / "relevance_dumps").mkdir()
        torch.save(dump, d / "relevance_dumps" / "step_000003.pt")


def test_run_curves():
    c = run_curves(_log({"format": [0.2, 0.9, 0.9, 0.8, 1.0], "correctness": [0.5] * 5}), 0.8, 2, 3)["format"]
    assert c["first_reach"] == 3  # running mean of 2: 0.55, 0.9 (step 3), ...; 0.9 at step 2 alone is not enough
    assert c["after"] == 0.8 and c["start"] == pytest.approx(0.55) and c["final"] == pytest.approx(0.9)
    assert run_curves(_log({"format": [0.2, 0.3]}), 0.8, 2, 10)["format"]["after"] is None
    with pytest.raises(ValueError):
        run_curves("", 0.8, 0, 1)


def test_analyse_builds_the_table_from_fake_runs(tmp_path):
    responses = [GOOD, GOOD, NO_CLOSE, NO_CLOSE]
    dump = _dump(responses, [[1, 0.5], [1, 1], [0, 1], [0, 0.5]], _localised_q(responses, len(GOOD)))
    runs = tmp_path / "runs"
    _fake_run(runs, "gdpo", 0, [0.2, 0.5, 0.8, 0.9, 0.9], [0.7, 0.7, 0.8, 0.8, 0.8])
    _fake_run(runs, "gdpo", 1, [0.2, 0.3, 0.3, 0.4, 0.4], [0.7, 0.7, 0.7, 0.8, 0.9])
    _fake_run(runs, "mrtpo", 0, [0.3, 0.8, 0.9, 1.0, 1.0], [0.7, 0.8, 0.8, 0.8, 0.8], dump)
    _fake_run(runs, "mrtpo", 1, [0.3, 0.9, 0.9, 1.0, 1.0], [0.7, 0.7, 0.7, 0.7, 0.7], dump)
    _fake_run(runs, "grpo", 0, [0.3] * 5, [0.7] * 5, ok=False)
    _fake_run(runs, "grpo", 1, [0.25, 0.5], [0.5, 0.0], dump)
    (runs / "grpo_seed1" / "result.json").unlink()  # stopped before it finished
    res = analyse(tmp_path, ["grpo", "gdpo", "mrtpo"], [0, 1], threshold=0.8, window=2, after_steps=3, steps=5, beta=0.5,
                  docs=tmp_path / "docs", log=lambda m: None)
    t = res["table"]
    assert t["grpo"]["n"] == 0 and t["gdpo"]["n"] == 2 and t["mrtpo"]["n"] == 2
    assert t["gdpo"]["reach"]["per_seed"] == {"0": 4, "1": None} and t["gdpo"]["reach"]["mean"] == 4
    assert t["gdpo"]["reach"]["censored_mean"] == pytest.approx((4 + 6) / 2)
    assert t["mrtpo"]["reach"]["per_seed"] == {"0": 3, "1": 3} and t["mrtpo"]["reach"]["mean"] == 3  # 0.6 at step 2
    assert t["mrtpo"]["format_after"][0] == pytest.approx(1.0)  # step 4 of both seeds
    assert t["gdpo"]["correctness_gain"][0] == pytest.approx(((0.8 - 0.7) + (0.85 - 0.7)) / 2)
    assert t["gdpo"]["diagnostic"] is None
    d = t["mrtpo"]["diagnostic"]
    assert d["conflicts"] == 4 and d["conflict"]["gdpo_agree"][0] == 0.0 and d["conflict"]["mrtpo_agree"][0] == 1.0
    md = (tmp_path / "results.md").read_text()
    assert "| gdpo | 2 | 4.0 (1/2; ≥5.0 over all) |" in md and "| grpo | 0 | – |" in md
    assert "| mrtpo | 3 | 3 |" in md  # steps to format per seed
    assert "- grpo seed 1 (stopped): step 1: 0.25 / 0.50, step 2: 0.50 / 0.00" in md and "- grpo seed 0 (failed)" in md
    assert res["runs"]["grpo_seed1"]["unfinished"] and not res["runs"]["grpo_seed1"]["ok"]
    for name in ("results.md", "curves.png", "diagnostic.png"):
        assert (tmp_path / "docs" / name).is_file()
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["table"]["mrtpo"]["n"] == 2
    # mrtpo against gdpo over seeds: steps 3, 3 against 4, 6 (not reached = steps + 1); 2 of the 6 labellings
    # of {3, 3, 4, 6} are as far apart as the observed one
    # (the paper's orderings with finished seeds in both methods: grpo has none, the shuffle did not run)
    c = saved["comparison"]
    assert set(c) == {"mrtpo - gdpo"} and c["mrtpo - gdpo"]["reach"]["diff"] == pytest.approx(-2.0)
    assert c["mrtpo - gdpo"]["reach"]["p"] == pytest.approx(2 / 6) and c["mrtpo - gdpo"]["n"] == [2, 2]
    assert c["mrtpo - gdpo"]["format_after"]["diff"] == pytest.approx(0.35)
    assert "| mrtpo - gdpo | 2 / 2 | -2.0 | -6 (13 vs 19) | 0.33 | +0.35 | 0.33 |" in md


def test_analyse_only_exits_nonzero_on_failed_runs(tmp_path, capsys):
    _fake_run(tmp_path / "runs", "gdpo", 0, [0.2, 0.5], [0.7, 0.7])
    _fake_run(tmp_path / "runs", "grpo", 0, [0.2, 0.5], [0.7, 0.7], ok=False)
    argv = ["--out", str(tmp_path), "--seeds", "0", "--methods", "gdpo", "grpo", "--analyse-only", "--steps", "2"]
    assert experiment_main(argv) == 1 and "grpo_seed0" in capsys.readouterr().err
    assert experiment_main(["--out", str(tmp_path / "none"), "--analyse-only"]) == 1


# -------------------------------------------------------------------------------------------------- runs


def test_run_overrides(tmp_path):
    ov = run_overrides("mrtpo", tmp_path / "m", tmp_path / "d.parquet", tmp_path / "r", seed=2, steps=15, lr=1e-3,
                       beta=0.5, warmup=1)
    keys = [o.split("=", 1)[0] for o in ov]
    assert len(keys) == len(set(keys))
    assert "trainer.project_name=mrtpo_format_speed" in ov and "mrtpo.dump.every_n_steps=1" in ov
    assert "algorithm.adv_estimator=mrtpo" in ov and "actor_rollout_ref.rollout.seed=2" in ov
    assert ov[-1].startswith("+actor_rollout_ref.actor.fsdp_config.mixed_precision=") and "param_dtype:fp32" in ov[-1]
    assert not any(o.startswith("mrtpo.dump") for o in run_overrides("gdpo", tmp_path, tmp_path, tmp_path, 0, 1, 1e-3, 0.5, 1))


def test_heavy_lock_is_exclusive(tmp_path):
    path = tmp_path / "heavy.lock"
    with heavy_lock(path, log=lambda m: None):
        with open(path) as other:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(path) as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released


def test_experiment_runs_as_a_module():
    res = subprocess.run([sys.executable, "-m", "experiments.format_speed", "--help"], cwd=Path(__file__).resolve().parents[2],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("usage: python -m experiments.format_speed ")


def test_run_verl_resumes_and_holds_the_lock_only_around_the_run(tmp_path, monkeypatch):
    """The shared runner of both miniatures: a finished run with the same overrides and weights is kept,
    changed overrides re-run it, a failed run is recorded as failed, and the lock is held during the run."""
    from experiments.mini_credit.runs import run_verl
    from recipe.mrtpo.cpu import launcher

    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"w")
    calls, held = [], []

    def fake_run_cpu(module, overrides, out_dir, timeout_s, on_line=None):
        calls.append(list(overrides))
        on_line("step:1 - x:1")
        steps = {} if "fail" in overrides else {1: {}, 2: {}}
        log = Path(out_dir) / "main_mrtpo.log"
        log.write_text("log\n")
        return launcher.RunResult(returncode=0, timed_out=False, wall_s=1.0, log_path=log, steps=steps)

    @contextlib.contextmanager
    def lock():
        held.append("in")
        yield
        held.append("out")

    monkeypatch.setattr(launcher, "run_cpu", fake_run_cpu)
    run_dir, info = tmp_path / "runs" / "gdpo_seed0", {"method": "gdpo"}
    lines = []
    first = run_verl("gdpo", 0, ["a=1"], model, run_dir, 2, 60, info, log=lines.append, lock=lock)
    assert first["ok"] and held == ["in", "out"] and json.loads((run_dir / "run.json").read_text()) == info
    assert any("step 1" in m for m in lines)
    again = run_verl("gdpo", 0, ["a=1"], model, run_dir, 2, 60, info, log=lines.append, lock=lock)
    assert again == first and len(calls) == 1 and held == ["in", "out"]  # kept: no run, no lock
    run_verl("gdpo", 0, ["a=2"], model, run_dir, 2, 60, info, log=lines.append)
    assert len(calls) == 2
    failed = run_verl("gdpo", 0, ["fail"], model, run_dir, 2, 60, info, log=lines.append)
    assert not failed["ok"] and not json.loads((run_dir / "result.json").read_text())["ok"]
    assert any("FAILED" in m for m in lines)


def test_prepare_seed_warm_starts_once_and_then_is_cached(tmp_path):
    """The per-seed preparation both miniatures share (data, random tiny Qwen2, the three SFT phases, the
    held-out evaluation through the real verifier): a second call with the same arguments is a cache hit."""
    import argparse

    from experiments.format_speed.warm_start import sft_warm_start
    from experiments.mini_credit.runs import warm_start_seed

    args = argparse.Namespace(n_sft=64, hidden=64, layers=1, sft_gold_steps=2, sft_demo_steps=2, sft_full_steps=1)
    build_args = ["--n-train", "4", "--n-test", "4", "--p-format", "0.3", "--p-arg", "0.8"]

    def prepare_seed(sdir, seed, args, log):  # experiments.format_speed.runs.prepare_seed on less data
        return warm_start_seed(sdir, seed, args, builder.main, build_args, sft_warm_start, log)

    lines = []
    meta = prepare_seed(tmp_path / "ws", 0, args, log=lines.append)
    assert meta["config"]["gold_steps"] == 2 and set(meta["loss"]) == {"gold", "demo", "full"}
    assert 0 <= meta["after"]["format"] <= 1 and meta["after"]["n"] == 4 * 4
    assert (tmp_path / "ws" / "sft_model" / "model.safetensors").is_file()
    assert any("SFT done" in m for m in lines)
    lines.clear()
    assert json.loads(json.dumps(prepare_seed(tmp_path / "ws", 0, args, log=lines.append))) == json.loads(json.dumps(meta))
    assert any("SFT model cached" in m for m in lines)


def test_prepare_seed_of_the_toolrl_condition_builds_a_task_vocabulary(tmp_path):
    """Under ToolRL's rewards the warm start's model is built on a task vocabulary trained on the data it
    just built (:attr:`Condition.task_vocab`); the control keeps the real Qwen2 tokenizer."""
    import argparse

    from transformers import AutoConfig, AutoTokenizer

    from experiments.format_speed.common import Condition
    from experiments.format_speed.runs import prepare_seed
    from experiments.format_speed.warm_start import corpus_texts

    assert Condition().task_vocab is None and Condition("toolrl", 32).task_vocab == 1024
    args = argparse.Namespace(n_sft=64, hidden=64, layers=1, sft_gold_steps=2, sft_demo_steps=2, sft_full_steps=1,
                              p_follow_call=builder.P_FOLLOW_CALL, p_follow_response=builder.P_FOLLOW_RESPONSE,
                              p_arg=builder.P_ARG)
    meta = prepare_seed(tmp_path / "ws", 0, args, log=lambda m: None, condition=Condition("toolrl", 32))
    assert meta["after"]["n"] > 0
    tok = AutoTokenizer.from_pretrained(tmp_path / "ws" / "sft_model")
    assert (tmp_path / "ws" / "sft_model" / "tokenizer.json").read_text() == \
        (tmp_path / "ws" / "tokenizer" / "tokenizer.json").read_text()
    assert 300 < len(tok) <= 1024 + 22 and AutoConfig.from_pretrained(tmp_path / "ws" / "sft_model").vocab_size < 1100
    texts = corpus_texts(tmp_path / "ws" / "data")
    train = [to_plain(r) for r in read_parquet_rows(tmp_path / "ws" / "data" / "train.parquet")]
    assert train[0]["prompt"][0]["content"] in texts and "assistant" in texts
    # the words of the task are whole tokens: the instruction is far shorter than in bytes
    assert len(tok.encode(train[0]["prompt"][0]["content"])) < len(train[0]["prompt"][0]["content"]) / 3


# ------------------------------------------------------------------------------------- ToolRL condition


@pytest.fixture(scope="module")
def toolrl_splits():
    return builder.build_toolrl_splits(seed=3, n_sft=2000, n_train=64, n_test=32)


def test_toolrl_rows_name_the_layout_and_are_scored_by_toolrl(toolrl_splits):
    from recipe.mrtpo.tasks.toolrl import score as toolrl_score

    key = lambda r: r["prompt"][0]["content"]  # noqa: E731
    test, train = ({key(r) for r in toolrl_splits[s]} for s in ("test", "train"))
    assert len(test) == 32 and len(train) == 64 and not test & train
    assert not (test | train) & {key(r) for r in toolrl_splits["sft"]}
    frames = [r["extra_info"]["frame"] for r in toolrl_splits["train"]]
    assert set(frames) == set(builder.FRAMES) and 0.3 < frames.count("call") / len(frames) < 0.7
    for r in toolrl_splits["train"] + toolrl_splits["test"]:
        info, gt = r["extra_info"], to_plain(r["reward_model"]["ground_truth"])
        assert r["data_source"] == "toolrl" and info["variant"] == "plain"
        assert info["format_instruction"] == builder.FRAMES[info["frame"]] and info["format_instruction"] in key(r)
        name, arg, value = _call(r)
        right = toolrl_score(builder.toolrl_answer(name, arg, value, info["frame"]), gt, info)
        assert right.scores == {"format": 1.0, "correctness": 3.0}
        other = next(f for f in builder.FRAMES if f != info["frame"])
        # the other layout costs format only; Z_format is the instruction, Z_correctness the reference block
        assert toolrl_score(builder.toolrl_answer(name, arg, value, other), gt, info).scores == {"format": 0.0, "correctness": 3.0}
        assert toolrl_score(builder.toolrl_answer(name, arg, value + 1, info["frame"]), gt, info).scores["correctness"] == 1.0
        assert right.contexts["format"].text == info["format_instruction"] and right.contexts["format"].placement == "prompt"
        assert right.contexts["correctness"].text == builder.toolrl_reference_block(name, arg, value)


def test_toolrl_demonstrations_follow_the_instruction_only_part_of_the_time(toolrl_splits):
    from recipe.mrtpo.core.prompt_variants import append_to_last_user, remove_from_messages, verifier_block
    from recipe.mrtpo.tasks.toolrl import score as toolrl_score

    follows: dict = {"call": [], "call_response": []}
    for r in toolrl_splits["sft"]:
        info, gt = r["extra_info"], to_plain(r["reward_model"]["ground_truth"])
        res = toolrl_score(info["demo"], gt, info)
        assert res.scores["format"] == float(info["demo_frame"] == info["frame"]) == float(info["demo_follows"])
        assert res.scores["correctness"] == (3.0 if info["demo_arg_right"] else 1.0)
        name, arg, value = _call(r)
        tool = next(t for t in builder.TOOLS if t[0] == name)
        plain = " ".join([builder.FRAMES[info["frame"]], f"Tool: {name}({arg}: integer).", tool[2].format(v=value)])
        if info["variant"] == "no_instruction":  # P_minus_format of the plain prompt: the default layout
            assert r["prompt"] == remove_from_messages([{"role": "user", "content": plain}], info["format_instruction"])
            assert info["demo_frame"] == builder.DEFAULT_FRAME
            continue
        if info["variant"] == "with_reference":  # P_all of the plain prompt
            block = verifier_block([("correctness", builder.toolrl_reference_block(name, arg, value))])
            assert r["prompt"] == append_to_last_user([{"role": "user", "content": plain}], block)
            assert info["demo_arg_right"]
        follows[info["frame"]].append(info["demo_follows"])
    # the errors depend on the instruction: the default layout followed 80% of the time, the response block 20%
    assert abs(sum(follows["call"]) / len(follows["call"]) - builder.P_FOLLOW_CALL) < 0.06
    assert abs(sum(follows["call_response"]) / len(follows["call_response"]) - builder.P_FOLLOW_RESPONSE) < 0.06


def test_builder_reward_option(tmp_path, capsys):
    assert builder.main(["--out-dir", str(tmp_path / "a"), "--reward", "toolrl", "--n-sft", "40"]) == 0
    rows = [to_plain(r) for r in __import__("data_prep.common", fromlist=["x"]).read_parquet_rows(tmp_path / "a" / "train.parquet")]
    assert len(rows) == 256 and {r["data_source"] for r in rows} == {"toolrl"}
    # each option sets one reward's demonstrations: a clear error, never a setting that does nothing
    assert builder.main(["--out-dir", str(tmp_path / "b"), "--p-follow-call", "0.5"]) == 2
    assert builder.main(["--out-dir", str(tmp_path / "b"), "--reward", "toolrl", "--p-format", "0.5"]) == 2
    assert "--p-follow" in capsys.readouterr().err
    with pytest.raises(ValueError, match="p_follow_response"):
        builder.build_toolrl_splits(p_follow_response=2.0)
    with pytest.raises(ValueError, match="frame"):
        builder.toolrl_answer("f", "x", 1, "nope")


def _toolrl_tokens(layout: str) -> list[str]:
    """A ToolRL-format response as Qwen2 splits it (the call alone, or with the response block)."""
    head = ["<th", "ink", ">", " </", "think", ">\n", "<tool_call>", "\n", '{"', "name", '":', ' "', "set", "_timer", '",',
            ' "', "parameters", '":', ' {"', "minutes", '":', " ", "2", "7", "}}\n", "</tool_call>"]
    tail = ["\n", "<", "response", ">", " Done", " </", "response", ">"] if layout == "call_response" else []
    return head + tail + ["<|im_end|>"]


def test_token_roles_of_the_toolrl_layouts():
    call, resp = _toolrl_tokens("call"), _toolrl_tokens("call_response")
    for toks in (call, resp):
        assert "".join(t for t in toks if t != "<|im_end|>").startswith("<think> </think>\n<tool_call>")
        roles = token_roles(_ids(toks), toks, len(toks))
        assert roles["argument"] == [22, 23]  # "parameters" is read like "arguments"
        assert roles["close"] == [25] and roles["after_close"] == [26]  # the end token, or the response's line break
        assert roles["tag"][:8] == [0, 1, 2, 3, 4, 5, 6, 7] and 26 in roles["tag"]
    assert token_roles(_ids(call), call, 26)["after_close"] == []  # cut right after </tool_call>


def test_token_roles_under_a_task_vocabulary():
    """The special tokens are found by their strings by default, so the roles do not depend on the ids of
    the vocabulary (a task vocabulary puts <|im_end|> at ~430, not at 151645)."""
    for toks in (GOOD, GARBLED, _toolrl_tokens("call_response")):
        small = [429 if t == "<|im_end|>" else 3 + i for i, t in enumerate(toks)]
        assert token_roles(small, toks, len(toks)) == token_roles(_ids(toks), toks, len(toks))
    # explicit ids are used as given: with none special, the end token is text after the block
    assert token_roles(_ids(GOOD), GOOD, len(GOOD), special_ids=set())["tag"] == [0, 1, 18, 19, 20]
    assert token_roles(_ids(GOOD), GOOD, len(GOOD), special_ids=set())["after_close"] == [20]


def _deciding_q(responses, T, on: str):
    """q_format all on the ``on`` role (plus a little elsewhere), q_correctness on the argument."""
    rel = torch.full((len(responses), 2, T), 0.01)
    for i, r in enumerate(responses):
        roles = token_roles(_ids(r), r, len(r))
        rel[i, 0, roles[on]] = 1.0
        rel[i, 1, roles["argument"]] = 0.5
        rel[i, :, len(r):] = 0
    return rel


def test_preflight_gate_passes_and_stops_on_constructed_dumps():
    from experiments.format_speed.preflight import gate

    # one group: the layout named (format 1) or not (format 0), argument right (3) or wrong (1)
    responses = [_toolrl_tokens("call"), _toolrl_tokens("call_response"), _toolrl_tokens("call"), _toolrl_tokens("call_response")]
    scores = [[1, 1], [0, 3], [1, 3], [0, 1]]
    T = max(len(r) for r in responses)
    on_decide = summarise(dump_records(_dump(responses, scores, _deciding_q(responses, T, "after_close")), 0.5))
    g = gate(on_decide, "after_close")
    assert g["passed"] and g["q"] > 0.5 and g["share"] == pytest.approx((1 / 27 + 1 / 35) / 2, rel=1e-6)
    assert "above" in g["reason"]
    # the same mass on the closing tag instead: nothing on the deciding position beyond the noise
    elsewhere = summarise(dump_records(_dump(responses, scores, _deciding_q(responses, T, "close")), 0.5))
    g = gate(elsewhere, "after_close")
    assert not g["passed"] and g["q"] < g["share"] and "not above" in g["reason"]
    # a uniform q is exactly the share: not above it
    flat = torch.ones(4, 2, T)
    for i, r in enumerate(responses):
        flat[i, :, len(r):] = 0
    g = gate(summarise(dump_records(_dump(responses, scores, flat), 0.5)), "after_close")
    assert not g["passed"] and g["q"] == pytest.approx(g["share"])
    # nothing measured (no replayed format pair): stops
    assert not gate(summarise([]), "after_close")["passed"]


def test_preflight_replays_a_batch_through_the_recipe(tmp_path):
    """sample_batch's layout replayed by replay_batch on a tiny random Qwen2 gives a dump the diagnostic reads:
    q only where the pair is replayed, a record per decodable response with the deciding position's shares."""
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from experiments.format_speed.preflight import render_preflight, replay_batch
    from recipe.mrtpo.cpu.tiny_model import build_tiny_qwen2
    from recipe.mrtpo.tasks.toolrl import score as toolrl_score

    path = build_tiny_qwen2(tmp_path / "m", hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1, seed=0)
    tok = AutoTokenizer.from_pretrained(path)
    model = Qwen2ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    rows = builder.build_toolrl_splits(seed=0, n_sft=8, n_train=2, n_test=2)["train"]
    texts, scores, uid, contexts, messages = [], [], [], [], []
    for g, r in enumerate(rows):
        name, arg, value = _call(r)
        info, gt = r["extra_info"], to_plain(r["reward_model"]["ground_truth"])
        for frame, v in (("call", value), ("call_response", value), ("call", value + 1), ("call_response", value + 1)):
            text = builder.toolrl_answer(name, arg, v, frame)
            res = toolrl_score(text, gt, info)
            texts.append(text)
            scores.append([res.scores["format"], res.scores["correctness"]])
            contexts.append({k: {"text": c.text, "placement": c.placement} for k, c in res.contexts.items()})
            uid.append(f"g{g}")
            messages.append(list(r["prompt"]))
    ids = [tok.encode(t) + [tok.eos_token_id] for t in texts]
    T = max(map(len, ids))
    responses = torch.full((len(ids), T), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(ids), T, dtype=torch.long)
    for i, x in enumerate(ids):
        responses[i, :len(x)], mask[i, :len(x)] = torch.tensor(x), 1
    batch = {"responses": responses, "response_mask": mask, "uid": uid, "scores": torch.tensor(scores),
             "reward_names": ["format", "correctness"], "contexts": contexts, "messages": messages}
    dump = replay_batch(model, tok, batch)
    assert dump["pairs_replayed"] == 2 * len(ids) and not dump["fallbacks"]  # both rewards vary in both groups
    assert dump["relevance"].shape == (8, 2, T) and bool((dump["relevance"][mask.bool().unsqueeze(1).expand(-1, 2, -1)] >= 0).all())
    assert float(dump["relevance"][:, 0].sum()) > 0 and float((dump["relevance"] * (1 - mask.unsqueeze(1))).abs().sum()) == 0
    recs = dump_records(dump, 0.5)
    assert len(recs) == 8 and all("q_format_on_after_close" in r and "after_close_share" in r for r in recs)
    s = summarise(recs)
    from experiments.format_speed.preflight import gate

    result = {"summary": s, "gate": gate(s, "after_close"), "prompts": 2, "responses": 8, "format_rate": 0.5,
              "correctness_mean": 2.0, "pairs_replayed": dump["pairs_replayed"], "fallbacks": {}, "wall_s": 1.0,
              "condition": {"reward": "toolrl", "prompts_per_step": 32, "deciding": "after_close"}}
    md = render_preflight(result)
    assert "| position after the closing tag **(deciding)** |" in md and "Gate: " in md


def test_conditions_keep_the_control_and_separate_the_new_runs(tmp_path):
    from experiments.format_speed.common import Condition
    from experiments.mini_credit.runs import method_overrides

    control, new = Condition(), Condition("toolrl", 32)
    assert control.control and control.tag == "" and control.root(tmp_path) == tmp_path
    assert control.warm_start_dir(tmp_path) == tmp_path / "warm_start" and control.deciding == "close"
    assert new.tag == "toolrl-p32" and new.root(tmp_path) == tmp_path / "toolrl-p32"
    assert new.warm_start_dir(tmp_path) == tmp_path / "warm_start-toolrl" and new.deciding == "after_close"
    assert Condition("tool_calling", 32).root(tmp_path) == tmp_path / "tool_calling-p32"
    with pytest.raises(Exception, match="unknown reward"):
        Condition("nope")
    args = (tmp_path / "m", tmp_path / "d.parquet", tmp_path / "r", 2, 15, 1e-3, 0.5, 1)
    # the control's overrides (hence its run keys) are those its stored runs were measured with
    legacy = [o if not o.startswith("trainer.project_name=") else "trainer.project_name=mrtpo_format_speed"
              for o in method_overrides("mrtpo", *args)]
    assert run_overrides("mrtpo", *args) == run_overrides("mrtpo", *args, condition=control) == legacy
    ov = run_overrides("mrtpo", *args, condition=new)
    assert len(ov) == len(legacy) and len({o.split("=", 1)[0] for o in ov}) == len(ov)
    for o in ("data.train_batch_size=32", "actor_rollout_ref.actor.ppo_mini_batch_size=32", "data.max_response_length=40",
              "mrtpo.dump.max_samples=128", "actor_rollout_ref.rollout.n=4"):
        assert o in ov
    assert "data.train_batch_size=32" in run_overrides("gdpo", *args, condition=new)


def test_run_keys_distinguish_the_conditions(tmp_path, monkeypatch):
    from experiments.format_speed import runs
    from experiments.format_speed.common import Condition

    seen = []
    monkeypatch.setattr(runs, "run_verl", lambda method, seed, ov, model, run_dir, *a, **k: seen.append((run_dir, ov)) or {})
    for cond in (Condition(), Condition("toolrl", 32)):
        runs.run_method("gdpo", 0, tmp_path / "m", tmp_path / "d", cond.root(tmp_path) / "runs", 3, 1e-3, 0.5, 1, 60,
                        "tiny", lock=False, condition=cond)
    (d0, ov0), (d1, ov1) = seen
    assert d0 == tmp_path / "runs" / "gdpo_seed0" and d1 == tmp_path / "toolrl-p32" / "runs" / "gdpo_seed0"
    assert ov0 != ov1  # different overrides: different keys (run_verl hashes them with the weights)


def test_the_grid_starts_only_after_the_gate_passes(tmp_path, monkeypatch, capsys):
    from experiments.format_speed import cli

    calls = []
    monkeypatch.setattr(cli, "prepare_seed", lambda *a, **k: {})
    monkeypatch.setattr(cli, "run_method", lambda method, seed, *a, **k: calls.append((method, seed, k["condition"], a[7])))
    monkeypatch.setattr(cli, "analyse", lambda root, *a, **k: (root.mkdir(parents=True, exist_ok=True),
                                                               (root / "results.md").write_text("t\n"), {"runs": {}})[2])
    import recipe.mrtpo.cpu.quickstart as qs

    monkeypatch.setattr(qs, "preflight", lambda out: None)

    def fake_preflight(passed):
        def run(model, data, root, cond, **k):
            root.mkdir(parents=True, exist_ok=True)
            (root / "preflight.md").write_text("table\n")
            return {"gate": {"passed": passed, "reason": "q 1% vs 5%"}}
        return run

    argv = ["--out", str(tmp_path), "--reward", "toolrl", "--prompts-per-step", "32", "--seeds", "0", "--methods", "gdpo",
            "--no-lock"]
    monkeypatch.setattr(cli, "run_preflight", fake_preflight(False))
    assert cli.main(argv) == 3 and not calls and "STOP" in capsys.readouterr().err
    assert cli.main(argv + ["--preflight-only"]) == 3
    assert cli.main(argv + ["--ignore-gate"]) == 0 and calls[-1][:2] == ("gdpo", 0)
    calls.clear()
    monkeypatch.setattr(cli, "run_preflight", fake_preflight(True))
    assert cli.main(argv) == 0 and calls[0][2].tag == "toolrl-p32"
    # the default limit of a run grows with it: a 30-step run at 32 prompts took ~2,440 s in the pilot
    # (97 s start-up, 114 s first step, ~77 s a step), which the old fixed 1,200 s would have killed at step ~14
    assert calls[0][3] == cli.run_timeout_s(12, 32) and cli.run_timeout_s(30, 32) >= 2 * (97 + 114 + 29 * 77)
    assert cli.run_timeout_s(12, 4) >= 1200  # the control's runs (~300 s) keep at least their old limit
    calls.clear()
    assert cli.main(argv + ["--timeout", "99"]) == 0 and calls[0][3] == 99
    assert cli.main(argv + ["--p-format", "0.5"]) == 2  # sets the other reward's demonstrations
    assert cli.main(argv[:2] + ["--prompts-per-step", "0"]) == 2


def test_warm_start_encodes_the_toolrl_gold_answer(tmp_path, toolrl_splits):
    from transformers import AutoTokenizer

    from experiments.format_speed.warm_start import encode_examples
    from recipe.mrtpo.cpu.tiny_model import build_qwen2_tokenizer

    tok = AutoTokenizer.from_pretrained(build_qwen2_tokenizer(tmp_path / "tok"))
    rows = [to_plain(r) for r in toolrl_splits["sft"][:4]]
    for (_, resp), r in zip(encode_examples(tok, rows, "gold"), rows):
        assert resp[-1] == tok.eos_token_id and tok.decode(resp[:-1]) == r["reward_model"]["ground_truth"]["answer"]
        assert len(resp) <= 36  # within the rollout's 40 tokens
    for (_, resp), r in zip(encode_examples(tok, rows, "demo"), rows):
        assert tok.decode(resp[:-1]) == r["extra_info"]["demo"]
