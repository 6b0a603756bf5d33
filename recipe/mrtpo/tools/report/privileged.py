"""Self-teacher runs without privileged information: which runs of OPSD / RLSD never had any, from their logs.

A self-teacher (the registry's entries with ``no_privileged``) logs ``mrtpo/rows_privileged`` on every step it
measures it: the rows whose teacher prompt differs from their rollout prompt. A run where it is 0 on every
logged step (instruction following: every Z_k is already in the rollout prompt) never had privileged
information; its method then reduces to what its entry says (RLSD with the live teacher: GDPO exactly). The
report marks its table cells with the entry's mark (``= GDPO here``) and says why below the table. Logs that
predate the common name are read through the method's own ``mrtpo/<method>/rows_privileged``, on the steps
where the pass ran (no ``mrtpo/replay_skipped``). A run that never logged either metric is not marked.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Optional

from recipe.mrtpo.methods import METHODS, ROWS_PRIVILEGED


def privileged_counts(method: str, steps: dict) -> list[float]:
    """The logged ``mrtpo/rows_privileged`` of a run's steps, in step order (the older per-method name where
    the common one is absent)."""
    own = f"mrtpo/{method}/rows_privileged"
    out = []
    for step in sorted(steps):
        m = steps[step]
        if ROWS_PRIVILEGED in m:
            out.append(float(m[ROWS_PRIVILEGED]))
        elif own in m and not m.get("mrtpo/replay_skipped"):
            out.append(float(m[own]))
    return out


def no_privileged_mark(method: str, steps: dict) -> Optional[tuple[str, str]]:
    """(mark, sentence) when ``method`` is a self-teacher and the run's logged rows_privileged is 0 on every
    step that has it (and at least one has), else None. The mark is the entry's for the run's last such step."""
    entry = METHODS.get(method)
    if entry is None or not entry.self_teacher:
        return None
    counts = privileged_counts(method, steps)
    if not counts or any(c != 0 for c in counts):
        return None
    last = max(steps)
    return entry.no_privileged(steps[last])


def group_marks(runs: Iterable) -> dict[tuple[str, str, str], tuple[str, str]]:
    """(model, training task, method) -> (mark, sentence) for the groups whose every run has no privileged
    information with the same mark (runs: the discovery's ``TrainRun``s)."""
    by_group: dict[tuple[str, str, str], list] = {}
    for r in runs:
        by_group.setdefault((r.model, r.task, r.method), []).append(no_privileged_mark(r.method, r.steps))
    return {k: v[0] for k, v in by_group.items() if v and v[0] is not None and all(x == v[0] for x in v)}
