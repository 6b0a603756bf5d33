"""The command line of the evaluation (``python -m recipe.mrtpo.tools.eval``; see :mod:`harness`).

Public names: :func:`build_parser`, :func:`main`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Optional

from recipe.mrtpo.tasks.sql_compare import SQL_MODES
from recipe.mrtpo.tools.eval.items import EvalError
from recipe.mrtpo.tools.eval.metrics import TASK_FAMILY
from recipe.mrtpo.tools.eval.multi_turn import DEFAULT_RESPONSE_LENGTH, ON_DECODE_ERROR
from recipe.mrtpo.tools.eval.run import run_eval

__all__ = ["build_parser", "main"]


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m recipe.mrtpo.tools.eval",
        description="Generate with a model on an evaluation set and score it with the MRTPO verifiers.",
        epilog="Resumable: per-item records go to OUT.partial; rerun the same command to continue.",
    )
    p.add_argument("--task", required=True, choices=sorted(TASK_FAMILY))
    p.add_argument("--model", required=True, help="model directory (or hub name, if reachable)")
    p.add_argument("--out", required=True, type=Path, help="result JSON (its cache: OUT.partial)")
    p.add_argument("--data", type=Path, default=None, help="verl parquet file (default data/<task>/test.parquet)")
    p.add_argument("--limit", type=_non_negative_int, default=None, help="only the first N items")
    p.add_argument("--backend", choices=("auto", "vllm", "hf"), default="auto",
                   help="auto: vllm if installed and a GPU is visible, else hf (transformers)")
    p.add_argument("--max-new-tokens", type=_positive_int, default=2048, help="per response (default 2048)")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling, with --temperature > 0 (default 1)")
    p.add_argument("--n", type=_positive_int, default=1, help="samples per prompt (needs --temperature > 0)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--batch-size", type=_positive_int, default=None,
                   help="prompts per generate call, and per cache flush (default 8 for hf, 256 for vllm)")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                   help="auto: the model's for vllm; bfloat16 on GPU, float32 on CPU for hf")
    p.add_argument("--chat-template-kwargs", type=_json_object, default={},
                   help='extra chat-template variables as JSON, e.g. \'{"enable_thinking": false}\'')
    p.add_argument("--max-model-len", type=_positive_int, default=None, help="vllm only")
    p.add_argument("--tensor-parallel-size", type=_positive_int, default=1, help="vllm only")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="vllm only (default 0.9)")
    p.add_argument("--overwrite", action="store_true", help="discard OUT.partial and generate everything")
    p.add_argument("--rescore", action="store_true", help="re-run the verifiers on cached responses")
    p.add_argument("--strip-reasoning", action="store_true",
                   help="ifeval/ifbench: check the answer after the first </think> (an unterminated <think> "
                        "passes nothing); off by default: the official scripts check the response as generated")
    p.add_argument("--sql-mode", choices=SQL_MODES, default=None,
                   help="spider/bird/chinook: keep_distinct (test-suite-sql-eval's --keep_distinct) or "
                        "spider_default (DISTINCT removed from both queries, test-suite's default); "
                        "default: each row's extra_info['sql_mode'], else keep_distinct")
    p.add_argument("--sql-timeout-s", type=float, default=None,
                   help="spider/bird/chinook: per-query time limit in seconds, at most 60 (test-suite's "
                        "nominal limit); default: each row's extra_info['sql_timeout_s'], else 2")
    mt = p.add_argument_group("bfcl_multi_turn (the agent loop; refused for other tasks)")
    mt.add_argument("--response-length", type=_positive_int, default=None,
                    help=f"tokens of a whole trajectory: model, tool results and injected turns (verl's "
                         f"rollout.response_length; default {DEFAULT_RESPONSE_LENGTH}); --max-new-tokens bounds "
                         f"one generation")
    mt.add_argument("--on-decode-error", choices=ON_DECODE_ERROR, default=None,
                    help="a step whose <tool_call> does not decode: end_turn (BFCL's protocol, the default) or "
                         "feedback (an error message back to the model, as in training)")
    return p


def _check_multi_turn(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    given = [f for f, v in (("--response-length", args.response_length), ("--on-decode-error", args.on_decode_error))
             if v is not None]
    if TASK_FAMILY[args.task] != "multi_turn":
        if given:
            p.error(f"{', '.join(given)}: only for --task bfcl_multi_turn")
        return
    if args.n > 1:
        p.error("--n > 1: bfcl_multi_turn plays one trajectory per question")
    if args.response_length is None:
        args.response_length = DEFAULT_RESPONSE_LENGTH
    if args.on_decode_error is None:
        args.on_decode_error = "end_turn"


def _check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        p.error(f"--temperature must be >= 0, got {args.temperature}")
    if not (0 < args.top_p <= 1):
        p.error(f"--top-p must be in (0, 1], got {args.top_p}")
    if args.n > 1 and args.temperature == 0:
        p.error("--n > 1 needs --temperature > 0 (greedy samples are identical)")
    if args.sql_timeout_s is not None and not (math.isfinite(args.sql_timeout_s) and 0 < args.sql_timeout_s <= 60):
        p.error(f"--sql-timeout-s must be in (0, 60], got {args.sql_timeout_s}")
    if not (0 < args.gpu_memory_utilization <= 1):
        p.error(f"--gpu-memory-utilization must be in (0, 1], got {args.gpu_memory_utilization}")
    _check_multi_turn(p, args)


def _summary(result: dict) -> str:
    lines = [f"{result['task']}: {result['n']} items ({result['stats']['generated']} generated, "
             f"{result['stats']['reused']} reused)"]
    for k, v in result["metrics"].items():
        if isinstance(v, dict) and k in ("by_category",) and result["task"] == "bfcl_multi_turn":
            for cat, g in v.items():
                lines.append(f"  {cat:<28} {g['accuracy']:.4f}  (n={g['n']})")
        elif isinstance(v, float):
            lines.append(f"  {k:<28} {v:.4f}")
        elif isinstance(v, int):
            lines.append(f"  {k:<28} {v}")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    _check_args(p, args)
    try:
        result = run_eval(args)
    except (FileNotFoundError, EvalError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(_summary(result))
    print(f"wrote {args.out}")
    return 0
