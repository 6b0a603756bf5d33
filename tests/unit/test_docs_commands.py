"""Every command of the tools (eval, report, viz, export) shown in README.md and docs/*.md uses only flags that the
tool's ``--help`` lists, and only ``--task`` values it accepts: the docs cannot drift from the command lines."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
TOOLS = ("eval.agreement", "eval", "report", "viz", "export")  # longest module name first
COMMAND = re.compile(r"python -m recipe\.mrtpo\.tools\.(" + "|".join(re.escape(t) for t in TOOLS) + r")(?![\w.])")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def _help(tool: str) -> str:
    import importlib

    module = {"eval": "recipe.mrtpo.tools.eval.cli", "report": "recipe.mrtpo.tools.report.build",
              "viz": "recipe.mrtpo.tools.viz.render", "export": "recipe.mrtpo.tools.export",
              "eval.agreement": "recipe.mrtpo.tools.eval.agreement"}[tool]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit):
        importlib.import_module(module).main(["--help"])
    return buf.getvalue()


def _commands() -> list[tuple[str, int, str, str]]:
    """(file, line, tool, the command's arguments) for every tool command in the docs: up to the end of its
    inline code span, or of the line (a shell comment cut off)."""
    found = []
    for path in DOCS:
        in_block = False
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith("```"):
                in_block = not in_block
                continue
            for m in COMMAND.finditer(line):
                rest = line[m.end():]
                opened = line[:m.start()].count("`") % 2 == 1
                if opened:
                    rest = rest.split("`", 1)[0]
                elif in_block:
                    rest = rest.split(" #", 1)[0]
                found.append((str(path.relative_to(REPO)), n, m.group(1), rest))
    return found


COMMANDS = _commands()


def test_the_docs_show_commands_of_every_tool():
    assert {tool for _, _, tool, _ in COMMANDS} >= {"eval", "report", "viz", "export"}


@pytest.mark.parametrize("where, line, tool, args", COMMANDS, ids=[f"{w}:{n}" for w, n, _, _ in COMMANDS])
def test_doc_command_matches_help(where, line, tool, args):
    text = _help(tool)
    known = set(FLAG.findall(text))
    used = set(FLAG.findall(args))
    assert used <= known, f"{where}:{line}: {sorted(used - known)} not in `{tool} --help` ({sorted(known)})"
    if tool == "eval":
        from recipe.mrtpo.tools.eval.metrics import TASK_FAMILY

        for value in re.findall(r"--task\s+([\w|]+)", args):
            bad = [t for t in value.split("|") if t not in TASK_FAMILY]
            assert not bad, f"{where}:{line}: --task {bad} is not a choice of the eval CLI"


def test_the_check_catches_a_wrong_flag():
    assert not set(FLAG.findall(" runs/ --out x")) <= set(FLAG.findall(_help("report")))
