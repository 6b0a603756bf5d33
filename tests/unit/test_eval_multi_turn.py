"""The multi-turn evaluation (``python -m recipe.mrtpo.tools.eval --task bfcl_multi_turn``;
``recipe/mrtpo/tools/eval/multi_turn.py``): BFCL's multi-turn questions played through the training's agent
loop, scored by BFCL's checker.

CPU only, on the offline multi-turn set (built here by ``data_prep.multi_turn --offline``: one test
question each of base, miss_func, miss_param). The transformers path runs end to end on the tiny random
Qwen2 (its tokenizer given a chat template that renders ``tools=``: the loop refuses one that does not).
A scripted generator that writes BFCL's gold calls as the model writes them pins the metrics through the
whole path (parquet -> agent loop -> trajectory record -> BFCL's checker -> JSON): every question passes
BFCL's verdict; the same generator answering without calls fails exactly the questions whose gold calls.
vLLM's path is checked against a stand-in ``vllm`` module (no engine is started), through the loop.
"""

from __future__ import annotations

import importlib.machinery
import inspect
import json
import math
import sys
import types
from pathlib import Path

import pytest

bfcl_eval = pytest.importorskip("bfcl_eval", reason="bfcl-eval is installed by run_scripts/setup.sh")

from data_prep import multi_turn as MTB  # noqa: E402
from recipe.mrtpo.tools.eval import harness as E  # noqa: E402
from recipe.mrtpo.tools.eval import multi_turn as MT  # noqa: E402
from recipe.mrtpo.tools.eval.metrics import aggregate  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TASK = "bfcl_multi_turn"
# a Qwen2.5-style tools block in front of the tiny model's ChatML template (Qwen2.5's own renders tools= so)
TOOLS_BLOCK = (
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags.<|im_end|>\\n' }}{%- endif %}"
)
IM_END = 151645


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mt_data")
    assert MTB.main(["--out-dir", str(out), "--offline"]) == 0
    return out / "test.parquet"


@pytest.fixture(scope="module")
def tools_model(tmp_path_factory) -> Path:
    """The tiny random Qwen2 with a chat template that renders ``tools=``."""
    from transformers import AutoTokenizer

    from recipe.mrtpo.cpu.tiny_model import CHATML_TEMPLATE, build_tiny_qwen2

    assert (REPO / ".assets" / "qwen" / "qwen.tiktoken").exists(), "run `bash run_scripts/setup.sh`"
    path = build_tiny_qwen2(tmp_path_factory.mktemp("tiny") / "model")
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = TOOLS_BLOCK + CHATML_TEMPLATE
    tok.save_pretrained(path)
    return path


def _args(model, data: Path, out: Path, *extra: str):
    argv = ["--task", TASK, "--model", str(model), "--data", str(data), "--out", str(out), "--backend", "hf", *extra]
    return E.build_parser().parse_args(argv)


def _items(data: Path):
    return E.load_items(data, TASK)


def _gold(item) -> list[list[str]]:
    """The item's gold calls per turn (the row's ``{"turns": JSON}``)."""
    turns = item.ground_truth["turns"]
    return json.loads(turns) if isinstance(turns, str) else turns


# --------------------------------------------------------------------------------------------------
# the transformers path, end to end
# --------------------------------------------------------------------------------------------------


def test_transformers_path_end_to_end(data, tools_model, tmp_path):
    out = tmp_path / "mt.json"
    args = _args(tools_model, data, out, "--max-new-tokens", "6", "--temperature", "1.0", "--response-length", "2048")
    result = E.run_eval(args)
    assert json.loads(out.read_text()) == result
    items = _items(data)
    assert result["n"] == len(items) == 3 and result["stats"]["generated"] == 3
    assert result["config"]["response_length"] == 2048 and result["config"]["on_decode_error"] == "end_turn"
    for rec, item in zip(result["items"], items):
        assert rec["id"] == item.id and rec["category"] == item.category
        traj, loop = rec["trajectory"], rec["loop"]
        n_turns = item.extra_info["num_turns"]
        assert 1 <= len(traj["turns"]) <= n_turns and loop["turns"] == n_turns
        steps = sum(len(t["steps"]) for t in traj["turns"])
        assert steps == loop["steps"] and 0 < rec["n_tokens"] <= 6 * steps
        spans = loop["spans"]
        assert sum(e - s for kind, s, e, *_ in spans if kind == "model") == rec["n_tokens"]
        keys = {"state", "response", "format", "bfcl_valid"}
        assert keys <= set(rec["scores"]) <= keys | {"irrelevance"}
        assert ("irrelevance" in rec["scores"]) == any(not g for g in _gold(item))
        # BFCL's verdict is 1 exactly when state and response both are
        assert rec["scores"]["bfcl_valid"] == float(rec["scores"]["state"] == rec["scores"]["response"] == 1.0)
    m = result["metrics"]
    assert m["n_responses"] == 3 and set(m["by_category"]) == {"base", "miss_func", "miss_param"}
    for key in ("accuracy", "state_rate", "response_rate", "format_rate", "accuracy_category_mean"):
        assert isinstance(m[key], float) and math.isfinite(m[key]) and 0.0 <= m[key] <= 1.0, key
    assert sum(m["loop_ends"].values()) == sum(m["bfcl_error_types"].values()) == 3
    # resumed: nothing generated again, the records reused as they are
    again = E.run_eval(args)
    assert again["stats"]["generated"] == 0 and again["stats"]["reused"] == 3 and again["items"] == result["items"]


# --------------------------------------------------------------------------------------------------
# a scripted generator through the real loop: gold calls pass BFCL's verdict, no calls fail it
# --------------------------------------------------------------------------------------------------


def _gold_text(extra_info: dict, calls: list[str]) -> str:
    """BFCL gold call strings as the model writes calls (Qwen's <tool_call> JSON), positional arguments
    named by the backend method's signature."""
    import ast

    from recipe.mrtpo.agent.bfcl_env import BFCLEnv, parse_entry

    env = BFCLEnv(parse_entry(extra_info))
    blocks = []
    for c in calls:
        node = ast.parse(c, mode="eval").body
        args = [ast.literal_eval(a) for a in node.args]
        kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
        bound = inspect.signature(env.methods[node.func.id]).bind(*args, **kwargs)
        blocks.append("<tool_call>\n" + json.dumps({"name": node.func.id, "arguments": dict(bound.arguments)})
                      + "\n</tool_call>")
    return "\n".join(blocks)


class ScriptedGenerator:
    """A token-level generator that plays each question's gold: at a user turn it writes that turn's gold
    calls (or a plain answer where the gold makes none), after tool results a plain answer. The question is
    told from the user turns in the prompt; ``calls=False`` never calls."""

    def __init__(self, tok, items, calls: bool = True):
        self.tok, self.items, self.calls = tok, items, calls
        self.sampling = E.SamplingConfig(n=1)
        self.prompts = 0

    def _reply(self, text: str) -> str:
        blocks = text.split("<|im_start|>")[1:]
        last = blocks[-2]  # the block before the generation prompt
        if "<tool_response>" in last or not self.calls:
            return "Done."
        users = [b[len("user\n"):].rsplit("<|im_end|>", 1)[0] for b in blocks
                 if b.startswith("user\n") and "<tool_response>" not in b]
        turn = len(users) - 1
        # base and miss_func copies of a scenario share their first turn: the tools offered tell them apart
        offered = {json.loads(x)["function"]["name"] for x in text.split("<tools>")[1].split("</tools>")[0].split("\n") if x}
        golds = set()
        for it in self.items:
            turns = json.loads(it.extra_info["user_turns"])
            tools = {t["function"]["name"] for t in json.loads(it.extra_info["tools"])}
            if tools == offered and len(turns) > turn and all(turns[t][-1]["content"] in users[t] for t in range(turn + 1)):
                golds.add(json.dumps(_gold(it)[turn]) + "\x00" + it.id)
        assert len(golds) == 1, f"{len(golds)} questions have user turns {users}"
        gold, item_id = sorted(golds)[0].split("\x00")
        gold = json.loads(gold)
        item = next(it for it in self.items if it.id == item_id)
        return _gold_text(item.extra_info, gold) if gold else "Done."

    def generate_ids(self, prompts, max_tokens):
        self.prompts += len(prompts)
        outs = []
        for p, m in zip(prompts, max_tokens):
            ids = self.tok.encode(self._reply(self.tok.decode(p)), add_special_tokens=False) + [IM_END]
            outs.append(ids[:m])
        return outs


@pytest.fixture(scope="module")
def tools_tok(tools_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tools_model)


def test_gold_calls_through_the_loop_pass_bfcls_verdict_and_no_calls_fail_it(data, tools_model, tools_tok, tmp_path):
    items = _items(data)
    gold = ScriptedGenerator(tools_tok, items)
    result = E.run_eval(_args(tools_model, data, tmp_path / "gold.json", "--on-decode-error", "feedback"),
                        generator_factory=lambda a, b: gold)
    m = result["metrics"]
    assert m["accuracy"] == m["state_rate"] == m["response_rate"] == m["format_rate"] == 1.0, m
    assert m["irrelevance_rate"] == 1.0 and m["n_irrelevance"] >= 2  # miss_func and miss_param have no-call turns
    assert m["bfcl_error_types"] == {"none": 3} and m["loop_ends"] == {"completed": 3}
    assert all(g["accuracy"] == 1.0 for g in m["by_category"].values()) and m["accuracy_category_mean"] == 1.0
    assert result["config"]["on_decode_error"] == "feedback"
    for rec in result["items"]:
        assert rec["loop"]["calls"] > 0 and rec["finished"]

    silent = ScriptedGenerator(tools_tok, items, calls=False)
    result = E.run_eval(_args(tools_model, data, tmp_path / "silent.json"), generator_factory=lambda a, b: silent)
    for rec in result["items"]:
        assert rec["scores"]["bfcl_valid"] == 0.0  # every offline question's gold makes a call somewhere
        assert rec["info"]["bfcl_error_type"] == "multi_turn:empty_turn_model_response"
        assert rec["scores"]["format"] == 1.0 and rec["loop"]["calls"] == 0
    assert result["metrics"]["accuracy"] == 0.0
    assert result["metrics"]["bfcl_error_types"] == {"multi_turn:empty_turn_model_response": 3}


@pytest.fixture()
def patient(monkeypatch):
    """Batches go only when every running trajectory waits (no wall-clock flush): batch sizes then do not
    depend on the machine's load."""
    monkeypatch.setattr(MT, "_WAIT_S", 3600.0)


def test_running_trajectories_share_generation_batches(data, tools_model, tools_tok, patient):
    items = _items(data)
    gen = ScriptedGenerator(tools_tok, items)
    runner = MT.MultiTurnRunner(gen, response_length=4096, max_step_tokens=None, on_decode_error="end_turn",
                                model_type="qwen2")
    gens = runner.generate_items(items)
    assert [len(g) for g in gens] == [1, 1, 1]
    assert sum(runner.batches) == gen.prompts and max(runner.batches) == 3  # the three first steps go together
    assert runner.knobs["on_decode_error"] == "end_turn" and runner.knobs["max_steps_per_turn"] == 20


def test_a_generator_error_reaches_the_caller(data, tools_model, tools_tok):
    class Broken(ScriptedGenerator):
        def generate_ids(self, prompts, max_tokens):
            raise RuntimeError("device lost")

    runner = MT.MultiTurnRunner(Broken(tools_tok, []), 1024, None, "end_turn", model_type="qwen2")
    with pytest.raises(RuntimeError, match="device lost"):
        runner.generate_items(_items(data))


def test_a_template_without_tools_is_refused_with_the_item(data, tools_model, tmp_path):
    from transformers import AutoTokenizer

    from recipe.mrtpo.cpu.tiny_model import CHATML_TEMPLATE

    tok = AutoTokenizer.from_pretrained(tools_model)
    tok.chat_template = CHATML_TEMPLATE
    runner = MT.MultiTurnRunner(ScriptedGenerator(tok, []), 1024, None, "end_turn", model_type="qwen2")
    with pytest.raises(E.EvalError, match="renders nothing for tools="):
        runner.generate_items(_items(data)[:1])


# --------------------------------------------------------------------------------------------------
# vLLM's path, with a stand-in module
# --------------------------------------------------------------------------------------------------


def _fake_vllm(calls: dict, reply_ids: list[int]) -> types.ModuleType:
    mod = types.ModuleType("vllm")
    mod.__spec__ = importlib.machinery.ModuleSpec("vllm", None)

    class SamplingParams:
        def __init__(self, **kwargs):
            calls.setdefault("sampling", []).append(kwargs)
            self.kwargs = kwargs

    class LLM:
        def __init__(self, **kwargs):
            calls["llm"] = kwargs

        def generate(self, prompts, params, use_tqdm=True):
            calls.setdefault("batches", []).append((prompts, [p.kwargs["max_tokens"] for p in params]))
            ns = types.SimpleNamespace
            return [ns(outputs=[ns(text="", token_ids=reply_ids[: p.kwargs["max_tokens"]], finish_reason="stop")])
                    for p in params]

    mod.SamplingParams, mod.LLM = SamplingParams, LLM
    return mod


def test_vllm_generator_through_the_loop(data, tools_model, tools_tok, monkeypatch, tmp_path, patient):
    calls: dict = {}
    reply = tools_tok.encode("I cannot help.", add_special_tokens=False) + [IM_END]
    monkeypatch.setitem(sys.modules, "vllm", _fake_vllm(calls, reply))
    gen = E.VLLMGenerator(str(tools_model), E.SamplingConfig(max_new_tokens=7, temperature=0.0, n=1, seed=3))
    assert gen.generate_ids([[1, 2], [3]], [5, 2]) == [reply[:5], reply[:2]]
    prompts, limits = calls["batches"][-1]
    assert prompts == [{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": [3]}] and limits == [5, 2]
    assert calls["sampling"][-1] == {"n": 1, "temperature": 0.0, "max_tokens": 2}

    calls["batches"].clear()
    args = _args(tools_model, data, tmp_path / "v.json", "--max-new-tokens", "7")
    result = E.run_eval(args, generator_factory=lambda a, b: gen)
    items = _items(data)
    # one generation per user turn (no call made), each request's limit the per-step budget
    assert sum(len(b[0]) for b in calls["batches"]) == sum(it.extra_info["num_turns"] for it in items)
    assert {m for _, ms in calls["batches"] for m in ms} == {7}
    assert max(len(b[0]) for b in calls["batches"]) == 3
    first = {it.id: rec for it, rec in zip(items, result["items"])}
    for it in items:
        turns = first[it.id]["trajectory"]["turns"]
        assert [[s["text"] for s in t["steps"]] for t in turns] == [["I cannot help."]] * it.extra_info["num_turns"]
    assert result["metrics"]["accuracy"] == 0.0 and result["metrics"]["loop_ends"] == {"completed": 3}


# --------------------------------------------------------------------------------------------------
# metrics, command line
# --------------------------------------------------------------------------------------------------


def test_multi_turn_metrics_restated():
    def s(cat, valid, state, resp, fmt, irr=None, end="completed"):
        scores = {"bfcl_valid": valid, "state": state, "response": resp, "format": fmt}
        if irr is not None:
            scores["irrelevance"] = irr
        return {"category": cat, "scores": scores, "info": {} if valid else {"bfcl_error_type": "x"},
                "loop": {"end": end}}

    samples = [s("base", 1.0, 1.0, 1.0, 1.0), s("base", 0.0, 0.0, 1.0, 1.0), s("base", 0.0, 1.0, 0.0, 0.0),
               s("miss_func", 1.0, 1.0, 1.0, 1.0, irr=0.0, end="step_limit")]
    m = aggregate("multi_turn", samples)
    assert m["accuracy"] == 0.5 and m["state_rate"] == 0.75 and m["response_rate"] == 0.75 and m["format_rate"] == 0.75
    assert m["irrelevance_rate"] == 0.0 and m["n_irrelevance"] == 1
    assert m["by_category"]["base"]["accuracy"] == pytest.approx(1 / 3) and m["by_category"]["miss_func"]["n"] == 1
    assert m["accuracy_category_mean"] == pytest.approx((1 / 3 + 1.0) / 2)  # unweighted over categories
    assert m["bfcl_error_types"] == {"none": 2, "x": 2} and m["loop_ends"] == {"completed": 3, "step_limit": 1}
    assert aggregate("multi_turn", [])["accuracy"] is None


def test_loop_choices_agree_with_the_loop():
    from recipe.mrtpo.agent.bfcl_loop import ON_DECODE_ERROR

    assert MT.ON_DECODE_ERROR == ON_DECODE_ERROR
    assert set(MT.loop_knobs("feedback", 5)) >= {"max_steps_per_turn", "call_timeout_s", "on_decode_error"}


@pytest.mark.parametrize("argv, message", [
    (["--task", "ifeval", "--response-length", "10"], "only for --task bfcl_multi_turn"),
    (["--task", "ifeval", "--on-decode-error", "feedback"], "only for --task bfcl_multi_turn"),
    (["--task", TASK, "--n", "2", "--temperature", "1"], "one trajectory per question"),
])
def test_multi_turn_options_are_refused_where_they_do_nothing(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit):
        E.main([*argv, "--model", "m", "--out", str(tmp_path / "o.json")])
    assert message in capsys.readouterr().err


def test_the_loops_spans_reach_the_viewer(data, tools_model, tools_tok):
    """The spans the real loop records (``bfcl_spans``), as the trainer's dump keeps them (``dump.loop_spans``),
    mark the tool results and injected user turns in the heatmap, and only them."""
    import torch

    from recipe.mrtpo.step.dump import loop_spans
    from recipe.mrtpo.tools.viz.render import render_html
    from recipe.mrtpo.tools.viz.view import normalise_dump

    items = [it for it in _items(data) if it.category == "miss_func"]  # tool results and an injected turn
    runner = MT.MultiTurnRunner(ScriptedGenerator(tools_tok, _items(data)), 4096, None, "end_turn", model_type="qwen2")
    [[gen]] = runner.generate_items(items)
    spans = gen.loop["spans"]
    T = spans[-1][2]
    mask = torch.zeros(1, T, dtype=torch.long)
    for kind, s, e, *_ in spans:
        mask[0, s:e] = int(kind == "model")
    raw = {"step": 1, "beta": 0.5, "reward_names": ["state"], "scores": torch.ones(1, 1), "response_mask": mask,
           "response_tokens": [[str(t) for t in range(T)]], "spans": loop_spans([spans], 1, T)}
    d = normalise_dump(raw)
    expect = [""] * T
    for kind, s, e, *_ in spans:
        for t in range(s, e):
            expect[t] = "" if kind == "model" else kind
    assert {"tool", "user"} <= set(expect) and d.kinds[0] == expect
    page = render_html(d)
    assert page.count('data-span="tool"') == expect.count("tool")  # one reward row, no advantage row in this dump
