"""MRTPO: reward-specific token-level credit assignment for multi-reward RL, as a verl 0.9.1 recipe.

The maths lives in ``core/`` (torch and numpy only): ``relevance`` (the per-token Jensen-Shannon between two
prompt variants), ``advantage`` (relevance weights, the MRTPO/GDPO token advantage, SAW/DVAO reward
weighting, RLSD's reweight), ``replay`` and ``passes`` (the worker-side passes). ``methods`` is the package of
the compared methods (GRPO, GDPO, MRTPO, CoRT, shuffle, OPSD, gdpo-distill, RLSD): their registry and, one module per method
or family, each one's advantage, pass needs and hook (OPSD's teacher pass and loss). The verl coupling sits in packages named by role
(docs/architecture.md): ``step`` (the trainer, verl's v1 sync trainer registered as ``mrtpo`` with its advantage step
overridden, and the actor worker: verl's plus the replay and teacher passes), ``rewards`` (the ``mrtpo`` reward
manager), ``rollout``, ``passes`` (the passes' wire), ``launch`` and ``cluster`` (what runs before step 1, what every
node must hold) and ``seams`` (the guarded re-statement of verl's step, ``verl_seam``); the entry points are
``main_mrtpo`` and ``doctor``.
"""

__version__ = "0.2.0"  # pyproject.toml's
