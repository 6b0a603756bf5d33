"""Execution match as test-suite-sql-eval's ``exec_eval.eval_exec_match`` (Spider's official metric).

Two modes (:data:`SQL_MODES`), named after test-suite's command line:

``keep_distinct`` (the recipe's default; test-suite's ``--keep_distinct``)
    Both queries run as written (after the query fixes below).
``spider_default`` (test-suite without ``--keep_distinct``)
    Every ``DISTINCT`` token is removed from both queries before they run (:func:`remove_distinct`):
    ``SELECT DISTINCT a`` -> ``SELECT  a``, and also ``count(DISTINCT a)`` -> ``count( a)``. As in
    test-suite, which tokenises with sqlparse and keeps ``parse(s)[0]``, only the first statement is
    kept; a ``distinct`` inside a string literal, a quoted identifier or a comment, or as part of a
    longer word (``distinct_id``), stays.

Query fixes applied in both modes, as test-suite does: ``> =``, ``< =``, ``! =`` become ``>=``, ``<=``,
``!=`` (:func:`postprocess`, on the whole text), and ``YEAR(CURDATE())`` becomes ``2020``
(:func:`replace_cur_year`, at execution).

Row order (:func:`order_matters`): the rows are compared as lists when ``'order by'`` occurs anywhere in
the gold query's lower-cased text (after the fixes and, in ``spider_default``, DISTINCT removal), as
test-suite does: an ORDER BY in a subquery counts, a string literal holding ``order by`` counts, and
``ORDER  BY`` written with two spaces or a line break does not. Otherwise the results are bags.

Result equality (:func:`results_match`, test-suite's ``result_eq(gold, pred, order_matters)``):

- two empty results match (whatever their columns); otherwise the row counts and the column counts must
  be equal;
- test-suite's quick rejection: each row's values sorted by ``str(v) + str(type(v))`` must give the same
  list (ordered) or the same set (unordered) on both sides;
- then some permutation of the predicted columns must make the rows equal: as lists when the order
  matters, else as multisets (duplicates count);
- values compare as Python compares what ``sqlite3`` returns, exactly: ``1 == 1.0``, ``0.1 + 0.2 !=
  0.3``, ``'1' != 1``, NULL equals NULL, text and blobs never equal each other.

One departure, bounded work: test-suite tries every column permutation its sampling leaves (exponential
in the column count when many columns hold the same values). Here candidate columns are paired by their
multisets of values (a necessary condition), identical predicted columns are tried once, and each
partial assignment must already agree on the projected rows; past :data:`MAX_PERMUTATION_CHECKS`
projections the pair counts as a mismatch and says so in the reason. Every decision taken within the
budget is test-suite's.

Public names: :data:`SQL_MODES`, :data:`DEFAULT_SQL_MODE`, :func:`postprocess`,
:func:`replace_cur_year`, :func:`remove_distinct`, :func:`prepare_queries`, :func:`order_matters`,
:func:`results_match`.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

__all__ = [
    "SQL_MODES",
    "DEFAULT_SQL_MODE",
    "MAX_PERMUTATION_CHECKS",
    "postprocess",
    "replace_cur_year",
    "remove_distinct",
    "prepare_queries",
    "order_matters",
    "results_match",
]

SQL_MODES = ("keep_distinct", "spider_default")
DEFAULT_SQL_MODE = "keep_distinct"
MAX_PERMUTATION_CHECKS = 2_000

_CUR_YEAR = re.compile(r"YEAR\s*\(\s*CURDATE\s*\(\s*\)\s*\)\s*", re.IGNORECASE)

# Lexer for remove_distinct: the tokens sqlparse keeps whole (comments, quoted text) are matched first,
# so a "distinct" inside them is never a token of its own.
_TOKEN = re.compile(
    r"""
    (?P<comment>--[^\r\n]*|/\*.*?(?:\*/|\Z))
  | (?P<quoted>'(?:''|[^'])*(?:'|\Z)|"(?:""|[^"])*(?:"|\Z)|`(?:``|[^`])*(?:`|\Z)|\[[^\]]*(?:\]|\Z))
  | (?P<word>\w[\w$#]*)
  | (?P<semicolon>;)
  | (?P<other>.)
    """,
    re.VERBOSE | re.DOTALL,
)

_AFTER_SEMICOLON = re.compile(r"[ \t]*(?:--[^\r\n]*(?:\r\n|\r|\n)?)?")


def postprocess(query: str) -> str:
    """test-suite's ``postprocess``: ``> =`` / ``< =`` / ``! =`` -> ``>=`` / ``<=`` / ``!=`` (whole text)."""
    return query.replace("> =", ">=").replace("< =", "<=").replace("! =", "!=")


def replace_cur_year(query: str) -> str:
    """test-suite's ``replace_cur_year``: ``YEAR(CURDATE())`` -> ``2020`` (run before every execution)."""
    return _CUR_YEAR.sub("2020", query)


def remove_distinct(query: str) -> str:
    """The first statement of ``query`` without its ``DISTINCT`` tokens (test-suite's ``remove_distinct``).

    Only whole tokens equal to ``distinct`` (any case) go; quoted text, comments and longer words stay,
    and the text around a removed token is kept as it is. Text after the first top-level ``;`` is
    dropped (but for the spaces and a ``--`` comment right after it), as test-suite keeps only
    sqlparse's first statement.
    """
    out = []
    for m in _TOKEN.finditer(query):
        if m.lastgroup == "word" and m.group().lower() == "distinct":
            continue
        out.append(m.group())
        if m.lastgroup == "semicolon":  # sqlparse's first statement also takes the blanks and a -- comment after it
            out.append(_AFTER_SEMICOLON.match(query, m.end()).group())
            break
    return "".join(out)


def prepare_queries(pred_sql: str, gold_sql: str, mode: str) -> tuple[str, str]:
    """The (predicted, gold) texts test-suite runs in ``mode`` (module docstring), before
    :func:`replace_cur_year`, which the caller applies at execution."""
    if mode not in SQL_MODES:
        raise ValueError(f"unknown sql_mode {mode!r}; choose from {SQL_MODES}")
    pred_sql, gold_sql = postprocess(pred_sql), postprocess(gold_sql)
    if mode == "spider_default":
        pred_sql, gold_sql = remove_distinct(pred_sql), remove_distinct(gold_sql)
    return pred_sql, gold_sql


def order_matters(gold_sql: str) -> bool:
    """test-suite's rule: ``'order by' in gold_sql.lower()`` (of the gold as :func:`prepare_queries` gives it)."""
    return "order by" in gold_sql.lower()


def _canon(value: Any) -> tuple:
    """Hashable, sortable form of one value with Python's equality (``1`` and ``1.0`` give equal keys)."""
    if value is None:
        return (0,)
    if isinstance(value, (bool, int, float)):
        if isinstance(value, float) and math.isnan(value):
            return (0,)  # SQLite itself turns NaN into NULL
        return (1, value)
    if isinstance(value, str):
        return (2, value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return (3, bytes(value))
    return (4, repr(value))


def _unorder_row(row: tuple) -> tuple:
    """test-suite's ``unorder_row``: a row's values sorted by ``str(v) + str(type(v))``."""
    return tuple(sorted(row, key=lambda v: str(v) + str(type(v))))


def _quick_accept(gold: Sequence[tuple], pred: Sequence[tuple], ordered: bool) -> bool:
    """test-suite's ``quick_rej`` (True: not rejected)."""
    g = [tuple(_canon(v) for v in _unorder_row(r)) for r in gold]
    p = [tuple(_canon(v) for v in _unorder_row(r)) for r in pred]
    return g == p if ordered else set(g) == set(p)


def results_match(pred: Sequence[tuple], gold: Sequence[tuple], ordered: bool) -> tuple[bool, str]:
    """test-suite's ``result_eq(gold, pred, order_matters=ordered)``; returns (match, short reason)."""
    if not pred and not gold:
        return True, "both empty"
    if len(pred) != len(gold):
        return False, f"row count {len(pred)} != {len(gold)}"
    width = len(gold[0])
    if len(pred[0]) != width:
        return False, "column count differs"
    if any(len(r) != width for r in gold) or any(len(r) != width for r in pred):
        return False, "ragged rows"
    if not _quick_accept(gold, pred, ordered):
        return False, "rows differ" if ordered else "values differ"
    p_cols = list(zip(*[tuple(_canon(v) for v in r) for r in pred]))
    g_cols = list(zip(*[tuple(_canon(v) for v in r) for r in gold]))
    search = _PermutationSearch(p_cols, g_cols, ordered)
    if search.run():
        return True, "match"
    return False, "column permutation search budget exceeded" if search.exhausted else "rows differ"


class _PermutationSearch:
    """Backtracking over gold-column -> predicted-column assignments (module docstring)."""

    def __init__(self, p_cols: list[tuple], g_cols: list[tuple], ordered: bool):
        self.p_cols, self.g_cols, self.ordered = p_cols, g_cols, ordered
        signature = lambda col: tuple(sorted(Counter(col).items()))  # noqa: E731
        p_sig = [signature(c) for c in p_cols]
        self.candidates = [[j for j, s in enumerate(p_sig) if s == signature(g)] for g in g_cols]
        self.checks = 0
        self.exhausted = False

    def run(self) -> bool:
        if any(not c for c in self.candidates):
            return False
        return self._extend([], set())

    def _agrees(self, chosen: list[int]) -> bool:
        self.checks += 1
        if self.checks > MAX_PERMUTATION_CHECKS:
            self.exhausted = True
            return False
        n = len(chosen)
        pred = list(zip(*(self.p_cols[j] for j in chosen)))
        gold = list(zip(*self.g_cols[:n]))
        return pred == gold if self.ordered else Counter(pred) == Counter(gold)

    def _extend(self, chosen: list[int], used: set[int]) -> bool:
        i = len(chosen)
        if i == len(self.g_cols):
            return True
        tried: set[tuple] = set()
        for j in self.candidates[i]:
            if j in used or self.p_cols[j] in tried:
                continue
            tried.add(self.p_cols[j])
            chosen.append(j)
            used.add(j)
            if self._agrees(chosen) and self._extend(chosen, used):
                return True
            chosen.pop()
            used.discard(j)
            if self.exhausted:
                return False
        return False
