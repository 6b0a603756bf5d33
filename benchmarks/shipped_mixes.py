"""The shipped data sets as replay batches, planned as the trainer plans them (for ``bench_shared_prompts``).

Each mix is the rows an offline builder of this repository writes (no network): ``if``
(``data_prep.build_offline``'s instruction_following, the IF scripts' training set), ``sql`` (Chinook, its
database built into a temporary folder), ``tool`` (BFCL's AST categories) and ``multi_turn`` (BFCL's four
multi-turn categories, ``bench_multi_turn_lengths.rows_of``, every ``MT_EVERY``-th scenario). A batch holds
``responses // n`` prompts (the rows in a seeded order, cycled if too few), each with a group of ``n``
responses. Each response's verifier information Z_k comes from its task's own verifier (``get_task``) on a
canned response of its place in the group (:func:`canned`: SQL alternates the gold query, a query that runs but
differs, one that fails and no query, so the appended execution message differs inside a group as in a real
batch; a multi-turn record stops one or two turns early, so BFCL's checker is not run); the scores are drawn at
random (most groups vary: every reward replayed, an upper bound of the work, as ``bench_plan``). The response
tokens are random ids of lengths drawn uniformly from :data:`RESPONSE_LENGTHS` (a model's answers are not
shipped). The planner is the trainer's: ``core.replay_plan.build_replay_plan`` over ``CachedRender`` (the
template's text tokenized piecewise, one cache per batch, one piece encoder for every tool list, as the
trainer's ``planner_renders``) with the real Qwen2 tokenizer and a Qwen2.5-style
ChatML template with its tools block (``bench_multi_turn_lengths.qwen_tokenizer``); multi-turn rows are
rendered with ``tools=`` their specs, as the agent loop renders them.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

#: response lengths (tokens, uniform) per mix: a SQL query or tool call is short, an essay or a multi-turn
#: trajectory (tool results included) long; the prompt lengths are the data's own
RESPONSE_LENGTHS = {"if": (100, 600), "sql": (30, 250), "tool": (20, 150), "multi_turn": (200, 2000)}
MIXES = tuple(RESPONSE_LENGTHS)
MT_EVERY = 4  # every 4th BFCL multi-turn scenario (200 of 800 questions): enough prompts, a quarter of the loading


def load_rows(mix: str, workdir: Path) -> list[dict]:
    """The rows the mix's offline builder writes (module docstring), in memory."""
    from data_prep import build_offline as B
    from data_prep.common import SkipLog

    if mix == "multi_turn":
        from benchmarks.bench_multi_turn_lengths import rows_of

        return rows_of(every=MT_EVERY)
    build = {"if": B._if_train, "sql": B._chinook, "tool": B._bfcl}[mix]
    return build(workdir, 0, SkipLog())[1]


def canned(mix: str, row: dict, j: int):
    """The response (a multi-turn record) of place ``j`` in its group (module docstring)."""
    if mix == "sql":
        gold = row["reward_model"]["ground_truth"]["gold_sql"]
        return [f"```sql\n{gold}\n```", "```sql\nSELECT 1\n```", "```sql\nSELECT nope FROM nowhere\n```", "I cannot tell."][j % 4]
    if mix == "multi_turn":
        from data_prep.multi_turn import gold_record

        return gold_record(row["gold"][: max(0, len(row["gold"]) - 1 - j % 2)])
    return ["A short answer.", ""][j % 2]


def _renderer(tok, tools=None, encoder=None):
    from recipe.mrtpo.core.render_cache import CachedRender

    def text(messages):
        return tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)

    return CachedRender(render_text=text, encoder=encoder)


def make_batch(mix: str, rows: list[dict], responses: int, n: int, seed: int) -> dict:
    """The batch's planner inputs: scores, group ids, reward names, contexts, messages, responses and mask, and the
    multi-turn rows' tools (module docstring)."""
    from recipe.mrtpo.tasks import get_task

    rng = np.random.default_rng(seed)
    order = rng.permutation(len(rows))
    groups = responses // n
    picked = [rows[int(order[g % len(rows)])] for g in range(groups)]
    contexts, messages, uid, tools = [], [], [], []
    names: dict[str, None] = {}
    for g, row in enumerate(picked):
        gt, extra = row["reward_model"]["ground_truth"], row.get("extra_info")
        for j in range(n):
            res = get_task(row["data_source"])(canned(mix, row, j), gt, extra)
            contexts.append({k: c.to_dict() for k, c in res.contexts.items()})
            names.update(dict.fromkeys(res.contexts))
            messages.append(list(row["prompt"]))
            uid.append(f"g{g}")
            tools.append(json.dumps(extra["tools"]) if mix == "multi_turn" else None)
    B = groups * n
    scores = torch.as_tensor(rng.integers(0, 2, size=(B, len(names))), dtype=torch.float32)
    for i, c in enumerate(contexts):  # a reward the sample's verifier does not give is absent (NaN)
        for k, name in enumerate(names):
            if name not in c:
                scores[i, k] = float("nan")
    lo, hi = RESPONSE_LENGTHS[mix]
    lens = torch.as_tensor(rng.integers(lo, hi + 1, size=B))
    resp = torch.as_tensor(rng.integers(1, 150_000, size=(B, hi)))
    mask = (torch.arange(hi)[None, :] < lens[:, None]).long()
    return {"scores": scores, "uid": np.array(uid, dtype=object), "names": list(names), "contexts": contexts,
            "messages": messages, "responses": resp, "mask": mask, "tools": tools}


def rollout_prompts(batch: dict, tok) -> list[list[int]]:
    """Each sample's rollout prompt ids, as lists (as the trainer reads verl's ``prompts``): its messages through
    the template with its tools, rendered once per group."""
    from recipe.mrtpo.agent.bfcl_env import tools_of_row

    by_group: dict = {}
    out = []
    for i, msgs in enumerate(batch["messages"]):
        g = batch["uid"][i]
        if g not in by_group:
            key = batch["tools"][i]
            tools = tools_of_row({"tools": json.loads(key)}) if key is not None else None
            text = tok.apply_chat_template(msgs, tools=tools, add_generation_prompt=True, tokenize=False)
            by_group[g] = tok(text, add_special_tokens=False)["input_ids"]
        out.append(list(by_group[g]))
    return out


def plan(batch: dict, tok):
    """``build_replay_plan`` as the trainer runs it (fresh render caches: one per batch; each row's rollout
    prompt matched to its variants where ``batch`` holds ``rollout_prompts``) -> (plan, seconds)."""
    from recipe.mrtpo.agent.bfcl_env import tools_of_row
    from recipe.mrtpo.core.render_cache import PieceEncoder
    from recipe.mrtpo.core.replay_plan import build_replay_plan

    t0 = time.perf_counter()
    encoder = PieceEncoder(lambda texts: tok(texts, add_special_tokens=False)["input_ids"])  # one for all tool lists
    render = _renderer(tok, encoder=encoder)
    by_tools: dict = {}

    def row_render(i):
        key = batch["tools"][i]
        if key is None:
            return render
        if key not in by_tools:
            by_tools[key] = _renderer(tok, tools_of_row({"tools": json.loads(key)}), encoder)
        return by_tools[key]

    p = build_replay_plan(batch["scores"], batch["uid"], batch["names"], batch["contexts"], batch["messages"],
                          batch["responses"], batch["mask"], render, row_render=row_render,
                          rollout_prompts=batch.get("rollout_prompts"))
    return p, time.perf_counter() - t0


def tokenizer():
    from benchmarks.bench_multi_turn_lengths import qwen_tokenizer

    return qwen_tokenizer(Path(tempfile.gettempdir()) / "mrtpo_qwen2_tokenizer")
