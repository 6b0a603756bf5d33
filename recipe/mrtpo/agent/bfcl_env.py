"""BFCL v4 multi-turn's environment for one trajectory: the test entry, fresh backends, decoding, execution.

No verl here (the agent loop, :mod:`.bfcl_loop`, binds this to verl's rollout); the pinned ``bfcl-eval``
package supplies the backends, their function docs and its protocol's constants.

The row (:func:`parse_entry`)
    The question's fields in the row's ``extra_info``, as ``data_prep.multi_turn`` writes them (the one
    builder of these rows; each field a value or its JSON string after parquet): ``id``
    (``multi_turn_<category>_<n>``), ``involved_classes``, ``initial_config`` (class -> state),
    ``tools`` (the function specs offered from the first turn, ``{"type": "function", "function": spec}``),
    ``missed_function`` (miss_func: turn -> the specs added at that turn; optional) and ``user_turns``
    (per turn its user messages, turn 0 being the prompt's; a miss_func turn holds BFCL's FC message
    "I have updated some more functions ..."). A malformed row is a data error (:class:`BFCLEntryError`).

Backends (:class:`BFCLEnv`)
    One instance per involved class per trajectory, built as BFCL's ``execute_multi_turn_func_call`` builds
    it (``class_()``, then ``_load_scenario(deepcopy(initial_config[class]), long_context=...)`` unless the
    class is stateless), but held by the trajectory: BFCL keys its instances in the module's
    ``globals()`` by ``{model}_{test_id}_{class}``, so two trajectories of one test id in one process (a
    GRPO group) would share state there. Method names map to instances in ``involved_classes`` order, a
    later class overriding an earlier one (BFCL's ``class_method_name_mapping``). WebSearchAPI (network)
    and the memory classes (files on disk) are refused: no multi-turn category uses them.

Decoding (:func:`decode_step`)
    The recipe's tool-calling format (Qwen2.5's ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
    blocks, read by :func:`recipe.mrtpo.tasks.tool_json.extract_calls`, whose rules the tool-calling
    task's docstring states) converted to BFCL's call strings as BFCL's ``convert_to_function_call`` writes
    them: ``name(k1=repr(v1),k2=repr(v2))``. A step decodes whole or not at all (BFCL's decoders return
    every call of a step or raise): a block that does not read as a call, a name or argument key that is
    not a Python identifier (BFCL would ``eval`` the string; a key like ``a=__import__('os')...`` would
    run), or more blocks than the step allows make the step an error with a reason.

Execution (:meth:`BFCLEnv.execute`)
    The call runs as BFCL's ``eval`` of ``instance.name(**arguments)`` does, without ``eval``: the method
    is called with the decoded arguments (``repr`` of a JSON value evaluates back to the same value, so
    the backend sees what BFCL's ``eval`` would pass). Results are BFCL's strings: a ``str`` as is, a
    ``dict`` as JSON (``str`` when it does not serialise), anything else ``str``; an exception is
    ``"Error during execution: {e}"``; BFCL's refused names (``kill``, ``exit``, ...) and names no
    instance has give BFCL's messages. :meth:`BFCLEnv.call` runs a call in the calling thread;
    :meth:`BFCLEnv.execute` runs it in a thread of its own under a time limit: past it the call is
    reported as timed out and the environment is *poisoned* (Python cannot stop a thread; an asynchronous
    exception is raised in it, which ends pure-Python loops but not one long C operation), so the loop ends
    the trajectory. The loop's default isolation runs the backends in a child process instead
    (:mod:`.bfcl_process`), which can be killed and whose memory is capped.
"""

from __future__ import annotations

import copy
import ctypes
import functools
import importlib
import inspect
import json
import keyword
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

# The tasks package is imported where it is used, not here: the backends' child process
# (:mod:`.bfcl_process`) imports this module and must start fast (the tasks package takes seconds).

__all__ = [
    "AGENT_NAME", "ROW_FIELDS", "REFUSED_CLASSES", "FORBIDDEN_NAMES", "BFCLEntry", "BFCLEntryError", "BFCLEnv",
    "StepDecode", "ExecResult", "parse_entry", "tools_of_row", "injected_turn", "decode_step", "call_string",
]

#: the agent-loop name rows choose the BFCL loop with (``agent_name``; registered by :mod:`.bfcl_loop`)
AGENT_NAME = "bfcl_multi_turn"
#: the ``extra_info`` fields a row must carry (``missed_function`` is optional)
ROW_FIELDS = ("id", "involved_classes", "initial_config", "tools", "user_turns")
#: classes no multi-turn category involves and this loop refuses: WebSearchAPI reaches the network, the
#: memory backends read and write snapshot files
REFUSED_CLASSES = frozenset({"WebSearchAPI", "MemoryAPI_kv", "MemoryAPI_vector", "MemoryAPI_rec_sum"})
#: BFCL's ``execute_multi_turn_func_call`` refuses these names before its ``eval`` (restated: the list is
#: inline in that function)
FORBIDDEN_NAMES = ("kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run")
MAX_ENTRY_CHARS = 5_000_000  # a test entry's JSON (long_context entries are the largest, ~100 kB)

# The bfcl-eval functions this module restates or follows are pinned, with the loop's other reliances, in
# recipe.mrtpo.agent.pins (BFCL_SOURCES; checked by tests/unit/test_bfcl_loop.py).


class BFCLEntryError(ValueError):
    """The row's BFCL question fields are missing or not of their shape (a data error, not model output)."""


@dataclass(frozen=True)
class BFCLEntry:
    """One BFCL multi-turn question as the row carries it (module docstring, The row)."""

    id: str
    turns: tuple  # per user turn, its messages ({"role", "content"}); turn 0 is the row's prompt
    initial_config: dict
    involved_classes: tuple
    tools: tuple  # the function specs offered from the first turn, wrapped {"type": "function", "function": spec}
    held_out: dict  # turn index -> the specs (wrapped) added at that turn (miss_func)

    @property
    def category(self) -> str:
        return self.id.rsplit("_", 1)[0]

    @property
    def long_context(self) -> bool:
        """BFCL's ``long_context`` argument of ``_load_scenario`` (``base_handler``)."""
        return "long_context" in self.category or "composite" in self.category


def _json(value: Any, what: str) -> Any:
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, str):
        if len(value) > MAX_ENTRY_CHARS:
            raise BFCLEntryError(f"extra_info.{what}: JSON longer than {MAX_ENTRY_CHARS} characters")
        try:
            return json.loads(value)
        except ValueError as e:
            raise BFCLEntryError(f"extra_info.{what}: not JSON ({e})") from None
    from recipe.mrtpo.tasks.base import to_plain

    return to_plain(value)


def _wrapped(spec: Any, what: str) -> dict:
    """A function spec as ``tools=`` takes it: ``{"type": "function", "function": spec}`` (a bare spec wrapped)."""
    inner = spec.get("function", spec) if isinstance(spec, Mapping) else None
    if not isinstance(inner, Mapping) or not _identifier(inner.get("name")):
        raise BFCLEntryError(f"extra_info.{what}: a function spec without an identifier name: {str(spec)[:120]}")
    return {"type": "function", "function": dict(inner)}


def _spec_list(value: Any, what: str) -> tuple:
    specs = _json(value, what)
    if not isinstance(specs, list):
        raise BFCLEntryError(f"extra_info.{what}: expected a list of function specs")
    return tuple(_wrapped(t, what) for t in specs)


def parse_entry(extra_info: Any) -> BFCLEntry:
    """The :class:`BFCLEntry` of a row's ``extra_info`` (module docstring, The row); BFCLEntryError if malformed."""
    if not isinstance(extra_info, Mapping):
        raise BFCLEntryError(f"extra_info: expected an object with the BFCL question, got {type(extra_info).__name__}")
    missing = [k for k in ROW_FIELDS if k not in extra_info]
    if missing:
        raise BFCLEntryError(f"extra_info lacks {missing} (data_prep.multi_turn writes {list(ROW_FIELDS)})")
    entry_id = extra_info["id"]
    if not isinstance(entry_id, str) or not entry_id.startswith("multi_turn_"):
        raise BFCLEntryError(f"extra_info.id: {str(entry_id)[:80]!r} is not a BFCL multi-turn id (multi_turn_<category>_<n>)")
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    classes = _json(extra_info["involved_classes"], "involved_classes")
    if not isinstance(classes, list) or not classes:
        raise BFCLEntryError("extra_info.involved_classes: expected a non-empty list")
    for c in classes:
        if c not in CLASS_FILE_PATH_MAPPING:
            raise BFCLEntryError(f"extra_info.involved_classes: unknown backend class {str(c)[:60]!r}")
        if c in REFUSED_CLASSES:
            raise BFCLEntryError(f"extra_info.involved_classes: backend class {c!r} is refused (network or disk state)")
    config = _json(extra_info["initial_config"], "initial_config")
    if not isinstance(config, dict):
        raise BFCLEntryError("extra_info.initial_config: expected an object (class -> state)")
    turns = _json(extra_info["user_turns"], "user_turns")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, list) and t for t in turns):
        raise BFCLEntryError("extra_info.user_turns: expected a non-empty list of non-empty message lists")
    for t in turns:
        for m in t:
            if not (isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise BFCLEntryError("extra_info.user_turns: a message is not {'role': str, 'content': str}")
    missed = _json(extra_info.get("missed_function") or {}, "missed_function")
    if not isinstance(missed, Mapping):
        raise BFCLEntryError("extra_info.missed_function: expected an object (turn -> function specs)")
    held = {}
    for k, specs in missed.items():
        if not str(k).isdigit() or not 0 < int(k) < len(turns):
            raise BFCLEntryError(f"extra_info.missed_function: turn {str(k)[:20]!r} is not a later turn of the question")
        held[int(k)] = _spec_list(specs, f"missed_function[{k}]")
    return BFCLEntry(
        id=entry_id,
        turns=tuple(tuple({"role": m["role"], "content": m["content"]} for m in t) for t in turns),
        initial_config=config,
        involved_classes=tuple(classes),
        tools=_spec_list(extra_info["tools"], "tools"),
        held_out=held,
    )


@functools.lru_cache(maxsize=4096)
def _tools_json(value: str) -> str:
    return json.dumps(list(_spec_list(value, "tools")))


def tools_of_row(extra_info: Any) -> list[dict]:
    """The ``tools=`` the loop renders a row's prompt with (the replay renders P_all with the same)."""
    if not isinstance(extra_info, Mapping) or "tools" not in extra_info:
        raise BFCLEntryError("extra_info.tools: a bfcl_multi_turn row carries its function specs")
    value = extra_info["tools"]
    if isinstance(value, str):
        return json.loads(_tools_json(value))  # a fresh copy: callers may not mutate the cache
    return list(_spec_list(value, "tools"))


def injected_turn(entry: BFCLEntry, turn: int) -> list[dict]:
    """The messages appended at the start of ``turn`` (> 0): the row's user messages of that turn; at a
    miss_func turn the held-out specs (JSON) come first in its message, as BFCL's prompting mode writes them
    (``DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING`` = ``"{functions}\n"`` + the FC message the row
    holds there).

    BFCL's FC mode adds the functions to ``tools`` and re-renders the whole prompt; verl's Continuous Token
    rollout appends only (the prompt's tools block cannot change mid-trajectory), so the specs come in the
    injected turn, in the same wrapping and JSON as ``tools=`` (BFCL writes the list's Python ``str``).
    """
    msgs = [dict(m) for m in entry.turns[turn]]
    if turn in entry.held_out:
        from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING

        prefix = DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.split("{functions}")[0]
        functions = json.dumps(list(entry.held_out[turn]), ensure_ascii=False)
        msgs[0]["content"] = prefix + functions + "\n" + msgs[0]["content"]
    return msgs


# --------------------------------------------------------------------------------------------------
# Decoding the model's text
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepDecode:
    """One step's text read as calls: ``attempted`` (it opened a ``<tool_call>``), the calls
    (``{"name", "arguments"}``) and their BFCL strings, or the error and its counted reason."""

    attempted: bool
    calls: tuple = ()
    strings: tuple = ()
    error: Optional[str] = None
    reason: Optional[str] = None


def _identifier(s: Any) -> bool:
    return isinstance(s, str) and s.isidentifier() and not keyword.iskeyword(s)


def call_string(name: str, arguments: Mapping) -> str:
    """BFCL's ``convert_to_function_call`` for one call: ``f"{name}({','.join(f'{k}={repr(v)}' ...)})"``."""
    return f"{name}({','.join(f'{k}={v!r}' for k, v in arguments.items())})"


def decode_step(text: Any, max_calls: int) -> StepDecode:
    """The step's calls (module docstring, Decoding). Never raises."""
    from recipe.mrtpo.tasks.base import as_text
    from recipe.mrtpo.tasks.tool_json import CALL_OPEN, MAX_CALLS, extract_calls, outside_think

    text = as_text(text)
    opened = outside_think(text).count(CALL_OPEN)
    if opened == 0:
        return StepDecode(attempted=False)
    if opened > min(max_calls, MAX_CALLS):
        return StepDecode(True, error=f"{opened} tool calls in one step, more than {min(max_calls, MAX_CALLS)}",
                          reason="too_many_calls")
    calls = extract_calls(text)
    if len(calls) < opened:
        return StepDecode(True, error=f"{opened - len(calls)} of {opened} <tool_call> blocks are not a JSON object "
                                      "with a string name and an arguments object", reason="malformed_call")
    for c in calls:
        if not _identifier(c["name"]):
            return StepDecode(True, error=f"function name {c['name'][:60]!r} is not a Python identifier",
                              reason="bad_function_name")
        bad = [k for k in c["arguments"] if not _identifier(k)]
        if bad:
            return StepDecode(True, error=f"argument name {bad[0][:60]!r} of {c['name']} is not a Python identifier",
                              reason="bad_argument_name")
    return StepDecode(True, calls=tuple(calls), strings=tuple(call_string(c["name"], c["arguments"]) for c in calls))


# --------------------------------------------------------------------------------------------------
# The backends of one trajectory
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExecResult:
    """A call's result text (BFCL's string) and, when it failed, the counted reason."""

    text: str
    reason: Optional[str] = None


def _bfcl_result_text(value: Any) -> str:
    """BFCL's conversion of a call's return value (``execute_multi_turn_func_call``)."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except Exception:  # noqa: BLE001 (BFCL: a bare except, falling back to str)
            return str(value)
    return str(value)


def _interrupt(thread: threading.Thread) -> None:
    """Raise TimeoutError inside a runaway call's thread (best effort: it lands at the next bytecode)."""
    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(TimeoutError))


class BFCLEnv:
    """The backend instances of one trajectory (module docstring, Backends and Execution)."""

    def __init__(self, entry: BFCLEntry):
        from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING, STATELESS_CLASSES

        self.entry = entry
        self.instances: dict[str, Any] = {}
        self.methods: dict[str, Any] = {}
        self.poisoned = False  # a call timed out: the backends cannot be trusted any more
        self.stop_reason: Optional[str] = None
        for class_name in entry.involved_classes:
            instance = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name]), class_name)()
            if class_name not in STATELESS_CLASSES:
                instance._load_scenario(copy.deepcopy(entry.initial_config.get(class_name, {})),
                                        long_context=entry.long_context)
            self.instances[class_name] = instance
            for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
                if not name.startswith("_"):
                    self.methods[name] = method  # a later class overrides, as BFCL's name mapping does

    def call(self, name: str, arguments: Mapping) -> ExecResult:
        """Run one decoded call in this thread, without a time limit (what the child process of
        :class:`recipe.mrtpo.agent.bfcl_process.ProcessEnv` runs). Never raises."""
        if name in FORBIDDEN_NAMES:
            return ExecResult(f"Error during execution: Function call {name} is not allowed.", "forbidden_function")
        method = self.methods.get(name)
        if method is None:  # BFCL's eval of an unprefixed unknown name raises NameError
            return ExecResult(f"Error during execution: name '{name}' is not defined", "unknown_function")
        try:
            return ExecResult(_bfcl_result_text(method(**dict(arguments))))
        except BaseException as e:  # noqa: BLE001 (any failure of the backend is the model's error message)
            try:
                msg = str(e)
            except Exception:  # noqa: BLE001 (an exception whose __str__ fails)
                msg = type(e).__name__
            return ExecResult(f"Error during execution: {msg}", "call_raised")

    def execute(self, name: str, arguments: Mapping, timeout_s: float) -> ExecResult:
        """:meth:`call` in a thread of its own under a time limit (module docstring, Execution). Never raises."""
        if self.poisoned:
            return ExecResult("Error during execution: the environment stopped after a call timed out", "env_poisoned")
        box: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: box.setdefault("result", self.call(name, arguments)),
                                  name=f"bfcl-call-{name}", daemon=True)
        thread.start()
        thread.join(timeout_s)
        if thread.is_alive():
            _interrupt(thread)
            self.poisoned, self.stop_reason = True, "call_timeout"
            return ExecResult(f"Error during execution: the call did not finish within {timeout_s:g} s", "call_timeout")
        return box.get("result") or ExecResult("Error during execution: the call was interrupted", "call_raised")

    def snapshot(self) -> dict[str, Any]:
        """The backend instances as they are now (tests compare them with BFCL's state checker)."""
        return self.instances

    def close(self) -> None:
        """Nothing to release in-process (the process environment stops its child)."""

    def state(self) -> dict[str, dict]:
        """Each stateful instance's public attributes (what BFCL's state checker compares)."""
        from bfcl_eval.constants.executable_backend_config import STATELESS_CLASSES

        return {c: {k: v for k, v in vars(i).items() if not k.startswith("_")}
                for c, i in self.instances.items() if c not in STATELESS_CLASSES}
