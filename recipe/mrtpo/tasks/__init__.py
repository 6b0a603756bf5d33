"""Verifiers, one module per task; importing this package registers the built-in tasks."""

from recipe.mrtpo.tasks.base import (
    Context,
    RewardResult,
    get_task,
    record_field_of,
    register_task,
    registered_tasks,
    to_plain,
)

__all__ = ["Context", "RewardResult", "get_task", "record_field_of", "register_task", "registered_tasks", "to_plain"]

# Built-in tasks register themselves on import (see each module's bottom line).
from recipe.mrtpo.tasks import instruction_following as _if  # noqa: E402,F401
from recipe.mrtpo.tasks import synthetic_slots as _slots  # noqa: E402,F401
from recipe.mrtpo.tasks import text_to_sql as _sql  # noqa: E402,F401
from recipe.mrtpo.tasks import tool_calling as _tool  # noqa: E402,F401
from recipe.mrtpo.tasks import toolrl as _toolrl  # noqa: E402,F401
from recipe.mrtpo.tasks.multi_turn import verifier as _multi_turn  # noqa: E402,F401
