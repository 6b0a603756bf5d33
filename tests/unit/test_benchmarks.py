"""The benchmarks run at a tiny size on CPU and print their tables with the ratio columns.

Only the shape of the output is checked (one row per size, finite positive ratios); timings depend on the
machine and are not asserted. The full-size runs and their figures are in docs/performance.md.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import bench_plan, bench_relevance, bench_replay

REPO = Path(__file__).resolve().parents[2]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.split("|")]


def _ratio(cell: str) -> float:
    value = float(cell)
    assert math.isfinite(value) and value > 0, cell
    return value


def test_bench_relevance_prints_a_row_of_ratios_per_length(capsys):
    bench_relevance.main(["--vocab", "1000", "--lengths", "8", "32", "--repeats", "1", "--naive-max", "16"])
    out = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(out) if line.lstrip().startswith("T |"))
    assert _cells(out[header])[-2:] == ["js/lp", "js/lp_x2"]
    rows = [_cells(line) for line in out[header + 2:] if line.lstrip()[:1].isdigit()]
    assert [int(r[0]) for r in rows] == [8, 32]
    for r in rows:
        assert len(r) == len(_cells(out[header]))
        for cell in r[-2:]:  # replay_js / verl_logprob, replay_js / verl_logprob_x2
            _ratio(cell)
    assert "skipped" not in rows[0][2] and rows[1][2] == "skipped"  # naive JS only up to --naive-max
    assert out[0].startswith("V=1000 ") and out[-1].startswith("(time: best of")


def test_bench_replay_prints_a_row_of_ratios_per_variant_count(capsys):
    bench_replay.main(["--configs", "tiny", "--variants", "2", "3", "--rows", "1", "--prompt-len", "24",
                       "--response-len", "8", "--repeats", "1"])
    out = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(out) if "replay/olp" in line)
    assert _cells(out[header])[-2:] == ["replay/olp", "/NV"]
    rows = [_cells(line) for line in out[header + 1:] if line.lstrip().startswith("tiny |")]
    assert [int(r[2]) for r in rows] == [2, 3]
    for r in rows:
        ratio, per_variant = _ratio(r[-2]), _ratio(r[-1])
        assert per_variant == pytest.approx(ratio / int(r[2]), abs=0.01)
    assert out[-1].startswith("(best of 1; V = 151936;")


@pytest.mark.parametrize("script", ["bench_relevance.py", "bench_replay.py", "bench_plan.py", "gpu_replay.py", "bench_noise_floor.py", "bench_packing.py",
                                    "bench_shared_prompts.py"])
def test_benchmarks_run_as_scripts_from_the_repo_root(script):
    # the recipe installed (``pip install -e .``) is stood in for by PYTHONPATH
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    res = subprocess.run([sys.executable, f"benchmarks/{script}", "--help"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert f"python benchmarks/{script}" in res.stdout


def test_bench_replay_mix_prints_both_passes_and_the_ratio_line(capsys):
    bench_replay.main(["--mix", "--mix-config", "tiny", "--mix-lengths", "24", "8", "40", "--prompt-len", "24",
                       "--token-budget", "96", "--repeats", "1", "--no-compile-js"])
    out = capsys.readouterr().out.splitlines()
    assert "responses=[8, 24, 40]" in out[0] and "NV=3" in out[0] and "compile_js=False" in out[0]
    header = next(i for i, line in enumerate(out) if "old_log_prob" in line and "replay" in line)
    olp, x_nv, replay, first = (float(c.rstrip("ms")) for c in _cells(out[header + 1]))
    assert x_nv == pytest.approx(3 * olp, abs=2) and replay > 0 and first > 0
    last = re.fullmatch(r"mix: replay / \(variants x old_log_prob\) = (\d+\.\d\d)", out[-1])
    assert last, out[-1]
    # the cells are whole milliseconds: the printed ratio lies within what their rounding allows
    lo, hi = (replay - 0.5) / (x_nv + 0.5), (replay + 0.5) / max(x_nv - 0.5, 1e-9)
    assert lo - 0.005 <= float(last.group(1)) <= hi + 0.005, (last.group(1), replay, x_nv)


def test_bench_plan_times_the_plan_with_and_without_the_render_cache(capsys):
    bench_plan.main(["--prompts", "3", "--n", "2", "--repeats", "1"])
    out = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(out) if line.lstrip().startswith("mix |"))
    rows = {r[0]: r for r in (_cells(line) for line in out[header + 1:]) if r[0] in ("if", "mixed")}
    assert set(rows) == {"if", "mixed"}
    for r in rows.values():
        assert int(r[1]) == 6 and int(r[2]) == 5
        renders, distinct = int(r[5]), int(r[6])
        assert 0 < distinct < renders  # a group's samples share their renders
        assert 0 < int(r[7])  # distinct text pieces the piece encoder tokenized
        for cell in r[8:11]:  # times printed with two decimals: a tiny batch's plan can print 0.00s
            assert math.isfinite(float(cell.rstrip("s"))) and float(cell.rstrip("s")) >= 0, cell
    assert int(rows["if"][6]) <= 3 * 6  # prompt-placed Z: P_all + 5 variants per prompt, whatever n
    assert re.fullmatch(r"plan: 6 responses x 5 rewards: \d+\.\d\d s with CachedRender over pieces \(\d+\.\d\d s whole "
                        r"prompts, \d+\.\d\d s without CachedRender\); \d+\.\d\d s per 1,024", out[-1])


def test_bench_packing_counts_every_layout_and_ends_with_the_if_line(capsys):
    from benchmarks import bench_packing

    bench_packing.main(["--responses", "64", "--budget", "4096"])
    out = capsys.readouterr().out.splitlines()
    rows = [_cells(line) for line in out if line.lstrip().startswith(("if ", "sql ", "tool "))]
    assert [(r[0], r[1]) for r in rows] == [(m, lay) for m in ("if", "sql", "tool") for lay in ("padded", "sorted", "packed")]
    for r in rows:
        assert float(r[2]) >= 1.0 and float(r[6]) >= 1.0  # forwarded >= existing, replay and teacher
    packed = {r[0]: r for r in rows if r[1] == "packed"}
    assert all(float(r[2]) == 1.0 and float(r[3]) == 1.0 for r in packed.values())
    last = re.fullmatch(r"packing: forwarded / existing tokens = (\d+\.\d\d) \(was (\d+\.\d\d)\); forwards per replayed row = (\d+\.\d+)", out[-1])
    assert last and float(last.group(1)) == 1.0 and float(last.group(2)) > 1.0


def test_bench_shared_prompts_counts_before_after_and_the_limit(capsys):
    """On the shipped mixes (16 groups each): at a budget a group fits, every mix forwards fewer tokens than
    unshared and no more than the limit (each distinct variant once), the variants' common prefixes below it
    on SQL, tool calling and multi-turn, never below the floor (one prefix tree of the batch); below it (8,192: no
    multi-turn group fits a forward) the split groups say why a prompt repeats."""
    from benchmarks import bench_shared_prompts

    for budget in (131_072, 8_192):
        per_forward = ["--per-forward"] if budget == 8_192 else []
        res = bench_shared_prompts.main(["--responses", "64", "--budget", str(budget), "--repeats", "1", *per_forward])
        out = capsys.readouterr().out.splitlines()
        fwd_lines = [line for line in out if re.match(r"\s*\w+ \| fwd +\d+ \| tokens ", line)]
        assert len(fwd_lines) == (sum(len(r["cost"]["forwards"]) for r in res.values()) if per_forward else 0)
        rows = {r[0]: r for r in (_cells(line) for line in out) if len(r) == 16 and r[0] in ("if", "sql", "tool", "multi_turn")}
        assert set(rows) == set(res) == {"if", "sql", "tool", "multi_turn"}
        for name, r in res.items():
            before, after, limit, resp = (int(rows[name][i].replace(",", "")) for i in (6, 7, 8, 9))
            assert r["floor"] * resp <= after + 1e-6 and after <= before, name  # never under the floor, never over today's
            assert r["ratio"] == pytest.approx(after / limit) and rows[name][12] == f"{r['split']}/{r['groups']}"
            if r["split"] == 0:  # every group in one forward: each distinct prompt at most once
                assert after <= limit, name
            if budget == 131_072:
                assert after < before and r["split"] == 0, name
                assert name == "if" or after < limit, name  # a row's variants share their prefix (a schema, tools, turns)
        assert budget == 131_072 or res["multi_turn"]["split"] == res["multi_turn"]["groups"] == 16
        # the rollout prompts are rendered as the planner renders: IF's prompt-placed Z make P_all the rollout
        # prompt; a tool-calling row whose only appended Z is removed replays its rollout prompt
        assert res["if"]["rollout_matched"] == 1.0 and res["tool"]["rollout_matched"] > 0
        assert re.fullmatch(r"shared prompts: after / limit <= \d+\.\d{3} on every mix; planning <= \d+\.\d{3} s per 1,024 responses \(best of 1; median \d+\.\d{3}\)", out[-1])
        # the attention cost: per mix and shape, the tree's tokens are the shared forwards' (after), its tile pairs at
        # least its exact pairs (and fewer at smaller tiles), the dense mask every pair of each shared row
        cost = {(r[0], r[1]): r for r in (_cells(line) for line in out) if len(r) == 14 and r[1] in ("1.5B", "7B")}
        assert {k[0] for k in cost} == set(res) and len(cost) == 8
        for (name, shape), r in cost.items():
            t = res[name]["cost"]["totals"]
            assert int(r[2].split("/")[1].replace(",", "")) == t["tree"].tokens == int(rows[name][7].replace(",", ""))
            assert t["dense"].pairs >= t["tree"].pairs >= t["tree"].exact_pairs and float(r[4]) >= 1.0
            assert float(r[4]) >= float(r[5].split("/")[0]) >= float(r[5].split("/")[1]) >= 1.0
            # segment by segment: the same tree's exact pairs, in whole tiles of each segment's queries
            assert t["segmented"].exact_pairs == t["tree"].exact_pairs and t["segmented"].tokens == t["tree"].tokens
            assert float(r[6]) == pytest.approx(t["segmented"].pairs / t["segmented"].exact_pairs, abs=6e-4) and float(r[6]) >= 1.0
            assert float(r[7]) == pytest.approx(t["tree"].pairs / t["segmented"].pairs, abs=6e-4)
            f = res[name]["cost"]["flops"][shape]
            assert 0 < f["attention"] < f["chosen"] and float(r[9].rstrip("%")) == pytest.approx(100 * f["attention"] / f["chosen"], abs=0.06)
            assert f["chosen"] <= f["varlen"] and float(r[10]) == pytest.approx(f["chosen"] / f["varlen"], abs=6e-4)
        tiles = re.fullmatch(r"attention: tree tiles / exact pairs <= (\d+\.\d{3}) on every mix \(segment by segment: <= "
                             r"(\d+\.\d{3})\); at 7B chosen / varlen FLOPs <= (\d+\.\d{3}) \(the old dense mask: up to "
                             r"(\d+\.\d{3})\), attention <= (\d+\.\d)% of the chosen FLOPs", out[-2])
        assert tiles and float(tiles.group(2)) >= 1.0 and float(tiles.group(3)) <= 1.0, out[-2]


BLOCK_HEAVY_IMPORTS = """
import runpy, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("verl", "ray", "vllm", "hydra"):
            raise ImportError(f"{name} is not on the GPU benchmark machine")
sys.meta_path.insert(0, Block())
sys.argv = ["gpu_replay.py", *sys.argv[1:]]
runpy.run_path(%r, run_name="__main__")
"""


def test_gpu_replay_runs_at_a_tiny_shape_on_cpu_with_torch_and_transformers_only(tmp_path):
    """The 7B GPU benchmark at a tiny shape, with verl, Ray, vLLM and Hydra made unimportable (the GPU machine has
    the repository tree, torch and transformers only); run from outside the repository. One run prints the table,
    the JS comparison, the replay-vs-old_log_prob consistency, the noise floor and the ratio line."""
    script = BLOCK_HEAVY_IMPORTS % str(REPO / "benchmarks" / "gpu_replay.py")
    args = ["--device", "cpu", "--dtype", "fp32", "--hidden", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2",
            "--intermediate", "128", "--vocab", "1000", "--lengths", "8", "16", "--rows", "2", "--prompt-len", "16", "24",
            "--mix-lengths", "4", "8", "24", "--floor-rows", "1", "--floor-response-len", "16", "--repeats", "1", "--no-compile-js",
            "--mix", "if"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([sys.executable, "-c", script, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout.splitlines()
    assert "vocab 1000" in out[0] and "dtype=fp32" in out[0] and "attn=sdpa" in out[0]
    assert "prompts 16-24 tokens, token_budget=24576, variants up to 6" in out[1]  # the 7B scripts' budget and variants
    assert out[1].endswith("mix if, responses: random ids") and "mix: responses random ids" in out
    header = next(i for i, line in enumerate(out) if "rep/(NV x olp)" in line)
    assert _cells(out[header])[4:7] == ["olp pad", "olp rmpad", "replay"]
    end = next(i for i in range(header + 1, len(out)) if out[i].startswith("(NV:"))  # the table's note ends it
    rows = [_cells(line) for line in out[header + 1:end]]
    assert [r[0] for r in rows] == ["8", "16", "mix"] and [int(r[2]) for r in rows] == [16, 32, 36]
    assert [float(r[3]) for r in rows[:2]] == [6.0, 6.0] and 2.0 <= float(rows[2][3]) <= 6.0  # the mix: 2..6 per row
    for r in rows:
        _ratio(r[7])
    text = "\n".join(out)
    assert "mix: compiled vs eager JS: skipped (--no-compile-js)" in text
    # fp32: the padded replay and the remove-padding pass (block-diagonal mask on SDPA) agree to rounding
    lp = re.search(r"old_log_prob \(remove padding\), \|d\| over 36 tokens: mean (\S+), p99 (\S+), max (\S+)$", text, re.M)
    assert lp and float(lp.group(3)) < 1e-4, text
    # the trainer's standing check at temperature 1 and 0.7 (verl's forward_step numerics, re-stated): fp32 agrees
    for t in ("1.0", "0.7"):
        chk = re.search(rf"fused check at temperature {t}: fused old_log_probs \(sorted\) vs verl's forward_step numerics, "
                        r"\|d\| over 36 tokens: mean (\S+), p99 (\S+), max (\S+); floor \(verl's numerics vs themselves on "
                        r"the rows reversed\): mean (\S+), p99 \S+, max \S+; largest row mean (\S+) \(floor's (\S+)\); "
                        r"ok: threshold 2 x the floor's largest row mean \+ fp32 tolerance = (\S+)$", text, re.M)
        assert chk and float(chk.group(3)) < 1e-4 and float(chk.group(5)) <= float(chk.group(3)), text
        assert float(chk.group(7)) == pytest.approx(2 * float(chk.group(6)) + 1e-4, rel=5e-3), text  # the trainer's rule (3 digits)
    floor = re.search(r"noise floor of q over 16 positions .* floor / q = (\d+\.\d+);", text)
    assert floor and float(floor.group(1)) < 1e-3, text  # fp32: no floor to speak of
    m = re.fullmatch(r"gpu mix: replay / \(variants x old_log_prob\) = (\d+\.\d\d)", out[-1])
    assert m and float(m.group(1)) == pytest.approx(float(rows[-1][7]), rel=0.01, abs=0.006)  # the table: 3 significant figures


def _tiny_qwen2(vocab: int = 1000):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, max_position_embeddings=4096, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).eval()
    model.set_attn_implementation("sdpa")
    return model


def test_sampled_responses_are_the_models_own_greedy_and_seeded_tokens():
    """gpu_replay's --sample-responses: greedy (temperature 0) gives the argmax of the model's full forward over
    [prompt | response] at every position (KV-cached loop over a left-padded batch); temperature 1 gives exactly the
    draws one seeded generator makes from the full forward's softmax, position by position; not random ids."""
    import torch

    from benchmarks.gpu_sampling import sample_responses

    model = _tiny_qwen2()
    g = torch.Generator().manual_seed(1)
    lens, P, T = torch.tensor([20, 13, 7]), 20, 12
    prompts = torch.zeros(3, P, dtype=torch.long)
    for r in range(3):
        prompts[r, P - int(lens[r]):] = torch.randint(0, 1000, (int(lens[r]),), generator=g)

    def full_logits(responses):  # each row alone, unpadded: the logits predicting its response tokens
        with torch.no_grad():
            return [model(input_ids=torch.cat([prompts[r, P - int(lens[r]):], responses[r]])[None]).logits[0, int(lens[r]) - 1: -1]
                    for r in range(3)]

    greedy, lp_greedy = sample_responses(model, prompts, lens, T, temperature=0)
    assert all(torch.equal(lg.argmax(-1), greedy[r]) for r, lg in enumerate(full_logits(greedy)))
    assert lp_greedy > -math.log(1000)  # the argmax is at least as likely as the uniform 1 / V
    drawn, _ = sample_responses(model, prompts, lens, T, temperature=1.0, seed=3)
    assert torch.equal(drawn, sample_responses(model, prompts, lens, T, temperature=1.0, seed=3)[0])  # seeded
    assert not torch.equal(drawn, sample_responses(model, prompts, lens, T, temperature=1.0, seed=4)[0])
    logits, ref_g = full_logits(drawn), torch.Generator().manual_seed(3)
    ref = torch.stack([torch.multinomial(torch.softmax(torch.stack([lg[t] for lg in logits]), -1), 1, generator=ref_g)[:, 0]
                       for t in range(T)], 1)
    assert torch.equal(ref, drawn)
    with pytest.raises(ValueError, match="temperature >= 0"):
        sample_responses(model, prompts, lens, T, temperature=-1.0)


def test_gpu_replay_prompt_heavy_mix_counts_shared_below_unshared_on_sampled_responses(tmp_path):
    """--mix prompt-heavy --sample-responses at a tiny shape (verl & co. unimportable, as on the GPU machine): the
    table's three rows (unshared, the old dense mask, block-sparse) are consistent (the dense row forwards every
    forward shared: fewer tokens and no more forwards than unshared, never under the limit, every pair of its rows,
    more than the block-sparse one; the block-sparse row between them, as many tokens as the dense one unless the
    cost model ran forwards unshared; per-response-token column = tokens / response tokens), both shared passes equal the
    unshared one in fp32, the ratio line agrees with the table, and the output says the responses were sampled."""
    script = BLOCK_HEAVY_IMPORTS % str(REPO / "benchmarks" / "gpu_replay.py")
    args = ["--device", "cpu", "--dtype", "fp32", "--hidden", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2",
            "--intermediate", "128", "--vocab", "1000", "--repeats", "1", "--no-compile-js", "--mix", "prompt-heavy",
            "--heavy-groups", "3", "--group-n", "3", "--heavy-prompt-len", "48", "96", "--heavy-response-len", "4", "16",
            "--token-budget", "400", "--sample-responses", "--sample-temperature", "0"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([sys.executable, "-c", script, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout.splitlines()
    text = "\n".join(out)
    assert "Qwen2 random weights" in out[0] and out[1].endswith("mix prompt-heavy, responses: the mixes' sampled from the "
                                                                 "model (temperature 0.0, seed 0)")
    assert "rep/(NV x olp)" not in text  # the IF mix did not run
    intro = next(line for line in out if line.startswith("prompt-heavy mix: 3 groups x 3 responses"))
    lp = re.search(r"\(sampled from the model, temperature 0\.0, seed 0, in \S+s: mean log p (\S+), "
                   r"random ids' -log V = (\S+)\)", intro)
    assert lp and float(lp.group(1)) > float(lp.group(2)), intro  # greedy: above the uniform model's log p
    rows = {r[0]: r for r in (_cells(line) for line in out) if r[0] in ("off", "dense", "flex")}
    assert set(rows) == {"off", "dense", "flex"}
    fwds, tokens = ({k: int(rows[k][i].replace(",", "")) for k in rows} for i in (1, 2))
    pairs = {k: float(rows[k][4].rstrip("M")) for k in rows}
    limit = re.search(r"prompt-heavy: limit ([\d,]+) tokens \(distinct prompt-variant tokens once \+ ([\d,]+) response", text)
    assert limit, text
    limit_tok, resp_tok = (int(limit.group(i).replace(",", "")) for i in (1, 2))
    by_cost = int(rows["flex"][5])  # the tiny model's cost model runs some forwards unshared (attention-heavy at hidden 64)
    assert limit_tok <= tokens["dense"] <= tokens["flex"] <= tokens["off"] and fwds["dense"] <= fwds["off"], (tokens, fwds)
    assert (tokens["flex"] == tokens["dense"]) == (by_cost == 0) and tokens["dense"] < tokens["off"]
    assert pairs["dense"] > pairs["flex"]  # the old mask computes every pair of its rows
    for k in rows:
        assert float(rows[k][3]) == pytest.approx(tokens[k] / resp_tok, abs=0.006)
    for mode in ("dense", "flex"):
        exact = re.search(rf"prompt-heavy: {mode} vs unshared: max \|dq\| = (\S+), max \|d log p\| of P_all = (\S+) ", text)
        assert exact and float(exact.group(1)) < 1e-5 and float(exact.group(2)) < 1e-4, text
    last = re.fullmatch(r"gpu prompt-heavy: replay shared / unshared = (\d+\.\d\d) in time \(dense mask (\d+\.\d\d)\), "
                        r"(\d+\.\d\d) in tokens forwarded, (\d+\.\d\d) in forwards; peak GiB nan / nan / nan", out[-1])
    assert last and float(last.group(1)) > 0 and float(last.group(2)) > 0, out[-1]
    assert float(last.group(3)) == pytest.approx(tokens["flex"] / tokens["off"], abs=0.006)
    assert float(last.group(4)) == pytest.approx(fwds["flex"] / fwds["off"], abs=0.006)


def test_gpu_replay_prompt_heavy_times_the_three_paths_under_their_attentions(capsys):
    """On a flash_attention_2 model the unshared replay runs packed (varlen) under the module's own attention, the
    dense-mask baseline under SDPA and the block-sparse one under the tree's FlexAttention, switched per forward and
    restored (no flash-attn needed: the spy runs SDPA where the module names flash_attention_2)."""
    import argparse

    import torch

    from benchmarks.gpu_prompt_heavy import bench_prompt_heavy, expand_groups
    from benchmarks.gpu_replay import make_rows
    from recipe.mrtpo.passes.tree_attention import register_tree_attention

    register_tree_attention()
    g = torch.Generator().manual_seed(0)
    inputs = expand_groups(make_rows([1, 1], (24, 32), 3, 1000, g, True), 2, (4, 8), 1000, g)
    args = argparse.Namespace(attn="flash_attention_2", device="cpu", variants=3, token_budget=None, compile_js=False, group_n=2)
    model = _tiny_qwen2()
    model.config._attn_implementation = "flash_attention_2"  # what the GPU run loads; the spy runs SDPA for it
    seen = []
    real = type(model).forward

    def spy(self, *a, **k):
        own = self.config._attn_implementation
        seen.append(own)
        if own == "flash_attention_2":
            self.config._attn_implementation = "sdpa"
        try:
            return real(self, *a, **k)
        finally:
            self.config._attn_implementation = own

    def timer(fn):
        return 1.0, float("nan"), fn()

    import unittest.mock

    with unittest.mock.patch.object(type(model), "forward", spy):
        res = bench_prompt_heavy(model, inputs, args, timer, "random ids")
    out = capsys.readouterr().out.splitlines()
    assert set(res) == {"off", "dense", "flex"} and "unshared layout packed (flash_attention_2)" in out[0]
    assert set(seen) == {"flash_attention_2", "sdpa", "mrtpo_tree_flex"}
    assert model.config._attn_implementation == "flash_attention_2"  # restored
    assert int(res["flex"]["rep"]["tokens_forwarded"]) < int(res["off"]["rep"]["tokens_forwarded"])
    assert out[-1].startswith("gpu prompt-heavy: replay shared / unshared = ")


def test_bench_noise_floor_prints_the_floor_beside_a_real_variants_q(capsys):
    from benchmarks import bench_noise_floor

    ratio = bench_noise_floor.main(["--dtypes", "fp32", "bf16", "--hidden", "32", "--layers", "1", "--heads", "2",
                                    "--kv-heads", "1", "--intermediate", "64", "--vocab", "300", "--rows", "1",
                                    "--prompt-len", "24", "--response-len", "16", "--neighbour-len", "64", "--cut", "4"])
    out = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(out) if line.lstrip().startswith("dtype |"))
    rows = {r[0]: r for r in (_cells(line) for line in out[header + 1:]) if r[0] in ("fp32", "bf16")}
    assert set(rows) == {"fp32", "bf16"}
    for r in rows.values():
        assert int(r[1]) == 16 and _ratio(r[5]) > 0  # positions; the real variant's q
        mean, p99, top = (float(c) for c in r[2:5])
        assert 0 <= mean <= top and 0 <= p99 <= top and float(r[6]) == pytest.approx(mean / float(r[5]), abs=1e-4)
    assert float(rows["fp32"][2]) < 1e-4 and float(rows["fp32"][4]) < 1e-3  # fp32: next to no floor
    m = re.fullmatch(r"noise floor: bf16 floor / q = (\d+\.\d+)", out[-1])
    assert m and float(m.group(1)) == pytest.approx(ratio, abs=1e-4)
