"""SmolLM2's tokenizer, as ``recipe.mrtpo.cpu.smollm2`` converts it from the GGUF.

The GGUF names its pre-tokenizer ``smollm`` (``tokenizer.ggml.pre``): llama.cpp isolates each digit (``\\p{N}``)
and runs GPT-2's regex on what lies between. transformers' GGUF loader ignores the key and runs GPT-2's regex alone,
which splits a whitespace run before a digit differently (``"\\n\\n1."``: ``Ċ Ċ 1 .`` against ``ĊĊ 1 .``); 13 of the
330 responses in ``docs/real_model/pairs.json`` tokenize differently. The reference below is llama.cpp's rule
written out with the ``regex`` module and the vocabulary's own BPE, independent of the tokenizers pre-tokenizers.
"""

from __future__ import annotations

import json

import pytest
import regex
from tokenizers import Tokenizer
from tokenizers.models import BPE

from recipe.mrtpo.cpu import smollm2

GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
DIGIT_STRINGS = ["Steps:\n\n1. Mix the flour", "a  2 b   34", "In 2024, 3.14 and 1,000,000", "Q2\n\n\n3)", "P.S. 12 days",
                 "<<Title 7>>\n\n* 1st\n  2nd", "x1y22 z"]


def _byte_map() -> dict[int, str]:
    """GPT-2's bytes -> printable characters table (the ByteLevel alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


BYTES = _byte_map()


def smollm_pieces(text: str) -> list[str]:
    """llama.cpp's ``smollm`` pre-tokenization: each ``\\p{N}`` alone, GPT-2's regex on the stretches between."""
    out: list[str] = []
    for part in regex.split(r"(\p{N})", text):
        if part:
            out += [part] if regex.fullmatch(r"\p{N}", part) else regex.findall(GPT2, part)
    return out


def reference_ids(model, text: str) -> list[int]:
    return [t.id for p in smollm_pieces(text) for t in model.tokenize("".join(BYTES[b] for b in p.encode()))]


def tiny_tokenizer() -> dict:
    """A byte-level BPE with whitespace-run merges, pre-tokenized as transformers' GGUF conversion writes it."""
    alphabet = sorted(set(BYTES.values()))
    vocab = {c: i for i, c in enumerate(alphabet)}
    merges = [("Ċ", "Ċ"), ("Ġ", "Ġ"), ("ĠĠ", "Ġ")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(BPE(vocab, merges))
    data = json.loads(tok.to_str())
    data["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True}
    return data


def encode(data: dict, text: str) -> list[int]:
    return Tokenizer.from_str(json.dumps(data)).encode(text, add_special_tokens=False).ids


def test_the_smollm_pre_tokenizer_isolates_digits_as_llama_cpp_does():
    old = tiny_tokenizer()
    new = smollm2.fix_tokenizer_json(old, "smollm")
    model = Tokenizer.from_str(json.dumps(new)).model
    for text in DIGIT_STRINGS:
        assert encode(new, text) == reference_ids(model, text), text
    # GPT-2's pre-tokenizer alone (the unfixed conversion) splits these differently
    assert encode(old, "Steps:\n\n1.") != reference_ids(model, "Steps:\n\n1.")
    assert encode(old, "a   2") != reference_ids(model, "a   2")
    assert new["decoder"]["type"] == "ByteLevel" and old["pre_tokenizer"] == tiny_tokenizer()["pre_tokenizer"]


def test_an_unknown_gguf_pre_tokenizer_is_refused():
    with pytest.raises(ValueError, match="tokenizer.ggml.pre 'qwen2' has no pre-tokenizer here"):
        smollm2.fix_tokenizer_json(tiny_tokenizer(), "qwen2")


def test_the_provisioned_tokenizer_is_smollm2s():
    """The asset setup builds (``require()`` refuses a folder of an older format): digits, EOS and padding."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2.require())
    model = tok.backend_tokenizer.model
    for text in DIGIT_STRINGS:
        assert tok(text, add_special_tokens=False)["input_ids"] == reference_ids(model, text), text
        assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    assert tok.convert_ids_to_tokens(tok("\n\n1", add_special_tokens=False)["input_ids"]) == ["ĊĊ", "1"]
    assert (tok.eos_token, tok.pad_token, tok.bos_token) == ("<|im_end|>", "<|im_end|>", "<|im_start|>")
