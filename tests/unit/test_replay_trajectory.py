"""The replay on a BFCL agent trajectory: attended everywhere, measured on model tokens only.

The trajectory is the agent loop's own (``recipe.mrtpo.agent.bfcl_loop`` driven by the scripted server of
``test_bfcl_loop``: BFCL's gold calls of ``multi_turn_miss_func_0`` written as the model writes them), so its
response holds model, tool and injected user spans with the loop's ``response_mask`` (1 exactly on the model's
tokens). It goes through the trainer's whole replay path: the planner renders P_all with the row's tools
(``rollout_render``), P_all is checked against the rollout prompt, the worker's row function forwards on a tiny
Qwen2. Checked against a direct computation re-stated here: a plain forward of [prompt | whole response] per
variant and the JS distance written out, sqrt(JSD) in nats / ln 2:

- q is exactly 0 on every tool and user position, and equal to the direct computation on the model positions;
- the MRTPO advantage is 0 on tool and user positions, and on the model positions equals the advantage of the
  same trajectory with the tool and user positions cut out (no share of A leaks into them).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("bfcl_eval", reason="bfcl-eval is installed by run_scripts/setup.sh")

from unit.test_bfcl_loop import check_tiling, gold_script, load, row_of, run_loop  # noqa: E402

RESPONSE_LENGTH = 360  # enough for model, tool, model, user, model spans; small logits on a 151k vocabulary
TEMPERATURE = 0.9


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer

    from recipe.mrtpo.cpu.tiny_model import CHATML_TEMPLATE, build_qwen2_tokenizer
    from unit.test_bfcl_loop import TOOLS_BLOCK

    t = AutoTokenizer.from_pretrained(build_qwen2_tokenizer(tmp_path_factory.mktemp("tok")))
    t.chat_template = TOOLS_BLOCK + CHATML_TEMPLATE
    return t


TINY_SEED = 3  # the suite's test model (tests/conftest.py: tiny, tiny_lm), this module's seed


@pytest.fixture(scope="module")
def trajectory(tok):
    """(loop output, raw_prompt, extra_info, the row's contexts) of a real trajectory with all three span kinds."""
    from data_prep.multi_turn import gold_record
    from recipe.mrtpo.tasks.multi_turn.verifier import score

    entry, gold = load("miss_func", [0])[0]
    out, *_ = run_loop(tok, entry, gold_script(entry, gold), response_length=RESPONSE_LENGTH)
    check_tiling(out)
    kinds = {k for k, *_ in out.extra_fields["bfcl_spans"]}
    assert {"model", "tool", "user"} <= kinds, kinds
    raw_prompt, extra_info = row_of(entry)
    gt = {"turns": gold}
    contexts = {k: c.to_dict() for k, c in score(gold_record(gold), gt, extra_info).contexts.items()}
    return out, raw_prompt, extra_info, contexts


def js_distance(la: torch.Tensor, lb: torch.Tensor) -> torch.Tensor:
    """sqrt(JSD(p, q) / ln 2), JSD = 1/2 KL(p||m) + 1/2 KL(q||m), m = (p + q) / 2, written out per position."""
    p, q = torch.softmax(la.double(), -1), torch.softmax(lb.double(), -1)
    m = (p + q) / 2
    kl = lambda a: (a * (a.clamp_min(1e-300).log() - m.clamp_min(1e-300).log())).sum(-1)  # noqa: E731
    return ((0.5 * kl(p) + 0.5 * kl(q)) / math.log(2)).clamp_min(0).sqrt().float()


def test_q_is_zero_on_tool_and_user_spans_and_direct_on_model_tokens(tok, tiny_lm, trajectory):
    from omegaconf import OmegaConf
    from tensordict import TensorDict

    from recipe.mrtpo.agent.bfcl_env import AGENT_NAME
    from recipe.mrtpo.config import mrtpo_config
    from recipe.mrtpo.core.advantage import compute_mrtpo_advantage_with_stats
    from recipe.mrtpo.core.render_cache import CachedRender
    from recipe.mrtpo.core.replay import hf_forward
    from recipe.mrtpo.passes.pass_driver import PassRequest
    from recipe.mrtpo.rewards.reward_extras import RewardTable
    from recipe.mrtpo.rollout.rollout_render import RolloutRender
    from recipe.mrtpo.step.replay_driver import run_replay
    from recipe.mrtpo.step.worker import RELEVANCE_DTYPE, REPLAY_SETTINGS, replay_rows

    out, raw_prompt, extra_info, contexts = trajectory
    T = len(out.response_ids)
    spans = out.extra_fields["bfcl_spans"]
    mask = torch.tensor(out.response_mask, dtype=torch.long)
    assert mask[-1] == 0 or spans[-1][0] == "model"
    # two samples of one group with the same trajectory, one reward varying: every reward that varies is replayed
    names = sorted(contexts)
    scores = torch.ones(2, len(names))
    k_state = names.index("state")
    scores[1, k_state] = 0.0
    responses = torch.tensor([out.response_ids] * 2)
    masks = torch.stack([mask, mask])
    cfg_v = OmegaConf.create({"data": {"apply_chat_template_kwargs": {}}, "actor_rollout_ref": {"model": {}, "rollout": {
        "agent": {"default_agent_loop": "single_turn_agent",
                  "agent_loop_config_path": "recipe/mrtpo/config/bfcl_agent_loop.yaml"}, "multi_turn": {}}}})
    rr = RolloutRender(cfg_v)
    tools = rr.tools_of(AGENT_NAME, extra_info)
    render_ids = lambda m: rr.render_ids(tok, m, tools)  # noqa: E731
    assert render_ids(raw_prompt) == list(out.prompt_ids)  # the rollout prompt, rendered as the planner renders
    # the trainer's planner render (trainer._planner_renders): the text through verl's chat-template call with the
    # row's tools, its pieces tokenized together
    cached = CachedRender(render_text=lambda m: rr.render_text(tok, m, tools),
                          encode_batch=lambda texts: tok(texts, add_special_tokens=False)["input_ids"])
    fwd = hf_forward(tiny_lm)

    def dispatch(inputs, settings):
        td = TensorDict(dict(inputs), batch_size=[inputs["pair_variant"].shape[0]])
        for key in (*REPLAY_SETTINGS, "fused"):
            td.set_non_tensor(key, settings[key])
        with torch.no_grad():
            return replay_rows(fwd, td, "cpu", sync=None)

    table = RewardTable(names=names, scores=scores, contexts=[contexts] * 2, errors=[""] * 2)
    index = np.array(["g", "g"], dtype=object)
    res = run_replay(PassRequest(mrtpo_config({}), table, [raw_prompt] * 2, responses, masks, [list(out.prompt_ids)] * 2,
                                 cached, dispatch, dp_size=1, temperature=TEMPERATURE, pad_id=0, row_render=lambda i: cached), index)
    assert res.replayed[:, k_state].all() and not res.replayed[:, [k for k in range(len(names)) if k != k_state]].any()
    assert res.metrics.get("mrtpo/pairs_fallback", 0) == 0
    q = res.relevance[0, k_state]

    # exactly 0 on every tool and user position (not merely small)
    for kind, a, b, *_ in spans:
        if kind != "model":
            assert torch.count_nonzero(q[a:b]) == 0, (kind, a, b)
    # the direct computation: [P_all | whole response] and [P_minus_state | whole response], plain forwards
    z = contexts["state"]["text"]
    from recipe.mrtpo.core.prompt_variants import build_sample_variants

    plan = build_sample_variants(raw_prompt, contexts, ["state"], render_ids)
    p_all, p_minus = plan.variants[0], plan.variants[plan.pair_variant["state"]]
    assert z in tok.decode(p_all) and z not in tok.decode(p_minus) and '"name": "cd"' in tok.decode(p_minus)  # tools kept
    with torch.no_grad():
        def logits(prompt):
            seq = torch.tensor([list(prompt) + out.response_ids])  # the logits of positions P-1 .. P+T-2 only
            return tiny_lm(input_ids=seq, logits_to_keep=T + 1).logits[0, :T] / TEMPERATURE

        want = js_distance(logits(p_all), logits(p_minus)) * mask
    m = mask > 0
    # the workers answer in RELEVANCE_DTYPE (bf16, docs/design.md §5): the direct value rounded the same way
    assert torch.allclose(q[m], want[m].to(RELEVANCE_DTYPE).float(), atol=1e-4, rtol=2**-8), float((q[m] - want[m]).abs().max())
    assert (q[m] > 0).all()

    # the advantage: 0 off the model tokens; on them, that of the trajectory with the other spans cut out
    adv, _ = compute_mrtpo_advantage_with_stats(scores, index, masks, res.relevance, beta=1.0, max_realloc_rms=None)
    assert (adv[:, ~m] == 0).all() and adv[:, m].abs().sum() > 0
    cut, _ = compute_mrtpo_advantage_with_stats(scores, index, masks[:, m], res.relevance[:, :, m], beta=1.0, max_realloc_rms=None)
    assert torch.allclose(adv[:, m], cut, atol=1e-6)


def test_the_loop_keeps_the_servers_global_steps():
    """verl's v1 trainer reads min/max_global_steps of every output (``_compute_metrics``); the loop merges each
    generation's ``TokenOutput.extra_fields`` as verl's ToolAgentLoop does (found by the multi-turn e2e run)."""
    from recipe.mrtpo.agent.bfcl_loop import merge_server_extra

    acc: dict = {}
    for step in (3, 3, 4):
        merge_server_extra(acc, {"global_steps": step, "min_global_steps": step, "max_global_steps": step})
    assert acc == {"global_steps": 3, "min_global_steps": 3, "max_global_steps": 4}
    merge_server_extra(acc, {})  # a server that sends none changes nothing
    assert acc["min_global_steps"] == 3 and acc["max_global_steps"] == 4


def test_importing_the_loop_keeps_the_yamls_registry_entry():
    """verl's worker registers the agent_loop_config_path entries (with their knobs) before the first instantiate
    imports the loop's module; the module's own registration must not replace them (found by the e2e run)."""
    from omegaconf import OmegaConf

    from recipe.mrtpo.agent.bfcl_loop import BFCLMultiTurnAgentLoop, register_unless_configured

    registry = {"bfcl_multi_turn": OmegaConf.create({"name": "bfcl_multi_turn", "max_step_tokens": 12})}
    register_unless_configured(registry, "bfcl_multi_turn", BFCLMultiTurnAgentLoop)
    assert registry["bfcl_multi_turn"].max_step_tokens == 12
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    assert _agent_loop_registry["bfcl_multi_turn"]["_target_"].endswith("bfcl_loop.BFCLMultiTurnAgentLoop")  # imported: registered
