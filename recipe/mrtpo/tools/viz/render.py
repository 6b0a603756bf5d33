"""Per-token relevance heatmap of a trainer relevance dump, as one self-contained HTML page.

    python -m recipe.mrtpo.tools.viz DUMP [--out FILE.html] [--step N] [--max-samples M] [--only-replayed]
                                    [--rho R|none] [--tokens auto|bytelevel|text]

DUMP is a ``step_XXXXXX.pt`` written by the trainer (``mrtpo.dump``, see ``MRTPOTrainer._maybe_dump``)
or a folder of them (the latest step is shown, or ``--step N``). The page has one block per sampled
response: its uid and per-reward scores, then one row per reward (name, its verifier information Z_k,
score, replayed yes/no) in which every response token is shaded by the replay relevance q_{k,t}
(opacity = q / max_t q of that row), plus a row of the final token advantage. Hovering a token shows
the token, q and the weight the trainer gave it, w = (1 - beta) + beta * q / qbar under the RMS
constraint rho, computed by :func:`recipe.mrtpo.core.advantage.relevance_weights` itself. Rows that were not
replayed are greyed and marked "uniform (not replayed)".

Everything in a dump that came from the model or a dataset (tokens, Z_k, uids, reward names) is
treated as hostile: it is sanitised (lone surrogates, control and bidi characters made visible) and
HTML-escaped. The page has no external assets: inline CSS and a few lines of inline JS (hover panel,
a per-row contrast stretch, also switched on by opening the page with ``#stretch``, and
``data-viz-ready="1"`` on <body> once the script ran, which the tests check in headless Chromium).
"""

from __future__ import annotations

import argparse
import html
import json
import math
import sys
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from recipe.mrtpo.core.advantage import QBAR_FLOOR, relevance_weights
from recipe.mrtpo.dump import DumpError, as_tensor, check_dump, load_dump

TOKEN_MODES = ("auto", "bytelevel", "text")
Q_RGB = (230, 85, 13)  # relevance shade (orange)
POS_RGB = (44, 160, 44)  # positive advantage (green)
NEG_RGB = (117, 80, 200)  # negative advantage (purple)
UNIFORM_NOTE = "uniform (not replayed)"
MASKED_NOTE = "masked (not trained)"
ADV_ZERO = 1e-6  # |advantage| below this is shown as 0
ALPHA_MAX = 0.8  # opacity of the strongest token (text stays readable on it)


# ----------------------------------------------------------------------------------------------
# Token text
# ----------------------------------------------------------------------------------------------
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2 / Qwen2 byte-level BPE alphabet: byte -> printable unicode character."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


_BYTE_OF = {c: b for b, c in _bytes_to_unicode().items()}
_SHIFTED = {c for c, b in _BYTE_OF.items() if ord(c) >= 256}  # 'Ġ' (space), 'Ċ' (newline), ...


def looks_byte_level(tokens: Sequence[Sequence[Any]]) -> bool:
    """True when every token is made of byte-level BPE characters and some use the shifted range ('Ġ', 'Ċ').

    Decoded text almost always holds a plain space (not in that alphabet) or a character outside it.
    """
    shifted = False
    for row in tokens:
        for tok in row:
            if not isinstance(tok, str):
                return False
            for ch in tok:
                if ch not in _BYTE_OF:
                    return False
                shifted = shifted or ch in _SHIFTED
    return shifted


def decode_byte_level(piece: str) -> str:
    """A raw byte-level BPE piece ('Ġword', 'Ċ', 'Ã©') as text; partial UTF-8 becomes U+FFFD."""
    if any(ch not in _BYTE_OF for ch in piece):
        return piece
    return bytes(_BYTE_OF[ch] for ch in piece).decode("utf-8", errors="replace")


def sanitize_text(s: Any) -> str:
    """Any value as printable text: valid UTF-8, controls and format characters shown as escapes.

    Keeps newlines and tabs; lone surrogates become U+FFFD; C0/C1 controls, bidi overrides and other
    format characters (Unicode category Cc/Cf) become visible ``\\xNN`` / ``\\uNNNN``.
    """
    if isinstance(s, bytes):
        s = s.decode("utf-8", errors="replace")
    elif not isinstance(s, str):
        s = str(s)
    s = s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    out = []
    for ch in s:
        if ch in "\n\t":
            out.append(ch)
        elif unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn") and ch != "\ufffd":
            cp = ord(ch)
            out.append(f"\\x{cp:02x}" if cp < 0x100 else f"\\u{cp:04x}" if cp < 0x10000 else f"\\U{cp:08x}")
        else:
            out.append(ch)
    return "".join(out)


def _esc(s: Any) -> str:
    return html.escape(sanitize_text(s), quote=True)


# ----------------------------------------------------------------------------------------------
# The dump, checked
# ----------------------------------------------------------------------------------------------
@dataclass
class Dump:
    """A relevance dump with shapes checked and defaults filled; ``tokens`` is display text."""

    step: Optional[int]
    beta: float
    rho: Optional[float]
    names: list[str]
    uids: list[str]
    scores: torch.Tensor  # [n, K] float, NaN = absent
    replayed: torch.Tensor  # [n, K] bool
    relevance: Optional[torch.Tensor]  # [n, K, T] float
    advantages: Optional[torch.Tensor]  # [n, T] float
    mask: torch.Tensor  # [n, T] bool
    tokens: list[list[str]]  # [n][T] display text
    raw_tokens: list[list[str]]  # [n][T] as in the dump
    contexts: list[dict]
    metrics: dict
    shuffle: Optional[bool] = None
    source: str = ""
    notes: list[str] = field(default_factory=list)


def resolve_rho(raw: dict, override: Any = "dump") -> Optional[float]:
    """rho of the RMS constraint: ``override`` (a number, or None = disabled) if given, else the dump's
    ``max_realloc_rms`` (None = disabled), else metric ``mrtpo/max_realloc_rms``, else 1.0 (the default)."""
    if override != "dump":
        return None if override is None else float(override)
    if "max_realloc_rms" in raw:
        v = raw["max_realloc_rms"]
        return None if v is None else float(v)
    v = (raw.get("metrics") or {}).get("mrtpo/max_realloc_rms")
    if isinstance(v, (int, float)) and math.isfinite(v) and v >= 0:
        return float(v)
    return 1.0


def normalise_dump(raw: dict, source: str = "", rho: Any = "dump", tokens: str = "auto") -> Dump:
    """Check a raw dump dict and fill what is optional; raises :class:`DumpError` with the reason."""
    if tokens not in TOKEN_MODES:
        raise DumpError(f"tokens must be one of {TOKEN_MODES}, got {tokens!r}")
    checked = check_dump(raw)
    names = [sanitize_text(n) for n in raw["reward_names"]]
    scores, mask, replayed = checked["scores"], checked["mask"], checked["replayed"]
    relevance, advantages = checked["relevance"], checked["advantages"]
    n, T = mask.shape

    raw_tokens = raw.get("response_tokens")
    if raw_tokens is None:
        ids = raw.get("response_ids")
        if ids is None:
            raise DumpError("dump has neither 'response_tokens' nor 'response_ids'")
        ids = as_tensor(ids, "response_ids", torch.long)
        raw_tokens = [[f"⟨{int(t)}⟩" for t in row.tolist()] for row in ids]
        tokens = "text"
    if len(raw_tokens) != n:
        raise DumpError(f"response_tokens has {len(raw_tokens)} rows for {n} samples")
    raw_tokens = [[t if isinstance(t, str) else sanitize_text(t) for t in list(row)[:T]] for row in raw_tokens]
    raw_tokens = [row + [""] * (T - len(row)) for row in raw_tokens]
    byte_level = tokens == "bytelevel" or (tokens == "auto" and looks_byte_level(raw_tokens))
    shown = [[sanitize_text(decode_byte_level(t) if byte_level else t) for t in row] for row in raw_tokens]

    beta = raw.get("beta", (raw.get("metrics") or {}).get("mrtpo/beta", 0.0))
    try:
        beta = float(beta)
    except (TypeError, ValueError) as e:
        raise DumpError(f"beta is not a number: {beta!r}") from e
    if not 0.0 <= beta <= 1.0:
        raise DumpError(f"beta must be in [0, 1], got {beta}")
    rho_v = resolve_rho(raw, rho)
    if rho_v is not None and (not math.isfinite(rho_v) or rho_v < 0):
        raise DumpError(f"rho (max_realloc_rms) must be >= 0, got {rho_v}")

    uids = raw.get("uid")
    uids = [str(i) for i in range(n)] if uids is None else list(uids)
    uids = [sanitize_text(u) for u in uids[:n]] + [""] * max(0, n - len(uids))
    contexts = list(raw.get("contexts") or [])
    contexts = [c if isinstance(c, dict) else {} for c in contexts[:n]] + [{}] * max(0, n - len(contexts))
    metrics = raw.get("metrics") if isinstance(raw.get("metrics"), dict) else {}
    step = raw.get("step")
    notes = []
    if byte_level:
        notes.append("tokens are raw byte-level BPE pieces, decoded for display (tooltips show the raw piece)")
    if relevance is None:
        notes.append("no replay at this step (relevance is None): every row is uniform")
    return Dump(
        step=None if step is None else int(step), beta=beta, rho=rho_v, names=names, uids=uids, scores=scores,
        replayed=replayed, relevance=relevance, advantages=advantages, mask=mask, tokens=shown,
        raw_tokens=raw_tokens, contexts=contexts, metrics=metrics,
        shuffle=raw.get("shuffle") if isinstance(raw.get("shuffle"), bool) else None, source=source, notes=notes,
    )


def row_weights(d: Dump, i: int, k: int) -> torch.Tensor:
    """w_{i,k,t} as the trainer computed it: :func:`relevance_weights` of row (i, k), [T] (1 where uniform)."""
    if d.relevance is None:
        return d.mask[i].to(torch.float32)
    return relevance_weights(d.relevance[i : i + 1, k], d.mask[i : i + 1], d.beta, d.rho)[0]


# ----------------------------------------------------------------------------------------------
# HTML
# ----------------------------------------------------------------------------------------------
def _num(x: float) -> str:
    if x != x:
        return "absent"
    return f"{x:.4g}"


def _rgba(rgb: tuple[int, int, int], alpha: float) -> str:
    return f"rgba({rgb[0]},{rgb[1]},{rgb[2]},{alpha:.3f})"


def _span(d: Dump, i: int, t: int, info: str, cls: str = "tok", shade: Optional[str] = None, data: str = "") -> str:
    """One token of response i as a <span>: escaped text, tooltip (token, raw piece, ``info``), shade."""
    title = f"{_tok_label(d, i, t)}\n{info}"
    shown = d.tokens[i][t]
    if shown == "":
        shown, cls = "∅", cls + " empty"
    elif "\n" in shown:
        shown = shown.replace("\n", "↵\n")
    style = f' style="background-color:{shade}"' if shade else ""
    return f'<span class="{cls}"{style} title="{_esc(title)}"{data}>{_esc(shown)}</span>'


def _tok_label(d: Dump, i: int, t: int) -> str:
    text, raw = d.tokens[i][t], d.raw_tokens[i][t]
    label = f"token {t}: {json.dumps(text, ensure_ascii=False)}"
    if raw != text:
        label += f" (raw {json.dumps(sanitize_text(raw), ensure_ascii=False)})"
    return label


def _last_valid(mask_row: torch.Tensor) -> int:
    pos = mask_row.nonzero(as_tuple=False)
    return int(pos[-1]) + 1 if pos.numel() else 0


def _context(d: Dump, i: int, name: str) -> tuple[str, str]:
    ctx = d.contexts[i].get(name) if isinstance(d.contexts[i], dict) else None
    if isinstance(ctx, dict):
        return sanitize_text(ctx.get("text", "")), sanitize_text(ctx.get("placement", ""))
    if ctx is None:
        return "", ""
    return sanitize_text(ctx), ""


def _reward_row(d: Dump, i: int, k: int, T_i: int) -> str:
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
            spans.append(_span(d, i, t, MASKED_NOTE, "tok masked"))
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


def _adv_row(d: Dump, i: int, T_i: int) -> str:
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
            spans.append(_span(d, i, t, MASKED_NOTE, "tok masked"))
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


def _sample_block(d: Dump, i: int) -> str:
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


CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 "DejaVu Sans","Liberation Sans",Arial,sans-serif;margin:0;padding:16px 20px 72px;color:#222;background:#fff}
h1{font-size:20px;margin:0 0 6px} h2{font-size:15px;margin:0 0 6px}
.summary{color:#444;margin-bottom:8px} .summary b{color:#111}
.notes{background:#fff8e1;border:1px solid #f0d98c;padding:4px 8px;margin:6px 0;border-radius:4px;font-size:13px}
.legend{display:flex;flex-wrap:wrap;gap:22px;align-items:center;margin:10px 0 14px;font-size:13px}
.bar{display:inline-block;width:180px;height:14px;vertical-align:middle;border:1px solid #bbb;margin:0 6px}
.bar.q{background:linear-gradient(to right,rgba(230,85,13,0),rgba(230,85,13,.8))}
.bar.adv{background:linear-gradient(to right,rgba(117,80,200,.8),rgba(117,80,200,0) 50%,rgba(44,160,44,0) 50%,rgba(44,160,44,.8))}
#viz-stretch-box{display:none}
.sample{border:1px solid #d7d7d7;border-radius:6px;padding:10px 12px;margin:0 0 14px;background:#fcfcfc}
.uid{font-weight:normal;color:#666;font-family:"DejaVu Sans Mono",monospace;font-size:12px}
.ntok{font-weight:normal;color:#888;font-size:12px;margin-left:6px}
.chips{margin-bottom:8px}
.chip{display:inline-block;border:1px solid #ccc;border-radius:10px;padding:0 8px;margin:0 6px 4px 0;font-size:12px;background:#fff}
.chip.absent{color:#999;border-style:dashed}
.row{display:grid;grid-template-columns:320px 1fr;gap:10px;padding:6px 0;border-top:1px solid #eee}
.label{font-size:12px;overflow-wrap:anywhere}
.rname{font-weight:bold;font-size:13px;font-family:"DejaVu Sans Mono",monospace}
.meta{color:#555}
.zk{color:#333;font-style:italic;margin-top:2px;white-space:pre-wrap}
.zk.none{color:#aaa}
.placement{font-style:normal;font-size:10px;text-transform:uppercase;background:#eef;border:1px solid #ccd;border-radius:3px;padding:0 3px;color:#446}
.toks{font-family:"DejaVu Sans Mono","Liberation Mono",monospace;font-size:13px;line-height:1.9;white-space:pre-wrap;overflow-wrap:anywhere}
.tok{border-radius:2px;box-shadow:inset -1px 0 0 rgba(0,0,0,.10);padding:1px 0;cursor:default}
.tok:hover{outline:2px solid #333}
.tok.masked{color:#bbb;text-decoration:line-through}
.tok.empty{color:#aaa}
.uniform .toks,.uniform .label{color:#9a9a9a}
.uniform{background:repeating-linear-gradient(135deg,#f6f6f6 0 6px,#fafafa 6px 12px)}
.adv-row .rname{color:#555}
#viz-info{position:fixed;left:0;right:0;bottom:0;background:#222;color:#eee;font:12px/1.4 "DejaVu Sans Mono",monospace;padding:6px 12px;white-space:pre-wrap;min-height:2.2em;max-height:6em;overflow:auto}
details{margin:6px 0} table{border-collapse:collapse;font-size:12px} td{padding:1px 8px;border-bottom:1px solid #eee}
"""

JS = """
(function(){
  var errs=[];
  window.addEventListener('error',function(e){errs.push(String(e.message));
    document.body.setAttribute('data-viz-errors',errs.join(' | '));});
  function init(){
    var toks=document.querySelectorAll('.tok');
    var info=document.getElementById('viz-info');
    document.addEventListener('mouseover',function(ev){
      var t=ev.target&&ev.target.closest?ev.target.closest('.tok'):null;
      if(!t)return;
      var row=t.closest('.row'),r=row?row.getAttribute('data-reward'):null;
      info.textContent=(r?('reward '+r+'\\n'):'')+t.getAttribute('title');
    });
    var box=document.getElementById('viz-stretch');
    box.addEventListener('change',function(){
      document.querySelectorAll('.reward-row.replayed').forEach(function(row){
        var lo=parseFloat(row.getAttribute('data-qmin')),hi=parseFloat(row.getAttribute('data-qmax'));
        row.querySelectorAll('.tok[data-q]').forEach(function(t){
          var a=parseFloat(t.getAttribute('data-alpha'));
          if(box.checked){var q=parseFloat(t.getAttribute('data-q'));a=hi>lo?AMAX*(q-lo)/(hi-lo):0;}
          t.style.backgroundColor=a>0?('rgba('+QRGB+','+a.toFixed(3)+')'):'';
        });
      });
    });
    document.getElementById('viz-stretch-box').style.display='inline';
    if(location.hash==='#stretch'){box.checked=true;box.dispatchEvent(new Event('change'));}
    document.getElementById('viz-status').textContent=toks.length+' token spans';
    document.body.setAttribute('data-viz-tokens',String(toks.length));
    document.body.setAttribute('data-viz-ready','1');
  }
  if(document.readyState==='loading'){document.addEventListener('DOMContentLoaded',init);}else{init();}
})();
"""


def select_samples(d: Dump, max_samples: Optional[int] = None, only_replayed: bool = False) -> list[int]:
    """Dump indices to show: in dump order, those with a replayed row if ``only_replayed``, at most ``max_samples``."""
    idx = [i for i in range(d.scores.shape[0]) if not only_replayed or bool(d.replayed[i].any())]
    return idx if max_samples is None else idx[: max(0, int(max_samples))]


def render_html(d: Dump, max_samples: Optional[int] = None, only_replayed: bool = False) -> str:
    """The whole page for dump ``d``: the first ``max_samples`` responses (all when None), optionally only
    those with at least one replayed reward."""
    n = d.scores.shape[0]
    shown = select_samples(d, max_samples, only_replayed)
    m = len(shown)
    step = "?" if d.step is None else str(d.step)
    rho = "none (disabled)" if d.rho is None else f"{d.rho:g}"
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
<style>{CSS}</style></head>
<body>
<h1>MRTPO token relevance · step {_esc(step)}</h1>
<div class="summary">beta<sub>s</sub> <b>{d.beta:g}</b> · rho <b>{_esc(rho)}</b> · showing <b>{m}</b> of {n} responses{" (replayed only)" if only_replayed else ""} ·
{len(d.names)} rewards · source <code>{_esc(d.source)}</code> · <span id="viz-status">script not run</span></div>
{notes_html}
<div class="legend">
<span>relevance q<sub>k,t</sub>: 0<span class="bar q"></span>max<sub>t</sub> q of the row (opacity &prop; q / max q)</span>
<span>advantage: &minus;max<span class="bar adv"></span>+max |adv| of the response</span>
<span>hover a token: q, w = (1&minus;&beta;) + &beta;&middot;q/q&#772; (RMS(w&minus;1) &le; &rho;)</span>
<label id="viz-stretch-box"><input type="checkbox" id="viz-stretch"> stretch contrast per row: (q &minus; min q) / (max q &minus; min q)</label>
</div>
{metrics_html}
{blocks}
<div id="viz-info">hover a token for its q and weight</div>
<script>var AMAX={ALPHA_MAX},QRGB="{Q_RGB[0]},{Q_RGB[1]},{Q_RGB[2]}";{JS}</script>
</body></html>
"""


def render_dump(path: str | Path, step: Optional[int] = None, max_samples: Optional[int] = None,
                rho: Any = "dump", tokens: str = "auto", only_replayed: bool = False) -> tuple[str, Dump, Path]:
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
