"""Does MRTPO learn span-read constraints faster than GDPO on a real model? SmolLM2-135M-Instruct in verl's loop on
CPU, instruction-following prompts with 2-3 constraints, each rewarded by its official checker
(``docs/real_model_learning/analysis_plan.md``, committed before any run).

    python -m experiments.real_model_learning plan                        # the settings and each arm's overrides, checked
    python -m experiments.real_model_learning run --arm mrtpo --seed 100  # one run and its committed record
    python -m experiments.real_model_learning summary                     # the plan's numbers from the records

:mod:`.settings` holds what the plan fixes (pool, arms, seeds, the overrides of a run); :mod:`.runs` runs one
(arm, seed): the data, verl's loop, the export, the held-out and IFEval evaluations, the record; :mod:`.analysis`
computes what the plan computes from the committed records (theta, n, T, stalls, collapses, the test).
"""
