"""The BFCL multi-turn task against BFCL's own multi-turn checker (bfcl-eval, pinned), called directly here.

- every gold answer of the shipped set (4 categories x 200) scores 1 on every reward, and BFCL's
  ``multi_turn_checker`` accepts the same decoded calls;
- corrupted gold records (a dropped call, a wrong argument, an extra call, an unknown function, a call in a
  turn that wants none; ``benchmarks/bench_multi_turn_agreement.corruptions``) get the checker's verdict and
  error type, on a declared subset: every 10th scenario of each category (80 questions; the benchmark runs
  all 800);
- the call-format rule, the gate in front of BFCL's ``eval``, hostile records, the time limit.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest

from data_prep.multi_turn import gold_record, multi_turn_row
from recipe.mrtpo.tasks import get_task
from recipe.mrtpo.tasks.multi_turn import verifier as V
from recipe.mrtpo.tasks.multi_turn.calls import REFUSED_CALL, call_error, executable_calls, parse_call
from recipe.mrtpo.tasks.multi_turn.official import CATEGORIES, load_category, method_names
from recipe.mrtpo.tasks.multi_turn.trajectory import parse_trajectory

pytestmark = pytest.mark.timeout(900)

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
from bench_multi_turn_agreement import corruptions  # noqa: E402

SUBSET_EVERY = 10  # the declared subset of the corruption check: scenarios 0, 10, ..., 190 of each category


@pytest.fixture(scope="module")
def items():
    """``{id: (entry, gold, row)}`` of the whole shipped multi-turn set."""
    out = {}
    for c in CATEGORIES:
        for entry, gold in load_category(c):
            out[entry["id"]] = (entry, gold, multi_turn_row(entry, gold, c))
    return out


def bfcl_checker(decoded, gold, entry) -> dict:
    """BFCL's ``multi_turn_checker`` itself on a fresh model name; its cached instances removed after."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    name = "test_" + uuid.uuid4().hex
    try:
        return multi_turn_checker(decoded, gold, entry, entry["id"].rsplit("_", 1)[0], name)
    finally:
        for k in [k for k in vars(multi_turn_utils) if k.startswith(name)]:
            del vars(multi_turn_utils)[k]


def bfcl_irrelevance(decoded, gold) -> dict:
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_irrelevance_checker

    return multi_turn_irrelevance_checker(decoded, gold)


def score(record, row):
    return V.score(record, row["reward_model"]["ground_truth"], row["extra_info"])


# --------------------------------------------------------------------------------------------------
# agreement with the official checker
# --------------------------------------------------------------------------------------------------


def test_the_shipped_set_is_the_four_categories_of_200(items):
    assert Counter(e["id"].rsplit("_", 1)[0] for e, _, _ in items.values()) == {
        f"multi_turn_{c}": 200 for c in CATEGORIES}


def test_every_gold_answer_scores_full_marks_and_bfcl_accepts_it(items):
    full, with_irrelevance = 0, 0
    for qid, (entry, gold, row) in items.items():
        decoded = [[calls] if calls else [] for calls in gold]
        assert bfcl_checker(decoded, gold, entry) == {"valid": True}, qid
        result = score(gold_record(gold), row)
        expected_keys = {"state", "response", "format"} | ({"irrelevance"} if any(not g for g in gold) else set())
        assert set(result.scores) == expected_keys, qid
        assert all(v == 1.0 for v in result.scores.values()), (qid, result.scores, result.info)
        assert result.info["bfcl_valid"] is True and result.info["refused_calls"] == 0
        assert all(c.placement == "appended" for c in result.contexts.values())
        full += 1
        with_irrelevance += "irrelevance" in result.scores
    assert full == 800
    assert with_irrelevance == 404  # every miss_func / miss_param question and 2 each of base, long_context


def test_gold_played_one_call_per_step_with_chatter_between_still_scores_full_marks(items):
    for qid in ("multi_turn_base_0", "multi_turn_miss_func_3", "multi_turn_long_context_7", "multi_turn_miss_param_9"):
        entry, gold, row = items[qid]
        record = {"turns": [{"steps": [*[{"text": f"<tool_call>{c}</tool_call>", "calls": [c], "error": None} for c in calls],
                                       {"text": "Done.", "calls": [], "error": None}]} for calls in gold]}
        decoded = parse_trajectory(record).decoded()
        assert decoded == [[[c] for c in calls] for calls in gold]
        assert bfcl_checker(decoded, gold, entry) == {"valid": True}
        assert all(v == 1.0 for v in score(record, row).scores.values()), qid


def test_corrupted_records_get_the_checkers_verdict_and_error_type(items):
    seen: Counter = Counter()
    for qid, (entry, gold, row) in items.items():
        if int(qid.rsplit("_", 1)[1]) % SUBSET_EVERY:
            continue
        for kind, turns in corruptions(gold).items():
            record = gold_record(turns)
            decoded = parse_trajectory(record).decoded()
            verdict, irrelevance = bfcl_checker(decoded, gold, entry), bfcl_irrelevance(decoded, gold)
            result = score(record, row)
            where = (qid, kind, verdict.get("error_type"), result.scores, result.info)
            assert result.info["bfcl_valid"] == verdict["valid"], where
            assert result.info["bfcl_error_type"] == verdict.get("error_type"), where
            assert (result.scores["state"] == 1.0 and result.scores["response"] == 1.0) == verdict["valid"], where
            if verdict.get("error_type") == "multi_turn:instance_state_mismatch":
                assert result.scores["state"] == 0.0, where
            if verdict.get("error_type") in ("multi_turn:execution_response_mismatch", "multi_turn:empty_turn_model_response"):
                assert result.scores["response"] == 0.0, where
            if "irrelevance" in result.scores:
                assert result.scores["irrelevance"] == float(irrelevance["valid"]), where
            # the unknown function is the only format defect among the corruptions
            assert result.scores["format"] == (0.0 if kind == "unknown_function" else 1.0), where
            seen[(kind, verdict.get("error_type", "valid"))] += 1
            seen[("irrelevance", irrelevance["valid"])] += 1
    # the subset exercises every verdict the checker can give on these corruptions
    kinds = {k for k, _ in seen}
    assert {"dropped_call", "wrong_argument", "extra_call", "unknown_function", "call_in_no_call_turn"} <= kinds
    errors = {e for _, e in seen}
    assert {"multi_turn:instance_state_mismatch", "multi_turn:execution_response_mismatch",
            "multi_turn:empty_turn_model_response", "valid", True, False} <= errors


def test_the_contexts_name_what_the_checker_found(items):
    entry, gold, row = items["multi_turn_miss_func_0"]
    ok = score(gold_record(gold), row)
    assert ok.contexts["state"].text == V.STATE_OK and ok.contexts["response"].text == V.RESPONSE_OK
    assert ok.contexts["format"].text == V.FORMAT_OK
    assert "turn 2" in ok.contexts["irrelevance"].text  # the miss_func turn of this question
    bad = [list(t) for t in gold]
    bad[0] = ["cd(folder='document')", "mkdir(dir_name='temp')"]  # the move is dropped
    result = score(gold_record(bad), row)
    assert result.scores["state"] == 0.0
    assert "GorillaFileSystem" in result.contexts["state"].text and "after turn 0" in result.contexts["state"].text
    assert result.scores["response"] == 0.0 and "turn 0" in result.contexts["response"].text
    bad[0] = ["cd(folder='document')", "mkdir(dir_name='temp')", "mv(source='final_report.pdf', destination='temp')",
              "rm_everything()"]
    result = score(gold_record(bad), row)
    assert result.scores["format"] == 0.0 and "rm_everything" in result.contexts["format"].text
    assert all(len(c.text) <= V.MAX_CONTEXT_CHARS for c in result.contexts.values())


def test_the_task_is_registered_and_reads_parquet_values(items, tmp_path):
    from data_prep.common import read_parquet_rows, write_parquet
    from recipe.mrtpo.tasks import to_plain

    _, gold, row = items["multi_turn_miss_param_4"]
    write_parquet([row], tmp_path / "x.parquet")
    back = read_parquet_rows(tmp_path / "x.parquet")[0]
    fn = get_task(back["data_source"])
    assert fn is V.score
    result = fn(json.dumps(gold_record(gold)), to_plain(back["reward_model"]["ground_truth"]), to_plain(back["extra_info"]))
    assert all(v == 1.0 for v in result.scores.values())


# --------------------------------------------------------------------------------------------------
# the format rule and the gate
# --------------------------------------------------------------------------------------------------

DOCS = {"f": {"name": "f", "parameters": {"type": "object", "required": ["a"],
                                           "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}},
        "g": {"name": "g", "parameters": {"type": "object", "properties": {}}}}


@pytest.mark.parametrize("call, ok", [
    ("f(a='x')", True), ("f('x')", True), ("f('x', 3)", True), ("f(a='x', b=3)", True), (" f(b=1, a='x') ", True),
    ("g()", True), ("f(a=1)", True),  # types are not the format's business (BFCL's own gold breaks them)
    ("f()", False), ("f('x', 1, 2)", False), ("f('x', a='y')", False), ("f(a='x', a='y')", False),
    ("f(a='x', c=1)", False), ("h(a='x')", False), ("f(a=x)", False), ("f(a='x'+'y')", False),
    ("f(*['x'])", False), ("f(**{'a': 'x'})", False), ("o.f(a='x')", False), ("f(a='x')(1)", False),
    ("f(a='x'); g()", False), ("[f(a='x')]", False), ("f(a='x'", False), ("", False), ("f", False),
    ("f(a='" + "x" * 20_000 + "')", False), ("f(a=" + "[" * 500 + "]" * 500 + ")", False),
])
def test_call_format_rule(call, ok):
    assert (call_error(call, DOCS) is None) == ok, call_error(call, DOCS)


def test_parse_call_keeps_literal_values_and_never_evaluates():
    c = parse_call("mv(source='a.txt', destination=['x', (1, 2.5, None, True)])")
    assert (c.name, c.args, c.kwargs) == ("mv", (), (("source", "a.txt"), ("destination", ["x", (1, 2.5, None, True)])))
    assert call_error(123, DOCS) == "not a string (int)"


def test_the_gate_passes_backend_methods_and_unresolvable_names_and_refuses_the_rest():
    methods = method_names(["GorillaFileSystem", "MathAPI"])
    assert {"cd", "ls", "mv", "power", "square_root"} <= methods
    calls = ["cd(folder='x')", "power(base=2, exponent=3)", "nonexistent_function(x=1)", "open(file='/etc/passwd')",
             "exec('import os')", "__import__('os').system('true')", "cd(folder=__file__)", "re(x=1)", "cd(folder='x'",
             "mrtpo_x()", "eval('1')"]
    out, refused = executable_calls(calls, methods)
    assert out[:3] == calls[:3]
    assert out[3:] == [REFUSED_CALL] * 8 and refused == 8


def test_hostile_calls_never_run(items, tmp_path):
    entry, gold, row = items["multi_turn_base_15"]  # GorillaFileSystem and MathAPI
    target = tmp_path / "pwned"
    evil = [f"open(file={str(target)!r}, mode='w')", f"__import__('os').system('touch {target}')",
            f"exec(\"open({str(target)!r}, 'w')\")", "getattr(cd, '__globals__')", "globals()", "breakpoint()",
            "cd(folder=open('/etc/passwd').read())", "print(x=1)", "exit()"]
    record = gold_record(gold)
    record["turns"][0]["steps"].insert(0, {"text": "", "calls": evil, "error": None})
    result = score(record, row)
    assert not target.exists()
    assert result.info["refused_calls"] == len(evil) and result.scores["format"] == 0.0
    assert result.scores["state"] == 1.0 and result.scores["response"] == 1.0  # refused calls change nothing


# --------------------------------------------------------------------------------------------------
# hostile records
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("record", [
    None, "", "not json", "[]", {"turns": "x"}, {"turns": [{"steps": [{"text": 1}]}]}, {"turns": [], "x": 1},
    {"turns": [{"steps": [{"text": "", "calls": ["ls()", None]}]}]}, b"\xff\xfe", "[" * 100_000,
    {"turns": [{"steps": [{"text": "", "calls": ["ls()"], "error": "x"}]}]},
])
def test_malformed_records_score_zero_with_a_counted_reason(items, record):
    _, gold, row = items["multi_turn_miss_func_0"]
    before = V.REASON_COUNTS["malformed_record"]
    result = score(record, row)
    assert set(result.scores) == {"state", "response", "format", "irrelevance"}
    assert all(v == 0.0 for v in result.scores.values())
    assert set(result.info["errors"]) == set(result.scores)
    assert V.REASON_COUNTS["malformed_record"] == before + 1


def test_a_wrong_number_of_turns_is_bfcls_force_termination(items):
    _, gold, row = items["multi_turn_base_0"]
    record = gold_record(gold[:-1])
    result = score(record, row)
    assert result.info["bfcl_error_type"] == "multi_turn:force_terminated"
    assert result.scores == {"state": 0.0, "response": 0.0, "format": 1.0}
    assert set(result.info["errors"]) == {"state", "response"}


def test_undecodable_steps_cost_format_only(items):
    _, gold, row = items["multi_turn_base_0"]
    record = gold_record(gold)
    record["turns"][1]["steps"].insert(0, {"text": "<tool_call>{oops", "calls": [], "error": "JSONDecodeError"})
    result = score(record, row)
    assert result.scores == {"state": 1.0, "response": 1.0, "format": 0.0}
    assert "turn 1 step 0: did not decode" in result.contexts["format"].text


def test_a_call_that_runs_too_long_is_stopped_and_the_checker_recovers(items, monkeypatch):
    entry, gold, row = items["multi_turn_base_15"]  # MathAPI: power() of two big integers never ends
    monkeypatch.setattr(V, "DEFAULT_TIMEOUT_S", 3.0)
    record = gold_record(gold)
    record["turns"][0]["steps"].insert(0, {"text": "", "calls": ["power(base=99999999, exponent=99999999999)"],
                                           "error": None})
    before = V.REASON_COUNTS["checker_unavailable"]
    result = score(record, row)
    assert result.scores["state"] == 0.0 and result.scores["response"] == 0.0 and result.scores["format"] == 1.0
    assert "timeout" in result.info["errors"]["state"]
    assert V.REASON_COUNTS["checker_unavailable"] == before + 1
    again = score(gold_record(gold), row)  # a fresh child answers the next trajectory
    assert all(v == 1.0 for v in again.scores.values())


def test_a_malformed_row_is_a_data_bug(items):
    _, gold, row = items["multi_turn_base_0"]
    with pytest.raises(ValueError):
        V.score(gold_record(gold), row["reward_model"]["ground_truth"], None)
    with pytest.raises(ValueError):
        V.score(gold_record(gold), {"turns": "not json"}, row["extra_info"])
    with pytest.raises(ValueError):
        V.score(gold_record(gold), row["reward_model"]["ground_truth"], {"id": "x"})


# --------------------------------------------------------------------------------------------------
# the hostile corpus (tests/hostile/multi_turn_corpus.py)
# --------------------------------------------------------------------------------------------------


def _corpus() -> list[str]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("_mt_corpus", REPO / "tests" / "hostile" / "multi_turn_corpus.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.call_corpus()


def test_the_gate_and_the_format_rule_survive_the_corpus():
    corpus = _corpus()
    assert len(corpus) >= 150
    methods = method_names(["GorillaFileSystem", "MathAPI"])
    docs = {n: {"name": n, "parameters": {"type": "object", "properties": {}}} for n in methods}
    out, refused = executable_calls(corpus, methods)
    assert refused >= 100
    import builtins

    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    passed_names = set()
    for original, passed in zip(corpus, out):
        call_error(original, docs)  # never raises
        if passed != REFUSED_CALL:
            # what reaches BFCL's eval is one literal-argument call of a backend method or of a name that eval
            # cannot resolve (NameError before anything runs)
            call = parse_call(passed)
            assert call.name in methods or (not hasattr(builtins, call.name) and call.name not in vars(multi_turn_utils))
            passed_names.add(call.name)
    assert {"cd", "ls", "mkdir", "echo", "nonexistent_function", "GorillaFileSystem"} <= passed_names
    assert not passed_names & {"open", "exec", "eval", "print", "exit", "globals", "re", "json", "copy", "importlib"}


def test_the_verifier_survives_the_corpus_in_bounded_time_and_runs_nothing(items, tmp_path, monkeypatch):
    import time

    monkeypatch.chdir(tmp_path)
    entry, gold, row = items["multi_turn_base_15"]  # GorillaFileSystem and MathAPI
    corpus = _corpus()
    one_per_step = gold_record(gold)
    one_per_step["turns"][0]["steps"][:0] = [{"text": c[:100], "calls": [c], "error": None} for c in corpus]
    all_in_one = gold_record(gold)
    all_in_one["turns"][1]["steps"].insert(0, {"text": "", "calls": corpus, "error": None})
    start = time.monotonic()
    for record in (one_per_step, all_in_one, json.dumps(one_per_step)):
        result = score(record, row)
        assert result.scores["format"] == 0.0 and result.info["refused_calls"] >= 100
        assert "errors" not in result.info, result.info  # the checker answered in time
        assert all(len(c.text) <= V.MAX_CONTEXT_CHARS for c in result.contexts.values())
    assert time.monotonic() - start < 120
    assert not (tmp_path / "PWNED").exists() and not (REPO / "PWNED").exists()


def test_the_agreement_benchmark_prints_its_table(capsys):
    import bench_multi_turn_agreement as bench

    assert bench.main(["--every", "100", "--categories", "base,miss_func"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("category") and [line.split("|")[0].strip() for line in out[2:4]] == ["base", "miss_func"]
    totals = json.loads(out[-2])
    assert totals["questions"] == 4 and totals["gold_full_marks"] == 4 and totals["agreed"] == totals["cases"] > 4
    assert out[-1].startswith(f"agreement: {totals['agreed']}/{totals['cases']} cases")
