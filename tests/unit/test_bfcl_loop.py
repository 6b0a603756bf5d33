"""The BFCL multi-turn agent loop (``recipe/mrtpo/agent/bfcl_loop.py``), driven without Ray or a GPU.

A scripted server manager stands in for verl's (its ``generate`` returns the token ids of prepared texts,
honouring ``max_tokens`` as vLLM does); the loop is verl's agent-loop class built as verl's worker builds
it, over the real Qwen2 tokenizer with a template that renders ``tools=`` (a Qwen2.5-style tools block,
written here) and verl's own Qwen Continuous Token builder. Checked against BFCL itself:

- gold trajectories (BFCL's gold calls written as the model would write them, one step per turn, then a
  plain answer) leave the backends in the state BFCL's own ``execute_multi_turn_func_call`` leaves them in
  (BFCL's ``state_checker``), and every tool output is BFCL's execution result of that call;
- the response mask is 1 exactly on the tokens the server generated, the spans tile the response, the
  injected user turns and miss_func's held-out functions appear at their turn, and not before;
- a hostile corpus (malformed JSON, unknown function, wrong types, a call that raises, a huge output,
  an endless stream of calls, a very long text, a call that never returns, an injection through an
  argument name, a slow server) ends with no exception, within its bounds, with the reason counted.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import time
import uuid
from pathlib import Path

import pytest
from omegaconf import OmegaConf

bfcl_eval = pytest.importorskip("bfcl_eval", reason="bfcl-eval is installed by run_scripts/setup.sh")

from recipe.mrtpo.agent import bfcl_env  # noqa: E402
from recipe.mrtpo.agent.bfcl_env import BFCLEntryError, BFCLEnv, decode_step, parse_entry  # noqa: E402

DATA = Path(bfcl_eval.__file__).parent / "data"
TOOLS_BLOCK = (
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags.<|im_end|>\\n' }}{%- endif %}"
)


def load(category: str, ids: list[int]) -> list[tuple[dict, list]]:
    """(question-file entry, gold answer) of shipped BFCL items."""
    q = {json.loads(x)["id"]: json.loads(x) for x in (DATA / f"BFCL_v4_multi_turn_{category}.json").open()}
    a = {json.loads(x)["id"]: json.loads(x) for x in (DATA / "possible_answer" / f"BFCL_v4_multi_turn_{category}.json").open()}
    return [(q[f"multi_turn_{category}_{i}"], a[f"multi_turn_{category}_{i}"]["ground_truth"]) for i in ids]


def row_of(entry: dict) -> tuple[list, dict]:
    """(raw_prompt, extra_info) of a BFCL question's row, built by the rows' one builder, ``data_prep.multi_turn``."""
    from data_prep.multi_turn import multi_turn_row

    category = entry["id"].rsplit("_", 1)[0].removeprefix("multi_turn_")
    (_, gold), = load(category, [int(entry["id"].rsplit("_", 1)[1])])
    row = multi_turn_row(entry, gold, category)
    assert row["agent_name"] == "bfcl_multi_turn"
    return row["prompt"], row["extra_info"]


ITEMS = load("base", [0, 7, 55]) + load("miss_func", [0, 12]) + load("long_context", [3]) + load("miss_param", [4])


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer

    from recipe.mrtpo.cpu.tiny_model import CHATML_TEMPLATE, build_qwen2_tokenizer

    t = AutoTokenizer.from_pretrained(build_qwen2_tokenizer(tmp_path_factory.mktemp("tok")))
    t.chat_template = TOOLS_BLOCK + CHATML_TEMPLATE
    return t


class LogprobServer:
    """A scripted server that also returns log-probs (-(1 + position) per generated token)."""

    def __init__(self, inner):
        self.inner = inner

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        out = await self.inner.generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)
        return out.model_copy(update={"log_probs": [-(1.0 + i) for i in range(len(out.token_ids))]})


class ScriptedServer:
    """verl's server manager, scripted: each ``generate`` returns the next text's ids (+ <|im_end|>),
    cut at ``max_tokens`` as vLLM cuts (then without <|im_end|>); a callable script sees the call index."""

    def __init__(self, tok, script, delay_s: float = 0.0):
        self.tok, self.script, self.delay_s, self.calls, self.prompts = tok, script, delay_s, 0, []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        text = self.script(self.calls) if callable(self.script) else self.script[self.calls]
        self.calls += 1
        self.prompts.append(list(prompt_ids))
        ids = self.tok.encode(text, add_special_tokens=False) + [self.tok.convert_tokens_to_ids("<|im_end|>")]
        return TokenOutput(token_ids=ids[: sampling_params["max_tokens"]])


def make_loop(tok, server, response_length=16384, max_tool_response_length=100_000, max_assistant_turns=None, **knobs):
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap

    from recipe.mrtpo.agent.bfcl_loop import BFCLMultiTurnAgentLoop

    cfg = OmegaConf.create({
        "actor_rollout_ref": {"rollout": {
            "prompt_length": 32768, "response_length": response_length, "full_determinism": False,
            "multi_turn": {"max_assistant_turns": max_assistant_turns, "max_tool_response_length": max_tool_response_length,
                           "tool_response_truncate_side": "middle"}}},
        "data": {"apply_chat_template_kwargs": {}},
    })
    loop = BFCLMultiTurnAgentLoop(trainer_config=DictConfigWrap(cfg), server_manager=server, tokenizer=tok,
                                  processor=None, dataset_cls=None, data_config=DictConfigWrap(cfg.data),
                                  hf_model_type="qwen2", tools=None, name="bfcl_multi_turn", **knobs)
    loop.envs = []
    make = loop.make_env

    def make_env(entry):  # keep each trajectory's environment and its final backends (taken before close)
        env = make(entry)
        close = env.close

        def close_keeping_state(*args, **kwargs):
            if not env.poisoned:
                env.final = env.snapshot()
            close(*args, **kwargs)

        env.close = close_keeping_state
        loop.envs.append(env)
        return env

    loop.make_env = make_env
    return loop


def run_loop(tok, entry, script, **kw):
    async def go():
        server = ScriptedServer(tok, script, delay_s=kw.pop("delay_s", 0.0))
        loop = make_loop(tok, server, **kw)
        raw_prompt, extra_info = row_of(entry)
        out = await loop.run({"temperature": 1.0}, raw_prompt=raw_prompt, extra_info=extra_info)
        return out, loop, server

    return asyncio.run(go())


def gold_calls_as_model(entry: dict, calls: list[str]) -> str:
    """BFCL gold call strings written as the model writes calls (Qwen's <tool_call> JSON); positional
    arguments named by the backend method's signature."""
    env = BFCLEnv(parse_entry(row_of(entry)[1]))
    blocks = []
    for c in calls:
        node = ast.parse(c, mode="eval").body
        name = node.func.id
        args = [ast.literal_eval(a) for a in node.args]
        kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
        bound = inspect.signature(env.methods[name]).bind(*args, **kwargs)
        blocks.append("<tool_call>\n" + json.dumps({"name": name, "arguments": dict(bound.arguments)}) + "\n</tool_call>")
    return "\n".join(blocks)


def gold_script(entry: dict, gold: list) -> list[str]:
    texts = []
    for turn in gold:
        if turn:
            texts.append(gold_calls_as_model(entry, turn))
        texts.append("Done.")
    return texts


def check_tiling(out):
    spans = out.extra_fields["bfcl_spans"]
    assert spans[0][1] == 0 and spans[-1][2] == len(out.response_ids) == len(out.response_mask)
    for a, b in zip(spans, spans[1:]):
        assert a[2] == b[1]
    for kind, s, e, *_ in spans:
        assert set(out.response_mask[s:e]) == ({1} if kind == "model" else {0}), kind


# --------------------------------------------------------------------------------------------------
# Gold trajectories against BFCL's own execution
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("entry,gold", ITEMS, ids=[e["id"] for e, _ in ITEMS])
def test_gold_trajectory_reaches_bfcls_state_and_outputs(tok, entry, gold):
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import state_checker
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call

    from recipe.mrtpo.tasks.multi_turn.trajectory import parse_trajectory

    script = gold_script(entry, gold)
    out, loop, server = run_loop(tok, entry, script)
    info = out.extra_fields["bfcl_loop"]
    assert info["end"] == "completed" and info["reasons"] == {} and server.calls == len(script)
    record = parse_trajectory(out.extra_fields["bfcl_trajectory"])
    assert len(record.turns) == len(gold)

    # BFCL's own execution of the gold answer, turn by turn, on its globals-keyed instances (a fresh key)
    model = f"mrtpo_test_{uuid.uuid4().hex}"
    long_context = "long_context" in entry["id"]
    bfcl_outputs = []
    for turn in gold:
        res, bfcl_instances = execute_multi_turn_func_call(turn, entry["initial_config"], entry["involved_classes"],
                                                           model, entry["id"], long_context=long_context)
        bfcl_outputs.append(res)
    assert type(loop.envs[0]).__name__ == "ProcessEnv"  # the default isolation
    ours = loop.envs[0].final
    assert state_checker(ours, bfcl_instances) == {"valid": True}
    # the loop's decoded calls, executed by BFCL on fresh instances, reach the same state too
    model2 = f"mrtpo_test_{uuid.uuid4().hex}"
    for turn_calls in record.decoded():
        flat = [c for step in turn_calls for c in step]
        _, again = execute_multi_turn_func_call(flat, entry["initial_config"], entry["involved_classes"], model2,
                                                entry["id"], long_context=long_context)
    assert state_checker(again, bfcl_instances) == {"valid": True}
    # every tool output is BFCL's execution result of that call, in order
    spans = out.extra_fields["bfcl_spans"]
    tool_text = {(t, s): tok.decode(out.response_ids[a:b]) for k, a, b, t, s in spans if k == "tool"}
    for t, res in enumerate(bfcl_outputs):
        if not res:
            assert not any(tt == t for tt, _ in tool_text)
            continue
        text = tool_text[(t, 0)]
        pos = 0
        for r in res:
            block = f"<tool_response>\n{r}\n</tool_response>"
            at = text.find(block, pos)
            assert at >= 0, (t, r[:80])
            pos = at + len(block)
    check_tiling(out)


def test_masks_are_one_exactly_on_generated_tokens_and_turns_arrive_in_order(tok):
    entry, gold = load("miss_func", [0])[0]
    script = gold_script(entry, gold)
    out, loop, server = run_loop(tok, entry, script)
    check_tiling(out)
    spans = out.extra_fields["bfcl_spans"]
    model = [tok.decode(out.response_ids[a:b]) for k, a, b, *_ in spans if k == "model"]
    assert model == [t + "<|im_end|>" for t in script]  # exactly the generated tokens, in order
    assert sum(out.response_mask) == sum(len(tok.encode(t + "<|im_end|>", add_special_tokens=False)) for t in script)
    users = [(t, tok.decode(out.response_ids[a:b])) for k, a, b, t, _ in spans if k == "user"]
    assert [t for t, _ in users] == [1, 2, 3, 4]
    for t, text in users:
        if entry["question"][t]:
            assert entry["question"][t][0]["content"] in text
        else:  # turn 3 holds out `sort`: its spec, then BFCL's message, arrive there
            assert "I have updated some more functions you can choose from. What about now?" in text
            assert '"name": "sort"' in text and text.index('"name": "sort"') < text.index("I have updated")
    prompt = tok.decode(out.prompt_ids)
    assert '"name": "mv"' in prompt and '"name": "sort"' not in prompt  # offered from the start vs held out
    assert not any('"name": "sort"' in text for t, text in users if t < 3)
    # the server saw, at each step, exactly the prompt + response so far
    starts = [a for k, a, *_ in spans if k == "model"]
    for prompt_ids, a in zip(server.prompts, starts):
        assert prompt_ids == list(out.prompt_ids) + list(out.response_ids[:a])
    # verl's batch conversion takes the output
    d = out.as_dict()
    assert d["responses"].shape == d["response_mask"].shape


def test_the_record_per_turn_and_step(tok):
    entry, _ = load("base", [0])[0]
    script = ['<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call>',
              "<think>\nlooked\n</think>\nThe folder holds the files.", "Nothing to do."]
    script += ["OK."] * (len(entry["question"]) - 2)
    out, *_ = run_loop(tok, entry, script)
    rec = out.extra_fields["bfcl_trajectory"]
    assert rec["turns"][0]["steps"] == [{"text": script[0], "calls": ["ls()"], "error": None},
                                        {"text": script[1], "calls": [], "error": None}]
    assert rec["turns"][1]["steps"] == [{"text": "Nothing to do.", "calls": [], "error": None}]
    assert len(rec["turns"]) == len(entry["question"])


# --------------------------------------------------------------------------------------------------
# Decoding and the environment
# --------------------------------------------------------------------------------------------------


def test_decode_step_writes_bfcls_call_strings():
    d = decode_step('<tool_call>\n{"name": "mv", "arguments": {"source": "a b.txt", "destination": "x"}}\n</tool_call>'
                    '<tool_call>{"name": "mean", "arguments": {"numbers": [1, 2.5, true, null], "o": {"k": "v"}}}</tool_call>', 8)
    # BFCL's convert_to_function_call: f"{key}({','.join([f'{k}={repr(v)}' for k, v in value.items()])})"
    assert d.strings == ("mv(source='a b.txt',destination='x')", "mean(numbers=[1, 2.5, True, None],o={'k': 'v'})")
    assert [ast.literal_eval(ast.parse(s, mode="eval").body.keywords[0].value) for s in d.strings] == ["a b.txt", [1, 2.5, True, None]]
    assert decode_step("No call needed.", 8) == bfcl_env.StepDecode(attempted=False)
    assert decode_step("<think>I could <tool_call> here</think>\nAnswer.", 8).attempted is False


@pytest.mark.parametrize("text,reason", [
    ("<tool_call>\n{not json\n</tool_call>", "malformed_call"),
    ('<tool_call>{"name": "ls", "arguments": {}}</tool_call><tool_call>[1, 2]</tool_call>', "malformed_call"),
    ('<tool_call>{"name": "ls", "arguments": "nope"}</tool_call>', "malformed_call"),
    ('<tool_call>{"name": "os.system", "arguments": {}}</tool_call>', "bad_function_name"),
    ('<tool_call>{"name": "ls", "arguments": {"a=__import__(\'os\').system(\'true\'),b": 1}}</tool_call>', "bad_argument_name"),
    ('<tool_call>{"name": "ls", "arguments": {"class": 1}}</tool_call>', "bad_argument_name"),
    ('<tool_call>{"name": "ls", "arguments": {}}</tool_call>' * 9, "too_many_calls"),
])
def test_decode_step_refuses_what_is_not_a_call(text, reason):
    d = decode_step(text, 8)
    assert d.attempted and d.reason == reason and d.calls == () and d.error


def test_decode_step_survives_the_hostile_tool_corpus():
    import importlib.util

    spec = importlib.util.spec_from_file_location("mrtpo_hostile_tool_corpus", Path(__file__).resolve().parents[1] / "hostile" / "tool_corpus.py")
    corpus = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(corpus)
    texts = corpus.tool_corpus()
    assert len(texts) >= 200
    t0 = time.monotonic()
    for text in texts:
        d = decode_step(text, 32)
        assert (d.error is None) == (d.reason is None) and (not d.error or not d.calls)
        for s, c in zip(d.strings, d.calls):  # every string is a plain call of literals
            node = ast.parse(s, mode="eval").body
            assert isinstance(node, ast.Call) and node.func.id == c["name"] and not node.args
            [ast.literal_eval(k.value) for k in node.keywords]
    assert time.monotonic() - t0 < 60


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_each_trajectory_has_its_own_backends(isolation):
    from recipe.mrtpo.agent.bfcl_process import ProcessEnv

    make = BFCLEnv if isolation == "thread" else ProcessEnv
    entry, _ = load("base", [0])[0]
    a, b = make(parse_entry(row_of(entry)[1])), make(parse_entry(row_of(entry)[1]))
    assert a.execute("mkdir", {"dir_name": "only_in_a"}, 5).reason is None
    assert "only_in_a" in a.execute("ls", {}, 5).text and "only_in_a" not in b.execute("ls", {}, 5).text
    c = make(parse_entry(row_of(entry)[1]))  # and nothing leaked into a later one of the same id
    assert "only_in_a" not in c.execute("ls", {}, 5).text
    for env in (a, b, c):
        env.close()


def test_a_process_env_stops_a_call_that_holds_the_interpreter():
    """CPython's big-integer power keeps the GIL: only a process can stop it."""
    from recipe.mrtpo.agent.bfcl_process import ProcessEnv

    env = ProcessEnv(parse_entry(GOOD_ROW))  # MathAPI
    assert env.execute("add", {"a": 1, "b": 2}, 5) == bfcl_env.ExecResult('{"result": 3}')
    t0 = time.monotonic()
    r = env.execute("power", {"base": 99999999, "exponent": 99999999999}, 1.0)
    assert r.reason == "call_timeout" and env.poisoned and env.stop_reason == "call_timeout"
    assert time.monotonic() - t0 < 10 and env._proc is None  # the child was killed at once
    assert env.execute("add", {"a": 1, "b": 2}, 5).reason == "env_poisoned"
    env.close()


def test_a_process_env_caps_memory():
    """square_root at a precision of 10**9 digits wants GBs (and hours): under the cap it fails at once."""
    from recipe.mrtpo.agent.bfcl_process import ProcessEnv

    env = ProcessEnv(parse_entry(GOOD_ROW), memory_limit_bytes=512 << 20)
    t0 = time.monotonic()
    r = env.execute("square_root", {"number": 2, "precision": 10**9}, 60)
    assert r == bfcl_env.ExecResult("Error during execution: ", "call_raised") and time.monotonic() - t0 < 30  # MemoryError
    assert env.execute("add", {"a": 1, "b": 2}, 5).text == '{"result": 3}'  # the child lives on
    env.close()


def test_environment_errors_are_bfcls_messages():
    entry, _ = load("base", [0])[0]
    env = BFCLEnv(parse_entry(row_of(entry)[1]))
    assert env.execute("nope", {}, 5) == bfcl_env.ExecResult("Error during execution: name 'nope' is not defined", "unknown_function")
    assert env.execute("kill", {}, 5).text == "Error during execution: Function call kill is not allowed."
    r = env.execute("cd", {"folder": "a", "extra": 1}, 5)
    assert r.reason == "call_raised" and r.text.startswith("Error during execution: ") and "extra" in r.text


GOOD_ROW = {"id": "multi_turn_base_x", "involved_classes": ["MathAPI"], "initial_config": "{}",
            "tools": [{"name": "mean", "parameters": {}}], "user_turns": [[{"role": "user", "content": "hi"}]]}


@pytest.mark.parametrize("change,match", [
    ({"tools": None}, "expected a list"), ({"user_turns": "{"}, "not JSON"), ({"id": "simple_1"}, "not a BFCL multi-turn"),
    ({"involved_classes": ["WebSearchAPI"]}, "refused"), ({"involved_classes": ["Nope"]}, "unknown backend"),
    ({"involved_classes": []}, "non-empty list"), ({"initial_config": "[1]"}, "expected an object"),
    ({"user_turns": [[{"role": "user", "content": "hi"}], []]}, "non-empty message lists"),
    ({"user_turns": [[{"role": "user", "content": 3}]]}, "not {'role'"),
    ({"tools": [{"name": "os.system"}]}, "identifier name"),
    ({"missed_function": {"0": []}}, "not a later turn"), ({"missed_function": {"1": []}}, "not a later turn"),
    ({"missed_function": "[]"}, "expected an object"),
])
def test_malformed_rows_are_data_errors(change, match):
    assert parse_entry(GOOD_ROW).tools == ({"type": "function", "function": {"name": "mean", "parameters": {}}},)
    with pytest.raises(BFCLEntryError, match=match):
        parse_entry({**GOOD_ROW, **change})
    for bad, match in ((None, "expected an object"), ({"id": "multi_turn_base_1"}, "lacks")):
        with pytest.raises(BFCLEntryError, match=match):
            parse_entry(bad)


def test_knobs_are_typed_and_checked(tok):
    with pytest.raises(TypeError, match="unknown knob"):
        make_loop(tok, None, max_step_per_turn=3)
    for bad in ({"max_steps_per_turn": 0}, {"max_calls_per_step": 65}, {"call_timeout_s": 0},
                {"on_decode_error": "ignore"}, {"max_step_tokens": 0}, {"isolation": "none"},
                {"memory_limit_mb": 100}, {"isolation": "thread", "memory_limit_mb": 1024}):
        with pytest.raises(ValueError):
            make_loop(tok, None, **bad)
    import yaml

    from recipe.mrtpo.agent.bfcl_loop import BFCLLoopConfig

    (spec,) = yaml.safe_load((Path(__file__).parents[2] / "recipe/mrtpo/config/bfcl_agent_loop.yaml").read_text())
    assert spec.pop("name") == "bfcl_multi_turn"
    assert spec.pop("_target_") == "recipe.mrtpo.agent.bfcl_loop.BFCLMultiTurnAgentLoop"
    assert BFCLLoopConfig(**spec) == BFCLLoopConfig()  # the YAML documents the defaults
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    assert _agent_loop_registry["bfcl_multi_turn"]["_target_"] == "recipe.mrtpo.agent.bfcl_loop.BFCLMultiTurnAgentLoop"


def test_a_template_that_ignores_tools_is_refused(tok):
    import copy

    bare = copy.deepcopy(tok)
    bare.chat_template = tok.chat_template[len(TOOLS_BLOCK):]
    entry, _ = load("base", [0])[0]
    with pytest.raises(ValueError, match="renders nothing for tools"):
        run_loop(bare, entry, ["Done."] * 10)


# --------------------------------------------------------------------------------------------------
# The hostile corpus
# --------------------------------------------------------------------------------------------------


def call(name, **arguments):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


HOSTILE = {
    # name: (script of the first turn, then "Done." forever; loop knobs; expected reasons; end)
    "malformed_json": (["<tool_call>\n{\"name\": \"ls\", \"arguments\": {\n</tool_call>"], {}, {"malformed_call": 1}, "completed"),
    "unknown_function": ([call("format_disk", drive="C")], {}, {"unknown_function": 1}, "completed"),
    "wrong_types": ([call("cd", folder=["document"]), call("mkdir", dir_name={"a": 1})], {}, {"call_raised": 2}, "completed"),
    "raises_inside": ([call("cd", folder="a", nope=1)], {}, {"call_raised": 1}, "completed"),
    "huge_output": ([call("echo", content="x" * 30000)], {"max_tool_response_length": 500},
                    {"tool_output_truncated": 1}, "completed"),
    "injection_by_argument_name": ([call("ls", **{"a=__import__('os').system('true'),b": 1})], {},
                                   {"bad_argument_name": 1}, "completed"),
    "too_many_calls": (["".join(call("ls") for _ in range(70))], {}, {"too_many_calls": 1}, "completed"),
    "decode_error_ends_turn": (["<tool_call>{broken</tool_call>"], {"on_decode_error": "end_turn"},
                               {"malformed_call": 1}, "completed"),
    "endless_calls": (lambda i: call("ls"), {"max_steps_per_turn": 5}, {"step_limit": 1}, "step_limit"),
    "endless_calls_total": (lambda i: call("pwd"), {"max_assistant_turns": 7}, {"total_step_limit": 1},
                            "total_step_limit"),
    "very_long_text": (["word " * 60000], {"response_length": 4096}, {"response_length": 1}, "response_length"),
    "long_step_text": (lambda i: "spam " * 5000 if i == 0 else "Done.", {"max_step_tokens": 256}, {}, "completed"),
    "holds_the_interpreter": ([call("power", base=99999999, exponent=99999999999)], {"call_timeout_s": 1.0},
                              {"call_timeout": 1}, "call_timeout", 31),
    "never_returns": ([call("spin")], {"call_timeout_s": 0.5, "isolation": "thread"}, {"call_timeout": 1}, "call_timeout"),
    "slow_server": (lambda i: call("ls"), {"trajectory_timeout_s": 0.6, "delay_s": 0.1}, {"trajectory_timeout": 1},
                    "trajectory_timeout"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_corpus_ends_within_bounds_with_counted_reasons(tok, name, monkeypatch):
    first, knobs, reasons, end, *item = HOSTILE[name]
    knobs = dict(knobs)
    entry, _ = load("base", item or [0])[0]  # base_31 involves MathAPI
    if name == "never_returns":  # a backend call that never returns: a method that spins, on the instance
        real_init = BFCLEnv.__init__

        def init(self, e):
            real_init(self, e)

            def spin():
                while True:
                    pass

            self.methods["spin"] = spin

        monkeypatch.setattr(BFCLEnv, "__init__", init)
    script = first if callable(first) else (lambda i: first[i] if i < len(first) else "Done.")
    t0 = time.monotonic()
    out, loop, server = run_loop(tok, entry, script, **knobs)
    elapsed = time.monotonic() - t0
    info = out.extra_fields["bfcl_loop"]
    assert info["end"] == end and info["reasons"] == reasons, info
    assert elapsed < 60
    check_tiling(out)
    assert len(out.response_ids) <= loop.response_length
    rec = out.extra_fields["bfcl_trajectory"]
    steps = [s for t in rec["turns"] for s in t["steps"]]
    assert len(steps) == server.calls == info["steps"]
    if end == "step_limit":
        assert info["force_quit"] and len(rec["turns"][0]["steps"]) == loop.loop_config.max_steps_per_turn + 1
    if end == "total_step_limit":
        assert info["steps"] == loop.max_assistant_turns == 7
    if name == "huge_output":
        tool = [tok.decode(out.response_ids[a:b]) for k, a, b, *_ in out.extra_fields["bfcl_spans"] if k == "tool"][0]
        assert "...(truncated)..." in tool and len(tool) < 1000
    if name in ("malformed_json", "injection_by_argument_name"):  # feedback: the error reached the model
        assert steps[0]["error"] and steps[1]["text"] == "Done."
        tool = [tok.decode(out.response_ids[a:b]) for k, a, b, *_ in out.extra_fields["bfcl_spans"] if k == "tool"][0]
        assert "could not be decoded" in tool
    if name == "decode_error_ends_turn":  # BFCL's protocol: the next thing is the next user turn
        assert [k for k, *_ in out.extra_fields["bfcl_spans"]][:3] == ["model", "user", "model"]
    if name == "long_step_text":
        first_span = out.extra_fields["bfcl_spans"][0]
        assert first_span[2] - first_span[1] == 256
    if name == "never_returns":
        import threading

        assert "did not finish within 0.5 s" in tok.decode(out.response_ids)
        deadline = time.monotonic() + 5  # the runaway call's thread was interrupted, not left spinning
        while any(t.name == "bfcl-call-spin" for t in threading.enumerate()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(t.name == "bfcl-call-spin" for t in threading.enumerate())


def test_the_bfcl_sources_followed_are_the_pinned_ones():
    from recipe.mrtpo.agent.pins import check_bfcl_sources
    from recipe.mrtpo.seams.source_pins import named_source

    def bfcl_source(name):
        return named_source(name, package="bfcl_eval")

    assert check_bfcl_sources() == [], "bfcl-eval changed: re-check recipe/mrtpo/agent/bfcl_env.py"
    # the restated lines, as BFCL writes them
    conv = bfcl_source("model_handler/utils.py:convert_to_function_call")
    assert "f\"{key}({','.join([f'{k}={repr(v)}' for k,v in value.items()])})\"" in conv  # call_string
    exe = bfcl_source("eval_checker/multi_turn_eval/multi_turn_utils.py:execute_multi_turn_func_call")
    assert str(list(bfcl_env.FORBIDDEN_NAMES)).replace("'", '"') in exe
    for line in ('instance_name = (\n            f"{model_name}_{test_entry_id}_{class_name}_instance"',  # why fresh instances
                 "class_instance._load_scenario(\n                    copy.deepcopy(class_initial_config), long_context=long_context",
                 'execution_results.append(f"Error during execution: {str(e)}")', "func_call_result = json.dumps(func_call_result)"):
        assert line in exe, line
    fc = bfcl_source("model_handler/base_handler.py:BaseHandler.inference_multi_turn_FC")
    assert "if count > MAXIMUM_STEP_LIMIT:" in fc and "force_quit = True" in fc and "DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC" in fc
    assert 'long_context=("long_context" in test_category or "composite" in test_category)' in fc
    from bfcl_eval.constants.default_prompts import MAXIMUM_STEP_LIMIT

    from recipe.mrtpo.agent.bfcl_loop import BFCLLoopConfig

    assert BFCLLoopConfig().max_steps_per_turn == MAXIMUM_STEP_LIMIT == 20


def test_the_replay_renders_p_all_as_the_loop_rendered_its_prompt(tok):
    from recipe.mrtpo.agent.bfcl_env import AGENT_NAME, tools_of_row
    from recipe.mrtpo.rollout.rollout_render import BFCL_AGENT, RolloutRender

    assert BFCL_AGENT == AGENT_NAME
    cfg = OmegaConf.create({"data": {"apply_chat_template_kwargs": {}}, "actor_rollout_ref": {"model": {}, "rollout": {
        "agent": {"default_agent_loop": "single_turn_agent",
                  "agent_loop_config_path": "recipe/mrtpo/config/bfcl_agent_loop.yaml"}, "multi_turn": {}}}})
    rr = RolloutRender(cfg)
    assert rr.has_tools
    for entry, gold in (load("miss_func", [0])[0], load("base", [7])[0]):
        raw_prompt, extra_info = row_of(entry)
        out, *_ = run_loop(tok, entry, gold_script(entry, gold))
        tools = rr.tools_of(AGENT_NAME, extra_info)
        assert tools == tools_of_row(extra_info) == tools_of_row({"tools": json.loads(extra_info["tools"])})
        assert rr.render_ids(tok, raw_prompt, tools) == list(out.prompt_ids)  # P_all = the rollout prompt
        assert rr.tools_of("single_turn_agent", extra_info) is None
    assert not RolloutRender(OmegaConf.create({"actor_rollout_ref": {"rollout": {"agent": {}, "multi_turn": {}}}})).has_tools


def test_rollout_log_probs_are_aligned_with_the_mask(tok):
    entry, gold = load("base", [7])[0]
    script = gold_script(entry, gold)

    async def go():
        loop = make_loop(tok, LogprobServer(ScriptedServer(tok, script)))
        raw_prompt, extra_info = row_of(entry)
        return await loop.run({}, raw_prompt=raw_prompt, extra_info=extra_info)

    out = asyncio.run(go())
    assert len(out.response_logprobs) == len(out.response_mask)
    for kind, a, b, *_ in out.extra_fields["bfcl_spans"]:
        want = [-(1.0 + i) for i in range(b - a)] if kind == "model" else [0.0] * (b - a)
        assert out.response_logprobs[a:b] == want, kind


def test_verls_worker_path_builds_the_loop_from_the_yaml(tok):
    """What verl's AgentLoopWorker does with ``agent_loop_config_path``: register each entry by name, then
    ``hydra.utils.instantiate`` it with the worker's keyword arguments (``_run_agent_loop``)."""
    import hydra
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap

    entries = OmegaConf.load(Path(__file__).parents[2] / "recipe/mrtpo/config/bfcl_agent_loop.yaml")
    (spec,) = [e for e in entries if e.name == "bfcl_multi_turn"]
    spec = OmegaConf.merge(spec, {"max_steps_per_turn": 3})
    entry, _ = load("base", [0])[0]
    cfg = OmegaConf.create({"actor_rollout_ref": {"rollout": {
        "prompt_length": 32768, "response_length": 16384, "multi_turn": {"max_tool_response_length": 100_000}}},
        "data": {"apply_chat_template_kwargs": {}}})

    async def go():
        server = ScriptedServer(tok, lambda i: call("ls"))
        loop = hydra.utils.instantiate(config=spec, trainer_config=DictConfigWrap(config=cfg), server_manager=server,
                                       tokenizer=tok, processor=None, hf_model_type="qwen2", dataset_cls=None,
                                       data_config=DictConfigWrap(cfg.data), tools=ToolListWrap([]))
        raw_prompt, extra_info = row_of(entry)
        return loop, await loop.run({}, raw_prompt=raw_prompt, extra_info=extra_info)

    loop, out = asyncio.run(go())
    assert loop.loop_config.max_steps_per_turn == 3 and loop.loop_config.call_timeout_s == 10.0
    assert out.extra_fields["bfcl_loop"]["end"] == "step_limit" and out.extra_fields["bfcl_loop"]["steps"] == 4


# --------------------------------------------------------------------------------------------------
# With the task: the loop's record scored by the multi-turn verifier (BFCL's checker)
# --------------------------------------------------------------------------------------------------


def score_of(entry, out):
    from data_prep.multi_turn import multi_turn_row
    from recipe.mrtpo.tasks.multi_turn.verifier import score

    category = entry["id"].rsplit("_", 1)[0].removeprefix("multi_turn_")
    (_, gold), = load(category, [int(entry["id"].rsplit("_", 1)[1])])
    row = multi_turn_row(entry, gold, category)
    return score(out.extra_fields["bfcl_trajectory"], row["reward_model"]["ground_truth"], row["extra_info"])


@pytest.mark.parametrize("entry,gold", ITEMS, ids=[e["id"] for e, _ in ITEMS])
def test_gold_played_through_the_loop_scores_full_marks(tok, entry, gold):
    texts = []
    for turn in gold:  # a turn whose gold makes no call: the model says so in plain text
        texts += [gold_calls_as_model(entry, turn), "Done."] if turn else ["None of the functions can do this."]
    out, *_ = run_loop(tok, entry, texts)
    assert out.extra_fields["bfcl_loop"]["end"] == "completed"
    result = score_of(entry, out)
    assert set(result.scores.values()) == {1.0}, result


def test_a_turn_answered_without_its_calls_fails_state_and_response(tok):
    entry, gold = ITEMS[0]
    texts = ["I will not do that."] + [t for turn in gold[1:] for t in ([gold_calls_as_model(entry, turn), "Done."] if turn else ["No."])]
    out, *_ = run_loop(tok, entry, texts)
    result = score_of(entry, out)
    assert result.scores["state"] == 0.0 and result.scores["response"] == 0.0 and result.scores["format"] == 1.0, result


def test_a_builder_that_inserts_tokens_at_an_assistant_merge_is_cut_to_the_response_length(tok):
    """verl's Qwen builder inserts nothing there; a builder that did would overrun the budget by its boundary
    tokens: the response is cut as verl's loops cut it, the spans with it, and the cut counted."""
    from verl.utils.tokenizer.continuous_token import MergeResult

    entry, _ = load("base", [0])[0]

    async def go():
        loop = make_loop(tok, ScriptedServer(tok, lambda i: "word " * 500), response_length=64)
        nl = tok.encode("\n", add_special_tokens=False)
        loop.continuous_token_builder.merge_assistant_tokens = lambda ids, new: MergeResult(
            token_ids=list(ids) + nl + list(new), appended_token_count=len(new), kind="assistant", inserted_token_ids=nl)
        raw_prompt, extra_info = row_of(entry)
        return await loop.run({}, raw_prompt=raw_prompt, extra_info=extra_info)

    out = asyncio.run(go())
    info = out.extra_fields["bfcl_loop"]
    assert info["reasons"] == {"response_truncated": 1, "response_length": 1} and info["end"] == "response_length"
    assert len(out.response_ids) == len(out.response_mask) == 64 and out.response_mask[0] == 0
    assert [k for k, *_ in out.extra_fields["bfcl_spans"]] == ["boundary", "model"]
    check_tiling(out)


def test_a_seeded_request_gets_a_stream_per_generation(tok):
    """verl hands every step of a trajectory the same sampling parameters; a seeded one (the recipe's rollout
    seeds) would restart one random stream at every step: each generation gets its own seed, the first the
    request's own (core.seeding.generation_seed, restated here)."""
    import hashlib

    entry, gold = load("miss_func", [0])[0]
    script = gold_script(entry, gold)
    seen = []

    class Recording(ScriptedServer):
        async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
            seen.append(sampling_params.get("seed"))
            return await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)

    async def go(params):
        loop = make_loop(tok, Recording(tok, script))
        raw_prompt, extra_info = row_of(entry)
        return await loop.run(params, raw_prompt=raw_prompt, extra_info=extra_info)

    asyncio.run(go({"temperature": 1.0, "seed": 12345}))
    expect = [12345] + [int.from_bytes(hashlib.sha256(f"mrtpo-generation|12345|{g}".encode()).digest()[:8], "big") >> 1
                        for g in range(1, len(script))]
    assert seen == expect and len(set(seen)) == len(script) > 1
    seen.clear()
    asyncio.run(go({"temperature": 1.0}))  # unseeded: left to the server
    assert seen == [None] * len(script)
