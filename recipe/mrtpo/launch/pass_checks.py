"""Launch checks of the models and adapters the recipe's passes run on (``main_mrtpo.check_config``, before Ray).

A method that replays (MRTPO, CoRT, the shuffle control, RLSD) or teaches (OPSD) runs its own no-grad
passes through the actor's module, and on a replay step writes verl's ``old_log_probs`` from them. Refused
here, in one line naming what to change:

- a vision-language model, and a model type the table does not know whose config has recurrent layers
  (``recipe.mrtpo.core.model_support``: the table; read from the model folder's ``config.json``, or from
  the local Hugging Face cache for a hub id; a model whose config cannot be read here is left to the
  worker, which applies the same table to the loaded module);
- LoRA (``actor_rollout_ref.model.lora_rank > 0``): the passes call the actor's module as a plain causal LM
  and have not been run or tested with verl's adapters (merged or not), so the fused ``old_log_probs``
  would not be known to equal verl's;
- verl's ``actor.use_prefix_grouper=True``: it regroups the update's forward by shared prompt; the fused
  ``old_log_probs`` have not been tested against it (the recipe's passes share prompts on their own,
  ``recipe.mrtpo.core.shared_prompts``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from recipe.mrtpo.core.model_support import config_facts, refusal
from recipe.mrtpo.methods.types import get_key  # config.a.b.c or a default (standard library only)

ARR = "actor_rollout_ref"


def model_config_dict(path: str) -> Optional[dict]:
    """The model's ``config.json`` as a dict: from a local folder, else from the local Hugging Face cache
    (never the network); None when neither has it."""
    p = Path(str(path)).expanduser()
    f = p / "config.json"
    if not f.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(str(path), "config.json")
        except Exception:  # not a repo id, or no hub library: left to the worker
            cached = None
        if not isinstance(cached, str):
            return None
        f = Path(cached)
    try:
        return json.loads(f.read_text())
    except (OSError, ValueError):
        return None


def runs_passes(method, cfg) -> bool:
    """Whether the run's method runs the recipe's passes: a replay (unless ``mrtpo.replay=False``) or a teacher."""
    if method.replay is not None and (not method.reads_knob("replay") or cfg.replay):
        return True
    return method.after_step is not None


def check_pass_support(config, method, cfg) -> None:
    """Refuse, before Ray, a model or adapter the method's passes cannot run exactly on (module docstring)."""
    if not runs_passes(method, cfg):
        return
    who = f"method {method.name} ({', '.join(method.overrides)})"
    off = ("turn the replay off (mrtpo.replay=False: the run is then GDPO)" if method.reads_knob("replay")
           else "choose a method without the pass (ALGO=gdpo)")
    rank = int(get_key(config, f"{ARR}.model.lora_rank", 0) or 0)
    if rank > 0:
        raise ValueError(
            f"{ARR}.model.lora_rank={rank} (LoRA) is not supported with {who}: its replay / teacher passes and the fused "
            f"old_log_prob forward the actor's module as a plain causal LM, not tested with verl's adapters. Set "
            f"{ARR}.model.lora_rank=0 (full fine-tuning), or {off}."
        )
    if bool(get_key(config, f"{ARR}.actor.use_prefix_grouper", False)):
        raise ValueError(
            f"{ARR}.actor.use_prefix_grouper=True is not supported with {who}: verl's PrefixGrouper changes the update's "
            f"forward, and the fused old_log_probs of the recipe's passes are not tested against it. Set "
            f"{ARR}.actor.use_prefix_grouper=False (the recipe's passes share prompts themselves: mrtpo.share_prompts), or {off}."
        )
    hf = model_config_dict(str(get_key(config, f"{ARR}.model.path", "") or ""))
    if hf is not None:
        msg = refusal(**config_facts(hf), what=f"{who}'s replay and teacher passes", otherwise=off)
        if msg:
            raise ValueError(msg)
