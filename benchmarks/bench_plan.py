"""Benchmark: the driver's replay planning at the batch size users run (1024 responses x 5 rewards).

    python benchmarks/bench_plan.py [--prompts 256] [--n 4] [--scenarios if mixed] [--repeats 2]

Before any replay forward, the driver plans the batch on one CPU: for every (response, reward) pair with
group variance it builds P_all and P_minus_k from the chat messages and renders them with the chat template
(``core.replay_plan.build_replay_plan`` over ``core.prompt_variants``). This times that step with the real
Qwen2 tokenizer and chat template, ``--prompts`` x ``--n`` responses (a group of n shares its prompt) and
5 rewards per response, scores drawn at random (most groups vary), in two task mixes:

- ``if``: instruction following, 5 constraint sentences in the user turn (all ``prompt``-placed);
- ``mixed``: a text-to-SQL-like prompt with a schema: 3 ``prompt``-placed Z (format + two rules) and 2
  ``appended`` ones (the sample's own execution message, the group's gold SQL).

Each row is timed with the plain renderer, with ``render_cache.CachedRender`` (one render per distinct
message list) and with ``CachedRender`` over the template's text and a ``PieceEncoder`` (what the trainer's
replay passes: the batch's distinct prompts rendered, their distinct line-led pieces tokenized in one
batched call; the plans are checked id for id), and
the last line is ``plan: <B> responses x 5 rewards: <s> s with CachedRender over pieces (...); <s> s per
1,024`` for the slower mix.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Optional

import numpy as np
import torch

REWARDS = 5
SYSTEM = "You are a careful assistant. Follow every instruction of the user exactly and answer in English."
TOPICS = ("the history of tea", "a rainy afternoon", "how bridges carry loads", "the migration of birds",
          "a city at night", "learning a new language", "the first computers", "a mountain village")
RULES = ("Your answer must contain exactly 3 bullet points.", "Do not use any commas in your response.",
         "Answer with at least 150 words.", "Your entire response should be in lowercase letters.",
         "Wrap your entire response with double quotation marks.", "Include the keywords river and stone.",
         "End your response with the phrase: Is there anything else?", "Highlight at least 2 sections with markdown.")
SCHEMA_COLUMNS = ("id INTEGER PRIMARY KEY", "name TEXT NOT NULL", "created_at TEXT", "amount REAL", "status TEXT")


def _schema(p: int) -> str:
    tables = [f"CREATE TABLE t{p}_{j} (\n  " + ",\n  ".join(SCHEMA_COLUMNS) + f",\n  ref_{j} INTEGER REFERENCES t{p}_{j - 1}(id)\n);"
              for j in range(6)]
    return "\n\n".join(tables)


def make_batch(scenario: str, prompts: int, n: int, seed: int = 0):
    """(scores [B, 5], uid [B], reward names, contexts per sample, messages per sample, responses, mask)."""
    rng = np.random.default_rng(seed)
    names = [f"r{k}" for k in range(REWARDS)]
    contexts, messages, uid = [], [], []
    for p in range(prompts):
        rules = [RULES[(p + 3 * k) % len(RULES)] for k in range(REWARDS)]
        topic = TOPICS[p % len(TOPICS)]
        if scenario == "if":
            user = f"Write a short essay about {topic} (prompt {p}). " + " ".join(rules)
            ctx = {names[k]: {"text": rules[k], "placement": "prompt"} for k in range(REWARDS)}
            group_ctx = [ctx] * n
        else:
            fmt = "Answer with one SQL query in a ```sql code block; use only SELECT or WITH."
            user = (f"Database schema:\n\n{_schema(p)}\n\nQuestion {p}: list the names related to {topic}.\n\n"
                    f"{fmt}\n\n{rules[0]} {rules[1]}")
            gold = f"SELECT name FROM t{p}_0 WHERE status = 'open' ORDER BY created_at"
            group_ctx = []
            for i in range(n):
                group_ctx.append({
                    names[0]: {"text": fmt, "placement": "prompt"},
                    names[1]: {"text": rules[0], "placement": "prompt"},
                    names[2]: {"text": rules[1], "placement": "prompt"},
                    names[3]: {"text": f"error: no such column: c{i}" if i % 2 else "executed", "placement": "appended"},
                    names[4]: {"text": gold, "placement": "appended"},
                })
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
        for i in range(n):
            contexts.append(group_ctx[i])
            messages.append(msgs)
            uid.append(f"u{p}")
    B = prompts * n
    scores = torch.as_tensor(rng.integers(0, 2, size=(B, REWARDS)), dtype=torch.float32)
    T = 1024
    lens = torch.as_tensor(rng.integers(64, T + 1, size=B))
    responses = torch.as_tensor(rng.integers(0, 150_000, size=(B, T)))
    mask = (torch.arange(T)[None, :] < lens[:, None]).long()
    return scores, np.array(uid, dtype=object), names, contexts, messages, responses, mask


def qwen2_render(tok_dir: str):
    """messages -> prompt ids with the Qwen2 chat template, as the trainer's ``_render``; and the two halves
    the trainer's replay passes to ``CachedRender`` (the template's text, the tokenizer without special tokens)."""
    from transformers import AutoTokenizer

    from recipe.mrtpo.cpu.tiny_model import build_qwen2_tokenizer

    tok = AutoTokenizer.from_pretrained(build_qwen2_tokenizer(tok_dir))

    def render(messages):
        out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(out["input_ids"] if hasattr(out, "keys") else out)

    def render_text(messages):
        return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def encode_batch(texts):
        return tok(texts, add_special_tokens=False)["input_ids"]

    render.text, render.encode_batch = render_text, encode_batch
    return render


def plan_once(batch, render):
    from recipe.mrtpo.core.replay_plan import build_replay_plan

    scores, uid, names, contexts, messages, responses, mask = batch
    t0 = time.perf_counter()
    plan = build_replay_plan(scores, uid, names, contexts, messages, responses, mask, render)
    return time.perf_counter() - t0, plan


def bench_scenario(name: str, render, args) -> tuple[float, float, float]:
    """One row: the plan's time without CachedRender, with it, and with it over pieces (best of ``--repeats``)."""
    from recipe.mrtpo.core.render_cache import CachedRender

    batch = make_batch(name, args.prompts, args.n)
    plain = cached = pieces = float("inf")
    calls = hits = 0
    for _ in range(args.repeats):
        t, plan = plan_once(batch, render)
        plain = min(plain, t)
        cache = CachedRender(render)  # a fresh cache per batch, as the trainer makes one per step
        t, cached_plan = plan_once(batch, cache)
        cached = min(cached, t)
        calls, hits = cache.calls, cache.hits
        piece = CachedRender(render_text=render.text, encode_batch=render.encode_batch)  # what the trainer's replay passes
        t, piece_plan = plan_once(batch, piece)
        pieces = min(pieces, t)
        enc = piece.encoder
        for other in (cached_plan, piece_plan):  # the same plan, id for id
            assert torch.equal(plan.inputs["variant_ids"], other.inputs["variant_ids"])
        assert enc.mismatches == 0
    B = batch[0].shape[0]
    print(f"{name:>6} | {B:>9} | {REWARDS:>7} | {plan.pairs_replayed:>6} | {plan.variants:>8} | {calls:>7} | "
          f"{calls - hits:>8} | {enc.pieces - enc.piece_hits:>7} | {plain:8.2f}s | {cached:8.2f}s | {pieces:8.2f}s | "
          f"{plain / pieces:7.1f}x")
    return plain, cached, pieces


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--n", type=int, default=4, help="responses per prompt (a group)")
    ap.add_argument("--scenarios", nargs="+", default=["if", "mixed"], choices=["if", "mixed"])
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        render = qwen2_render(tmp)
        print(f"Qwen2 chat template; {args.prompts} prompts x {args.n} responses, {REWARDS} rewards each (CPU, one process)")
        print(f"{'mix':>6} | {'responses':>9} | {'rewards':>7} | {'pairs':>6} | {'variants':>8} | {'renders':>7} | "
              f"{'distinct':>8} | {'pieces':>7} | {'plain':>9} | {'cached':>9} | {'pieces':>9} | {'speedup':>8}")
        rows = [bench_scenario(name, render, args) for name in args.scenarios]
    plain, cached, pieces = max(rows, key=lambda r: r[2])
    B = args.prompts * args.n
    print(f"(best of {args.repeats}; renders = render calls of the plan, distinct = chat templates actually run, "
          f"pieces = distinct text pieces tokenized by the piece encoder)")
    print(f"plan: {B} responses x {REWARDS} rewards: {pieces:.2f} s with CachedRender over pieces "
          f"({cached:.2f} s whole prompts, {plain:.2f} s without CachedRender); {pieces * 1024 / B:.2f} s per 1,024")


if __name__ == "__main__":
    main()
