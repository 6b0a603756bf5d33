"""The fused pass's log-probs and entropy against verl's own engine forward, on CPU, without Ray.

verl 0.9.1's ``compute_log_prob`` reaches ``engine_workers.TrainingWorker.infer_batch`` ->
``FSDPEngine.infer_batch`` -> ``FSDPEngineWithLMHead.forward_step`` for every micro-batch: its autocast, the
model call, ``prepare_model_outputs`` (the temperature division, ``logprobs_from_logits``, the entropy). This
test calls that ``forward_step`` itself on a tiny Qwen2 (an engine object holding only what ``forward_step``
reads: no process group, no FSDP wrapping; FSDP2's bf16 ``param_dtype`` is the bf16 module), and the recipe's
fused pass (``replay_relevance`` with each row's rollout prompt forwarded for its log-probs, as the fused
old_log_prob step runs it) through the worker's own forward wrapper (``worker.autocast_forward``) and
numerics (``worker.verl_numerics``), at temperature 1 and 0.7, in fp32 and bf16.

Measured here (CPU, this tiny model, 56 response tokens): fp32 agrees to ~5e-7 (asserted 1e-5), both of verl's
padding paths against both recipe layouts. bf16 with verl's CPU numerics (its fallback log-prob is a bf16
log-softmax; eager bf16 entropy): bitwise equal, at temperature 1 and 0.7, log-probs and entropy (asserted:
exact in the ``sorted`` layout, within one bf16 ulp in ``packed``). bf16 logits with fp32 log-probs (verl's
GPU path, flash-attention's cross entropy, emulated): mean 6e-6 / 1.2e-5 and max 2.4e-4 / 4.9e-4 at
temperature 1 / 0.7, the bf16 forwards of differently padded micro-batches (asserted under
``BF16_FLOOR``: mean 1e-4, max 2e-3); dividing by 0.7 in fp32 instead of verl's bf16 0.69921875 gives mean
2.7e-4, max 1.2e-3 there (asserted > 10x the fused pass's mean).
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from transformers import Qwen2Config, Qwen2ForCausalLM
from verl.utils import tensordict_utils as tu
from verl.utils import torch_functional as verl_F

from recipe.mrtpo.core.passes import PassSettings, hf_forward
from recipe.mrtpo.core.replay import replay_relevance
from recipe.mrtpo.step.worker import autocast_forward, verl_numerics

V = 384
PROMPTS = (9, 14, 6, 11)
RESPS = (12, 5, 16, 9)
#: bf16 noise floor of |fused - verl| log-probs (bf16 logits, fp32 log-probs as on a GPU; measured on this tiny
#: Qwen2: mean ~1e-5, max ~5e-4, from the two forwards padding the sequences differently)
BF16_FLOOR = {"mean": 1e-4, "max": 2e-3}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=128, tie_word_embeddings=True)
    cfg._attn_implementation = "sdpa"
    return Qwen2ForCausalLM(cfg).eval()


def verl_engine(module, dtype, monkeypatch):
    """verl's ``FSDPEngineWithLMHead`` holding what ``forward_step`` reads, on CPU."""
    import verl.workers.engine.fsdp.transformer_impl as ti
    from verl.workers.config import FSDPEngineConfig

    monkeypatch.setattr(ti, "get_device_id", lambda: "cpu")
    monkeypatch.setattr(ti, "get_device_name", lambda: "cpu")
    monkeypatch.setattr("verl.utils.device.get_device_name", lambda: "cpu")
    eng = ti.FSDPEngineWithLMHead.__new__(ti.FSDPEngineWithLMHead)
    eng.engine_config = FSDPEngineConfig(use_torch_compile=False)
    eng.module = module
    eng.use_ulysses_sp = False
    eng.pad_to_length = False
    eng._autocast_dtype = dtype
    eng.compute_entropy_from_logits = verl_F.entropy_from_logits  # use_torch_compile=False: verl's eager choice
    return eng


def batch():
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, V, (p,), generator=g) for p in PROMPTS]
    resps = [torch.randint(0, V, (t,), generator=g) for t in RESPS]
    return prompts, resps


def verl_pass(eng, prompts, resps, temperature, remove_padding):
    seqs = [torch.cat([p, r]) for p, r in zip(prompts, resps)]
    td = TensorDict({"input_ids": torch.nested.as_nested_tensor(seqs, layout=torch.jagged),
                     "position_ids": torch.nested.as_nested_tensor([torch.arange(len(s)) for s in seqs], layout=torch.jagged)},
                    batch_size=[len(seqs)])
    tu.assign_non_tensor(td, temperature=temperature, use_remove_padding=remove_padding, calculate_entropy=True, pad_token_id=0)
    with torch.no_grad():
        _, out = eng.forward_step(td, None, True)
    mo = out["model_output"]
    lps, ents = [], []
    for p, r, lp, en in zip(prompts, resps, mo["log_probs"].unbind(), mo["entropy"].unbind()):
        a, b = len(p) - 1, len(p) + len(r) - 1  # position t predicts token t + 1: the response tokens
        lps.append(lp[a:b].float())
        ents.append(en[a:b].float())
    return lps, ents


def fused_pass(eng, prompts, resps, temperature, layout="sorted"):
    R, P, T = len(prompts), max(PROMPTS), max(RESPS)
    ids = torch.zeros(R, 1, P, dtype=torch.long)
    lens = torch.zeros(R, 1, dtype=torch.long)
    responses = torch.zeros(R, T, dtype=torch.long)
    mask = torch.zeros(R, T, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, resps)):
        ids[i, 0, P - len(p):], lens[i, 0] = p, len(p)
        responses[i, : len(r)], mask[i, : len(r)] = r, 1
    settings = PassSettings(temperature=temperature, micro_batch_size=3, layout=layout, packed_attention="block_mask",
                            **verl_numerics(eng, "cpu"))
    out = replay_relevance(autocast_forward(hf_forward(eng.module), eng), ids, lens, responses, mask,
                           torch.full((R, 1), -1), logprob_variant=torch.zeros(R, dtype=torch.long), settings=settings,
                           entropy=True)
    return ([out["replay_logprobs"][i, : len(r)] for i, r in enumerate(resps)],
            [out["replay_entropy"][i, : len(r)] for i, r in enumerate(resps)])


def diffs(a, b):
    d = torch.cat([(x - y).abs() for x, y in zip(a, b)])
    return float(d.mean()), float(d.max())


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fp32_fused_pass_equals_verls_forward_step(model, monkeypatch, temperature):
    eng = verl_engine(model.float(), torch.float32, monkeypatch)
    prompts, resps = batch()
    assert verl_numerics(eng, "cpu") == {"logprob_dtype": "float32", "entropy_dtype": "float32"}
    for remove_padding in (False, True):
        v_lp, v_ent = verl_pass(eng, prompts, resps, temperature, remove_padding)
        for layout in ("sorted", "packed"):
            f_lp, f_ent = fused_pass(eng, prompts, resps, temperature, layout)
            assert diffs(f_lp, v_lp)[1] < 1e-5, (remove_padding, layout)
            assert diffs(f_ent, v_ent)[1] < 1e-5, (remove_padding, layout)


def bf16_engine(monkeypatch, flash_ce: bool):
    """verl's engine over a bf16 tiny Qwen2 (FSDP2's ``param_dtype``) under bf16 autocast. ``flash_ce``: verl's
    log-prob as on a GPU with flash-attention (its Triton cross entropy computes in fp32 from the bf16 logits;
    emulated by the fp32 log-softmax), else verl's CPU fallback (a bf16 log-softmax)."""
    import verl.workers.engine.fsdp.transformer_impl as ti

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=128, tie_word_embeddings=True)
    cfg._attn_implementation = "sdpa"
    eng = verl_engine(Qwen2ForCausalLM(cfg).eval().to(torch.bfloat16), torch.bfloat16, monkeypatch)
    if flash_ce:
        monkeypatch.setattr(ti, "logprobs_from_logits",
                            lambda logits, labels, inplace_backward=True: verl_F.logprobs_from_logits_v2(logits.float(), labels))
    return eng


def ulps(x: torch.Tensor) -> torch.Tensor:
    """One bf16 ulp at |x| (the spacing of bf16 numbers there)."""
    return 2.0 ** (torch.floor(torch.log2(x.abs().clamp(min=1e-30))) - 7)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_bf16_fused_pass_equals_verls_cpu_forward_step(monkeypatch, temperature):
    eng = bf16_engine(monkeypatch, flash_ce=False)
    assert verl_numerics(eng, "cpu") == {"logprob_dtype": "bfloat16", "entropy_dtype": "bfloat16"}
    prompts, resps = batch()
    v_lp, v_ent = verl_pass(eng, prompts, resps, temperature, False)
    for layout in ("sorted", "packed"):
        f_lp, f_ent = fused_pass(eng, prompts, resps, temperature, layout)
        d = torch.cat([(a - b).abs() for a, b in zip(f_lp, v_lp)])
        print(f"bf16 T={temperature} {layout}: log-prob |fused - verl| mean {float(d.mean()):.2e} max {float(d.max()):.2e}; "
              f"entropy max {diffs(f_ent, v_ent)[1]:.2e}")
        assert bool((d <= ulps(torch.cat(v_lp))).all()) and float(d.mean()) <= BF16_FLOOR["mean"], layout
        assert diffs(f_ent, v_ent)[1] <= BF16_FLOOR["max"], layout
        if layout == "sorted":  # the same micro-batch arithmetic: bitwise verl's numbers
            assert float(d.max()) == 0.0 and diffs(f_ent, v_ent)[1] == 0.0


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_bf16_fused_pass_equals_verls_gpu_numerics(monkeypatch, temperature):
    eng = bf16_engine(monkeypatch, flash_ce=True)
    assert verl_numerics(eng, "cpu")["logprob_dtype"] == "float32"
    prompts, resps = batch()
    v_lp, _ = verl_pass(eng, prompts, resps, temperature, False)
    mean, mx = diffs(fused_pass(eng, prompts, resps, temperature)[0], v_lp)
    print(f"bf16 logits, fp32 log-probs, T={temperature}: |fused - verl| mean {mean:.2e} max {mx:.2e}")
    assert mean <= BF16_FLOOR["mean"] and mx <= BF16_FLOOR["max"], (mean, mx)
    if temperature != 1.0:  # dividing in fp32 by 0.7 (not verl's bf16 0.69921875) is visibly off
        import recipe.mrtpo.core.passes as passes

        monkeypatch.setattr(passes, "scale_logits", lambda logits, t: logits.float() / t)
        naive_mean, naive_max = diffs(fused_pass(eng, prompts, resps, temperature)[0], v_lp)
        print(f"  dividing in fp32 instead: mean {naive_mean:.2e} max {naive_max:.2e}")
        assert naive_mean > 10 * mean and naive_max > mx
