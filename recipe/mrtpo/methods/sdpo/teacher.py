"""The worker's side of SDPO's teacher pass, pure torch: the student's top-k ids, then the EMA teacher at them.

Per response token t of each row (SDPO's ``dp_actor``: the teacher is evaluated at the student's top-k):

    K_S[t]   = top-k_v log pi_old(v | rollout prompt, y_<t)            (the behaviour policy: the actor's weights)
    lp_T[t]  = log p_T(v | P_all, y_<t) for v in K_S[t]                (the EMA teacher's weights, swapped in)

Both passes are OPSD's (``methods.opsd.teacher.teacher_topk_rows``: the pass engine's packer, layouts and
forward-count agreement), the second with ``ids=``; the teacher's weights are in the module only inside
``swap`` (``ema.EMATeacher.swapped``), once for all of the rank's rows.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Optional

import torch

from recipe.mrtpo.core.passes import ForwardFn, PassCounts, PassSettings
from recipe.mrtpo.methods.opsd.teacher import teacher_topk_rows

COUNTS = tuple(PassCounts().as_tensors())  # every count the pass engine answers


def sdpo_teacher_rows(
    forward: ForwardFn,
    inputs: dict[str, torch.Tensor],
    k: int,
    settings: PassSettings,
    swap: Callable[[], AbstractContextManager],
    device: torch.device | str = "cpu",
    sync_forward_count: Optional[Callable[[int], int]] = None,
) -> dict[str, torch.Tensor]:
    """This rank's rows: ``inputs`` holds ``prompt_ids`` / ``prompt_lens`` (the teacher prompts, P_all),
    ``student_prompt_ids`` / ``student_prompt_lens`` (the rollout prompts), ``responses``, ``response_mask``.

    Returns ``topk_ids`` [R, T, k] (the student's), ``topk_logprobs`` [R, T, k] (the teacher's at them),
    ``token_logprobs`` [R, T] (the teacher's of the sampled tokens), ``student_topk_logprobs`` [R, T, k] and
    the pass counts of both passes summed.
    """
    common = dict(settings=settings, device=device, sync_forward_count=sync_forward_count)
    student = teacher_topk_rows(forward, inputs["student_prompt_ids"], inputs["student_prompt_lens"], inputs["responses"],
                                inputs["response_mask"], k=int(k), **common)
    with swap():
        teacher = teacher_topk_rows(forward, inputs["prompt_ids"], inputs["prompt_lens"], inputs["responses"],
                                    inputs["response_mask"], k=int(k), ids=student["topk_ids"], **common)
    out = {
        "topk_ids": student["topk_ids"],
        "topk_logprobs": teacher["topk_logprobs"],
        "token_logprobs": teacher["token_logprobs"],
        "student_topk_logprobs": student["topk_logprobs"],
    }
    for c in COUNTS:
        out[c] = student[c] + teacher[c]
    return out
