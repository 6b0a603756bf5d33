"""Instruction-following data: ``build`` (multi-constraint training prompts, the IFEval / IFBench sets; the command
line), ``compat`` (which constraints may share a row), ``rows`` (the row schema the builders share), ``sources`` (the
peers' public training sets). ``python -m data_prep.instruction_following`` runs ``build``."""
