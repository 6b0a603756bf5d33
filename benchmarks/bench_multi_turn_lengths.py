"""Benchmark: the BFCL multi-turn run scripts' length limits against the shipped data's gold trajectories.

    python benchmarks/bench_multi_turn_lengths.py [--max-prompt 8192] [--max-response 8192] \\
        [--max-tool-chars 16384] [--every 1] [--categories base,long_context,miss_func,miss_param]

The limits are ``run_scripts/common.sh``'s for ``toolcall_multiturn``: ``MAX_PROMPT_LENGTH``
(``data.max_prompt_length``), ``MAX_RESPONSE_LENGTH`` (``rollout.response_length``: the whole trajectory)
and ``actor_rollout_ref.rollout.multi_turn.max_tool_response_length`` (characters of one tool result); pass
them as arguments (the defaults are the script's values when this was written).

For every question of the installed ``bfcl-eval``'s four multi-turn categories (800; ``--every N``: every
N-th scenario), the row is built by ``data_prep.multi_turn`` (:func:`data_prep.multi_turn.multi_turn_row`,
split by :func:`data_prep.multi_turn.scenario_splits`, as ``build_rows`` does; instead of its gold check,
``gold ok`` below scores the loop's record) and played by the recipe's own agent loop
(:class:`recipe.mrtpo.agent.bfcl_loop.BFCLMultiTurnAgentLoop`, built as verl's worker builds it, no Ray,
no GPU) against a scripted server that writes BFCL's gold answer, over the real Qwen2 tokenizer
(``.assets/qwen/qwen.tiktoken``, :func:`recipe.mrtpo.cpu.tiny_model.build_qwen2_tokenizer`):

- **prompt tokens**: the loop's first-turn render (verl's Continuous Token ``build_initial_tokens`` with
  ``tools=`` the row's specs, :func:`recipe.mrtpo.agent.bfcl_env.tools_of_row`), i.e.
  ``len(apply_chat_template(prompt, tools=tools, add_generation_prompt=True))``;
- **response tokens**: the loop's whole response for the gold trajectory, as it would reach the trainer:
  the model's steps, every tool result as the loop feeds it back (cut by the loop at ``--max-tool-chars``
  characters on ``--truncate-side``, verl's cut; the cut results are counted), the injected user turns and
  miss_func's held-out functions message (:func:`recipe.mrtpo.agent.bfcl_env.injected_turn`), and the
  template's turn boundaries. The loop runs with an unbounded response budget, so a trajectory over
  ``--max-response`` is measured whole, and counted in ``>resp``;
- the split of the response by span kind (``model`` / ``tool`` / ``user``: the loop's ``bfcl_spans``), the
  longest tool result in characters before the cut, and ``gold ok``: the loop's record of the trajectory
  scores 1 on ``state`` and ``response`` through the task's verifier (the measured trajectory is BFCL's
  gold one);
- ``ok@limit``: the same within the limits: a trajectory over ``--max-response`` is played again with it as
  the loop's budget (the loop then stops where a tool result or user turn would not fit, ``response_length``,
  and the turns after it are never played) and its record scored again.

The gold trajectory as the model would write it (:func:`gold_script`): per turn whose gold makes calls, one
step with all of that turn's gold calls (at most the loop's ``max_calls_per_step``, 64, per step; BFCL's
longest gold turn has 34), each a Qwen2.5 ``<tool_call>`` JSON block written by the recipe's
:func:`recipe.mrtpo.tasks.tool_reference.render_tool_calls` (BFCL's positional arguments named by the
backend method's signature), then a plain-text step that ends the turn (``--answer``, default "Done.");
a turn whose gold makes no call is one plain-text step (the text ``data_prep.multi_turn.gold_record`` writes
there). **Approximations** (printed under the table): this is a *lower bound* on a real model's response:
no reasoning or prose beyond ``--answer``, all of a turn's calls in one step where the loop allows (a model that calls
sequentially adds a ``<|im_end|>`` / tool turn / ``<|im_start|>assistant`` boundary per extra step, and its
extra results), and no failed or repeated calls. The chat template is Qwen2.5-style ChatML with a tools
block (:data:`TOOLS_BLOCK` + :data:`recipe.mrtpo.cpu.tiny_model.CHATML_TEMPLATE`, the template of
``tests/unit/test_bfcl_loop.py``); Qwen2.5-Instruct's own template writes the same tools list and tool
turns, but a longer fixed preamble around ``<tools>`` in the system turn (a few dozen tokens more per prompt,
none in the response). Backends run in-process (the loop's ``isolation: thread``, a 60 s call limit: the
results are the same as in the child process; only the timing differs).

Output: one row per category and one for all, then the per-split figures (train / test), the
approximations line, and a JSON line with the totals (``--json-out``: every question's figures). The
repository root is put on the path; set ``HF_HUB_OFFLINE=1`` (nothing is downloaded). All 800 take about
4 minutes on the 2-core CI machine (long_context's states and outputs are the bulk).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import math
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # the repository tree, installed or not (as bench_noise_floor.py)
    sys.path.insert(0, str(REPO))

CATEGORIES = ("base", "long_context", "miss_func", "miss_param")
DEFAULT_ANSWER = "Done."
#: the Qwen2.5-style tools block ``tests/unit/test_bfcl_loop.py`` prepends to the ChatML template (restated:
#: it is a test's constant; ``tests/unit/test_bench_multi_turn_lengths.py`` checks the two are equal)
TOOLS_BLOCK = (
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags.<|im_end|>\\n' }}{%- endif %}"
)
APPROXIMATIONS = (
    "lower bound: gold calls only, one call step per turn (<= max_calls_per_step calls each), closing text {answer!r}, no reasoning; "
    "template: ChatML + Qwen2.5-style tools block (Qwen2.5-Instruct's own preamble adds a few dozen prompt tokens)"
)
CALL_TIMEOUT_S = 60.0  # a backend call's limit here (the loop's default is 10 s; timing is not measured)


# --------------------------------------------------------------------------------------------------
# Rows, tokenizer, the gold script
# --------------------------------------------------------------------------------------------------


def rows_of(categories=CATEGORIES, every: int = 1, first: Optional[int] = None, seed: int = 0,
            test_fraction: Optional[float] = None) -> list[dict]:
    """The rows ``data_prep.multi_turn`` builds for these categories (its ``multi_turn_row``, split by its
    ``scenario_splits`` over every loaded question, as ``build_rows`` does), each with ``"gold"`` (BFCL's gold
    turns) added; only every ``every``-th scenario, and only the ``first`` questions of each category."""
    from data_prep.multi_turn import DEFAULT_TEST_FRACTION, multi_turn_row, scenario_splits
    from recipe.mrtpo.tasks.multi_turn.official import load_category

    loaded = {c: load_category(c) for c in categories}
    frac = DEFAULT_TEST_FRACTION if test_fraction is None else test_fraction
    splits = scenario_splits([q for c in categories for q, _ in loaded[c]], seed, frac)
    rows = []
    for c in categories:
        taken = 0
        for entry, gold in loaded[c]:
            scenario = int(entry["id"].rsplit("_", 1)[1])
            if scenario % every:
                continue
            if first is not None and taken >= first:
                break
            taken += 1
            row = multi_turn_row(entry, gold, c)
            row["extra_info"]["split"] = splits[scenario]
            row["gold"] = gold
            rows.append(row)
    return rows


def qwen_tokenizer(cache_dir: Optional[Path] = None):
    """The real Qwen2 tokenizer (from ``.assets/qwen/qwen.tiktoken``) with :data:`TOOLS_BLOCK` +
    ``CHATML_TEMPLATE`` as its chat template (``tests/unit/test_bfcl_loop.py``'s). The converted tokenizer
    is cached in ``cache_dir`` (default: a folder under the system's temp dir)."""
    from transformers import AutoTokenizer

    from recipe.mrtpo.cpu.tiny_model import CHATML_TEMPLATE, build_qwen2_tokenizer

    cache = Path(cache_dir) if cache_dir is not None else Path(tempfile.gettempdir()) / "mrtpo_qwen2_tokenizer"
    tok = AutoTokenizer.from_pretrained(build_qwen2_tokenizer(cache))
    tok.chat_template = TOOLS_BLOCK + CHATML_TEMPLATE
    return tok


def prompt_token_count(tokenizer, row: dict) -> int:
    """Tokens of the row's first turn rendered as the loop renders it: ``tools=`` the row's specs,
    the generation prompt appended (the direct render; the loop's own count is :func:`measure`'s)."""
    from recipe.mrtpo.agent.bfcl_env import tools_of_row

    ids = tokenizer.apply_chat_template(row["prompt"], tools=tools_of_row(row["extra_info"]),
                                        add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # a BatchEncoding in newer transformers
        ids = ids["input_ids"]
    return len(ids)


def _methods(row: dict) -> dict:
    """Method name -> the backend's function (signatures only; BFCL's name mapping: a later class overrides)."""
    import importlib

    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    out: dict = {}
    for c in row["extra_info"]["involved_classes"]:
        cls = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[c]), c)
        out.update({n: f for n, f in inspect.getmembers(cls, predicate=inspect.isfunction) if not n.startswith("_")})
    return out


def model_calls(calls: list[str], methods: dict) -> str:
    """BFCL gold call strings as the model writes them: Qwen2.5 ``<tool_call>`` JSON blocks (the recipe's
    ``render_tool_calls``), positional arguments named by the backend method's signature."""
    from recipe.mrtpo.tasks.multi_turn.calls import parse_call
    from recipe.mrtpo.tasks.tool_reference import render_tool_calls

    out = []
    for text in calls:
        c = parse_call(text)
        bound = inspect.signature(methods[c.name]).bind(None, *c.args, **dict(c.kwargs))  # None: self
        args = {k: v for k, v in bound.arguments.items() if k != "self"}
        out.append({"name": c.name, "arguments": args})
    return render_tool_calls(out)


def default_max_calls() -> int:
    """The loop's ``max_calls_per_step`` default (``BFCLLoopConfig``; ``bfcl_agent_loop.yaml`` sets the same)."""
    from recipe.mrtpo.agent.bfcl_loop import BFCLLoopConfig

    return BFCLLoopConfig().max_calls_per_step


def call_steps(calls: list[str], max_calls: int) -> list[list[str]]:
    """A turn's gold calls as the loop's steps: in order, at most ``max_calls`` per step (more in one step is
    the loop's ``too_many_calls`` decode error)."""
    return [calls[i:i + max_calls] for i in range(0, len(calls), max_calls)]


def gold_script(row: dict, answer: str = DEFAULT_ANSWER, max_calls: Optional[int] = None) -> list[str]:
    """The texts the scripted model writes for the row's gold trajectory (module docstring): per turn its
    call steps (:func:`call_steps`) then ``answer``, or the no-call text."""
    from data_prep.multi_turn import gold_record

    max_calls = default_max_calls() if max_calls is None else max_calls
    no_call = gold_record([[]])["turns"][0]["steps"][0]["text"]  # the builder's text for a no-call turn
    methods = _methods(row)
    texts = []
    for calls in row["gold"]:
        if calls:
            texts += [model_calls(step, methods) for step in call_steps(calls, max_calls)] + [answer]
        else:
            texts.append(no_call)
    return texts


# --------------------------------------------------------------------------------------------------
# The loop, played against a scripted server
# --------------------------------------------------------------------------------------------------


class ScriptedServer:
    """verl's server manager, scripted: each ``generate`` returns the next text's ids + ``<|im_end|>``."""

    def __init__(self, tokenizer, script: list[str]):
        self.tok, self.script, self.calls = tokenizer, script, 0
        self.end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        text = self.script[self.calls] if self.calls < len(self.script) else DEFAULT_ANSWER
        self.calls += 1
        ids = self.tok.encode(text, add_special_tokens=False) + [self.end_id]
        return TokenOutput(token_ids=ids[: sampling_params["max_tokens"]])


BIG = 1 << 30  # a budget that never binds: trajectories are measured whole


def make_loop(tokenizer, server, max_tool_chars: int, truncate_side: str = "middle", response_length: int = BIG):
    """The recipe's agent loop, built as verl's worker builds it, with an unbounded prompt budget, the response
    budget ``response_length`` (default: unbounded) and the tool-result cut at ``max_tool_chars``; backends
    in-process. ``loop.tool_chars`` collects the length of every tool result before the cut."""
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap

    from recipe.mrtpo.agent.bfcl_loop import BFCLMultiTurnAgentLoop

    cfg = OmegaConf.create({
        "actor_rollout_ref": {"rollout": {
            "prompt_length": BIG, "response_length": response_length, "full_determinism": False,
            "multi_turn": {"max_assistant_turns": None, "max_tool_response_length": max_tool_chars,
                           "tool_response_truncate_side": truncate_side}}},
        "data": {"apply_chat_template_kwargs": {}},
    })
    loop = BFCLMultiTurnAgentLoop(trainer_config=DictConfigWrap(cfg), server_manager=server, tokenizer=tokenizer,
                                  processor=None, dataset_cls=None, data_config=DictConfigWrap(cfg.data),
                                  hf_model_type="qwen2", tools=None, name="bfcl_multi_turn",
                                  isolation="thread", call_timeout_s=CALL_TIMEOUT_S)
    loop.tool_chars = []
    make = loop.make_env

    def make_env(entry):
        env = make(entry)
        execute = env.execute

        def measured(name, arguments, timeout_s):
            res = execute(name, arguments, timeout_s)
            loop.tool_chars.append(len(res.text))
            return res

        env.execute = measured
        return env

    loop.make_env = make_env
    return loop


@dataclass
class Lengths:
    """One question's measured lengths (module docstring)."""

    id: str
    category: str
    split: str
    prompt: int  # tokens of the first turn with tools=
    response: int  # tokens of the gold trajectory's response
    by_kind: dict = field(default_factory=dict)  # span kind -> tokens
    tool_results: int = 0
    tool_cut: int = 0  # results longer than max_tool_chars (cut by the loop)
    max_tool_chars: int = 0  # the longest result before the cut
    end: str = ""
    reasons: dict = field(default_factory=dict)
    gold_ok: Optional[bool] = None
    #: over the response limit: the trajectory played again with the limit as the loop's budget, how it ended
    #: and whether its record still scores 1 on state and response (None: within the limit, or not verified)
    end_at_limit: Optional[str] = None
    ok_at_limit: Optional[bool] = None


def play(tokenizer, row: dict, max_tool_chars: int, truncate_side: str = "middle", answer: str = DEFAULT_ANSWER,
         response_length: int = BIG):
    """The loop's output for the row's gold trajectory, and the loop (``tool_chars``)."""
    server = ScriptedServer(tokenizer, gold_script(row, answer))

    async def go():  # the loop is built inside the event loop it runs on (verl's AgentLoopBase takes it)
        loop = make_loop(tokenizer, server, max_tool_chars, truncate_side, response_length)
        return await loop.run({"temperature": 1.0}, raw_prompt=row["prompt"], extra_info=row["extra_info"]), loop

    return asyncio.run(go())


def gold_ok(out, row: dict) -> bool:
    """The loop's record scores 1 on ``state`` and ``response`` through the task's verifier."""
    from recipe.mrtpo.tasks.multi_turn.verifier import score

    s = score(out.extra_fields["bfcl_trajectory"], row["reward_model"]["ground_truth"], row["extra_info"]).scores
    return s.get("state") == 1.0 and s.get("response") == 1.0


def measure(tokenizer, row: dict, max_tool_chars: int, truncate_side: str = "middle",
            answer: str = DEFAULT_ANSWER, verify: bool = True, max_response: Optional[int] = None) -> Lengths:
    """Play the row's gold trajectory through the agent loop and count (module docstring); a trajectory over
    ``max_response`` is played again with it as the loop's budget (``end_at_limit``, ``ok_at_limit``)."""
    out, loop = play(tokenizer, row, max_tool_chars, truncate_side, answer)
    info = out.extra_fields["bfcl_loop"]
    kinds: Counter = Counter()
    for kind, a, b, *_ in out.extra_fields["bfcl_spans"]:
        kinds[kind] += b - a
    ok = gold_ok(out, row) if verify else None
    end_at_limit = ok_at_limit = None
    if max_response is not None and len(out.response_ids) > max_response:
        cut_out, _ = play(tokenizer, row, max_tool_chars, truncate_side, answer, response_length=max_response)
        end_at_limit = cut_out.extra_fields["bfcl_loop"]["end"]
        ok_at_limit = gold_ok(cut_out, row) if verify else None
    ex = row["extra_info"]
    return Lengths(id=ex["id"], category=ex["category"], split=ex["split"], prompt=len(out.prompt_ids),
                   response=len(out.response_ids), by_kind=dict(kinds), tool_results=len(loop.tool_chars),
                   tool_cut=sum(n > max_tool_chars for n in loop.tool_chars),
                   max_tool_chars=max(loop.tool_chars, default=0), end=info["end"], reasons=dict(info["reasons"]),
                   gold_ok=ok, end_at_limit=end_at_limit, ok_at_limit=ok_at_limit)


# --------------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------------


def percentile(values: list, q: float) -> int:
    """Nearest-rank percentile (the smallest value with at least ``q``% of the values at or below it)."""
    if not values:
        return 0
    s = sorted(values)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def summarise(items: list[Lengths], max_prompt: int, max_response: int) -> dict:
    """Per-group figures: n, prompt and response p50/p90/p99/max, counts over the limits, tool cuts."""
    p = [x.prompt for x in items]
    r = [x.response for x in items]
    return {
        "n": len(items),
        "prompt": [percentile(p, q) for q in (50, 90, 99, 100)],
        "response": [percentile(r, q) for q in (50, 90, 99, 100)],
        "over_prompt": sum(v > max_prompt for v in p),
        "over_response": sum(v > max_response for v in r),
        "tool_results": sum(x.tool_results for x in items),
        "tool_cut": sum(x.tool_cut for x in items),
        "questions_cut": sum(x.tool_cut > 0 for x in items),
        "max_tool_chars": max((x.max_tool_chars for x in items), default=0),
        "gold_ok": sum(bool(x.gold_ok) for x in items),
        "verified": sum(x.gold_ok is not None for x in items),
        # within the limits: gold ok, and over the response limit still ok when the loop stops at it
        "ok_within": sum(bool(x.ok_at_limit if x.end_at_limit is not None else x.gold_ok) for x in items),
        "not_completed": sum(x.end != "completed" for x in items),
    }


HEADER = ("group", "n", "prompt p50/p90/p99/max", ">prompt", "response p50/p90/p99/max", ">resp",
          "cut/results", "q cut", "max chars", "gold ok", "ok@limit")


def table_lines(groups: list[tuple[str, dict]]) -> list[str]:
    """The printed table: one line per group."""
    widths = (14, 4, 24, 7, 26, 6, 12, 5, 9, 7, 8)
    lines = [" | ".join(h.ljust(w) for h, w in zip(HEADER, widths)), "-" * (sum(widths) + 3 * (len(widths) - 1))]
    for name, s in groups:
        cells = (name, s["n"], "/".join(map(str, s["prompt"])), s["over_prompt"], "/".join(map(str, s["response"])),
                 s["over_response"], f"{s['tool_cut']}/{s['tool_results']}", s["questions_cut"], s["max_tool_chars"],
                 f"{s['gold_ok']}/{s['verified']}", f"{s['ok_within']}/{s['verified']}")
        lines.append(" | ".join(str(c).ljust(w) for c, w in zip(cells, widths)))
    return lines


def run(tokenizer, rows: list[dict], max_tool_chars: int, truncate_side: str = "middle",
        answer: str = DEFAULT_ANSWER, verify: bool = True, max_response: Optional[int] = None, log=None) -> list[Lengths]:
    """:func:`measure` of every row."""
    out = []
    for i, row in enumerate(rows, 1):
        out.append(measure(tokenizer, row, max_tool_chars, truncate_side, answer, verify, max_response))
        if log is not None and (i % 50 == 0 or i == len(rows)):
            log(f"  {i}/{len(rows)} measured")
    return out


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-prompt", type=int, default=8192, help="MAX_PROMPT_LENGTH of run_scripts/common.sh")
    ap.add_argument("--max-response", type=int, default=8192, help="MAX_RESPONSE_LENGTH of run_scripts/common.sh")
    ap.add_argument("--max-tool-chars", type=int, default=16384,
                    help="actor_rollout_ref.rollout.multi_turn.max_tool_response_length of run_scripts/common.sh")
    ap.add_argument("--truncate-side", default="middle", choices=("left", "right", "middle"),
                    help="multi_turn.tool_response_truncate_side (verl's default: middle)")
    ap.add_argument("--every", type=int, default=1, help="every N-th scenario (default 1: all 800 questions)")
    ap.add_argument("--first", type=int, default=None, help="only the first N questions of each category")
    ap.add_argument("--categories", default=",".join(CATEGORIES))
    ap.add_argument("--answer", default=DEFAULT_ANSWER, help="the plain text that ends a turn after its calls")
    ap.add_argument("--no-verify", action="store_true", help="skip scoring each trajectory through the verifier")
    ap.add_argument("--tokenizer-cache", type=Path, default=None, help="folder for the converted Qwen2 tokenizer")
    ap.add_argument("--json-out", type=Path, default=None, help="write every question's figures here (JSON Lines)")
    args = ap.parse_args(argv)
    cats = [c for c in args.categories.split(",") if c]
    bad = [c for c in cats if c not in CATEGORIES]
    if bad or not cats:
        print(f"error: unknown categories {bad}; choose from {CATEGORIES}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    tok = qwen_tokenizer(args.tokenizer_cache)
    rows = rows_of(cats, max(1, args.every), args.first)
    print(f"{len(rows)} questions (every {max(1, args.every)}-th scenario), limits: prompt {args.max_prompt} tokens, "
          f"response {args.max_response} tokens, tool result {args.max_tool_chars} characters ({args.truncate_side})",
          file=sys.stderr)
    items = run(tok, rows, args.max_tool_chars, args.truncate_side, args.answer, not args.no_verify,
                args.max_response, log=lambda m: print(m, file=sys.stderr))
    if args.json_out is not None:
        with open(args.json_out, "w", encoding="utf-8") as f:
            for x in items:
                f.write(json.dumps(x.__dict__) + "\n")
    groups = [(c, summarise([x for x in items if x.category == c], args.max_prompt, args.max_response)) for c in cats]
    total = summarise(items, args.max_prompt, args.max_response)
    groups.append(("all", total))
    for split in ("train", "test"):
        groups.append((f"all {split}", summarise([x for x in items if x.split == split], args.max_prompt,
                                                 args.max_response)))
    print(f"limits: prompt {args.max_prompt} tokens, response {args.max_response} tokens, "
          f"tool result {args.max_tool_chars} characters (cut: {args.truncate_side})")
    for line in table_lines(groups):
        print(line)
    kinds = Counter()
    for x in items:
        kinds.update(x.by_kind)
    print("response tokens by span kind (all questions): "
          + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
    longest = sorted(items, key=lambda x: -x.response)[:5]
    print("longest responses: " + ", ".join(f"{x.id} {x.response} (tool {x.by_kind.get('tool', 0)})" for x in longest))
    reasons = Counter()
    for x in items:
        reasons.update(x.reasons)
    print(f"loop reasons: {dict(reasons) or 'none'}; trajectories not completed: {total['not_completed']}")
    ends = Counter(x.end_at_limit for x in items if x.end_at_limit is not None)
    print(f"over {args.max_response} response tokens, played again with it as the loop's budget: "
          f"{sum(ends.values())} trajectories, ended {dict(ends) or '-'}; "
          f"still gold ok {sum(bool(x.ok_at_limit) for x in items if x.end_at_limit is not None)}")
    print("approximations: " + APPROXIMATIONS.format(answer=args.answer))
    print(json.dumps({"questions": total["n"], "over_prompt": total["over_prompt"],
                      "over_response": total["over_response"], "tool_cut": total["tool_cut"],
                      "tool_results": total["tool_results"], "gold_ok": total["gold_ok"],
                      "ok_within_limits": total["ok_within"],
                      "seconds": round(time.perf_counter() - start, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
