"""OPSD (docs/opsd.md): the teacher top-k of P_all, verl's teacher layout, verl's own loss on it; tiny Qwen2, no Ray."""

import copy

import pytest
import torch
from tensordict import TensorDict

from recipe.mrtpo.config import mrtpo_config
from recipe.mrtpo.core.prompt_variants import build_sample_variants
from recipe.mrtpo.core.replay import hf_forward
from recipe.mrtpo.methods.opsd.driver import (
    distillation_loss_settings,
    pad_to_multiple,
    run_opsd_teacher,
    teacher_fields,
    teacher_prompts,
    uses_topk,
)
from recipe.mrtpo.methods.opsd.teacher import (
    forward_kl_topk,
    sequence_teacher_fields,
    teacher_topk_from_logits,
    teacher_topk_rows,
    topk_mass,
    topk_overlap,
)
from recipe.mrtpo.passes.pass_driver import PassRequest
from recipe.mrtpo.rewards.reward_extras import RewardTable

MSGS = [{"role": "user", "content": "List the three longest tracks. Answer with one SQL query."}]
CTX_APPENDED = {"execution_match": {"text": "SELECT Name FROM Track ORDER BY Milliseconds DESC LIMIT 3", "placement": "appended"},
                "format": {"text": "Answer with one SQL query.", "placement": "prompt"}}
CTX_PROMPT = {"format": {"text": "Answer with one SQL query.", "placement": "prompt"}}
TEMP = 0.9


TINY_SEED = 7  # the suite's test model (tests/conftest.py: tiny, tiny_lm), this module's seed


def render_fn(tok):
    return lambda m: list(tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=False))


def direct_logprobs(model, prompt: list[int], response: torch.Tensor) -> torch.Tensor:
    """log_softmax(z / tau) at the response positions of one unpadded forward of [prompt | response]: [T, V]."""
    seq = torch.tensor([list(prompt) + response.tolist()])
    with torch.no_grad():
        lg = model(input_ids=seq).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(response)].float()
    return torch.log_softmax(lg / TEMP, -1)


# ------------------------------------------------------------------------------------------- pure maths
def test_topk_from_logits_chunked_equals_full_and_sampled_logprob():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 7, 300, generator=g) * 3
    ids = torch.randint(0, 300, (2, 7), generator=g)
    lp, tid, tok = teacher_topk_from_logits(logits, ids, k=5, temperature=0.7, chunk_size=3)
    ref = torch.log_softmax(logits / 0.7, -1)
    v, i = ref.topk(5, -1)
    assert torch.allclose(lp, v, atol=1e-6) and torch.equal(tid, i)
    assert torch.allclose(tok, ref.gather(-1, ids.unsqueeze(-1)).squeeze(-1), atol=1e-6)
    lp2, _, _ = teacher_topk_from_logits(logits.bfloat16(), ids, k=5, temperature=0.7)  # model dtype in, fp32 out
    ref2 = torch.log_softmax(logits.bfloat16().float() / 0.7, -1).topk(5, -1).values  # the same maths in fp32
    assert lp2.dtype == torch.float32 and torch.allclose(lp2, ref2, atol=1e-5)
    assert ((topk_mass(lp) > 0) & (topk_mass(lp) <= 1 + 1e-6)).all()
    assert torch.allclose(topk_mass(teacher_topk_from_logits(logits, ids, k=300)[0]), torch.ones(2, 7), atol=1e-5)


def test_forward_kl_topk_zero_on_itself_positive_otherwise_and_overlap():
    g = torch.Generator().manual_seed(1)
    a = torch.log_softmax(torch.randn(4, 50, generator=g) * 2, -1)
    b = torch.log_softmax(torch.randn(4, 50, generator=g) * 2, -1)
    lp, ids = a.topk(8, -1)
    assert torch.allclose(forward_kl_topk(lp, ids, a), torch.zeros(4), atol=1e-6)
    assert (forward_kl_topk(lp, ids, b) > 0).all()
    assert torch.equal(topk_overlap(ids, ids), torch.ones(4))
    assert (topk_overlap(ids, b.topk(8, -1).indices) < 1).any()


def test_sequence_layout_is_what_verl_reads_at_the_response():
    """verl slices the response from the per-sequence tensors with a one-token shift (no_padding_2_padding)."""
    from verl.workers.utils.padding import no_padding_2_padding

    prompt_lens, resp_lens = [4, 2], [3, 5]
    per_token = [torch.arange(1, n + 1).float().unsqueeze(-1) * (i + 1) for i, n in enumerate(resp_lens)]  # [T_i, 1]
    fields = [sequence_teacher_fields(x, x.long(), p, n) for x, p, n in zip(per_token, prompt_lens, resp_lens)]
    nested = lambda xs: torch.nested.as_nested_tensor(xs, layout=torch.jagged)  # noqa: E731
    data = TensorDict({"prompts": nested([torch.zeros(p, dtype=torch.long) for p in prompt_lens]),
                       "responses": nested([torch.zeros(n, dtype=torch.long) for n in resp_lens])}, batch_size=[2])
    got = no_padding_2_padding(nested([f[0] for f in fields]), data).squeeze(-1)
    for i, n in enumerate(resp_lens):
        assert torch.equal(got[i, :n], per_token[i][:, 0]) and (got[i, n:] == 0).all()
    assert fields[0][0].shape == (7, 1) and fields[0][1].dtype == torch.int32


# ------------------------------------------------------------------------------------------- tiny Qwen2
def test_teacher_topk_equals_a_direct_forward_of_p_all(tiny):
    tok, model = tiny
    render = render_fn(tok)
    rollout = render(MSGS)
    p_all = build_sample_variants(MSGS, CTX_APPENDED, ["format"], render).variants[0].tolist()
    assert p_all != rollout and "ORDER BY Milliseconds" in tok.decode(p_all)
    g = torch.Generator().manual_seed(0)
    T, k = 6, 4
    responses = torch.randint(0, 151_000, (3, T), generator=g)
    mask = torch.ones(3, T, dtype=torch.long)
    mask[1, 4:] = 0
    prompts = [p_all, rollout, p_all[3:]]
    ids = torch.zeros(4, max(len(p) for p in prompts), dtype=torch.long)  # + one padding row (length 0)
    lens = torch.tensor([len(p) for p in prompts] + [0])
    for r, p in enumerate(prompts):
        ids[r, ids.shape[1] - len(p):] = torch.tensor(p)
    resp4, mask4 = torch.cat([responses, responses[:1]]), torch.cat([mask, mask[:1]])
    seen, calls = [], []
    fwd = hf_forward(model)

    def counting(*a):
        calls.append(tuple(a[0].shape))
        return fwd(*a)

    with torch.no_grad():
        out = teacher_topk_rows(counting, ids, lens, resp4, mask4, k=k, temperature=TEMP, micro_batch_size=2,
                                sync_forward_count=lambda n: seen.append((n, len(calls))) or n + 2)
        budget = teacher_topk_rows(fwd, ids, lens, resp4, mask4, k=k, temperature=TEMP, micro_batch_size=8, token_budget=40)
    assert seen == [(2, 0)] and len(calls) == 4 and calls[-1] == (1, 1)  # agreed first; two padding forwards last
    for r, p in enumerate(prompts):
        ref = direct_logprobs(model, p, responses[r])
        n = int(mask[r].sum())
        v, i = ref.topk(k, -1)
        for o in (out, budget):
            assert torch.allclose(o["topk_logprobs"][r, :n], v[:n], atol=1e-4)
            assert torch.equal(o["topk_ids"][r, :n], i[:n])
            assert torch.allclose(o["token_logprobs"][r, :n], ref.gather(-1, responses[r, :n, None])[:n, 0], atol=1e-4)
        assert (out["topk_logprobs"][r, n:] == 0).all() and (out["token_logprobs"][r, n:] == 0).all()
    assert (out["topk_logprobs"][3] == 0).all()  # the padding row ran nothing
    # P_all's teacher differs from the rollout prompt's on the same response (the privileged context matters)
    assert not torch.allclose(out["topk_logprobs"][0], out["topk_logprobs"][1], atol=1e-3)


def student_full_logprobs(model, prompt, response):
    """The student's log-softmax over the WHOLE sequence (as verl's actor computes logits for every position)."""
    seq = torch.tensor([list(prompt) + response.tolist()])
    return torch.log_softmax(model(input_ids=seq).logits[0].float() / TEMP, -1)


def verl_topk_loss(model, rollout, responses, teacher_seq):
    """verl's own fsdp top-k forward KL over each packed sequence, read at the response as verl's loss reads it."""
    from verl.trainer.distillation.fsdp.losses import compute_forward_kl_topk
    from verl.workers.config import DistillationConfig, DistillationLossConfig

    cfg = DistillationConfig(distillation_loss=DistillationLossConfig(loss_mode="forward_kl_topk", topk=teacher_seq[0][0].shape[-1],
                                                                      use_policy_gradient=False, log_prob_min_clamp=None))
    nested = lambda xs: torch.nested.as_nested_tensor(xs, layout=torch.jagged)  # noqa: E731
    logits = torch.cat([model(input_ids=torch.tensor([rollout + r.tolist()])).logits[0] / TEMP for r in responses])
    out = compute_forward_kl_topk(logits.unsqueeze(0), nested([t[0] for t in teacher_seq]), nested([t[1].long() for t in teacher_seq]),
                                  cfg, "thd")
    losses, start, vals = out["distillation_losses"][0], 0, []
    for r in responses:
        L = len(rollout) + len(r)
        vals.append(losses[start + len(rollout) - 1 : start + L - 1])
        start += L
    return torch.cat(vals).mean(), out


@pytest.mark.parametrize("privileged", [False, True])
def test_verl_loss_zero_on_identical_prompts_and_decreasing_when_they_differ(tiny, privileged):
    tok, model0 = tiny
    render = render_fn(tok)
    model = copy.deepcopy(model0)
    rollout = render(MSGS)
    teacher_prompt = build_sample_variants(MSGS, CTX_APPENDED if privileged else CTX_PROMPT, ["format"], render).variants[0].tolist()
    assert (teacher_prompt != rollout) is privileged
    g = torch.Generator().manual_seed(3)
    responses = [torch.randint(0, 151_000, (n,), generator=g) for n in (5, 7)]
    k = 16
    teacher_seq = []
    with torch.no_grad():
        for r in responses:
            lp, ids, _ = teacher_topk_from_logits(direct_logprobs(model, teacher_prompt, r), r, k)  # log_softmax is idempotent
            teacher_seq.append(sequence_teacher_fields(lp, ids, len(rollout), len(r)))
    loss, out = verl_topk_loss(model, rollout, responses, teacher_seq)
    # the recipe's core formula is verl's, on the response positions
    with torch.no_grad():
        core = torch.cat([forward_kl_topk(t[0][len(rollout) - 1 : len(rollout) - 1 + len(r)], t[1][len(rollout) - 1 : len(rollout) - 1 + len(r)],
                                          student_full_logprobs(model, rollout, r)[len(rollout) - 1 : -1])
                          for t, r in zip(teacher_seq, responses)])
    assert torch.allclose(core.clamp_min(0).mean(), loss.detach(), atol=1e-5)
    if not privileged:
        assert float(loss.detach()) < 1e-5  # teacher == student: nothing to distil
        n_resp = [len(rollout) - 1 + t for t in range(5)]
        assert (out["overlap_count"][0, n_resp] == k).all()  # identical top-k sets at the response
        return
    first = float(loss.detach())
    assert first > 1e-3
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(15):
        opt.zero_grad()
        loss, _ = verl_topk_loss(model, rollout, responses, teacher_seq)
        loss.backward()
        opt.step()
    with torch.no_grad():
        last = float(verl_topk_loss(model, rollout, responses, teacher_seq)[0])
    assert last < 0.5 * first, (first, last)


# ------------------------------------------------------------------------------------------- driver
#: the teacher prompt of MSGS with CTX_APPENDED under the default template, written out here (not built by the
#: code under test): the user turn, then the gold SQL framed as the RLSD authors frame a reference solution
FRAMED = [{"role": "user", "content": (
    "List the three longest tracks. Answer with one SQL query.\n\n"
    "Here is a reference solution:\n"
    "SELECT Name FROM Track ORDER BY Milliseconds DESC LIMIT 3\n\n"
    "After understanding the reference solution, please try to solve this problem using your own approach below.")}]


def test_teacher_prompts_frame_the_privileged_information_with_fallbacks(tiny):
    """The teacher prompt is the rollout prompt with the appended Z framed by the template, not the replay's bare
    verifier block; a prompt-placed-only sample (no privileged information) keeps its rollout prompt."""
    tok, _ = tiny
    render = render_fn(tok)
    rollout = render(MSGS)
    contexts = [CTX_APPENDED, CTX_PROMPT, {}, CTX_APPENDED, CTX_APPENDED]
    messages = [MSGS, MSGS, MSGS, None, MSGS]
    prompts, reasons = teacher_prompts(contexts, messages, [rollout] * 5, render, None)
    assert prompts[0] == render(FRAMED)
    assert prompts[0] != build_sample_variants(MSGS, CTX_APPENDED, ["execution_match"], render).variants[0].tolist()
    assert prompts[1] == rollout and reasons[:2] == [None, None]
    assert prompts[2] == rollout and reasons[2] == "no_contexts"
    assert prompts[3] == rollout and reasons[3] == "no_messages"
    limit = len(render(FRAMED)) - 1
    prompts, reasons = teacher_prompts(contexts, messages, [rollout] * 5, render, limit)
    assert reasons[0] == "too_long" and prompts[0] == rollout and reasons[1] is None
    own = "Task: {prompt}\nKnown answer: {information}"
    prompts, _ = teacher_prompts(contexts[:1], messages[:1], [rollout], render, None, template=own)
    assert prompts[0] == render([{"role": "user", "content": "Task: " + MSGS[0]["content"] + "\nKnown answer: "
                                  + CTX_APPENDED["execution_match"]["text"]}])


def test_teacher_prompts_render_each_row_as_the_rollout_did(tiny):
    """With ``row_render`` (the rows' tools, as the trainer passes them) each row's teacher prompt comes from its
    own render: a row rendered with tools gets the tools in its teacher prompt, a prompt-placed row stays its
    rollout prompt under that render."""
    tok, _ = tiny
    render = render_fn(tok)
    marker = tok.encode("TOOLS", add_special_tokens=False)
    with_tools = lambda m: marker + render(m)  # a stand-in for a chat template that renders tools first
    row_render = lambda i: with_tools if i % 2 == 0 else render
    contexts = [CTX_APPENDED, CTX_APPENDED, CTX_PROMPT, CTX_PROMPT]
    rollouts = [with_tools(MSGS), render(MSGS), with_tools(MSGS), render(MSGS)]
    prompts, reasons = teacher_prompts(contexts, [MSGS] * 4, rollouts, render, None, row_render)
    assert reasons == [None] * 4
    assert prompts[0] == with_tools(FRAMED)
    assert prompts[0][:len(marker)] == marker and prompts[1][:len(marker)] != marker
    assert prompts[1] == render(FRAMED)
    assert prompts[2] == rollouts[2] and prompts[3] == rollouts[3]  # no privileged information: the rollout prompt


def test_run_opsd_teacher_pads_to_dp_and_writes_verls_fields(tiny):
    from recipe.mrtpo.step.worker import opsd_teacher_rows

    tok, model = tiny
    render = render_fn(tok)
    rollout = render(MSGS)
    cfg = mrtpo_config({"mode": "opsd", "opsd_topk": 4, "replay_micro_batch_size": 2})
    B, T = 3, 6
    g = torch.Generator().manual_seed(4)
    responses = torch.randint(0, 151_000, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[2, 3:] = 0
    table = RewardTable(names=["execution_match", "format"], scores=torch.zeros(B, 2),
                        contexts=[CTX_APPENDED, CTX_PROMPT, {}], errors=[""] * B)
    sizes = []

    def dispatch(inputs, settings):
        sizes.append(int(inputs["prompt_lens"].shape[0]))
        td = TensorDict(inputs, batch_size=[sizes[-1]])
        for key, v in settings.items():
            td.set_non_tensor(key, v)
        with torch.no_grad():
            return opsd_teacher_rows(hf_forward(model), td, "cpu", sync=None)

    old = torch.stack([direct_logprobs(model, rollout, responses[i]).gather(-1, responses[i, :, None])[:, 0] for i in range(B)])
    request = PassRequest(cfg, table, [MSGS] * B, responses, mask, [rollout] * B, render, dispatch, dp_size=2,
                          temperature=TEMP, pad_id=0)
    teacher = run_opsd_teacher(request, old_log_probs=old)
    assert sizes == [4]  # padded to the data-parallel size
    m = teacher.metrics
    assert teacher.privileged == [True, False, False]
    assert m["mrtpo/opsd/rows_privileged"] == 1 and m["mrtpo/rows_privileged"] == 1 and m["mrtpo/opsd/rows_same_prompt"] == 1 and m["mrtpo/opsd/fallback/no_contexts"] == 1
    assert 0 < m["mrtpo/opsd/teacher_topk_mass"] <= 1 and m["mrtpo/opsd/teacher_prompt_extra_tokens"] > 0
    # rows taught from the rollout prompt reproduce old_log_probs: the gain is the privileged row's alone
    gain0 = float(((teacher.token_logprobs[0] - old[0]) * mask[0]).sum() / mask.sum())
    assert m["mrtpo/opsd/teacher_logprob_gain"] == pytest.approx(gain0, abs=1e-4) and abs(gain0) > 1e-3
    lens = mask.sum(-1).tolist()
    for use_topk, width in ((True, 4), (False, 1)):
        f = teacher_fields(teacher, responses, [len(rollout)] * B, lens, use_topk)
        assert f["teacher_logprobs"].is_nested and f["teacher_ids"].is_nested
        for i, seq in enumerate(f["teacher_logprobs"].unbind()):
            assert seq.shape == (len(rollout) + lens[i], width)
            resp = seq[len(rollout) - 1 : len(rollout) - 1 + lens[i]]
            want = teacher.topk_logprobs[i, : lens[i]] if use_topk else teacher.token_logprobs[i, : lens[i], None]
            assert torch.equal(resp, want)
    assert pad_to_multiple({"prompt_lens": torch.ones(4)}, 2)["prompt_lens"].shape == (4,)


def test_loss_settings_and_config_checks():
    from recipe.mrtpo.methods.opsd.driver import BETA_KEY, JSD_TOPK_LOSS_MODE
    from recipe.mrtpo.methods.opsd.loss import build_distillation_config, opsd_jsd_loss, opsd_loss_fn

    group = {"_target_": "x", "loss_mode": "k3", "topk": 32, "loss_max_clamp": 5.0, "use_task_rewards": False,
             "log_prob_min_clamp": None, "use_policy_gradient": True}
    # gdpo-distill: verl's loss with the recipe's knobs, RL + distillation
    cfg = mrtpo_config({"mode": "gdpo-distill", "opsd_topk": 8, "opsd_loss_coef": 0.3})
    s = distillation_loss_settings(cfg, group)
    assert s == {"loss_mode": "forward_kl_topk", "topk": 8, "distillation_loss_coef": 0.3, "use_task_rewards": True,
                 "loss_max_clamp": 5.0, "log_prob_min_clamp": None, "use_policy_gradient": False}
    d = build_distillation_config(s)
    assert d.enabled is False and d.distillation_loss.loss_settings.use_topk and uses_topk(cfg)
    assert opsd_loss_fn(object(), s).keywords["distillation_config"].distillation_loss.distillation_loss_coef == 0.3
    assert not uses_topk(mrtpo_config({"mode": "gdpo-distill", "opsd_loss_mode": "k3"}))
    # OPSD: the recipe's JSD alone, beta carried beside verl's fields, k = the reference's 50 by default
    cfg = mrtpo_config({"mode": "opsd", "opsd_beta": 0.25})
    s = distillation_loss_settings(cfg, group)
    assert s == {"loss_mode": JSD_TOPK_LOSS_MODE, "topk": 50, "distillation_loss_coef": 1.0, "use_task_rewards": False,
                 "loss_max_clamp": 5.0, "use_policy_gradient": False, BETA_KEY: 0.25}
    fn = opsd_loss_fn(object(), s)
    assert fn.func is opsd_jsd_loss and fn.keywords["beta"] == 0.25 and uses_topk(cfg)
    assert distillation_loss_settings(cfg, {})["loss_max_clamp"] is None  # verl's YAML default, not its dataclass's 10
    assert mrtpo_config({"mode": "gdpo-distill"}).opsd_topk_of() == 32 and mrtpo_config({"mode": "opsd", "opsd_topk": 7}).opsd_topk_of() == 7
    for bad in ({"opsd_topk": 0}, {"opsd_loss_mode": "k1"}, {"opsd_loss_coef": -1.0}, {"mode": "distil"}, {"opsd_beta": -0.1},
                {"opsd_support": "full"}, {"opsd_support": "vocab"}):
        with pytest.raises(ValueError):
            mrtpo_config(bad)


def test_the_report_places_opsd_among_the_baselines():
    from recipe.mrtpo.tools.report.discovery import parse_run_name
    from recipe.mrtpo.tools.report.names import method_sort

    assert parse_run_name("qwen2.5-coder-7b-instruct_text2sql_opsd_seed1")["method"] == "opsd"  # the run scripts' names
    assert method_sort(["mrtpo", "zeta", "opsd", "shuffle", "grpo", "gdpo", "cort"]) == ["grpo", "gdpo", "cort", "opsd", "shuffle", "mrtpo", "zeta"]
    # gdpo-distill (GDPO + a distillation term) is its own row, never "opsd"
    assert parse_run_name("qwen2.5-coder-7b-instruct_text2sql_gdpo-distill_seed1")["method"] == "gdpo-distill"
    assert parse_run_name("qwen2.5-coder-7b-instruct_text2sql_gdpo-distill")["method"] == "gdpo-distill"
    assert method_sort(["gdpo-distill", "opsd", "mrtpo"]) == ["opsd", "gdpo-distill", "mrtpo"]


def test_single_token_teacher_through_verls_estimator_loss():
    """The [L_i, 1] teacher of the estimators, read by verl's own k3 loss at the response (student log-probs over
    the whole sequence, as the actor's forward hands them over)."""
    from verl.trainer.distillation.losses import compute_distillation_loss_reverse_kl_estimator
    from verl.trainer.ppo.core_algos import kl_penalty

    from recipe.mrtpo.methods.opsd.loss import build_distillation_config

    g = torch.Generator().manual_seed(5)
    prompt_lens, resp_lens = [3, 5], [4, 2]
    nested = lambda xs: torch.nested.as_nested_tensor(xs, layout=torch.jagged)  # noqa: E731
    student_seq = [-torch.rand(p + n, generator=g) * 3 for p, n in zip(prompt_lens, resp_lens)]  # log p_S(x_{j+1}) at row j
    student_resp = [s[p - 1 : p - 1 + n] for s, p, n in zip(student_seq, prompt_lens, resp_lens)]
    data = TensorDict({"prompts": nested([torch.zeros(p, dtype=torch.long) for p in prompt_lens]),
                       "responses": nested([torch.zeros(n, dtype=torch.long) for n in resp_lens]),
                       "response_mask": nested([torch.ones(n, dtype=torch.long) for n in resp_lens])}, batch_size=[2])
    cfg = build_distillation_config(distillation_loss_settings(mrtpo_config({"mode": "gdpo-distill", "opsd_loss_mode": "k3"}), {}))
    assert cfg.distillation_loss.use_policy_gradient is False  # pinned: verl's dataclass default (True) never slips in
    for shift in (0.0, 0.7):
        teacher_resp = [s + shift for s in student_resp]
        f = [sequence_teacher_fields(t.unsqueeze(-1), torch.zeros(n, 1, dtype=torch.long), p, n)
             for t, p, n in zip(teacher_resp, prompt_lens, resp_lens)]
        data["teacher_logprobs"] = nested([x[0] for x in f])
        losses, _ = compute_distillation_loss_reverse_kl_estimator(None, cfg, {"log_probs": nested(student_seq)}, data)
        for i, n in enumerate(resp_lens):
            want = kl_penalty(student_resp[i], teacher_resp[i], kl_penalty="k3")
            assert torch.allclose(losses[i, :n], want, atol=1e-6)
        assert (float(losses.abs().max()) < 1e-7) is (shift == 0.0)
