"""verl's reward side: ``reward_manager`` (the ``mrtpo`` reward-loop manager: per-reward scores and Z_k for every
sample) and ``reward_extras`` (what it leaves per sample, parsed once on the trainer's side)."""
