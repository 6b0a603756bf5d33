"""The replay under real FSDP2 on two processes (gloo) with uneven work per rank (docs/design.md §5).

Every FSDP2 forward all-gathers the parameters, so two ranks whose replays differ in length must agree on
the number of forwards before the first one, or their collectives stop pairing up and the run hangs.
Here rank 0 replays three rows (eight forwards) and rank 1 one row (two forwards) of a tiny Qwen2 under
``torch.distributed.fsdp.fully_shard``; both must finish within a bound and together equal the
single-process replay of the four rows.

SDPO's EMA teacher is swapped into the same FSDP2 shards after those passes and must give the other model's
log-probs at the student's top-k ids, then the student's weights back.

With shared prompts (``mrtpo.share_prompts``, the default under SDPA): eight rows in groups of 3, 3 and 2 that
share their prompt variants, split unevenly (rank 0 five rows: the first group and two of the second; rank 1
three rows: the second group's last and the third), so the ranks plan different numbers of shared forwards and a
group is split over the ranks; they must agree on the count and together equal the unshared single-process
replay.

The ranks are this file run as a script (``python test_replay_distributed.py RANK WORLD WORKDIR``),
rendezvous through a file in WORKDIR (no network), started and bounded by the test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import torch

WORLD = 2
ROWS_OF_RANK = {0: [0, 1, 2], 1: [3]}  # uneven on purpose: 8 forwards against 2
SHARED_ROWS_OF_RANK = {0: [0, 1, 2, 3, 4], 1: [5, 6, 7]}  # groups (0-2), (3-5), (6-7): the second split over ranks
BOUND_S = 300  # generous: two processes importing torch + transformers on a loaded 2-core machine


def tiny_qwen2(seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, tie_word_embeddings=False, attn_implementation="sdpa")
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg).float().eval()
    with torch.no_grad():  # random init at std 0.02 barely reacts to the prompt: sharpen it
        for p in model.parameters():
            p.mul_(8.0)
    return model


def replay_inputs():
    """Four rows: variants used 2, 1, 2 and 1 (besides P_all); prompt lengths and response lengths differ."""
    g = torch.Generator().manual_seed(0)
    R, NV, P, T = 4, 3, 9, 7
    ids = torch.randint(1, 512, (R, NV, P), generator=g)
    lens = torch.tensor([[9, 7, 6], [8, 5, 0], [9, 8, 4], [6, 3, 0]])
    for r in range(R):
        for j in range(NV):
            ids[r, j, : P - int(lens[r, j])] = 0
    responses = torch.randint(1, 512, (R, T), generator=g)
    mask = torch.ones(R, T, dtype=torch.long)
    mask[1, 5:] = 0
    mask[2, 2:4] = 0  # non-contiguous
    pair = torch.tensor([[1, 2, -1], [-1, 1, 1], [2, 1, 1], [1, -1, -1]])
    return ids, lens, responses, mask, pair


def _replay(model, rows, sync):
    from recipe.mrtpo.core.replay import hf_forward, replay_relevance

    ids, lens, responses, mask, pair = (x[rows] for x in replay_inputs())
    with torch.no_grad():
        return replay_relevance(hf_forward(model), ids, lens, responses, mask, pair, micro_batch_size=1,
                                temperature=0.8, sync_forward_count=sync)


def shared_inputs():
    """Eight rows in groups of 3, 3 and 2 rows sharing their prompt variants (P_all and two P_minus of uneven
    lengths), responses of uneven lengths, uneven replayed variants per row."""
    g = torch.Generator().manual_seed(1)
    groups, NV, P, T = (3, 3, 2), 3, 9, 7
    R = sum(groups)
    ids, lens = torch.zeros(R, NV, P, dtype=torch.long), torch.zeros(R, NV, dtype=torch.long)
    r = 0
    for n, gl in zip(groups, ([9, 6, 4], [8, 7, 3], [9, 5, 2])):
        for j, length in enumerate(gl):
            ids[r : r + n, j, P - length :] = torch.randint(1, 512, (length,), generator=g)
        lens[r : r + n] = torch.tensor(gl)
        r += n
    responses = torch.randint(1, 512, (R, T), generator=g)
    mask = torch.zeros(R, T, dtype=torch.long)
    for i, n in enumerate([7, 4, 6, 7, 3, 5, 7, 2]):
        mask[i, :n] = 1
    pair = torch.tensor([[1, 2], [2, 1], [1, 2], [2, 2], [-1, 1], [1, -1], [2, 1], [1, 2]])
    return ids, lens, responses, mask, pair


def _shared(model, rows, sync, share=True):
    """The replay of ``shared_inputs``' rows with prompts shared (the tree's FlexAttention, registered as the worker
    registers it), 6 sequences a forward."""
    from recipe.mrtpo.core.passes import PassSettings
    from recipe.mrtpo.core.replay import hf_forward, replay_relevance
    from recipe.mrtpo.passes.tree_attention import register_tree_attention

    register_tree_attention()

    ids, lens, responses, mask, pair = (x[rows] for x in shared_inputs())
    settings = PassSettings(temperature=0.8, micro_batch_size=6, layout="sorted", packed_attention="block_mask", share_prompts=share)
    with torch.no_grad():
        return replay_relevance(hf_forward(model), ids, lens, responses, mask, pair, settings=settings, sync_forward_count=sync)


def _teacher(model, rows, sync):
    """The OPSD teacher pass (P_all of each row) through the same engine, packed into one row per forward."""
    from recipe.mrtpo.core.passes import hf_forward
    from recipe.mrtpo.methods.opsd.teacher import teacher_topk_rows

    ids, lens, responses, mask, _ = (x[rows] for x in replay_inputs())
    with torch.no_grad():
        return teacher_topk_rows(hf_forward(model), ids[:, 0], lens[:, 0], responses, mask, k=3, temperature=0.8,
                                 micro_batch_size=1, layout="packed", packed_attention="block_mask", sync_forward_count=sync)


def _sdpo(model, teacher_model, rows, sync, reshard=None):
    """SDPO's pass (the student's top-3 ids on P_minus_1 as the rollout prompt, the EMA teacher at them on P_all)
    with the teacher's weights swapped into ``model``'s shards (``teacher_model``: the same sharding)."""
    from recipe.mrtpo.core.passes import PassSettings, hf_forward
    from recipe.mrtpo.methods.sdpo.ema import EMATeacher
    from recipe.mrtpo.methods.sdpo.teacher import sdpo_teacher_rows

    ids, lens, responses, mask, _ = (x[rows] for x in replay_inputs())
    inputs = {"prompt_ids": ids[:, 0], "prompt_lens": lens[:, 0], "student_prompt_ids": ids[:, 1], "student_prompt_lens": lens[:, 1],
              "responses": responses, "response_mask": mask}
    ema = EMATeacher.from_module(teacher_model)
    settings = PassSettings(temperature=0.8, micro_batch_size=1, layout="packed", packed_attention="block_mask")
    with torch.no_grad():
        return sdpo_teacher_rows(hf_forward(model), inputs, 3, settings, lambda: ema.swapped(model, reshard), sync_forward_count=sync)


def rank_main(rank: int, world: int, workdir: Path) -> None:
    """One rank: FSDP2-shard the model (each decoder layer, then the root), replay this rank's rows."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from recipe.mrtpo.core.replay import sync_max_over_ranks

    dist.init_process_group("gloo", init_method=f"file://{workdir / 'rendezvous'}", rank=rank, world_size=world)
    model = tiny_qwen2()
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    out = _replay(model, ROWS_OF_RANK[rank], sync_max_over_ranks)
    torch.save(out, workdir / f"rank{rank}.pt")
    torch.save(_shared(model, SHARED_ROWS_OF_RANK[rank], sync_max_over_ranks), workdir / f"shared{rank}.pt")
    torch.save(_teacher(model, ROWS_OF_RANK[rank], sync_max_over_ranks), workdir / f"teacher{rank}.pt")
    # SDPO's EMA teacher swapped into the FSDP2 shards after the no-grad passes above (FSDP2 keeps the root's
    # parameters gathered after a no-grad forward: the swap reshards first; without it the root's parameters are the
    # gathered ones, which the teacher's shape check refuses), then
    # the student's weights back
    teacher = tiny_qwen2(seed=1)
    for layer in teacher.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(teacher, mesh=mesh)
    torch.save(_sdpo(model, teacher, ROWS_OF_RANK[rank], sync_max_over_ranks, model.reshard), workdir / f"sdpo{rank}.pt")
    torch.save(_teacher(model, ROWS_OF_RANK[rank], sync_max_over_ranks), workdir / f"after{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def launch(workdir: Path, script: Path, bound_s: float) -> tuple[bool, list]:
    """Start the ranks of ``script``; True if all exited within ``bound_s`` (else they are killed)."""
    paths = [str(Path(__file__).resolve().parents[2]), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(paths))
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(WORLD), str(workdir)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in range(WORLD)]
    deadline = time.monotonic() + bound_s
    try:
        for p in procs:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        return True, [(p.returncode, p.stdout.read().decode(errors="replace")[-3000:]) for p in procs]
    except subprocess.TimeoutExpired:
        return False, []
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_uneven_ranks_under_fsdp2_finish_and_equal_one_process(tmp_path):
    finished, outputs = launch(tmp_path, Path(__file__).resolve(), BOUND_S)
    assert finished, f"the two FSDP2 ranks did not finish within {BOUND_S} s (collectives out of step?)"
    for rc, log in outputs:
        assert rc == 0, log
    outs = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    assert [int(o["n_forwards"]) for o in outs] == [8, 2]
    assert [int(o["n_forwards_global"]) for o in outs] == [8, 8]
    ref = _replay(tiny_qwen2(), [0, 1, 2, 3], None)
    got_rel = torch.cat([o["variant_relevance"] for o in outs])
    got_lp = torch.cat([o["replay_logprobs"] for o in outs])
    assert torch.allclose(got_rel, ref["variant_relevance"], atol=1e-5)
    assert torch.allclose(got_lp, ref["replay_logprobs"], atol=1e-5)
    assert (ref["variant_relevance"][0, :2] > 0).any() and (ref["variant_relevance"][2, :, 2:4] == 0).all()
    # shared prompts, a group split over the ranks: different forward counts, agreed; equal to one process unshared
    shared = [torch.load(tmp_path / f"shared{r}.pt") for r in range(WORLD)]
    own = [int(o["n_forwards"]) for o in shared]
    assert own[0] > own[1] and [int(o["n_forwards_global"]) for o in shared] == [own[0]] * 2, own
    assert all(int(o["tokens_forwarded"]) < int(o["tokens_existing"]) for o in shared)  # each rank shared its groups' prompts
    unshared = _shared(tiny_qwen2(), list(range(8)), None, share=False)
    for key in ("variant_relevance", "replay_logprobs"):
        got = torch.cat([o[key] for o in shared])
        assert torch.allclose(got, unshared[key], atol=1e-5), (key, float((got - unshared[key]).abs().max()))
    assert float(unshared["variant_relevance"].max()) > 1e-2
    # the teacher pass, same engine: 3 forwards against 1, agreed; equal to one process (gapped mask of row 2)
    teach = [torch.load(tmp_path / f"teacher{r}.pt") for r in range(WORLD)]
    assert [int(o["n_forwards"]) for o in teach] == [3, 1] and [int(o["n_forwards_global"]) for o in teach] == [3, 3]
    tref = _teacher(tiny_qwen2(), [0, 1, 2, 3], None)
    for key in ("topk_logprobs", "token_logprobs"):
        assert torch.allclose(torch.cat([o[key] for o in teach]), tref[key], atol=1e-5), key
    assert torch.equal(torch.cat([o["topk_ids"] for o in teach]), tref["topk_ids"])
    # SDPO under FSDP2: the student's ids are the student's, the teacher's log-probs the other model's (one process
    # each, two plain models), and the student's weights are back afterwards (its OPSD pass is unchanged)
    sdpo = [torch.load(tmp_path / f"sdpo{r}.pt") for r in range(WORLD)]
    sref = _sdpo(tiny_qwen2(), tiny_qwen2(seed=1), [0, 1, 2, 3], None)
    assert torch.equal(torch.cat([o["topk_ids"] for o in sdpo]), sref["topk_ids"])
    for key in ("topk_logprobs", "token_logprobs", "student_topk_logprobs"):
        assert torch.allclose(torch.cat([o[key] for o in sdpo]), sref[key], atol=1e-5), key
    assert not torch.allclose(sref["topk_logprobs"], sref["student_topk_logprobs"], atol=1e-2)  # two different models
    after = [torch.load(tmp_path / f"after{r}.pt") for r in range(WORLD)]
    for key in ("topk_logprobs", "token_logprobs"):
        assert torch.equal(torch.cat([o[key] for o in after]), torch.cat([o[key] for o in teach])), key


if __name__ == "__main__":
    rank_main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
