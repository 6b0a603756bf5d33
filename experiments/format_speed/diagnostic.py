"""The mechanism, measured on relevance dumps: where each reward's relevance q lies, and whether the
token advantage on the tag tokens follows the format reward's advantage.

For one dump (one step's batch, schema :mod:`recipe.mrtpo.step.dump`) :func:`dump_records` recomputes, with the
recipe's own functions (:mod:`recipe.mrtpo.core.advantage`), from the dump's scores, group ids, mask and q:

- A[i, k], the group-normalised advantage of each reward (the same for GDPO and MRTPO);
- GDPO's summed token advantage: sum_k A[i,k] on every token (``beta = 0``);
- MRTPO's: sum_k A[i,k] w[i,k,t] with the relevance weights of ``beta`` and the dump's rho;

both before the batch whitening (which only shifts and scales the whole batch; the question is which
reward's sign a token gets). Then per response whose call is decodable (:func:`.tokens.token_roles`)
and whose format advantage is not 0, over its tag tokens: the share of tag tokens whose summed advantage
has the sign of A_format (``agree``; an advantage under :data:`CANCEL_TOL` x |A_format| has none), the mean of sign(A_format) x advantage / |A_format| (``signed``:
1 means the tag tokens get exactly the format credit, 0 that it cancels), and whether the response is a
*conflict* (A_correctness of the opposite sign: good tags with a wrong argument, or the reverse). Also
the share of q_format on the tag tokens and of q_correctness on the argument tokens, next to the share
those tokens have of the response (what a uniform q scores). And at the *closing position* (the token
where the closing tag has to begin, :func:`.tokens.token_roles`): the share of q_format there and the
format credit each weighting keeps there (``close``: sign(A_format) x advantage / |A_format|, 1 for GDPO
outside conflicts); the same at the position after the closing tag (``after_close``: where the layout is
decided when the instruction names it, ``data_prep.format_speed --reward toolrl``).

Both weightings are computed on the same batch: GDPO runs write no relevance, so the diagnostic uses the
dumps of the MRTPO runs and asks what each weighting would have done with them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

from experiments.format_speed.common import CORRECTNESS, FORMAT
from experiments.format_speed.tokens import token_roles

#: an advantage below this fraction of |A_format| counts as cancelled (sign 0): exact cancellation in
#: GDPO leaves float noise of the group-std epsilon (~1e-6)
CANCEL_TOL = 1e-3


def _sign(x: float, tol: float = 0.0) -> int:
    return (x > tol) - (x < -tol)


def summed_advantages(dump: dict, beta: float) -> Optional[dict]:
    """``{"A": [n, K], "gdpo": [n, T], "mrtpo": [n, T]}`` (unwhitened), or ``None`` without relevance."""
    import torch

    from recipe.mrtpo.core.advantage import compute_mrtpo_advantage_with_stats, group_normalized_scores

    rel = dump.get("relevance")
    if rel is None:
        return None
    scores = torch.as_tensor(dump["scores"]).to(torch.float32)
    mask = torch.as_tensor(dump["response_mask"]).to(torch.float32)
    uid = list(dump["uid"])
    rho = dump.get("max_realloc_rms", 1.0)
    rel = torch.as_tensor(rel).to(torch.float32)
    if "replayed" in dump and dump["replayed"] is not None:  # pairs not replayed carry no q (uniform weights)
        rel = rel * torch.as_tensor(dump["replayed"]).to(torch.float32).unsqueeze(-1)
    gdpo, _ = compute_mrtpo_advantage_with_stats(scores, uid, mask, None, 0.0, rho, whiten=False)
    mrtpo, _ = compute_mrtpo_advantage_with_stats(scores, uid, mask, rel, beta, rho, whiten=False)
    return {"A": group_normalized_scores(scores, uid), "gdpo": gdpo, "mrtpo": mrtpo}


def dump_records(dump: dict, beta: float, special_ids: Optional[set] = None) -> list[dict]:
    """One record per response of the dump whose call is decodable (see the module docstring)."""
    import torch

    adv = summed_advantages(dump, beta)
    if adv is None:
        return []
    names = list(dump["reward_names"])
    if FORMAT not in names or CORRECTNESS not in names:
        return []
    kf, kc = names.index(FORMAT), names.index(CORRECTNESS)
    mask = torch.as_tensor(dump["response_mask"]).bool()
    ids = torch.as_tensor(dump["response_ids"])
    rel = torch.as_tensor(dump["relevance"]).double()
    replayed = dump.get("replayed")
    out = []
    for i in range(mask.shape[0]):
        valid = int(mask[i].sum())
        if valid == 0:
            continue
        roles = token_roles(ids[i].tolist(), dump["response_tokens"][i], valid, special_ids)
        if roles is None or not roles["tag"]:
            continue
        tags, arg = roles["tag"], roles["argument"]
        a_f, a_c = float(adv["A"][i, kf]), float(adv["A"][i, kc])
        rec = {"step": int(dump.get("step", -1)), "sample": i, "n_valid": valid, "n_tag": len(tags), "n_arg": len(arg),
               "format": float(dump["scores"][i][kf]), "correctness": float(dump["scores"][i][kc]),
               "A_format": a_f, "A_correctness": a_c,
               "conflict": _sign(a_f) != 0 and _sign(a_c) == -_sign(a_f)}
        close, after_close = roles["close"], roles["after_close"]
        if a_f != 0:
            for method in ("gdpo", "mrtpo"):
                vals = [float(adv[method][i, t]) for t in tags]
                rec[f"{method}_agree"] = sum(_sign(v, CANCEL_TOL * abs(a_f)) == _sign(a_f) for v in vals) / len(vals)
                rec[f"{method}_signed"] = sum(_sign(a_f) * v for v in vals) / len(vals) / abs(a_f)
                for role, pos in (("close", close), ("after_close", after_close)):
                    if pos:
                        rec[f"{method}_{role}"] = _sign(a_f) * float(adv[method][i, pos[0]]) / abs(a_f)
        for k, name, pos in ((kf, "q_format_on_tag", tags), (kc, "q_correctness_on_arg", arg),
                             (kc, "q_correctness_on_tag", tags), (kf, "q_format_on_arg", arg),
                             (kf, "q_format_on_close", close), (kf, "q_format_on_after_close", after_close)):
            if replayed is not None and not bool(torch.as_tensor(replayed)[i, k]):
                continue
            q = rel[i, k, :valid]
            total = float(q.sum())
            if total > 0 and pos:
                rec[name] = float(q[pos].sum()) / total
        rec["tag_share"] = len(tags) / valid
        rec["arg_share"] = len(arg) / valid
        for role, pos in (("close", close), ("after_close", after_close)):
            if pos:
                rec[f"{role}_share"] = len(pos) / valid
        out.append(rec)
    return out


#: the per-response keys averaged over the responses with a format advantage (and over the conflicts)
SIGN_KEYS = ("gdpo_agree", "mrtpo_agree", "gdpo_signed", "mrtpo_signed", "gdpo_close", "mrtpo_close",
             "gdpo_after_close", "mrtpo_after_close")
#: the per-response keys averaged over every response (where q lies, and the shares of those tokens)
Q_KEYS = ("q_format_on_tag", "q_format_on_arg", "q_correctness_on_arg", "q_correctness_on_tag", "tag_share", "arg_share",
           "q_format_on_close", "close_share", "q_format_on_after_close", "after_close_share")


def summarise(records: Sequence[dict]) -> dict:
    """Means of every key over the records that have it: all responses with A_format != 0, and the
    conflicts among them (``conflict``); counts alongside."""

    def mean(recs, key):
        vals = [r[key] for r in recs if key in r]
        return sum(vals) / len(vals) if vals else None

    signed = [r for r in records if "gdpo_agree" in r]
    conflict = [r for r in signed if r["conflict"]]
    out = {"responses": len(records), "with_format_advantage": len(signed), "conflicts": len(conflict)}
    out.update({k: mean(signed, k) for k in SIGN_KEYS})
    out["conflict"] = {k: mean(conflict, k) for k in SIGN_KEYS}
    out.update({k: mean(records, k) for k in Q_KEYS})
    return out
