"""Instruction-following training sets of the paper's peers -> verl parquet (data_source ``instruction_following``).

Sources (``python -m data_prep.instruction_following <source> [--input NAME_OR_PATH] --out-dir DIR``;
``--input`` defaults to the hub name, a local file or folder in the same schema works the same way,
see :mod:`data_prep.public_sources`):

- ``rlvr_ifeval`` (``allenai/RLVR-IFeval``, 14,973 rows): ``{"messages": [{"role", "content"}],
  "ground_truth": JSON string {"func_name": ..., <arguments, unused ones null>}, "dataset",
  "constraint_type", "constraint"}``, one constraint per prompt. ``func_name`` names one of the
  RLVR constraint functions; :data:`RLVR_FUNCS` maps each to the IFEval checker that tests the same
  thing, with its arguments renamed (``N`` -> ``num_words`` ...) and quantifiers translated ("at
  most N" -> IFEval's "less than N+1"). Functions with no IFEval equivalent (exact keyword or letter
  counts, "around N" words/sentences/capital words, options other than IFEval's yes/no/maybe) are
  skipped and counted by function name.
- ``if_multi_constraints`` (``allenai/IF_multi_constraints_upto5``, 95,373 rows): ``{"key", "messages",
  "ground_truth": string of a list with one {"instruction_id": [...], "kwargs": [...]} (Python literal
  or JSON), "dataset", "constraint_type", "constraint"}``, up to five constraints whose ids are
  IFEval's and IFBench's. Ids without a checker in the verifier (IFBench's training-only ids), or that
  cannot run offline (``words:start_verb``), are skipped and counted by id.

Each row: the prompt is the set's messages up to the last user turn (assistant turns after it are
dropped), ``reward_model.ground_truth`` is the verifier's ``{"instruction_id_list": [...], "kwargs":
[JSON string per instruction]}``, ``extra_info`` has ``split``, ``index``, ``id``, ``base_id``
(``""``), ``source``, ``constraint_texts`` (the set's ``constraint`` sentence when it occurs verbatim
in the prompt and the row has one constraint, else the checker's own sentence for these arguments
when that occurs verbatim, else ``""``: the replay then gives that reward uniform weights).

Check of every row (there is no gold response in these sets): each constraint's checker is built from
the converted arguments by the verifier's registry (unknown id, unsupported id or arguments the checker
does not take: skipped with the reason). The tests score hand-written responses that satisfy every
constraint of the fixtures and require full marks.

Split: ``--test-fraction`` (default 0: everything ``train``; the evaluation sets are IFEval/IFBench) by
the seeded hash rule on the row id.
"""

from __future__ import annotations

import argparse
import ast
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from data_prep.common import SkipLog, fraction, make_row
from data_prep.instruction_following.rows import ABILITY, card_columns, verbatim_sentence
from data_prep.public_sources import assign_splits, finish, load_or_exit

__all__ = ["SOURCES", "RLVR_FUNCS", "convert_rlvr", "convert_multi", "build_rows", "add_arguments", "run"]

IFEVAL_OPTIONS = {"My answer is yes.", "My answer is no.", "My answer is maybe."}


class Unconvertible(ValueError):
    """A constraint that has no equivalent checker; ``kind`` is the data card's reason."""

    def __init__(self, kind: str, detail: str = ""):
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise Unconvertible("bad argument", f"{what}={v!r}")
    try:
        f = float(v)
    except ValueError:
        raise Unconvertible("bad argument", f"{what}={v!r}") from None
    if not f.is_integer():
        raise Unconvertible("bad argument", f"{what}={v!r}")
    return int(f)


def _relation(q: Any, n: int, func: str) -> tuple[str, int]:
    """RLVR quantifier -> (IFEval relation, count): 'at least' N, 'at most' N = 'less than' N+1."""
    if q == "at least":
        return "at least", n
    if q == "at most":
        return "less than", n + 1
    raise Unconvertible(f"no equivalent checker ({func}, quantifier {q!r})")


def _options(v: Any) -> set:
    if isinstance(v, str):
        try:
            v = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            v = [v]
    return {str(o).strip() for o in (v or [])} if isinstance(v, (list, tuple, set)) else set()


def _choice(a: dict) -> tuple[str, dict]:
    if _options(a.get("options")) != IFEVAL_OPTIONS:
        raise Unconvertible("no equivalent checker (validate_choice, options other than IFEval's)")
    return "detectable_format:constrained_response", {}


def _rel_words(a: dict) -> tuple[str, dict]:
    rel, n = _relation(a.get("quantifier"), _int(a.get("N"), "N"), "validate_word_constraint")
    return "length_constraints:number_words", {"num_words": n, "relation": rel}


def _rel_sentences(a: dict) -> tuple[str, dict]:
    rel, n = _relation(a.get("quantifier"), _int(a.get("N"), "N"), "verify_sentence_constraint")
    return "length_constraints:number_sentences", {"num_sentences": n, "relation": rel}


def _rel_capitals(a: dict) -> tuple[str, dict]:
    rel, n = _relation(a.get("quantifier"), _int(a.get("N"), "N"), "validate_frequency_capital_words")
    return "change_case:capital_word_frequency", {"capital_frequency": n, "capital_relation": rel}


def _words(v: Any) -> list:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, (list, tuple)) or not v or not all(isinstance(w, str) and w.strip() for w in v):
        raise Unconvertible("bad argument", f"word list {v!r}")
    return list(v)


#: RLVR constraint function -> converter of its arguments to (IFEval id, kwargs).
RLVR_FUNCS: dict[str, Optional[Callable[[dict], tuple[str, dict]]]] = {
    "verify_keywords": lambda a: ("keywords:existence", {"keywords": _words(a.get("keyword_list"))}),
    "validate_forbidden_words": lambda a: ("keywords:forbidden_words",
                                           {"forbidden_words": _words(a.get("forbidden_words"))}),
    "validate_response_language": lambda a: ("language:response_language", {"language": a.get("language")}),
    "verify_paragraph_count": lambda a: ("length_constraints:number_paragraphs",
                                         {"num_paragraphs": _int(a.get("N"), "N")}),
    "validate_word_constraint": _rel_words,
    "verify_sentence_constraint": _rel_sentences,
    "validate_paragraphs": lambda a: ("length_constraints:nth_paragraph_first_word", {
        "num_paragraphs": _int(a.get("N"), "N"), "nth_paragraph": _int(a.get("i"), "i"),
        "first_word": a.get("first_word")}),
    "verify_postscript": lambda a: ("detectable_content:postscript", {"postscript_marker": a.get("postscript_marker")}),
    "validate_placeholders": lambda a: ("detectable_content:number_placeholders",
                                        {"num_placeholders": _int(a.get("N"), "N")}),
    "verify_bullet_points": lambda a: ("detectable_format:number_bullet_lists", {"num_bullets": _int(a.get("N"), "N")}),
    "validate_title": lambda a: ("detectable_format:title", {}),
    "validate_choice": _choice,
    "validate_highlighted_sections": lambda a: ("detectable_format:number_highlighted_sections",
                                                {"num_highlights": _int(a.get("N"), "N")}),
    "validate_sections": lambda a: ("detectable_format:multiple_sections", {
        "section_spliter": a.get("section_splitter"), "num_sections": _int(a.get("N"), "N")}),
    "validate_json_format": lambda a: ("detectable_format:json_format", {}),
    "validate_repeat_prompt": lambda a: ("combination:repeat_prompt", {"prompt_to_repeat": a.get("original_prompt")}),
    "validate_two_responses": lambda a: ("combination:two_responses", {}),
    "validate_uppercase": lambda a: ("change_case:english_capital", {}),
    "validate_lowercase": lambda a: ("change_case:english_lowercase", {}),
    "validate_frequency_capital_words": _rel_capitals,
    "validate_end": lambda a: ("startend:end_checker", {"end_phrase": a.get("end_phrase")}),
    "validate_quotation": lambda a: ("startend:quotation", {}),
    "validate_no_commas": lambda a: ("punctuation:no_comma", {}),
    # exact counts: IFEval's keyword/letter checkers only know "less than" / "at least"
    "verify_keyword_frequency": None,
    "verify_letter_frequency": None,
}


def _loads(text: Any) -> Any:
    """A ground-truth string as JSON, else as a Python literal (the sets use both)."""
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError) as e:
            raise ValueError(f"ground_truth is neither JSON nor a literal: {type(e).__name__}") from None


def convert_rlvr(rec: dict) -> tuple[list[str], list[dict]]:
    """RLVR-IFeval's ground truth -> ([IFEval id], [kwargs]); Unconvertible / ValueError otherwise."""
    gt = _loads(rec.get("ground_truth"))
    if isinstance(gt, list) and len(gt) == 1:
        gt = _loads(gt[0])
    if not isinstance(gt, dict) or not isinstance(gt.get("func_name"), str):
        raise ValueError("ground_truth has no 'func_name'")
    func = gt["func_name"]
    if func not in RLVR_FUNCS:
        raise Unconvertible(f"unknown constraint function ({func})")
    conv = RLVR_FUNCS[func]
    if conv is None:
        raise Unconvertible(f"no equivalent checker ({func})")
    iid, kw = conv({k: v for k, v in gt.items() if v is not None})
    return [iid], [kw]


def convert_multi(rec: dict) -> tuple[list[str], list[dict]]:
    """IF_multi_constraints_upto5's ground truth -> (ids, kwargs)."""
    gt = _loads(rec.get("ground_truth"))
    if isinstance(gt, list):
        if len(gt) != 1:
            raise ValueError(f"ground_truth list must hold one constraint set, has {len(gt)}")
        gt = _loads(gt[0])
    if not isinstance(gt, dict) or not isinstance(gt.get("instruction_id"), list) or not gt["instruction_id"]:
        raise ValueError("ground_truth has no 'instruction_id' list")
    ids = gt["instruction_id"]
    kwargs = gt.get("kwargs") or [None] * len(ids)
    if not isinstance(kwargs, list) or len(kwargs) != len(ids):
        raise ValueError("'kwargs' must have one entry per instruction id")
    return [str(i) for i in ids], [{k: v for k, v in (kw or {}).items() if v is not None} for kw in kwargs]


#: source -> (default hub name, converter, data card title)
SOURCES: dict[str, tuple[str, Callable[[dict], tuple[list[str], list[dict]]]]] = {
    "rlvr_ifeval": ("allenai/RLVR-IFeval", convert_rlvr),
    "if_multi_constraints": ("allenai/IF_multi_constraints_upto5", convert_multi),
}


def _check(ids: list[str], kwargs: list[dict]) -> list[dict]:
    """The kwargs the verifier will use (cleaned); Unconvertible for ids or arguments it cannot check."""
    from recipe.mrtpo.tasks.instruction_following import REGISTRY, UNSUPPORTED_IDS, clean_kwargs

    out = []
    for iid, kw in zip(ids, kwargs):
        if iid not in REGISTRY:
            raise Unconvertible(f"unknown instruction id ({iid})")
        if iid in UNSUPPORTED_IDS:
            raise Unconvertible(f"instruction id not checkable offline ({iid})")
        kw = clean_kwargs(kw)
        state = random.getstate()
        try:
            random.seed(f"mrtpo-if-source|{iid}")
            REGISTRY[iid](iid).build_description(**kw)
        except Exception as e:  # noqa: BLE001 - any refusal of the checker is a skip reason
            raise Unconvertible(f"arguments the checker does not take ({iid})", f"{type(e).__name__}: {e}") from None
        finally:
            random.setstate(state)
        out.append(kw)
    return out


def _messages(rec: dict) -> Optional[list[dict]]:
    msgs = rec.get("messages")
    if not isinstance(msgs, list) or not msgs:
        return None
    out = []
    for m in msgs:
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") \
                or not isinstance(m.get("content"), str):
            return None
        out.append({"role": m["role"], "content": m["content"]})
    last_user = max((i for i, m in enumerate(out) if m["role"] == "user"), default=-1)
    if last_user < 0 or not out[last_user]["content"].strip():
        return None
    return out[: last_user + 1]


def _texts(ids: list[str], kwargs: list[dict], prompt: str, constraint: Any) -> list[str]:
    if len(ids) == 1 and isinstance(constraint, str) and constraint.strip() and constraint.strip() in prompt:
        return [constraint.strip()]
    return [verbatim_sentence(iid, kw, prompt, "mrtpo-if-source") for iid, kw in zip(ids, kwargs)]


def build_rows(source: str, records: list[tuple[str, int, dict]], skips: SkipLog) -> list[dict]:
    """Rows from the loaded ``(file or hub name, line or row, record)`` triples (module docstring); bad
    records go to ``skips``."""
    convert = SOURCES[source][1]
    rows, seen = [], set()
    for k, (name, n, rec) in enumerate(records, start=1):  # k: the record's ordinal, n: its line
        msgs = _messages(rec)
        if msgs is None:
            skips.skip(name, n, "missing field 'messages' (or no user turn)")
            continue
        try:
            ids, kwargs = convert(rec)
            kwargs = _check(ids, kwargs)
        except Unconvertible as e:
            skips.skip(name, n, str(e))
            continue
        except (ValueError, TypeError) as e:
            skips.skip(name, n, f"bad ground_truth: {e}")
            continue
        key = rec.get("key")
        rid = str(key) if isinstance(key, (str, int)) and str(key).strip() else f"{source}-{k}"
        if rid in seen:
            skips.skip(name, n, f"duplicate key: {rid}")
            continue
        seen.add(rid)
        prompt = "\n".join(m["content"] for m in msgs)
        ground_truth = {"instruction_id_list": ids,
                        "kwargs": [json.dumps(k, sort_keys=True, ensure_ascii=False) for k in kwargs]}
        extra = {"split": "", "index": 0, "id": rid, "base_id": "", "source": source,
                 "constraint_texts": _texts(ids, kwargs, prompt, rec.get("constraint"))}
        rows.append(make_row("instruction_following", msgs, ABILITY, ground_truth, extra))
    return rows


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The options of the ``rlvr_ifeval`` / ``if_multi_constraints`` commands of
    ``python -m data_prep.instruction_following``."""
    ap.add_argument("--input", default=None, help="hub name or local .json/.jsonl/.parquet file or folder "
                    "(default: the source's hub name)")
    ap.add_argument("--out-dir", type=Path, required=True, help="folder for train.parquet [/ test.parquet]")
    ap.add_argument("--split", default="train", help="hub split to read (default train)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the hash split (default 0)")
    ap.add_argument("--test-fraction", type=fraction, default=0.0, help="held-out share (default 0)")
    ap.add_argument("--limit", type=int, default=None, help="read only the first N records")
    ap.add_argument("--cache-dir", default=None, help="datasets cache folder (default: the library's)")


def run(args: argparse.Namespace) -> int:
    """Build one public set from parsed ``instruction_following`` arguments (``args.command``: the source)."""
    name = args.input or SOURCES[args.command][0]
    skips = SkipLog()
    loaded = load_or_exit(name, skips, split=args.split, cache_dir=args.cache_dir, limit=args.limit)
    if loaded is None:
        return 1
    records, malformed = loaded
    rows = build_rows(args.command, records, skips)
    assign_splits(rows, args.seed, args.test_fraction)
    return finish(f"{args.command} ({name})", rows, args.out_dir, skips, len(records) + malformed, card_columns())
