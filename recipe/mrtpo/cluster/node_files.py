"""Files a worker reads on its own node: resolved against two documented roots, checked, never a silent 0.

Reward and agent-loop workers run on every node of a Ray cluster (verl 0.9.1's ``reward_loop.py``,
``agent_loop.py``), so a file a row names (a SQL database, a BFCL asset, a tool config) must exist on each node.
The two roots, the one place that says where a worker looks (the run scripts pass both to every worker through
Ray's runtime env; doctor, the node check and the verifiers read them with the functions below):

- the data root, ``$MRTPO_DATA_ROOT`` (default: the repository's ``data/``): rows store their files (SQL
  databases) relative to it; a path that is absolute stays as it is (:func:`data_root`, :func:`resolve`);
- the asset root, ``$MRTPO_ASSETS`` (default: the repository's ``.assets/``, what ``run_scripts/fetch_assets.py``
  unpacks): the verifiers' own data, NLTK's under ``nltk_data/`` (:func:`nltk_data_dir`; ``$MRTPO_NLTK_DATA``
  overrides that one folder). BFCL's data and backends are the installed ``bfcl-eval`` package's (checked as
  modules), tool configs are files the settings name (checked as given).
 A file that is not there is reported in one line naming the file and the node
(:func:`missing_line`): before the first step by the node check (``node_check``), and during the run in the
verifier's error, where the row then leaves the advantage (``reward_extras``; counted as ``mrtpo/missing_files``),
never as a reward of 0.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from pathlib import Path

DATA_ROOT_ENV = "MRTPO_DATA_ROOT"
ASSETS_ENV = "MRTPO_ASSETS"
NLTK_DATA_ENV = "MRTPO_NLTK_DATA"
#: the NLTK resources the IFEval / IFBench checkers load (sentence splitting, stop words; IFBench's import-time
#: probes of punkt and the tagger are refused, ``tasks.if_registry``), as ``nltk.data.find`` names them
NLTK_RESOURCES = ("tokenizers/punkt_tab/english/", "corpora/stopwords/english")
#: how the node check's other refusals begin (a node that does not answer, a checkpoint folder it does not share)
NODE_CHECK_MARK = "mrtpo: node check: "
#: how :func:`missing_line` begins (the node's name follows): what the trainer and the launch recognise it by
MISSING_MARK = "mrtpo: file not found on node "
_REPO = Path(__file__).resolve().parents[3]


def data_root() -> Path:
    """``$MRTPO_DATA_ROOT`` when set (and not empty), else the repository's ``data/``."""
    env = os.environ.get(DATA_ROOT_ENV, "").strip()
    return Path(env).expanduser() if env else _REPO / "data"


def assets_root() -> Path:
    """``$MRTPO_ASSETS`` when set (and not empty), else the repository's ``.assets/``."""
    env = os.environ.get(ASSETS_ENV, "").strip()
    return Path(env).expanduser() if env else _REPO / ".assets"


def nltk_data_dir() -> Path:
    """Where the IF checkers' NLTK data is: ``$MRTPO_NLTK_DATA`` when set, else ``<asset root>/nltk_data``."""
    env = os.environ.get(NLTK_DATA_ENV, "").strip()
    return Path(env).expanduser() if env else assets_root() / "nltk_data"


def missing_nltk(resources: Iterable[str] = NLTK_RESOURCES) -> str | None:
    """The first of ``resources`` that NLTK does not find under :func:`nltk_data_dir` alone (its zip archives
    included), or None; ``"nltk"`` itself where the package is not installed."""
    try:
        import nltk
    except ImportError:
        return "nltk"
    for r in resources:
        try:
            nltk.data.find(r, paths=[str(nltk_data_dir())])
        except LookupError:
            return r
    return None


def resolve(path: str) -> str:
    """An absolute path for ``path``: relative paths are under :func:`data_root`, absolute ones stay."""
    p = Path(path).expanduser()
    return str(p if p.is_absolute() else data_root() / p)


def relative_to_root(path: str | Path, root: Path | None = None) -> str:
    """How a row stores ``path``: relative to the data root when it lies under it, else absolute."""
    p = Path(path).resolve()
    base = Path(root if root is not None else data_root()).resolve()
    try:
        return p.relative_to(base).as_posix()
    except ValueError:
        return str(p)


def node_name() -> str:
    """This node's host name (the name a one-line error gives)."""
    return socket.gethostname()


def missing_line(path: str, stored: str | None = None, named_by: str | None = None) -> str:
    """One line: which file is missing on which node, and the data root it was resolved against (a row's file,
    ``stored`` as the row stores it) or the setting that names it (``named_by``: a file the run's settings name)."""
    if named_by:
        return f"{MISSING_MARK}{node_name()}: {path} (named by {named_by}; it must be there on every node)"
    shown = path if stored is None or stored == path else f"{path} (row: {stored})"
    return (f"{MISSING_MARK}{node_name()}: {shown}; "
            f"{DATA_ROOT_ENV}={data_root()} (set it to the same data on every node)")


def is_missing_file(text: str) -> bool:
    """Whether an error text (a verifier's ``mrtpo_error``, an exception's message) holds a :func:`missing_line`."""
    return MISSING_MARK in str(text or "")


def first_missing(paths: Iterable[str]) -> str | None:
    """:func:`missing_line` for the first of ``paths`` (as rows store them) missing here, or None."""
    for stored in paths:
        if not os.path.isfile(resolve(stored)):
            return missing_line(resolve(stored), stored)
    return None
