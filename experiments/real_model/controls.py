"""The two controls of ``docs/real_model/analysis_plan.md`` (amendment 2) that can fail, per type: the position-matched
span and the sham removal; the shared-sentence pairs; the within-type own / constructed comparison.

    python -m experiments.real_model.controls            # every pair of pairs.json -> docs/real_model/{controls.md,controls.json}
    python -m experiments.real_model.controls --limit 8  # a quick look (writes under outputs/real_model_controls)

It reuses the responses ``pairs.json`` stores, re-tokenizes them with the asset's tokenizer (SmolLM2's, format 2)
and replays, with the recipe's replay, both the true removal (Z_k) and the sham one on every pair.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from experiments.real_model import spans as S

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "real_model"
BOOT, SEED, MIN_N = 10_000, 0, 10

#: cue words (any, lower-cased) that locate the sentence of a constraint type without a span rule (the plan's
#: amendment 2); a type in neither this table nor ``spans.SPAN_TYPES`` cannot be located
GLOBAL_CUES = {
    "punctuation:no_comma": ("comma",),
    "length_constraints:number_words": ("words",),
    "length_constraints:number_sentences": ("sentence",),
    "length_constraints:number_paragraphs": ("paragraph",),
    "length_constraints:nth_paragraph_first_word": ("paragraph",),
    "change_case:english_lowercase": ("lowercase", "lower case", "lower-case"),
    "change_case:english_capital": ("capital", "uppercase", "upper case"),
    "change_case:capital_word_frequency": ("capital", "uppercase", "upper case"),
    "keywords:letter_frequency": ("letter",),
    "language:response_language": ("language",),
    "detectable_format:multiple_sections": ("section",),
    "detectable_format:json_format": ("json",),
    "detectable_format:constrained_response": ("my answer is", "answer with one of"),
    "combination:two_responses": ("two different", "two responses", "******"),
    "startend:end_checker": ("end your", "finish your"),
    "punctuation:punctuation_dot": ("period", "dot"),
    "punctuation:punctuation_exclamation": ("exclamation",),
}
FILLER = re.compile(r"(?: This is about [^.]*\.)+$")


def locate_constraint(iid: str, kw: dict, prompt: str, verbatim: str = "") -> list[str]:
    """A constraint's sentences in ``prompt``: ``spans.locate_z`` (verbatim sentence, span-type cues), else the
    sentences carrying one of the type's :data:`GLOBAL_CUES` (for ``forbidden_words`` one of the words)."""
    found = S.locate_z(iid, kw, prompt, verbatim)
    if found:
        return found
    cues = tuple(GLOBAL_CUES.get(iid, ()))
    if iid == "keywords:forbidden_words":
        cues = tuple(str(w).lower() for w in kw.get("forbidden_words") or [])
    return list(dict.fromkeys(s for s in S.sentences(prompt) if any(c in s.lower() for c in cues))) if cues else []


def is_shared(z: Sequence[str], others: Sequence[Sequence[str]]) -> bool:
    """Whether a sentence of Z_k is also a located sentence of another constraint of the prompt."""
    return any(set(z) & set(o) for o in others)


def sham_sentences(iid: str, kw: dict, prompt: str, z: Sequence[str],
                   others: Sequence[Sequence[str]]) -> tuple[str | None, list[str]]:
    """(kind, sentences) the sham removal takes out instead of Z_k (the plan's two steps); (None, []) without one.

    ``others``: the located sentences of the prompt's other constraints, in instruction order."""
    for o in others:
        rest = [s for s in o if s not in z]
        if rest:
            return "constraint", rest
    body = str(kw.get("prompt_to_repeat") or "") if iid == "combination:repeat_prompt" else ""
    want = sum(len(s) for s in z)
    cands = [s for s in S.sentences(prompt) if s not in z and not S.has_cue(iid, kw, s) and not (body and s in body)]
    if not cands:
        return None, []
    return "length", [min(cands, key=lambda s: abs(len(s) - want))]  # min keeps the earliest on a tie


def position_map(idx: np.ndarray, n_i: int, n_j: int) -> np.ndarray | None:
    """Span token indices of a response of ``n_i`` tokens placed in one of ``n_j``, each at its distance from the
    nearer end (t -> t when t < n_i / 2, else n_j - (n_i - t)); None when one falls outside or the order breaks."""
    idx = np.asarray(idx, dtype=np.int64)
    out = np.where(idx < n_i / 2, idx, n_j - (n_i - idx))
    if len(out) == 0 or out.min() < 0 or out.max() >= n_j or np.any(np.diff(out) <= 0):
        return None
    return out


def position_baselines(types: Sequence[str], qs: Sequence[np.ndarray], masks: Sequence[np.ndarray]) -> list[tuple[float, int]]:
    """Per pair: (the mean lift of other-type recipients' own q on its position-matched span, their number).

    ``qs[i]`` and ``masks[i]``: [L_i] q and span mask over the response tokens and the end-of-turn token (last),
    which is never mapped to; a recipient qualifies by the plan's rule (:func:`position_map`, away from its span)."""
    out = []
    for i, (t_i, m_i) in enumerate(zip(types, masks)):
        idx, n_i, lifts = np.flatnonzero(m_i[:-1]), len(m_i) - 1, []
        for j, (t_j, m_j) in enumerate(zip(types, masks)):
            if j == i or t_j == t_i:
                continue
            mapped = position_map(idx, n_i, len(m_j) - 1)
            if mapped is None or m_j[mapped].any():
                continue
            sham = np.zeros(len(m_j), dtype=bool)
            sham[mapped] = True
            lifts.append(S.lift(qs[j], sham))
        lifts = [x for x in lifts if not math.isnan(x)]
        out.append((float(np.mean(lifts)) if lifts else math.nan, len(lifts)))
    return out


def mean_ci(x: Sequence[float], rng: np.random.Generator, boot: int = BOOT) -> tuple[float, float, float]:
    """(mean, 2.5% and 97.5% percentile-bootstrap bounds of the mean over resampled pairs); nan bounds below 2."""
    x = np.asarray(x, dtype=np.float64)
    if len(x) < 2:
        return (float(x.mean()) if len(x) else math.nan), math.nan, math.nan
    means = x[rng.integers(0, len(x), (boot, len(x)))].mean(1)
    return float(x.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def survival(rows: Sequence[dict], boot: int = BOOT) -> list[dict]:
    """Per type (n >= :data:`MIN_N` decides) and pooled, over the pairs both controls kept: the mean lift, the
    position baseline, the sham lift, d_pos and d_sham with their intervals, and the verdicts."""
    groups = defaultdict(list)
    for r in rows:
        if not (math.isnan(r["baseline"]) or math.isnan(r["sham_lift"])):
            groups[r["type"]].append(r)
    out = []
    for name, rs in sorted(groups.items()) + [("pooled", [r for g in groups.values() for r in g])]:
        rng = np.random.default_rng(SEED)
        d_pos = mean_ci([r["lift"] - r["baseline"] for r in rs], rng, boot)
        d_sham = mean_ci([r["lift"] - r["sham_lift"] for r in rs], rng, boot)
        pos_ok, sham_ok = d_pos[1] > 0, d_sham[1] > 0
        out.append({"type": name, "n": len(rs), "own": sum(r["origin"] == "own" for r in rs),
                    "shared": sum(r["shared"] for r in rs), "lift": float(np.mean([r["lift"] for r in rs])),
                    "baseline": float(np.mean([r["baseline"] for r in rs])),
                    "sham_lift": float(np.mean([r["sham_lift"] for r in rs])), "d_pos": d_pos, "d_sham": d_sham,
                    "kinds": dict(Counter(r["sham_kind"] for r in rs)), "decides": name == "pooled" or len(rs) >= MIN_N,
                    "survives_pos": bool(pos_ok), "survives_sham": bool(sham_ok), "survives_both": bool(pos_ok and sham_ok)})
    return out


def filler_start(response: str) -> int | None:
    """Where a keyword construction's appended filler sentences begin (None when there are none)."""
    m = FILLER.search(response)
    return m.start() if m else None


def own_vs_constructed(rows: Sequence[dict], least: int = 3) -> list[tuple[str, int, float, int, float]]:
    """Per type with >= ``least`` of each: (type, n own, mean lift own, n constructed, mean lift constructed)."""
    groups = defaultdict(lambda: {"own": [], "constructed": []})
    for r in rows:
        groups[r["type"]][r["origin"]].append(r["lift"])
    return [(t, len(g["own"]), float(np.mean(g["own"])), len(g["constructed"]), float(np.mean(g["constructed"])))
            for t, g in sorted(groups.items()) if len(g["own"]) >= least and len(g["constructed"]) >= least]


def _fmt(c: tuple[float, float, float]) -> str:
    return f"{c[0]:+.2f} [{c[1]:+.2f}, {c[2]:+.2f}]"


def render_table(table: Sequence[dict]) -> list[str]:
    lines = ["| type | n (own, shared) | lift | position baseline | lift - baseline [95% CI] | sham lift (kinds) | "
             "lift - sham [95% CI] | survives both |", "|---|---|---|---|---|---|---|---|"]
    for r in table:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(r["kinds"].items()))
        verdict = ("yes" if r["survives_both"] else "no") if r["decides"] else f"(n < {MIN_N})"
        lines.append(f"| {r['type']} | {r['n']} ({r['own']}, {r['shared']}) | {r['lift']:.2f} | {r['baseline']:.2f} | "
                     f"{_fmt(r['d_pos'])} | {r['sham_lift']:.2f} ({kinds}) | {_fmt(r['d_sham'])} | {verdict} |")
    return lines


def report(rows: list[dict], skips: dict, wall: float, out: Path) -> str:
    """controls.md and controls.json under ``out``; the text of controls.md."""
    full, unshared = survival(rows), survival([r for r in rows if not r["shared"]])
    big = [r for r in full if r["decides"] and r["type"] != "pooled"]
    both = [r["type"] for r in big if r["survives_both"]]
    flips = [a["type"] for a in full for b in unshared if a["type"] == b["type"] and a["decides"]
             and a["survives_both"] != b["survives_both"]]
    ovc = own_vs_constructed(rows)
    kwf = [r for r in rows if r.get("lift_filler") is not None]
    text = "\n".join([
        f"Pairs: {len(rows)} replayed ({sum(r['shared'] for r in rows)} shared-sentence); wall {wall / 60:.1f} min.", "",
        "**All pairs** (the criterion):", "", *render_table(full), "",
        f"Types with n >= {MIN_N} that survive both controls: {len(both)} of {len(big)} ({', '.join(both) or 'none'}); "
        f"pooled: {'survives' if full[-1]['survives_both'] else 'does not survive'} both.", "",
        "**Without the shared-sentence pairs** (beside it):", "", *render_table(unshared), "",
        "Verdicts that change without them: " + (", ".join(flips) or "none"), "",
        "**Own and constructed, within types** (descriptive; types with at least 3 of each):", "",
        "| type | own: n, mean lift | constructed: n, mean lift |", "|---|---|---|",
        *[f"| {t} | {no}, {lo:.2f} | {nc}, {lc:.2f} |" for t, no, lo, nc, lc in ovc], "",
        "**Keyword constructions**: mean lift on the appended filler's keywords "
        + (f"{np.mean([r['lift_filler'] for r in kwf]):.2f}, on the sample's own keywords "
           f"{np.nanmean([r['lift_sample_kw'] for r in kwf]):.2f} (n {len(kwf)})" if kwf else "(none)"), "",
        "Excluded (counted):", *[f"- {k}: {v}" for k, v in sorted(skips.items())],
    ])
    out.mkdir(parents=True, exist_ok=True)
    (out / "controls.md").write_text("# Controls (generated by `python -m experiments.real_model.controls`)\n\n" + text + "\n")
    keep = ("id", "type", "origin", "shared", "lift", "baseline", "recipients", "sham_kind", "sham_z", "sham_lift",
            "lift_filler", "lift_sample_kw")
    (out / "controls.json").write_text(json.dumps([{k: r.get(k) for k in keep} for r in rows], indent=0) + "\n")
    return text


def main(argv=None) -> None:
    from experiments.real_model import run as R
    from recipe.mrtpo.core.prompt_variants import remove_from_messages
    from recipe.mrtpo.cpu import smollm2

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=Path, default=DOCS / "pairs.json", help="the stored responses (default docs/real_model/pairs.json)")
    ap.add_argument("--limit", type=int, default=0, help="only the first N pairs (then written under outputs/)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    out = a.out or (REPO / "outputs" / "real_model_controls" if a.limit else DOCS)
    t0 = time.time()
    tok, model = R.load(smollm2.require())
    stored = json.loads(a.pairs.read_text())
    stored = stored[: a.limit] if a.limit else stored
    skips: dict = defaultdict(int)
    found = {p["id"]: p for p in R.pairs_from_sets(defaultdict(int))}
    others = _other_constraints()

    def minus(prompt: str, sentences: Sequence[str]):
        msgs = [{"role": "user", "content": prompt}]
        for s in sentences:
            msgs = remove_from_messages(msgs, s) if msgs else None
        return R.render(tok, msgs) if msgs and msgs[0]["content"].strip() else None

    items, shams = [], []
    for p in stored:
        it = found.get(p["id"])
        if it is None or not R.passes(it["type"], it["kwargs_json"], p["response"]):
            skips["id not found or the stored response fails its checker"] += 1
            continue
        rid, k = p["id"].rsplit("/", 1)
        oth = [z for j, z in enumerate(others[rid]) if j != int(k)]
        it = {**it, "origin": p["origin"], "response": p["response"], "shared": is_shared(it["z"], oth)}
        it["sham_kind"], it["sham_z"] = sham_sentences(it["type"], it["kw"], it["prompt"], it["z"], oth)
        it["p_all"], it["p_minus"] = R.render(tok, [{"role": "user", "content": it["prompt"]}]), minus(it["prompt"], it["z"])
        p_sham = minus(it["prompt"], it["sham_z"]) if it["sham_kind"] else None
        if p_sham is None:
            skips[f"no sham removal: {it['type']}"] += 1
        enc = tok(it["response"], add_special_tokens=False, return_offsets_mapping=True)
        it["resp_ids"], it["offsets"] = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
        it["span_chars"] = S.span_chars(it["type"], it["kw"], it["response"])
        items.append(it)
        shams.append({**it, "p_minus": p_sham} if p_sham is not None else None)
    if not items:
        raise SystemExit(f"no pair of {a.pairs} could be measured: {dict(skips)}")
    R.replay(tok, model, items)
    R.replay(tok, model, [s for s in shams if s is not None])
    rng = np.random.default_rng(SEED)
    for it, sh in zip(items, shams):
        R.measure(it, rng)
        mask = np.asarray(it["in_span"])
        it["sham_lift"] = S.lift(np.asarray(sh["q"]), mask) if sh is not None else math.nan
        cut = filler_start(it["response"]) if it["origin"] == "constructed" and it["type"] in S.KEYWORD_TYPES else None
        it["lift_filler"] = it["lift_sample_kw"] = None
        if cut is not None:
            after = np.array([s >= cut for s, _ in it["offsets"]] + [False])
            q = np.asarray(it["q"])
            it["lift_filler"], it["lift_sample_kw"] = S.lift(q, mask & after), S.lift(q, mask & ~after)
    base = position_baselines([i["type"] for i in items], [np.asarray(i["q"]) for i in items],
                              [np.asarray(i["in_span"]) for i in items])
    for it, (b, n) in zip(items, base):
        it["baseline"], it["recipients"] = b, n
        if n == 0:
            skips[f"no position-matched recipient: {it['type']}"] += 1
    R.report(R.summarise(items), {}, items, time.time() - t0, out / "fixed_tokenizer")
    print(report(items, skips, time.time() - t0, out))


def _other_constraints() -> dict[str, list[list[str]]]:
    """Per row id of the shipped IFEval / IFBench sets: each constraint's located sentences, in instruction order."""
    from data_prep.instruction_following.build import build_eval_rows

    out = {}
    for bench in ("ifeval", "ifbench"):
        for row in build_eval_rows(bench)[0]:
            prompt, gt = row["prompt"][0]["content"], row["reward_model"]["ground_truth"]
            texts = row["extra_info"]["constraint_texts"]
            out[str(row["extra_info"]["id"])] = [
                locate_constraint(iid, {k: v for k, v in json.loads(kwj).items() if v is not None}, prompt, texts[i])
                for i, (iid, kwj) in enumerate(zip(gt["instruction_id_list"], gt["kwargs"]))]
    return out


if __name__ == "__main__":
    main()
