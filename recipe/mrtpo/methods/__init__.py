"""The recipe's methods, one entry each, resolved once from the composed config before Ray starts.

A method is what ``ALGO=<name>`` selects in the run scripts and what a report row is named after. Its
:class:`Method` entry declares everything the trainer's advantage step does differently for it:

- ``overrides``: the Hydra overrides that select it (``algorithm.adv_estimator`` and the ``mrtpo.*``
  selectors ``mode`` / ``shuffle``); :func:`resolve` maps a composed config back to exactly one entry;
- ``reads``: the ``mrtpo.*`` knobs it reads. A knob another method reads, set to anything but its
  default, is refused with the knob and the method named (it would do nothing);
- ``replay``: the replay pass it needs (:class:`ReplayPass`: which prompts it forwards, on the actor or on
  verl's reference policy), or None;
- ``strength``: the schedule of its token-level part (MRTPO's beta_s, RLSD's lambda_s); the replay runs
  only when it is > 0 (at 0 the method is GDPO exactly, so nothing is replayed);
- ``advantage``: the token advantage from the step's inputs (:class:`AdvantageInputs`), or None for
  verl's own estimator step (GRPO);
- ``after_step``: a hook after the advantage is written (OPSD's and SDPO's teacher passes and loss settings), named by
  its import path (:class:`GlueRef`);
- ``checks``: verl settings the method cannot run with, refused with what to change;
- ``no_privileged``: for a self-teacher (OPSD, gdpo-distill, RLSD, SDPO), what it is where no row's teacher prompt differs
  from its rollout prompt (a mark and a sentence): the launch line of such a run
  (:func:`no_privileged_line`, on the first step whose ``mrtpo/rows_privileged`` is 0) and the report's
  mark of its table cells.

Layout: :mod:`.types` (the entry's types), :mod:`.checks` (the shared verl-setting checks), one module per
method or family holding its entry, advantage, pass needs and hook (:mod:`.gdpo`: GRPO and GDPO;
:mod:`.mrtpo`: MRTPO, CoRT, shuffle; :mod:`.rlsd`; :mod:`.opsd`, a package with OPSD's and gdpo-distill's teacher pass and
loss; :mod:`.sdpo`, SDPO's entry, pass, EMA teacher and loss on OPSD's pass), :mod:`.registry` (the table, :func:`resolve`, the command line). The registry and its types import no
torch, no verl and none of the trainer's glue (tests/unit/test_import_graph.py): the run scripts call its
command line for every launch with any python3: ``python3 -m recipe.mrtpo.methods`` lists the methods,
``python3 -m recipe.mrtpo.methods overrides NAME`` prints a method's Hydra overrides, one per line; ``reads
NAME`` the ``mrtpo.*`` knobs it reads.
"""

from recipe.mrtpo.methods.gdpo import gdpo_advantage
from recipe.mrtpo.methods.registry import METHODS, get, main, modes, name_of, names, replay_pass_of, resolve
from recipe.mrtpo.methods.types import (
    PASS_KNOBS,
    RESOURCE_KNOBS,
    ROWS_PRIVILEGED,
    SELECTORS,
    STEP_KNOBS,
    TEACHER_KNOBS,
    AdvantageInputs,
    GlueRef,
    Method,
    ReplayPass,
    StepContext,
    no_privileged_line,
)

__all__ = [
    "METHODS", "PASS_KNOBS", "RESOURCE_KNOBS", "ROWS_PRIVILEGED", "SELECTORS", "STEP_KNOBS", "TEACHER_KNOBS",
    "AdvantageInputs", "GlueRef", "Method",
    "ReplayPass", "StepContext", "gdpo_advantage", "get", "main", "modes", "name_of", "names", "replay_pass_of",
    "resolve", "no_privileged_line",
]
