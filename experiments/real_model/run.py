"""q on a real instruct model (``docs/real_model/analysis_plan.md``): SmolLM2-135M-Instruct samples a response to
each IFEval / IFBench (prompt, constraint) pair with a locatable span, the response is made compliant where it is
not (marked), and the recipe's own replay (:func:`recipe.mrtpo.core.replay.replay_relevance`, JS distance) measures
q for P_all against the prompt without the constraint's sentence. Per type: the lift of q on the checker's span,
top-10% precision, top-1 in span, the shuffle control, bootstrap intervals.

    python -m experiments.real_model.run                 # all pairs -> docs/real_model/{results.md,pairs.json,heatmaps.html}
    python -m experiments.real_model.run --limit 12      # a quick look (writes under outputs/real_model)
"""

from __future__ import annotations

import argparse
import html
import json
import math
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from experiments.real_model import spans as S

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "real_model"
GEN_BATCH, MAX_NEW, GEN_TEMPERATURE, SEED = 16, 160, 0.7, 0
BOOT, SHUFFLES = 10_000, 200


def load(model_dir: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    return tok, model


def pairs_from_sets(skips: dict) -> list[dict]:
    """Every (prompt, constraint) of the shipped IFEval and IFBench sets with a span rule and a locatable Z_k."""
    from data_prep.instruction_following.build import build_eval_rows

    out = []
    for bench in ("ifeval", "ifbench"):
        rows, _ = build_eval_rows(bench)
        for row in rows:
            prompt = row["prompt"][0]["content"]
            gt = row["reward_model"]["ground_truth"]
            for i, (iid, kwj) in enumerate(zip(gt["instruction_id_list"], gt["kwargs"])):
                if iid not in S.SPAN_TYPES:
                    skips[f"no span rule: {iid}"] += 1
                    continue
                kw = {k: v for k, v in json.loads(kwj).items() if v is not None}
                z = S.locate_z(iid, kw, prompt, row["extra_info"]["constraint_texts"][i])
                if not z:
                    skips[f"Z not located: {iid}"] += 1
                    continue
                out.append({"id": f"{row['extra_info']['id']}/{i}", "bench": bench, "type": iid, "kw": kw,
                            "kwargs_json": kwj, "prompt": prompt, "z": z})
    return out


def passes(iid: str, kwj: str, text: str) -> bool:
    from recipe.mrtpo.tasks.instruction_following import evaluate

    return evaluate(text, {"instruction_id_list": [iid], "kwargs": [kwj]}).scores[iid] == 1.0


@torch.no_grad()
def sample(tok, model, prompts: list[list[int]]) -> list[str]:
    """One sampled response per prompt (left-padded batches of :data:`GEN_BATCH`, each seeded SEED + batch index)."""
    out: list[str] = []
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    for b in range(0, len(prompts), GEN_BATCH):
        batch = prompts[b : b + GEN_BATCH]
        P = max(map(len, batch))
        ids = torch.tensor([[pad] * (P - len(p)) + p for p in batch])
        att = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in batch])
        torch.manual_seed(SEED + b // GEN_BATCH)
        gen = model.generate(input_ids=ids, attention_mask=att, do_sample=True, temperature=GEN_TEMPERATURE, top_p=1.0,
                             top_k=0, max_new_tokens=MAX_NEW, pad_token_id=pad)
        out += [tok.decode(g[P:], skip_special_tokens=True) for g in gen]
        print(f"[real-model] sampled {min(b + GEN_BATCH, len(prompts))}/{len(prompts)}", flush=True)
    return out


def render(tok, messages) -> list[int]:
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


@torch.no_grad()
def replay(tok, model, items: list[dict], chunk: int = 16) -> None:
    """q of each item's constraint with the recipe's replay (P_all = variant 0, P_minus_k = variant 1)."""
    from recipe.mrtpo.core.replay import hf_forward, replay_relevance

    end = tok.convert_tokens_to_ids("<|im_end|>")
    for b in range(0, len(items), chunk):
        its = items[b : b + chunk]
        resp = [it["resp_ids"] + [end] for it in its]
        P, T = max(max(len(it["p_all"]), len(it["p_minus"])) for it in its), max(map(len, resp))
        var = torch.zeros(len(its), 2, P, dtype=torch.long)
        lens = torch.zeros(len(its), 2, dtype=torch.long)
        rs = torch.zeros(len(its), T, dtype=torch.long)
        mask = torch.zeros(len(its), T, dtype=torch.long)
        for r, it in enumerate(its):
            for j, p in enumerate((it["p_all"], it["p_minus"])):
                var[r, j, P - len(p):] = torch.tensor(p)
                lens[r, j] = len(p)
            rs[r, : len(resp[r])] = torch.tensor(resp[r])
            mask[r, : len(resp[r])] = 1
        out = replay_relevance(hf_forward(model), var, lens, rs, mask, torch.ones(len(its), 1, dtype=torch.long),
                               micro_batch_size=4, temperature=1.0)
        for r, it in enumerate(its):
            it["q"] = out["variant_relevance"][r, 0, : len(resp[r])].tolist()
        print(f"[real-model] replayed {min(b + chunk, len(items))}/{len(items)}", flush=True)


def measure(item: dict, rng: np.random.Generator) -> None:
    q = np.asarray(item["q"], dtype=np.float64)
    offsets = item["offsets"] + [(0, 0)]  # the end-of-turn token: never in the span
    in_span = S.token_mask(offsets, item["span_chars"])
    item.update(L=len(q), span_tokens=int(in_span.sum()), share=float(in_span.mean()), mean_q=float(q.mean()),
                lift=S.lift(q, in_span), top10=S.top_precision(q, in_span), top1=bool(in_span[int(np.argmax(q))]),
                shuffle_lift=S.shuffle_lift(q, in_span, SHUFFLES, rng), in_span=in_span.tolist())


def boot_ci(x: np.ndarray, rng: np.random.Generator) -> tuple[float, float]:
    if len(x) < 2:
        return math.nan, math.nan
    means = x[rng.integers(0, len(x), (BOOT, len(x)))].mean(1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def summarise(items: list[dict]) -> list[dict]:
    """One line per type and one pooled (the plan's aggregation and criterion)."""
    groups = defaultdict(list)
    for it in items:
        groups[it["type"]].append(it)
    rows = []
    for name, its in sorted(groups.items()) + [("pooled", items)]:
        rng = np.random.default_rng(SEED)
        lifts = np.array([i["lift"] for i in its])
        shuf = np.array([i["shuffle_lift"] for i in its])
        lo, hi = boot_ci(lifts, rng)
        slo, shi = boot_ci(shuf, rng)
        rows.append({"type": name, "n": len(its), "own": sum(i["origin"] == "own" for i in its),
                     "mean_lift": float(lifts.mean()), "ci": (lo, hi), "median_lift": float(np.median(lifts)),
                     "shuffle": float(shuf.mean()), "shuffle_ci": (slo, shi),
                     "top10": float(np.mean([i["top10"] for i in its])), "chance": float(np.mean([i["share"] for i in its])),
                     "top1": float(np.mean([i["top1"] for i in its])), "mean_q": float(np.mean([i["mean_q"] for i in its])),
                     "localises": bool(lo > 1 and lo > shi)})
    return rows


def heatmap(it: dict, tok) -> str:
    q = np.asarray(it["q"])
    top = q.max() or 1.0
    cells = []
    pieces = [tok.decode([t]) for t in it["resp_ids"]] + ["<|im_end|>"]
    for piece, v, sp in zip(pieces, q, it["in_span"]):
        style = f"background: rgba(220,50,47,{v / top:.2f});" + ("border-bottom: 2px solid #268bd2;" if sp else "")
        cells.append(f'<span title="q={v:.3f}" style="{style}">{html.escape(piece)}</span>')
    return (f"<h3>{html.escape(it['type'])} ({it['origin']}, lift {it['lift']:.2f})</h3><p><b>Z removed:</b> "
            f"{html.escape(' | '.join(it['z']))}</p><pre style='white-space: pre-wrap'>{''.join(cells)}</pre>")


def report(rows: list[dict], skips: dict, items: list[dict], wall: float, out: Path) -> str:
    f = lambda x: f"{x:.2f}"  # noqa: E731
    lines = ["| type | n (own) | mean lift [95% CI] | median lift | shuffle [95% CI] | top-10% precision / chance | top-1 in span / span share | mean q | localises |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['type']} | {r['n']} ({r['own']}) | {f(r['mean_lift'])} [{f(r['ci'][0])}, {f(r['ci'][1])}] | "
                     f"{f(r['median_lift'])} | {f(r['shuffle'])} [{f(r['shuffle_ci'][0])}, {f(r['shuffle_ci'][1])}] | "
                     f"{f(r['top10'])} / {f(r['chance'])} | {f(r['top1'])} / {f(r['chance'])} | {r['mean_q']:.3f} | "
                     f"{'yes' if r['localises'] else 'no'} |")
    big = [r for r in rows[:-1] if r["n"] >= 10]
    verdict = rows[-1]["localises"] and sum(r["localises"] for r in big) > len(big) / 2
    own = [i for i in items if i["origin"] == "own"]
    text = "\n".join([
        f"Pairs measured: {len(items)} ({len(own)} own samples, {len(items) - len(own)} constructed); "
        f"wall {wall / 60:.1f} min on this machine.", "",
        *lines, "",
        f"Types with n >= 10 that localise: {sum(r['localises'] for r in big)} of {len(big)}; pooled: "
        f"{'localises' if rows[-1]['localises'] else 'does not localise'}. **Criterion (declared): mechanism "
        f"{'supported' if verdict else 'not supported'} on this model.**", "",
        "Own samples only: " + (f"mean lift {np.mean([i['lift'] for i in own]):.2f} (n {len(own)})" if own else "none"),
        "", "Excluded (counted):", *[f"- {k}: {v}" for k, v in sorted(skips.items())],
    ])
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text("# Results (generated by `python -m experiments.real_model.run`)\n\n" + text + "\n")
    return text


def main(argv=None) -> None:
    from recipe.mrtpo.core.prompt_variants import remove_from_messages
    from recipe.mrtpo.cpu import smollm2

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=0, help="only the first N pairs (then written under outputs/)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    out = a.out or (REPO / "outputs" / "real_model" if a.limit else DOCS)
    t0 = time.time()
    torch.manual_seed(SEED)
    tok, model = load(smollm2.require())
    skips: dict = defaultdict(int)
    items = pairs_from_sets(skips)
    if a.limit:
        items = items[: a.limit]
    for it in items:
        msgs = [{"role": "user", "content": it["prompt"]}]
        minus = msgs
        for z in it["z"]:
            minus = remove_from_messages(minus, z) if minus else None
        it["p_all"] = render(tok, msgs)
        it["p_minus"] = render(tok, minus) if minus and minus[0]["content"].strip() else None
    for it in [i for i in items if i["p_minus"] is None]:
        skips[f"removal empties the prompt: {it['type']}"] += 1
    items = [i for i in items if i["p_minus"] is not None]
    for it, text in zip(items, sample(tok, model, [i["p_all"] for i in items])):
        it["sample"] = text
        if passes(it["type"], it["kwargs_json"], text):
            it["origin"], it["response"] = "own", text
        else:
            it["origin"], it["response"] = "constructed", S.construct(it["type"], it["kw"], it["prompt"], text)
    kept = []
    for it in items:
        if it["origin"] == "constructed" and not passes(it["type"], it["kwargs_json"], it["response"]):
            skips[f"construction fails the checker: {it['type']}"] += 1
            continue
        enc = tok(it["response"], add_special_tokens=False, return_offsets_mapping=True)
        it["resp_ids"], it["offsets"] = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
        it["span_chars"] = S.span_chars(it["type"], it["kw"], it["response"])
        if not it["span_chars"]:
            skips[f"empty span: {it['type']}"] += 1
            continue
        kept.append(it)
    replay(tok, model, kept)
    rng = np.random.default_rng(SEED)
    for it in kept:
        measure(it, rng)
    kept = [i for i in kept if not math.isnan(i["lift"])]
    rows = summarise(kept)
    print(report(rows, skips, kept, time.time() - t0, out))
    keep = ("id", "bench", "type", "z", "origin", "response", "L", "span_tokens", "lift", "top10", "top1",
            "shuffle_lift", "mean_q", "q")
    (out / "pairs.json").write_text(json.dumps([{k: i[k] for k in keep} for i in kept], indent=0) + "\n")
    shown, seen = [], set()
    for it in sorted(kept, key=lambda i: i["id"]):
        if it["type"] not in seen and it["type"] in ("startend:end_checker", "detectable_format:title",
                                                      "detectable_content:postscript", "startend:quotation",
                                                      "keywords:existence", "detectable_content:number_placeholders"):
            seen.add(it["type"])
            shown.append(heatmap(it, tok))
    (out / "heatmaps.html").write_text("<html><meta charset='utf-8'><body><p>Red: q (relative to the response's "
                                       "largest); underlined: the checker's span.</p>" + "".join(shown) + "</body></html>\n")


if __name__ == "__main__":
    main()
