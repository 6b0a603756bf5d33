"""ToolRL's tool-calling reward form, registered as the task ``toolrl`` (its own data_source).

This is the reward GDPO's published tool-calling run trains with (ToolRL's 4k mix of ToolACE, Hammer
and xLAM, Qwen2.5-1.5B-Instruct, 100 steps): two rewards on ToolRL's output format

    <think> ... </think>
    <tool_call>
    {"name": "tool", "parameters": {"arg": "value"}}
    {"name": ..., "parameters": {...}}
    </tool_call>
    <response> ... </response>

- ``format`` in {0, 1}: the stripped response must match, in full, the layout the reference uses:
  ``<think>..</think>\\n<tool_call>\\n..\\n</tool_call>`` when the reference calls tools and gives no
  ``<response>``; ``<think>..</think>\\n<response>..</response>`` when it only answers; both blocks in
  that order when it does both; ``<think>..</think>`` alone when it does neither; each used tag
  exactly once.
- ``correctness`` in [-3, 3] when the reference calls tools, else 0 (ToolRL gives answer-only rows no
  correctness signal). The predicted calls are the JSON lines between the first ``<tool_call>`` and
  the following ``</tool_call>``, one object per line; no block, a line that is not JSON, a call
  without ``name``, or a matched call without a ``parameters`` object scores -3. Otherwise, with G
  the reference calls and P the predicted ones: identical lists score 3; else ::

      S = match(names(G), names(P)) + sum over g in G of best(g)
      best(g) = max over unused p in P with p.name == g.name of
                match(keys(g.parameters), keys(p.parameters)) + #{k in g.parameters: p.parameters[k] == g.parameters[k]}
      S_max = 1 + sum over g in G of (1 + |g.parameters|)
      correctness = 6 * S / S_max - 3

  where ``match(a, b)`` is 1 for equal lists, else the multiset intersection over the multiset union
  (0 if either is empty). Values compare with Python's ``==`` on the decoded JSON (``"5" != 5``).

Ground truth: the plain tool-calling shape ``{"calls": [{"name", "arguments"}], "tools": [...]}`` (JSON
strings or lists, read by :func:`recipe.mrtpo.tasks.tool_calling.normalise_calls`), plus ``answer``:
the set's reference output text. The reference calls are read from ``answer``'s ``<tool_call>``
block exactly as ToolRL reads them (so a ``null`` parameter stays); without ``answer`` they come from
``calls`` and the layout is ``<tool_call>`` alone (or ``<response>`` alone when there is no call).

Contexts (Z_k): ``format`` -> ``Context(extra_info["format_instruction"], "prompt")`` (the builder
stores the output-format block of ToolRL's system prompt there; default :data:`FORMAT_BLOCK`);
``correctness`` -> ``Context(<tool_call> block of the reference, "appended")`` (or the reference
answer when it has no call).

Choice: a separate data_source rather than an option read from ``extra_info``, so that the default
tool-calling task (``tool_calling`` / ``bfcl``: format 0/1, correctness in [0, 1], ``arguments``
key, Qwen2.5's ``<tool_call>`` convention) is untouched and a row states its reward form by itself.
Rows come from ``python -m data_prep.tool_calling toolrl --reward toolrl``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any, Optional

from recipe.mrtpo.tasks.base import Context, RewardResult, as_text, register_task
from recipe.mrtpo.tasks.tool_calling import MAX_BLOCK_CHARS, MAX_CALLS, normalise_calls

__all__ = ["FORMAT_MAX", "FORMAT_MIN", "CORRECT_MAX", "CORRECT_MIN", "FORMAT_BLOCK", "score",
           "format_reward", "correctness_reward", "reference_calls", "render_answer"]

FORMAT_MAX, FORMAT_MIN = 1.0, 0.0
CORRECT_MAX, CORRECT_MIN = 3.0, -3.0
MAX_RESPONSE_CHARS = 65_536

#: Default Z_format: the output-format block of ToolRL's system prompt.
FORMAT_BLOCK = (
    "**Output Format**\n```plaintext\n<think> Your thoughts and reasoning </think>\n<tool_call>\n"
    '{"name": "Tool name", "parameters": {"Parameter name": "Parameter content", "... ...": "... ..."}}\n'
    '{"name": "... ...", "parameters": {"... ...": "... ...", "... ...": "... ..."}}\n...\n</tool_call>\n'
    "<response> AI's final response </response>\n```"
)

_PATTERNS = {
    (True, False): re.compile(r"^<think>.*?</think>\n<tool_call>\n.*?\n</tool_call>$", re.DOTALL),
    (False, True): re.compile(r"^<think>.*?</think>\n<response>.*?</response>$", re.DOTALL),
    (True, True): re.compile(r"^<think>.*?</think>\n<tool_call>\n.*?\n</tool_call>\n<response>.*?</response>$",
                             re.DOTALL),
    (False, False): re.compile(r"^<think>.*?</think>$", re.DOTALL),
}


def _layout(answer: Optional[str], calls: list) -> tuple[bool, bool]:
    """(uses <tool_call>, uses <response>) of the reference."""
    if isinstance(answer, str) and answer.strip():
        return "<tool_call>" in answer, "<response>" in answer
    return bool(calls), not calls


def format_reward(response: str, has_call: bool, has_response: bool) -> float:
    """1.0 iff the stripped response has the reference's layout, each used tag once (module docstring)."""
    text = response.strip()
    if not _PATTERNS[(has_call, has_response)].search(text):
        return FORMAT_MIN
    tags = (["<tool_call>", "</tool_call>"] if has_call else []) + (["<response>", "</response>"] if has_response
                                                                   else [])
    return FORMAT_MAX if all(text.count(t) == 1 for t in tags) else FORMAT_MIN


def _block_calls(text: str) -> list:
    """The JSON lines of the first ``<tool_call>`` block (ValueError when absent or broken)."""
    if "<tool_call>" not in text or "</tool_call>" not in text:
        raise ValueError("no <tool_call> block")
    body = text.split("<tool_call>", 1)[1].split("</tool_call>", 1)[0].strip()
    if len(body) > MAX_BLOCK_CHARS * 4:
        raise ValueError("tool_call block too long")
    lines = body.split("\n")
    if len(lines) > MAX_CALLS:
        raise ValueError("too many calls")
    return [json.loads(line) for line in lines]


def reference_calls(ground_truth: Any) -> tuple[list, Optional[str]]:
    """(reference calls as ToolRL reads them: ``{"name", "parameters"}``, the answer text or None)."""
    gt = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    if not isinstance(gt, dict):
        raise ValueError(f"toolrl ground_truth must be a dict, got {type(gt).__name__}")
    answer = gt.get("answer")
    answer = answer if isinstance(answer, str) and answer.strip() else None
    if answer is not None:
        if "<tool_call>" not in answer:
            return [], answer
        calls = _block_calls(answer)
        for c in calls:
            if not isinstance(c, dict) or not isinstance(c.get("name"), str) or not isinstance(c.get("parameters"),
                                                                                              dict):
                raise ValueError(f"reference call without name/parameters: {c!r:.200}")
        return calls, answer
    if "calls" not in gt:
        raise ValueError("toolrl ground_truth needs 'answer' or 'calls'")
    return [{"name": c["name"], "parameters": c["arguments"]} for c in normalise_calls(gt["calls"])], None


def _match(a: list, b: list) -> float:
    if a == b:
        return 1.0
    if not a or not b:
        return 0.0
    ca, cb = Counter(a), Counter(b)
    inter = sum(min(ca[k], cb[k]) for k in ca.keys() & cb.keys())
    union = len(a) + len(b) - inter
    return inter / union if union > 0 else 0.0


def _keys(d: dict) -> list:
    return [json.dumps(k) if not isinstance(k, str) else k for k in d]


def correctness_reward(gt_calls: list, pred_calls: list) -> float:
    """ToolRL's correctness in [-3, 3] of parsed predicted calls against the reference (module docstring);
    KeyError/TypeError for a predicted call it cannot read (the caller scores that -3)."""
    if gt_calls == pred_calls:
        return CORRECT_MAX
    score = _match([g["name"] for g in gt_calls], [p["name"] for p in pred_calls])
    s_max = 1.0
    used: set = set()
    for g in gt_calls:
        gp = g["parameters"]
        s_max += 1.0 + len(gp)
        best, best_i = 0.0, -1
        for i, p in enumerate(pred_calls):
            if i in used or p["name"] != g["name"]:
                continue
            pp = p["parameters"]
            if not isinstance(pp, dict):
                raise TypeError("parameters must be an object")
            total = _match(_keys(gp), _keys(pp)) + sum(1.0 for k, v in gp.items() if k in pp and pp[k] == v)
            if total > best:
                best, best_i = total, i
        if best_i >= 0:
            used.add(best_i)
            score += best
    return (CORRECT_MAX - CORRECT_MIN) * score / s_max + CORRECT_MIN


def render_answer(calls: list, response: Optional[str] = None, think: str = "I should use the appropriate tool "
                  "with proper parameters to respond to the user's need.") -> str:
    """A reference answer in ToolRL's format (``calls`` as ``{"name", "parameters"}``)."""
    parts = [f"<think> {think} </think>"]
    if calls:
        parts.append("<tool_call>\n" + "\n".join(json.dumps(c, ensure_ascii=False) for c in calls) + "\n</tool_call>")
    if response is not None or not calls:
        parts.append(f"<response> {response or ''} </response>")
    return "\n".join(parts)


def score(response: str, ground_truth: dict, extra_info: dict | None = None) -> RewardResult:
    """Rewards ``format`` (0/1) and ``correctness`` ([-3, 3]) of one response (module docstring)."""
    gt_calls, answer = reference_calls(ground_truth)
    has_call, has_resp = _layout(answer, gt_calls)
    instr = extra_info.get("format_instruction") if isinstance(extra_info, dict) else None
    if gt_calls:
        ref_text = "<tool_call>\n" + "\n".join(json.dumps(c, ensure_ascii=False) for c in gt_calls) + "\n</tool_call>"
    else:
        ref_text = answer or "<response>"
    contexts = {"format": Context(instr if isinstance(instr, str) and instr else FORMAT_BLOCK, "prompt"),
                "correctness": Context(ref_text, "appended")}
    info: dict[str, Any] = {"n_ref_calls": len(gt_calls)}
    text = ""
    try:
        text = as_text(response)
    except Exception as e:  # noqa: BLE001 - untrusted output
        info["error"] = f"{type(e).__name__}: {str(e)[:200]}"
    if len(text) > MAX_RESPONSE_CHARS:
        info["error"] = f"ResponseTooLong: {len(text)} characters"
        return RewardResult(scores={"format": FORMAT_MIN, "correctness": CORRECT_MIN if has_call else 0.0},
                            contexts=contexts, info=info)
    fmt = format_reward(text, has_call, has_resp)
    if not has_call:
        corr = 0.0
    else:
        try:
            corr = correctness_reward(gt_calls, _block_calls(text.strip()))
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
            corr = CORRECT_MIN
            info["correctness_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    return RewardResult(scores={"format": fmt, "correctness": corr}, contexts=contexts, info=info)


register_task("toolrl", score)
