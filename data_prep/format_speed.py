"""Builder of the format-speed miniature's data: one-tool calling prompts for the real tool-calling
verifier (``data_source = "tool_calling"``, rewards ``format`` and ``correctness``), and demonstrations
whose format is often broken and whose argument is right about half the time, independently.

    python -m data_prep.format_speed --out-dir DIR [--seed 0] [--n-sft 4000] [--n-train 128]
                                     [--n-test 64] [--p-format 0.3] [--p-arg 0.8]

writes ``DIR/sft.parquet`` (prompts with a demonstration in ``extra_info["demo"]``), ``DIR/train.parquet``
(the RL prompts) and ``DIR/test.parquet`` (held-out prompts), and prints a data card.

A prompt (one user turn) is the format instruction (:data:`FORMAT_INSTRUCTION`, also stored as
``extra_info["format_instruction"]``, so that it is the format reward's Z_k), one tool and one request::

    Reply with the call as JSON inside <tool_call></tool_call> tags. Tool: set_timer(minutes: integer). Set a timer for 27 minutes.

The gold answer is the verifier's own rendering of the reference call (20 Qwen2 tokens)::

    <tool_call>
    {"name": "set_timer", "arguments": {"minutes": 27}}
    </tool_call>

A demonstration keeps the opening tag and the JSON object and, with probability ``1 - p_format``, breaks
the frame after the object in one of the ways of :data:`CORRUPTIONS` (closing tag missing or garbled, a
stray ``}``, text after the block): each costs ``format`` and nothing else, because the verifier's lenient
reading of the calls (``correctness``) forgives all of them. Independently, the argument is the requested
value with probability ``p_arg``, otherwise another value of 10-99 (``correctness`` 0.5: right name, one of one
argument wrong).

For the replay to have something to measure, the SFT split also teaches the model what each reward's
Z_k does (``extra_info["variant"]``): in a quarter of the SFT prompts the format instruction is left
out and the frame is always broken (the instruction is what makes the tags right), and in a quarter the
reference call is appended as the replay appends it (a ``<verifier_information>`` block, see
``recipe.mrtpo.core.prompt_variants``) and the argument is always right (the reference is what makes the
argument right), its frame still broken with probability ``1 - p_format``. Train and test prompts are
always the plain kind (instruction, no block), distinct, and none occurs in the SFT split.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Optional

from data_prep.common import fraction, print_data_card, write_splits

__all__ = ["DATA_SOURCE", "FORMAT_INSTRUCTION", "TOOLS", "CORRUPTIONS", "VALUES", "tool_spec", "reference_call",
           "gold_answer", "demo_answer", "prompt_text", "verifier_block_text", "draw_example", "make_row",
           "build_splits", "main"]

DATA_SOURCE = "tool_calling"
FORMAT_INSTRUCTION = "Reply with the call as JSON inside <tool_call></tool_call> tags."
#: (function, its one integer argument, the request with ``{v}`` for the value)
TOOLS = (
    ("set_timer", "minutes", "Set a timer for {v} minutes."),
    ("set_volume", "level", "Turn the volume to {v}."),
    ("call_room", "room", "Call room {v}."),
    ("order_pizza", "count", "Order {v} pizzas."),
)
VALUES = tuple(range(10, 100))  # two Qwen2 tokens each
#: How a demonstration breaks the frame after the JSON object (name -> text after ``<tool_call>\\n{...}``).
CORRUPTIONS = {
    "no_close": "",
    "garbled_close": "\n</tool>",
    "extra_brace": "}\n</tool_call>",
    "trailing_text": "\n</tool_call>\nDone",
}
_GOOD_TAIL = "\n</tool_call>"
VARIANTS = ("plain", "no_instruction", "with_reference")


def tool_spec(name: str, arg: str) -> dict:
    return {"name": name, "description": f"{name.replace('_', ' ')}",
            "parameters": {"type": "object", "properties": {arg: {"type": "integer"}}, "required": [arg]}}


def reference_call(name: str, arg: str, value: int) -> dict:
    return {"name": name, "arguments": {arg: int(value)}}


def _json_object(name: str, arg: str, value: int) -> str:
    return json.dumps({"name": name, "arguments": {arg: int(value)}})


def gold_answer(name: str, arg: str, value: int) -> str:
    """The verifier's rendering of the reference call (``render_tool_calls``)."""
    from recipe.mrtpo.tasks.tool_reference import render_tool_calls

    return render_tool_calls([reference_call(name, arg, value)])


def demo_answer(name: str, arg: str, value: int, corruption: Optional[str]) -> str:
    """``<tool_call>\\n{json}`` + the good closing or a :data:`CORRUPTIONS` tail."""
    tail = _GOOD_TAIL if corruption is None else CORRUPTIONS[corruption]
    return "<tool_call>\n" + _json_object(name, arg, value) + tail


def prompt_text(tool: tuple, value: int, instruction: bool = True) -> str:
    name, arg, request = tool
    parts = ([FORMAT_INSTRUCTION] if instruction else []) + [f"Tool: {name}({arg}: integer).", request.format(v=value)]
    return " ".join(parts)


def verifier_block_text(name: str, arg: str, value: int) -> str:
    """The block the replay appends for Z_correctness (``prompt_variants.verifier_block``)."""
    from recipe.mrtpo.core.prompt_variants import verifier_block

    return verifier_block([("correctness", gold_answer(name, arg, value))])


def draw_example(rng: random.Random) -> dict:
    tool = rng.choice(TOOLS)
    return {"tool": tool, "value": rng.choice(VALUES)}


def make_row(example: dict, split: str, index: int, variant: str = "plain", demo: Optional[str] = None,
             demo_info: Optional[dict] = None) -> dict:
    """A verl row for one drawn example (``variant``: see the module docstring; only SFT rows use others)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    name, arg, _ = example["tool"]
    value = int(example["value"])
    content = prompt_text(example["tool"], value, instruction=variant != "no_instruction")
    if variant == "with_reference":
        from recipe.mrtpo.core.prompt_variants import append_to_last_user

        content = append_to_last_user([{"role": "user", "content": content}],
                                      verifier_block_text(name, arg, value))[0]["content"]
    ground_truth = {"calls": json.dumps([reference_call(name, arg, value)]), "tools": json.dumps([tool_spec(name, arg)])}
    extra = {"split": split, "index": index, "variant": variant, "format_instruction": FORMAT_INSTRUCTION,
             "tool": name, "value": value}
    if demo is not None:
        extra["demo"] = demo
        extra.update(demo_info or {})
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": content}],
        "ability": "tool_calling",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": extra,
    }


def _demo(rng: random.Random, example: dict, variant: str, p_format: float, p_arg: float) -> tuple[str, dict]:
    name, arg, _ = example["tool"]
    value = int(example["value"])
    arg_right = variant == "with_reference" or rng.random() < p_arg
    shown = value if arg_right else rng.choice([v for v in VALUES if v != value])
    fmt_ok = variant != "no_instruction" and rng.random() < p_format
    corruption = None if fmt_ok else rng.choice(sorted(CORRUPTIONS))
    return demo_answer(name, arg, shown, corruption), {"demo_corruption": corruption or "", "demo_arg_right": arg_right}


# the demonstrations' defaults, also the format-speed experiment's: a frame right 30% of the time; an argument
# right 80% of the time (0.5 left the warm-started model's copied argument right in only 26% of its samples)
P_FORMAT = 0.3
P_ARG = 0.8


def _key(example: dict) -> tuple:
    return (example["tool"][0], int(example["value"]))


def build_splits(seed: int = 0, n_sft: int = 4000, n_train: int = 128, n_test: int = 64, p_format: float = P_FORMAT,
                 p_arg: float = P_ARG, p_no_instruction: float = 0.25, p_with_reference: float = 0.25) -> dict[str, list[dict]]:
    """``{"test": rows, "train": rows, "sft": rows}``; test and train prompts distinct, none in sft.

    There are ``len(TOOLS) * len(VALUES)`` = 360 distinct (tool, value) prompts; ``n_train + n_test``
    must leave some for the SFT split (whose prompts repeat, each time with a fresh demonstration)."""
    for what, p in (("p_format", p_format), ("p_arg", p_arg), ("p_no_instruction", p_no_instruction),
                    ("p_with_reference", p_with_reference)):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"{what} must be in [0, 1], got {p}")
    if p_no_instruction + p_with_reference > 1.0:
        raise ValueError("p_no_instruction + p_with_reference must be at most 1")
    pool = [{"tool": t, "value": v} for t in TOOLS for v in VALUES]
    if n_train + n_test >= len(pool):
        raise ValueError(f"n_train + n_test must be below {len(pool)} (the distinct prompts), got {n_train + n_test}")
    rng = random.Random(f"format_speed:{seed}:split")
    rng.shuffle(pool)
    held = {"test": pool[:n_test], "train": pool[n_test:n_test + n_train]}
    sft_pool = pool[n_test + n_train:]
    splits = {split: [make_row(ex, split, i) for i, ex in enumerate(exs)] for split, exs in held.items()}
    rng = random.Random(f"format_speed:{seed}:sft")
    rows = []
    for i in range(n_sft):
        ex = rng.choice(sft_pool)
        u = rng.random()
        variant = "no_instruction" if u < p_no_instruction else "with_reference" if u < p_no_instruction + p_with_reference else "plain"
        demo, info = _demo(rng, ex, variant, p_format, p_arg)
        rows.append(make_row(ex, "sft", i, variant, demo, info))
    splits["sft"] = rows
    return splits


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m data_prep.format_speed", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-sft", type=int, default=4000, help="demonstrations (default 4000)")
    ap.add_argument("--n-train", type=int, default=128, help="RL prompts (default 128)")
    ap.add_argument("--n-test", type=int, default=64, help="held-out prompts (default 64)")
    ap.add_argument("--p-format", type=fraction, default=P_FORMAT, help=f"chance that a demo's frame is right (default {P_FORMAT})")
    ap.add_argument("--p-arg", type=fraction, default=P_ARG, help=f"chance that a demo's argument is right (default {P_ARG})")
    args = ap.parse_args(argv)
    try:
        splits = build_splits(args.seed, args.n_sft, args.n_train, args.n_test, args.p_format, args.p_arg)
    except ValueError as e:
        print(f"format_speed: {e}", file=sys.stderr)
        return 2
    rows = [r for rs in splits.values() for r in rs]
    written = write_splits(rows, args.out_dir)  # by extra_info["split"]; the index is already 0..n-1 per split
    print_data_card(
        f"format_speed (seed {args.seed}, p_format {args.p_format:g}, p_arg {args.p_arg:g})",
        rows,
        columns=[("variant", lambda r: r["extra_info"]["variant"]),
                 ("demo corruption", lambda r: r["extra_info"].get("demo_corruption", "-") or "none")],
        written=written,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
