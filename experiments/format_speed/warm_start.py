"""The warm start of the format-speed experiment: supervised fine-tuning of the tiny Qwen2 in plain
PyTorch (the three phases of :class:`experiments.mini_credit.warm_start.SFTConfig`, its training loop
reused), so that the RL runs start from a policy whose tool-call frame is often broken and whose
argument is right about half the time.

:func:`encode_examples` renders the rows (the demonstration or the gold call), :func:`evaluate_tool_calls`
samples the model on held-out prompts and scores the samples with the real tool-calling verifier, and
:func:`sft_warm_start` runs the phases and caches the model by a key of every input.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional

from experiments.format_speed.common import LOG_PREFIX, ExperimentError
from experiments.mini_credit.warm_start import SFTConfig, _chat_ids, cached_sft

_SFT_FORMAT = "1"  # bump when the recipe changes in a way its key would not see
_SFT_KEY_FILE = ".format-speed-sft-key"


def _target_text(r: dict, target: str) -> str:
    from recipe.mrtpo.tasks import to_plain
    from recipe.mrtpo.tasks.tool_calling import parse_ground_truth, render_tool_calls

    if target == "demo":
        text = (r.get("extra_info") or {}).get("demo")
        if not isinstance(text, str) or not text:
            raise ExperimentError(f"SFT row without extra_info['demo']: {r!r:.200}")
        return text
    if r.get("data_source") == "toolrl":
        return to_plain(r["reward_model"]["ground_truth"])["answer"]
    calls, _ = parse_ground_truth(r["reward_model"]["ground_truth"])
    return render_tool_calls(calls)


def encode_examples(tokenizer, rows: Sequence[dict], target: str = "demo") -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids + EOS) per row; the response is ``extra_info["demo"]`` (``target="demo"``)
    or the gold answer (``target="gold"``): the verifier's rendering of the reference call, or under
    ToolRL's rewards the reference answer in the layout the instruction names."""
    if target not in ("demo", "gold"):
        raise ValueError(f"target must be 'demo' or 'gold', got {target!r}")
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ExperimentError("the tokenizer has no eos_token_id")
    return [(_chat_ids(tokenizer, list(r["prompt"])), list(tokenizer.encode(_target_text(r, target))) + [eos])
            for r in rows]


def corpus_texts(data_dir: Path) -> list[str]:
    """The texts a task vocabulary is trained on: the chat roles, every prompt message of the SFT, RL and
    held-out rows, and the SFT rows' demonstrations and gold answers (what the model reads and writes)."""
    from experiments.mini_credit.warm_start import _read_rows

    texts = ["system", "user", "assistant"]
    for split in ("sft", "train", "test"):
        for r in _read_rows(Path(data_dir) / f"{split}.parquet"):
            texts += [m["content"] for m in r["prompt"]]
            if split == "sft":
                texts += [_target_text(r, "demo"), _target_text(r, "gold")]
    return texts


def task_tokenizer(vocab_size: int) -> Callable[[Path], Path]:
    """``data_dir -> tokenizer folder``: a task vocabulary of at most ``vocab_size`` tokens over
    :func:`corpus_texts` (:func:`recipe.mrtpo.cpu.tiny_model.build_task_tokenizer`), written next to the data."""
    from recipe.mrtpo.cpu.tiny_model import build_task_tokenizer

    return lambda data_dir: build_task_tokenizer(Path(data_dir).parent / "tokenizer", corpus_texts(data_dir), vocab_size)


#: the correctness of a right call, per data_source (what ``exact`` counts)
CORRECT_MAX = {"tool_calling": 1.0, "toolrl": 3.0}
#: the response length each task's rollout allows (the toolrl answer with its response block is 35 tokens)
MAX_NEW_TOKENS = {"tool_calling": 24, "toolrl": 40}


def evaluate_tool_calls(model, tokenizer, rows: Sequence[dict], samples: int = 4, max_new_tokens: Optional[int] = None,
                        seed: int = 0) -> dict:
    """Format rate, mean correctness and exact-argument rate of ``model`` sampled at temperature 1 on
    ``rows``, scored by the rows' verifier (``data_source``: ``tool_calling`` or ``toolrl``);
    ``max_new_tokens`` defaults to the task's :data:`MAX_NEW_TOKENS`."""
    import torch

    from recipe.mrtpo.cpu.tiny_model import eos_token_ids
    from recipe.mrtpo.tasks import get_task, to_plain

    eos_ids = eos_token_ids(tokenizer)
    sources = {r.get("data_source", "tool_calling") for r in rows}
    if len(sources) != 1 or not sources <= set(CORRECT_MAX):
        raise ExperimentError(f"evaluation rows must all be tool_calling or all toolrl, got {sorted(sources)}")
    source = sources.pop()
    score, top = get_task(source), CORRECT_MAX[source]
    max_new_tokens = MAX_NEW_TOKENS[source] if max_new_tokens is None else max_new_tokens
    fmt, corr, examples = [], [], []
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
        for r in rows:
            prompt = torch.tensor([_chat_ids(tokenizer, list(r["prompt"]))])
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=True, temperature=1.0,
                                 top_k=0, top_p=1.0, max_new_tokens=max_new_tokens, num_return_sequences=samples,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=eos_ids)
            for o in out:
                text = tokenizer.decode(o[prompt.shape[1]:], skip_special_tokens=True)
                res = score(text, to_plain(r["reward_model"]["ground_truth"]), to_plain(r.get("extra_info")))
                fmt.append(res.scores["format"])
                corr.append(res.scores["correctness"])
                if len(examples) < 6:
                    examples.append((r["prompt"][0]["content"], text))
    n = len(fmt)
    return {"format": sum(fmt) / n if n else float("nan"), "correctness": sum(corr) / n if n else float("nan"),
            "exact": sum(c >= top for c in corr) / n if n else float("nan"), "n": n, "examples": examples}


def sft_warm_start(base_model: Path, sft_parquet: Path, test_parquet: Path, out_dir: Path, cfg: SFTConfig,
                   seed: int = 0, eval_samples: int = 4, log: Callable[[str], None] = print) -> dict:
    """Fine-tune ``base_model`` (gold calls, then the demonstrations, then the demonstrations with the
    full softmax), save it (bf16, with the tokenizer) to ``out_dir``; return its record
    (:func:`experiments.mini_credit.warm_start.cached_sft`; cached by key)."""

    def describe(after: dict) -> tuple[str, dict]:
        line = (f"held-out (sampled, T=1): format {after['format']:.2f}, correctness {after['correctness']:.2f}, "
                f"argument right {after['exact']:.2f}")
        return line, {"after": {k: after[k] for k in ("format", "correctness", "exact", "n")}}

    return cached_sft(base_model, sft_parquet, test_parquet, out_dir, cfg, seed, eval_samples,
                      cache=(_SFT_FORMAT, _SFT_KEY_FILE), prefix=LOG_PREFIX, encode=encode_examples,
                      evaluate=evaluate_tool_calls, describe=describe, log=log)
