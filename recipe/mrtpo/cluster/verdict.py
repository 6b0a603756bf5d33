"""No verdict: a verifier that could not judge a response through no fault of the response.

An asset of the node that is not there (NLTK data), a database the node cannot open or read, a gold query that
fails: the verifier raises :class:`NoVerdict` (a file missing on the node raises ``node_files.missing_line``
instead), the reward manager keeps its one line as the row's ``mrtpo_error``, and the trainer takes the row out of
the step (``reward_extras.RewardTable.rows_out``), never scoring it 0. Standard library only (the trainer's side
reads the mark without importing the verifiers).
"""

from __future__ import annotations

from typing import Any

from recipe.mrtpo.cluster.node_files import node_name

#: how a :class:`NoVerdict`'s message begins (the node's name follows): what the trainer recognises it by
NO_VERDICT_MARK = "mrtpo: no verdict on node "


class NoVerdict(RuntimeError):
    """The verifier could not judge the response, through no fault of the response (module docstring).

    The message is one line: :data:`NO_VERDICT_MARK`, this node's name, then ``why``."""

    def __init__(self, why: str):
        super().__init__(f"{NO_VERDICT_MARK}{node_name()}: {' '.join(str(why).split())}")


def is_no_verdict(text: Any) -> bool:
    """Whether an error text (a verifier's ``mrtpo_error``, an exception's message) holds a :class:`NoVerdict`."""
    return NO_VERDICT_MARK in str(text or "")
