"""Source pins: the one reader and hasher of the third-party functions the recipe restates or relies on.

A pin is ``name -> sha256`` of the function's dedented source, kept next to the code that relies on it
(``verl_seam``: verl's advantage and old_log_prob steps, numerics, distillation path; ``agent.pins``: the
BFCL agent loop's verl pieces and bfcl-eval; ``rollout_seed``: the rollout's per-request seeds;
``methods.sdpo.pins``: SDPO). Each group has a guard test that fails when the installed source differs.

Standard library only: a pin module may be imported where verl, torch or bfcl-eval's handlers are not.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import inspect
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional


def source_sha256(source: str) -> str:
    """The sha256 hex digest of a source text (what a pin holds)."""
    return hashlib.sha256(source.encode()).hexdigest()


def named_source(name: str, package: str = "") -> str:
    """The dedented source of ``name``, what the pins hash.

    ``module:qualname`` (verl's pins): imported, ``textwrap.dedent(inspect.getsource(obj))``. With ``package``
    (``agent.pins.BFCL_SOURCES``: ``package="bfcl_eval"``), ``file:qualname`` with ``file`` relative to that installed
    package, read with ``ast`` without importing it (bfcl-eval's model handlers cannot be imported without their
    heavy dependencies): the dedented ``ast.get_source_segment`` of the definition (no decorators; its first line
    is not indented, so the dedent leaves the body as in the file).
    """
    where, qual = name.split(":")
    if not package:
        obj = importlib.import_module(where)
        for part in qual.split("."):
            obj = getattr(obj, part)
        return textwrap.dedent(inspect.getsource(obj))
    root = Path(list(importlib.util.find_spec(package).submodule_search_locations)[0])
    text = (root / where).read_text()
    node: Any = ast.parse(text)
    for part in qual.split("."):
        node = next(n for n in ast.iter_child_nodes(node)
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == part)
    return textwrap.dedent(ast.get_source_segment(text, node))


def file_source(name: str) -> str:
    """The dedented source of ``module:qualname`` read from the module's file (decorators left out), without
    importing the module (``verl.workers.rollout.vllm_rollout`` imports vLLM, refused where vLLM is not verl's)."""
    mod, qual = name.split(":")
    top, *rest = mod.split(".")
    path = Path(importlib.util.find_spec(top).origin).parent.joinpath(*rest).with_suffix(".py")
    text = path.read_text()
    body, node = ast.parse(text).body, None
    for part in qual.split("."):
        node = next((n for n in body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                     and n.name == part), None)
        if node is None:
            raise LookupError(f"{name}: {part} not found in {path}")
        body = node.body
    return textwrap.dedent("".join(text.splitlines(True)[node.lineno - 1:node.end_lineno]))


def changed_sources(pins: dict[str, str], package: str = "", reader: Optional[Callable[[str], str]] = None) -> list[str]:
    """The names of ``pins`` (name -> sha256) whose installed source differs: read with ``reader`` (e.g.
    :func:`file_source`), else :func:`named_source` (with ``package`` for ``file:qualname`` names)."""
    read = reader if reader is not None else (lambda n: named_source(n, package))
    return [n for n, sha in pins.items() if source_sha256(read(n)) != sha]
