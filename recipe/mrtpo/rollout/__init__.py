"""The rollout as the recipe needs it: ``rollout_render`` (prompts rendered as the rollout rendered them, for the
replay) and ``rollout_seed`` (every rollout request its own vLLM seed, through verl's agent-loop manager extension
point)."""
