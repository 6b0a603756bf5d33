"""How ``python -m recipe.mrtpo.main_mrtpo`` reports a launch it refuses: one line, the traceback behind a flag.

A mistyped override (``mrtpo.bta=0.3``), a value the recipe's checks refuse (``mrtpo.beta=1.5``) or a
missing local model folder or data file is a mistake in the command line, not a crash: it is printed as

    main_mrtpo: error: unknown config key 'mrtpo.bta' (did you mean 'mrtpo.beta'?)  [traceback: --debug or MRTPO_DEBUG=1]

and the process exits with status 2 (Hydra's own report of a composition error is six lines and suggests
``+mrtpo.bta=...``, which the recipe's schema then refuses as well; with ``HYDRA_FULL_ERROR=1``, which the
run scripts set, it is a ~70-line traceback). ``--debug`` (anywhere on the command line; removed before
Hydra sees it) or ``MRTPO_DEBUG=1`` shows the full traceback instead. Everything else (an error inside
the Ray job: a training crash) keeps its full traceback: one line would hide where it happened.

Which errors are "launch errors": Hydra's composition and override errors, OmegaConf's key and
validation errors, and ``ValueError`` / ``FileNotFoundError`` / ``AssertionError`` raised in the driver
before Ray runs the job (the recipe's ``check_config``, the schema, verl's ``validate_config``,
:func:`check_local_paths`); of the exceptions that come back from Ray only one: the node check's missing file
(``recipe.mrtpo.launch.node_check``, run in the task runner before the first step; its line names the file and the node),
a node that does not answer it, a checkpoint folder a node does not share, and a refused resume
(``recipe.mrtpo.cluster.checkpoint_shards``).

Public names: :func:`check_local_paths`, :func:`one_line`, :func:`is_launch_error`,
:func:`launch_errors_in_one_line`, :func:`run_hydra_main`.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

__all__ = ["DEBUG_FLAG", "DEBUG_ENV", "looks_local", "check_local_paths", "one_line", "is_launch_error", "launch_errors_in_one_line",
           "run_hydra_main"]

DEBUG_FLAG = "--debug"
DEBUG_ENV = "MRTPO_DEBUG"
_HINT = f"[traceback: {DEBUG_FLAG} or {DEBUG_ENV}=1]"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def looks_local(value: str) -> bool:
    """A model path meant as a local folder: absolute, ``./``, ``../`` or ``~``, or anything that is not a
    hub id (``org/name``)."""
    return value.startswith(("/", "./", "../", "~")) or not _HUB_ID.match(value) and "/" in value


def check_local_paths(config) -> None:
    """Refuse, before Ray starts, a local model folder or a data file that does not exist.

    ``actor_rollout_ref.model.path``: a local folder must exist (a hub id such as ``Qwen/Qwen2.5-7B-Instruct``
    is left to transformers); ``data.train_files`` / ``data.val_files``: every local file must exist
    (``hdfs://`` and other URLs are left to verl). Without this, verl fails inside the Ray job with a
    traceback of some hundred lines, after the cluster has started."""
    model = str(config.actor_rollout_ref.model.path)
    if looks_local(model) and not Path(model).expanduser().exists():
        raise FileNotFoundError(f"actor_rollout_ref.model.path={model}: no such folder (a local model folder, "
                                f"e.g. one written by `python -m recipe.mrtpo.tools.export`, or a hub id such as "
                                f"Qwen/Qwen2.5-7B-Instruct)")
    for key in ("train_files", "val_files"):
        files = config.data.get(key)
        files = [files] if isinstance(files, str) else list(files or [])
        missing = [str(f) for f in files if "://" not in str(f) and not Path(str(f)).expanduser().exists()]
        if missing:
            raise FileNotFoundError(f"data.{key}: no such file {missing[0]}"
                                    + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
                                    + " (build the data first: docs/data.md)")


def _key_suggestion(exc: BaseException) -> Optional[str]:
    """``unknown config key 'a.b' (did you mean 'a.c'?)`` for an OmegaConf struct-mode key error."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    for err in (exc, exc.__cause__, exc.__context__):
        if isinstance(err, (ConfigKeyError, ConfigAttributeError)) and getattr(err, "full_key", None):
            full_key, key = str(err.full_key), str(getattr(err, "key", "") or str(err.full_key).rsplit(".", 1)[-1])
            parent = getattr(err, "parent_node", None)
            known = [str(k) for k in parent.keys()] if parent is not None and hasattr(parent, "keys") else []
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            prefix = full_key[: -len(key)] if full_key.endswith(key) else ""
            hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
            return f"unknown config key '{full_key}'{hint}"
    return None


def _node_file_cause(exc: BaseException) -> Optional[BaseException]:
    """The recipe's refusal from inside the job behind a Ray error (``RayTaskError.cause``), else None: the node
    check's missing file, unanswered node or unshared checkpoint folder, a refused resume."""
    from recipe.mrtpo.cluster.checkpoint_shards import RESUME_MARK
    from recipe.mrtpo.cluster.node_files import NODE_CHECK_MARK, is_missing_file

    cause = getattr(exc, "cause", None)
    text = str(cause)
    refusal = is_missing_file(text) or NODE_CHECK_MARK in text or RESUME_MARK in text
    return cause if isinstance(cause, (FileNotFoundError, TimeoutError, RuntimeError)) and refusal else None


def one_line(exc: BaseException) -> str:
    """The message of a launch error on one line (module docstring)."""
    refusal = _node_file_cause(exc)
    exc = refusal or exc
    text = _key_suggestion(exc)
    if text is None:
        text = str(exc).strip() or type(exc).__name__
        if refusal is None and not isinstance(exc, (ValueError, FileNotFoundError)):
            text = f"{type(exc).__name__}: {text}"
    text = text.split("\n    full_key:", 1)[0]  # OmegaConf's appended context
    return " ".join(text.split())


def is_launch_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a mistake in the launch's input (module docstring), not a crash."""
    try:
        from ray.exceptions import RayError
    except ImportError:  # pragma: no cover - ray is a dependency of verl
        RayError = ()
    if RayError and isinstance(exc, RayError):
        return _node_file_cause(exc) is not None
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    return isinstance(exc, (HydraException, OmegaConfBaseException, ValueError, FileNotFoundError, AssertionError))


def _debug() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


@contextmanager
def launch_errors_in_one_line(prog: str = "main_mrtpo") -> Iterator[None]:
    """Report a launch error raised in the block in one line and exit with status 2 (``SystemExit``, which
    Hydra lets through without its own report); with ``MRTPO_DEBUG=1``, or any other error, re-raise."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - sorted below; anything not a launch error is re-raised
        if _debug() or not is_launch_error(exc):
            raise
        print(f"{prog}: error: {one_line(exc)}  {_HINT}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def run_hydra_main(hydra_main: Callable[[], None], prog: str = "main_mrtpo", argv: Optional[list[str]] = None) -> None:
    """Run a ``@hydra.main`` function with launch errors in one line (:func:`launch_errors_in_one_line`).

    ``--debug`` is taken out of ``sys.argv`` (or ``argv``) and turned into ``MRTPO_DEBUG=1``; Hydra is
    told to re-raise its composition errors (``HYDRA_FULL_ERROR=1``) so that they reach the handler
    instead of Hydra's own report. Errors inside the job reach Hydra's report only if the task function
    lets them: ``main_mrtpo.main`` runs its body in :func:`launch_errors_in_one_line` too."""
    args = sys.argv if argv is None else argv
    if DEBUG_FLAG in args[1:]:
        args[1:] = [a for a in args[1:] if a != DEBUG_FLAG]
        os.environ[DEBUG_ENV] = "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"
    with launch_errors_in_one_line(prog):
        hydra_main()
