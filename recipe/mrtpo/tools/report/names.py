"""The methods and tasks the report knows: their order in tables and plots and the tasks' display names."""

from __future__ import annotations

from collections.abc import Iterable

from recipe.mrtpo.methods import names as method_names

#: Row order of the paper's table: the base model, the baselines, the control, the method (the registry's methods,
#: recipe/mrtpo/methods/, in this order where named here; any other registered one before the control); other
#: run names follow alphabetically.
_LAST = ("shuffle", "mrtpo")
METHOD_ORDER = ("base", *(m for m in method_names() if m not in _LAST), *_LAST)

#: Column order and display names of the evaluated tasks; others follow alphabetically.
#: ``toolcall_multiturn`` is the multi-turn run scripts' training task (a name with an underscore must be known to be
#: read from ``<model>_<task>_<method>_seed<k>``), ``bfcl_multi_turn`` its evaluation and data source.
TASK_ORDER = ("ifbench", "ifeval", "instruction_following", "spider", "bird", "chinook", "text_to_sql",
              "bfcl", "tool_calling", "bfcl_multi_turn", "toolcall_multiturn")
TASK_LABELS = {
    "ifbench": "IFBench",
    "ifeval": "IFEval",
    "instruction_following": "IF",
    "spider": "Spider",
    "bird": "BIRD",
    "chinook": "Chinook",
    "text_to_sql": "Text-to-SQL",
    "bfcl": "BFCL",
    "tool_calling": "Tool calling",
    "bfcl_multi_turn": "BFCL multi-turn",
    "toolcall_multiturn": "Multi-turn tool use",
}
UNKNOWN = "?"  # a run's model or task that no source names


def method_sort(methods: Iterable[str]) -> list[str]:
    """Methods in :data:`METHOD_ORDER`, then any other name alphabetically (each once)."""
    methods = set(methods)
    return [m for m in METHOD_ORDER if m in methods] + sorted(methods - set(METHOD_ORDER))


def task_sort(tasks: Iterable[str]) -> list[str]:
    """Tasks in :data:`TASK_ORDER`, then any other name alphabetically (each once)."""
    tasks = set(tasks)
    return [t for t in TASK_ORDER if t in tasks] + sorted(tasks - set(TASK_ORDER))
