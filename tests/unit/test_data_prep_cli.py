"""The data builders as a package and as command lines.

- every ``data_prep`` module imports alone in a fresh interpreter, and the modules' imports of each
  other (top-level and function-local, read with ``ast``) form no cycle;
- every ``python -m data_prep...`` command written in README.md and docs/*.md parses with that
  module's own argparse: the sub-command exists, every flag exists under that exact spelling, and a
  command without placeholders parses completely;
- one spelling per flag: output folders are ``--out-dir``, ``--out`` only names one output file,
  SQL time limits are ``--sql-timeout-s``.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import itertools
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DATA_PREP = REPO / "data_prep"
#: every module of data_prep, dotted below it (``common``, ``text_to_sql.rows``)
MODULES = sorted(".".join(p.relative_to(DATA_PREP).with_suffix("").parts) for p in DATA_PREP.rglob("*.py")
                 if p.stem not in ("__init__", "__main__"))


def _source(module: str) -> str:
    return (DATA_PREP / Path(*module.split("."))).with_suffix(".py").read_text(encoding="utf-8")


def _main_module(package: Path) -> str:
    """The module whose ``main`` a package's ``__main__.py`` runs (``from data_prep.X.build import main``)."""
    for node in ast.walk(ast.parse((package / "__main__.py").read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and any(a.name == "main" for a in node.names):
            return node.module.split(".", 1)[1]
    raise AssertionError(f"{package}/__main__.py runs no main")


#: ``python -m data_prep.<name>`` -> the module whose ``main`` it runs (a package's: what its __main__.py imports)
CLIS = {**{m: m for m in MODULES if "\ndef main(" in _source(m)},
        **{p.parent.name: _main_module(p.parent) for p in DATA_PREP.glob("*/__main__.py")}}
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


# --------------------------------------------------------------------------------------------------
# imports
# --------------------------------------------------------------------------------------------------


def test_every_module_imports_alone_in_a_fresh_interpreter():
    procs = {m: subprocess.Popen([sys.executable, "-c", f"import data_prep.{m}"], cwd=REPO,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for m in MODULES}
    failed = {}
    for m, p in procs.items():
        _, err = p.communicate(timeout=120)
        if p.returncode != 0:
            failed[m] = err.strip().splitlines()[-1:]
    assert not failed, failed
    assert {"common", "text_to_sql.rows", "instruction_following.rows", "tool_calling.rows", "text_to_sql.build",
            "text_to_sql.sources"} <= set(MODULES)


def _data_prep_imports(module: str) -> set[str]:
    """The ``data_prep`` modules ``module`` imports anywhere in its source (function bodies included)."""
    out = set()
    for node in ast.walk(ast.parse(_source(module))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "data_prep":
            base = node.module.split(".", 1)[1] if "." in node.module else ""
            for a in node.names:  # ``from data_prep.X import build``: the module X.build; else the module X
                sub = f"{base}.{a.name}" if base else a.name
                out.add(sub if sub in MODULES else base)
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".", 1)[1] for a in node.names if a.name.startswith("data_prep.")}
    return out & set(MODULES)


def _cycle(graph: dict[str, set[str]]):
    """One cycle of ``graph`` as a list of nodes, or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_data_prep_has_no_import_cycles():
    graph = {m: _data_prep_imports(m) for m in MODULES}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))
    # the leaf modules the task builders share import no builder
    for leaf in ("text_to_sql.rows", "instruction_following.rows", "tool_calling.rows", "common"):
        assert graph[leaf] <= {"common"}, (leaf, graph[leaf])
    # the detector itself finds a cycle hidden in a function body
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


# --------------------------------------------------------------------------------------------------
# the documented commands
# --------------------------------------------------------------------------------------------------


class _Parser(Exception):
    def __init__(self, parser):
        super().__init__("parser captured")
        self.parser = parser


def cli_parser(module: str) -> argparse.ArgumentParser:
    """The argparse parser ``python -m data_prep.<module>`` uses: ``main`` is called and stopped at its
    ``parse_args`` (every builder parses its arguments before doing anything)."""
    mod = importlib.import_module(f"data_prep.{CLIS[module]}")

    def capture(self, *args, **kwargs):
        raise _Parser(self)

    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = capture
    try:
        mod.main([])
    except _Parser as e:
        return e.parser
    finally:
        argparse.ArgumentParser.parse_args = original
    raise AssertionError(f"data_prep.{module}.main() never parsed its arguments")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


_CMD = re.compile(r"python -m data_prep\.[^`\n]*")


def documented_commands() -> list[tuple[str, str]]:
    """``(where, command)`` for every ``python -m data_prep...`` in README.md and docs/*.md: inline code
    spans and lines of fenced blocks (continuation backslashes joined, ``# comments`` dropped)."""
    out = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        in_block = False
        lines = text.splitlines()
        i = 0
        while i < len(lines):
            line, number = lines[i], i + 1
            if line.lstrip().startswith("```"):
                in_block = not in_block
            elif in_block and line.lstrip().startswith("python -m data_prep."):
                cmd = line.strip()
                while cmd.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    cmd = cmd[:-1] + " " + lines[i].strip()
                out.append((f"{doc.name}:{number}", cmd.split(" #", 1)[0].strip()))
            elif not in_block:
                for span in re.findall(r"`([^`]+)`", line):
                    if span.startswith("python -m data_prep."):
                        out.append((f"{doc.name}:{number}", span.strip()))
            i += 1
    return out


def _expand(tokens: list[str]) -> list[list[str]]:
    """Alternatives written ``a|b`` (or ``<a|b>``) in a positional token: one command per choice."""
    options = []
    for t in tokens:
        bare = t[1:-1] if t.startswith("<") and t.endswith(">") else t
        options.append(bare.split("|") if "|" in bare and not t.startswith("-") else [t])
    return [list(c) for c in itertools.product(*options)]


def check_command(cmd: str) -> list[str]:
    """What is wrong with one documented command (empty when it matches the CLI)."""
    tokens = shlex.split(cmd.replace("\\|", "|"))
    assert tokens[:2] == ["python", "-m"], cmd
    problems = []
    for variant in _expand(tokens[2:]):
        module, args = variant[0].split(".", 1)[1], variant[1:]
        if module not in CLIS:
            problems.append(f"no command line data_prep.{module}")
            continue
        partial = "..." in args or any(a.startswith("<") or a.startswith("[") for a in args) or "--help" in args
        args = args[: args.index("...")] if "..." in args else args
        args = [a for a in args if not (a.startswith("<") or a.startswith("["))]
        parser = cli_parser(module)
        subs = _subcommands(parser)
        target = parser
        if subs:
            if not args or args[0] in ("-h", "--help"):
                continue  # the module named in prose, or its top-level help
            if args[0] not in subs:
                problems.append(f"{module}: no command {args[0]!r} (has {sorted(subs)})")
                continue
            target = subs[args[0]]
        known = _options(target)
        flags = [a.split("=", 1)[0] for a in args if a.startswith("--")]
        problems += [f"{module} {args[0] if subs else ''}: no flag {f}" for f in flags if f not in known]
        if not partial and not problems and args:
            try:
                parser.parse_args(args)
            except SystemExit as e:
                problems.append(f"{module}: does not parse {args} (exit {e.code})")
    return problems


def test_docs_name_the_data_commands():
    cmds = documented_commands()
    modules = {c.split()[2] for _, c in cmds}
    assert {"data_prep.build_offline", "data_prep.text_to_sql", "data_prep.instruction_following",
            "data_prep.tool_calling"} <= modules, modules


@pytest.mark.parametrize("where, cmd", documented_commands(), ids=lambda x: x if ":" in str(x) else "")
def test_every_documented_command_parses_with_its_cli(where, cmd, capsys):
    problems = check_command(cmd)
    capsys.readouterr()
    assert not problems, f"{where}: {cmd}\n" + "\n".join(problems)


def test_the_command_check_catches_what_the_docs_could_get_wrong(capsys):
    assert check_command("python -m data_prep.instruction_following train --out-dir d") == []
    assert check_command("python -m data_prep.text_to_sql spider|bird --input A ...") == []
    assert "no command 'xlam'" in check_command("python -m data_prep.instruction_following xlam --out-dir d")[0]
    assert "no flag --out" in check_command("python -m data_prep.tool_calling bfcl --out d")[0]
    assert "no flag --sql-timeout" in check_command(
        "python -m data_prep.text_to_sql chinook --out-dir d --sql-timeout 3")[0]
    assert "does not parse" in check_command("python -m data_prep.tool_calling bfcl")[0]  # --out-dir missing
    assert "no command '--source'" in check_command("python -m data_prep.text_to_sql --source spider --out-dir d")[0]
    capsys.readouterr()


# --------------------------------------------------------------------------------------------------
# one spelling per flag
# --------------------------------------------------------------------------------------------------


def _all_actions():
    for module in CLIS:
        parser = cli_parser(module)
        subs = _subcommands(parser) or {"": parser}
        for name, sub in subs.items():
            for action in sub._actions:
                yield f"{module} {name}".strip(), action


def test_one_spelling_per_flag_across_the_clis():
    seen_out_dir = False
    for where, action in _all_actions():
        for flag in action.option_strings:
            text = (action.help or "").lower()
            if flag == "--out-dir":
                seen_out_dir = True
                assert "folder" in text or action.help is None, (where, action.help)
            elif flag.startswith("--out"):
                assert flag == "--out" and "file" in text and "folder" not in text, (where, flag, action.help)
            if "timeout" in flag:
                assert flag == "--sql-timeout-s", (where, flag)
    assert seen_out_dir
