"""The methods package: the registry agrees with the config, each hook named by its path loads, the command line
answers with the standard library alone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from recipe.mrtpo import methods
from recipe.mrtpo.config import MODES

REPO = Path(__file__).resolve().parents[2]


def test_the_registrys_modes_are_the_configs():
    assert methods.modes() == MODES


def test_every_named_hook_loads_a_function_of_its_method_package():
    hooks = {name: m.after_step for name, m in methods.METHODS.items() if m.after_step is not None}
    assert set(hooks) == {"opsd", "gdpo-distill", "sdpo", "rlsd"}
    package = {"gdpo-distill": "opsd"}  # a family's package: gdpo-distill lives with OPSD (one teacher pass, two losses)
    for name, hook in hooks.items():
        assert isinstance(hook, methods.GlueRef) and hook.module.startswith(f"recipe.mrtpo.methods.{package.get(name, name)}")
        assert callable(hook.load())


def test_every_actor_part_is_a_class_of_its_method_package_under_its_hooks_key():
    """Each method's worker side (methods/actor_part.py) lives in its package; its key is the one its hook writes."""
    from recipe.mrtpo.methods.actor_part import ActorPart
    from recipe.mrtpo.methods.opsd.driver import LOSS_SETTINGS_KEY as OPSD_KEY
    from recipe.mrtpo.methods.rlsd import LOSS_SETTINGS_KEY as RLSD_KEY
    from recipe.mrtpo.methods.sdpo import LOSS_SETTINGS_KEY as SDPO_KEY

    parts = {name: m.actor_part for name, m in methods.METHODS.items() if m.actor_part is not None}
    assert set(parts) == {"opsd", "gdpo-distill", "sdpo", "rlsd"}
    assert {name: p.key for name, p in parts.items()} == {"opsd": OPSD_KEY, "gdpo-distill": OPSD_KEY, "sdpo": SDPO_KEY,
                                                          "rlsd": RLSD_KEY}
    package = {"gdpo-distill": "opsd"}
    for name, part in parts.items():
        assert part.module == f"recipe.mrtpo.methods.{package.get(name, name)}.actor"
        assert issubclass(part.load(), ActorPart)
    dirs = [p.checkpoint_dir for p in {p.key: p for p in parts.values()}.values() if p.checkpoint_dir]
    assert sorted(dirs) == ["rlsd_synced_teacher", "sdpo_ema_teacher"]  # one folder each in the actor's checkpoint


def test_the_registry_imports_no_torch_or_verl():
    """Importing the registry in a fresh interpreter loads neither torch nor verl nor the OPSD glue."""
    code = ("import sys; import recipe.mrtpo.methods as m; m.resolve; "
            "bad = [k for k in sys.modules if k.split('.')[0] in ('torch', 'verl', 'omegaconf') "
            "or k.startswith(('recipe.mrtpo.methods.opsd.', 'recipe.mrtpo.methods.sdpo.', 'recipe.mrtpo.methods.rlsd.', 'recipe.mrtpo.methods.actor_part')) or k in ('recipe.mrtpo.step.trainer', 'recipe.mrtpo.step.worker')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.skipif(shutil.which("python3") is None, reason="no python3 on PATH")
def test_the_command_line_lists_overrides_and_knobs():
    def run(*args):
        return subprocess.run(["python3", "-m", "recipe.mrtpo.methods", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})

    names = run("names")
    assert names.returncode == 0 and names.stdout.split() == methods.names(), names.stderr
    assert run("overrides", "rlsd").stdout.splitlines() == list(methods.get("rlsd").overrides)
    assert "rlsd_lambda" in run("reads", "rlsd").stdout.split()
    bad = run("overrides", "nope")
    assert bad.returncode == 2 and "unknown method" in bad.stderr


def test_self_teachers_read_the_teacher_template_and_say_what_they_are_without_privileged_information():
    """OPSD, gdpo-distill, RLSD and SDPO (and no other method) read mrtpo.teacher_template and carry a no-privileged line,
    logged only on a step whose mrtpo/rows_privileged is 0; RLSD's is GDPO exactly only with the live teacher, OPSD's
    (the initial policy as the teacher, no RL term) is not GDPO at all."""
    teachers = {n for n, m in methods.METHODS.items() if m.self_teacher}
    assert teachers == {"opsd", "gdpo-distill", "rlsd", "sdpo"}
    assert {n for n, m in methods.METHODS.items() if "teacher_template" in m.reads} == teachers
    rlsd, opsd, gdpo = methods.get("rlsd"), methods.get("opsd"), methods.get("gdpo")
    line = methods.no_privileged_line(rlsd, {"mrtpo/rows_privileged": 0, "mrtpo/rlsd/teacher_initial": 0.0}, 1)
    assert line.startswith("mrtpo: method rlsd, step 1: no row has privileged information") and "= GDPO here" in line
    assert "\n" not in line
    initial = methods.no_privileged_line(rlsd, {"mrtpo/rows_privileged": 0, "mrtpo/rlsd/teacher_initial": 1.0}, 1)
    assert "= GDPO here" not in initial and "initial policy" in initial
    opsd_line = methods.no_privileged_line(opsd, {"mrtpo/rows_privileged": 0}, 3)
    assert "GDPO" not in opsd_line and "initial policy" in opsd_line
    assert "≈ GDPO here" in methods.no_privileged_line(methods.get("gdpo-distill"), {"mrtpo/rows_privileged": 0}, 3)
    sdpo = methods.no_privileged_line(methods.get("sdpo"), {"mrtpo/rows_privileged": 0}, 2)
    assert "GDPO" not in sdpo and "EMA" in sdpo  # no RL term: SDPO is never GDPO
    assert methods.no_privileged_line(rlsd, {"mrtpo/rows_privileged": 2}, 1) is None
    assert methods.no_privileged_line(rlsd, {}, 1) is None  # not measured (the pass did not run)
    assert methods.no_privileged_line(gdpo, {"mrtpo/rows_privileged": 0}, 1) is None


def test_the_distillation_defaults_are_verls_and_sdpo_refuses_a_group_field_it_does_not_read():
    from importlib.util import find_spec
    from pathlib import Path

    import pytest
    from omegaconf import OmegaConf

    from recipe.mrtpo.methods.checks import VERL_DISTILLATION_LOSS_DEFAULTS
    from recipe.mrtpo.methods.sdpo import check_sdpo

    yaml = Path(find_spec("verl").origin).parent / "trainer" / "config" / "distillation" / "distillation.yaml"
    group = OmegaConf.to_container(OmegaConf.load(yaml).distillation_loss)
    for key, value in VERL_DISTILLATION_LOSS_DEFAULTS.items():
        assert group[key] == value, key
    sdpo = methods.get("sdpo")
    base = {"actor_rollout_ref": {"actor": {"strategy": "fsdp2"}}, "distillation": {"enabled": False, "distillation_loss": group}}
    check_sdpo(OmegaConf.create(base), sdpo, None)  # verl's defaults: accepted
    for key, changed in (("loss_mode", "forward_kl_topk"), ("topk", 64), ("loss_max_clamp", 10.0)):
        cfg = OmegaConf.create(base)
        cfg.distillation.distillation_loss[key] = changed
        with pytest.raises(ValueError, match=f"distillation_loss.{key}=.* not read by method sdpo"):
            check_sdpo(cfg, sdpo, None)
