"""P_all is the rollout prompt for tool datasets: the replay renders each row with the tools and chat-template
arguments verl's rollout rendered it with (``recipe/mrtpo/rollout/rollout_render.py``).

The rollout side is verl 0.9.1's own Continuous Token builder (what its agent loops call for the initial
prompt), over a task-vocabulary tokenizer whose chat template (written here) renders ``tools`` into a system
block and reads one ``apply_chat_template_kwargs`` entry. Both of the trainer's renders are checked: the whole
render (``MRTPOTrainer._render``) and the planner's text + pieces (``_planner_renders``), per row tool
selections included; then the planner finds the rollout prompt among the row's variants (variant 0, P_all).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from recipe.mrtpo.rollout.rollout_render import RolloutRender

TOOLS_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and not enable_thinking %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)
SCHEMAS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "add", "description": "Add two numbers.",
                                      "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}},
]
MSGS = [{"role": "system", "content": "Answer briefly. Use lowercase only."}, {"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer

    from recipe.mrtpo.cpu.tiny_model import build_task_tokenizer

    texts = [TOOLS_TEMPLATE, str(SCHEMAS), *(m["content"] for m in MSGS)] * 4
    t = AutoTokenizer.from_pretrained(build_task_tokenizer(tmp_path_factory.mktemp("tok"), texts, 400))
    t.chat_template = TOOLS_TEMPLATE
    return t


def config(**rollout):
    return OmegaConf.create({"data": {"apply_chat_template_kwargs": {"enable_thinking": False}},
                             "actor_rollout_ref": {"model": {}, "rollout": {"agent": {"default_agent_loop": "tool_agent"},
                                                                            "multi_turn": {}, **rollout}}})


def verl_rollout_prompt(tok, messages, tools):
    """The initial prompt ids verl's agent loops build (``ct_build_initial_tokens``)."""
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    builder = create_continuous_token_builder(tok, hf_model_type=None, chat_template_kwargs={"enable_thinking": False},
                                              mm_processor_kwargs={}, processor=None)
    return list(builder.build_initial_tokens(messages, tools=tools))


def test_tools_of_a_row_are_the_tool_agent_loops():
    rr = RolloutRender(config(), tool_schemas=SCHEMAS)
    assert rr.has_tools and rr.tools_of(None, None) == SCHEMAS  # the default agent loop is the tool agent
    assert rr.tools_of("tool_agent", {"tool_selection": ["add", "nope", "get_weather"]}) == [SCHEMAS[1], SCHEMAS[0]]
    assert rr.tools_of("single_turn_agent", {"tool_selection": ["add"]}) is None  # the single-turn loop renders none
    assert not RolloutRender(config()).has_tools and RolloutRender(config()).tools_of("tool_agent") is None
    custom = RolloutRender(OmegaConf.merge(config(), {"actor_rollout_ref": {"model": {"custom_chat_template": "X"}}}))
    assert custom.kwargs == {"enable_thinking": False, "chat_template": "X"}


def test_p_all_is_the_rollout_prompt_in_both_renders_of_a_tool_dataset(tok):
    from recipe.mrtpo.core.replay_plan import build_replay_plan
    from recipe.mrtpo.step.trainer import MRTPOTrainer

    rr = RolloutRender(config(), tool_schemas=SCHEMAS)
    rows = [("tool_agent", None), ("tool_agent", {"tool_selection": ["add"]}), ("single_turn_agent", None), (None, {})]
    tools = [rr.tools_of(a, x) for a, x in rows]
    want = [verl_rollout_prompt(tok, MSGS, t) for t in tools]
    assert want[0] != want[1] != want[2] and "get_weather" in tok.decode(want[0]) and "<think>" in tok.decode(want[0])
    stub = SimpleNamespace(tokenizer=tok, _rollout_render=rr)
    for i, t in enumerate(tools):
        assert MRTPOTrainer._render(stub, MSGS, t) == want[i], i  # the whole render
    render, row_render, encoder = MRTPOTrainer._planner_renders(stub, tools)
    for i in range(len(rows)):
        assert row_render(i)(MSGS).tolist() == want[i], i  # the planner's text + pieces
    assert encoder.mismatches == 0
    # the planner: a prompt-placed context varies, and each row's rollout prompt is its P_all (variant 0)
    ctx = {"lower": {"text": "Use lowercase only.", "placement": "prompt"}}
    scores = torch.tensor([[1.0], [0.0], [1.0], [0.0]])
    plan = build_replay_plan(scores, np.array(["g"] * 4, dtype=object), ["lower"], [ctx] * 4, [MSGS] * 4,
                             torch.ones(4, 3, dtype=torch.long), torch.ones(4, 3, dtype=torch.long), render,
                             rollout_prompts=want, row_render=row_render)
    assert plan.rows == [0, 1, 2, 3] and plan.rollout_variant == [0, 0, 0, 0]
    # without the tools (the render before this change) P_all would not be the rollout prompt of the tool rows
    plain = build_replay_plan(scores, np.array(["g"] * 4, dtype=object), ["lower"], [ctx] * 4, [MSGS] * 4,
                              torch.ones(4, 3, dtype=torch.long), torch.ones(4, 3, dtype=torch.long), render,
                              rollout_prompts=want)
    assert plain.rollout_variant[0] != 0 and plain.rollout_variant[2] == 0
