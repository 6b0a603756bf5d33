"""The warm start of the miniature experiment: supervised fine-tuning of the tiny Qwen2 in plain PyTorch,
so that the RL runs start from a policy that is right about half the time on each slot reward.

:class:`SFTConfig` names the three phases; :func:`sft_warm_start` runs them, evaluates the model on
held-out prompts (:func:`evaluate_slots`) and caches it by a key of every input, so that all methods
of a seed start from the same weights. :func:`encode_sft_examples`, :func:`response_vocabulary`,
:func:`sft_loss` and :func:`sft_train` are its parts.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from data_prep.common import read_parquet_rows, sha256_file
from experiments.mini_credit.common import ExperimentError
from recipe.mrtpo.tasks import to_plain

_SFT_FORMAT = "2"  # bump when the SFT recipe changes in a way its key would not see
_SFT_KEY_FILE = ".mini-sft-key"


def _chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    out = tokenizer.apply_chat_template([dict(m) for m in messages], add_generation_prompt=True, tokenize=True)
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    return list(out)


def encode_sft_examples(tokenizer, rows: Sequence[dict], target: str = "demo") -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) per row: the prompt rendered as verl renders it for the rollout (the chat
    template with the generation prompt); the response + the EOS token, where the response is the row's
    imperfect demonstration (``target="demo"``: ``extra_info["demo"]``) or its correct answer
    (``target="gold"``: built from the ground truth)."""
    from recipe.mrtpo.tasks.synthetic_slots import answer_text, parse_ground_truth

    eos = tokenizer.eos_token_id
    if eos is None:
        raise ExperimentError("the tokenizer has no eos_token_id")
    if target not in ("demo", "gold"):
        raise ValueError(f"target must be 'demo' or 'gold', got {target!r}")
    out = []
    for r in rows:
        if target == "demo":
            text = (r.get("extra_info") or {}).get("demo")
            if not isinstance(text, str) or not text:
                raise ExperimentError(f"SFT row without extra_info['demo']: {r!r:.200}")
        else:
            fields, order = parse_ground_truth(to_plain(r["reward_model"]["ground_truth"]))
            text = answer_text(dict(fields), order)
        out.append((_chat_ids(tokenizer, list(r["prompt"])), list(tokenizer.encode(text)) + [eos]))
    return out


def response_vocabulary(examples) -> list[int]:
    """Every token id that occurs in the responses of ``examples`` (sorted)."""
    return sorted({t for _, r in examples for t in r})


def _sft_batch(examples, pad_id: int):
    import torch

    T = max(len(p) + len(r) for p, r in examples)
    B = len(examples)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros(B, T, dtype=torch.long)
    labels = torch.full((B, T), -100, dtype=torch.long)
    for i, (p, r) in enumerate(examples):
        x = list(p) + list(r)
        ids[i, : len(x)] = torch.tensor(x)
        attn[i, : len(x)] = 1
        labels[i, len(p) : len(x)] = torch.tensor(list(r))
    return ids, attn, labels


def sft_loss(model, examples, pad_id: int, vocab: Optional[Sequence[int]] = None):
    """Mean next-token cross-entropy on the response tokens of ``examples`` (right-padded batch).

    Only the response positions go through the LM head: with a 151,936-token vocabulary the head is
    nearly all of the compute, and the prompt positions carry no loss. ``vocab`` restricts the softmax
    to those token ids (a cheap stand-in while the model learns the task's mechanics; the targets must
    be in it)."""
    import torch

    ids, attn, labels = _sft_batch(examples, pad_id)
    hidden = model.model(input_ids=ids, attention_mask=attn).last_hidden_state
    target = labels[:, 1:]
    sel = target != -100
    h = hidden[:, :-1][sel]
    tgt = target[sel]
    if vocab is None:
        logits = model.lm_head(h).float()
    else:
        vocab_t = torch.as_tensor(list(vocab), dtype=torch.long)
        remap = torch.full((int(vocab_t.max()) + 1,), -1, dtype=torch.long)
        remap[vocab_t] = torch.arange(len(vocab_t))
        if int(tgt.max()) >= len(remap) or bool((remap[tgt] < 0).any()):
            raise ExperimentError("a target token is outside the restricted SFT vocabulary")
        logits = (h @ model.lm_head.weight[vocab_t].T).float()
        tgt = remap[tgt]
    return torch.nn.functional.cross_entropy(logits, tgt)


def sft_train(model, examples, steps: int, batch_size: int = 32, lr: float = 3e-3, seed: int = 0, pad_id: int = 0,
              vocab: Optional[Sequence[int]] = None, train_embeddings: bool = False, log_every: int = 100,
              on_log: Optional[Callable[[int, float], None]] = None) -> list[float]:
    """AdamW on :func:`sft_loss`, batches drawn without replacement epoch by epoch (``random.Random(seed)``),
    gradient norm clipped to 1, linear decay to 10% of ``lr``; returns the loss of every step.

    ``train_embeddings=False`` freezes the (tied) embedding matrix: the transformer body learns the task
    on the random token embeddings, and each step skips an optimizer update of 151,936 x hidden weights."""
    import torch

    if not examples:
        raise ExperimentError("no SFT examples")
    emb = model.get_input_embeddings().weight
    emb.requires_grad_(train_embeddings)
    params = [p for p in model.parameters() if p.requires_grad]
    rng = random.Random(f"sft:{seed}")
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - 0.9 * min(s, steps) / max(1, steps))
    model.train()
    order: list[int] = []
    losses = []
    try:
        for step in range(steps):
            if len(order) < batch_size:
                fresh = list(range(len(examples)))
                rng.shuffle(fresh)
                order += fresh
            batch = [examples[i] for i in order[:batch_size]]
            del order[:batch_size]
            loss = sft_loss(model, batch, pad_id, vocab)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            losses.append(loss.item())
            if on_log is not None and (step % log_every == 0 or step == steps - 1):
                on_log(step, losses[-1])
    finally:
        emb.requires_grad_(True)
        model.eval()
    return losses


def evaluate_slots(model, tokenizer, rows: Sequence[dict], samples: int = 4, max_new_tokens: int = 24,
                   seed: int = 0) -> dict:
    """Per-slot accuracy of ``model`` sampled at temperature 1 (as the rollout samples) on ``rows``:
    ``{"per_reward": {slot_X: mean}, "mean": ..., "n": responses, "examples": [(prompt, response)...]}``."""
    import torch

    from recipe.mrtpo.cpu.tiny_model import eos_token_ids
    from recipe.mrtpo.tasks.synthetic_slots import score_synthetic_slots

    eos_ids = eos_token_ids(tokenizer)
    scores: dict[str, list[float]] = {}
    examples = []
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
        for r in rows:
            prompt = torch.tensor([_chat_ids(tokenizer, list(r["prompt"]))])
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                 max_new_tokens=max_new_tokens, num_return_sequences=samples,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=eos_ids)
            for o in out:
                text = tokenizer.decode(o[prompt.shape[1]:], skip_special_tokens=True)
                res = score_synthetic_slots(text, to_plain(r["reward_model"]["ground_truth"]))
                for k, v in res.scores.items():
                    scores.setdefault(k, []).append(v)
                if len(examples) < 6:
                    examples.append((r["prompt"][0]["content"], text))
    per = {k: sum(v) / len(v) for k, v in sorted(scores.items())}
    return {"per_reward": per, "mean": sum(per.values()) / len(per) if per else float("nan"),
            "n": len(next(iter(scores.values()), [])), "examples": examples}


def _read_rows(path: Path) -> list[dict]:
    return [to_plain(r) for r in read_parquet_rows(path)]


@dataclass(frozen=True)
class SFTConfig:
    """The warm start's three phases (steps of ``batch_size`` examples each):

    1. ``gold_steps`` on the correct answers, softmax over the response vocabulary, embeddings frozen
       (cheap steps): teaches the mechanics (layout, copying each field's value from its request
       sentence) with a clean signal;
    2. ``demo_steps`` on the imperfect demonstrations, same softmax: brings each field's accuracy down to
       about ``p_correct`` (a 50%-right demonstration gives a copying model only 0.06 nats per field, too
       weak a signal to learn the copying from on its own in CPU minutes);
    3. ``full_steps`` on the demonstrations with the full softmax (151,936 tokens under the real
       vocabulary) and trainable embeddings (~1 s a step there): takes the probability mass off the rest of the vocabulary, which phases 1-2 never
       saw.
    """

    gold_steps: int = 1500
    demo_steps: int = 300
    full_steps: int = 50
    batch_size: int = 32
    lr: float = 3e-3
    demo_lr: float = 1e-3
    full_lr: float = 3e-3


def sft_warm_start(base_model: Path, sft_parquet: Path, test_parquet: Path, out_dir: Path,
                   cfg: SFTConfig = SFTConfig(), seed: int = 0, eval_samples: int = 4,
                   log: Callable[[str], None] = print) -> dict:
    """Fine-tune ``base_model`` (phases of :class:`SFTConfig`), save it (bf16, with the tokenizer) to
    ``out_dir`` and return its record (losses, held-out per-slot accuracy before and after). Cached: a
    second call with the same base model, data and arguments returns the stored record at once."""

    def describe(after: dict) -> tuple[str, dict]:
        line = "held-out accuracy per slot (sampled, T=1): " + ", ".join(f"{k} {v:.2f}" for k, v in after["per_reward"].items())
        return line, {"accuracy_after": after["per_reward"], "accuracy_after_mean": after["mean"], "eval_responses": after["n"]}

    return cached_sft(base_model, sft_parquet, test_parquet, out_dir, cfg, seed, eval_samples,
                      cache=(_SFT_FORMAT, _SFT_KEY_FILE), prefix="[mini]", encode=encode_sft_examples,
                      evaluate=evaluate_slots, describe=describe, log=log)


def cached_sft(base_model: Path, sft_parquet: Path, test_parquet: Path, out_dir: Path, cfg: SFTConfig, seed: int,
               eval_samples: int, *, cache: tuple[str, str], prefix: str,
               encode: Callable[..., list], evaluate: Callable[..., dict], describe: Callable[[dict], tuple[str, dict]],
               log: Callable[[str], None] = print) -> dict:
    """The warm start both miniatures share: the three phases of :class:`SFTConfig` on ``encode(tokenizer,
    rows, "gold" | "demo")``, then ``evaluate(model, tokenizer, test_rows, samples=, seed=)`` (a dict with
    ``examples``) on the held-out rows, summarised by ``describe(after) -> (log line, record fields)``; the
    model is saved atomically (bf16, with the tokenizer) to ``out_dir`` with its record ``sft_meta.json``.
    Cached by a key over the base model, the data, ``cfg``, ``seed``, ``eval_samples`` and ``cache``'s
    format tag (stored in ``out_dir / cache[1]``): a second call returns the stored record at once."""
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    fmt, key_name = cache
    out_dir = Path(out_dir)
    key_file = Path(base_model) / ".mrtpo-tiny-key"
    base_key = key_file.read_text().strip() if key_file.is_file() else sha256_file(Path(base_model) / "model.safetensors")
    key = hashlib.sha256(json.dumps({
        "format": fmt, "base": base_key, "sft": sha256_file(sft_parquet), "test": sha256_file(test_parquet),
        "cfg": asdict(cfg), "seed": seed, "eval_samples": eval_samples,
    }, sort_keys=True).encode()).hexdigest()[:16]
    meta_path = out_dir / "sft_meta.json"
    try:
        if (out_dir / key_name).read_text().strip() == key and meta_path.is_file():
            log(f"{prefix} SFT model cached: {out_dir}")
            return json.loads(meta_path.read_text())
    except OSError:
        pass

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(base_model)
    model = Qwen2ForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    rows = _read_rows(sft_parquet)
    gold = encode(tokenizer, rows, "gold")
    demos = encode(tokenizer, rows, "demo")
    vocab = response_vocabulary(gold + demos)
    test_rows = _read_rows(test_parquet)
    pad = int(tokenizer.pad_token_id or 0)
    t0 = time.monotonic()

    def progress(phase):
        return lambda s, v: log(f"{prefix}   sft {phase} step {s:>4}  loss {v:.3f}  ({time.monotonic() - t0:.0f} s)")

    log(f"{prefix} SFT: {len(rows)} prompts; {cfg.gold_steps} steps on the gold answers, {cfg.demo_steps} + "
        f"{cfg.full_steps} on the imperfect demonstrations (batch {cfg.batch_size})")
    losses = {
        "gold": sft_train(model, gold, cfg.gold_steps, cfg.batch_size, cfg.lr, seed, pad, vocab, on_log=progress("gold")),
        "demo": sft_train(model, demos, cfg.demo_steps, cfg.batch_size, cfg.demo_lr, seed + 1, pad, vocab,
                          on_log=progress("demo")),
        "full": sft_train(model, demos, cfg.full_steps, cfg.batch_size, cfg.full_lr, seed + 2, pad, None,
                          train_embeddings=True, log_every=25, on_log=progress("full-vocab")),
    }
    train_s = time.monotonic() - t0
    after = evaluate(model, tokenizer, test_rows, samples=eval_samples, seed=seed)
    line, fields = describe(after)
    log(f"{prefix} SFT done in {train_s:.0f} s; {line}")
    for prompt, response in after["examples"][:3]:
        log(f"{prefix}   {prompt[-60:]!r} -> {response!r}")

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / key_name).unlink(missing_ok=True)
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

    meta = {
        "config": asdict(cfg), "seed": seed, "train_s": train_s,
        "loss": {phase: {"first": ends(v)[0], "last": ends(v)[1]} for phase, v in losses.items()},
        "losses_every_10": {phase: v[::10] for phase, v in losses.items()},
        **fields, "examples": after["examples"],
    }
    meta_path.write_text(json.dumps(meta, indent=1))
    (out_dir / key_name).write_text(key + "\n")
    return meta
