"""The registry's types: what a method entry declares, and what its advantage and after-step hook receive.

Standard library only (the run scripts read the registry through its command line with any python3); the
torch and verl objects these types carry are typed ``Any``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

#: knobs that select the method (part of its ``overrides``), never "unread"
SELECTORS = ("mode", "shuffle")
#: how a pass runs, not what it computes: per-machine presets the run scripts set for every method of a
#: (model, task) the same way, so they are not refused where no pass runs (they change no number)
RESOURCE_KNOBS = ("replay_micro_batch_size", "chunk_size", "compile_js", "share_prompts")
#: knobs of the recipe's own advantage step, read by every method that runs it
STEP_KNOBS = ("reward_weighting", "reward_weights", "dump")
#: knobs of the replay pass, read by every method that replays
PASS_KNOBS = ("max_replay_prompt_length", "fused_check_every")

#: knobs of the self-teachers' teacher prompt, read by every method with a self-teacher (OPSD, RLSD, SDPO)
TEACHER_KNOBS = ("teacher_template",)
#: the step metric of the self-teachers: rows whose teacher prompt differs from their rollout prompt (they have
#: privileged information); 0 on every step of a run means the method had none (``Method.no_privileged``)
ROWS_PRIVILEGED = "mrtpo/rows_privileged"

#: the prompts a replay pass forwards (``ReplayPass.variants``)
PASS_VARIANTS = ("per_reward", "joint", "p_all")


@dataclass(frozen=True)
class ReplayPass:
    """What a method needs from the replay (``replay_driver.run_replay``).

    ``variants``: ``per_reward``: P_all and one P_minus_k per reward whose group varies (MRTPO, shuffle);
    ``joint``: P_all and CoRT's one P_none per sample; ``p_all``: the teacher prompt alone (P_all, or the
    rollout prompt where P_all cannot be built), its log-probs of the sampled tokens returned, no relevance
    (RLSD). ``reference``: ``cfg -> bool``, True where the pass runs through verl's reference policy (the
    initial policy) instead of the actor; such a pass is never fused with verl's old_log_prob step.
    """

    variants: str = "per_reward"
    measure: Optional[str] = None  # the worker's measure; None: ``mrtpo.measure``
    reference: Optional[Callable[[Any], bool]] = None

    def __post_init__(self) -> None:
        if self.variants not in PASS_VARIANTS:
            raise ValueError(f"ReplayPass.variants must be one of {PASS_VARIANTS}, got {self.variants!r}")

    @property
    def joint(self) -> bool:
        return self.variants == "joint"

    @property
    def p_all_only(self) -> bool:
        return self.variants == "p_all"

    def measure_of(self, cfg) -> str:
        return self.measure or cfg.measure

    def on_reference(self, cfg) -> bool:
        return bool(self.reference(cfg)) if self.reference is not None else False


@dataclass(frozen=True)
class GlueRef:
    """A function of the trainer's glue, named by its module and imported when first called.

    A method's after-step hook binds verl's batch and workers (TransferQueue, the worker group); naming it
    keeps the registry, and everything that reads it (tools, config checks, the run scripts' command line),
    free of those imports. The trainer calls it as the function itself.
    """

    module: str
    name: str

    def load(self) -> Callable:
        return getattr(importlib.import_module(self.module), self.name)

    def __call__(self, *args, **kwargs):
        return self.load()(*args, **kwargs)


@dataclass(frozen=True)
class ActorPartRef:
    """A method's part on the actor's workers (its worker-side pass, loss and state), named by module and class and
    imported by the worker when first needed (``recipe.mrtpo.methods.actor_part.ActorPart``).

    ``key``: the entry of the actor update's batch its settings travel under (the method's after-step hook sets it);
    ``checkpoint_dir``: the folder of its state in the actor's checkpoint (None: it keeps none).
    """

    key: str
    module: str
    name: str
    checkpoint_dir: Optional[str] = None

    def load(self) -> type:
        return getattr(importlib.import_module(self.module), self.name)


@dataclass
class AdvantageInputs:
    """What a method's advantage reads: the batch's rewards, groups and mask, the replay, verl's log-probs."""

    cfg: Any  # MRTPOConfig
    table: Any  # RewardTable
    index: Any  # [B] group ids (verl's uid)
    mask: Any  # [B, T] float response mask
    valid: Any  # [B] bool: not one of verl's padding rows
    step: int  # completed training steps
    strength: float  # the method's schedule at this step (beta_s, lambda_s; 0 for GDPO)
    replay: Any = None  # ReplayResult or None
    old_log_probs: Any = None  # [B, T] verl's old_log_probs (the behaviour policy under the rollout prompt)


@dataclass
class StepContext:
    """What an ``after_step`` hook may use: the batch, its reward table and the actor's workers, no trainer."""

    config: Any  # the composed config
    cfg: Any  # MRTPOConfig
    batch: Any  # verl's batch meta (TransferQueue keys)
    metrics: dict
    table: Any  # RewardTable
    fields: dict  # the step's own fetch: extra_fields, raw_prompt, prompts
    tokenizer: Any
    render: Callable[[list], list]  # chat messages -> prompt ids, as the rollout rendered them
    worker_group: Any  # the actor's worker group (its registered methods, e.g. compute_opsd_teacher)
    dp_size: Callable[[], int]  # the actor's data-parallel size
    row_render: Optional[Callable[[int], Callable[[list], list]]] = None  # sample -> its render (the row's tools), or None
    # verl's reference worker group (the initial policy; raises where verl built none) and its data-parallel size:
    # OPSD's frozen teacher
    reference_group: Optional[Callable[[], Any]] = None
    reference_dp_size: Optional[Callable[[], int]] = None
    # the batch meta the advantage step's write returned (every persisted field): what a hook that writes no field
    # of its own returns for the update (None: ``batch``)
    written: Any = None


@dataclass(frozen=True)
class Method:
    """One compared method (the registry's entry; ``recipe.mrtpo.methods`` documents each field)."""

    name: str
    summary: str
    estimator: str  # algorithm.adv_estimator
    mode: str = "mrtpo"  # mrtpo.mode
    shuffle: bool = False  # mrtpo.shuffle
    reads: tuple[str, ...] = ()
    replay: Optional[ReplayPass] = None
    # (MRTPOConfig, completed training steps, the composed config) -> the schedule of the token-level part
    strength: Optional[Callable[[Any, int, Any], float]] = None
    advantage: Optional[Callable[[AdvantageInputs], tuple]] = None
    after_step: Optional[Callable[[StepContext], Any]] = None  # a GlueRef (or any callable)
    checks: tuple[Callable[[Any, Method, Any], None], ...] = field(default=())  # (config, method, MRTPOConfig)
    # a self-teacher's step metrics -> (mark, sentence): what the method is where no row has privileged
    # information (the report's mark of such a run, the launch line); None for the other methods
    no_privileged: Optional[Callable[[dict], tuple[str, str]]] = None
    # verl settings the method cannot run without, appended to its overrides (what ALGO= passes): OPSD's reference
    # worker (use_kl_loss=True) with no KL term (kl_loss_coef=0, which its loss does not read); SDPO's FSDP2
    settings: tuple[str, ...] = ()
    # its part on the actor's workers (OPSD's and SDPO's losses, SDPO's EMA teacher, RLSD's teacher sync), or None
    actor_part: Optional[ActorPartRef] = None

    @property
    def overrides(self) -> tuple[str, ...]:
        out = [f"algorithm.adv_estimator={self.estimator}"]
        if self.mode != "mrtpo":
            out.append(f"mrtpo.mode={self.mode}")
        if self.shuffle:
            out.append("mrtpo.shuffle=True")
        return (*out, *self.settings)

    @property
    def recipe_step(self) -> bool:
        """The recipe computes its advantage (else verl's estimator step runs unchanged)."""
        return self.advantage is not None

    def reads_knob(self, knob: str) -> bool:
        return knob in self.reads or knob in SELECTORS or knob in RESOURCE_KNOBS

    @property
    def self_teacher(self) -> bool:
        """The method learns from the policy under a teacher prompt with privileged information (OPSD, RLSD, SDPO)."""
        return self.no_privileged is not None


def no_privileged_line(method: Method, metrics: dict, step) -> Optional[str]:
    """The one line a self-teacher's run logs when a step's :data:`ROWS_PRIVILEGED` is 0 (no row's teacher
    prompt differs from its rollout prompt), else None (also for methods without a self-teacher and steps
    where it was not measured)."""
    if not method.self_teacher or metrics.get(ROWS_PRIVILEGED, None) is None or metrics[ROWS_PRIVILEGED] != 0:
        return None
    mark, sentence = method.no_privileged(metrics)
    return (f"mrtpo: method {method.name}, step {step}: no row has privileged information (every teacher prompt is "
            f"its rollout prompt: each Z_k is already in the prompt, or none is given); {method.name} {mark}: {sentence}")


def get_key(config, dotted: str, default=None):
    """``config.a.b.c`` or ``default`` when any part is absent (composed DictConfig or plain dict)."""
    node = config
    for part in dotted.split("."):
        if node is None or not hasattr(node, "get"):
            return default
        node = node.get(part, None)
    return default if node is None else node
