"""The BFCL multi-turn data builder: row fields from the installed bfcl-eval, the declared scenario split, the
offline set, deterministic bytes."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from data_prep import multi_turn as MT
from data_prep.common import hash_unit, read_parquet_rows, sha256_file
from recipe.mrtpo.tasks.multi_turn.official import function_docs, load_category


@pytest.fixture(scope="module")
def rows():
    built, read = MT.build_rows()
    assert read == 800
    return built


@pytest.fixture(scope="module")
def entries():
    return {e["id"]: (e, g) for c in MT.CATEGORIES for e, g in load_category(c)}


def test_every_question_becomes_a_row(rows):
    assert len(rows) == 800
    assert {r["extra_info"]["category"] for r in rows} == set(MT.CATEGORIES)
    for r in rows:
        assert r["data_source"] == "bfcl_multi_turn" and r["agent_name"] == MT.AGENT_NAME
        assert r["ability"] == "tool_calling_multi_turn"


def test_row_fields_are_bfcls_question(rows, entries):
    from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC

    assert MT.ADDED_FUNCTIONS_MESSAGE == DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
    for r in rows:
        x = r["extra_info"]
        entry, gold = entries[x["id"]]
        assert json.loads(r["reward_model"]["ground_truth"]["turns"]) == gold
        # same values and the same key order (BFCL's file system takes the first key under "root")
        assert json.dumps(json.loads(x["initial_config"])) == json.dumps(entry["initial_config"])
        assert x["involved_classes"] == entry["involved_classes"]
        assert x["scenario"] == int(entry["id"].rsplit("_", 1)[1]) and x["num_turns"] == len(gold)
        turns = json.loads(x["user_turns"])
        assert len(turns) == len(entry["question"])
        assert r["prompt"] == [{"role": "system", "content": "You are a helpful assistant."}, *turns[0]]
        held = entry.get("missed_function", {})
        for t, messages in enumerate(turns):
            if str(t) in held:
                assert entry["question"][t] == [] and messages == [{"role": "user", "content": MT.ADDED_FUNCTIONS_MESSAGE}]
            else:
                assert messages == entry["question"][t]
        docs = function_docs(entry["involved_classes"])
        tools = json.loads(x["tools"])
        added = json.loads(x["missed_function"])
        held_names = {n for names in held.values() for n in names}
        assert [t["function"]["name"] for t in tools] == [d["name"] for d in docs if d["name"] not in held_names]
        assert {k: [t["function"]["name"] for t in v] for k, v in added.items()} == held
        assert all(t["type"] == "function" for t in tools)


def test_tool_types_are_json_schema(rows):
    seen = set()
    for r in rows[:50]:
        for t in json.loads(r["extra_info"]["tools"]):
            for p in t["function"]["parameters"]["properties"].values():
                seen.add(p["type"])
            assert t["function"]["parameters"]["type"] == "object"
    assert seen <= {"string", "integer", "number", "boolean", "array", "object"} and "number" in seen


def test_the_split_is_by_scenario_stratified_by_backends_and_follows_the_hash_rule(rows):
    by_scenario = defaultdict(set)
    for r in rows:
        by_scenario[r["extra_info"]["scenario"]].add(r["extra_info"]["split"])
    assert len(by_scenario) == 200 and all(len(s) == 1 for s in by_scenario.values())  # no scenario in both
    strata = defaultdict(list)
    for r in rows:
        if r["extra_info"]["category"] == "base":
            strata[",".join(sorted(r["extra_info"]["involved_classes"]))].append(r["extra_info"]["scenario"])
    for scenarios in strata.values():  # re-stated rule: per stratum, the round(n/2) lowest hashes are test
        ranked = sorted(scenarios, key=lambda i: (hash_unit(0, str(i)), str(i)))
        n_test = int(round(MT.DEFAULT_TEST_FRACTION * len(ranked)))
        assert {i for i in ranked[:n_test]} == {i for i in ranked if by_scenario[i] == {"test"}}
    other = MT.scenario_splits([e for e, _ in load_category("base")], seed=1, test_fraction=0.5)
    assert other != {i: next(iter(s)) for i, s in by_scenario.items()}


def test_the_offline_set_is_a_few_short_questions_of_both_splits(rows):
    off = MT.offline_rows(rows)
    assert len(off) == 9
    assert sorted((r["extra_info"]["category"], r["extra_info"]["split"]) for r in off) == sorted(
        [(c, "train") for c in ("base", "miss_func", "miss_param") for _ in range(2)]
        + [(c, "test") for c in ("base", "miss_func", "miss_param")])
    assert max(r["extra_info"]["num_turns"] for r in off) <= 3
    assert any(json.loads(r["extra_info"]["missed_function"]) for r in off)  # a miss_func injection is covered


def test_cli_writes_the_offline_set_deterministically(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert MT.main(["--out-dir", str(a), "--offline"]) == 0
    assert MT.main(["--out-dir", str(b), "--offline"]) == 0
    assert "== data card: bfcl_multi_turn (offline set) ==" in capsys.readouterr().out
    for split, n in (("train", 6), ("test", 3)):
        assert sha256_file(a / f"{split}.parquet") == sha256_file(b / f"{split}.parquet")
        back = read_parquet_rows(a / f"{split}.parquet")
        assert len(back) == n and [r["extra_info"]["index"] for r in back] == list(range(n))
    assert MT.main(["--out-dir", str(a), "--categories", "nope"]) == 2


def test_a_malformed_question_is_reported_not_fatal(entries):
    entry, gold = entries["multi_turn_miss_func_0"]
    broken = dict(entry, missed_function={"2": ["no_such_function"]})
    with pytest.raises(ValueError, match="not documented"):
        MT.multi_turn_row(broken, gold, "miss_func")
    with pytest.raises(ValueError, match="gold turns"):
        MT.multi_turn_row(entry, gold[:-1], "miss_func")
