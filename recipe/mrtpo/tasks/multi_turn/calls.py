"""BFCL call strings: reading them, the ``format`` reward's rule, and the gate before BFCL's ``eval``.

A call string is what BFCL's ``decode_execute`` produces, ``name(arg=value, ...)`` (gold answers also
use positional arguments: ``sort('final_report.pdf')``). :func:`parse_call` reads one with Python's
``ast``: exactly one call expression whose callee is a bare name, arguments positional or keyword (no
``*``/``**``), every value a Python literal (``ast.literal_eval``: strings, numbers, booleans, None,
lists, tuples, dicts, sets). Nothing is evaluated.

**Well-formed call** (:func:`call_error` returns None), against the function docs of the question: it
parses; its name is a documented function; positional arguments fill the declared parameters in the
doc's order, no more of them than declared; every keyword is a declared parameter and none is given
twice; every required parameter is given. Values are not checked against the declared types: BFCL's
own gold breaks them (``close_ticket(ticket_id='ticket_001')`` for an ``integer`` parameter, in question
173 of each category) and its backends take what they can use; a wrong value costs ``state`` or
``response``.

**The gate** (:func:`executable_calls`): BFCL's executor runs each call string through Python's ``eval``
after prefixing the backend's method names with their instance; model output must not reach that
``eval`` as code. A call goes to BFCL unchanged iff it parses as above and its name is either a method
of the involved backends (BFCL runs it, offered or not, as BFCL would) or a name that ``eval`` cannot
resolve (not a builtin nor a global of BFCL's executor module: ``eval`` then fails with NameError before
evaluating anything, BFCL's own result). Any other call (unparsable, a non-literal argument, an
attribute or subscript callee, a builtin such as ``open``) is replaced by :data:`REFUSED_CALL`, a name
that resolves to nothing: BFCL then records ``Error during execution: name '...' is not defined``
where it would have recorded the call's own error (or run it). The only difference to BFCL's result is
that error's text, which BFCL compares with the gold's results only; the refusals are counted.
"""

from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass
from typing import Any, Optional

__all__ = [
    "MAX_CALL_CHARS",
    "REFUSED_CALL",
    "CallParseError",
    "ParsedCall",
    "parse_call",
    "call_error",
    "executable_calls",
]

MAX_CALL_CHARS = 10_000  # far above any gold call (the longest is a few hundred characters)
REFUSED_CALL = "mrtpo_refused_call()"


class CallParseError(ValueError):
    """The string is not one literal-argument call of a bare name."""


@dataclass(frozen=True)
class ParsedCall:
    name: str
    args: tuple
    kwargs: tuple  # ((name, value), ...) in the written order


def parse_call(text: Any) -> ParsedCall:
    """One call string read without evaluating anything (module docstring); CallParseError otherwise."""
    if not isinstance(text, str):
        raise CallParseError(f"not a string ({type(text).__name__})")
    if len(text) > MAX_CALL_CHARS:
        raise CallParseError(f"longer than {MAX_CALL_CHARS} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
        raise CallParseError(f"does not parse ({type(e).__name__})") from None
    node = tree.body
    if not isinstance(node, ast.Call):
        raise CallParseError("not a call")
    if not isinstance(node.func, ast.Name):
        raise CallParseError("the callee is not a bare function name")
    args, kwargs = [], []
    try:
        for a in node.args:
            if isinstance(a, ast.Starred):
                raise CallParseError("*args are not allowed")
            args.append(ast.literal_eval(a))
        for k in node.keywords:
            if k.arg is None:
                raise CallParseError("**kwargs are not allowed")
            kwargs.append((k.arg, ast.literal_eval(k.value)))
    except CallParseError:
        raise
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as e:
        raise CallParseError(f"an argument is not a literal ({type(e).__name__})") from None
    return ParsedCall(node.func.id, tuple(args), tuple(kwargs))


def call_error(text: Any, docs_by_name: dict[str, dict]) -> Optional[str]:
    """None if ``text`` is a well-formed call of a function of ``docs_by_name`` (module docstring), else why not."""
    try:
        call = parse_call(text)
    except CallParseError as e:
        return str(e)
    doc = docs_by_name.get(call.name)
    if doc is None:
        return f"{call.name} is not a function of this question"
    params = doc.get("parameters") or {}
    props = params.get("properties") or {}
    names = list(props)
    if len(call.args) > len(names):
        return f"{call.name}: {len(call.args)} positional arguments for {len(names)} parameters"
    given: dict[str, Any] = dict(zip(names, call.args))
    for k, v in call.kwargs:
        if k not in props:
            return f"{call.name}: undeclared argument {k!r}"
        if k in given:
            return f"{call.name}: argument {k!r} given twice"
        given[k] = v
    missing = [r for r in params.get("required") or [] if r not in given]
    if missing:
        return f"{call.name}: missing required argument(s) {missing}"
    return None


def _unresolvable(name: str) -> bool:
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    return not hasattr(builtins, name) and name not in vars(multi_turn_utils)


def executable_calls(calls: list[str], methods: frozenset) -> tuple[list[str], int]:
    """The calls as BFCL's executor may receive them (module docstring) and how many were refused."""
    out, refused = [], 0
    for text in calls:
        try:
            name = parse_call(text).name
        except CallParseError:
            name = None
        if name is not None and (name in methods or _unresolvable(name)) and not name.startswith("mrtpo_"):
            out.append(text.strip())
        else:
            out.append(REFUSED_CALL)
            refused += 1
    return out, refused
