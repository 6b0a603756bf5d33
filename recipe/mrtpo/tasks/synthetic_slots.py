"""A synthetic multi-reward task whose rewards each read a known set of response tokens ("slots").

The prompt holds an opening sentence of random length (:data:`PREAMBLES`), one request sentence per
field, then the order of the form::

    Hi. Set A=3. Set C=8. Set B=5. Fill in the form in this order: B, C, A.

and the answer is ``Form: B=5 C=8 A=3``. Reward ``slot_<X>`` is 1 when the first ``X=<digits>`` in the
response carries the requested value, else 0; it reads nothing else. Its verifier information Z_k is the
request sentence of that field (``Context("Set A=3.", "prompt")``).

Each field draws its value from its own digits (:data:`VALUES`: A from 1-3, B from 4-6, C from 7-9), so
the request sentence of field X is the only place in the prompt that holds a value of X's range.
Removing it (the replay's P_minus_k) takes away exactly what the value token of field X depends on and
nothing that another field needs: the tokens each reward depends on are known by construction. (With
one shared digit range a tiny model has to bind each label to its digit by content, which it does not
learn in a few CPU minutes.) The field order varies from prompt to prompt, so the value token of field
X sits at a different position each time. The order sentence comes last, next to the response: a tiny
model copies the labels from it at a fixed distance, and removing a request sentence before it leaves
that distance unchanged (with the order sentence first, every P_minus_k shifted it and moved every
label's prediction, whatever the reward). Every `` X``, ``=`` and digit is one Qwen2 token, so "the
positions reward k reads" is a well-defined token set (:func:`slot_value_spans` gives its character
span; ``experiments.mini_credit.localisation.read_positions`` maps it to tokens).

Public names: :data:`DATA_SOURCE`, :data:`LABELS`, :data:`VALUES`, :data:`PREAMBLES`, :data:`ANSWER_PREFIX`,
:func:`reward_name`, :func:`request_sentence`, :func:`order_sentence`, :func:`prompt_text`,
:func:`answer_text`, :func:`find_slot`, :func:`slot_value_spans`, :func:`parse_ground_truth`,
:func:`score_synthetic_slots` (registered for ``data_source == "synthetic_slots"``).

Ground truth (``reward_model.ground_truth`` of a row)::

    {"fields": [{"name": "A", "value": "3"}, {"name": "B", "value": "5"}, ...],
     "order": ["B", "C", "A"]}
"""

from __future__ import annotations

import re
from typing import Any, Optional

from recipe.mrtpo.tasks.base import Context, RewardResult, as_text, register_task

DATA_SOURCE = "synthetic_slots"
#: Field labels, in the order a form with n fields uses them (each `` X`` is one Qwen2 token).
LABELS = "ABC"
#: The digits each field's value is drawn from: disjoint, so each request sentence is the only source of
#: its field's value.
VALUES = {"A": "123", "B": "456", "C": "789"}
PREAMBLE = "Fill in the form in this order:"
#: Opening sentences of different lengths (0-9 tokens), one drawn per prompt: a prompt's length then says
#: nothing about where its fields are, so a model cannot time its answer (e.g. its stop) by the distance
#: to the prompt's start, which P_minus_k shortens. (With every prompt equally long a tiny model did, and
#: every P_minus_k moved its end-of-answer prediction, whatever the reward.)
PREAMBLES = ("", "Hi.", "Hello there.", "Please help.", "Thanks in advance.", "Here is a short form.",
             "Good morning, this is the front desk.", "Please fill this in for me, thank you.")
#: What a demonstration starts with; it makes every field `` X=d`` (space, label, =, digit: the same tokens
#: as in the request sentence "Set X=d.").
ANSWER_PREFIX = "Form:"

# ASCII-only classes on purpose: Python's \d and \w also match other scripts' digits and letters.
_SLOT = re.compile(r"(?<![A-Za-z0-9_])([A-Z])[ \t]*=[ \t]*([0-9]+)")


def reward_name(label: str) -> str:
    """The reward of field ``label``: ``slot_A``."""
    return f"slot_{label}"


def request_sentence(label: str, value: str) -> str:
    """The prompt sentence that requests ``label``'s value; it is also that reward's Z_k."""
    return f"Set {label}={value}."


def order_sentence(order: list[str]) -> str:
    return f"{PREAMBLE} {', '.join(order)}."


def prompt_text(fields: list[dict], order: list[str], request_order: Optional[list[str]] = None,
                preamble: str = "") -> str:
    """The user turn: the preamble (if any), one request sentence per field (in ``request_order``, default
    the fields' order), then the order sentence."""
    by_name = {f["name"]: str(f["value"]) for f in fields}
    names = list(request_order) if request_order is not None else [f["name"] for f in fields]
    parts = [preamble] if preamble else []
    return " ".join([*parts, *(request_sentence(n, by_name[n]) for n in names), order_sentence(order)])


def answer_text(values: dict[str, str], order: list[str]) -> str:
    """The answer form: ``Form: B=7 C=1 A=3`` (``values`` by label, written in ``order``)."""
    return " ".join([ANSWER_PREFIX, *(f"{n}={values[n]}" for n in order)])


def find_slot(text: str, label: str) -> Optional[tuple[str, tuple[int, int]]]:
    """The first ``label=<digits>`` in ``text``: (the digits, their character span), or None."""
    for m in _SLOT.finditer(text):
        if m.group(1) == label:
            return m.group(2), m.span(2)
    return None


def slot_value_spans(text: str, labels) -> dict[str, Optional[tuple[int, int]]]:
    """Per label, the character span of the value the verifier compares (None: no such field)."""
    out = {}
    for label in labels:
        found = find_slot(text, label)
        out[label] = found[1] if found else None
    return out


def parse_ground_truth(ground_truth: Any) -> tuple[list[tuple[str, str]], list[str]]:
    """``[(label, requested value)]`` and the requested order; ValueError on a malformed ground truth."""
    if not isinstance(ground_truth, dict) or "fields" not in ground_truth:
        raise ValueError(f"synthetic_slots ground truth must be a dict with 'fields', got {ground_truth!r:.200}")
    fields = []
    for f in ground_truth["fields"]:
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or f.get("value") is None:
            raise ValueError(f"synthetic_slots field must be {{'name': str, 'value': digits}}, got {f!r:.200}")
        name, value = f["name"], str(f["value"])
        if len(name) != 1 or name not in LABELS or not value.isascii() or not value.isdigit():
            raise ValueError(f"synthetic_slots field {name!r}={value!r}: name must be one of {LABELS!r}, value ASCII digits")
        fields.append((name, value))
    names = [n for n, _ in fields]
    if not fields or len(set(names)) != len(names):
        raise ValueError(f"synthetic_slots ground truth needs distinct field names, got {names}")
    order = [str(x) for x in (ground_truth.get("order") or names)]
    if sorted(order) != sorted(names):
        raise ValueError(f"synthetic_slots order {order} is not a permutation of the fields {names}")
    return fields, order


def score_synthetic_slots(response: Any, ground_truth: dict, extra_info: Optional[dict] = None) -> RewardResult:
    """One reward per field: 1.0 when the first ``X=<digits>`` of the response has the requested value.

    Any response is accepted (no exception for any string); a malformed ground truth raises ValueError
    (a data bug, counted by the reward manager as a verifier error).
    """
    fields, _ = parse_ground_truth(ground_truth)
    text = as_text(response)
    scores, contexts = {}, {}
    for name, value in fields:
        found = find_slot(text, name)
        scores[reward_name(name)] = float(found is not None and found[0] == value)
        contexts[reward_name(name)] = Context(request_sentence(name, value), "prompt")
    return RewardResult(scores=scores, contexts=contexts)


register_task(DATA_SOURCE, score_synthetic_slots)
