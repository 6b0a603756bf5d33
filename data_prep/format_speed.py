"""Builder of the format-speed miniature's data: one-tool calling prompts for the real tool-calling
verifier (``data_source = "tool_calling"``, rewards ``format`` and ``correctness``), and demonstrations
whose format is often broken and whose argument is right about half the time, independently.

    python -m data_prep.format_speed --out-dir DIR [--seed 0] [--n-sft 4000] [--n-train 128]
                                     [--n-test 64] [--p-format 0.3] [--p-arg 0.8]
                                     [--reward tool_calling|toolrl] [--p-follow-call 0.8] [--p-follow-response 0.2]

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

``--reward toolrl`` builds the task under ToolRL's rewards (``data_source = "toolrl"``,
:mod:`recipe.mrtpo.tasks.toolrl`: ``format`` in {0, 1} by the layout of the reference answer,
``correctness`` in [-3, 3]) with a frame that the instruction decides (:data:`FRAMES`): the instruction
names one of two layouts, the call alone or the call followed by a ``<response>`` block::

    Reply in ToolRL's format: <think> </think>, then the call as JSON in <tool_call></tool_call> tags, then <response> Done </response>. Tool: set_timer(minutes: integer). Set a timer for 27 minutes.

    <think> </think>
    <tool_call>
    {"name": "set_timer", "parameters": {"minutes": 27}}
    </tool_call>
    <response> Done </response>

The instruction sentence is Z_format (``extra_info["format_instruction"]``); the prompt says nothing else
about the layout, so the token after ``</tool_call>`` (the end token or the response block's line
break) is where the instruction decides the frame. A demonstration follows the named layout with
probability ``p_follow_call`` (when it names the call alone, the warm start's default) or
``p_follow_response`` (when it names the response block), otherwise it takes the other layout: the
frame errors depend on the instruction, and each costs ``format`` only (ToolRL reads the calls from the
first ``<tool_call>`` block whatever follows it). Without the instruction (the SFT variant
``no_instruction``) the demonstration always takes the default, the call alone. The argument is right
with probability ``p_arg`` as above (ToolRL's correctness 3 when right, 1 when wrong).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Optional

from data_prep.common import fraction, print_data_card, write_splits

__all__ = ["DATA_SOURCE", "REWARDS", "FRAMES", "DEFAULT_FRAME", "FORMAT_INSTRUCTION", "TOOLS", "CORRUPTIONS", "VALUES", "tool_spec", "reference_call",
           "gold_answer", "demo_answer", "prompt_text", "verifier_block_text", "draw_example", "make_row",
           "build_splits", "toolrl_answer", "toolrl_reference_block", "make_toolrl_row", "build_toolrl_splits", "main"]

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
    _check({"p_format": p_format, "p_arg": p_arg}, p_no_instruction, p_with_reference)
    pool = [{"tool": t, "value": v} for t in TOOLS for v in VALUES]
    return _assemble(pool, f"format_speed:{seed}", n_sft, n_train, n_test, p_no_instruction, p_with_reference, make_row,
                     lambda rng, ex, variant: _demo(rng, ex, variant, p_format, p_arg))


def _check(probabilities: dict, p_no_instruction: float, p_with_reference: float) -> None:
    for what, p in (*probabilities.items(), ("p_no_instruction", p_no_instruction), ("p_with_reference", p_with_reference)):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"{what} must be in [0, 1], got {p}")
    if p_no_instruction + p_with_reference > 1.0:
        raise ValueError("p_no_instruction + p_with_reference must be at most 1")


def _assemble(pool: list[dict], tag: str, n_sft: int, n_train: int, n_test: int, p_no_instruction: float,
              p_with_reference: float, row, demo) -> dict[str, list[dict]]:
    """Shuffle ``pool`` (``random.Random(tag + ":split")``) into test, train and the SFT pool; draw ``n_sft``
    SFT rows from the latter (``tag + ":sft"``), each of a variant drawn by the two probabilities and with
    ``demo(rng, example, variant) -> (text, info)``; ``row(example, split, index, ...)`` makes a row."""
    if n_train + n_test >= len(pool):
        raise ValueError(f"n_train + n_test must be below {len(pool)} (the distinct prompts), got {n_train + n_test}")
    rng = random.Random(f"{tag}:split")
    rng.shuffle(pool)
    held = {"test": pool[:n_test], "train": pool[n_test:n_test + n_train]}
    sft_pool = pool[n_test + n_train:]
    splits = {split: [row(ex, split, i) for i, ex in enumerate(exs)] for split, exs in held.items()}
    rng = random.Random(f"{tag}:sft")
    rows = []
    for i in range(n_sft):
        ex = rng.choice(sft_pool)
        u = rng.random()
        variant = "no_instruction" if u < p_no_instruction else "with_reference" if u < p_no_instruction + p_with_reference else "plain"
        text, info = demo(rng, ex, variant)
        rows.append(row(ex, "sft", i, variant, text, info))
    splits["sft"] = rows
    return splits


# ------------------------------------------------------------------------------ ToolRL's rewards

TOOLRL_SOURCE = "toolrl"
#: --reward -> the verifier's data_source
REWARDS = {"tool_calling": DATA_SOURCE, "toolrl": TOOLRL_SOURCE}
_TOOLRL_FRAME = "Reply in ToolRL's format: <think> </think>, then the call as JSON in <tool_call></tool_call> tags, "
#: layout name -> the instruction sentence that names it (Z_format)
FRAMES = {
    "call": _TOOLRL_FRAME + "and stop there.",
    "call_response": _TOOLRL_FRAME + "then <response> Done </response>.",
}
#: the layout the warm start takes without an instruction
DEFAULT_FRAME = "call"
_THINK = "<think> </think>"
_RESPONSE = "<response> Done </response>"
# the demonstrations' defaults under ToolRL's rewards: the default layout followed 80% of the time, the
# response block only 20% (a warm start that starts near format 0.5 and whose errors the instruction decides)
P_FOLLOW_CALL = 0.8
P_FOLLOW_RESPONSE = 0.2


def toolrl_reference_block(name: str, arg: str, value: int) -> str:
    """The ``<tool_call>`` block of the reference call in ToolRL's form (``parameters``)."""
    return "<tool_call>\n" + json.dumps({"name": name, "parameters": {arg: int(value)}}) + "\n</tool_call>"


def toolrl_answer(name: str, arg: str, value: int, frame: str) -> str:
    """The answer in the layout ``frame`` (:data:`FRAMES`): think block, the call's block, and for
    ``call_response`` the response block."""
    if frame not in FRAMES:
        raise ValueError(f"frame must be one of {sorted(FRAMES)}, got {frame!r}")
    text = _THINK + "\n" + toolrl_reference_block(name, arg, value)
    return text + ("\n" + _RESPONSE if frame == "call_response" else "")


def make_toolrl_row(example: dict, split: str, index: int, variant: str = "plain", demo: Optional[str] = None,
                    demo_info: Optional[dict] = None) -> dict:
    """A ``toolrl`` row: the instruction of ``example["frame"]``, the tool and the request; the reference
    answer in that layout is the ground truth's ``answer`` (it sets the layout the format reward asks for)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    name, arg, request = example["tool"]
    value, frame = int(example["value"]), example["frame"]
    instruction = FRAMES[frame]
    parts = ([instruction] if variant != "no_instruction" else []) + [f"Tool: {name}({arg}: integer).",
                                                                       request.format(v=value)]
    content = " ".join(parts)
    if variant == "with_reference":  # P_all of the plain prompt: ToolRL's Z_correctness is the reference block
        from recipe.mrtpo.core.prompt_variants import append_to_last_user, verifier_block

        content = append_to_last_user([{"role": "user", "content": content}],
                                      verifier_block([("correctness", toolrl_reference_block(name, arg, value))]))[0]["content"]
    ground_truth = {"calls": json.dumps([reference_call(name, arg, value)]), "tools": json.dumps([tool_spec(name, arg)]),
                    "answer": toolrl_answer(name, arg, value, frame)}
    extra = {"split": split, "index": index, "variant": variant, "format_instruction": instruction, "frame": frame,
             "tool": name, "value": value}
    if demo is not None:
        extra["demo"] = demo
        extra.update(demo_info or {})
    return {"data_source": TOOLRL_SOURCE, "prompt": [{"role": "user", "content": content}], "ability": "tool_calling",
            "reward_model": {"style": "rule", "ground_truth": ground_truth}, "extra_info": extra}


def _toolrl_demo(rng: random.Random, example: dict, variant: str, p_follow: dict, p_arg: float) -> tuple[str, dict]:
    name, arg, _ = example["tool"]
    value = int(example["value"])
    arg_right = variant == "with_reference" or rng.random() < p_arg
    shown = value if arg_right else rng.choice([v for v in VALUES if v != value])
    named = example["frame"]
    if variant == "no_instruction":
        frame = DEFAULT_FRAME
    else:
        frame = named if rng.random() < p_follow[named] else next(f for f in FRAMES if f != named)
    return toolrl_answer(name, arg, shown, frame), {"demo_frame": frame, "demo_follows": frame == named,
                                                    "demo_arg_right": arg_right}


def build_toolrl_splits(seed: int = 0, n_sft: int = 4000, n_train: int = 256, n_test: int = 64,
                        p_follow_call: float = P_FOLLOW_CALL, p_follow_response: float = P_FOLLOW_RESPONSE,
                        p_arg: float = P_ARG, p_no_instruction: float = 0.25,
                        p_with_reference: float = 0.25) -> dict[str, list[dict]]:
    """The ``toolrl`` splits (module docstring): ``len(TOOLS) * len(VALUES) * len(FRAMES)`` = 720 distinct
    prompts, test and train distinct, none in sft; the SFT variants as in :func:`build_splits`."""
    _check({"p_follow_call": p_follow_call, "p_follow_response": p_follow_response, "p_arg": p_arg},
           p_no_instruction, p_with_reference)
    pool = [{"tool": t, "value": v, "frame": f} for t in TOOLS for v in VALUES for f in FRAMES]
    follow = {"call": p_follow_call, "call_response": p_follow_response}
    return _assemble(pool, f"format_speed:toolrl:{seed}", n_sft, n_train, n_test, p_no_instruction, p_with_reference,
                     make_toolrl_row, lambda rng, ex, variant: _toolrl_demo(rng, ex, variant, follow, p_arg))


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m data_prep.format_speed", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-sft", type=int, default=4000, help="demonstrations (default 4000)")
    ap.add_argument("--reward", choices=sorted(REWARDS), default="tool_calling",
                    help="tool_calling (one frame, broken after the object) or toolrl (ToolRL's rewards, the "
                         "instruction names the layout); default tool_calling")
    ap.add_argument("--n-train", type=int, default=None, help="RL prompts (default 128; 256 under toolrl)")
    ap.add_argument("--n-test", type=int, default=64, help="held-out prompts (default 64)")
    ap.add_argument("--p-format", type=fraction, default=P_FORMAT, help=f"chance that a demo's frame is right (default {P_FORMAT})")
    ap.add_argument("--p-arg", type=fraction, default=P_ARG, help=f"chance that a demo's argument is right (default {P_ARG})")
    ap.add_argument("--p-follow-call", type=fraction, default=P_FOLLOW_CALL,
                    help=f"toolrl: chance that a demo follows an instruction naming the call alone (default {P_FOLLOW_CALL})")
    ap.add_argument("--p-follow-response", type=fraction, default=P_FOLLOW_RESPONSE,
                    help="toolrl: chance that a demo follows an instruction naming the response block "
                         f"(default {P_FOLLOW_RESPONSE})")
    args = ap.parse_args(argv)
    toolrl = args.reward == "toolrl"
    n_train = args.n_train if args.n_train is not None else 256 if toolrl else 128
    if not toolrl and (args.p_follow_call != P_FOLLOW_CALL or args.p_follow_response != P_FOLLOW_RESPONSE):
        print("format_speed: --p-follow-* set the toolrl frames; --reward tool_calling has one frame", file=sys.stderr)
        return 2
    if toolrl and args.p_format != P_FORMAT:
        print("format_speed: --p-format sets the tool_calling frames; under toolrl use --p-follow-*", file=sys.stderr)
        return 2
    try:
        if toolrl:
            splits = build_toolrl_splits(args.seed, args.n_sft, n_train, args.n_test, args.p_follow_call,
                                         args.p_follow_response, args.p_arg)
        else:
            splits = build_splits(args.seed, args.n_sft, n_train, args.n_test, args.p_format, args.p_arg)
    except ValueError as e:
        print(f"format_speed: {e}", file=sys.stderr)
        return 2
    rows = [r for rs in splits.values() for r in rs]
    written = write_splits(rows, args.out_dir)  # by extra_info["split"]; the index is already 0..n-1 per split
    if toolrl:
        title = (f"format_speed toolrl (seed {args.seed}, p_follow call {args.p_follow_call:g} / response "
                 f"{args.p_follow_response:g}, p_arg {args.p_arg:g})")
        columns = [("variant", lambda r: r["extra_info"]["variant"]), ("frame named", lambda r: r["extra_info"]["frame"]),
                   ("demo frame", lambda r: r["extra_info"].get("demo_frame", "-"))]
    else:
        title = f"format_speed (seed {args.seed}, p_format {args.p_format:g}, p_arg {args.p_arg:g})"
        columns = [("variant", lambda r: r["extra_info"]["variant"]),
                   ("demo corruption", lambda r: r["extra_info"].get("demo_corruption", "-") or "none")]
    print_data_card(title, rows, columns=columns, written=written)
    return 0


if __name__ == "__main__":
    sys.exit(main())
