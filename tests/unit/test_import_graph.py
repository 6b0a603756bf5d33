"""The recipe's import graph, built statically (``ast`` over ``recipe/**/*.py``), has no circle, and its layers hold.

Every ``import`` / ``from ... import`` of a recipe module counts, at module level and inside functions alike
(a lazy import runs as soon as its function does; it breaks no circle). An import of ``a.b.c`` from outside
package ``a.b`` also runs ``a.b``'s ``__init__``: it is an edge to that package too. Rules:

- no circle anywhere in ``recipe/``;
- ``recipe.mrtpo.config`` reaches no module of the methods package (the registry validates against the
  config, never the other way);
- the methods registry and its types (``recipe.mrtpo.methods`` and everything it reaches) reach none of the
  trainer's glue: tools, config and the run scripts' command line read the registry without verl's trainer;
- ``recipe.mrtpo.tools`` reaches neither the glue nor ``data_prep``;
- the registry's command line (``python3 -m recipe.mrtpo.methods``, called by the run scripts with any
  python3) imports only the standard library at module level;
- the TRL adapter (``recipe.mrtpo.trl_adapter``) imports only the core, the task registry and itself of the
  recipe, reaches none of the glue, and no module it reaches imports verl, Ray or vLLM (TRL users have none);
- no module of ``recipe/`` or ``data_prep/`` is longer than :data:`MAX_MODULE_LINES` lines (a module has one job);
- the rooms: ``recipe/mrtpo/`` holds packages and only the modules of :data:`LOOSE`, and every import of a room
  (a package or loose module of ``recipe.mrtpo``) goes to a room listed before it in :data:`ROOMS` (no arrow back up).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: the trainer's glue: the modules that bind the recipe to verl's trainer, workers and TransferQueue
GLUE = (
    "recipe.mrtpo.step.trainer",
    "recipe.mrtpo.step.worker",
    "recipe.mrtpo.main_mrtpo",
    "recipe.mrtpo.seams.verl_seam",
    "recipe.mrtpo.rewards.reward_manager",
    "recipe.mrtpo.passes.pass_driver",
    "recipe.mrtpo.step.replay_driver",
    "recipe.mrtpo.methods.opsd.step",
    "recipe.mrtpo.methods.opsd.driver",
    "recipe.mrtpo.methods.opsd.loss",
    "recipe.mrtpo.methods.sdpo.step",
    "recipe.mrtpo.methods.sdpo.loss",
)


#: the rooms of ``recipe.mrtpo``, from the bottom floor up: a room imports only rooms before it (docs/architecture.md)
ROOMS = ("core", "cluster", "seams", "config", "tasks", "passes", "agent", "rewards", "methods", "rollout", "step",
         "launch", "tools", "doctor", "main_mrtpo", "cpu", "trl_adapter")
#: the modules that stand loose in ``recipe/mrtpo/`` beside its packages: the entry points
LOOSE = ("__init__", "main_mrtpo", "doctor")


#: the TRL adapter and what of the recipe it may import (itself, the core, the task registry; its demo: the SmolLM2
#: asset's locator, and so the ``recipe.mrtpo.cpu`` package above it)
TRL_ADAPTER = "recipe.mrtpo.trl_adapter"
TRL_ADAPTER_MAY_IMPORT = (TRL_ADAPTER, "recipe.mrtpo.core", "recipe.mrtpo.tasks", "recipe.mrtpo.cpu.smollm2")


def _is_glue(mod: str) -> bool:
    leaf = mod.rsplit(".", 1)[-1]
    return mod in GLUE or leaf.endswith("_driver") or leaf.endswith("_step")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(tree: ast.Module, mod: str, is_pkg: bool):
    """(target, lazy, names) for every import statement of a module; ``lazy``: inside a function."""
    out = []

    def visit(node, lazy: bool):
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend((a.name, inner, ()) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[: len(base) - (child.level - 1)]
                    target = ".".join([*base, *([child.module] if child.module else [])])
                else:
                    target = child.module or ""
                out.append((target, inner, tuple(a.name for a in child.names)))
            visit(child, inner)

    visit(tree, False)
    return out


def build_graph(root: Path = REPO, package: str = "recipe"):
    """``{module: {target: lazy}}`` over the recipe's modules (lazy True when every import of the edge is
    inside a function), and each module's imports of top-level names outside the recipe, ``{name: lazy}``."""
    files = {module_name(p, root): p for p in sorted((root / package).rglob("*.py"))}
    known = set(files)
    graph: dict[str, dict[str, bool]] = {m: {} for m in files}
    outside: dict[str, dict[str, bool]] = {m: {} for m in files}
    for mod, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for target, lazy, names in _imports(tree, mod, path.name == "__init__.py"):
            top = target.split(".")[0]
            if top != package:
                outside[mod][top] = outside[mod].get(top, True) and lazy
                continue
            hits = [f"{target}.{n}" for n in names if f"{target}.{n}" in known] + [target]
            for t in hits:
                parts = t.split(".")
                # the target and every package above it that the importer is not already inside
                for k in range(1, len(parts) + 1):
                    anc = ".".join(parts[:k])
                    if anc not in known or anc == mod or mod.startswith(anc + "."):
                        continue
                    graph[mod][anc] = graph[mod].get(anc, True) and lazy
    return graph, outside


def cycles(graph: dict[str, dict[str, bool]], lazy: bool = True) -> list[list[str]]:
    """The strongly connected components with more than one module (or a self-loop), Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))

    def edges(v):
        return [w for w, is_lazy in graph[v].items() if lazy or not is_lazy]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges(v):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph[v]:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            strong(v)
    return out


def reach(graph: dict[str, dict[str, bool]], start: str, lazy: bool = True) -> dict[str, list[str]]:
    """Every module ``start`` reaches, with one import path to it."""
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop()
        for w, is_lazy in graph.get(v, {}).items():
            if (lazy or not is_lazy) and w not in paths:
                paths[w] = [*paths[v], w]
                todo.append(w)
    return paths


def violations(root: Path = REPO) -> list[str]:
    """Every broken rule of the module docstring, one line each (empty: the graph is as designed)."""
    graph, outside = build_graph(root)
    out = [f"circle: {' <-> '.join(c)}" for c in cycles(graph)]
    for conf in [m for m in graph if m == "recipe.mrtpo.config" or m.startswith("recipe.mrtpo.config.")]:
        for m, p in reach(graph, conf).items():
            if m == "recipe.mrtpo.methods" or m.startswith("recipe.mrtpo.methods."):
                out.append(f"config reaches the methods package: {' -> '.join(p)}")
    if "recipe.mrtpo.methods" in graph:
        for m, p in reach(graph, "recipe.mrtpo.methods").items():
            if _is_glue(m):
                out.append(f"the methods registry reaches glue: {' -> '.join(p)}")
    for tool in [m for m in graph if m.startswith("recipe.mrtpo.tools")]:
        for m, p in reach(graph, tool).items():
            if _is_glue(m):
                out.append(f"tools reach glue: {' -> '.join(p)}")
        for m, p in reach(graph, tool).items():
            if "data_prep" in outside[m]:
                out.append(f"tools import data_prep: {' -> '.join(p)}")
    for adapter in [m for m in graph if m == TRL_ADAPTER or m.startswith(TRL_ADAPTER + ".")]:
        for m in graph[adapter]:
            if not (m in ("recipe", "recipe.mrtpo", "recipe.mrtpo.cpu") or m.startswith(TRL_ADAPTER_MAY_IMPORT)):
                out.append(f"the TRL adapter imports {m}: {adapter}")
        for m, p in reach(graph, adapter).items():
            if _is_glue(m):
                out.append(f"the TRL adapter reaches glue: {' -> '.join(p)}")
            bad = sorted(n for n in outside[m] if n in ("verl", "ray", "vllm"))
            if bad:
                out.append(f"the TRL adapter reaches an import of {bad}: {' -> '.join(p)}")
    cli = "recipe.mrtpo.methods.__main__" if "recipe.mrtpo.methods.__main__" in graph else "recipe.mrtpo.methods"
    if cli in graph:
        stdlib = set(sys.stdlib_module_names) | {"__future__"}
        for m, p in reach(graph, cli, lazy=False).items():
            third = sorted(n for n, lazy in outside[m].items() if not lazy and n not in stdlib)
            if third:
                out.append(f"the registry's command line imports {third} at module level: {' -> '.join(p)}")
    out += room_breaches(graph, root)
    return sorted(set(out))


def room_of(mod: str) -> str | None:
    """The room of a ``recipe.mrtpo`` module (its package or loose module below ``recipe.mrtpo``)."""
    parts = mod.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["recipe", "mrtpo"] else None


def room_breaches(graph: dict[str, dict[str, bool]], root: Path = REPO) -> list[str]:
    """A room unknown to :data:`ROOMS`, a loose module not in :data:`LOOSE`, and every import up the floors."""
    out = []
    mrtpo = root / "recipe" / "mrtpo"
    if mrtpo.is_dir():
        out += [f"a loose module in recipe/mrtpo/: {p.name}" for p in sorted(mrtpo.glob("*.py")) if p.stem not in LOOSE]
    for mod, targets in graph.items():
        src = room_of(mod)
        for t in targets:
            dst = room_of(t)
            if src is None or dst is None or dst == src:
                continue
            unknown = [r for r in (src, dst) if r not in ROOMS]
            if unknown:
                out.append(f"a room not in ROOMS: {unknown[0]} ({mod} -> {t})")
            elif ROOMS.index(dst) > ROOMS.index(src):
                out.append(f"an import up the floors: {mod} ({src}) -> {t} ({dst})")
    return out


#: the house's limit on a module's length, in lines
MAX_MODULE_LINES = 450


def oversized(root: Path = REPO, package: str = "recipe", limit: int = MAX_MODULE_LINES) -> list[str]:
    """``path: N lines`` for every module of ``package`` longer than ``limit`` lines."""
    out = []
    for p in sorted((root / package).rglob("*.py")):
        n = len(p.read_text(encoding="utf-8").splitlines())
        if n > limit:
            out.append(f"{p.relative_to(root)}: {n} lines")
    return out


def _lazy_edges(graph) -> list[str]:
    return sorted(f"{a} -> {b}" for a, es in graph.items() for b, lazy in es.items() if lazy)


def test_the_recipe_import_graph_has_no_circle_and_keeps_its_layers():
    graph, _ = build_graph()
    assert len(graph) > 50 and "recipe.mrtpo.methods" in graph and "recipe.mrtpo.step.trainer" in graph
    assert violations() == []


def test_the_function_level_imports_are_listed_and_break_no_circle():
    """Lazy imports are counted above as much as module-level ones; here they are listed (for a reader), and the
    graph without them has no circle either."""
    graph, _ = build_graph()
    lazy = _lazy_edges(graph)
    print("\nfunction-level imports inside the recipe:\n  " + "\n  ".join(lazy))
    assert cycles(graph, lazy=False) == []


def test_the_checker_finds_a_circle_a_layer_breach_and_data_prep(tmp_path):
    """The rules fail where they should: a miniature recipe with each breach."""
    def write(rel: str, text: str) -> None:
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)

    for pkg in ("recipe", "recipe/mrtpo", "recipe/mrtpo/config", "recipe/mrtpo/methods", "recipe/mrtpo/tools"):
        write(f"{pkg}/__init__.py", "")
    write("recipe/mrtpo/config/schema.py", "from recipe.mrtpo.methods import modes\n")
    write("recipe/mrtpo/methods/__init__.py", "def modes():\n    from recipe.mrtpo.opsd_step import hook\n")
    write("recipe/mrtpo/opsd_step.py", "from recipe.mrtpo.config import schema\nhook = 1\n")
    write("recipe/mrtpo/tools/agree.py", "import data_prep.common\nfrom recipe.mrtpo import methods\n")
    found = violations(tmp_path)
    assert any(v.startswith("circle:") and "recipe.mrtpo.opsd_step" in v for v in found), found
    assert any(v.startswith("config reaches the methods package") for v in found), found
    assert any(v.startswith("the methods registry reaches glue") for v in found), found
    assert any(v.startswith("tools reach glue") for v in found), found
    assert "tools import data_prep: recipe.mrtpo.tools.agree" in found, found
    # the TRL adapter reaching the glue, and (through the task registry) verl
    write("recipe/mrtpo/trl_adapter/__init__.py", "from recipe.mrtpo.step import trainer\nfrom recipe.mrtpo.tasks import x\n")
    write("recipe/mrtpo/tasks/__init__.py", "")
    write("recipe/mrtpo/tasks/x.py", "import verl\n")
    write("recipe/mrtpo/step/trainer.py", "")
    found = violations(tmp_path)
    assert "the TRL adapter imports recipe.mrtpo.step.trainer: recipe.mrtpo.trl_adapter" in found, found
    assert any(v.startswith("the TRL adapter reaches glue") for v in found), found
    assert any(v.startswith("the TRL adapter reaches an import of ['verl']") for v in found), found
    # the registry's command line with a third-party import at module level
    write("recipe/mrtpo/methods/__init__.py", "import torch\n")
    assert any(v.startswith("the registry's command line imports ['torch']") for v in violations(tmp_path))


@pytest.mark.parametrize("rel", ["from . import b\n", "from .b import x\n", "from recipe.pkg.b import x\n"])
def test_relative_and_absolute_imports_resolve_to_the_same_module(tmp_path, rel):
    for f, text in {"recipe/__init__.py": "", "recipe/pkg/__init__.py": "", "recipe/pkg/a.py": rel,
                    "recipe/pkg/b.py": "x = 1\n"}.items():
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text(text)
    graph, _ = build_graph(tmp_path)
    assert "recipe.pkg.b" in graph["recipe.pkg.a"]


def test_the_rooms_checker_finds_a_loose_module_and_an_arrow_up(tmp_path):
    for f, text in {"recipe/__init__.py": "", "recipe/mrtpo/__init__.py": "", "recipe/mrtpo/main_mrtpo.py": "",
                    "recipe/mrtpo/core/__init__.py": "", "recipe/mrtpo/core/maths.py": "from recipe.mrtpo.step import trainer\n",
                    "recipe/mrtpo/step/__init__.py": "", "recipe/mrtpo/step/trainer.py": "from recipe.mrtpo.core import maths\n",
                    "recipe/mrtpo/helper.py": "", "recipe/mrtpo/attic/old.py": "from recipe.mrtpo.core import maths\n"}.items():
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text(text)
    graph, _ = build_graph(tmp_path)
    found = room_breaches(graph, tmp_path)
    assert "a loose module in recipe/mrtpo/: helper.py" in found, found
    assert "an import up the floors: recipe.mrtpo.core.maths (core) -> recipe.mrtpo.step (step)" in found, found
    assert any(v.startswith("a room not in ROOMS: attic") for v in found), found
    assert not any("recipe.mrtpo.step.trainer (step) ->" in v for v in found), found  # downward: allowed


def test_no_module_of_the_recipe_is_longer_than_the_limit(tmp_path):
    too_long = oversized() + oversized(package="data_prep")
    assert too_long == [], f"split these modules (at most {MAX_MODULE_LINES} lines each)"
    # the check finds one line too many
    (tmp_path / "recipe" / "pkg").mkdir(parents=True)
    (tmp_path / "recipe" / "pkg" / "ok.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    (tmp_path / "recipe" / "pkg" / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert oversized(tmp_path) == [f"recipe/pkg/long.py: {MAX_MODULE_LINES + 1} lines"]
