"""Evaluate a model on IFEval, IFBench, Spider, BIRD, Chinook, BFCL or BFCL multi-turn with the project's verifiers.

::

    python -m recipe.mrtpo.tools.eval --task ifeval --model PATH --out results/ifeval.json [--limit N]

Data: the verl parquet files of ``data_prep`` (rows ``data_source``, ``prompt`` = chat messages,
``reward_model.ground_truth``, ``extra_info``). Default paths (relative to the working directory),
``--data FILE.parquet`` overrides:

===============  =================================  ========================================================
task             default data                       built by
===============  =================================  ========================================================
ifeval           data/ifeval/test.parquet           python -m data_prep.build_offline --only ifeval
ifbench          data/ifbench/test.parquet          python -m data_prep.build_offline --only ifbench
chinook          data/chinook/test.parquet          python -m data_prep.build_offline --only chinook
bfcl             data/bfcl/test.parquet             python -m data_prep.build_offline --only bfcl
bfcl_multi_turn  data/bfcl_multi_turn/test.parquet  python -m data_prep.build_offline --only bfcl_multi_turn
spider           data/spider/test.parquet           python -m data_prep.text_to_sql spider ... --part dev
bird             data/bird/test.parquet             python -m data_prep.text_to_sql bird ... --part dev
===============  =================================  ========================================================

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

Scoring options (they change only the scores, so they are not part of the cache's settings: a cached
record scored with other options is re-scored, counted in ``stats["rescored"]``):

- ``--strip-reasoning`` (ifeval/ifbench; off by default, the official scripts check the response as
  generated): check the answer after the first ``</think>``; an unterminated ``<think>`` passes nothing;
- ``--sql-mode keep_distinct|spider_default`` (spider/bird/chinook): test-suite-sql-eval's
  ``--keep_distinct`` or its default (DISTINCT removed from both queries); default: each row's
  ``extra_info["sql_mode"]``, else ``keep_distinct``;
- ``--sql-timeout-s S`` (spider/bird/chinook): per-query limit, at most 60 s; default: each row's
  ``extra_info["sql_timeout_s"]``, else 2 s.

Output ``OUT`` (written atomically at the end)::

    {"task", "model", "n" (items), "metrics": {...}, "config": {...},
     "stats": {"generated", "reused", "stale", "rescored", "seconds"},
     "items": [{"id", "index", "data_source", "category"?, "difficulty"?, "prompt_sha",
                "response", "n_tokens", "finished", "scores", "info",
                "scoring" (the options it was scored with),
                "samples"? (with --n > 1: every sample's response, n_tokens, finished, scores, info)}]}

The metrics are those of :mod:`recipe.mrtpo.tools.eval.metrics` (IFEval/IFBench prompt- and
instruction-level accuracy, strict and loose; text-to-SQL execution accuracy, format and executable
rates; BFCL AST accuracy, format rate, per category; BFCL multi-turn: BFCL's verdict and the per-reward rates,
per category).

``bfcl_multi_turn`` plays each question through the training's agent loop (:mod:`.multi_turn`; one trajectory
per question, ``--response-length`` tokens for the whole trajectory, ``--on-decode-error``) and scores its
trajectory record, not its text.

The work is split by job: :mod:`.items` (data loading), :mod:`.generation` (HF / vLLM generators),
:mod:`.partial` (the cache and the result file), :mod:`.run` (the evaluation loop), :mod:`.cli` (the
command line), :mod:`.metrics` (per-response scores, aggregation). This module re-exports their public
names: :func:`main`, :func:`build_parser`, :func:`run_eval`, :func:`load_items`, :class:`Item`,
:class:`Generation`, :class:`HFGenerator`, :class:`VLLMGenerator`, :func:`make_generator`,
:func:`choose_backend`, :data:`DEFAULT_DATA`, :class:`EvalError`.
"""

from __future__ import annotations

from recipe.mrtpo.tools.eval.cli import build_parser, main
from recipe.mrtpo.tools.eval.generation import (
    Generation,
    HFGenerator,
    SamplingConfig,
    VLLMGenerator,
    choose_backend,
    make_generator,
)
from recipe.mrtpo.tools.eval.items import DEFAULT_DATA, EvalError, Item, load_items
from recipe.mrtpo.tools.eval.run import run_eval

__all__ = [
    "DEFAULT_DATA",
    "EvalError",
    "Item",
    "Generation",
    "SamplingConfig",
    "HFGenerator",
    "VLLMGenerator",
    "choose_backend",
    "make_generator",
    "load_items",
    "run_eval",
    "build_parser",
    "main",
]

if __name__ == "__main__":
    raise SystemExit(main())
