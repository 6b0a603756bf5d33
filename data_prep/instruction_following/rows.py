"""Instruction-following rows shared by the builders: the verbatim constraint sentence and the data card.

A leaf module (no other ``data_prep`` builder is imported): :mod:`data_prep.instruction_following`
(training prompts, IFEval / IFBench, the CLI) and :mod:`data_prep.instruction_following.sources` (the peers' public
sets) both use it.
"""

from __future__ import annotations

__all__ = ["ABILITY", "verbatim_sentence", "card_columns"]

ABILITY = "instruction_following"

_IFEVAL_FAMILIES = {"keywords", "language", "length_constraints", "detectable_content", "detectable_format",
                    "combination", "startend", "change_case", "punctuation"}


def verbatim_sentence(iid: str, kw: dict, prompt: str, seed: str) -> str:
    """The checker's sentence for these arguments (drawn with ``seed`` where the checker draws) if it
    occurs verbatim in ``prompt``, else "" (the replay then gives that reward uniform weights)."""
    from recipe.mrtpo.tasks.instruction_following import describe_constraint

    try:
        sentence, _ = describe_constraint(iid, kw, seed=seed)
    except (KeyError, ValueError, TypeError):
        return ""
    sentence = (sentence or "").strip()
    return sentence if sentence and sentence in prompt else ""


def card_columns():
    """The data card's columns of instruction-following rows."""
    ids = lambda r: list(r["reward_model"]["ground_truth"]["instruction_id_list"])  # noqa: E731
    return [
        ("constraints per prompt", lambda r: len(r["reward_model"]["ground_truth"]["instruction_id_list"])),
        ("source (IFEval / IFBench)", lambda r: ["IFEval" if ":" in i and i.split(":")[0] in _IFEVAL_FAMILIES
                                                 else "IFBench" for i in ids(r)]),
        ("constraint family", lambda r: [i.split(":", 1)[0] for i in ids(r)]),
        ("Z_k verbatim in prompt", lambda r: ["yes" if t else "no" for t in r["extra_info"]["constraint_texts"]]),
        ("instruction id", ids),
    ]
