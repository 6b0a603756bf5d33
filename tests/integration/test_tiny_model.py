"""recipe.mrtpo.cpu.tiny_model: the real Qwen2 tokenizer (ids, special tokens, chat template) and the tiny model
(loads with transformers, forwards, cached by key). vLLM serving it is covered by tests/e2e."""

from __future__ import annotations

import json

import pytest
import torch

from recipe.mrtpo.cpu import tiny_model as tm


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tm.build_tiny_qwen2(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def tok(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


# ---------------------------------------------------------------- tokenizer


def test_known_qwen2_ids(tok):
    assert tok.encode("Hello, world!") == [9707, 11, 1879, 0]
    assert tok("Hello, world!")["input_ids"] == [9707, 11, 1879, 0]  # no BOS is added, as Qwen2
    assert tok.encode("12345") == [16, 17, 18, 19, 20]  # Qwen2's regex splits digits one by one
    assert tok.encode("user") == [872] and tok.encode("assistant") == [77091] and tok.encode("\n") == [198]


def test_pretokenizer_is_qwen2s():
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    assert tm.QWEN2_PRETOKENIZE_REGEX == PRETOKENIZE_REGEX


@pytest.mark.parametrize("tid,content,special", tm.QWEN2_SPECIAL_TOKENS)
def test_special_tokens_have_their_qwen2_ids(tok, tid, content, special):
    assert tok.convert_tokens_to_ids(content) == tid
    assert tok.encode(content) == [tid]  # never split into BPE pieces
    assert tok.decode([tid]) == content


def test_vocabulary_and_roles(tok):
    assert len(tok) == 151_665 < tm.QWEN2_VOCAB_SIZE  # embeddings are padded past the tokenizer, as Qwen2
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 151645
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 151643
    assert tok.bos_token is None


def test_round_trip_and_skip_special(tok):
    text = "Straße café 你好 🙂\n\n  x = 42;\ttabs"
    assert tok.decode(tok.encode(text)) == text
    ids = tok.encode('<tool_call>{"name": "f"}</tool_call><|im_end|>')
    assert ids[0] == 151657 and ids[-2:] == [151658, 151645]
    # As Qwen2.5: tool-call tags are added tokens but not special, so they survive skip_special_tokens.
    assert tok.decode(ids, skip_special_tokens=True) == '<tool_call>{"name": "f"}</tool_call>'


# ---------------------------------------------------------------- chat template


def test_chat_template_system_user_generation_prompt(tok):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)["input_ids"]
    assert ids == tok.encode(text)
    assert ids[:3] == [151644, 8948, 198] and ids[-3:] == [151644, 77091, 198]


def test_chat_template_adds_no_default_system_prompt(tok):
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=False)
    assert text == "<|im_start|>user\nHi<|im_end|>\n"


def test_chat_template_multi_turn_and_tool_messages(tok):
    msgs = [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "<tool_call>\n{}\n</tool_call>"},
        {"role": "tool", "content": "r1"},
        {"role": "tool", "content": "r2"},
        {"role": "assistant", "content": "A"},
    ]
    text = tok.apply_chat_template(msgs, tokenize=False)
    assert text == (
        "<|im_start|>user\nQ<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n{}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nA<|im_end|>\n"
    )


def test_chat_template_rejects_unknown_role(tok):
    with pytest.raises(Exception, match="unsupported chat role: narrator"):
        tok.apply_chat_template([{"role": "narrator", "content": "x"}], tokenize=False)


# ---------------------------------------------------------------- model


def test_model_loads_and_forwards(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    cfg = model.config
    assert (cfg.model_type, cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers) == ("qwen2", 151_936, 64, 2)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (2, 1, 32)
    assert cfg.tie_word_embeddings and model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.dtype == torch.bfloat16
    with torch.no_grad():
        logits = model(torch.tensor([[9707, 11, 1879, 0]])).logits
    assert logits.shape == (1, 4, 151_936) and torch.isfinite(logits).all()
    gen = json.loads((model_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [151645, 151643]


def test_model_generates_with_transformers(model_dir, tok):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=True, add_generation_prompt=True)
    ids = torch.tensor([prompt["input_ids"]])
    torch.manual_seed(0)
    out = model.generate(ids, max_new_tokens=4, do_sample=True, pad_token_id=tok.pad_token_id)
    assert out.shape[1] > ids.shape[1] and (out[0, : ids.shape[1]] == ids[0]).all()


def test_cache_hit_is_cheap_and_key_changes_rebuild(model_dir, tmp_path):
    weights = model_dir / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert tm.build_tiny_qwen2(model_dir) == model_dir
    assert weights.stat().st_mtime_ns == before  # same key: nothing rewritten
    assert tm.main(["--out", str(model_dir)]) == 0  # the CLI on a built directory is a cache hit too
    assert weights.stat().st_mtime_ns == before

    from safetensors.torch import load_file

    other = tm.build_tiny_qwen2(tmp_path / "seed1", seed=1)
    a, b = load_file(weights), load_file(other / "model.safetensors")
    assert a.keys() == b.keys()
    assert not torch.equal(a["model.embed_tokens.weight"], b["model.embed_tokens.weight"])


def test_rejects_head_dim_vllm_cpu_cannot_serve(tmp_path):
    with pytest.raises(ValueError, match="head_dim = hidden_size / num_heads = 24"):
        tm.build_tiny_qwen2(tmp_path / "bad", hidden_size=48, num_heads=2)
    assert not (tmp_path / "bad" / "model.safetensors").exists()


def test_missing_bpe_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="run_scripts/setup.sh"):
        tm.build_qwen2_tokenizer(tmp_path / "t", tiktoken_path=tmp_path / "nope.tiktoken")


def test_wrong_bpe_file_is_rejected(tmp_path):
    fake = tmp_path / "fake.tiktoken"
    fake.write_text("IQ== 0\nIg== 1\n")
    with pytest.raises(ValueError, match="not the Qwen2 qwen.tiktoken"):
        tm.build_qwen2_tokenizer(tmp_path / "t", tiktoken_path=fake)


# ---------------------------------------------------------------- task vocabulary

TASK_TEXTS = ["system", "user", "assistant",
              "Reply with the call as JSON inside <tool_call></tool_call> tags. Tool: set_timer(minutes: integer).",
              '<tool_call>\n{"name": "set_timer", "arguments": {"minutes": 27}}\n</tool_call>'] * 20


@pytest.fixture(scope="module")
def task_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("task")
    tdir = tm.build_task_tokenizer(root / "tok", TASK_TEXTS, 512)
    return tdir, tm.build_tiny_qwen2(root / "model", hidden_size=64, tokenizer_dir=tdir)


def test_task_tokenizer_keeps_qwen2s_pipeline_specials_and_template(task_dirs, tok):
    from transformers import AutoTokenizer

    task = AutoTokenizer.from_pretrained(task_dirs[0])
    assert 256 + len(tm.QWEN2_SPECIAL_TOKENS) < len(task) <= 512 + len(tm.QWEN2_SPECIAL_TOKENS)
    assert task.eos_token == "<|im_end|>" and task.pad_token == "<|endoftext|>" and task.bos_token is None
    for _, content, special in tm.QWEN2_SPECIAL_TOKENS:
        tid = task.convert_tokens_to_ids(content)
        assert task.encode(content) == [tid] and tid >= len(task) - len(tm.QWEN2_SPECIAL_TOKENS)
        assert task.added_tokens_decoder[tid].special == special
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Set a timer."}]
    assert task.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
        tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    # byte-level: text the corpus never held still round-trips; the corpus' words are whole tokens
    text = "Straße café 你好 🙂\n\n  x = 42;\ttabs"
    assert task.decode(task.encode(text)) == text
    assert len(task.encode(TASK_TEXTS[4])) < len(tok.encode(TASK_TEXTS[4])) + 8
    ids = task.encode('<tool_call>{"name": "f"}</tool_call><|im_end|>')
    assert task.decode(ids, skip_special_tokens=True) == '<tool_call>{"name": "f"}</tool_call>'
    assert tm.eos_token_ids(task) == [task.convert_tokens_to_ids("<|im_end|>"), task.pad_token_id]
    assert tm.eos_token_ids(tok) == tm.EOS_TOKEN_IDS


def test_task_tokenizer_is_deterministic_and_cached(task_dirs, tmp_path):
    tdir = task_dirs[0]
    again = tm.build_task_tokenizer(tmp_path / "again", TASK_TEXTS, 512)
    assert (again / "tokenizer.json").read_text() == (tdir / "tokenizer.json").read_text()
    before = (tdir / "tokenizer.json").stat().st_mtime_ns
    assert tm.build_task_tokenizer(tdir, TASK_TEXTS, 512) == tdir
    assert (tdir / "tokenizer.json").stat().st_mtime_ns == before
    other = tm.build_task_tokenizer(tmp_path / "other", TASK_TEXTS[:4], 300)
    assert (other / "tokenizer.json").read_text() != (tdir / "tokenizer.json").read_text()


def test_task_tokenizer_rejects_what_it_cannot_build(tmp_path):
    with pytest.raises(ValueError, match="more than its 256 byte tokens"):
        tm.build_task_tokenizer(tmp_path / "t", TASK_TEXTS, 256)
    with pytest.raises(ValueError, match="no texts"):
        tm.build_task_tokenizer(tmp_path / "t", ["", None], 512)
    with pytest.raises(FileNotFoundError, match="build_task_tokenizer"):
        tm.build_tiny_qwen2(tmp_path / "m", tokenizer_dir=tmp_path / "empty")


def test_model_on_a_task_vocabulary(task_dirs):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tdir, mdir = task_dirs
    task = AutoTokenizer.from_pretrained(mdir)
    assert (mdir / "tokenizer.json").read_text() == (tdir / "tokenizer.json").read_text()
    model = AutoModelForCausalLM.from_pretrained(mdir)
    cfg = model.config
    assert cfg.vocab_size % 64 == 0 and len(task) <= cfg.vocab_size < len(task) + 64
    assert (cfg.eos_token_id, cfg.pad_token_id) == (task.eos_token_id, task.pad_token_id)
    gen = json.loads((mdir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == tm.eos_token_ids(task) and gen["pad_token_id"] == task.pad_token_id
    prompt = task.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=True, add_generation_prompt=True)
    ids = torch.tensor([prompt["input_ids"]])
    torch.manual_seed(0)
    out = model.generate(ids, max_new_tokens=4, do_sample=True, pad_token_id=task.pad_token_id)
    assert out.shape[1] > ids.shape[1] and int(out.max()) < cfg.vocab_size
    # a second tokenizer is another model key: rebuilt, not served from the cache
    other = tm.build_task_tokenizer(mdir.parent / "tok2", TASK_TEXTS[:4], 300)
    assert tm.build_tiny_qwen2(mdir, hidden_size=64, tokenizer_dir=other) == mdir
    assert (mdir / "tokenizer.json").read_text() == (other / "tokenizer.json").read_text()
