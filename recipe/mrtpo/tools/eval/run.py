"""The evaluation loop: load the items, reuse the cached records, generate and score the rest, aggregate.

Scoring options (``--strip-reasoning``, ``--sql-mode``, ``--sql-timeout-s``) do not change what is generated, so they are not
part of the cache's fingerprint: each record stores the options it was scored with (``"scoring"``), and
a cached record scored with other options is re-scored (counted in ``stats["rescored"]``).

Public names: :func:`run_eval`, :func:`scoring_options`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from recipe.mrtpo.launch.launch_errors import looks_local
from recipe.mrtpo.tools.eval.generation import Generation, choose_backend, make_generator
from recipe.mrtpo.tools.eval.items import BUILD_HINT, DEFAULT_DATA, EvalError, Item, load_items
from recipe.mrtpo.tools.eval.metrics import TASK_FAMILY, aggregate, score_response
from recipe.mrtpo.tools.eval.partial import PartialWriter, read_partial, write_json

__all__ = ["run_eval", "scoring_options"]

#: settings that change what is generated: a cache made with other values is not reused
_FINGERPRINT_KEYS = ("task", "model", "max_new_tokens", "temperature", "top_p", "n_samples", "seed",
                     "chat_template_kwargs")
_DEFAULT_BATCH = {"hf": 8, "vllm": 256}


def scoring_options(args: argparse.Namespace) -> dict:
    """The options the verifiers run with (:func:`metrics.score_response`'s keyword arguments)."""
    return {"strip_reasoning": bool(getattr(args, "strip_reasoning", False)),
            "sql_mode": getattr(args, "sql_mode", None),
            "sql_timeout_s": getattr(args, "sql_timeout_s", None)}


#: the options of a record written before records stored theirs
_LEGACY_SCORING = {"strip_reasoning": False, "sql_mode": None, "sql_timeout_s": None}


#: settings of the multi-turn path (:mod:`.multi_turn`) that change what is generated
_MULTI_TURN_KEYS = ("response_length", "on_decode_error")
#: a generation's fields a record keeps (the last two: multi-turn's trajectory record and loop account)
_GEN_KEYS = ("response", "n_tokens", "finished", "trajectory", "loop")


def _score_sample(family: str, item: Item, gen: dict, opts: dict) -> dict:
    # multi-turn: the verifier reads the trajectory record, never the response text (tool output is in it)
    scored = gen.get("trajectory") if family == "multi_turn" else gen["response"]
    scores, info = score_response(family, scored, item.ground_truth, item.extra_info, **opts)
    return {**gen, "scores": scores, "info": info}


def _gen_dict(g: Generation) -> dict:
    d = {"response": g.text, "n_tokens": g.n_tokens, "finished": g.finished}
    if g.trajectory is not None:
        d.update(trajectory=g.trajectory, loop=g.loop)
    return d


def _record(family: str, item: Item, gens: list[Generation], opts: dict) -> dict:
    samples = [_score_sample(family, item, _gen_dict(g), opts) for g in gens]
    record = {"id": item.id, "index": item.index, "data_source": item.data_source}
    if item.category:
        record["category"] = item.category
    if item.difficulty:
        record["difficulty"] = item.difficulty
    record.update(prompt_sha=item.prompt_sha, **samples[0])
    if len(samples) > 1:
        record["samples"] = samples
    record["scoring"] = dict(opts)
    return record


def _rescored(family: str, item: Item, record: dict, opts: dict) -> dict:
    samples = record.get("samples") or [record]
    return _record(family, item, [Generation(*(s.get(k) for k in _GEN_KEYS)) for s in samples], opts)


def _fingerprint(args: argparse.Namespace) -> dict:
    model = Path(args.model)
    values = {
        "task": args.task,
        "model": str(model.resolve()) if model.exists() else args.model,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "top_p": args.top_p if args.temperature > 0 else 1.0,
        "n_samples": args.n,
        "seed": args.seed,
        "chat_template_kwargs": args.chat_template_kwargs,
    }
    out = {k: values[k] for k in _FINGERPRINT_KEYS}
    if TASK_FAMILY[args.task] == "multi_turn":  # only there, so the other tasks' caches stay valid
        out.update({k: getattr(args, k) for k in _MULTI_TURN_KEYS})
    return out


def _reuse(family: str, items: list[Item], cached: dict[str, dict], rescore: bool,
           opts: dict) -> tuple[dict[str, dict], int, set[str]]:
    """The cached records of ``items`` whose prompt is unchanged (re-scored with ``rescore`` or when they
    were scored with other options), the number of stale ones (same id, other prompt: regenerated), and
    the ids of the re-scored ones."""
    records: dict[str, dict] = {}
    rescored: set[str] = set()
    stale = 0
    for item in items:
        rec = cached.get(item.id)
        if rec is None:
            continue
        if rec.get("prompt_sha") != item.prompt_sha:
            stale += 1
            continue
        if rescore or rec.get("scoring", _LEGACY_SCORING) != opts:
            records[item.id] = _rescored(family, item, rec, opts)
            rescored.add(item.id)
        else:
            records[item.id] = rec
    return records, stale, rescored


def _generate(family: str, pending: list[Item], generator, batch_size: int, n: int, writer: PartialWriter,
              desc: str, opts: dict) -> dict[str, dict]:
    """Generate and score ``pending`` batch by batch, appending every record to the cache as it comes.
    ``generator``: its ``generate(conversations)``, or for multi-turn a :class:`.multi_turn.MultiTurnRunner`
    (``generate_items(items)``)."""
    from tqdm.auto import tqdm

    records: dict[str, dict] = {}
    # longest prompts first: less padding per batch, and an out-of-memory shows at once
    order = sorted(pending, key=lambda it: -sum(len(m["content"]) for m in it.messages))
    with tqdm(total=len(order), desc=desc, unit="item", file=sys.stderr) as bar:
        for i in range(0, len(order), batch_size):
            chunk = order[i:i + batch_size]
            if family == "multi_turn":
                gens = generator.generate_items(chunk)
            else:
                gens = generator.generate([it.messages for it in chunk])
            if len(gens) != len(chunk) or any(len(g) != n for g in gens):
                raise RuntimeError(f"generator returned {[len(g) for g in gens]} for {len(chunk)} prompts x n={n}")
            for item, g in zip(chunk, gens):
                records[item.id] = _record(family, item, g, opts)
                writer.write(records[item.id])
            writer.flush()
            bar.update(len(chunk))
    return records


def _multi_turn_runner(args: argparse.Namespace, generator):
    from recipe.mrtpo.tools.eval.multi_turn import MultiTurnRunner, model_type

    return MultiTurnRunner(generator, args.response_length, args.max_new_tokens, args.on_decode_error,
                           args.chat_template_kwargs, model_type(args.model))


def _row_count(path: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def run_eval(args: argparse.Namespace, generator_factory=make_generator) -> dict:
    """Evaluate as the parsed CLI arguments say; write ``args.out`` and return its content.

    ``generator_factory(args, backend)`` builds the generator (default :func:`make_generator`; tests
    pass stubs); it is called only when some item needs generating.
    """
    start = time.time()
    family = TASK_FAMILY[args.task]
    if family == "multi_turn":  # the command line fills these; a caller building args itself may not
        from recipe.mrtpo.tools.eval.multi_turn import DEFAULT_RESPONSE_LENGTH

        args.response_length = getattr(args, "response_length", None) or DEFAULT_RESPONSE_LENGTH
        args.on_decode_error = getattr(args, "on_decode_error", None) or "end_turn"
    data = Path(args.data or DEFAULT_DATA[args.task])
    if not data.is_file():
        raise FileNotFoundError(f"data file not found: {data}; build it with `{BUILD_HINT[args.task]}` or pass --data")
    if looks_local(str(args.model)) and not Path(args.model).expanduser().exists():
        raise EvalError(f"--model {args.model}: no such folder (a Hugging Face model folder, e.g. one written by "
                        f"`python -m recipe.mrtpo.tools.export`, or a hub id)")
    if Path(args.model).expanduser().is_dir() and not (Path(args.model).expanduser() / "config.json").is_file():
        raise EvalError(f"--model {args.model}: no config.json, not a Hugging Face model folder (a training "
                        f"checkpoint? export it first: python -m recipe.mrtpo.tools.export CHECKPOINT_DIR --out HF_DIR)")
    out = Path(args.out)
    partial = out.with_name(out.name + ".partial")
    items = load_items(data, args.task, args.limit)
    total = _row_count(data)
    fingerprint = _fingerprint(args)
    if args.overwrite and partial.exists():
        partial.unlink()
    opts = scoring_options(args)
    records, stale, rescored = _reuse(family, items, read_partial(partial, fingerprint), args.rescore, opts)
    pending = [it for it in items if it.id not in records]

    backend = choose_backend(args.backend)
    batch_size = args.batch_size or _DEFAULT_BATCH[backend]
    writer = PartialWriter(partial, fingerprint)
    try:
        if rescored:
            for item_id in rescored:
                writer.write(records[item_id])
            writer.flush()
        if pending:
            try:
                generator = generator_factory(args, backend)
            except (OSError, ValueError) as e:  # no model files, no tokenizer, not a model folder: the input's fault
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                raise EvalError(f"cannot load --model {args.model}: {first}") from e
            if family == "multi_turn":
                generator = _multi_turn_runner(args, generator)
            records.update(_generate(family, pending, generator, batch_size, args.n, writer, f"eval {args.task}",
                                     opts))
    finally:
        writer.close()

    ordered = [records[it.id] for it in items]
    samples = [
        {**s, "category": it.category, "difficulty": it.difficulty}
        for it, r in zip(items, ordered)
        for s in (r.get("samples") or [r])
    ]
    result = {
        "task": args.task,
        "model": args.model,
        "n": len(ordered),
        "metrics": aggregate(family, samples),
        "config": {
            **fingerprint,
            "data": str(data.resolve()),
            "backend": backend,
            "limit": args.limit,
            "batch_size": batch_size,
            "dtype": args.dtype,
            "max_model_len": args.max_model_len,
            "tensor_parallel_size": args.tensor_parallel_size,
            "gpu_memory_utilization": args.gpu_memory_utilization,
            "scoring": opts,
        },
        "stats": {
            "generated": len(pending),
            "reused": len(items) - len(pending),
            "stale": stale,
            "rescored": len(rescored),
            "seconds": round(time.time() - start, 3),
        },
        "items": ordered,
    }
    if args.limit is not None and len(ordered) < total:  # a subset: tables must say so (tools.report does)
        result["subset"] = {"items": len(ordered), "of": total, "how": f"first {len(ordered)} rows (--limit)"}
    write_json(out, result)
    return result
