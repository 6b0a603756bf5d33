"""The README and docs/**/*.md point only at what exists:

- every relative markdown link and image resolves to a file or folder of the repository, and a ``#anchor``
  into a ``.md`` file (or into the page itself) names one of its headings by GitHub's slug;
- every ``bash run_scripts/X.sh`` and ``python path/to/X.py`` they show is a file of the repository, and
  every ``python -m module`` of the repository's own packages is a module (or a package with
  ``__main__.py``) there;
- the README's ``ALGO = a | b | ...`` list is the methods registry's names;
- the README stays under 300 lines.

The flags of the tools' commands are checked against their ``--help`` in ``test_docs_commands.py``, those
of the data builders against their argparse in ``test_data_prep_cli.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = [README, *sorted((REPO / "docs").rglob("*.md"))]
OWN_PACKAGES = ("recipe", "data_prep", "experiments", "benchmarks", "run_scripts", "verl_patches", "tests")

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
BASH_SCRIPT = re.compile(r"(?<![\w/.-])bash\s+(run_scripts/[\w./-]+\.sh)")
PY_SCRIPT = re.compile(r"(?<![\w/.-])python3?\s+((?:[\w-]+/)+[\w.-]+\.py)")
PY_MODULE = re.compile(r"(?<![\w/.-])python3?\s+-m\s+([A-Za-z_][\w.]*)")


def _prose_lines(text: str):
    """(line number, line) outside fenced code blocks."""
    in_block = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_block = not in_block
            continue
        if not in_block:
            yield n, line


def _without_code(line: str) -> str:
    """``line`` with its code spans blanked (they hold commands, not links), except a span that is a link's
    whole text (``[`docs/x.md`](docs/x.md)``)."""
    out, last = [], 0
    for m in CODE_SPAN.finditer(line):
        is_link_text = line[:m.start()].endswith("[") and line[m.end():].startswith("](")
        out += [line[last:m.start()], m.group(0) if is_link_text else " " * len(m.group(0))]
        last = m.end()
    return "".join(out) + line[last:]


def github_slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text without markup, lower case, punctuation dropped (``-`` and ``_``
    kept), each space a ``-``."""
    text = CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading: its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's slug in a page's ``text``, with GitHub's ``-1``, ``-2`` ... for repeated headings."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in _prose_lines(text):
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = github_slug(m.group(1))
        k = seen.get(slug, 0)
        seen[slug] = k + 1
        out.add(slug if k == 0 else f"{slug}-{k}")
    return out


def broken_links(path: Path, text: str | None = None) -> list[str]:
    """``line: target (why)`` for every relative link or image of ``path`` that does not resolve."""
    text = path.read_text(encoding="utf-8") if text is None else text
    problems = []
    for n, line in _prose_lines(text):
        for m in LINK.finditer(_without_code(line)):
            target = m.group(1)
            if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
                continue
            where, _, anchor = target.partition("#")
            if not where:  # an anchor into the page itself
                if anchor not in anchors(text):
                    problems.append(f"{n}: {target} (no heading #{anchor} on this page)")
                continue
            dest = (path.parent / where).resolve()
            if REPO not in dest.parents and dest != REPO:
                problems.append(f"{n}: {target} (outside the repository)")
            elif not dest.exists():
                problems.append(f"{n}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text(encoding="utf-8")):
                problems.append(f"{n}: {target} (no heading #{anchor} in {dest.relative_to(REPO)})")
    return problems


def _module_exists(module: str) -> bool:
    base = REPO.joinpath(*module.split("."))
    return base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()


def missing_commands(path: Path, text: str | None = None) -> list[str]:
    """``line: command`` for every shown ``bash run_scripts/...``, ``python X.py`` or ``python -m <own module>``
    whose file does not exist (fenced blocks and prose alike)."""
    text = path.read_text(encoding="utf-8") if text is None else text
    problems = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in BASH_SCRIPT.finditer(line):
            if not (REPO / m.group(1)).is_file():
                problems.append(f"{n}: bash {m.group(1)} (no such script)")
        for m in PY_SCRIPT.finditer(line):
            if not (REPO / m.group(1)).is_file():
                problems.append(f"{n}: python {m.group(1)} (no such file)")
        for m in PY_MODULE.finditer(line):
            module = m.group(1).rstrip(".")
            if module.split(".")[0] in OWN_PACKAGES and not _module_exists(module):
                problems.append(f"{n}: python -m {module} (no such module or package __main__)")
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(REPO)) for d in DOCS])
def test_links_and_images_resolve(doc):
    assert not broken_links(doc), f"{doc.relative_to(REPO)}: {broken_links(doc)}"


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(REPO)) for d in DOCS])
def test_shown_scripts_and_modules_exist(doc):
    assert not missing_commands(doc), f"{doc.relative_to(REPO)}: {missing_commands(doc)}"


def test_the_readme_shows_the_commands_it_should():
    """The checks above see the README's commands: the two fresh-machine commands, a run script, the tools."""
    text = README.read_text(encoding="utf-8")
    scripts = set(BASH_SCRIPT.findall(text))
    modules = set(PY_MODULE.findall(text))
    assert {"run_scripts/quickstart_cpu.sh", "run_scripts/test.sh", "run_scripts/qwen7b_ifbench.sh"} <= scripts
    assert {"recipe.mrtpo.main_mrtpo", "recipe.mrtpo.tools.eval", "recipe.mrtpo.tools.report",
            "recipe.mrtpo.tools.viz", "recipe.mrtpo.tools.export"} <= modules


def test_the_readme_algo_list_is_the_registry():
    from recipe.mrtpo import methods

    lists = re.findall(r"ALGO = ((?:[\w-]+ \| )+[\w-]+)", README.read_text(encoding="utf-8"))
    assert lists, "the README names the run scripts' ALGO values"
    for listed in lists:
        assert set(listed.split(" | ")) == set(methods.names()), listed


def test_the_readme_is_under_300_lines():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n < 300, f"README.md has {n} lines; move detail into docs/"


def test_the_checks_catch_what_is_broken():
    doc = REPO / "docs" / "x.md"  # a page as if it were in docs/ (never written)
    text = "\n".join([
        "# Title",
        "## Two words (`code`)",
        "[ok](design.md) [ok](#two-words-code) [`ok`](design.md#2-verifier-information-z_k) [web](https://x.org/a)",
        "[bad](no_such_page.md) ![bad](mini_credit/none.png) [bad](design.md#no-such-heading) [bad](#nowhere)",
        "[bad](../../outside.md) `[in code](no_such.md)`",
        "```",
        "[in a block](no_such.md)",
        "```",
        "bash run_scripts/no_such.sh; python -m recipe.mrtpo.no_such; python benchmarks/no_such.py",
        "bash run_scripts/test.sh; python -m recipe.mrtpo.tools.eval; python -m verl.model_merger",
    ])
    assert broken_links(doc, text) == [
        "4: no_such_page.md (no such file)",
        "4: mini_credit/none.png (no such file)",
        "4: design.md#no-such-heading (no heading #no-such-heading in docs/design.md)",
        "4: #nowhere (no heading #nowhere on this page)",
        "5: ../../outside.md (outside the repository)",
    ]
    assert missing_commands(doc, text) == [
        "9: bash run_scripts/no_such.sh (no such script)",
        "9: python benchmarks/no_such.py (no such file)",
        "9: python -m recipe.mrtpo.no_such (no such module or package __main__)",
    ]


def test_github_slugs():
    assert github_slug("How it sits in verl 0.9.1") == "how-it-sits-in-verl-091"
    assert github_slug("Training metrics (`mrtpo/`)") == "training-metrics-mrtpo"
    assert github_slug("How the miniatures differ from the paper's setup") == "how-the-miniatures-differ-from-the-papers-setup"
    assert github_slug("2. Verifier information Z_k") == "2-verifier-information-z_k"
