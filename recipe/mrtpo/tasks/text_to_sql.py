"""Text-to-SQL verifier: three rewards per response (docs/design.md §2).

``score(response, ground_truth, extra_info=None)`` with ``ground_truth = {"db_path": str, "gold_sql": str}``;
``db_path`` relative to the data root (``node_files``: ``$MRTPO_DATA_ROOT``) or absolute. A database that is not
there raises one line naming the file and the node: the row then leaves the step (never a reward of 0). So does
every error that is not the model's SQL's fault (no verdict, ``tasks.base.NoVerdict``): a database that vanishes
between the check and the open (the missing-file line again), one that cannot be opened or read (an ``OSError``
such as NFS's ESTALE, SQLite's "unable to open database file", "disk I/O error", a corrupt or locked file:
``sql_executor.environment_fault``), met by the model's query or the gold's; and, in the training reward
(:func:`reward`, the registered verifier), a gold query that fails at all (a time-out under load included). The
model's SQL failing on its own (a syntax error, a missing column, a time-out, the sandbox's refusal, its worker
dying) scores as below.
The answer is the **last** fenced ```sql block of the response (language tag case-insensitive, ``sqlite``
accepted too). If the last ```sql fence is never closed (a truncated answer), there is no valid block.

Rewards (each 0.0 or 1.0):

- ``format``: the block holds exactly one statement, it is a SELECT (optionally with WITH, or a
  compound SELECT such as UNION), and sqlglot parses it with the ``sqlite`` dialect. ``DROP TABLE``
  and the like parse in sqlglot, so the statement type is checked explicitly. Blocks longer than
  ``MAX_SQL_CHARS`` fail too. Z_k: the output-format instruction (``SQL_FORMAT_INSTRUCTION`` or
  ``extra_info["format_instruction"]``), placed in the prompt.
- ``executable``: the block's SQL runs without error in the read-only sandbox (:mod:`sql_sandbox`).
  Z_k: ``"executed"`` or ``"error: <message>"`` (at most 300 characters), appended.
- ``execution_match``: the result equals the gold query's result (test-suite-sql-eval's semantics, below).
  Z_k: the gold SQL, appended.

Each reward judges one thing: ``executable`` and ``execution_match`` run the last ```sql block whatever
``format`` says. With no block at all there is nothing to run, so all three are 0. A block that fails
``format`` because it is not a SELECT or holds several statements is also not executable (the sandbox
runs only one SELECT/WITH/VALUES statement); a block that SQLite runs but sqlglot cannot parse keeps
its ``executable`` and ``execution_match`` scores. ``execution_match`` follows test-suite even where
``executable`` is 0: a block test-suite's fixes make runnable (``a > = 1``) can match, and in
``spider_default`` only the first statement runs.

Execution match: test-suite-sql-eval's ``eval_exec_match`` (:mod:`sql_compare`), in one of two modes,
``extra_info["sql_mode"]`` per row (a data bug, ``ValueError``, if it is neither):

- ``keep_distinct`` (the default; test-suite's ``--keep_distinct``): both queries run as written;
- ``spider_default`` (test-suite's default): DISTINCT removed from both queries before they run.

In both, test-suite's query fixes apply (``> =`` -> ``>=``, ``YEAR(CURDATE())`` -> ``2020``); row order
matters when ``'order by'`` occurs anywhere in the (prepared) gold text; results are bags of rows up to
a permutation of the columns; values compare exactly as Python compares them (``1 == 1.0``, no float
tolerance). When the query test-suite would run differs from the block's text (a fix or a DISTINCT
removal applied), it is executed separately for ``execution_match``; ``executable`` always judges the
block as written. A result cut at the sandbox's row/size cap: if only the prediction was cut it has
more rows than the gold, so no match; if the gold was cut, the match cannot be decided and scores 0
(``info``).

Time limit: each query stops after ``extra_info["sql_timeout_s"]`` (default 2.0 s, at most 60 s) and
then counts as an error. test-suite allows 60 s per query, through ``asyncio.wait_for`` around a
synchronous ``sqlite3`` call, which cannot interrupt a running query: there a slow query finishes.

``extra_info`` may set ``sql_mode`` (above), ``sql_timeout_s`` (float) and ``sql_max_rows`` (int) to
override the sandbox limits (defaults 2.0 s and 10,000 rows). A malformed ``ground_truth`` is a data bug and raises
``ValueError``; no response text, however hostile, makes ``score`` raise.

``RewardResult.info`` holds diagnostics only: ``format_error``, ``exec_error``, ``match_detail``, and
``errors`` (``{reward: message}``, which the reward manager counts) when the gold query itself fails
(:func:`score`, the evaluation's test-suite semantics: ``execution_match`` is then 0 and the data should be fixed;
:func:`reward` raises ``NoVerdict`` instead) or, as a last line of defence, when the verifier hits an internal
error (every reward 0).
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any, Optional

import sqlglot
from sqlglot import exp

from recipe.mrtpo.cluster.node_files import is_missing_file, missing_line, resolve
from recipe.mrtpo.tasks.base import Context, NoVerdict, RewardResult, as_text, register_task
from recipe.mrtpo.tasks.sql_compare import (
    DEFAULT_SQL_MODE,
    SQL_MODES,
    order_matters,
    prepare_queries,
    replace_cur_year,
    results_match,
)
from recipe.mrtpo.tasks.sql_sandbox import (
    DEFAULT_MAX_ROWS,
    DEFAULT_TIMEOUT_S,
    SqlResult,
    execute_gold,
    execute_sql,
)

__all__ = [
    "SQL_FORMAT_INSTRUCTION",
    "REWARD_KEYS",
    "MAX_SQL_CHARS",
    "extract_sql_block",
    "check_format",
    "SQL_MODES",
    "gold_is_ordered",
    "results_match",
    "score",
    "reward",
]

SQL_FORMAT_INSTRUCTION = (
    "Answer with exactly one SQLite query: a single SELECT statement (it may start with WITH), "
    "written in a single ```sql code block at the end of your response."
)
REWARD_KEYS = ("format", "executable", "execution_match")
MAX_SQL_CHARS = 20_000  # Spider/BIRD gold queries stay far below; bounds sqlglot's parsing time
MAX_CONTEXT_CHARS = 300  # length bound of the ``executable`` context text
GOLD_FAILED = "gold SQL failed: "  # how ``info["errors"]["execution_match"]`` begins when the gold query failed

_FENCE = re.compile(r"`{3,}")
_SQL_TAG = re.compile(r"[ \t]*(?:sqlite3?|sql)(?=\s|$)", re.IGNORECASE)
_QUERY_TYPES = (exp.Select, exp.SetOperation)


# ---------------------------------------------------------------------------------------------------
# Extraction and format


def extract_sql_block(text: str) -> Optional[str]:
    """Body of the last fenced ```sql block, or None if there is none (or the last one is unclosed).

    Fences (runs of 3+ backticks) pair up in order, as in Markdown, so the closing fence of a
    ```python block is never taken for an opening one. The body may start on the fence's line
    (```sql SELECT 1```).
    """
    fences = list(_FENCE.finditer(text))
    last = None
    for i in range(0, len(fences) - 1, 2):
        content = text[fences[i].end() : fences[i + 1].start()]
        tag = _SQL_TAG.match(content)
        if tag is not None:
            last = content[tag.end() :]
    if len(fences) % 2 == 1 and _SQL_TAG.match(text, fences[-1].end()) is not None:
        return None  # the final ```sql block was never closed: truncated answer
    return None if last is None else last.strip()


def check_format(sql: str) -> Optional[str]:
    """None if ``sql`` is exactly one SELECT/WITH statement that sqlglot parses (sqlite), else why not."""
    if not sql.strip():
        return "empty SQL"
    if len(sql) > MAX_SQL_CHARS:
        return f"SQL longer than {MAX_SQL_CHARS} characters"
    try:
        statements = [s for s in sqlglot.parse(sql, read="sqlite") if s is not None]
    except Exception as e:  # ParseError, TokenError, RecursionError on absurd nesting, ...
        return "does not parse: " + _one_line(str(e) or type(e).__name__, 200)
    if len(statements) != 1:
        return f"expected exactly one statement, found {len(statements)}"
    if not isinstance(statements[0], _QUERY_TYPES):
        return f"not a SELECT statement ({type(statements[0]).__name__})"
    return None


# ---------------------------------------------------------------------------------------------------
# Execution match


def gold_is_ordered(gold_sql: str, sql_mode: str = DEFAULT_SQL_MODE) -> bool:
    """Whether the gold's row order is part of the answer: test-suite's ``'order by' in gold.lower()``,
    on the gold as test-suite prepares it in ``sql_mode``."""
    return order_matters(prepare_queries("", gold_sql, sql_mode)[1])


# ---------------------------------------------------------------------------------------------------
# score


def _one_line(text: str, limit: int) -> str:
    """One printable line of at most ``limit`` characters (drops e.g. sqlglot's ANSI highlighting)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(text))
    text = " ".join(text.split())
    text = "".join(ch if ch.isprintable() else "?" for ch in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _parse_ground_truth(ground_truth: Any) -> tuple[str, str]:
    if isinstance(ground_truth, str):
        try:
            ground_truth = json.loads(ground_truth)
        except ValueError as e:
            raise ValueError(f"text_to_sql: ground_truth is a string but not JSON: {e}") from None
    if not isinstance(ground_truth, dict):
        raise ValueError(f"text_to_sql: ground_truth must be a dict, got {type(ground_truth).__name__}")
    db_path, gold_sql = ground_truth.get("db_path"), ground_truth.get("gold_sql")
    if not isinstance(db_path, str) or not db_path or not isinstance(gold_sql, str) or not gold_sql.strip():
        raise ValueError("text_to_sql: ground_truth needs non-empty string fields 'db_path' and 'gold_sql'")
    return db_path, gold_sql


def _sql_mode(extra: dict) -> str:
    mode = extra.get("sql_mode")
    if mode is None:
        return DEFAULT_SQL_MODE
    if mode not in SQL_MODES:
        raise ValueError(f"text_to_sql: extra_info['sql_mode'] must be one of {SQL_MODES}, got {mode!r}")
    return mode


def _limits(extra: dict) -> dict:
    limits = {"timeout_s": DEFAULT_TIMEOUT_S, "max_rows": DEFAULT_MAX_ROWS}
    try:
        t = float(extra.get("sql_timeout_s", DEFAULT_TIMEOUT_S))
        if math.isfinite(t) and t > 0:
            limits["timeout_s"] = min(t, 60.0)
        r = int(extra.get("sql_max_rows", DEFAULT_MAX_ROWS))
        if r > 0:
            limits["max_rows"] = min(r, 1_000_000)
    except (TypeError, ValueError, OverflowError):
        pass
    return limits


def _judged(result: SqlResult, db_path: str, stored_path: str, who: str) -> SqlResult:
    """``result``, unless its error is the environment's (``SqlResult.environment``): then no verdict, raised as the
    missing-file line when the database is gone from the node now (it vanished after the check), else as
    :class:`NoVerdict` naming the database and the error."""
    if not result.environment:
        return result
    if not os.path.isfile(db_path):
        raise FileNotFoundError(missing_line(db_path, stored_path))
    raise NoVerdict(f"text_to_sql: the {who} query could not run on {db_path}: {result.error}")


def _execution_match(pred: SqlResult, sql: str, db_path: str, stored_path: str, gold_sql: str, mode: str,
                     limits: dict, info: dict) -> float:
    """test-suite's verdict (module docstring); ``pred`` is the block's own result."""
    pred_sql, gold_sql = prepare_queries(sql, gold_sql, mode)
    pred_sql, gold_run = replace_cur_year(pred_sql), replace_cur_year(gold_sql)
    gold = _judged(execute_gold(db_path, gold_run, **limits), db_path, stored_path, "gold")
    if not gold.ok:
        info["errors"] = {"execution_match": _one_line(f"{GOLD_FAILED}{gold.error}", 300)}
        return 0.0
    if pred_sql != sql:  # a query fix or the DISTINCT removal changed the text: run what test-suite runs
        pred = _judged(execute_sql(db_path, pred_sql, **limits), db_path, stored_path, "model's")
        if not pred.ok:
            info["match_detail"] = _one_line(f"prepared prediction fails: {pred.error}", 300)
            return 0.0
    elif not pred.ok:
        return 0.0
    if gold.truncated:
        info["match_detail"] = "gold result exceeds the sandbox cap; match undecidable"
        return 0.0
    if pred.truncated:
        info["match_detail"] = "prediction exceeds the sandbox cap (more rows than gold)"
        return 0.0
    matched, why = results_match(pred.rows, gold.rows, order_matters(gold_sql))
    info["match_detail"] = why
    return 1.0 if matched else 0.0


def _score_response(text: str, db_path: str, stored_path: str, gold_sql: str, mode: str, limits: dict,
                    info: dict) -> tuple[dict, Optional[str]]:
    sql = extract_sql_block(text)
    if sql is None:
        info["format_error"] = "no SQL block"
        return {"format": 0.0, "executable": 0.0, "execution_match": 0.0}, "no SQL block"
    format_error = check_format(sql)
    if format_error is not None:
        info["format_error"] = format_error
    pred = _judged(execute_sql(db_path, sql, **limits), db_path, stored_path, "model's")
    scores = {"format": 0.0 if format_error else 1.0, "executable": 0.0, "execution_match": 0.0}
    if pred.ok:
        scores["executable"] = 1.0
    else:
        info["exec_error"] = pred.error
    scores["execution_match"] = _execution_match(pred, sql, db_path, stored_path, gold_sql, mode, limits, info)
    return scores, pred.error


def score(response: str, ground_truth: dict, extra_info: Optional[dict] = None) -> RewardResult:
    """Score one response on ``format``, ``executable`` and ``execution_match`` (module docstring)."""
    stored_path, gold_sql = _parse_ground_truth(ground_truth)
    db_path = resolve(stored_path)
    if not os.path.isfile(db_path):  # a missing database is an error the reward manager counts, never a 0
        raise FileNotFoundError(missing_line(db_path, stored_path))
    extra = extra_info if isinstance(extra_info, dict) else {}
    mode = _sql_mode(extra)
    instruction = extra.get("format_instruction")
    if not isinstance(instruction, str) or not instruction.strip():
        instruction = SQL_FORMAT_INSTRUCTION
    info: dict = {}
    try:
        scores, exec_error = _score_response(as_text(response), db_path, stored_path, gold_sql, mode, _limits(extra),
                                             info)
    except NoVerdict:
        raise
    except Exception as e:  # last line of defence: a verifier bug must not kill a training step
        if isinstance(e, FileNotFoundError) and is_missing_file(str(e)):
            raise  # the database vanished after the check: no verdict, as when it was missing
        message = _one_line(f"internal error: {type(e).__name__}: {e}", 300)
        info["errors"] = dict.fromkeys(REWARD_KEYS, message)
        scores, exec_error = dict.fromkeys(REWARD_KEYS, 0.0), "internal error"
    exec_text = "executed" if exec_error is None else _one_line("error: " + exec_error, MAX_CONTEXT_CHARS)
    contexts = {
        "format": Context(instruction, "prompt"),
        "executable": Context(exec_text, "appended"),
        "execution_match": Context(gold_sql, "appended"),
    }
    return RewardResult(scores=scores, contexts=contexts, info=info)


def reward(response: str, ground_truth: dict, extra_info: Optional[dict] = None) -> RewardResult:
    """The training reward: :func:`score`, except that a gold query that fails is no verdict (``NoVerdict``: the
    row leaves the step) rather than an ``execution_match`` of 0 (module docstring): a gold that fails for one
    sample of a group (a time-out under load) and not another would teach a difference no response made."""
    result = score(response, ground_truth, extra_info)
    gold_error = str((result.info.get("errors") or {}).get("execution_match", ""))
    if gold_error.startswith(GOLD_FAILED):
        raise NoVerdict(f"text_to_sql: {gold_error}")
    return result


register_task("text_to_sql", reward)
register_task("spider", reward)
register_task("bird", reward)
register_task("chinook", reward)
