"""The per-request rollout seed (recipe/mrtpo/core/seeding.py): re-stated from its docstring, distinct within a
group and a batch, identical across calls and processes."""

import hashlib
import subprocess
import sys

import pytest

from recipe.mrtpo.core.seeding import request_seed


def test_the_seed_is_the_documented_hash():
    text = "mrtpo-request|7|3|train|5|2"
    expected = int(hashlib.sha256(text.encode()).hexdigest()[:16], 16) // 2  # top 63 of the first 64 bits
    assert request_seed(7, 3, 5, 2) == expected
    assert 0 <= expected < 2**63


def test_distinct_within_a_group_a_batch_and_across_steps_seeds_and_validation():
    batch = {(p, s): request_seed(0, 1, p, s) for p in range(512) for s in range(8)}
    assert len(set(batch.values())) == len(batch)  # every sample of every group of a 512-prompt batch its own
    assert request_seed(0, 1, 0, 0) != request_seed(0, 2, 0, 0)  # next step
    assert request_seed(0, 1, 0, 0) != request_seed(1, 1, 0, 0)  # next seed
    assert request_seed(0, 1, 0, 0) != request_seed(0, 1, 0, 0, validate=True)  # a validation pass of step 1


def test_identical_across_calls_and_processes():
    here = [request_seed(3, s, p, k) for s in (1, 30) for p in (0, 31) for k in (0, 3)]
    code = ("from recipe.mrtpo.core.seeding import request_seed; "
            "print([request_seed(3, s, p, k) for s in (1, 30) for p in (0, 31) for k in (0, 3)])")
    for hash_seed in ("0", "123"):  # Python's hash() salt plays no part
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={"PYTHONHASHSEED": hash_seed, "PATH": ""}, cwd=str(__import__("pathlib").Path(__file__).parents[2]))
        assert eval(out.stdout) == here


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1"])
def test_refuses_what_is_not_a_non_negative_integer(bad):
    with pytest.raises((ValueError, TypeError)):
        request_seed(bad, 1, 0, 0)


def test_generation_seeds_keep_the_first_and_differ_after():
    import hashlib

    from recipe.mrtpo.core.seeding import generation_seed

    assert generation_seed(7, 0) == 7
    s = [generation_seed(7, g) for g in range(1, 50)]
    assert len(set(s)) == 49 and 7 not in s and all(0 <= x < 2**63 for x in s)
    assert s[0] == int.from_bytes(hashlib.sha256(b"mrtpo-generation|7|1").digest()[:8], "big") >> 1
    with pytest.raises(ValueError):
        generation_seed(7, -1)


def test_submission_order_puts_rows_back_in_the_order_their_prompts_were_submitted():
    import random

    from recipe.mrtpo.core.seeding import submission_order

    uids = ["9f1c-aa", "01b2-cc", "5e5e-bb"]  # random uids: their own order says nothing
    rank = {u: k for k, u in enumerate(uids)}
    want = [f"{u}_{s}_{i}" for u in uids for s in (0, 1, 2, 10) for i in (0, 1)]  # session 10 after 2, not after 1
    for seed in range(5):
        arrived = want[:]
        random.Random(seed).shuffle(arrived)
        order, unplaced = submission_order(arrived, rank)
        assert [arrived[j] for j in order] == want and unplaced == 0
    # a row whose prompt was not numbered (re-issued after a resume) or whose key does not parse goes last, counted
    order, unplaced = submission_order(["zz_0_0", want[3], "bad", want[0]], rank)
    assert order == [3, 1, 2, 0] and unplaced == 2
    assert submission_order([], rank) == ([], 0)
