"""The quickstart's --model choice: SmolLM2 is linked (never written), the tiny builder never writes through an
earlier link, a missing asset is a clear error, and the run names follow the model."""

from __future__ import annotations

import pytest

from recipe.mrtpo.cpu import quickstart as Q
from recipe.mrtpo.cpu import smollm2, tiny_model


def test_smollm2_is_linked_then_tiny_replaces_the_link(tmp_path, monkeypatch):
    src = tmp_path / "assets" / "smollm2-135m-instruct"
    src.mkdir(parents=True)
    (src / "config.json").write_text("{}")
    out = tmp_path / "out"
    (out / "model").mkdir(parents=True)  # an earlier tiny quickstart's model
    monkeypatch.setattr(smollm2, "require", lambda assets=None: src)
    m = Q.model_folder(out, "smollm2")
    assert m.is_symlink() and m.resolve() == src.resolve()

    built = []

    def fake_build(dest):
        assert not dest.is_symlink() and not dest.exists(), "the tiny builder would write through the link"
        dest.mkdir()
        built.append(dest)
        return dest

    monkeypatch.setattr(tiny_model, "build_tiny_qwen2", fake_build)
    assert Q.model_folder(out, "tiny") == out / "model" and built
    assert sorted(p.name for p in src.iterdir()) == ["config.json"]  # the asset untouched


def test_missing_asset_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("MRTPO_ASSETS", str(tmp_path / "nothing"))
    with pytest.raises(Q.QuickstartError, match="setup.sh"):
        Q.model_folder(tmp_path / "out", "smollm2")


def test_run_names_follow_the_model(tmp_path):
    assert Q.run_names("tiny") == (Q.RUN_NAME, Q.BASE_NAME)
    run, base = Q.run_names("smollm2")
    assert run.startswith("smollm2-135m_") and base.startswith("smollm2-135m_")
    assert f"trainer.experiment_name={run}" in Q.overrides(tmp_path / "m", tmp_path / "d", tmp_path, 2, run)
    with pytest.raises(Q.QuickstartError, match="unknown model"):
        Q.run_names("gpt")
