"""The preflight of a format-speed grid: does the replay, on the warm start alone, put q_format where the
frame is decided? Minutes of CPU, before any verl run.

:func:`sample_batch` samples the warm start (``transformers``' ``generate`` at T = 1, as the rollout
samples) on the first RL prompts, ``RESPONSES_PER_PROMPT`` responses each, and scores them with the rows'
verifier; :func:`replay_batch` replays them as a training step would, with the recipe's own functions
(:func:`recipe.mrtpo.core.replay_plan.build_replay_plan`: pairs whose group has variance, P_minus_k
built from each verifier's Z_k; :func:`recipe.mrtpo.core.replay.replay_relevance` over the model; JS
distance), into a batch in the relevance dump's layout (:mod:`recipe.mrtpo.step.dump`). The diagnostic of the
runs' dumps (:func:`.diagnostic.dump_records`, :func:`.diagnostic.summarise`) then measures it, so the
preflight and the runs' tables are one computation.

:func:`gate` is the rule: the grid starts only when q_format's share on the deciding positions
(:attr:`.common.Condition.deciding`) is above their share of the tokens (what a uniform q scores).
:func:`render_preflight` writes the table; :func:`run_preflight` does all of it and saves
``preflight.json`` and ``preflight.md`` (cached by the model's weights and the settings).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional

from data_prep.common import read_parquet_rows, sha256_file
from experiments.format_speed.common import CORRECTNESS, FORMAT, LOG_PREFIX, RESPONSES_PER_PROMPT, Condition, ExperimentError
from experiments.format_speed.diagnostic import dump_records, summarise

_PREFLIGHT_FORMAT = "1"  # bump when the preflight changes in a way its key would not see
#: the token roles the table reports: (name, q_format key, q_correctness key, share key)
ROWS = (
    ("position after the closing tag", "q_format_on_after_close", None, "after_close_share"),
    ("closing position", "q_format_on_close", None, "close_share"),
    ("tag tokens", "q_format_on_tag", "q_correctness_on_tag", "tag_share"),
    ("argument tokens", "q_format_on_arg", "q_correctness_on_arg", "arg_share"),
)


def sample_batch(model, tokenizer, rows: Sequence[dict], n: int = RESPONSES_PER_PROMPT, max_new_tokens: int = 24,
                 seed: int = 0) -> dict:
    """``n`` responses per row at T = 1, scored: ``{"responses" [B, T], "response_mask" [B, T] (up to and
    with the end token), "uid", "scores" [B, K], "reward_names", "contexts", "messages"}``."""
    import torch

    from experiments.mini_credit.warm_start import _chat_ids
    from recipe.mrtpo.cpu.tiny_model import eos_token_ids
    from recipe.mrtpo.tasks import get_task, to_plain

    eos_ids = eos_token_ids(tokenizer)
    names = [FORMAT, CORRECTNESS]
    resp, scores, uid, contexts, messages = [], [], [], [], []
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
        for g, r in enumerate(rows):
            msgs = [dict(m) for m in r["prompt"]]
            prompt = torch.tensor([_chat_ids(tokenizer, msgs)])
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=True, temperature=1.0,
                                 top_k=0, top_p=1.0, max_new_tokens=max_new_tokens, num_return_sequences=n,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=eos_ids)
            score = get_task(r["data_source"])
            for o in out:
                ids = o[prompt.shape[1]:].tolist()
                end = next((t + 1 for t, i in enumerate(ids) if i in eos_ids), len(ids))
                ids = ids[:end]
                res = score(tokenizer.decode(ids, skip_special_tokens=True), to_plain(r["reward_model"]["ground_truth"]),
                            to_plain(r.get("extra_info")))
                resp.append(ids)
                scores.append([float(res.scores[k]) for k in names])
                contexts.append({k: {"text": c.text, "placement": c.placement} for k, c in res.contexts.items()})
                uid.append(f"g{g}")
                messages.append(msgs)
    T = max(len(x) for x in resp)
    pad = int(tokenizer.pad_token_id or 0)
    responses = torch.full((len(resp), T), pad, dtype=torch.long)
    mask = torch.zeros(len(resp), T, dtype=torch.long)
    for i, x in enumerate(resp):
        responses[i, :len(x)] = torch.tensor(x)
        mask[i, :len(x)] = 1
    return {"responses": responses, "response_mask": mask, "uid": uid, "scores": torch.tensor(scores),
            "reward_names": names, "contexts": contexts, "messages": messages}


def replay_batch(model, tokenizer, batch: dict, beta: float = 0.5, rho: Optional[float] = 1.0,
                 micro_batch_size: int = 16) -> dict:
    """Replay ``batch`` (:func:`sample_batch`) as a training step does (module docstring); returns it in the
    relevance dump's layout with the replay's counts (``pairs_replayed``, ``fallbacks``)."""
    import torch

    from experiments.mini_credit.warm_start import _chat_ids
    from recipe.mrtpo.core.replay import expand_relevance, hf_forward, replay_relevance
    from recipe.mrtpo.core.replay_plan import build_replay_plan

    pad = int(tokenizer.pad_token_id or 0)
    plan = build_replay_plan(batch["scores"], batch["uid"], batch["reward_names"], batch["contexts"], batch["messages"],
                             batch["responses"], batch["response_mask"], lambda m: _chat_ids(tokenizer, m), pad_id=pad)
    B, T = batch["responses"].shape
    relevance = torch.zeros(B, len(batch["reward_names"]), T)
    if plan.rows:
        with torch.no_grad():
            out = replay_relevance(hf_forward(model), **plan.inputs, micro_batch_size=micro_batch_size,
                                   measure="js_distance", temperature=1.0, pad_id=pad)
        relevance[torch.tensor(plan.rows)] = expand_relevance(out["variant_relevance"], plan.inputs["pair_variant"])
    return {"step": 0, "beta": beta, "max_realloc_rms": rho, "reward_names": list(batch["reward_names"]),
            "scores": batch["scores"], "uid": list(batch["uid"]), "response_mask": batch["response_mask"],
            "response_ids": batch["responses"], "relevance": relevance, "replayed": plan.replayed_mask,
            "response_tokens": [[tokenizer.decode([t]) for t in r.tolist()] for r in batch["responses"]],
            "pairs_replayed": plan.pairs_replayed, "fallbacks": dict(plan.fallback_reasons)}


def gate(summary: dict, deciding: str) -> dict:
    """``{"passed", "q", "share", "reason"}``: passed iff q_format's mean share on the ``deciding``
    positions is above their mean share of the tokens (both over the same responses; none measured:
    not passed)."""
    q, share = summary.get(f"q_format_on_{deciding}"), summary.get(f"{deciding}_share")
    if q is None or share is None:
        return {"passed": False, "q": q, "share": share,
                "reason": f"no response with a replayed format pair and a {deciding} position: nothing measured"}
    passed = q > share
    verb = "above" if passed else "not above"
    return {"passed": passed, "q": q, "share": share,
            "reason": f"q_format on the deciding positions ({deciding}) is {100 * q:.1f}%, {verb} their "
                      f"{100 * share:.1f}% share of the tokens"}


def _pct(v: Optional[float]) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


def render_preflight(result: dict) -> str:
    s, g, cond = result["summary"], result["gate"], result["condition"]
    lines = [f"# Preflight of the format-speed grid ({cond['reward']}, {cond['prompts_per_step']} prompts x "
             f"{RESPONSES_PER_PROMPT} responses a step)", "",
             f"The warm start alone, sampled at T = 1 on the first {result['prompts']} RL prompts x {RESPONSES_PER_PROMPT} "
             f"responses ({result['responses']} responses; format {result['format_rate']:.2f}, correctness "
             f"{result['correctness_mean']:.2f}), replayed as a training step replays them ({result['pairs_replayed']} "
             f"(response, reward) pairs whose group has variance; fallbacks {result['fallbacks'] or 'none'}). "
             f"{s['responses']} responses hold a decodable call. Mean over them of each share:", "",
             "| positions | q_format's share | q_correctness's share | their share of the tokens (uniform q) |",
             "| --- | ---: | ---: | ---: |"]
    for name, qf, qc, share in ROWS:
        mark = " **(deciding)**" if share == f"{cond['deciding']}_share" else ""
        lines.append(f"| {name}{mark} | {_pct(s.get(qf))} | {_pct(s.get(qc)) if qc else '–'} | {_pct(s.get(share))} |")
    lines += ["", f"Gate: {'PASSED' if g['passed'] else 'NOT PASSED'}: {g['reason']}."
              + ("" if g["passed"] else " The grid does not start."), "",
              "The same batch under both weightings (beta 0.5, rho 1; responses with A_format != 0: "
              f"{s['with_format_advantage']}, of which conflicts {s['conflicts']}): format credit kept on the deciding "
              f"position (sign(A_format) x advantage / abs A_format): GDPO {_fmt(s.get('gdpo_' + cond['deciding']))}, "
              f"MRTPO {_fmt(s.get('mrtpo_' + cond['deciding']))}; in the conflicts: GDPO "
              f"{_fmt(s['conflict'].get('gdpo_' + cond['deciding']))}, MRTPO {_fmt(s['conflict'].get('mrtpo_' + cond['deciding']))}.",
              "", f"Measured in {result['wall_s']:.0f} s (`experiments/format_speed/preflight.py`; the shares are those of "
              "`experiments/format_speed/diagnostic.py`, the positions those of `experiments/format_speed/tokens.py`)."]
    return "\n".join(lines) + "\n"


def _fmt(v: Optional[float]) -> str:
    return "–" if v is None else f"{v:.2f}"


def run_preflight(model_dir: Path, train_parquet: Path, out_dir: Path, condition: Condition, prompts: int = 64,
                  seed: int = 0, beta: float = 0.5, docs: Optional[Path] = None,
                  log: Callable[[str], None] = print) -> dict:
    """Sample, replay, measure and gate (module docstring); writes ``out_dir/preflight.{json,md}`` (and
    copies them to ``docs``). Cached by the weights, the data and the settings."""
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from recipe.mrtpo.tasks import to_plain

    if prompts < 1:
        raise ExperimentError(f"the preflight needs at least one prompt, got {prompts}")
    out_dir = Path(out_dir)
    key = hashlib.sha256(json.dumps([_PREFLIGHT_FORMAT, sha256_file(Path(model_dir) / "model.safetensors"),
                                     sha256_file(train_parquet), condition.reward, prompts, seed, beta]).encode()).hexdigest()[:16]
    path = out_dir / "preflight.json"
    result = None
    if path.is_file():
        try:
            old = json.loads(path.read_text())
            result = old if old.get("key") == key else None
        except ValueError:
            pass
    if result is not None:
        log(f"{LOG_PREFIX} preflight cached: {path}")
    else:
        rows = [to_plain(r) for r in read_parquet_rows(train_parquet)][:prompts]
        if not rows:
            raise ExperimentError(f"no RL prompts in {train_parquet}")
        t0 = time.monotonic()
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        log(f"{LOG_PREFIX} preflight: sampling {len(rows)} prompts x {RESPONSES_PER_PROMPT} from the warm start ...")
        batch = sample_batch(model, tokenizer, rows, max_new_tokens=condition.max_response_length, seed=seed)
        log(f"{LOG_PREFIX} preflight: replaying ({time.monotonic() - t0:.0f} s) ...")
        dump = replay_batch(model, tokenizer, batch, beta=beta)
        summary = summarise(dump_records(dump, beta))
        scores = batch["scores"]
        result = {"key": key, "condition": {"reward": condition.reward, "prompts_per_step": condition.prompts_per_step,
                                            "deciding": condition.deciding},
                  "prompts": len(rows), "responses": int(scores.shape[0]), "format_rate": float(scores[:, 0].mean()),
                  "correctness_mean": float(scores[:, 1].mean()), "pairs_replayed": dump["pairs_replayed"],
                  "fallbacks": dump["fallbacks"], "summary": summary, "gate": gate(summary, condition.deciding),
                  "wall_s": time.monotonic() - t0}
        out_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1))
        (out_dir / "preflight.md").write_text(render_preflight(result))
    if docs is not None:
        docs = Path(docs)
        docs.mkdir(parents=True, exist_ok=True)
        for name in ("preflight.json", "preflight.md"):
            (docs / name).write_bytes((out_dir / name).read_bytes())
    return result
