"""The relevance heatmap page (recipe/mrtpo/tools/viz/: render.py, view.py, tokens.py, viz.css, viz.js):
structure, exact weights, escaping, loading, CLI, and a real render in headless Chromium (screenshot +
script ran without errors).

The sample dump tests/data/relevance_dump.pt is a real trainer dump (step 2 of the tiny-model run, raw
byte-level BPE tokens, 16 responses, 4 rewards); the hostile dump is made here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch

from recipe.mrtpo.core.advantage import relevance_weights
from recipe.mrtpo.step.dump import DumpError, load_dump
from recipe.mrtpo.tools.viz import render as viz
from recipe.mrtpo.tools.viz.tokens import decode_byte_level, looks_byte_level, sanitize_text
from recipe.mrtpo.tools.viz.view import normalise_dump, row_weights

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "relevance_dump.pt"
VOID = {"meta", "br", "input", "img", "link", "hr", "wbr", "source", "area", "base", "col", "embed", "param", "track"}
ALPHA = re.compile(r"background-color:\s*rgba\(\s*\d+\s*,\s*\d+\s*,\s*\d+\s*,\s*([0-9.]+)\s*\)")
HOSTILE_TOKEN = "<script>alert(1)</script>"


# ----------------------------------------------------------------------------------------------
# A small DOM from the stdlib parser
# ----------------------------------------------------------------------------------------------
class Node:
    def __init__(self, tag: str, attrs: dict, parent: Node | None):
        self.tag, self.attrs, self.parent, self.children = tag, attrs, parent, []

    @property
    def classes(self) -> set:
        return set((self.attrs.get("class") or "").split())

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def find_all(self, pred) -> list[Node]:
        out = []
        for c in self.children:
            if isinstance(c, Node):
                if pred(c):
                    out.append(c)
                out.extend(c.find_all(pred))
        return out

    def by_class(self, cls: str) -> list[Node]:
        return self.find_all(lambda n: cls in n.classes)


class TreeBuilder(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Node("#root", {}, None)
        self.cur = self.root
        self.tags: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        node = Node(tag, dict(attrs), self.cur)
        self.cur.children.append(node)
        if tag not in VOID:
            self.cur = node

    def handle_startendtag(self, tag, attrs):
        self.tags.append(tag)
        self.cur.children.append(Node(tag, dict(attrs), self.cur))

    def handle_endtag(self, tag):
        n = self.cur
        while n is not None and n.tag != tag:
            n = n.parent
        assert n is not None and n.parent is not None, f"unbalanced </{tag}>"
        self.cur = n.parent

    def handle_data(self, data):
        self.cur.children.append(data)


def parse(page: str) -> TreeBuilder:
    p = TreeBuilder()
    p.feed(page)
    p.close()
    assert p.cur is p.root, f"unclosed <{p.cur.tag}>"
    return p


def alpha_of(span: Node) -> float:
    m = ALPHA.search(span.attrs.get("style") or "")
    return float(m.group(1)) if m else 0.0


def value_in_title(span: Node, name: str) -> float:
    m = re.search(rf"^{name} = (\S+)$", span.attrs["title"], re.M)
    assert m, span.attrs["title"]
    return float(m.group(1))


@pytest.fixture(scope="module")
def sample_raw() -> dict:
    assert SAMPLE.is_file(), f"missing {SAMPLE} (the sample dump shipped with the tests)"
    return torch.load(SAMPLE, weights_only=True)


@pytest.fixture(scope="module")
def sample_page(sample_raw):
    d = normalise_dump(sample_raw, source=str(SAMPLE))
    return viz.render_html(d), d


def hostile_dump() -> dict:
    """Two responses of one group, 2 rewards, every text field hostile."""
    T = 7
    g = torch.Generator().manual_seed(0)
    rel = torch.rand(2, 2, T, generator=g)
    rel[0, 1] = 0.0  # not replayed: the trainer leaves 0
    return {
        "step": 7,
        "beta": 0.5,
        "reward_names": ["fmt<i>x</i>", "match"],
        "uid": ['<img src=x onerror="alert(3)">', '<img src=x onerror="alert(3)">'],
        "scores": torch.tensor([[1.0, 0.0], [0.0, 1.0]]),
        "replayed": torch.tensor([[True, False], [True, True]]),
        "relevance": rel,
        "advantages": torch.randn(2, T, generator=g),
        "response_mask": torch.tensor([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0]]),
        "response_ids": torch.arange(2 * T).view(2, T),
        "response_tokens": [
            ["Hi", HOSTILE_TOKEN, '" onmouseover="alert(2)', "\x00\u202e\x1b[31m", "\ud800", "&amp;", "a\nb"],
            ["</span></div>", "'", "<!--", "ok", "pad", "pad", "pad"],
        ],
        "contexts": [
            {"fmt<i>x</i>": {"text": "Use <b>bold</b> & \"quotes\"", "placement": "prompt"}},
            {"fmt<i>x</i>": {"text": "Use <b>bold</b> & \"quotes\"", "placement": "prompt"},
             "match": {"text": "</script><script>alert(4)</script>", "placement": "appended"}},
        ],
        "metrics": {"mrtpo/beta": 0.5, "<evil>": 1.0},
    }


# ----------------------------------------------------------------------------------------------
# (1) The page's structure on the real sample
# ----------------------------------------------------------------------------------------------
def test_one_block_per_sample_and_one_row_per_reward(sample_page, sample_raw):
    page, d = sample_page
    root = parse(page).root
    samples = root.by_class("sample")
    n, K = sample_raw["scores"].shape
    assert len(samples) == n == 16
    for i, sec in enumerate(samples):
        assert sec.attrs["data-uid"] == sample_raw["uid"][i]
        assert sample_raw["uid"][i] in sec.text()
        rows = sec.by_class("reward-row")
        assert [r.attrs["data-reward"] for r in rows] == list(sample_raw["reward_names"])
        chips = sec.by_class("chip")
        assert len(chips) == K
        for k, chip in enumerate(chips):
            s = float(sample_raw["scores"][i, k])
            assert chip.text().endswith("absent" if s != s else f"{s:.4g}")
        assert len(sec.by_class("adv-row")) == 1


def test_replayed_rows_are_shaded_by_q_and_weights_are_the_trainers(sample_page, sample_raw):
    page, d = sample_page
    root = parse(page).root
    mask = sample_raw["response_mask"].bool()
    rel = sample_raw["relevance"]
    beta = float(sample_raw["beta"])
    n_replayed = 0
    for i, sec in enumerate(root.by_class("sample")):
        for k, row in enumerate(sec.by_class("reward-row")):
            spans = [s for s in row.by_class("tok") if "masked" not in s.classes]
            assert len(spans) == int(mask[i].sum())
            if bool(sample_raw["replayed"][i, k]):
                n_replayed += 1
                assert "replayed" in row.classes and "uniform" not in row.classes
                assert "replayed: yes" in row.text()
                q = rel[i, k][mask[i]]
                alphas = torch.tensor([alpha_of(s) for s in spans])
                assert (alphas > 0).any(), "a replayed row must be shaded"
                assert float(alphas.max()) == pytest.approx(viz.ALPHA_MAX, abs=1e-3)
                assert torch.allclose(alphas, viz.ALPHA_MAX * q / q.max(), atol=2e-3)
                want_w = relevance_weights(rel[i : i + 1, k], mask[i : i + 1], beta, 1.0)[0][mask[i]]
                got_w = torch.tensor([float(s.attrs["data-w"]) for s in spans])
                assert torch.allclose(got_w, want_w, rtol=1e-5, atol=1e-6)
                assert torch.allclose(torch.tensor([value_in_title(s, "w") for s in spans]), want_w, atol=1e-5)
                assert torch.allclose(torch.tensor([value_in_title(s, "q") for s in spans]), q, rtol=1e-4, atol=1e-9)
                assert float(got_w.mean()) == pytest.approx(1.0, abs=1e-5)
                assert not torch.allclose(got_w, torch.ones_like(got_w)), "beta > 0 and non-flat q: weights move"
            else:
                assert "uniform" in row.classes and "replayed" not in row.classes
                assert viz.UNIFORM_NOTE in row.text()
                assert all(alpha_of(s) == 0 for s in spans)
                assert all(float(s.attrs["data-w"]) == 1.0 for s in spans)
    assert n_replayed == int(sample_raw["replayed"].sum()) == 16


def test_tokens_are_decoded_and_zk_is_next_to_its_row(sample_page, sample_raw):
    page, d = sample_page
    root = parse(page).root
    sec = root.by_class("sample")[0]
    row = sec.by_class("reward-row")[1]  # keywords:letter_frequency
    assert sample_raw["contexts"][0]["keywords:letter_frequency"]["text"] in row.by_class("zk")[0].text()
    first = row.by_class("tok")[0]
    assert sample_raw["response_tokens"][0][0] == "Ġtuyá»ĩt"
    assert first.text() == " tuyệt"
    assert '"Ġtuyá»ĩt"' in first.attrs["title"]


def test_page_is_self_contained(sample_page):
    page, _ = sample_page
    p = parse(page)
    assert "link" not in p.tags and "img" not in p.tags and "iframe" not in p.tags
    scripts = p.root.find_all(lambda n: n.tag == "script")
    assert len(scripts) == 1 and "src" not in scripts[0].attrs
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page)
    assert "url(" not in page and "@import" not in page
    # the stylesheet and the script shipped beside the viewer are inlined whole
    viz_dir = Path(viz.__file__).parent
    css, js = (viz_dir / "viz.css").read_text(encoding="utf-8"), (viz_dir / "viz.js").read_text(encoding="utf-8")
    assert css.strip() and js.strip() and css in page and js in page
    assert viz.asset("viz.css") == css and viz.asset("viz.js") == js


# ----------------------------------------------------------------------------------------------
# Hostile text
# ----------------------------------------------------------------------------------------------
def test_hostile_text_is_escaped():
    d = normalise_dump(hostile_dump(), source="<x>")
    page = viz.render_html(d)
    page.encode("utf-8")  # a lone surrogate in a token must not make the page unwritable
    assert "<script>alert" not in page and "alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;b&gt;bold&lt;/b&gt;" in page and "<b>bold" not in page
    p = parse(page)
    assert p.tags.count("script") == 1, "only the page's own script"
    assert "img" not in p.tags and "i" not in p.tags
    assert not p.root.find_all(lambda n: any(a.startswith("on") for a in n.attrs))
    root = p.root
    sec0, sec1 = root.by_class("sample")
    assert sec0.attrs["data-uid"] == '<img src=x onerror="alert(3)">'
    toks = sec0.by_class("reward-row")[0].by_class("tok")
    assert toks[1].text() == HOSTILE_TOKEN  # shown as text, round-trips through the parser
    assert toks[2].text() == '" onmouseover="alert(2)'
    assert toks[3].text() == "\\x00\\u202e\\x1b[31m"  # controls and bidi overrides made visible
    assert toks[4].text() == "\ufffd"
    assert toks[5].text() == "&amp;"
    assert toks[6].text() == "a↵\nb"
    zk = sec0.by_class("zk")[0].text()
    assert 'Use <b>bold</b> & "quotes"' in zk
    assert "</script><script>alert(4)</script>" in sec1.by_class("reward-row")[1].by_class("zk")[0].text()
    assert [r.attrs["data-reward"] for r in sec1.by_class("reward-row")] == ["fmt<i>x</i>", "match"]
    # the second response has 4 valid tokens: padding after them is not drawn
    assert len(sec1.by_class("reward-row")[0].by_class("tok")) == 4


def test_sanitize_never_raises_on_odd_input():
    for s in ["\ud83d\ude00", "\udc80abc", "\x7f\x85\u200b\u2066", b"\xff\xfe", 12, None, "\U0010ffff", ""]:
        out = sanitize_text(s)
        out.encode("utf-8")
    assert sanitize_text("\ud83d\ude00") == "😀"  # a surrogate pair is joined, not broken
    assert sanitize_text("tab\tnl\n") == "tab\tnl\n"


def test_byte_level_detection_and_decoding():
    assert decode_byte_level("Ġword") == " word"
    assert decode_byte_level("Ċ") == "\n"
    assert decode_byte_level("Ã©") == "é"
    assert decode_byte_level("á»") == "\ufffd"  # a partial UTF-8 sequence
    assert looks_byte_level([["Ġthe", "Ġcat"], ["ĊĊ"]])
    assert not looks_byte_level([[" the", " cat"]])  # decoded text has plain spaces
    assert not looks_byte_level([["猫", "Ġx"]])
    assert not looks_byte_level([["abc"]])  # no shifted character: leave it alone
    raw = hostile_dump()
    raw["response_tokens"][0] = ["Ġthe", "Ġcat", "Ċ", "Ã©", "x", "y", "z"]
    raw["response_tokens"][1] = ["Ġa"] * 7
    assert normalise_dump(raw).tokens[0][:4] == [" the", " cat", "\n", "é"]
    assert normalise_dump(raw, tokens="text").tokens[0][0] == "Ġthe"


# ----------------------------------------------------------------------------------------------
# Weights: rho from the dump, no relevance
# ----------------------------------------------------------------------------------------------
def _peaked_dump(**extra) -> dict:
    raw = hostile_dump()
    raw["beta"] = 1.0
    q = torch.full((2, 2, 7), 0.01)
    q[:, :, 0] = 1.0
    raw["relevance"] = q
    raw["replayed"] = torch.ones(2, 2, dtype=torch.bool)
    raw.update(extra)
    return raw


def _rms_dev(raw, **kw) -> float:
    d = normalise_dump(raw, **kw)
    w = row_weights(d, 0, 0)[d.mask[0]]
    assert float(w.mean()) == pytest.approx(1.0, abs=1e-5)
    return float(((w - 1) ** 2).mean().sqrt())


def test_rho_comes_from_the_dump():
    free = _rms_dev(_peaked_dump(max_realloc_rms=None))
    assert free > 1.5  # peaked q with beta = 1 reallocates a lot
    assert _rms_dev(_peaked_dump()) == pytest.approx(1.0, abs=1e-4)  # default rho = 1.0
    raw = _peaked_dump()
    raw["metrics"]["mrtpo/max_realloc_rms"] = 0.25
    assert _rms_dev(raw) == pytest.approx(0.25, abs=1e-4)
    assert _rms_dev(_peaked_dump(max_realloc_rms=0.5)) == pytest.approx(0.5, abs=1e-4)
    assert _rms_dev(_peaked_dump(), rho=0.1) == pytest.approx(0.1, abs=1e-4)
    assert _rms_dev(_peaked_dump(), rho=None) == pytest.approx(free)
    assert "rho <b>0.25</b>" in viz.render_html(normalise_dump(raw))


def test_the_token_weight_cap_comes_from_the_dump():
    """A run with ``mrtpo.max_token_weight`` dumps its cap; the viewer's weights are the trainer's, capped."""
    d_free = normalise_dump(_peaked_dump())
    assert d_free.cap is None and float(row_weights(d_free, 0, 0).max()) > 2.0
    d = normalise_dump(_peaked_dump(max_token_weight=2.0))
    w = row_weights(d, 0, 0)[d.mask[0]]
    assert float(w.max()) == pytest.approx(2.0, abs=1e-5) and float(w.mean()) == pytest.approx(1.0, abs=1e-5)
    assert "token weight cap 2" in viz.render_html(d)
    with pytest.raises(DumpError, match="max_token_weight"):
        normalise_dump(_peaked_dump(max_token_weight=0.5))


def test_no_replay_step_renders_every_row_uniform():
    raw = hostile_dump()
    raw["relevance"] = None
    page = viz.render_html(normalise_dump(raw))
    root = parse(page).root
    rows = root.by_class("reward-row")
    assert len(rows) == 4 and all("uniform" in r.classes for r in rows)
    assert "no replay this step" in page
    assert all(float(s.attrs["data-w"]) == 1.0 for r in rows for s in r.by_class("tok") if "data-w" in s.attrs)


def test_bad_dumps_give_clear_errors():
    raw = hostile_dump()
    raw["relevance"] = torch.zeros(2, 2, 3)
    with pytest.raises(DumpError, match="relevance must be"):
        normalise_dump(raw)
    raw = hostile_dump()
    del raw["scores"]
    with pytest.raises(DumpError, match="no 'scores'"):
        normalise_dump(raw)
    raw = hostile_dump()
    raw["beta"] = 2.0
    with pytest.raises(DumpError, match="beta"):
        normalise_dump(raw)


# ----------------------------------------------------------------------------------------------
# Loading and CLI
# ----------------------------------------------------------------------------------------------
def test_folder_gives_latest_or_chosen_step(tmp_path, sample_raw):
    for s in (1, 10, 3):
        torch.save(dict(sample_raw, step=s), tmp_path / f"step_{s:06d}.pt")
    (tmp_path / "notes.txt").write_text("not a dump")
    raw, f = load_dump(tmp_path)
    assert raw["step"] == 10 and f.name == "step_000010.pt"
    raw, f = load_dump(tmp_path, step=3)
    assert raw["step"] == 3
    with pytest.raises(DumpError, match="available steps: 1, 3, 10"):
        load_dump(tmp_path, step=5)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DumpError, match="no step_XXXXXX.pt"):
        load_dump(empty)
    (tmp_path / "bad.pt").write_text("garbage")
    with pytest.raises(DumpError, match="cannot read"):
        load_dump(tmp_path / "bad.pt")


def test_cli_writes_the_page(tmp_path, capsys):
    out = tmp_path / "sub" / "page.html"
    assert viz.main([str(SAMPLE), "--out", str(out), "--max-samples", "3"]) == 0
    assert "3 responses" in capsys.readouterr().out
    root = parse(out.read_text(encoding="utf-8")).root
    assert len(root.by_class("sample")) == 3
    assert viz.main([str(SAMPLE), "--out", str(out), "--only-replayed"]) == 0
    secs = parse(out.read_text(encoding="utf-8")).root.by_class("sample")
    assert [int(s.attrs["data-sample"]) for s in secs] == list(range(4, 16))
    assert viz.main([str(tmp_path / "missing.pt"), "--out", str(out)]) == 2
    assert "no such dump" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------
# (2) A real browser: headless Chromium
# ----------------------------------------------------------------------------------------------
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage",
]
INSTALL_HINT = (
    "headless Chromium is needed for the viewer's browser test and was not found "
    "(looked at $MRTPO_CHROMIUM, `chromium` / `chromium-browser` on PATH, /usr/bin/chromium). "
    "Install it with: apt-get update && apt-get install -y chromium"
)


@pytest.fixture(scope="module")
def chromium() -> str:
    for c in (os.environ.get("MRTPO_CHROMIUM"), shutil.which("chromium"), shutil.which("chromium-browser"), "/usr/bin/chromium"):
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    pytest.fail(INSTALL_HINT)


def _chrome(chromium: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile{len(list(tmp_path.glob('profile*')))}"
    cmd = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90)


def _console_errors(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ":CONSOLE" in ln and ("Uncaught" in ln or "Error" in ln)]


def test_chromium_renders_the_heatmap(chromium, tmp_path):
    from PIL import Image

    d = normalise_dump(torch.load(SAMPLE, weights_only=True), source=str(SAMPLE))
    page = tmp_path / "page.html"
    page.write_text(viz.render_html(d, only_replayed=True), encoding="utf-8")
    n_spans = len(parse(page.read_text(encoding="utf-8")).root.by_class("tok"))

    png = tmp_path / "shot.png"
    r = _chrome(chromium, tmp_path, f"--screenshot={png}", "--window-size=1200,900", page.as_uri())
    assert r.returncode == 0 and png.is_file(), f"chromium screenshot failed ({r.returncode}):\n{r.stderr[-3000:]}"
    img = Image.open(png).convert("RGB")
    assert img.size == (1200, 900)
    colours = img.getcolors(maxcolors=1 << 24)
    assert len(colours) > 50, f"screenshot looks blank: {len(colours)} colours"
    px = list(img.getdata())
    orange = sum(1 for r_, g_, b_ in px if r_ > 200 and 70 < g_ < 215 and b_ < 190 and r_ - b_ > 60)
    dark = sum(1 for r_, g_, b_ in px if r_ + g_ + b_ < 200)
    assert orange > 2000, f"no relevance shading visible ({orange} orange pixels)"
    assert dark > 2000, f"no text visible ({dark} dark pixels)"

    r = _chrome(chromium, tmp_path, "--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri())
    assert r.returncode == 0, r.stderr[-3000:]
    body = re.search(r"<body[^>]*>", r.stdout)
    assert body, r.stdout[:500]
    assert 'data-viz-ready="1"' in body.group(0), f"the page's script did not finish: {body.group(0)}"
    assert f'data-viz-tokens="{n_spans}"' in body.group(0)
    assert "data-viz-errors" not in body.group(0)
    assert not _console_errors(r.stderr), _console_errors(r.stderr)


def test_chromium_check_catches_a_broken_script(chromium, tmp_path):
    """The two script checks above can fail: a page whose script throws trips both."""
    d = normalise_dump(hostile_dump())
    html_ = viz.render_html(d)
    assert "else{init();}" in html_
    html_ = html_.replace("<script>var AMAX", '<script>throw new Error("boom")</script><script>var AMAX')
    html_ = html_.replace("else{init();}", "else{init(;}")
    page = tmp_path / "broken.html"
    page.write_text(html_, encoding="utf-8")
    r = _chrome(chromium, tmp_path, "--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri())
    assert r.returncode == 0, r.stderr[-3000:]
    body = re.search(r"<body[^>]*>", r.stdout).group(0)
    assert 'data-viz-ready="1"' not in body
    errs = _console_errors(r.stderr)
    assert any("boom" in e for e in errs) and any("SyntaxError" in e for e in errs), r.stderr[-2000:]


# ----------------------------------------------------------------------------------------------
# Agent-loop responses: tool and user spans (the dump's ``spans``, from the BFCL loop's ``bfcl_spans``)
# ----------------------------------------------------------------------------------------------
def _agent_dump(spans) -> dict:
    """Response 0 of an agent loop: model 0-1, tool 2-3, model 4, user 5, model 6; response 1 one-turn."""
    raw = hostile_dump()
    raw["response_mask"] = torch.tensor([[1, 1, 0, 0, 1, 0, 1], [1, 1, 1, 1, 0, 0, 0]])
    raw["spans"] = spans
    return raw


def _marks(page: str) -> list[list[tuple[str, str]]]:
    """Per sample, the (span kind, note) of every token of its first reward row."""
    out = []
    for section in parse(page).root.by_class("sample"):
        row = section.by_class("reward-row")[0]
        out.append([(s.attrs.get("data-span", "masked" if "masked" in s.classes else ""), s.attrs["title"].split("\n")[-1])
                    for s in row.by_class("tok")])
    return out


def test_tool_and_user_spans_are_marked_and_never_measured():
    page = viz.render_html(normalise_dump(_agent_dump([[["model", 0, 2], ["tool", 2, 4], ["model", 4, 5], ["user", 5, 6],
                                                        ["model", 6, 7]], []])))
    marks = _marks(page)
    assert [k for k, _ in marks[0]] == ["", "", "tool", "tool", "", "user", ""]
    assert marks[0][2][1] == viz.SPAN_NOTES["tool"] and marks[0][5][1] == viz.SPAN_NOTES["user"]
    assert [k for k, _ in marks[1]] == ["", "", "", ""]  # up to its last measured token; no spans
    # the marked tokens carry no q and no weight, in every row, the advantage row included
    root = parse(page).root
    for s in root.by_class("span-tool") + root.by_class("span-user"):
        assert "data-q" not in s.attrs and "data-w" not in s.attrs and "data-adv" not in s.attrs
    assert len(root.by_class("span-tool")) == 2 * (2 + 1) + 1  # 2 tokens x (2 rewards + advantage) + the legend
    assert "agent-loop responses" in page


@pytest.mark.parametrize("spans", [
    None,  # a dump written before spans
    [],
    [[["tool", 0, 7]], []],  # over measured positions: those stay measured
    [[["evil<script>", 2, 4], ["tool", "x", 4], ["tool", 4, 2], ["user", -5, 3], "junk", None], "junk"],
])
def test_spans_off_their_shape_never_mark_a_measured_token_nor_fail(spans):
    d = normalise_dump(_agent_dump(spans))
    page = viz.render_html(d)
    marks = _marks(page)
    measured = [t for t, v in enumerate(d.mask[0].tolist()) if v]
    assert all(marks[0][t][0] == "" for t in measured)
    assert "evil<script>" not in page
    if spans and spans[0] and spans[0][0][0] == "tool":  # the one well-formed span marks the masked positions inside
        assert [k for k, _ in marks[0]] == ["", "", "tool", "tool", "", "tool", ""]
