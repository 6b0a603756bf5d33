"""Reward for the end-to-end CPU loop test, loaded by verl through ``reward.custom_reward_function``.

A random tiny model samples near-uniformly over the vocabulary, so the reward is one a random sampler
scores partly on: the share of the response's characters that are ASCII letters. It is continuous in
[0, 1] and varies inside a group, so GRPO's group-normalised advantages are non-zero.
"""

from __future__ import annotations


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """verl's ``compute_score(data_source, solution_str, ground_truth, extra_info)`` contract."""
    if not isinstance(solution_str, str) or not solution_str:
        return 0.0
    letters = sum(1 for c in solution_str if c.isascii() and c.isalpha())
    return letters / len(solution_str)
