"""P_all / P_minus_k construction (docs/design.md §2) and its fallbacks."""

import numpy as np
import pytest

from recipe.mrtpo.core.prompt_variants import (
    BLOCK_OPEN,
    append_to_last_user,
    build_sample_variants,
    count_occurrences,
    remove_all,
    remove_from_messages,
    rollout_prompt_variant,
    verifier_block,
)
from recipe.mrtpo.core.render_cache import PIECE_BOUNDARY, CachedRender, PieceEncoder, split_pieces

MSGS = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Write a poem about rain. Do not use any commas. Answer in lowercase letters only."},
]
CTX = {
    "punctuation:no_comma": {"text": "Do not use any commas.", "placement": "prompt"},
    "change_case:english_lowercase": {"text": "Answer in lowercase letters only.", "placement": "prompt"},
}


def render(msgs):
    """A deterministic stand-in for the chat template: one id per character, role-tagged."""
    s = "".join(f"<{m['role']}>{m['content']}" for m in msgs) + "<assistant>"
    return [ord(c) for c in s]


def text_of(ids):
    return "".join(chr(i) for i in ids)


def _lists(sv):
    """A sample's variants (int32 arrays) as lists, to compare two plans."""
    return [v.tolist() for v in sv.variants]


def test_remove_from_messages_exact_and_clean():
    out = remove_from_messages(MSGS, "Do not use any commas.")
    assert out[1]["content"] == "Write a poem about rain. Answer in lowercase letters only."
    assert MSGS[1]["content"].startswith("Write a poem about rain. Do not")  # input untouched
    assert remove_from_messages(MSGS, "not in the prompt") is None
    assert remove_from_messages(MSGS, "") is None
    end = remove_from_messages(MSGS, "Answer in lowercase letters only.")
    assert end[1]["content"] == "Write a poem about rain. Do not use any commas."


def test_appended_block_all_and_minus():
    block = verifier_block([("execution_match", "SELECT 1"), ("executable", "executed")])
    assert block.startswith(BLOCK_OPEN) and "[execution_match]\nSELECT 1" in block
    assert verifier_block([]) == ""
    msgs = append_to_last_user(MSGS, block)
    assert msgs[1]["content"].endswith(block) and msgs[0] == MSGS[0]
    only_sys = append_to_last_user([{"role": "system", "content": "s"}], block)
    assert only_sys[-1] == {"role": "user", "content": block}


def test_prompt_placement_variants():
    plan = build_sample_variants(MSGS, CTX, list(CTX), render)
    assert text_of(plan.variants[0]) == text_of(render(MSGS))  # P_all is the original prompt
    assert set(plan.pair_variant) == set(CTX) and not plan.fallbacks
    no_comma = text_of(plan.variants[plan.pair_variant["punctuation:no_comma"]])
    assert "commas" not in no_comma and "lowercase" in no_comma
    lower = text_of(plan.variants[plan.pair_variant["change_case:english_lowercase"]])
    assert "lowercase" not in lower and "commas" in lower


def test_only_replayed_rewards_and_fallbacks():
    ctx = dict(CTX)
    ctx["missing"] = {"text": "This sentence is not in the prompt.", "placement": "prompt"}
    ctx["empty"] = {"text": "", "placement": "prompt"}
    plan = build_sample_variants(MSGS, ctx, ["punctuation:no_comma", "missing", "empty", "unknown"], render)
    assert list(plan.pair_variant) == ["punctuation:no_comma"]
    assert plan.fallbacks == {"missing": "not_found", "empty": "empty_context", "unknown": "empty_context"}
    assert len(plan.variants) == 2
    none = build_sample_variants(None, CTX, list(CTX), render)
    assert none.fallbacks == {k: "no_messages" for k in CTX} and not none.variants


def test_too_long_and_dedup():
    long_plan = build_sample_variants(MSGS, CTX, list(CTX), render, max_prompt_length=10)
    assert set(long_plan.fallbacks.values()) == {"too_long"}
    ctx = {
        "a": {"text": "Do not use any commas.", "placement": "prompt"},
        "b": {"text": "Do not use any commas.", "placement": "prompt"},
    }
    plan = build_sample_variants(MSGS, ctx, ["a", "b"], render)
    assert plan.pair_variant["a"] == plan.pair_variant["b"] == 1 and len(plan.variants) == 2
    assert plan.deduplicated == 1


def test_appended_placement_and_joint():
    ctx = {
        "format": {"text": "Do not use any commas.", "placement": "prompt"},
        "executable": {"text": "error: no such column: foo", "placement": "appended"},
        "execution_match": {"text": "SELECT name FROM track", "placement": "appended"},
    }
    plan = build_sample_variants(MSGS, ctx, list(ctx), render)
    p_all = text_of(plan.variants[0])
    assert "no such column" in p_all and "SELECT name FROM track" in p_all and "commas" in p_all
    minus_exec = text_of(plan.variants[plan.pair_variant["executable"]])
    assert "no such column" not in minus_exec and "SELECT name FROM track" in minus_exec
    minus_fmt = text_of(plan.variants[plan.pair_variant["format"]])
    assert "commas" not in minus_fmt and "no such column" in minus_fmt
    joint = build_sample_variants(MSGS, ctx, ["format", "executable"], render, joint=True)
    assert len(joint.variants) == 2 and set(joint.pair_variant.values()) == {1}
    p_none = text_of(joint.variants[1])
    assert "commas" not in p_none and BLOCK_OPEN not in p_none


Z = "Do not use any commas."


@pytest.mark.parametrize(
    "content, expected",
    [
        (f"Write a poem. {Z} Use lowercase.", "Write a poem. Use lowercase."),
        (f"Write a poem.\n\n{Z}\n\nUse lowercase.", "Write a poem.\n\nUse lowercase."),
        (f"Write a poem. {Z}\nUse lowercase.", "Write a poem.\nUse lowercase."),
        (f"Write a poem.\n{Z} Use lowercase.", "Write a poem.\nUse lowercase."),
        (f"{Z}\n\nWrite a poem.", "Write a poem."),
        (f"Write a poem.\n\n{Z}\n", "Write a poem.\n"),
        (f"Write a poem.\n\n{Z}", "Write a poem."),
        (f"Write a poem ({Z}) now.", "Write a poem () now."),
    ],
)
def test_removal_collapses_its_separators(content, expected):
    out, n = remove_all(content, Z)
    assert (out, n) == (expected, 1)
    assert "  " not in out and "\n\n\n" not in out


def test_every_copy_is_removed_from_system_and_user_turns_only():
    msgs = [
        {"role": "system", "content": f"Rules:\n{Z}\nBe kind."},
        {"role": "user", "content": "Here is an example."},
        {"role": "assistant", "content": f"I will follow: {Z}"},  # the model's own text: never edited
        {"role": "tool", "content": Z},
        {"role": "user", "content": [{"type": "text", "text": f"Write a poem. {Z} {Z} Use lowercase."}, {"type": "image"}]},
    ]
    assert count_occurrences(msgs, Z) == 3
    out = remove_from_messages(msgs, Z)
    assert out[0]["content"] == "Rules:\nBe kind."
    assert out[4]["content"][0]["text"] == "Write a poem. Use lowercase." and out[4]["content"][1] == {"type": "image"}
    assert out[2] == msgs[2] and out[3] == msgs[3] and out[1] == msgs[1]
    assert Z in msgs[0]["content"] and Z in msgs[4]["content"][0]["text"]  # input untouched
    # Z only in an assistant turn: not found (a fallback, counted), never removed from the model's text
    only_assistant = [msgs[1], msgs[2]]
    assert remove_from_messages(only_assistant, Z) is None
    plan = build_sample_variants(only_assistant, {"no_comma": {"text": Z, "placement": "prompt"}}, ["no_comma"], render)
    assert plan.fallbacks == {"no_comma": "not_found"}


def test_a_removal_that_recreates_the_text_removes_it_too():
    out, n = remove_all("abcabcxx", "abc")
    assert out == "xx" and n == 2
    out, n = remove_all("aabcbc", "abc")  # removing the inner copy joins a new one
    assert out == "" and n == 2


def test_repeated_context_is_counted_and_fully_removed_from_p_minus_k():
    msgs = [{"role": "system", "content": f"Format: {Z}"}, {"role": "user", "content": f"Write a poem. {Z} Use lowercase."}]
    ctx = {"no_comma": {"text": Z, "placement": "prompt"}, "lower": {"text": "Use lowercase.", "placement": "prompt"}}
    plan = build_sample_variants(msgs, ctx, list(ctx), render)
    assert plan.repeated == {"no_comma": 2} and not plan.fallbacks
    minus = text_of(plan.variants[plan.pair_variant["no_comma"]])
    assert "commas" not in minus and "Use lowercase." in minus and "Format:<user>" in minus


def test_rollout_prompt_variant_finds_the_variant_without_any_appended_block():
    """Tool calling: format is prompt-placed, correctness appended; P_all = prompt + block, so the variant
    without the block (P_minus_correctness) is the rollout prompt, the row the consistency metric can use."""
    ctx = {"format": {"text": Z, "placement": "prompt"},
           "correctness": {"text": '[{"name": "f", "arguments": {}}]', "placement": "appended"}}
    rollout = render(MSGS)
    plan = build_sample_variants(MSGS, ctx, list(ctx), render)
    j = rollout_prompt_variant(plan.variants, rollout)
    assert j == plan.pair_variant["correctness"] and j != 0
    assert BLOCK_OPEN in text_of(plan.variants[0])
    prompt_only = build_sample_variants(MSGS, CTX, list(CTX), render)
    assert rollout_prompt_variant(prompt_only.variants, rollout) == 0  # prompt-placed Z: P_all
    only_format = build_sample_variants(MSGS, ctx, ["format"], render)  # no P_minus_correctness replayed
    assert rollout_prompt_variant(only_format.variants, rollout) == -1
    assert rollout_prompt_variant(plan.variants, rollout[:-1]) == -1


def test_cached_render_renders_each_distinct_prompt_once():
    calls = []

    def counting(msgs):
        calls.append(1)
        return render(msgs)

    cached = CachedRender(counting)
    plans = [build_sample_variants(MSGS, CTX, list(CTX), cached) for _ in range(4)]  # a group of four samples
    assert len(calls) == 3 and cached.calls == 12 and cached.hits == 9  # P_all and two P_minus_k, once each
    direct = build_sample_variants(MSGS, CTX, list(CTX), render)
    assert all(_lists(p) == _lists(direct) and p.pair_variant == direct.pair_variant for p in plans)
    ids = cached(MSGS)
    assert ids.dtype == np.int32 and ids is cached(MSGS)  # the cached array itself, no copy a call
    with pytest.raises(ValueError, match="read-only"):
        ids[0] = -1  # no caller can change what the others get
    assert cached(MSGS).tolist() == render(MSGS)


def test_piece_encoder_equals_whole_prompts_on_the_qwen2_template_and_falls_back_when_not(tmp_path):
    """The trainer's replay tokenizes each distinct line-led piece once: ids equal the whole render's."""
    from transformers import AutoTokenizer

    from recipe.mrtpo.cpu.tiny_model import build_qwen2_tokenizer

    tok = AutoTokenizer.from_pretrained(build_qwen2_tokenizer(tmp_path / "tok"))
    whole = lambda m: list(tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=False))  # noqa: E731
    text = lambda m: tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False)  # noqa: E731
    encode = lambda texts: tok(texts, add_special_tokens=False)["input_ids"]  # noqa: E731
    schema = "CREATE TABLE t (\n  id INTEGER,\n  name TEXT\n);\n\n\nCREATE TABLE u (\n \n  x REAL\n);"
    ctx = {"fmt": {"text": "Answer in one ```sql block.", "placement": "prompt"},
           "gold": {"text": "SELECT name FROM t\nWHERE id = 1", "placement": "appended"},
           "err": {"text": "error: no such column: z\n  at line 2", "placement": "appended"}}
    msgs = [{"role": "system", "content": "Be exact.\n\n  Indented line.\n\tTab."},
            {"role": "user", "content": f"Schema:\n\n{schema}\n\nQuestion: names? Answer in one ```sql block.\n\nThanks 日本語 😀."}]
    cached = CachedRender(render_text=text, encode_batch=encode)
    plain = build_sample_variants(msgs, ctx, sorted(ctx), whole)
    pieces = build_sample_variants(msgs, ctx, sorted(ctx), cached)
    assert _lists(pieces) == _lists(plain) and len(plain.variants) == 4
    enc = cached.encoder
    assert enc.mismatches == 0 and not enc.whole and enc.piece_hits > 0  # shared pieces tokenized once
    # a tokenizer that would merge across the boundary is caught at the first check, counted, and avoided
    joined = {"a\n": [1], "b": [2], "a\nb": [3]}
    bad = PieceEncoder(lambda texts: [joined.get(t, [9]) for t in texts], verify_every=10)
    assert bad("a\nb").tolist() == [3] and bad.mismatches == 1 and bad.whole and bad("a\nb").tolist() == [3]
    with pytest.raises(ValueError, match="render_text and encode_batch"):
        CachedRender(render_text=text)


@pytest.mark.parametrize("text", ["", "a", "\n", "a\n", "\nb", "a\nb", "a\n\n\nb\n", "a\n  b\n\tc\nd", " \n \n x",
                                  "日本\n語😀\n\n", "x\r\ny", "<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n"])
def test_split_pieces_is_the_boundary_split(text):
    assert split_pieces(text) == PIECE_BOUNDARY.split(text)
    assert "".join(split_pieces(text)) == text


def test_piece_encoder_batches_the_unseen_pieces_of_a_call_and_checks_whole_texts():
    calls = []

    def encode_batch(texts):  # a character-level "tokenizer": pieces concatenate exactly
        calls.append(list(texts))
        return [[ord(c) for c in t] for t in texts]

    enc = PieceEncoder(encode_batch, verify_every=2)
    texts = ["sys\nschema\nq1", "sys\nschema\nq2", "sys\nschema\nq1", "other"]
    out = enc.encode_many(texts)
    assert [o.tolist() for o in out] == [[ord(c) for c in t] for t in texts]
    # one call for the distinct unseen pieces, one for the whole texts checked (the 1st and 3rd)
    assert calls == [["sys\n", "schema\n", "q1", "q2", "other"], ["sys\nschema\nq1", "sys\nschema\nq1"]]
    assert enc.batches == 2 and enc.pieces == 10 and enc.piece_hits == 5 and enc.mismatches == 0
    # its pieces all seen: no tokenizer call for pieces, only the whole-text check of the 5th text
    assert enc("sys\nq2").tolist() == [ord(c) for c in "sys\nq2"] and calls[2:] == [["sys\nq2"]] and enc.piece_hits == 7
    # a mismatch in a batch: every text of that batch comes back whole, and later calls stay whole
    joined = {"a\n": [1], "b": [2], "a\nb": [3], "c": [4]}
    bad = PieceEncoder(lambda ts: [joined.get(t, [9]) for t in ts], verify_every=1)
    assert [o.tolist() for o in bad.encode_many(["a\nb", "c"])] == [[3], [4]] and bad.whole and bad.mismatches == 1
    assert [o.tolist() for o in bad.encode_many(["a\nb"])] == [[3]]
    with pytest.raises(ValueError, match="2 results for 1 texts"):
        PieceEncoder(lambda ts: [[1], [2]]).encode_many(["x"])


def test_cached_render_prepare_encodes_a_batch_at_once_and_keys_by_the_whole_messages():
    texts_encoded = []

    def encode_batch(texts):
        texts_encoded.append(len(texts))
        return [[ord(c) for c in t] for t in texts]

    def text(m):
        return "".join(f"<{x['role']}>{x['content']}{x.get('name', '')}\n" for x in m)

    cached = CachedRender(render_text=text, encode_batch=encode_batch)
    a = [{"role": "user", "content": "a"}]
    named = [{"role": "user", "content": "a", "name": "n"}]  # an extra key: another prompt, not a hit
    cached.prepare([a, a, named])
    assert cached.encoder.batches == 2 and cached.calls == 0  # the pieces, then the first text checked whole
    assert cached(a).tolist() == [ord(c) for c in text(a)] and cached(named).tolist() == [ord(c) for c in text(named)]
    assert cached.hits == 2 and cached.encoder.batches == 2  # nothing left to tokenize
    cached.prepare([a])
    assert cached.encoder.batches == 2
    plain = CachedRender(render=lambda m: [len(m)])
    plain.prepare([a])  # a whole-prompt renderer has nothing to batch: it renders on demand
    assert plain.calls == 0 and plain(a).tolist() == [1] and plain.hits == 0


# ----------------------------------------------------------------------- the self-teachers' teacher prompt
SQL_MSGS = [{"role": "system", "content": "You write SQL."},
            {"role": "user", "content": "List the tracks. Reply with one query.  "}]
SQL_CTX = {"execution_match": {"text": " SELECT Name FROM Track\n", "placement": "appended"},
           "format": {"text": "Reply with one query.", "placement": "prompt"}}
#: the default framing written out (the RLSD authors' self-distillation wording, its format sentence left out)
FRAMED_SQL = ("List the tracks. Reply with one query.\n\nHere is a reference solution:\nSELECT Name FROM Track\n\n"
              "After understanding the reference solution, please try to solve this problem using your own approach below.")


def test_teacher_messages_frame_the_appended_information_with_the_references_wording():
    from recipe.mrtpo.core.prompt_variants import teacher_messages

    out = teacher_messages(SQL_MSGS, SQL_CTX)
    assert out == [SQL_MSGS[0], {"role": "user", "content": FRAMED_SQL}]
    assert SQL_MSGS[1]["content"].endswith("  ")  # the input is not modified
    # several appended Z: each under its reward name, in name order
    two = {**SQL_CTX, "columns": {"text": "Name", "placement": "appended"}}
    body = teacher_messages(SQL_MSGS, two)[1]["content"]
    assert "Here is a reference solution:\n[columns]\nName\n\n[execution_match]\nSELECT Name FROM Track\n\nAfter" in body
    # an appended Z without text is no information
    assert teacher_messages(SQL_MSGS, {"execution_match": {"text": "", "placement": "appended"}}) == SQL_MSGS


def test_no_privileged_information_no_framing():
    """Every Z in the prompt (instruction following): the teacher prompt is the rollout prompt, unframed."""
    from recipe.mrtpo.core.prompt_variants import teacher_messages

    assert teacher_messages(MSGS, CTX) == MSGS
    assert render(teacher_messages(MSGS, CTX)) == render(MSGS)
    assert teacher_messages(None, CTX) is None and teacher_messages([], CTX) is None


def test_a_teacher_template_of_ones_own_and_its_checks():
    from recipe.mrtpo.core.prompt_variants import check_teacher_template, teacher_messages

    out = teacher_messages(SQL_MSGS, SQL_CTX, "{{hint}} {information} | {prompt}")
    assert out[1]["content"] == "{hint} SELECT Name FROM Track | List the tracks. Reply with one query."
    # the replay's unframed P_all through the knob: the bare verifier block after the user turn
    bare = "{prompt}\n\n<verifier_information>\n[execution_match]\n{information}\n</verifier_information>"
    replay = build_sample_variants(SQL_MSGS, SQL_CTX, ["format"], render).variants[0].tolist()
    assert render(teacher_messages(SQL_MSGS, SQL_CTX, bare)) == render(
        append_to_last_user(SQL_MSGS, verifier_block([("execution_match", "SELECT Name FROM Track")])))
    assert replay != render(teacher_messages(SQL_MSGS, SQL_CTX))  # the default framing is not the replay's P_all
    check_teacher_template(None)
    for bad in ("{prompt}", "{prompt} {information} {prompt}", "{prompt} {information} {x}", "{prompt {information}", 3):
        with pytest.raises(ValueError, match="teacher_template"):
            check_teacher_template(bad)


def test_without_a_text_user_turn_the_framed_information_is_a_new_turn():
    from recipe.mrtpo.core.prompt_variants import teacher_messages

    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}]
    out = teacher_messages(msgs, {"gold": {"text": "a cat", "placement": "appended"}}, "{prompt}\n\nAnswer: {information}")
    assert out == [msgs[0], {"role": "user", "content": "Answer: a cat"}]


def test_mrtpos_p_all_is_not_framed():
    """The template applies to the self-teachers only: the replay's P_all keeps the bare verifier block."""
    sv = build_sample_variants(SQL_MSGS, SQL_CTX, ["execution_match"], render)
    want = SQL_MSGS[1]["content"].rstrip() + "\n\n<verifier_information>\n[execution_match]\n SELECT Name FROM Track\n\n</verifier_information>"
    assert sv.variants[0].tolist() == render([SQL_MSGS[0], {"role": "user", "content": want}])


def test_renders_sharing_an_encoder_tokenize_a_common_piece_once():
    calls = []

    def encode_batch(texts):
        calls.append(list(texts))
        return [[ord(c) for c in t] for t in texts]

    enc = PieceEncoder(encode_batch, verify_every=1000)
    msgs = [{"role": "user", "content": "q"}]
    with_tools = [CachedRender(render_text=lambda m, t=t: f"{t}\nshared tool doc\n{m[0]['content']}", encoder=enc)
                  for t in ("tools A", "tools B")]
    assert [r(msgs).tolist() for r in with_tools] == [[ord(c) for c in f"{t}\nshared tool doc\nq"] for t in ("tools A", "tools B")]
    pieces = [p for c in calls for p in c]
    assert pieces.count("shared tool doc\n") == 1 and with_tools[0].encoder is with_tools[1].encoder
    with pytest.raises(ValueError, match="not both"):
        CachedRender(render_text=str, encode_batch=encode_batch, encoder=enc)
