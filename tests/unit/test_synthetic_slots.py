"""The synthetic-slots task and the miniature credit-assignment experiment, without any verl run:

- the verifier (``recipe.mrtpo.tasks.synthetic_slots``): each slot scored on its own field only, first
  occurrence wins, hostile input never raises, Z_k = the field's request sentence, found in the prompt;
- the builder (``data_prep.synthetic_slots``): byte-identical files for the same seed, disjoint splits,
  demonstrations right at the asked rate and always well-formed;
- the localisation metric (``experiments.mini_credit.localisation``) on hand-made relevance dumps with known answers;
- the SFT warm start's training step on a few examples lowers the loss (a tiny stand-in model);
- the per-method verl overrides and the results table built from a hand-made run folder.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from data_prep import synthetic_slots as builder
from experiments.mini_credit.cli import main as experiment_main
from experiments.mini_credit.common import ExperimentError
from experiments.mini_credit.localisation import localisation_records, read_positions, summarise_localisation
from experiments.mini_credit.results import analyse
from experiments.mini_credit.runs import method_overrides
from experiments.mini_credit.warm_start import encode_sft_examples, response_vocabulary, sft_loss, sft_train
from recipe.mrtpo.core.prompt_variants import remove_from_messages
from recipe.mrtpo.tasks import get_task
from recipe.mrtpo.tasks.base import RewardResult
from recipe.mrtpo.tasks.synthetic_slots import (
    VALUES,
    answer_text,
    find_slot,
    parse_ground_truth,
    prompt_text,
    request_sentence,
    score_synthetic_slots,
    slot_value_spans,
)

GT = {"fields": [{"name": "A", "value": "3"}, {"name": "B", "value": "5"}, {"name": "C", "value": "8"}],
      "order": ["B", "C", "A"]}
IM_END = 151645  # a special token: the reward manager decodes with skip_special_tokens=True


# ------------------------------------------------------------------------------------------- verifier


def test_registered_under_its_data_source():
    assert get_task("synthetic_slots") is score_synthetic_slots


def test_correct_answer_scores_every_slot_and_contexts_are_request_sentences():
    res = score_synthetic_slots("Form: B=5 C=8 A=3", GT)
    assert isinstance(res, RewardResult)
    assert res.scores == {"slot_A": 1.0, "slot_B": 1.0, "slot_C": 1.0}
    assert {k: (c.text, c.placement) for k, c in res.contexts.items()} == {
        "slot_A": ("Set A=3.", "prompt"), "slot_B": ("Set B=5.", "prompt"), "slot_C": ("Set C=8.", "prompt")}


@pytest.mark.parametrize("response,expected", [
    ("Form: B=4 C=8 A=3", {"slot_A": 1.0, "slot_B": 0.0, "slot_C": 1.0}),  # one wrong field: only its reward
    ("Form: B=5 C=7 A=3", {"slot_A": 1.0, "slot_B": 1.0, "slot_C": 0.0}),
    ("Form: B=5 C=8 A=2", {"slot_A": 0.0, "slot_B": 1.0, "slot_C": 1.0}),
    ("A=3 B=5 C=8", {"slot_A": 1.0, "slot_B": 1.0, "slot_C": 1.0}),  # order is not scored
    ("Form: B=5 C=8", {"slot_A": 0.0, "slot_B": 1.0, "slot_C": 1.0}),  # missing field
    ("Form: A=2 B=5 C=8 A=3", {"slot_A": 0.0, "slot_B": 1.0, "slot_C": 1.0}),  # the first A= counts
    ("Form: A=33 B=55 C=8", {"slot_A": 0.0, "slot_B": 0.0, "slot_C": 1.0}),  # the whole number is compared
    ("Form: BA=3 CB=5", {"slot_A": 0.0, "slot_B": 0.0, "slot_C": 0.0}),  # labels must stand alone
    ("Form: B = 5\tC =8 A=\t3", {"slot_A": 1.0, "slot_B": 1.0, "slot_C": 1.0}),  # blanks around '=' allowed
    ("Form: A=٣ B=５ C=8", {"slot_A": 0.0, "slot_B": 0.0, "slot_C": 1.0}),  # non-ASCII digits are not digits
    ("", {"slot_A": 0.0, "slot_B": 0.0, "slot_C": 0.0}),
])
def test_each_slot_reads_only_its_field(response, expected):
    assert score_synthetic_slots(response, GT).scores == expected


@pytest.mark.parametrize("response", [None, b"Form: B=5 \xff C=8 A=3", "\x00" * 10, "A=" * 50_000, "🙂" * 1000,
                                      "=" * 1000 + "9" * 1000, 12345, ["A=3"], "\ud800A=3"])
def test_hostile_responses_never_raise_and_score_finitely(response):
    res = score_synthetic_slots(response, GT)
    assert set(res.scores) == {"slot_A", "slot_B", "slot_C"}
    assert all(math.isfinite(v) and v in (0.0, 1.0) for v in res.scores.values())


def test_bytes_are_decoded():
    assert score_synthetic_slots(b"Form: B=5 \xff C=8 A=3", GT).scores == {"slot_A": 1.0, "slot_B": 1.0, "slot_C": 1.0}


@pytest.mark.parametrize("bad", [None, {}, {"fields": [{"name": "A"}]}, {"fields": [{"name": "Z", "value": "1"}]},
                                 {"fields": [{"name": "A", "value": "x"}]},
                                 {"fields": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]},
                                 {"fields": [{"name": "A", "value": "1"}], "order": ["B"]}])
def test_malformed_ground_truth_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="synthetic_slots"):
        score_synthetic_slots("A=1", bad)


def test_slot_value_spans_point_at_the_compared_digits():
    text = "Form: B=5 C=81 A=3"
    spans = slot_value_spans(text, "ABCD")
    assert {k: text[a:b] for k, (a, b) in ((k, v) for k, v in spans.items() if v)} == {"A": "3", "B": "5", "C": "81"}
    assert spans["D"] is None
    assert find_slot(text, "C") == ("81", (12, 14))


# -------------------------------------------------------------------------------------------- builder


@pytest.fixture(scope="module")
def splits():
    return builder.build_splits(seed=3, n_slots=3, n_sft=600, n_train=40, n_test=20, p_correct=0.5)


def test_builder_is_deterministic_and_seeded(tmp_path, splits):
    assert builder.build_splits(seed=3, n_slots=3, n_sft=600, n_train=40, n_test=20, p_correct=0.5) == splits
    assert builder.build_splits(seed=4, n_slots=3, n_sft=600, n_train=40, n_test=20, p_correct=0.5) != splits
    args = ["--seed", "1", "--n-sft", "50", "--n-train", "10", "--n-test", "5"]
    assert builder.main(["--out-dir", str(tmp_path / "a"), *args]) == 0
    assert builder.main(["--out-dir", str(tmp_path / "b"), *args]) == 0
    for name in ("sft.parquet", "train.parquet", "test.parquet"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_splits_are_disjoint_and_rows_well_formed(splits):
    assert [len(splits[s]) for s in ("test", "train", "sft")] == [20, 40, 600]
    keys = {s: [r["prompt"][0]["content"] for r in rows] for s, rows in splits.items()}
    assert len(set(keys["test"])) == 20 and len(set(keys["train"])) == 40
    assert not set(keys["test"]) & set(keys["train"])
    assert not (set(keys["test"]) | set(keys["train"])) & set(keys["sft"])
    for rows in splits.values():
        for r in rows:
            assert r["data_source"] == "synthetic_slots"
            fields, order = parse_ground_truth(r["reward_model"]["ground_truth"])
            assert all(v in VALUES[n] for n, v in fields)
            content = r["prompt"][0]["content"]
            assert content == prompt_text(r["reward_model"]["ground_truth"]["fields"], order,
                                          r["extra_info"]["request_order"], r["extra_info"]["preamble"])
            assert content.endswith(f" Fill in the form in this order: {', '.join(order)}.")
            for n, v in fields:  # every Z_k is in the prompt verbatim, and the replay can remove it
                minus = remove_from_messages(r["prompt"], request_sentence(n, v))
                assert minus is not None and request_sentence(n, v) not in minus[0]["content"]
                assert all(request_sentence(m, w) in minus[0]["content"] for m, w in fields if m != n)


def test_demonstrations_are_right_at_the_asked_rate(splits):
    right, total = 0, 0
    for r in splits["sft"]:
        demo = r["extra_info"]["demo"]
        gt = r["reward_model"]["ground_truth"]
        # well-formed: the requested layout, each value from its field's range
        fields, order = parse_ground_truth(gt)
        assert demo.startswith("Form: ") and [f.split("=")[0] for f in demo.split()[1:]] == order
        assert all(find_slot(demo, n)[0] in VALUES[n] for n, _ in fields)
        scores = score_synthetic_slots(demo, gt).scores
        right += sum(scores.values())
        total += len(scores)
    assert abs(right / total - 0.5) < 0.05  # 1800 fields: sd 0.012
    for p, want in ((1.0, 1.0), (0.0, 0.0)):
        rows = builder.build_splits(seed=0, n_sft=50, n_train=1, n_test=1, p_correct=p)["sft"]
        assert all(score_synthetic_slots(r["extra_info"]["demo"], r["reward_model"]["ground_truth"]).scores
                   == {k: want for k in ("slot_A", "slot_B", "slot_C")} for r in rows)


def test_gold_answer_scores_one(splits):
    for r in splits["train"]:
        fields, order = parse_ground_truth(r["reward_model"]["ground_truth"])
        assert set(score_synthetic_slots(answer_text(dict(fields), order), r["reward_model"]["ground_truth"]).scores.values()) == {1.0}


def test_builder_reports_impossible_requests(tmp_path, capsys):
    assert builder.main(["--out-dir", str(tmp_path), "--slots", "1", "--n-train", "50"]) == 2
    assert "could not draw" in capsys.readouterr().err
    with pytest.raises(ValueError, match="slots"):
        builder.build_splits(n_slots=4)


# ---------------------------------------------------------------------------------------- localisation


def _dump(responses: list[list[tuple[int, str]]], relevance: torch.Tensor, replayed: torch.Tensor,
          names=("slot_A", "slot_B", "slot_C")) -> dict:
    """A dump shaped like the trainer's (``MRTPOTrainer._maybe_dump``) for hand-written (id, text) tokens."""
    T = max(len(r) for r in responses)
    ids = torch.full((len(responses), T), 151643)
    mask = torch.zeros(len(responses), T)
    tokens = []
    for i, r in enumerate(responses):
        ids[i, : len(r)] = torch.tensor([t for t, _ in r])
        mask[i, : len(r)] = 1
        tokens.append([s for _, s in r] + ["<|endoftext|>"] * (T - len(r)))
    return {"step": 2, "reward_names": list(names), "relevance": relevance, "replayed": replayed,
            "response_mask": mask, "response_ids": ids, "response_tokens": tokens}


# "Form: B=5 C=8 A=3<|im_end|>" as the tokenizer splits it (ids arbitrary but not special)
FORM = [(1, "Form"), (2, ":"), (3, " B"), (4, "="), (5, "5"), (6, " C"), (4, "="), (7, "8"), (8, " A"), (4, "="),
        (9, "3"), (IM_END, "<|im_end|>")]


def test_read_positions_are_the_value_tokens():
    ids, toks = [t for t, _ in FORM], [s for _, s in FORM]
    assert [read_positions(ids, toks, len(FORM), x) for x in "ABCD"] == [[10], [4], [7], []]
    # a special token inside the text is skipped (the verifier never sees it), multi-token values count whole
    ids2, toks2 = [1, 8, 4, IM_END, 9, 9], ["Form", " A", "=", "<|im_end|>", "1", "2"]
    assert read_positions(ids2, toks2, 6, "A") == [4, 5]
    assert read_positions(ids2, toks2, 5, "A") == [4]  # only the valid prefix is read


def test_localisation_records_on_a_hand_made_dump():
    T = len(FORM)
    rel = torch.zeros(2, 3, T)
    rel[0, 0, 10] = 0.6  # slot_A: 0.6 of 1.0 on A's digit, the argmax
    rel[0, 0, 0] = 0.4
    rel[0, 1, 4] = 0.1  # slot_B: 0.1 of 0.5 on B's digit, the argmax is elsewhere
    rel[0, 1, 7] = 0.4
    rel[0, 2, :] = 0.5  # slot_C: not replayed (no group variance): ignored
    rel[1, 0, :5] = 1.0  # second response lacks the A field: absent
    replayed = torch.tensor([[True, True, False], [True, False, False]])
    short = FORM[:5] + [(IM_END, "<|im_end|>")]  # "Form: B=5"
    recs = localisation_records(_dump([FORM, short], rel, replayed))
    by = {(r["sample"], r["reward"]): r for r in recs}
    assert set(by) == {(0, "slot_A"), (0, "slot_B"), (1, "slot_A")}
    a, b, gone = by[(0, "slot_A")], by[(0, "slot_B")], by[(1, "slot_A")]
    assert a["precision"] == pytest.approx(0.6) and a["chance"] == pytest.approx(1 / 12) and a["top1"]
    assert b["precision"] == pytest.approx(0.2) and not b["top1"]
    assert a["cross"] == 0 and b["cross"] == pytest.approx(0.8)  # B's mass on C's value token leaked
    assert gone["absent"] and "precision" not in gone
    s = summarise_localisation(recs)
    assert s["pairs"] == 2 and s["absent"] == 1
    assert s["precision"] == pytest.approx(0.4) and s["top1"] == pytest.approx(0.5)
    assert s["cross"] == pytest.approx(0.4)
    assert s["per_reward"]["slot_A"]["precision"] == pytest.approx(0.6)
    assert s["per_reward"]["slot_A"]["absent"] == 1


def test_dumps_without_relevance_or_mass_give_nothing():
    rel = torch.zeros(1, 3, len(FORM))
    d = _dump([FORM], rel, torch.ones(1, 3, dtype=torch.bool))
    assert localisation_records(d) == []  # zero q mass everywhere
    d["relevance"] = None
    assert localisation_records(d) == []  # warm-up step / non-replay method
    assert summarise_localisation([])["precision"] is None


# ------------------------------------------------------------------------------------------------- SFT


def _toy_model(vocab=64):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=1, num_key_value_heads=1, head_dim=32, tie_word_embeddings=True,
                      max_position_embeddings=64, initializer_range=0.2)  # frozen random embeddings must be usable
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).float()


def _toy_examples(n=24, seed=0):
    rng = random.Random(seed)  # the response copies the prompt's last two tokens: learnable
    out = []
    for _ in range(n):
        p = [rng.randrange(10, 60) for _ in range(rng.randrange(3, 7))]
        out.append((p, [p[-1], p[-2], 1]))
    return out


@pytest.mark.parametrize("restricted,train_embeddings", [(True, False), (False, True)])  # phases 1-2, phase 3
def test_sft_steps_lower_the_loss(restricted, train_embeddings):
    model, ex = _toy_model(), _toy_examples()
    vocab = response_vocabulary(ex) if restricted else None
    with torch.no_grad():
        before = float(sft_loss(model, ex, 0, vocab))
    emb_before = model.get_input_embeddings().weight.detach().clone()
    losses = sft_train(model, ex, steps=40, batch_size=8, lr=1e-2, pad_id=0, vocab=vocab,
                          train_embeddings=train_embeddings)
    with torch.no_grad():
        after = float(sft_loss(model, ex, 0, vocab))
    assert len(losses) == 40 and all(math.isfinite(v) for v in losses)
    assert after < 0.7 * before, (before, after)
    assert torch.equal(model.get_input_embeddings().weight, emb_before) != train_embeddings  # frozen or not...
    assert model.get_input_embeddings().weight.requires_grad  # ...and handed back trainable
    assert not model.training


def test_sft_loss_counts_response_tokens_only():
    model = _toy_model()
    ex = [([5, 6, 7], [8, 1]), ([9, 10], [11, 12, 1])]
    with torch.no_grad():
        logits = model(torch.tensor([[5, 6, 7, 8]])).logits[0]
        want = torch.nn.functional.cross_entropy(logits[2:4], torch.tensor([8, 1]))
        assert float(sft_loss(model, ex[:1], 0)) == pytest.approx(float(want), rel=1e-5)
    with pytest.raises(ExperimentError, match="outside"):
        sft_loss(model, ex, 0, vocab=[8, 1])


@pytest.fixture(scope="module")
def qwen_tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from recipe.mrtpo.cpu.tiny_model import build_qwen2_tokenizer

    return AutoTokenizer.from_pretrained(build_qwen2_tokenizer(tmp_path_factory.mktemp("tok")))


def test_sft_examples_match_the_rollout_prompt_and_end_with_eos(qwen_tokenizer, splits):
    tok = qwen_tokenizer
    rows = splits["sft"][:3]
    demo, gold = encode_sft_examples(tok, rows, "demo"), encode_sft_examples(tok, rows, "gold")
    for r, (p, y), (p2, g) in zip(rows, demo, gold):
        assert p == p2 == tok.apply_chat_template(list(r["prompt"]), add_generation_prompt=True, tokenize=True)["input_ids"]
        assert y[-1] == g[-1] == tok.eos_token_id
        assert tok.decode(y[:-1]) == r["extra_info"]["demo"]
        assert set(score_synthetic_slots(tok.decode(g[:-1]), r["reward_model"]["ground_truth"]).scores.values()) == {1.0}
    # every field is " X", "=", digit: one token each (what "the token a reward reads" relies on)
    assert [tok.decode([t]) for t in tok.encode("Form: B=5 C=8 A=3")] == ["Form", ":", " B", "=", "5", " C", "=", "8", " A", "=", "3"]
    with pytest.raises(ExperimentError, match="demo"):
        encode_sft_examples(tok, splits["train"][:1], "demo")


# ---------------------------------------------------------------------------------- runs and the table


def test_method_overrides(tmp_path):
    def ov(method):
        return method_overrides(method, tmp_path / "m", tmp_path / "d.parquet", tmp_path / "run", seed=7, steps=5,
                                   lr=1e-3, beta=0.5, warmup=1)

    for method, est in (("grpo", "grpo"), ("gdpo", "gdpo"), ("mrtpo", "mrtpo"), ("shuffle", "mrtpo")):
        o = ov(method)
        assert f"algorithm.adv_estimator={est}" in o and "trainer.total_training_steps=5" in o
        assert "actor_rollout_ref.rollout.seed=7" in o
        # only the knobs the method reads (the registry's): others would be refused before Ray starts
        assert ("mrtpo.warmup_steps=1" in o) == ("mrtpo.beta=0.5" in o) == (method in ("mrtpo", "shuffle"))
        assert ("mrtpo.seed=7" in o) == (method == "shuffle")
        assert ("mrtpo.shuffle=True" in o) == (method == "shuffle")
        assert ("mrtpo.dump.every_n_steps=1" in o) == (method in ("mrtpo", "shuffle"))
        keys = [x.split("=", 1)[0] for x in o]
        assert len(keys) == len(set(keys)), "an override is given twice"
    with pytest.raises(ExperimentError, match="unknown method"):
        ov("ppo")


def _fake_run(runs: Path, method: str, seed: int, rewards: dict[str, list[float]], dump=None):
    from verl.utils.logger.aggregate_logger import concat_dict_to_str

    d = runs / f"{method}_seed{seed}"
    d.mkdir(parents=True)
    n = len(next(iter(rewards.values())))
    lines = [concat_dict_to_str({f"mrtpo/reward/{k}/mean": v[i] for k, v in rewards.items()}, step=i + 1) for i in range(n)]
    (d / "main_mrtpo.log").write_text("\n".join(lines) + "\n")
    (d / "run.json").write_text(json.dumps({"method": method, "task": "synthetic_slots", "seed": seed, "model": "toy"}))
    (d / "result.json").write_text(json.dumps({"ok": True, "log": str(d / "main_mrtpo.log"), "wall_s": 1.0}))
    if dump is not None:
        (d / "relevance_dumps").mkdir()
        torch.save(dump, d / "relevance_dumps" / "step_000002.pt")


def test_analyse_writes_the_table_from_runs(tmp_path):
    rel = torch.zeros(1, 3, len(FORM))
    rel[0, 0, 10], rel[0, 0, 0] = 0.75, 0.25
    dump = _dump([FORM], rel, torch.tensor([[True, False, False]]))
    _fake_run(tmp_path / "runs", "gdpo", 0, {"slot_A": [0.5, 0.6, 0.9, 0.9], "slot_B": [0.4, 0.5, 0.5, 0.6]})
    _fake_run(tmp_path / "runs", "gdpo", 1, {"slot_A": [0.5, 0.9, 0.9, 0.7], "slot_B": [0.5, 0.5, 0.6, 0.6]})
    _fake_run(tmp_path / "runs", "mrtpo", 0, {"slot_A": [0.5, 0.9, 0.9, 1.0], "slot_B": [0.5, 0.5, 0.5, 0.5]}, dump)
    (tmp_path / "runs" / "mrtpo_seed0" / "relevance_dumps" / "step_000003.pt").write_bytes(b"PK\x03\x04 cut short")
    logged = []
    res = analyse(tmp_path, ["gdpo", "mrtpo"], [0, 1], threshold=0.8, final_window=2, log=logged.append)
    assert res["runs"]["mrtpo_seed0"]["dumps_unreadable"] == 1 and any("step_000003.pt" in m for m in logged)
    t = res["table"]
    assert t["gdpo"]["seeds"] == 2 and t["mrtpo"]["seeds"] == 1
    assert t["gdpo"]["final"]["slot_A"][0] == pytest.approx((0.9 + 0.8) / 2)
    # reached: the mean of the last 2 steps >= 0.8 (seed 0: 0.55, 0.75, 0.9; seed 1: 0.7, 0.9, 0.8)
    assert t["gdpo"]["reach"]["slot_A"]["per_seed"] == [4, 3] and t["gdpo"]["reach"]["slot_A"]["mean"] == 3.5
    assert t["gdpo"]["reach"]["slot_B"]["mean"] is None and t["gdpo"]["localisation"] is None
    assert t["mrtpo"]["reach"]["slot_A"]["per_seed"] == [3]  # 0.9 at step 2 alone is not "reached"
    # gain: final mean - start mean over the slots, per seed (0.725 - 0.5, 0.7 - 0.6)
    assert t["gdpo"]["gain_mean"][0] == pytest.approx((0.225 + 0.1) / 2)
    assert t["gdpo"]["gain_per_seed"] == pytest.approx({"0": 0.225, "1": 0.1})
    assert t["mrtpo"]["localisation"]["precision"][0] == pytest.approx(0.75)
    md = (tmp_path / "results.md").read_text()
    assert "| gdpo | 2 | 0.85 ± 0.07 |" in md and "not reached (0/2)" in md and "| gdpo | +0.225 | +0.100 |" in md and "| 75.0 | 0.0 | 8.3 | 100.0 |" in md
    assert (tmp_path / "localisation.png").read_bytes()[:4] == b"\x89PNG"
    assert list((tmp_path / "report").glob("curves__*.png")) and list((tmp_path / "report").glob("threshold__*.png"))


def test_analyse_only_exits_nonzero_when_a_run_failed(tmp_path, capsys):
    _fake_run(tmp_path / "runs", "gdpo", 0, {"slot_A": [0.5, 0.6], "slot_B": [0.4, 0.5]})
    _fake_run(tmp_path / "runs", "grpo", 0, {"slot_A": [0.5, 0.6], "slot_B": [0.4, 0.5]})
    res = tmp_path / "runs" / "grpo_seed0" / "result.json"
    res.write_text(json.dumps({**json.loads(res.read_text()), "ok": False}))
    argv = ["--out", str(tmp_path), "--seeds", "0", "--methods", "gdpo", "grpo", "--analyse-only", "--final-window", "1"]
    assert experiment_main(argv) == 1
    assert "grpo_seed0" in capsys.readouterr().err
    md = (tmp_path / "results.md").read_text()
    assert "| gdpo | 1 |" in md and "| grpo | 0 |" in md  # written, the failed run left out
    res.write_text(json.dumps({**json.loads(res.read_text()), "ok": True}))
    assert experiment_main(argv) == 0


def test_experiment_runs_as_a_module():
    res = subprocess.run([sys.executable, "-m", "experiments.mini_credit", "--help"], cwd=Path(__file__).resolve().parents[2],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("usage: python -m experiments.mini_credit ")
    for flag in ("--out", "--seeds", "--steps", "--methods", "--threshold", "--prepare-only", "--analyse-only"):
        assert flag in res.stdout
