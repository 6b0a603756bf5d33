"""The warm start of the format-speed experiment: supervised fine-tuning of the tiny Qwen2 in plain
PyTorch (the three phases of :class:`experiments.mini_credit.warm_start.SFTConfig`, its training loop
reused), so that the RL runs start from a policy whose tool-call frame is often broken and whose
argument is right about half the time.

:func:`encode_examples` renders the rows (the demonstration or the gold call), :func:`evaluate_tool_calls`
samples the model on held-out prompts and scores the samples with the real tool-calling verifier, and
:func:`sft_warm_start` runs the phases and caches the model by a key of every input.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

from data_prep.common import read_parquet_rows, sha256_file
from experiments.format_speed.common import LOG_PREFIX, ExperimentError
from experiments.mini_credit.warm_start import SFTConfig, _chat_ids, response_vocabulary, sft_train
from recipe.mrtpo.tasks import to_plain

_SFT_FORMAT = "1"  # bump when the recipe changes in a way its key would not see
_SFT_KEY_FILE = ".format-speed-sft-key"


def encode_examples(tokenizer, rows: Sequence[dict], target: str = "demo") -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids + EOS) per row; the response is ``extra_info["demo"]`` (``target="demo"``)
    or the verifier's rendering of the reference call (``target="gold"``)."""
    from recipe.mrtpo.tasks.tool_calling import parse_ground_truth, render_tool_calls

    if target not in ("demo", "gold"):
        raise ValueError(f"target must be 'demo' or 'gold', got {target!r}")
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ExperimentError("the tokenizer has no eos_token_id")
    out = []
    for r in rows:
        if target == "demo":
            text = (r.get("extra_info") or {}).get("demo")
            if not isinstance(text, str) or not text:
                raise ExperimentError(f"SFT row without extra_info['demo']: {r!r:.200}")
        else:
            calls, _ = parse_ground_truth(r["reward_model"]["ground_truth"])
            text = render_tool_calls(calls)
        out.append((_chat_ids(tokenizer, list(r["prompt"])), list(tokenizer.encode(text)) + [eos]))
    return out


def evaluate_tool_calls(model, tokenizer, rows: Sequence[dict], samples: int = 4, max_new_tokens: int = 24,
                        seed: int = 0) -> dict:
    """Format rate, mean correctness and exact-argument rate of ``model`` sampled at temperature 1 on
    ``rows``, scored by :func:`recipe.mrtpo.tasks.tool_calling.score`."""
    import torch

    from recipe.mrtpo.cpu.tiny_model import EOS_TOKEN_IDS
    from recipe.mrtpo.tasks.tool_calling import score

    fmt, corr, examples = [], [], []
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
        for r in rows:
            prompt = torch.tensor([_chat_ids(tokenizer, list(r["prompt"]))])
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=True, temperature=1.0,
                                 top_k=0, top_p=1.0, max_new_tokens=max_new_tokens, num_return_sequences=samples,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=EOS_TOKEN_IDS)
            for o in out:
                text = tokenizer.decode(o[prompt.shape[1]:], skip_special_tokens=True)
                res = score(text, r["reward_model"]["ground_truth"], r.get("extra_info"))
                fmt.append(res.scores["format"])
                corr.append(res.scores["correctness"])
                if len(examples) < 6:
                    examples.append((r["prompt"][0]["content"], text))
    n = len(fmt)
    return {"format": sum(fmt) / n if n else float("nan"), "correctness": sum(corr) / n if n else float("nan"),
            "exact": sum(c >= 1.0 for c in corr) / n if n else float("nan"), "n": n, "examples": examples}


def _rows(path: Path) -> list[dict]:
    return [to_plain(r) for r in read_parquet_rows(path)]


def sft_warm_start(base_model: Path, sft_parquet: Path, test_parquet: Path, out_dir: Path, cfg: SFTConfig,
                   seed: int = 0, eval_samples: int = 4, log: Callable[[str], None] = print) -> dict:
    """Fine-tune ``base_model`` (gold calls, then the demonstrations, then the demonstrations with the
    full softmax), save it (bf16, with the tokenizer) to ``out_dir``; return its record. Cached by key."""
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    out_dir = Path(out_dir)
    key_file = Path(base_model) / ".mrtpo-tiny-key"
    base_key = key_file.read_text().strip() if key_file.is_file() else sha256_file(Path(base_model) / "model.safetensors")
    key = hashlib.sha256(json.dumps({
        "format": _SFT_FORMAT, "base": base_key, "sft": sha256_file(sft_parquet), "test": sha256_file(test_parquet),
        "cfg": asdict(cfg), "seed": seed, "eval_samples": eval_samples,
    }, sort_keys=True).encode()).hexdigest()[:16]
    meta_path = out_dir / "sft_meta.json"
    try:
        if (out_dir / _SFT_KEY_FILE).read_text().strip() == key and meta_path.is_file():
            log(f"{LOG_PREFIX} SFT model cached: {out_dir}")
            return json.loads(meta_path.read_text())
    except OSError:
        pass

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(base_model)
    model = Qwen2ForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    rows = _rows(sft_parquet)
    gold = encode_examples(tokenizer, rows, "gold")
    demos = encode_examples(tokenizer, rows, "demo")
    vocab = response_vocabulary(gold + demos)
    test_rows = _rows(test_parquet)
    pad = int(tokenizer.pad_token_id or 0)
    t0 = time.monotonic()

    def progress(phase):
        return lambda s, v: log(f"{LOG_PREFIX}   sft {phase} step {s:>4}  loss {v:.3f}  ({time.monotonic() - t0:.0f} s)")

    log(f"{LOG_PREFIX} SFT: {len(rows)} prompts; {cfg.gold_steps} steps on gold calls, {cfg.demo_steps} + "
        f"{cfg.full_steps} on the demonstrations (batch {cfg.batch_size})")
    losses = {
        "gold": sft_train(model, gold, cfg.gold_steps, cfg.batch_size, cfg.lr, seed, pad, vocab, on_log=progress("gold")),
        "demo": sft_train(model, demos, cfg.demo_steps, cfg.batch_size, cfg.demo_lr, seed + 1, pad, vocab,
                          on_log=progress("demo")),
        "full": sft_train(model, demos, cfg.full_steps, cfg.batch_size, cfg.full_lr, seed + 2, pad, None,
                          train_embeddings=True, log_every=25, on_log=progress("full-vocab")),
    }
    train_s = time.monotonic() - t0
    after = evaluate_tool_calls(model, tokenizer, test_rows, samples=eval_samples, seed=seed)
    log(f"{LOG_PREFIX} SFT done in {train_s:.0f} s; held-out (sampled, T=1): format {after['format']:.2f}, "
        f"correctness {after['correctness']:.2f}, argument right {after['exact']:.2f}")
    for prompt, response in after["examples"][:3]:
        log(f"{LOG_PREFIX}   {prompt[-40:]!r} -> {response!r}")

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / _SFT_KEY_FILE).unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=f".{out_dir.name}.build-") as tmp:
        tmp = Path(tmp)
        model.to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)
        for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            if (Path(base_model) / f).is_file():
                shutil.copy(Path(base_model) / f, tmp / f)
        for f in tmp.iterdir():
            shutil.move(str(f), str(out_dir / f.name))

    def ends(v):
        k = max(1, len(v) // 10)
        return (sum(v[:k]) / k, sum(v[-k:]) / k) if v else (None, None)

    meta = {"config": asdict(cfg), "seed": seed, "train_s": train_s,
            "loss": {phase: {"first": ends(v)[0], "last": ends(v)[1]} for phase, v in losses.items()},
            "after": {k: after[k] for k in ("format", "correctness", "exact", "n")}, "examples": after["examples"]}
    meta_path.write_text(json.dumps(meta, indent=1))
    (out_dir / _SFT_KEY_FILE).write_text(key + "\n")
    return meta
