"""Response tokens sampled from the benchmark's own model (``benchmarks/gpu_replay.py --sample-responses``).

Random ids are tokens no model would write: a random-weight model's distribution over them is flat, while the
text a rollout hands the replay is the model's own, where its distribution is peaked. So that a device run
measures q, the fused check's difference and its floor on text the model would write, :func:`sample_responses`
draws each row's response from the model itself, after the row's rollout prompt: a KV-cached decoding loop over
a left-padded batch, ``temperature`` 0 the argmax (greedy), else the softmax of ``logits / temperature`` drawn
with ``torch.multinomial`` on CPU from one seeded generator (the same tokens on any device, given the same
logits). Every row runs to the batch's length (no stop at an end-of-sequence token: the mix fixes the lengths,
its mask cuts each row). Torch and transformers only, like ``gpu_replay.py``.
"""

from __future__ import annotations

import torch


def sample_next(logits: torch.Tensor, temperature: float, g: torch.Generator) -> torch.Tensor:
    """[R] next tokens from the last-position logits [R, V]: the argmax at ``temperature`` 0, else a draw from
    ``softmax(logits / temperature)`` (fp32, on CPU, from ``g``)."""
    z = logits.float().cpu()
    if temperature == 0:
        return z.argmax(-1)
    return torch.multinomial(torch.softmax(z / float(temperature), -1), 1, generator=g).squeeze(-1)


def sample_responses(model, prompts: torch.Tensor, prompt_lens: torch.Tensor, length: int, *, temperature: float = 1.0,
                     seed: int = 0, device: str = "cpu") -> tuple[torch.Tensor, float]:
    """``(responses [R, length], mean log p)``: ``length`` tokens per row sampled from ``model`` after the row's
    prompt (``prompts`` [R, P] LEFT-padded, ``prompt_lens`` [R] their lengths), and the mean log-probability
    (temperature 1) of the tokens drawn, to print beside ``-log V`` (what random ids average on a flat model)."""
    if temperature < 0 or length < 1:
        raise ValueError(f"need temperature >= 0 and length >= 1, got {temperature} and {length}")
    R, P = prompts.shape
    attn = (torch.arange(P)[None, :] >= P - prompt_lens[:, None]).long()
    if bool((prompt_lens < 1).any()):
        raise ValueError("every row needs a prompt of at least one token to sample after")
    g = torch.Generator().manual_seed(int(seed))
    ids, attn = prompts.to(device), attn.to(device)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    out = torch.zeros(R, length, dtype=torch.long)
    logp = 0.0
    with torch.no_grad():
        res = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1)
        for t in range(length):
            last = res.logits[:, -1]
            nxt = sample_next(last, temperature, g)
            out[:, t] = nxt
            logp += torch.log_softmax(last.float().cpu(), -1).gather(-1, nxt[:, None]).sum().item()
            if t == length - 1:
                break
            attn = torch.cat([attn, torch.ones(R, 1, dtype=attn.dtype, device=device)], -1)
            pos = pos[:, -1:] + 1
            res = model(input_ids=nxt[:, None].to(device), attention_mask=attn, position_ids=pos,
                        past_key_values=res.past_key_values, use_cache=True)
    return out, logp / (R * length)
