"""Prompt variants for the replay: P_all and P_minus_k from a sample's messages and contexts Z_k
(docs/design.md §2). Pure Python; tokenisation is a callable passed in.

- ``placement="prompt"``: Z_k is a verbatim substring of the chat messages. P_minus_k removes it
  (its first occurrence, searching the messages from the last user turn backwards, then the rest).
- ``placement="appended"``: P_all gets one verifier-information block at the end of the last user
  turn, holding every appended Z_j of the sample, each labelled by its reward name::

      <verifier_information>
      [execution_match]
      SELECT ...
      </verifier_information>

  P_minus_k is the same block without Z_k (no block at all when nothing is left).

A variant that cannot be built gets no replay and its pair falls back to uniform weights, counted by
reason: ``not_found`` (Z_k not in the prompt), ``empty_context``, ``too_long`` (over the replay prompt
length limit), ``no_messages`` (no raw chat to edit). Variants are deduplicated by token ids: identical
prompts (e.g. two rewards with the same context) are replayed once.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Optional

BLOCK_OPEN = "<verifier_information>"
BLOCK_CLOSE = "</verifier_information>"

FALLBACK_REASONS = ("not_found", "empty_context", "too_long", "no_messages")


def _content_str(msg: dict) -> Optional[str]:
    c = msg.get("content")
    return c if isinstance(c, str) else None


def remove_from_messages(messages: Sequence[dict], text: str) -> Optional[list[dict]]:
    """A copy of ``messages`` with the first occurrence of ``text`` removed, or None if absent.

    Search order: the last user message first (where constraints and formats usually sit), then every
    message from the first. The removal also drops one adjacent separator (space or newline) so that
    no stray double blank is left behind. Only string contents are edited.
    """
    if not text:
        return None
    order = [i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "user"][:1]
    order += [i for i in range(len(messages)) if i not in order]
    for i in order:
        content = _content_str(messages[i])
        if content is None:
            continue
        pos = content.find(text)
        if pos < 0:
            continue
        before, after = content[:pos], content[pos + len(text) :]
        if after[:1] in (" ", "\n"):
            after = after[1:]
        elif before[-1:] in (" ", "\n"):
            before = before[:-1]
        out = copy.deepcopy(list(messages))
        out[i]["content"] = before + after
        return out
    return None


def verifier_block(appended: Sequence[tuple[str, str]]) -> str:
    """The verifier-information block for (reward name, Z) pairs, in the given order ('' if none)."""
    if not appended:
        return ""
    body = "\n".join(f"[{name}]\n{text}" for name, text in appended)
    return f"{BLOCK_OPEN}\n{body}\n{BLOCK_CLOSE}"


def append_to_last_user(messages: Sequence[dict], block: str) -> list[dict]:
    """A copy of ``messages`` with ``block`` appended to the last user turn (a new user turn if none)."""
    out = copy.deepcopy(list(messages))
    if not block:
        return out
    for i in range(len(out) - 1, -1, -1):
        if out[i].get("role") == "user" and isinstance(out[i].get("content"), str):
            out[i]["content"] = out[i]["content"].rstrip() + "\n\n" + block
            return out
    out.append({"role": "user", "content": block})
    return out


@dataclass
class SampleVariants:
    """The replay plan of one sample: unique prompt token ids and, per reward, which variant is P_minus_k.

    ``variants[0]`` is P_all. ``pair_variant[k]`` is the index of P_minus_k in ``variants`` for replayed
    rewards; rewards that are not replayed are absent. ``fallbacks`` maps reward -> reason.
    """

    variants: list[list[int]] = field(default_factory=list)
    pair_variant: dict[str, int] = field(default_factory=dict)
    fallbacks: dict[str, str] = field(default_factory=dict)
    deduplicated: int = 0  # P_minus_k variants identical to another variant (not replayed twice)


def build_sample_variants(
    messages: Optional[Sequence[dict]],
    contexts: dict[str, dict],
    replay_rewards: Sequence[str],
    render: Callable[[list[dict]], list[int]],
    max_prompt_length: Optional[int] = None,
    joint: bool = False,
) -> SampleVariants:
    """Plan the replay of one sample.

    Args:
        messages: the sample's chat messages (the dataset's ``prompt``), or None.
        contexts: reward -> {"text": Z_k, "placement": "prompt"|"appended"} from the reward manager.
        replay_rewards: rewards to replay (those whose group has variance); others are ignored.
        render: messages -> prompt token ids (the chat template with the generation prompt).
        max_prompt_length: a variant longer than this falls back (``too_long``).
        joint: CoRT-style: one variant with every Z removed, shared by all replayed rewards.
    """
    plan = SampleVariants()
    wanted = [k for k in replay_rewards if k in contexts]
    for k in replay_rewards:
        if k not in contexts:
            plan.fallbacks[k] = "empty_context"
    if not wanted:
        return plan
    if not messages:
        plan.fallbacks.update({k: "no_messages" for k in wanted})
        return plan
    names = sorted(contexts)
    appended_all = [(n, contexts[n]["text"]) for n in names if contexts[n].get("placement") == "appended" and contexts[n].get("text")]

    def render_ok(msgs: list[dict]) -> Optional[list[int]]:
        ids = list(render(msgs))
        if max_prompt_length is not None and len(ids) > max_prompt_length:
            return None
        return ids

    p_all = render_ok(append_to_last_user(messages, verifier_block(appended_all)))
    if p_all is None:
        plan.fallbacks.update({k: "too_long" for k in wanted})
        return plan
    plan.variants.append(p_all)
    index = {tuple(p_all): 0}

    def minus(removed: Sequence[str]) -> tuple[Optional[list[dict]], Optional[str]]:
        msgs = list(messages)
        for k in removed:
            ctx = contexts[k]
            text = ctx.get("text") or ""
            if not text:
                return None, "empty_context"
            if ctx.get("placement") == "prompt":
                msgs = remove_from_messages(msgs, text)
                if msgs is None:
                    return None, "not_found"
        keep = [(n, t) for n, t in appended_all if n not in set(removed)]
        return append_to_last_user(msgs, verifier_block(keep)), None

    groups = [(tuple(names), wanted)] if joint else [((k,), [k]) for k in wanted]
    for removed, rewards in groups:
        msgs, reason = minus(removed)
        ids = render_ok(msgs) if msgs is not None else None
        if msgs is not None and ids is None:
            reason = "too_long"
        if ids is None:
            for k in rewards:
                plan.fallbacks[k] = reason or "not_found"
            continue
        key = tuple(ids)
        if key in index:
            plan.deduplicated += 1
        else:
            index[key] = len(plan.variants)
            plan.variants.append(ids)
        for k in rewards:
            plan.pair_variant[k] = index[key]
    return plan
