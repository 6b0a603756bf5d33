"""The suite's layout that run_scripts/test.sh relies on: the end-to-end tests are exactly those in ``tests/e2e``
(tests/conftest.py sends that folder to one pytest-xdist worker, so an e2e test elsewhere would run beside
another one, and a plain test there would wait behind them)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]


def _marked_e2e(fn: ast.AST) -> bool:
    return any(ast.unparse(d).startswith(("pytest.mark.e2e", "mark.e2e")) for d in fn.decorator_list)


def _tests(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            yield node


def test_the_e2e_tests_are_exactly_those_in_tests_e2e():
    outside = [f"{p.relative_to(TESTS)}::{fn.name}" for p in sorted(TESTS.rglob("test_*.py")) if "e2e" not in p.parts
               for fn in _tests(p) if _marked_e2e(fn)]
    unmarked = [f"{p.relative_to(TESTS)}::{fn.name}" for p in sorted((TESTS / "e2e").glob("test_*.py"))
                for fn in _tests(p) if not _marked_e2e(fn)]
    assert not outside, f"e2e tests outside tests/e2e: {outside}"
    assert not unmarked, f"tests in tests/e2e without the e2e mark: {unmarked}"


E2E_TOY = """
import os, time, pytest
@pytest.mark.e2e
@pytest.mark.parametrize("i", range(4))
def test_run(i):
    time.sleep(0.2)
    with open(os.environ["TOY_LOG"], "a") as f:
        f.write(f"e2e {os.environ['PYTEST_XDIST_WORKER']}\\n")
"""
UNIT_TOY = E2E_TOY.replace("@pytest.mark.e2e\n", "").replace("e2e {", "unit {")


def test_two_workers_run_every_e2e_test_on_one_of_them(tmp_path):
    """The suite's own conftest under ``pytest -n 2`` (as test.sh runs it), on a toy suite of the same layout."""
    pytest.importorskip("xdist", reason="pytest-xdist is in requirements-cpu.txt; the check needs it")
    (tmp_path / "tests" / "e2e").mkdir(parents=True)
    (tmp_path / "tests" / "unit").mkdir()
    shutil.copy(TESTS / "conftest.py", tmp_path / "tests" / "conftest.py")
    (tmp_path / "tests" / "e2e" / "test_a.py").write_text(E2E_TOY)
    (tmp_path / "tests" / "e2e" / "test_b.py").write_text(E2E_TOY)
    (tmp_path / "tests" / "unit" / "test_c.py").write_text(UNIT_TOY)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    e2e: toy\n    gpu: toy\n")
    log = tmp_path / "log.txt"
    res = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-q", "-p", "no:cacheprovider", "tests"], cwd=tmp_path,
                         env={**os.environ, "TOY_LOG": str(log)}, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = [line.split() for line in log.read_text().splitlines()]
    e2e_workers = {w for kind, w in rows if kind == "e2e"}
    assert len([r for r in rows if r[0] == "e2e"]) == 8 and len(e2e_workers) == 1, rows
    assert {w for kind, w in rows} == {"gw0", "gw1"}, rows  # the other worker ran tests too


def _marked_slow(fn: ast.AST) -> bool:
    return any(ast.unparse(d).startswith(("pytest.mark.slow", "mark.slow")) for d in fn.decorator_list)


def test_the_slow_tier_is_end_to_end_launches_and_ci_runs_it():
    """The ``slow`` tier (deselected by the default command, pyproject's addopts) holds only end-to-end launches,
    and CI runs it after the default suite: nothing in it is left to rot."""
    slow = [f"{p.relative_to(TESTS)}::{fn.name}" for p in sorted(TESTS.rglob("test_*.py")) for fn in _tests(p) if _marked_slow(fn)]
    assert slow and all(s.startswith("e2e/") for s in slow), slow
    ci = [line.strip() for line in (TESTS.parent / ".ci" / "run").read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert "bash run_scripts/test.sh" in ci and "bash run_scripts/test.sh -m slow" in ci, ci


def test_a_report_with_lone_surrogates_reaches_the_controller(tmp_path):
    """A test whose captured log holds a lone surrogate (as the hostile corpora make third-party checkers log)
    passes under two workers instead of ending the session with xdist's UTF-8 error."""
    pytest.importorskip("xdist", reason="pytest-xdist is in requirements-cpu.txt; the check needs it")
    (tmp_path / "tests").mkdir()
    shutil.copy(TESTS / "conftest.py", tmp_path / "tests" / "conftest.py")
    (tmp_path / "tests" / "test_s.py").write_text(
        'import logging\n\ndef test_logs_a_surrogate():\n    logging.getLogger().warning("text \\udc98 here")\n\n'
        'def test_other():\n    pass\n')
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    e2e: toy\n    gpu: toy\n")
    res = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-q", "-p", "no:cacheprovider", "tests"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "2 passed" in res.stdout, res.stdout[-3000:] + res.stderr[-3000:]
