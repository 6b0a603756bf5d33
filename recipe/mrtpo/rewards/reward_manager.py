"""The ``mrtpo`` reward manager for verl 0.9.1's reward loop: per-reward scores and contexts Z_k.

Selected in the recipe's config with ``reward.reward_manager.source=importlib``,
``module.path=pkg://recipe.mrtpo.rewards.reward_manager``, ``name=MRTPORewardManager`` (it is also registered
as ``@register("mrtpo")`` for ``source=register`` once this module is imported).

For each sample it decodes the response, dispatches on ``data_source`` to the task registered with
:func:`recipe.mrtpo.tasks.register_task`, and returns::

    {"reward_score": mean of the sample's reward scores,
     "reward_extra_info": {
         "mrtpo_rewards":  JSON {reward_name: score},                       (SCORES_KEY)
         "mrtpo_contexts": JSON {reward_name: {"text": Z_k, "placement": "prompt"|"appended"}},
         "mrtpo_task":     the data_source,
         "mrtpo_error":    "" or "ExceptionType: message" when the verifier raised}}

verl's reward loop requires every sample to carry the same extra keys, so the ragged per-reward
scores travel as one JSON object per sample. A verifier that raises never crashes the run: the
sample scores 0, ``mrtpo_rewards`` stays empty (the trainer fills 0 for every reward of the sample's
group and counts ``mrtpo/verifier_errors``), and the reason is logged and kept in ``mrtpo_error``. A batch in
which every verifier raised (say, a custom task whose module was never imported) has no reward at all: the
trainer logs it, counts ``mrtpo/batches_without_scores`` and trains the batch with zero advantage. A checker
that fails on one reward keeps the sample's other scores (the verifier scored that one 0) and is counted
apart, as ``mrtpo/checker_errors``. A verifier that raised because a file it reads is missing on its node (a SQL
database that vanished mid-run: the error is :func:`recipe.mrtpo.cluster.node_files.missing_line`, naming the file and the
node), or raised ``NoVerdict`` (``recipe.mrtpo.cluster.verdict``: NLTK data missing on the node, a database it cannot read, a
gold query that failed), judged nothing: the trainer does not score it 0 but takes the row out of the step (no
score, so out of its group's statistics; an advantage of exactly 0; its response mask written 0, so out of the loss;
``reward_extras.advantage_mask``), counts ``mrtpo/missing_files`` or ``mrtpo/no_verdict`` (not
``mrtpo/verifier_errors``; ``mrtpo/rows_out`` both) and logs the line; GRPO, whose advantage is verl's own step on the
one scalar, stops the run with that line instead of training on a 0.

A task registered with a ``record_field`` (BFCL multi-turn: ``bfcl_trajectory``) is not handed the decoded
response: a multi-turn response holds tool output and injected user turns the model never wrote. Its verifier
gets the record the agent loop left in its output's ``extra_fields`` (verl's reward loop passes them per sample
as ``non_tensor_batch["tool_extra_fields"]``, as its own reward managers read them; a batch-level reward sees
them as columns of their own). A row whose record is missing, or that the verifier finds malformed, scores 0 on
every reward of the task, its reason logged and kept in ``mrtpo_error`` behind ``record:`` (the trainer counts
``mrtpo/record_errors``).
"""

from __future__ import annotations

import json
import logging
import os

from verl import DataProto
from verl.experimental.reward_loop.reward_manager import register
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase

from recipe.mrtpo.rewards.reward_extras import CONTEXTS_KEY, ERROR_KEY, RECORD_ERROR_PREFIX, SCORES_KEY, TASK_KEY
from recipe.mrtpo.tasks import RewardResult, get_task, record_field_of, to_plain

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))


_MISSING = object()


def agent_record(non_tensor: dict, field: str):
    """The agent loop's record ``field`` of one sample: from ``tool_extra_fields`` (verl's reward loop) or a
    column of its own (a batch-level reward); ``_MISSING`` when neither has it (or it is None)."""
    extra = non_tensor.get("tool_extra_fields", None)
    if isinstance(extra, dict) and extra.get(field) is not None:
        return extra[field]
    value = non_tensor.get(field, None)
    return _MISSING if value is None else value


def score_sample(data_source: str, response, ground_truth, extra_info, missing_record: str = "") -> dict:
    """Run the registered verifier of ``data_source``; never raises. Returns the reward-loop dict.

    ``response``: the decoded text, or the agent loop's record for a task with a ``record_field``;
    ``missing_record``: the record was not there (why): the verifier sees None (it scores 0 on every reward)
    and the error says so."""
    try:
        fn = get_task(str(data_source))
        result = fn(response, to_plain(ground_truth), to_plain(extra_info) if extra_info is not None else None)
        if not isinstance(result, RewardResult):
            raise TypeError(f"verifier for {data_source!r} returned {type(result).__name__}, not RewardResult")
        error = ""
        scores = result.scores
        contexts = {k: c.to_dict() for k, c in result.contexts.items()}
        if result.info.get("errors"):
            # a checker failed on one reward: the verifier already scored it 0; count it
            error = "; ".join(f"{k}: {v}" for k, v in result.info["errors"].items())[:500]
        if missing_record or result.info.get("record_error"):
            error = (RECORD_ERROR_PREFIX + (missing_record or str(result.info["record_error"])))[:500]
            logger.warning("mrtpo reward: data_source=%r scores 0: %s", data_source, error)
    except Exception as e:  # a verifier bug or hostile input it did not handle
        logger.warning("mrtpo reward: verifier for data_source=%r raised %s: %s", data_source, type(e).__name__, e)
        scores, contexts, error = {}, {}, f"{type(e).__name__}: {e}"[:500]
    overall = sum(scores.values()) / len(scores) if scores else 0.0
    return {
        "reward_score": float(overall),
        "reward_extra_info": {
            SCORES_KEY: json.dumps(scores, sort_keys=True),
            CONTEXTS_KEY: json.dumps(contexts, sort_keys=True, ensure_ascii=False),
            TASK_KEY: str(data_source),
            ERROR_KEY: error,
        },
    }


@register("mrtpo")
class MRTPORewardManager(RewardManagerBase):
    """Multi-reward manager: one score and one context Z_k per reward, for every registered task."""

    def __init__(self, config, tokenizer, compute_score=None, reward_router_address=None, reward_model_tokenizer=None):
        super().__init__(config, tokenizer, compute_score)

    async def run_single(self, data: DataProto) -> dict:
        assert len(data) == 1, "run_single takes one sample"
        item = data[0]
        ntb = item.non_tensor_batch
        data_source = ntb.get("data_source", "")
        ground_truth = (ntb.get("reward_model") or {}).get("ground_truth")
        extra_info = ntb.get("extra_info", None)
        try:
            field = record_field_of(data_source)
        except Exception:  # an odd data_source: get_task (in score_sample) says why
            field = None
        if field:  # the verifier judges the agent loop's record, never the response text (module docstring)
            record = agent_record(ntb, field)
            missing = "" if record is not _MISSING else f"missing: the agent loop's extra fields have no {field!r}"
            response = None if missing else record
            return await self.loop.run_in_executor(None, score_sample, data_source, response, ground_truth, extra_info,
                                                   missing)
        response_ids = item.batch["responses"]
        valid_len = int(item.batch["attention_mask"][-response_ids.shape[-1] :].sum())
        ids = response_ids[:valid_len]
        response = await self.loop.run_in_executor(None, lambda: self.tokenizer.decode(ids, skip_special_tokens=True))
        return await self.loop.run_in_executor(None, score_sample, data_source, response, ground_truth, extra_info)
