"""``quickstart --model``: what each model's run computes (no launch; the launch itself is the quickstart)."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipe.mrtpo.cpu import quickstart as qs


def _get(overrides, key):
    vals = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == key]
    assert len(vals) == 1, (key, vals)  # Hydra refuses a key given twice
    return vals[0]


@pytest.mark.parametrize("model", sorted(qs.MODELS))
def test_each_model_sets_its_own_length_rate_and_run_name(model, tmp_path):
    o = qs.overrides(Path("/m"), Path("/d.parquet"), tmp_path, 3, model)
    spec = qs.MODELS[model]
    assert int(_get(o, "data.max_response_length")) == spec["response_length"]
    assert float(_get(o, "actor_rollout_ref.actor.optim.lr")) == spec["lr"]
    assert _get(o, "trainer.experiment_name") == qs.run_name(model) == f"{spec['name']}_instruction_following_mrtpo_seed0"
    assert qs.base_name(model).endswith("_instruction_following_base")


def test_smollm2_trains_a_pretrained_model_gently_on_constraints_with_a_span():
    tiny, smol = qs.MODELS["tiny"], qs.MODELS["smollm2"]
    assert smol["lr"] <= 1e-5 < tiny["lr"]  # the tiny model's 1e-3 would wreck pretrained weights in 3 steps
    assert {"startend:end_checker", "detectable_format:title"} <= set(smol["constraints"].split(","))
    from data_prep.instruction_following.compat import constraint_pool

    constraint_pool(smol["constraints"])  # composable ids the builder accepts


def test_a_missing_asset_says_to_run_setup(tmp_path, monkeypatch):
    monkeypatch.setenv("MRTPO_ASSETS", str(tmp_path / "none"))
    with pytest.raises(qs.QuickstartError, match="run_scripts/setup.sh"):
        qs.build_inputs(tmp_path / "out", "smollm2")
