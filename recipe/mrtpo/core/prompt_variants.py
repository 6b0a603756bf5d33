"""Prompt variants for the replay: P_all and P_minus_k from a sample's messages and contexts Z_k
(docs/design.md §2). Python and numpy; tokenisation is a callable passed in.

- ``placement="prompt"``: Z_k is a verbatim substring of the system or user turns (never searched in
  assistant or tool turns). P_minus_k removes every occurrence, each removal collapsing the separators
  around it (no double space or extra blank line left); several occurrences are counted (``repeated``).
- ``placement="appended"``: P_all gets one verifier-information block at the end of the last user
  turn, holding every appended Z_j of the sample, each labelled by its reward name::

      <verifier_information>
      [execution_match]
      SELECT ...
      </verifier_information>

  P_minus_k is the same block without Z_k (no block at all when nothing is left).

The self-teachers (OPSD, RLSD) do not use the replay's P_all as their teacher prompt: they frame the
privileged information with an instruction, as their references do (:func:`teacher_messages`,
:data:`TEACHER_TEMPLATE`). MRTPO's replay (P_all, P_minus_k) is unframed.

A variant that cannot be built gets no replay and its pair falls back to uniform weights, counted by
reason: ``not_found`` (Z_k not in the prompt), ``empty_context``, ``too_long`` (over the replay prompt
length limit), ``no_messages`` (no raw chat to edit). Variants are deduplicated by token ids: identical
prompts (e.g. two rewards with the same context) are replayed once.

:func:`rollout_prompt_variant` says which variant of a sample is its rollout prompt (P_all for
prompt-placed Z; for appended Z, the P_minus_k whose block is empty), the rows where the replay's log-probs
must equal verl's ``old_log_probs``. A sample's variants are built as messages first
(:func:`variant_messages`) and rendered after (:func:`render_variants`), so that a batch's planner can hand
all of them to :class:`recipe.mrtpo.core.render_cache.CachedRender` at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

BLOCK_OPEN = "<verifier_information>"
BLOCK_CLOSE = "</verifier_information>"

FALLBACK_REASONS = ("not_found", "empty_context", "too_long", "no_messages")


SEARCHED_ROLES = ("system", "user")  # Z_k is looked for in these turns only, never in the model's own


def _collapse(before: str, after: str) -> str:
    """Join the text around a removed sentence with one separator: the wider of the two it stood between.

    ``"A. Z. B."`` -> ``"A. B."``; ``"A.\n\nZ\n\nB"`` -> ``"A.\n\nB"``; ``"A. Z.\nB"`` -> ``"A.\nB"``. At
    the start or end of the text, the text's own leading / trailing white space is kept. So a removal never
    leaves a double space or three newlines that were not there.
    """
    head, tail = before.rstrip(), after.lstrip()
    ws_before, ws_after = before[len(head):], after[: len(after) - len(tail)]
    if not head:
        return ws_before + tail if not tail else tail
    if not tail:
        return head + ws_after
    sep = max(ws_before, ws_after, key=lambda w: (w.count("\n"), len(w)))
    return head + sep + tail


def remove_all(content: str, text: str) -> tuple[str, int]:
    """``content`` with every occurrence of ``text`` removed (separators collapsed), and how many there were.

    An occurrence created by a removal (the text around it joining into ``text`` again) is removed too:
    the result never contains ``text``.
    """
    n = 0
    pos = content.find(text) if text else -1
    while pos >= 0:
        content = _collapse(content[:pos], content[pos + len(text):])
        n += 1
        pos = content.find(text)
    return content, n


def _edit_content(content, text: str):
    """(new content, occurrences) of a message content: a string, or a list of parts with text parts."""
    if isinstance(content, str):
        return remove_all(content, text)
    if isinstance(content, list):
        parts, total = [], 0
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                new, n = remove_all(part["text"], text)
                part = {**part, "text": new} if n else part
                total += n
            parts.append(part)
        return parts, total
    return content, 0


def count_occurrences(messages: Sequence[dict], text: str) -> int:
    """How many times ``text`` occurs in the system and user turns (what :func:`remove_from_messages` removes)."""
    return sum(_edit_content(m.get("content"), text)[1] for m in messages if m.get("role") in SEARCHED_ROLES) if text else 0


def remove_from_messages(messages: Sequence[dict], text: str) -> Optional[list[dict]]:
    """A copy of ``messages`` with **every** occurrence of ``text`` removed, or None if it occurs nowhere.

    Only system and user turns are searched (an assistant turn is the model's own text, a tool turn a tool's).
    Each removal collapses the separators around it (:func:`_collapse`). The input is not modified.
    Why every copy and not the first (``docs/design.md`` §2): a copy left behind still shows Z_k to the model.
    """
    if not text:
        return None
    out, found = [], 0
    for msg in messages:
        if msg.get("role") in SEARCHED_ROLES:
            content, n = _edit_content(msg.get("content"), text)
            if n:
                msg = {**msg, "content": content}
                found += n
        out.append(dict(msg))
    return out if found else None


def verifier_block(appended: Sequence[tuple[str, str]]) -> str:
    """The verifier-information block for (reward name, Z) pairs, in the given order ('' if none)."""
    if not appended:
        return ""
    body = "\n".join(f"[{name}]\n{text}" for name, text in appended)
    return f"{BLOCK_OPEN}\n{body}\n{BLOCK_CLOSE}"


def append_to_last_user(messages: Sequence[dict], block: str) -> list[dict]:
    """A copy of ``messages`` with ``block`` appended to the last user turn (a new user turn if none)."""
    out = [dict(m) for m in messages]  # contents are replaced, never edited in place
    if not block:
        return out
    for i in range(len(out) - 1, -1, -1):
        if out[i].get("role") == "user" and isinstance(out[i].get("content"), str):
            out[i]["content"] = out[i]["content"].rstrip() + "\n\n" + block
            return out
    out.append({"role": "user", "content": block})
    return out


#: The self-teachers' framing of the privileged information (``mrtpo.teacher_template``; None = this one). The
#: wording is the RLSD authors' self-distillation teacher prompt (iie-ycx/RLSD,
#: ``examples/visual_rl/format_prompt/teacher_hint_self_distill.jinja``), which frames the information as OPSD's
#: ``data_collator.py`` does (the problem, "Here is a reference solution to this problem:", the solution, an
#: instruction to solve it); its last sentence, the output format of the authors' tasks, is left out: the
#: rollout prompt ``{prompt}`` carries each task's own format instruction.
TEACHER_TEMPLATE = (
    "{prompt}\n\n"
    "Here is a reference solution:\n"
    "{information}\n\n"
    "After understanding the reference solution, please try to solve this problem using your own approach below."
)
#: the fields a teacher template must use, each exactly once
TEACHER_FIELDS = ("prompt", "information")


def check_teacher_template(template: Optional[str]) -> None:
    """Raise ValueError unless ``template`` is None or a ``str.format`` string using ``{prompt}`` and
    ``{information}`` once each and no other field (literal braces doubled: ``{{`` ``}}``)."""
    if template is None:
        return
    import string

    if not isinstance(template, str):
        raise ValueError(f"mrtpo.teacher_template must be a string or null, got {template!r}")
    try:
        names = [f for _, f, spec, conv in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        raise ValueError(f"mrtpo.teacher_template is not a format string ({e}); write literal braces as {{{{ }}}}") from e
    bad = sorted({n for n in names if n not in TEACHER_FIELDS})
    if bad or sorted(names) != sorted(TEACHER_FIELDS):
        raise ValueError(f"mrtpo.teacher_template must use {{prompt}} and {{information}} once each and no other "
                         f"field, got fields {names}")


def frame_information(prompt: str, information: str, template: Optional[str] = None) -> str:
    """``template`` (:data:`TEACHER_TEMPLATE` when None) filled with a user turn's text and the information,
    each stripped of surrounding white space (the reference template's ``trim``)."""
    return (template if template is not None else TEACHER_TEMPLATE).format(prompt=prompt.strip(), information=information.strip())


def privileged_information(contexts: dict[str, dict]) -> str:
    """The information the rollout prompt lacks: every appended Z_k of the sample with text, in reward-name
    order, each stripped and under its reward name when there are several (``[name]`` then the text); '' when
    none."""
    appended = [(n, contexts[n]["text"].strip()) for n in sorted(contexts)
                if contexts[n].get("placement") == "appended" and (contexts[n].get("text") or "").strip()]
    if len(appended) == 1:
        return appended[0][1]
    return "\n\n".join(f"[{name}]\n{text}" for name, text in appended)


def teacher_messages(messages: Optional[Sequence[dict]], contexts: dict[str, dict],
                     template: Optional[str] = None) -> Optional[list[dict]]:
    """The self-teachers' teacher prompt (OPSD, RLSD) as messages, or None without messages.

    The privileged information is what the rollout prompt lacks, the appended Z_k
    (:func:`privileged_information`); the last user turn becomes ``template`` filled with its text
    (``{prompt}``) and that information (``{information}``); the other turns are kept. A prompt-placed Z_k is
    already in the rollout prompt, in place, as in the replay's P_all. A sample with no appended Z (every Z_k
    prompt-placed: instruction following) has no privileged information and is not framed: its teacher prompt
    is its rollout prompt. Without a user turn with text content, the framed information (``{prompt}``
    empty) is a new user turn.
    """
    if not messages:
        return None
    out = [dict(m) for m in messages]  # contents are replaced, never edited in place
    info = privileged_information(contexts)
    if not info:
        return out
    for i in range(len(out) - 1, -1, -1):
        if out[i].get("role") == "user" and isinstance(out[i].get("content"), str):
            out[i]["content"] = frame_information(out[i]["content"], info, template)
            return out
    out.append({"role": "user", "content": frame_information("", info, template).lstrip()})
    return out


@dataclass
class SampleVariants:
    """The replay plan of one sample: unique prompt token ids and, per reward, which variant is P_minus_k.

    ``variants[0]`` is P_all. ``pair_variant[k]`` is the index of P_minus_k in ``variants`` for replayed
    rewards; rewards that are not replayed are absent. ``fallbacks`` maps reward -> reason. A variant is a
    1-D int32 array (:func:`as_ids`): the planner copies it into the packed input without a list conversion
    (a BFCL multi-turn batch holds tens of millions of prompt tokens), and its bytes key the deduplication.
    """

    variants: list[np.ndarray] = field(default_factory=list)
    pair_variant: dict[str, int] = field(default_factory=dict)
    fallbacks: dict[str, str] = field(default_factory=dict)
    deduplicated: int = 0  # P_minus_k variants identical to another variant (not replayed twice)
    repeated: dict[str, int] = field(default_factory=dict)  # reward -> occurrences of its Z when more than one (all removed)


@dataclass
class VariantMessages:
    """The messages of one sample's replay, before rendering: P_all, and per group of removed rewards its
    P_minus messages (None with the reason it cannot be built). ``fallbacks`` / ``repeated`` as in
    :class:`SampleVariants`."""

    p_all: Optional[list[dict]] = None
    minus: list[tuple[list[str], Optional[list[dict]], Optional[str]]] = field(default_factory=list)
    fallbacks: dict[str, str] = field(default_factory=dict)
    repeated: dict[str, int] = field(default_factory=dict)

    def all_messages(self) -> list[list[dict]]:
        """Every message list the replay renders for this sample (for :meth:`CachedRender.prepare`)."""
        return ([self.p_all] if self.p_all is not None else []) + [m for _, m, _ in self.minus if m is not None]


def variant_messages(
    messages: Optional[Sequence[dict]],
    contexts: dict[str, dict],
    replay_rewards: Sequence[str],
    joint: bool = False,
) -> VariantMessages:
    """The message lists of one sample's replay (arguments as :func:`build_sample_variants`)."""
    out = VariantMessages()
    wanted = [k for k in replay_rewards if k in contexts]
    for k in replay_rewards:
        if k not in contexts:
            out.fallbacks[k] = "empty_context"
    if not wanted:
        return out
    if not messages:
        out.fallbacks.update({k: "no_messages" for k in wanted})
        return out
    names = sorted(contexts)
    appended_all = [(n, contexts[n]["text"]) for n in names if contexts[n].get("placement") == "appended" and contexts[n].get("text")]
    out.p_all = append_to_last_user(messages, verifier_block(appended_all))

    def minus(removed: Sequence[str]) -> tuple[Optional[list[dict]], Optional[str]]:
        msgs = list(messages)
        for k in removed:
            ctx = contexts[k]
            text = ctx.get("text") or ""
            if not text:
                return None, "empty_context"
            if ctx.get("placement") == "prompt":
                n = count_occurrences(msgs, text)
                if n > 1:
                    out.repeated[k] = n
                msgs = remove_from_messages(msgs, text)
                if msgs is None:
                    return None, "not_found"
        keep = [(n, t) for n, t in appended_all if n not in set(removed)]
        return append_to_last_user(msgs, verifier_block(keep)), None

    groups = [(tuple(names), wanted)] if joint else [((k,), [k]) for k in wanted]
    for removed, rewards in groups:
        out.minus.append((rewards, *minus(removed)))
    return out


def as_ids(ids: Sequence[int]) -> np.ndarray:
    """Prompt token ids as a 1-D int32 array (every vocabulary fits; the packed input is int32): a render's
    array as it is (:class:`~recipe.mrtpo.core.render_cache.CachedRender` returns one, read-only), a list
    converted."""
    out = np.asarray(ids, dtype=np.int32)
    if out.ndim != 1:
        raise ValueError(f"prompt ids must be one sequence of ints, got shape {out.shape}")
    return out


def render_variants(
    vm: VariantMessages,
    render: Callable[[list[dict]], list[int]],
    max_prompt_length: Optional[int] = None,
) -> SampleVariants:
    """Render a sample's variant messages to token ids, deduplicated (arguments as :func:`build_sample_variants`)."""
    plan = SampleVariants(fallbacks=dict(vm.fallbacks), repeated=dict(vm.repeated))
    if vm.p_all is None:
        return plan
    wanted = [k for rewards, _, _ in vm.minus for k in rewards]

    def render_ok(msgs: list[dict]) -> Optional[np.ndarray]:
        ids = as_ids(render(msgs))
        if max_prompt_length is not None and len(ids) > max_prompt_length:
            return None
        return ids

    p_all = render_ok(vm.p_all)
    if p_all is None:  # nothing of the sample is replayed: its repeated contexts are not counted either
        plan.fallbacks.update({k: "too_long" for k in wanted})
        plan.repeated = {}
        return plan
    plan.variants.append(p_all)
    index = {p_all.tobytes(): 0}
    for rewards, msgs, reason in vm.minus:
        ids = render_ok(msgs) if msgs is not None else None
        if msgs is not None and ids is None:
            reason = "too_long"
        if ids is None:
            for k in rewards:
                plan.fallbacks[k] = reason or "not_found"
            continue
        key = ids.tobytes()
        if key in index:
            plan.deduplicated += 1
        else:
            index[key] = len(plan.variants)
            plan.variants.append(ids)
        for k in rewards:
            plan.pair_variant[k] = index[key]
    return plan


def build_sample_variants(
    messages: Optional[Sequence[dict]],
    contexts: dict[str, dict],
    replay_rewards: Sequence[str],
    render: Callable[[list[dict]], list[int]],
    max_prompt_length: Optional[int] = None,
    joint: bool = False,
) -> SampleVariants:
    """Plan the replay of one sample: :func:`variant_messages`, then :func:`render_variants`.

    Args:
        messages: the sample's chat messages (the dataset's ``prompt``), or None.
        contexts: reward -> {"text": Z_k, "placement": "prompt"|"appended"} from the reward manager.
        replay_rewards: rewards to replay (those whose group has variance); others are ignored.
        render: messages -> prompt token ids (the chat template with the generation prompt).
        max_prompt_length: a variant longer than this falls back (``too_long``).
        joint: CoRT-style: one variant with every Z removed, shared by all replayed rewards.
    """
    return render_variants(variant_messages(messages, contexts, replay_rewards, joint), render, max_prompt_length)


def rollout_prompt_variant(variants: Sequence[Sequence[int]], rollout_prompt: Sequence[int]) -> int:
    """Index of the variant whose token ids are exactly the rollout prompt, or -1 if none is.

    For prompt-placed Z it is 0 (P_all is the rollout prompt). For a sample whose Z are all appended except
    the one removed, it is that P_minus_k (its verifier block is empty: tool calling's P_minus_correctness).
    The replay's log-probs under that variant are verl's ``old_log_probs`` up to numerics (the consistency
    metric). Variants are distinct (deduplicated), so at most one matches.
    """
    n = len(rollout_prompt)
    same_length = [j for j, v in enumerate(variants) if len(v) == n]
    if not same_length:  # the common case: converted only when a variant could match
        return -1
    target = as_ids(rollout_prompt)
    for j in same_length:
        if np.array_equal(variants[j], target):
            return j
    return -1
