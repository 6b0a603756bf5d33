"""Per-token relevance heatmap of a trainer relevance dump, as one self-contained HTML page.

    python -m recipe.mrtpo.tools.viz DUMP [--out FILE.html] [--step N] [--max-samples M] [--only-replayed]
                                    [--rho R|none] [--tokens auto|bytelevel|text]

DUMP is a ``step_XXXXXX.pt`` written by the trainer (``mrtpo.dump``; the schema: :mod:`recipe.mrtpo.step.dump`)
or a folder of them (the latest step is shown, or ``--step N``). The page has one block per sampled
response: its uid and per-reward scores, then one row per reward (name, its verifier information Z_k,
score, replayed yes/no) in which every response token is shaded by the replay relevance q_{k,t}
(opacity = q / max_t q of that row), plus a row of the final token advantage. Hovering a token shows
the token, q and the weight the trainer gave it, w = (1 - beta) + beta * q / qbar under the RMS
constraint rho, computed by :func:`recipe.mrtpo.core.advantage.relevance_weights` itself. Rows that were not
replayed are greyed and marked "uniform (not replayed)".

Everything in a dump that came from the model or a dataset (tokens, Z_k, uids, reward names) is
treated as hostile: it is sanitised (lone surrogates, control and bidi characters made visible) and
HTML-escaped. The page has no external assets: ``viz.css`` and ``viz.js`` (beside this module) are
inlined into it. The script gives a hover panel, a per-row contrast stretch (also switched on by opening
the page with ``#stretch``), and ``data-viz-ready="1"`` on <body> once it ran, which the tests check in
headless Chromium.

Modules: :mod:`~recipe.mrtpo.tools.viz.tokens` (token text), :mod:`~recipe.mrtpo.tools.viz.view` (the dump
checked and made ready for display, the weights); this one writes the HTML and is the command line.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import sys
from collections.abc import Sequence
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any, Optional

import torch

from recipe.mrtpo.core.advantage import QBAR_FLOOR
from recipe.mrtpo.step.dump import DumpError, load_dump
from recipe.mrtpo.tools.viz.tokens import sanitize_text
from recipe.mrtpo.tools.viz.view import TOKEN_MODES, DumpView, normalise_dump, row_weights, select_samples

Q_RGB = (230, 85, 13)  # relevance shade (orange)
POS_RGB = (44, 160, 44)  # positive advantage (green)
NEG_RGB = (117, 80, 200)  # negative advantage (purple)
UNIFORM_NOTE = "uniform (not replayed)"
MASKED_NOTE = "masked (not trained)"
#: masked positions of an agent loop's response, by span kind (the dump's ``spans``)
SPAN_NOTES = {"tool": "tool output (not generated: attended, not measured, not trained)",
              "user": "injected user turn (not generated: attended, not measured, not trained)"}
ADV_ZERO = 1e-6  # |advantage| below this is shown as 0
ALPHA_MAX = 0.8  # opacity of the strongest token (text stays readable on it)


@cache
def asset(name: str) -> str:
    """The text of ``viz.css`` / ``viz.js``, shipped beside this module and inlined into every page."""
    return files(__package__).joinpath(name).read_text(encoding="utf-8")


def _esc(s: Any) -> str:
    return html.escape(sanitize_text(s), quote=True)


def _num(x: float) -> str:
    if x != x:
        return "absent"
    return f"{x:.4g}"


def _rgba(rgb: tuple[int, int, int], alpha: float) -> str:
    return f"rgba({rgb[0]},{rgb[1]},{rgb[2]},{alpha:.3f})"


def _span(d: DumpView, i: int, t: int, info: str, cls: str = "tok", shade: Optional[str] = None, data: str = "") -> str:
    """One token of response i as a <span>: escaped text, tooltip (token, raw piece, ``info``), shade."""
    title = f"{_tok_label(d, i, t)}\n{info}"
    shown = d.tokens[i][t]
    if shown == "":
        shown, cls = "∅", cls + " empty"
    elif "\n" in shown:
        shown = shown.replace("\n", "↵\n")
    style = f' style="background-color:{shade}"' if shade else ""
    return f'<span class="{cls}"{style} title="{_esc(title)}"{data}>{_esc(shown)}</span>'


def _tok_label(d: DumpView, i: int, t: int) -> str:
    text, raw = d.tokens[i][t], d.raw_tokens[i][t]
    label = f"token {t}: {json.dumps(text, ensure_ascii=False)}"
    if raw != text:
        label += f" (raw {json.dumps(sanitize_text(raw), ensure_ascii=False)})"
    return label


def _last_valid(mask_row: torch.Tensor) -> int:
    pos = mask_row.nonzero(as_tuple=False)
    return int(pos[-1]) + 1 if pos.numel() else 0


def _masked(d: DumpView, i: int, t: int) -> str:
    """A position the mask leaves out: a tool / user span of an agent loop, or plain masked."""
    kind = d.kinds[i][t] if d.kinds else ""
    if kind in SPAN_NOTES:
        return _span(d, i, t, SPAN_NOTES[kind], f"tok masked span-{kind}", data=f' data-span="{kind}"')
    return _span(d, i, t, MASKED_NOTE, "tok masked")


def _context(d: DumpView, i: int, name: str) -> tuple[str, str]:
    ctx = d.contexts[i].get(name) if isinstance(d.contexts[i], dict) else None
    if isinstance(ctx, dict):
        return sanitize_text(ctx.get("text", "")), sanitize_text(ctx.get("placement", ""))
    if ctx is None:
        return "", ""
    return sanitize_text(ctx), ""


def _reward_row(d: DumpView, i: int, k: int, T_i: int) -> str:
    name = d.names[k]
    score = float(d.scores[i, k])
    replayed = bool(d.replayed[i, k]) and d.relevance is not None
    mask = d.mask[i]
    q = d.relevance[i, k] if d.relevance is not None else torch.zeros(mask.shape[0])
    q = torch.nan_to_num(q, nan=0.0, posinf=0.0, neginf=0.0).clamp(min=0.0)
    w = row_weights(d, i, k)
    valid_q = q[mask]
    qmax = float(valid_q.max()) if valid_q.numel() else 0.0
    qmin = float(valid_q.min()) if valid_q.numel() else 0.0
    qbar = float(valid_q.mean()) if valid_q.numel() else 0.0

    status = []
    if replayed:
        status.append("replayed: yes")
        status.append(f"q̄ {qbar:.3g} · max q {qmax:.3g}")
        if qbar < QBAR_FLOOR:
            status.append("q̄ below floor: uniform fallback")
        cls = "reward-row replayed"
    else:
        status.append("replayed: no")
        reason = "reward absent" if score != score else ("no replay this step" if d.relevance is None else "")
        status.append(UNIFORM_NOTE + (f", {reason}" if reason else ""))
        cls = "reward-row uniform"
        if score != score:
            cls += " absent"
    zk, placement = _context(d, i, name)

    spans = []
    valid, q_l, w_l = mask.tolist(), q.tolist(), w.tolist()
    for t in range(T_i):
        if not valid[t]:
            spans.append(_masked(d, i, t))
            continue
        qt, wt = q_l[t], w_l[t]
        alpha = ALPHA_MAX * qt / qmax if (replayed and qmax > 0) else 0.0
        info = f"q = {qt:.5g}\nw = {wt:.6g}" + ("" if replayed else f"\n{UNIFORM_NOTE}")
        data = f' data-q="{qt:.6g}" data-w="{wt:.6g}" data-alpha="{alpha:.3f}"'
        spans.append(_span(d, i, t, info, "tok", _rgba(Q_RGB, alpha) if alpha > 0 else None, data))
    zk_html = (
        f'<div class="zk"><span class="placement">{_esc(placement or "Z_k")}</span> {_esc(zk)}</div>'
        if zk
        else '<div class="zk none">no Z_k for this sample</div>'
    )
    return (
        f'<div class="row {cls}" data-reward="{_esc(name)}" data-replayed="{int(replayed)}" '
        f'data-qmin="{qmin:.6g}" data-qmax="{qmax:.6g}">'
        f'<div class="label"><div class="rname">{_esc(name)}</div>'
        f'<div class="meta">score <b>{_esc(_num(score))}</b> · {" · ".join(_esc(s) for s in status)}</div>'
        f"{zk_html}</div>"
        f'<div class="toks">{"".join(spans)}</div></div>'
    )


def _adv_row(d: DumpView, i: int, T_i: int) -> str:
    if d.advantages is None:
        return ""
    a = torch.nan_to_num(d.advantages[i], nan=0.0)
    mask = d.mask[i]
    amax = float(a[mask].abs().max()) if mask.any() else 0.0
    flat = amax < ADV_ZERO  # whitening of an all-zero advantage leaves rounding noise: show it as 0
    spans = []
    valid, a_l = mask.tolist(), a.tolist()
    for t in range(T_i):
        if not valid[t]:
            spans.append(_masked(d, i, t))
            continue
        at = a_l[t]
        alpha = 0.0 if flat else ALPHA_MAX * abs(at) / amax
        shade = _rgba(POS_RGB if at >= 0 else NEG_RGB, alpha) if alpha > 0 else None
        spans.append(_span(d, i, t, f"advantage = {at:.5g}", "tok", shade, f' data-adv="{at:.6g}"'))
    return (
        '<div class="row adv-row"><div class="label"><div class="rname">advantage</div>'
        f'<div class="meta">final token advantage (whitened) · '
        f'{"all ≈ 0 (no signal in this response)" if flat else f"max |adv| {amax:.3g}"}</div></div>'
        f'<div class="toks">{"".join(spans)}</div></div>'
    )


def _sample_block(d: DumpView, i: int) -> str:
    T_i = _last_valid(d.mask[i])
    chips = []
    for k, name in enumerate(d.names):
        s = float(d.scores[i, k])
        cls = "chip absent" if s != s else "chip"
        chips.append(f'<span class="{cls}">{_esc(name)}: <b>{_esc(_num(s))}</b></span>')
    rows = "".join(_reward_row(d, i, k, T_i) for k in range(len(d.names)))
    return (
        f'<section class="sample" data-sample="{i}" data-uid="{_esc(d.uids[i])}">'
        f'<h2>Sample {i} <span class="uid">uid {_esc(d.uids[i])}</span> '
        f'<span class="ntok">{int(d.mask[i].sum())} tokens</span></h2>'
        f'<div class="chips">{"".join(chips)}</div>{rows}{_adv_row(d, i, T_i)}</section>'
    )


def render_html(d: DumpView, max_samples: Optional[int] = None, only_replayed: bool = False) -> str:
    """The whole page for dump ``d``: the first ``max_samples`` responses (all when None), optionally only
    those with at least one replayed reward."""
    n = d.scores.shape[0]
    shown = select_samples(d, max_samples, only_replayed)
    m = len(shown)
    step = "?" if d.step is None else str(d.step)
    rho = "none (disabled)" if d.rho is None else f"{d.rho:g}"
    if d.cap is not None:
        rho += f" · token weight cap {d.cap:g}"
    notes = list(d.notes)
    if d.shuffle:
        notes.append("shuffle ablation: the trainer permuted q before weighting; shown are the unshuffled q")
    notes_html = "".join(f'<div class="notes">{_esc(x)}</div>' for x in notes)
    metric_rows = "".join(
        f"<tr><td>{_esc(k)}</td><td>{_esc(f'{v:.6g}' if isinstance(v, float) else v)}</td></tr>"
        for k, v in sorted(d.metrics.items(), key=lambda kv: str(kv[0]))
    )
    metrics_html = f"<details><summary>metrics ({len(d.metrics)})</summary><table>{metric_rows}</table></details>" if d.metrics else ""
    blocks = "".join(_sample_block(d, i) for i in shown)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>MRTPO relevance · step {_esc(step)}</title>
<style>
{asset("viz.css")}</style></head>
<body>
<h1>MRTPO token relevance · step {_esc(step)}</h1>
<div class="summary">beta<sub>s</sub> <b>{d.beta:g}</b> · rho <b>{_esc(rho)}</b> · showing <b>{m}</b> of {n} responses{" (replayed only)" if only_replayed else ""} ·
{len(d.names)} rewards · source <code>{_esc(d.source)}</code> · <span id="viz-status">script not run</span></div>
{notes_html}
<div class="legend">
<span>relevance q<sub>k,t</sub>: 0<span class="bar q"></span>max<sub>t</sub> q of the row (opacity &prop; q / max q)</span>
<span>advantage: &minus;max<span class="bar adv"></span>+max |adv| of the response</span>
<span><span class="tok masked span-tool">tool output</span> <span class="tok masked span-user">user turn</span>: agent-loop text the model did not generate (not measured)</span>
<span>hover a token: q, w = (1&minus;&beta;) + &beta;&middot;q/q&#772; (RMS(w&minus;1) &le; &rho;)</span>
<label id="viz-stretch-box"><input type="checkbox" id="viz-stretch"> stretch contrast per row: (q &minus; min q) / (max q &minus; min q)</label>
</div>
{metrics_html}
{blocks}
<div id="viz-info">hover a token for its q and weight</div>
<script>var AMAX={ALPHA_MAX},QRGB="{Q_RGB[0]},{Q_RGB[1]},{Q_RGB[2]}";
{asset("viz.js")}</script>
</body></html>
"""


def render_dump(path: str | Path, step: Optional[int] = None, max_samples: Optional[int] = None,
                rho: Any = "dump", tokens: str = "auto", only_replayed: bool = False) -> tuple[str, DumpView, Path]:
    """Load, check and render: (html, dump, dump file). Arguments as in :func:`main`."""
    raw, f = load_dump(path, step)
    d = normalise_dump(raw, source=str(f), rho=rho, tokens=tokens)
    return render_html(d, max_samples, only_replayed), d, f


def _rho_arg(s: str) -> Optional[float]:
    if s.lower() in ("none", "null", "off"):
        return None
    try:
        v = float(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--rho takes a number >= 0 or 'none', got {s!r}") from e
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"--rho takes a number >= 0 or 'none', got {s!r}")
    return v


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m recipe.mrtpo.tools.viz", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dump", help="a step_XXXXXX.pt relevance dump, or a folder of them (the latest is shown)")
    ap.add_argument("--out", help="HTML file to write (default: the dump's name with .html, beside it)")
    ap.add_argument("--step", type=int, help="with a folder: the step to show (default: the latest)")
    ap.add_argument("--max-samples", type=int, help="show the first M responses (default: all in the dump)")
    ap.add_argument("--only-replayed", action="store_true",
                    help="show only responses with at least one replayed reward")
    ap.add_argument("--rho", type=_rho_arg, default=argparse.SUPPRESS,
                    help="rho of the RMS constraint for the weights (default: from the dump, else 1.0; 'none' disables)")
    ap.add_argument("--tokens", choices=TOKEN_MODES, default="auto",
                    help="token strings: decoded text, raw byte-level BPE pieces ('Ġword'), or auto-detect")
    args = ap.parse_args(argv)
    if args.max_samples is not None and args.max_samples < 1:
        ap.error("--max-samples must be >= 1")
    try:
        page, d, f = render_dump(args.dump, args.step, args.max_samples, getattr(args, "rho", "dump"), args.tokens,
                                  args.only_replayed)
    except DumpError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else f.with_suffix(".html")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    n = len(select_samples(d, args.max_samples, args.only_replayed))
    print(f"wrote {out} (step {d.step}, {n} responses, {len(d.names)} rewards)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
