"""Evaluate a model on IFEval, IFBench, Spider, BIRD, Chinook or BFCL with the project's verifiers.

::

    python -m recipe.mrtpo.tools.eval --task ifeval --model PATH --out results/ifeval.json [--limit N]

Data: the verl parquet files of ``data_prep`` (rows ``data_source``, ``prompt`` = chat messages,
``reward_model.ground_truth``, ``extra_info``). Default paths (relative to the working directory),
``--data FILE.parquet`` overrides:

==========  ==============================  ====================================================
task        default data                    built by
==========  ==============================  ====================================================
ifeval      data/ifeval/test.parquet        python -m data_prep.build_offline --only ifeval
ifbench     data/ifbench/test.parquet       python -m data_prep.build_offline --only ifbench
chinook     data/chinook/test.parquet       python -m data_prep.build_offline --only chinook
bfcl        data/bfcl/test.parquet          python -m data_prep.build_offline --only bfcl
spider      data/spider/test.parquet        python -m data_prep.text_to_sql --source spider ... --split test
bird        data/bird/test.parquet          python -m data_prep.text_to_sql --source bird ... --split test
==========  ==============================  ====================================================

Generation: every prompt is rendered with the tokenizer's chat template (``add_generation_prompt``;
``--chat-template-kwargs '{"enable_thinking": false}'`` passes extra template variables), then

- ``--backend vllm`` (the default when vLLM is installed and a CUDA GPU is visible): ``vllm.LLM``
  fed the rendered token ids, one ``SamplingParams(n, temperature, top_p, max_tokens, seed)``;
- ``--backend hf`` (the CPU path): ``transformers`` ``generate``, batched with left padding.

Decoding is greedy by default (``--temperature 0``); ``--n`` samples per prompt need a temperature
> 0. Both backends use exactly the given sampling settings and never the model's
``generation_config`` sampling defaults (Qwen's top_k / repetition penalty), only its stop tokens.
Responses are decoded without special tokens.

Resuming: each item's record (response, scores) is appended as one JSON line to ``OUT.partial``
(first line: a header with the generation settings) as soon as its batch is scored. A later run with
the same settings reuses every record whose item id and prompt are unchanged and generates only the
rest, so an interrupted run continues where it stopped, and ``--limit 5`` after ``--limit 3``
generates 2 items. ``OUT.partial`` is kept as the cache (delete it, or pass ``--overwrite``, to
regenerate; a run with other generation settings refuses to reuse it). ``--rescore`` re-runs the
verifiers on the cached responses.

Output ``OUT`` (written atomically at the end)::

    {"task", "model", "n" (items), "metrics": {...}, "config": {...},
     "stats": {"generated", "reused", "stale", "seconds"},
     "items": [{"id", "index", "data_source", "category"?, "difficulty"?, "prompt_sha",
                "response", "n_tokens", "finished", "scores", "info",
                "samples"? (with --n > 1: every sample's response, n_tokens, finished, scores, info)}]}

The metrics are those of :mod:`recipe.mrtpo.tools.eval.metrics` (IFEval/IFBench prompt- and
instruction-level accuracy, strict and loose; text-to-SQL execution accuracy, format and executable
rates; BFCL AST accuracy, format rate, per category).

Public names: :func:`main`, :func:`build_parser`, :func:`run_eval`, :func:`load_items`,
:class:`Item`, :class:`Generation`, :class:`HFGenerator`, :class:`VLLMGenerator`,
:func:`make_generator`, :func:`choose_backend`, :data:`DEFAULT_DATA`.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from recipe.mrtpo.tools.eval.metrics import FAMILY_DATA_SOURCES, TASK_FAMILY, aggregate, score_response, validate_ground_truth

__all__ = [
    "DEFAULT_DATA",
    "EvalError",
    "Item",
    "Generation",
    "HFGenerator",
    "VLLMGenerator",
    "choose_backend",
    "make_generator",
    "load_items",
    "run_eval",
    "build_parser",
    "main",
]

DEFAULT_DATA: dict[str, str] = {task: f"data/{task}/test.parquet" for task in TASK_FAMILY}

_BUILD_HINT = {
    "ifeval": "python -m data_prep.build_offline --only ifeval",
    "ifbench": "python -m data_prep.build_offline --only ifbench",
    "chinook": "python -m data_prep.build_offline --only chinook",
    "bfcl": "python -m data_prep.build_offline --only bfcl",
    "spider": "python -m data_prep.text_to_sql --source spider --questions spider/dev.json "
    "--db-root spider/database --split test --out-dir data/spider",
    "bird": "python -m data_prep.text_to_sql --source bird --questions bird/dev/dev.json "
    "--db-root bird/dev/dev_databases --split test --out-dir data/bird",
}

_PARTIAL_FORMAT = 1


class EvalError(ValueError):
    """A problem with the inputs of an evaluation (data, cache, settings): reported without a traceback."""


#: settings that change what is generated: a cache made with other values is not reused
_FINGERPRINT_KEYS = ("task", "model", "max_new_tokens", "temperature", "top_p", "n_samples", "seed",
                     "chat_template_kwargs")
_DEFAULT_BATCH = {"hf": 8, "vllm": 256}


# --------------------------------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """Numpy arrays/scalars -> lists/Python scalars, recursively (parquet rows as pandas hands them)."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


@dataclass
class Item:
    """One evaluation prompt: a parquet row with its stable id."""

    id: str
    index: int
    data_source: str
    messages: list[dict]
    ground_truth: Any
    extra_info: dict
    prompt_sha: str

    @property
    def category(self) -> str:
        return str(self.extra_info.get("category") or "")

    @property
    def difficulty(self) -> str:
        return str(self.extra_info.get("difficulty") or "")


def _messages(prompt: Any, where: str) -> list[dict]:
    prompt = _plain(prompt)
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not isinstance(prompt, list) or not prompt or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt
    ):
        raise EvalError(f"{where}: 'prompt' must be a non-empty list of {{'role', 'content'}} messages")
    return [{"role": m["role"], "content": m["content"]} for m in prompt]


def load_items(path: os.PathLike, task: str, limit: Optional[int] = None) -> list[Item]:
    """The first ``limit`` rows (all when None) of a verl parquet file as :class:`Item` s.

    Item ids are ``extra_info["id"]`` (else ``"<data_source>-<row>"``), with ``#2``, ``#3``... added to
    repeats, so they are stable for a given file. Raises ValueError for a row the task's verifiers
    cannot score (wrong ``data_source``, malformed ground truth, missing database).
    """
    import pandas as pd

    family = TASK_FAMILY[task]
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    frame = pd.read_parquet(path)
    missing = [c for c in ("data_source", "prompt", "reward_model") if c not in frame.columns]
    if missing:
        raise EvalError(f"{path}: not a verl parquet file (missing columns {missing})")
    if limit is not None:
        frame = frame.iloc[: max(0, limit)]
    items, seen = [], {}
    for row_no, row in enumerate(frame.to_dict(orient="records")):
        where = f"{path} row {row_no}"
        source = str(row["data_source"])
        if source.split("/", 1)[0] not in FAMILY_DATA_SOURCES[family]:
            raise EvalError(
                f"{where}: data_source {source!r} cannot be scored as task {task!r} "
                f"(expected one of {FAMILY_DATA_SOURCES[family]}); wrong --data?"
            )
        messages = _messages(row["prompt"], where)
        reward_model = _plain(row["reward_model"])
        if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
            raise EvalError(f"{where}: reward_model has no ground_truth")
        extra = _plain(row.get("extra_info"))
        extra = extra if isinstance(extra, dict) else {}
        base = str(extra.get("id") or f"{source}-{row_no}")
        seen[base] = seen.get(base, 0) + 1
        item_id = base if seen[base] == 1 else f"{base}#{seen[base]}"
        try:
            validate_ground_truth(family, reward_model["ground_truth"], extra)
        except (ValueError, KeyError, TypeError) as e:
            raise EvalError(f"{where} (id {item_id}): cannot be scored: {e}") from e
        sha = hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]
        items.append(Item(item_id, row_no, source, messages, reward_model["ground_truth"], extra, sha))
    return items


# --------------------------------------------------------------------------------------------------
# generation
# --------------------------------------------------------------------------------------------------


@dataclass
class Generation:
    """One sampled response: text (special tokens dropped), its token count, and whether it stopped
    on a stop token (False: cut at ``max_new_tokens``)."""

    text: str
    n_tokens: int
    finished: bool


@dataclass
class SamplingConfig:
    max_new_tokens: int = 2048
    temperature: float = 0.0
    top_p: float = 1.0
    n: int = 1
    seed: int = 0


def _load_tokenizer(model_path: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    if not getattr(tok, "chat_template", None):
        raise EvalError(f"the tokenizer of {model_path} has no chat template")
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def _render(tok, messages: list[dict], template_kwargs: dict) -> str:
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **template_kwargs)


def _stop_ids(tok, generation_config) -> list[int]:
    ids = getattr(generation_config, "eos_token_id", None)
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tok.eos_token_id is not None:
        ids.append(tok.eos_token_id)
    return sorted(set(int(i) for i in ids))


class HFGenerator:
    """``transformers`` generation (CPU or one GPU): one batch per call, left padding."""

    backend = "hf"

    def __init__(self, model_path: str, sampling: SamplingConfig, dtype: str = "auto",
                 template_kwargs: Optional[dict] = None, device: Optional[str] = None):
        import torch
        from transformers import AutoModelForCausalLM

        self.sampling = sampling
        self.template_kwargs = dict(template_kwargs or {})
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if dtype == "auto":
            dtype = "bfloat16" if self.device.startswith("cuda") else "float32"
        self.tok = _load_tokenizer(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
        self.model.to(self.device).eval()
        self.stop_ids = _stop_ids(self.tok, self.model.generation_config)
        torch.manual_seed(sampling.seed)

    def _generation_config(self):
        from transformers import GenerationConfig

        s = self.sampling
        sample = s.temperature > 0
        kwargs = dict(max_new_tokens=s.max_new_tokens, do_sample=sample, num_return_sequences=s.n,
                      eos_token_id=self.stop_ids, pad_token_id=self.tok.pad_token_id)
        if sample:
            kwargs.update(temperature=s.temperature, top_p=s.top_p, top_k=0)
        return GenerationConfig(**kwargs)

    def generate(self, batch: Sequence[list[dict]]) -> list[list[Generation]]:
        """``n`` generations for each conversation of ``batch`` (in order)."""
        import torch

        texts = [_render(self.tok, m, self.template_kwargs) for m in batch]
        enc = self.tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        with torch.inference_mode():
            out = self.model.generate(**enc, generation_config=self._generation_config())
        new = out[:, enc["input_ids"].shape[1]:].tolist()
        stops = set(self.stop_ids)
        gens = []
        for ids in new:
            end = next((i + 1 for i, t in enumerate(ids) if t in stops), None)
            kept = ids if end is None else ids[:end]
            gens.append(Generation(self.tok.decode(kept, skip_special_tokens=True), len(kept), end is not None))
        n = self.sampling.n
        return [gens[i * n:(i + 1) * n] for i in range(len(batch))]


class VLLMGenerator:
    """vLLM offline generation (``vllm.LLM``) on the rendered prompt token ids."""

    backend = "vllm"

    def __init__(self, model_path: str, sampling: SamplingConfig, dtype: str = "auto",
                 template_kwargs: Optional[dict] = None, tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float = 0.9, max_model_len: Optional[int] = None):
        from vllm import LLM, SamplingParams

        self.sampling = sampling
        self.template_kwargs = dict(template_kwargs or {})
        self.tok = _load_tokenizer(model_path)
        llm_kwargs = dict(model=model_path, tokenizer=model_path, dtype=dtype, seed=sampling.seed,
                          tensor_parallel_size=tensor_parallel_size, gpu_memory_utilization=gpu_memory_utilization)
        if max_model_len:
            llm_kwargs["max_model_len"] = max_model_len
        self.llm = LLM(**llm_kwargs)
        s = sampling
        params = dict(n=s.n, temperature=s.temperature, max_tokens=s.max_new_tokens)
        if s.temperature > 0:
            params.update(top_p=s.top_p, seed=s.seed)
        self.params = SamplingParams(**params)

    def generate(self, batch: Sequence[list[dict]]) -> list[list[Generation]]:
        """``n`` generations for each conversation of ``batch`` (in order)."""
        prompts = [
            {"prompt_token_ids": self.tok(_render(self.tok, m, self.template_kwargs), add_special_tokens=False)["input_ids"]}
            for m in batch
        ]
        outputs = self.llm.generate(prompts, self.params, use_tqdm=False)
        return [
            [Generation(o.text, len(o.token_ids), o.finish_reason == "stop") for o in req.outputs]
            for req in outputs
        ]


def choose_backend(requested: str) -> str:
    """``vllm`` or ``hf``: ``auto`` picks vLLM when it is installed and a CUDA GPU is visible."""
    if requested in ("hf", "vllm"):
        if requested == "vllm" and importlib.util.find_spec("vllm") is None:
            raise EvalError("--backend vllm: vllm is not installed")
        return requested
    if requested != "auto":
        raise ValueError(f"unknown backend {requested!r}")
    import torch

    return "vllm" if importlib.util.find_spec("vllm") is not None and torch.cuda.is_available() else "hf"


def make_generator(args: argparse.Namespace, backend: str):
    """The generator of ``backend`` for the parsed CLI arguments."""
    sampling = SamplingConfig(args.max_new_tokens, args.temperature, args.top_p, args.n, args.seed)
    if backend == "vllm":
        return VLLMGenerator(args.model, sampling, args.dtype, args.chat_template_kwargs,
                             args.tensor_parallel_size, args.gpu_memory_utilization, args.max_model_len)
    return HFGenerator(args.model, sampling, args.dtype, args.chat_template_kwargs)


# --------------------------------------------------------------------------------------------------
# the per-item cache (OUT.partial)
# --------------------------------------------------------------------------------------------------


def _read_partial(path: Path, fingerprint: dict) -> dict[str, dict]:
    """Records of ``path`` by item id (a later line wins). A torn last line is ignored; a header with
    other generation settings raises ValueError."""
    records: dict[str, dict] = {}
    if not path.is_file():
        return records
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            print(f"warning: {path}:{n}: unreadable line ignored (interrupted write?)", file=sys.stderr)
            continue
        if "header" in obj:
            old = obj["header"].get("fingerprint", {})
            diff = {k: (old.get(k), fingerprint[k]) for k in fingerprint if old.get(k) != fingerprint[k]}
            if diff:
                raise EvalError(
                    f"{path} was made with other generation settings {diff} (cached, now); "
                    "pass --overwrite to start afresh or choose another --out"
                )
        elif isinstance(obj.get("id"), str):
            records[obj["id"]] = obj
    return records


class _PartialWriter:
    """Appends records to OUT.partial, one JSON line each, flushed per batch."""

    def __init__(self, path: Path, fingerprint: dict):
        path.parent.mkdir(parents=True, exist_ok=True)
        fresh = not path.is_file() or path.stat().st_size == 0
        self.f = open(path, "a", encoding="utf-8")
        if not fresh:
            with open(path, "rb") as r:
                r.seek(-1, os.SEEK_END)
                if r.read(1) != b"\n":
                    self.f.write("\n")  # after a torn line
        else:
            self.write({"header": {"format": _PARTIAL_FORMAT, "fingerprint": fingerprint}})

    def write(self, obj: dict) -> None:
        self.f.write(json.dumps(obj, ensure_ascii=False, allow_nan=False) + "\n")

    def flush(self) -> None:
        self.f.flush()
        os.fsync(self.f.fileno())

    def close(self) -> None:
        self.f.close()


# --------------------------------------------------------------------------------------------------
# evaluation
# --------------------------------------------------------------------------------------------------


def _score_sample(family: str, item: Item, gen: dict) -> dict:
    scores, info = score_response(family, gen["response"], item.ground_truth, item.extra_info)
    return {**gen, "scores": scores, "info": info}


def _record(family: str, item: Item, gens: list[Generation]) -> dict:
    samples = [
        _score_sample(family, item, {"response": g.text, "n_tokens": g.n_tokens, "finished": g.finished})
        for g in gens
    ]
    record = {"id": item.id, "index": item.index, "data_source": item.data_source}
    if item.category:
        record["category"] = item.category
    if item.difficulty:
        record["difficulty"] = item.difficulty
    record.update(prompt_sha=item.prompt_sha, **samples[0])
    if len(samples) > 1:
        record["samples"] = samples
    return record


def _rescored(family: str, item: Item, record: dict) -> dict:
    samples = record.get("samples") or [record]
    keys = ("response", "n_tokens", "finished")
    return _record(family, item, [Generation(*(s[k] for k in keys)) for s in samples])


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
    return {k: values[k] for k in _FINGERPRINT_KEYS}


def _write_json(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(obj, ensure_ascii=False, indent=1, allow_nan=False) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _reuse(family: str, items: list[Item], cached: dict[str, dict], rescore: bool) -> tuple[dict[str, dict], int]:
    """The cached records of ``items`` whose prompt is unchanged (re-scored with ``rescore``), and the
    number of stale ones (same id, other prompt: regenerated)."""
    records: dict[str, dict] = {}
    stale = 0
    for item in items:
        rec = cached.get(item.id)
        if rec is None:
            continue
        if rec.get("prompt_sha") != item.prompt_sha:
            stale += 1
            continue
        records[item.id] = _rescored(family, item, rec) if rescore else rec
    return records, stale


def _generate(family: str, pending: list[Item], generator, batch_size: int, n: int, writer: _PartialWriter,
              desc: str) -> dict[str, dict]:
    """Generate and score ``pending`` batch by batch, appending every record to the cache as it comes."""
    from tqdm.auto import tqdm

    records: dict[str, dict] = {}
    # longest prompts first: less padding per batch, and an out-of-memory shows at once
    order = sorted(pending, key=lambda it: -sum(len(m["content"]) for m in it.messages))
    with tqdm(total=len(order), desc=desc, unit="item", file=sys.stderr) as bar:
        for i in range(0, len(order), batch_size):
            chunk = order[i:i + batch_size]
            gens = generator.generate([it.messages for it in chunk])
            if len(gens) != len(chunk) or any(len(g) != n for g in gens):
                raise RuntimeError(f"generator returned {[len(g) for g in gens]} for {len(chunk)} prompts x n={n}")
            for item, g in zip(chunk, gens):
                records[item.id] = _record(family, item, g)
                writer.write(records[item.id])
            writer.flush()
            bar.update(len(chunk))
    return records


def run_eval(args: argparse.Namespace, generator_factory=make_generator) -> dict:
    """Evaluate as the parsed CLI arguments say; write ``args.out`` and return its content.

    ``generator_factory(args, backend)`` builds the generator (default :func:`make_generator`; tests
    pass stubs); it is called only when some item needs generating.
    """
    start = time.time()
    family = TASK_FAMILY[args.task]
    data = Path(args.data or DEFAULT_DATA[args.task])
    if not data.is_file():
        raise FileNotFoundError(f"data file not found: {data}; build it with `{_BUILD_HINT[args.task]}` or pass --data")
    out = Path(args.out)
    partial = out.with_name(out.name + ".partial")
    items = load_items(data, args.task, args.limit)
    fingerprint = _fingerprint(args)
    if args.overwrite and partial.exists():
        partial.unlink()
    records, stale = _reuse(family, items, _read_partial(partial, fingerprint), args.rescore)
    pending = [it for it in items if it.id not in records]

    backend = choose_backend(args.backend)
    batch_size = args.batch_size or _DEFAULT_BATCH[backend]
    writer = _PartialWriter(partial, fingerprint)
    try:
        if args.rescore:
            for rec in records.values():
                writer.write(rec)
            writer.flush()
        if pending:
            generator = generator_factory(args, backend)
            records.update(_generate(family, pending, generator, batch_size, args.n, writer, f"eval {args.task}"))
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
        },
        "stats": {
            "generated": len(pending),
            "reused": len(items) - len(pending),
            "stale": stale,
            "seconds": round(time.time() - start, 3),
        },
        "items": ordered,
    }
    _write_json(out, result)
    return result


# --------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------


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
    return p


def _check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        p.error(f"--temperature must be >= 0, got {args.temperature}")
    if not (0 < args.top_p <= 1):
        p.error(f"--top-p must be in (0, 1], got {args.top_p}")
    if args.n > 1 and args.temperature == 0:
        p.error("--n > 1 needs --temperature > 0 (greedy samples are identical)")
    if not (0 < args.gpu_memory_utilization <= 1):
        p.error(f"--gpu-memory-utilization must be in (0, 1], got {args.gpu_memory_utilization}")


def _summary(result: dict) -> str:
    lines = [f"{result['task']}: {result['n']} items ({result['stats']['generated']} generated, "
             f"{result['stats']['reused']} reused)"]
    for k, v in result["metrics"].items():
        if isinstance(v, float):
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


if __name__ == "__main__":
    raise SystemExit(main())
