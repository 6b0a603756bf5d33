"""P_all / P_minus_k construction (docs/design.md §2) and its fallbacks."""

from recipe.mrtpo.core.prompt_variants import (
    BLOCK_OPEN,
    append_to_last_user,
    build_sample_variants,
    remove_from_messages,
    verifier_block,
)

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
