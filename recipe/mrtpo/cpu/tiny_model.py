"""A tiny random Qwen2 with the real Qwen2 tokenizer, for CPU tests and the CPU quickstart (or with a task
vocabulary: Qwen2's tokenizer pipeline and special tokens over a small BPE trained on a task's texts).

The model is random (it generates near-uniform samples over the vocabulary) but everything around it
is the real thing: the real Qwen2 byte-level BPE (converted from ``qwen.tiktoken`` with transformers'
``TikTokenConverter``, no hub download), Qwen2's special tokens with their real ids, a ChatML chat
template, the real vocabulary size (151,936) and a Qwen2 architecture that vLLM's CPU backend serves
(head_dim >= 32: its CPU attention supports head sizes 32, 64, 80, ...).

Public names:

- :func:`build_qwen2_tokenizer` (``out_dir`` gets ``tokenizer.json`` + ``tokenizer_config.json``);
- :func:`build_tiny_qwen2` (``out_dir`` gets config, ``model.safetensors``, generation config and
  the tokenizer, loadable by ``AutoTokenizer`` / ``AutoModelForCausalLM.from_pretrained`` and vLLM);
- :func:`build_task_tokenizer`: the same pipeline (NFC, Qwen2's pre-tokenizer, byte-level BPE, the
  special tokens and the chat template) with a BPE of a few hundred to a few thousand tokens trained on
  given texts; :func:`build_tiny_qwen2` takes it as ``tokenizer_dir``. At hidden size 128 the
  151,936-row LM head is nearly all of a tiny model's compute: a training step of the format-speed
  experiment (128 responses) took ~77 s under the real vocabulary and ~7 s under a 449-token task
  vocabulary on the 2-core CI machine (verl's ``timing_s/step``, ``docs/format_speed``), so an
  experiment that runs many training steps on one task can use a task vocabulary;
- :func:`eos_token_ids` (the ids generation stops at, read from a tokenizer);
- :data:`CHATML_TEMPLATE`, :data:`QWEN2_SPECIAL_TOKENS`, :data:`QWEN2_VOCAB_SIZE`;
- CLI: ``python -m recipe.mrtpo.cpu.tiny_model --out DIR``.

Both builders are cached by a key (every argument, the BPE file's size and hash, the template, this
module's format version, the transformers version) written to ``out_dir``: a second call with the same
key returns at once, a call with another key rebuilds in place.

Chat template (written by this project, not copied from a model card): ChatML turns
``<|im_start|>{role}\\n{content}<|im_end|>\\n`` for ``system``/``user``/``assistant`` messages, and a
``tool`` message rendered as Qwen2.5 does (a user turn with ``<tool_response>`` blocks, consecutive
tool messages sharing one turn); ``add_generation_prompt`` appends ``<|im_start|>assistant\\n``. It
adds **no default system prompt**: Qwen2.5-Instruct's template inserts "You are Qwen, created by
Alibaba Cloud. You are a helpful assistant." when the conversation has none; this template renders
exactly the messages it is given, so a prompt without a system turn starts with the user turn. The
``tools=`` argument of ``apply_chat_template`` is not rendered (the recipe's tool-calling task writes
its tools section into the system message itself).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

REPO_ROOT = Path(__file__).resolve().parents[3]


def default_tiktoken_path() -> Path:
    """``$MRTPO_ASSETS/qwen/qwen.tiktoken`` (``MRTPO_ASSETS`` defaults to ``<repo>/.assets``, as in setup.sh)."""
    return Path(os.environ.get("MRTPO_ASSETS") or REPO_ROOT / ".assets") / "qwen" / "qwen.tiktoken"


# Bump when the files written here change in a way the cache key would not see.
_FORMAT_VERSION = "1"
_KEY_FILE = ".mrtpo-tiny-key"

QWEN2_VOCAB_SIZE = 151_936  # embedding rows of every Qwen2/Qwen2.5 model (BPE ranks 0..151642 + specials + padding)
QWEN2_NUM_BPE_RANKS = 151_643

# Qwen2's pre-tokenizer regex (as in Qwen2's tokenizer.json and transformers' Qwen2Tokenizer): single
# digits (``\p{N}``), unlike the converter's cl100k default (``\p{N}{1,3}``).
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Qwen2.5's added tokens, (id, content, special) as in its tokenizer_config.json. The tool-call and
# FIM/repo tokens are added tokens but not "special" there (they survive skip_special_tokens).
QWEN2_SPECIAL_TOKENS: tuple[tuple[int, str, bool], ...] = (
    (151643, "<|endoftext|>", True),
    (151644, "<|im_start|>", True),
    (151645, "<|im_end|>", True),
    (151646, "<|object_ref_start|>", True),
    (151647, "<|object_ref_end|>", True),
    (151648, "<|box_start|>", True),
    (151649, "<|box_end|>", True),
    (151650, "<|quad_start|>", True),
    (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True),
    (151653, "<|vision_end|>", True),
    (151654, "<|vision_pad|>", True),
    (151655, "<|image_pad|>", True),
    (151656, "<|video_pad|>", True),
    (151657, "<tool_call>", False),
    (151658, "</tool_call>", False),
    (151659, "<|fim_prefix|>", False),
    (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False),
    (151662, "<|fim_pad|>", False),
    (151663, "<|repo_name|>", False),
    (151664, "<|file_sep|>", False),
)

# vLLM 0.28's CPU attention backend (CPUAttentionBackend.get_supported_head_sizes, v1/attention/backends/cpu_attn.py).
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)

EOS_TOKEN = "<|im_end|>"  # chat models end a turn with <|im_end|> (Qwen2.5-Instruct's eos_token)
PAD_TOKEN = "<|endoftext|>"
EOS_TOKEN_IDS = [151645, 151643]  # generation stops at either (Qwen2.5-Instruct's generation_config)

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}"
    "{{- '<|im_start|>user' }}"
    "{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- elif message['role'] in ['system', 'user', 'assistant'] %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- raise_exception('unsupported chat role: ' + message['role']) }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def _key(kind: str, **parts) -> str:
    # importlib.metadata, not `import transformers`: a cache hit should not pay for the import.
    from importlib.metadata import version

    payload = {"kind": kind, "format": _FORMAT_VERSION, "transformers": version("transformers"), **parts}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _cached(out_dir: Path, key: str) -> bool:
    try:
        return (out_dir / _KEY_FILE).read_text().strip() == key
    except OSError:
        return False


def _resolve_tiktoken(tiktoken_path: Optional[os.PathLike]) -> Path:
    path = Path(tiktoken_path) if tiktoken_path is not None else default_tiktoken_path()
    if not path.is_file():
        raise FileNotFoundError(
            f"Qwen2 BPE ranks not found at {path}. Run `bash run_scripts/setup.sh` (it unpacks "
            "qwen.tiktoken into .assets/qwen/) or pass tiktoken_path=."
        )
    return path


def _convert_tokenizer(tiktoken_path: Path):
    """The Qwen2 byte-level BPE as a ``tokenizers.Tokenizer`` with Qwen2's added tokens at their ids."""
    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    tok = TikTokenConverter(vocab_file=str(tiktoken_path), pattern=QWEN2_PRETOKENIZE_REGEX).converted()
    tok.normalizer = normalizers.NFC()  # as Qwen2's tokenizer.json
    if tok.get_vocab_size(with_added_tokens=False) != QWEN2_NUM_BPE_RANKS:
        raise ValueError(
            f"{tiktoken_path} has {tok.get_vocab_size(with_added_tokens=False)} BPE ranks, Qwen2 has "
            f"{QWEN2_NUM_BPE_RANKS}: not the Qwen2 qwen.tiktoken"
        )
    for tid, content, special in QWEN2_SPECIAL_TOKENS:  # in id order, so each lands on the next free id
        token = AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special)
        if special:
            tok.add_special_tokens([token])
        else:
            tok.add_tokens([token])
        got = tok.token_to_id(content)
        if got != tid:
            raise RuntimeError(f"{content} got id {got}, Qwen2 has {tid}")
    return tok


def build_qwen2_tokenizer(out_dir: os.PathLike, tiktoken_path: Optional[os.PathLike] = None) -> Path:
    """Write the Qwen2 tokenizer (real BPE, Qwen2 special tokens, the ChatML template) to ``out_dir``.

    ``tiktoken_path`` defaults to :func:`default_tiktoken_path` (``<repo>/.assets/qwen/qwen.tiktoken``,
    provisioned by setup.sh).
    Returns ``out_dir``. Cached: a second call with the same inputs only reads the key file.
    """
    out = Path(out_dir)
    src = _resolve_tiktoken(tiktoken_path)
    key = _key("tokenizer", bpe=_file_digest(src), template=CHATML_TEMPLATE, specials=QWEN2_SPECIAL_TOKENS)
    if _cached(out, key):
        return out
    out.mkdir(parents=True, exist_ok=True)
    _write_tokenizer(out, src)
    (out / _KEY_FILE).write_text(key + "\n")
    return out


def _write_tokenizer(out: Path, src) -> None:
    """``tokenizer.json`` + ``tokenizer_config.json`` of ``src``: a ``qwen.tiktoken`` path (the real
    Qwen2 tokenizer) or a ``tokenizers.Tokenizer`` holding Qwen2's added tokens (a task vocabulary)."""
    tok = _convert_tokenizer(src) if isinstance(src, (str, os.PathLike)) else src
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "model_max_length": 32768,
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": None,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "split_special_tokens": False,
        "chat_template": CHATML_TEMPLATE,
        "added_tokens_decoder": {
            str(tok.token_to_id(content)): {
                "content": content,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": special,
            }
            for _, content, special in QWEN2_SPECIAL_TOKENS
        },
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def build_task_tokenizer(out_dir: os.PathLike, texts: Sequence[str], vocab_size: int,
                         tiktoken_path: Optional[os.PathLike] = None) -> Path:
    """Write a task-vocabulary tokenizer to ``out_dir``: Qwen2's normalizer, pre-tokenizer and byte-level
    decoder (taken from the real tokenizer) over a byte-level BPE of at most ``vocab_size`` tokens trained
    on ``texts`` (the 256 bytes first, so any text still encodes), then Qwen2's added tokens (the same
    contents and special flags as :data:`QWEN2_SPECIAL_TOKENS`, at the ids after the BPE), and the ChatML
    template. Training is deterministic; cached by a key of the texts, ``vocab_size`` and the BPE file.
    Returns ``out_dir``."""
    from tokenizers import AddedToken, Tokenizer, models, trainers
    from tokenizers.pre_tokenizers import ByteLevel

    if vocab_size < 257:
        raise ValueError(f"vocab_size {vocab_size}: a byte-level BPE needs more than its 256 byte tokens")
    texts = [t for t in texts if isinstance(t, str) and t]
    if not texts:
        raise ValueError("no texts to train the task vocabulary on")
    out = Path(out_dir)
    src = _resolve_tiktoken(tiktoken_path)
    corpus = hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:16]
    key = _key("task-tokenizer", bpe=_file_digest(src), corpus=corpus, vocab_size=vocab_size,
               template=CHATML_TEMPLATE, specials=QWEN2_SPECIAL_TOKENS)
    if _cached(out, key):
        return out
    real = _convert_tokenizer(src)
    tok = Tokenizer(models.BPE())
    tok.normalizer, tok.pre_tokenizer, tok.decoder = real.normalizer, real.pre_tokenizer, real.decoder
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    for _, content, special in QWEN2_SPECIAL_TOKENS:
        token = AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special)
        (tok.add_special_tokens if special else tok.add_tokens)([token])
    out.mkdir(parents=True, exist_ok=True)
    (out / _KEY_FILE).unlink(missing_ok=True)
    _write_tokenizer(out, tok)
    (out / _KEY_FILE).write_text(key + "\n")
    return out


def eos_token_ids(tokenizer) -> list[int]:
    """The ids generation stops at: ``<|im_end|>`` then ``<|endoftext|>`` in ``tokenizer`` (a transformers
    tokenizer), as :data:`EOS_TOKEN_IDS` for the real vocabulary."""
    ids = [tokenizer.convert_tokens_to_ids(t) for t in (EOS_TOKEN, PAD_TOKEN)]
    if any(i is None or i == tokenizer.unk_token_id for i in ids):
        raise ValueError(f"the tokenizer lacks {EOS_TOKEN} or {PAD_TOKEN}")
    return [int(i) for i in ids]


def _tiny_config(hidden_size: int, num_layers: int, num_heads: int, num_kv_heads: int,
                 vocab_size: int = QWEN2_VOCAB_SIZE, pad_id: int = 151643, eos_id: int = EOS_TOKEN_IDS[0]):
    from transformers import Qwen2Config

    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} is not a multiple of num_heads {num_heads}")
    head_dim = hidden_size // num_heads
    if head_dim not in VLLM_CPU_HEAD_SIZES:
        raise ValueError(
            f"head_dim = hidden_size / num_heads = {head_dim}: vLLM's CPU attention supports head sizes "
            f"{VLLM_CPU_HEAD_SIZES} (e.g. hidden 64 with 2 heads)"
        )
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=4096,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        torch_dtype="bfloat16",
    )


def build_tiny_qwen2(
    out_dir: os.PathLike,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    seed: int = 0,
    tiktoken_path: Optional[os.PathLike] = None,
    tokenizer_dir: Optional[os.PathLike] = None,
) -> Path:
    """Write a random tiny Qwen2 (tied embeddings, bf16) and its tokenizer to ``out_dir``.

    The tokenizer is the real Qwen2 one (vocabulary 151,936) unless ``tokenizer_dir`` holds one written
    by :func:`build_task_tokenizer`; the embedding then has that tokenizer's size rounded up to a multiple
    of 64 (Qwen2 pads its embedding past the tokenizer too), and the special ids are that tokenizer's.
    Defaults give head_dim 32 and ~9.8M parameters (19.6 MB in bf16) under the real vocabulary, nearly
    all of it the embedding. The weights depend only on the arguments, ``seed`` (transformers' Qwen2
    initialisation under ``torch.manual_seed(seed)``) and the tokenizer. Returns ``out_dir``; cached by a
    key of every input.
    """
    out = Path(out_dir)
    src = _resolve_tiktoken(tiktoken_path)
    task_tok = None if tokenizer_dir is None else Path(tokenizer_dir) / "tokenizer.json"
    if task_tok is not None and not task_tok.is_file():
        raise FileNotFoundError(f"no tokenizer.json in {tokenizer_dir} (write it with build_task_tokenizer)")
    key = _key(
        "model",
        shape=(hidden_size, num_layers, num_heads, num_kv_heads),
        seed=seed,
        bpe=_file_digest(src),
        template=CHATML_TEMPLATE,
        specials=QWEN2_SPECIAL_TOKENS,
        **({} if task_tok is None else {"task_tokenizer": _file_digest(task_tok)}),
    )
    if _cached(out, key):
        return out

    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM

    if task_tok is None:
        vocab, pad_id, eos_ids = QWEN2_VOCAB_SIZE, 151643, EOS_TOKEN_IDS
    else:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(task_tok))
        size = tok.get_vocab_size(with_added_tokens=True)
        vocab = -(-size // 64) * 64
        pad_id, eos_ids = tok.token_to_id(PAD_TOKEN), [tok.token_to_id(EOS_TOKEN), tok.token_to_id(PAD_TOKEN)]
        if pad_id is None or None in eos_ids:
            raise ValueError(f"{task_tok} lacks {EOS_TOKEN} or {PAD_TOKEN}")
    config = _tiny_config(hidden_size, num_layers, num_heads, num_kv_heads, vocab, pad_id, eos_ids[0])
    out.mkdir(parents=True, exist_ok=True)
    # Build next to out_dir and move the files in, so an interrupted build never leaves a half model
    # behind a valid key.
    (out / _KEY_FILE).unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.build-") as tmp:
        tmp = Path(tmp)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = Qwen2ForCausalLM(config).to(torch.bfloat16)
        model.generation_config = GenerationConfig(
            bos_token_id=pad_id, eos_token_id=list(eos_ids), pad_token_id=pad_id, do_sample=True
        )
        model.save_pretrained(tmp, safe_serialization=True)
        if task_tok is None:
            _write_tokenizer(tmp, src)
        else:
            for f in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy(Path(tokenizer_dir) / f, tmp / f)
        for f in tmp.iterdir():
            f.chmod(0o644)
            shutil.move(str(f), str(out / f.name))
    (out / _KEY_FILE).write_text(key + "\n")
    return out


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path, help="output directory (model + tokenizer)")
    p.add_argument(
        "--tiktoken", type=Path, default=None, help="qwen.tiktoken (default $MRTPO_ASSETS/qwen/qwen.tiktoken)"
    )
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--num-heads", type=int, default=2)
    p.add_argument("--num-kv-heads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer-only", action="store_true", help="write only the tokenizer")
    a = p.parse_args(argv)
    if a.tokenizer_only:
        out = build_qwen2_tokenizer(a.out, tiktoken_path=a.tiktoken)
    else:
        out = build_tiny_qwen2(
            a.out, a.hidden_size, a.num_layers, a.num_heads, a.num_kv_heads, a.seed, tiktoken_path=a.tiktoken
        )
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
