"""The registry: one entry per method, resolved once from the composed config before Ray starts.

The entries live with their code (:mod:`.gdpo`, :mod:`.mrtpo`, :mod:`.rlsd`, :mod:`.opsd`, :mod:`.sdpo`); this module
collects them in the order the run scripts and the report list them, maps a composed config to exactly one
(:func:`resolve`, refusing every ``mrtpo.*`` knob the method does not read and every verl setting it cannot
run with) and is the command line the run scripts call (``python3 -m recipe.mrtpo.methods``).
"""

from __future__ import annotations

import sys
from typing import Optional

from recipe.mrtpo.methods.gdpo import GDPO, GRPO
from recipe.mrtpo.methods.mrtpo import CORT, MRTPO, SHUFFLE
from recipe.mrtpo.methods.opsd import GDPO_DISTILL, OPSD
from recipe.mrtpo.methods.rlsd import RLSD
from recipe.mrtpo.methods.sdpo import SDPO
from recipe.mrtpo.methods.types import RESOURCE_KNOBS, SELECTORS, Method, ReplayPass, get_key

METHODS: dict[str, Method] = {m.name: m for m in (GRPO, GDPO, MRTPO, CORT, SHUFFLE, OPSD, GDPO_DISTILL, RLSD, SDPO)}


def names() -> list[str]:
    return list(METHODS)


def modes() -> tuple[str, ...]:
    """The values of ``mrtpo.mode`` (each method's, once)."""
    return tuple(dict.fromkeys(m.mode for m in METHODS.values()))


def get(name: str) -> Method:
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; one of {names()}")
    return METHODS[name]


def replay_pass_of(cfg) -> ReplayPass:
    """The replay pass of the method of ``mrtpo.mode`` (what ``replay_driver.run_replay`` plans and asks for)."""
    for m in METHODS.values():
        if m.mode == cfg.mode and m.replay is not None:
            return m.replay
    raise ValueError(f"mrtpo.mode={cfg.mode} runs no replay")


def _estimator(config) -> str:
    est = get_key(config, "algorithm.adv_estimator", "gae")
    return str(getattr(est, "value", est))


def name_of(estimator: str, mode: str = "mrtpo", shuffle: bool = False) -> Optional[str]:
    """The method that (``algorithm.adv_estimator``, ``mrtpo.mode``, ``mrtpo.shuffle``) select, or None."""
    for m in METHODS.values():
        if (m.estimator, m.mode, m.shuffle) == (estimator, mode, bool(shuffle)):
            return m.name
    return None


def _match(est: str, cfg) -> Method:
    """The one entry of (estimator, mode, shuffle), or a message naming the setting that contradicts it."""
    name = name_of(est, cfg.mode, cfg.shuffle)
    if name is not None:
        return METHODS[name]
    if cfg.mode != "mrtpo":
        m = next(m for m in METHODS.values() if m.mode == cfg.mode)
        if cfg.shuffle:
            raise ValueError(f"mrtpo.shuffle=True is not read by method {m.name} (mrtpo.mode={cfg.mode}): leave it False")
        raise ValueError(
            f"mrtpo.mode={cfg.mode} is method {m.name}, which runs with algorithm.adv_estimator={m.estimator}; "
            f"with adv_estimator={est} it would not run as {m.name}. Use {' '.join(m.overrides)} (ALGO={m.name})"
        )
    if cfg.shuffle:
        raise ValueError(
            f"mrtpo.shuffle=True is read only by method shuffle (algorithm.adv_estimator=mrtpo); with adv_estimator={est} "
            "it would do nothing. Use ALGO=shuffle or leave it False"
        )
    known = sorted({m.estimator for m in METHODS.values()})
    raise ValueError(f"algorithm.adv_estimator={est} is none of the recipe's methods (estimators {known}; methods {names()})")


def resolve(config) -> Method:
    """The method of a composed config, after refusing every setting it does not read or cannot run with.

    Raises ValueError naming the setting and the method. Also validates every ``mrtpo.*`` value
    (:func:`recipe.mrtpo.config.mrtpo_config`).
    """
    from dataclasses import fields

    from recipe.mrtpo.config import MRTPOConfig, mrtpo_config

    cfg = mrtpo_config(config.get("mrtpo", None))
    if cfg.mode not in modes():
        raise ValueError(f"mrtpo.mode must be one of {modes()} (the methods registry's), got {cfg.mode!r}")
    method = _match(_estimator(config), cfg)
    defaults = MRTPOConfig()
    for f in fields(MRTPOConfig):
        if f.name == "_target_" or method.reads_knob(f.name):
            continue
        value, default = getattr(cfg, f.name), getattr(defaults, f.name)
        if f.name == "dump":  # the switch is every_n_steps; the other dump knobs are read only when it is on
            if value.every_n_steps != default.every_n_steps:
                raise ValueError(f"mrtpo.dump.every_n_steps={value.every_n_steps} is not read by method {method.name}: "
                                 "verl's own advantage step writes no relevance dumps")
            continue
        if value != default:
            readers = [m.name for m in METHODS.values() if f.name in m.reads]
            raise ValueError(
                f"mrtpo.{f.name}={value} is not read by method {method.name} ({', '.join(method.overrides)}): it would do "
                f"nothing. Leave it at its default ({default}) or choose a method that reads it ({', '.join(readers) or 'none'})"
            )
    for check in method.checks:
        check(config, method, cfg)
    return method


def main(argv: list[str]) -> int:
    if not argv or argv == ["list"]:
        for m in METHODS.values():
            print(f"{m.name:12s} {' '.join(m.overrides):45s} {m.summary}")
        return 0
    if argv[0] == "names" and len(argv) == 1:
        print(" ".join(names()))
        return 0
    if argv[0] == "overrides" and len(argv) == 2:
        if argv[1] not in METHODS:
            print(f"unknown method '{argv[1]}' (one of: {' '.join(names())})", file=sys.stderr)
            return 2
        print("\n".join(METHODS[argv[1]].overrides))
        return 0
    if argv[0] == "reads" and len(argv) == 2:  # the mrtpo.* knobs NAME reads (the run scripts set only these)
        if argv[1] not in METHODS:
            print(f"unknown method '{argv[1]}' (one of: {' '.join(names())})", file=sys.stderr)
            return 2
        m = METHODS[argv[1]]
        print(" ".join(dict.fromkeys((*m.reads, *SELECTORS, *RESOURCE_KNOBS))))
        return 0
    print("usage: python -m recipe.mrtpo.methods [list | names | overrides NAME | reads NAME]", file=sys.stderr)
    return 2

