"""Matching predicted calls to reference calls with BFCL's AST semantics (the ``correctness`` reward).

A predicted call is *BFCL-valid* for a reference call exactly when BFCL's ``simple_function_checker``
(bfcl-eval 2026.3.23, ``eval_checker/ast_eval/ast_checker.py``, Python language) accepts it; this
module re-states that checker per argument so that the reward can also count partial matches:

- the names are equal (exactly);
- every parameter the spec lists as ``required`` is given, and every argument of ``accepted`` whose
  list has no ``""`` is given (omission is allowed exactly where the reference lists ``""``; a
  parameter's ``default`` in the spec forgives nothing);
- every given argument is declared by the spec and listed in ``accepted``, has the spec's type
  (``integer``: a JSON integer, not a float and not a boolean; ``number``: a float, or an integer,
  which BFCL converts; ``string``, ``boolean``, ``array``, ``object`` likewise; ``null`` is never
  valid), one level of item types for arrays, and a value among the acceptable ones: strings after
  BFCL's normalisation (lower case, spaces and ``,./-_*^`` removed, ``'`` read as ``"``), list elements
  the same, objects key by key against BFCL's nested notation, everything else by Python equality;
- BFCL's "variable" rule: when the acceptable values have another type than the spec's (a variable
  name written as a string), a value of that type is compared literally.

Without a spec for the function (no ``tools`` in the ground truth), nothing is declared or required
and types are not checked; values are compared as above (strings normalised).

Calls are matched one-to-one, order-free, by the assignment that maximises the total pair score
(Hungarian algorithm); a pair scores 0 when the names differ, else ``(1 + m) / (1 + u)`` with ``u``
the given arguments plus the missing required ones and ``m`` the valid given ones; ``correctness =
sum / max(n_pred, n_ref)``. So ``correctness == 1`` iff the counts are equal and every pair is
BFCL-valid. (BFCL's parallel checker matches greedily, in reference order, and can reject a correct
permutation that the optimal matching accepts: the evaluation reports BFCL's own verdict next to this.)
"""

from __future__ import annotations

import re
from typing import Any, Optional

from recipe.mrtpo.tasks.tool_reference import accepted_values

__all__ = ["standardize_string", "param_valid", "pair_score", "correctness_score", "max_assignment"]

_PY_TYPES = {
    "string": str, "integer": int, "number": float, "float": float, "boolean": bool,
    "array": list, "tuple": list, "object": dict, "dict": dict, "any": str,
}
_STD = re.compile(r"[ \,\.\/\-\_\*\^]")


def standardize_string(s: str) -> str:
    """BFCL's string normalisation: spaces and ``,./-_*^`` removed, lower case, ``'`` -> ``"``."""
    return _STD.sub("", s).lower().replace("'", '"')


def _std(x: Any) -> Any:
    return standardize_string(x) if type(x) is str else x


def _answer_type(allowed: list) -> Optional[type]:
    for a in allowed:
        if not (type(a) is str and a == ""):
            return type(a)
    return None


def _type_check(value: Any, allowed: Any, expected: type, nested: Optional[type]) -> tuple[bool, bool]:
    """(valid, is_variable) as BFCL's ``type_checker``."""
    allowed = allowed if isinstance(allowed, list) else [allowed]
    pa_type = _answer_type(allowed)
    is_variable = pa_type is not None and pa_type is not expected
    valid = True
    if type(value) is expected:
        if nested is None:
            return True, is_variable
        for item in allowed:
            if type(item) is list and not all(_type_check(v, item, nested, None)[0] for v in value):
                continue
            return True, is_variable
        valid = False
    if pa_type is not None and type(value) is pa_type:
        return valid, True
    return False, False


def _string_ok(value: str, allowed: list) -> bool:
    return standardize_string(value) in [standardize_string(a) for a in allowed if type(a) is str]


def _list_ok(value: list, allowed: list) -> bool:
    out = [_std(x) for x in value]
    for a in allowed:
        if isinstance(a, (list, str)) and out == [_std(a[j]) for j in range(len(a))]:
            return True
    return False


def _dict_ok(value: Any, allowed: list) -> bool:
    if not isinstance(value, dict):
        return False
    for pa in allowed:
        if type(pa) is str and pa == "":
            continue
        if not isinstance(pa, dict):
            continue
        ok = True
        for key, v in value.items():
            options = pa.get(key)
            if key not in pa or not isinstance(options, (list, str)) or _std(v) not in [_std(x) for x in options]:
                ok = False
                break
        if ok and all(key in value or (isinstance(vals, (list, str)) and "" in vals) for key, vals in pa.items()):
            return True
    return False


def _list_dict_ok(value: list, allowed: list) -> bool:
    for alt in allowed:
        if not isinstance(alt, (list, str)) or len(value) != len(alt):
            continue
        if all(_dict_ok(value[i], [alt[i]]) for i in range(len(value))):
            return True
    return False


def param_valid(value: Any, allowed: Any, schema: Optional[dict]) -> bool:
    """Whether one argument value passes BFCL's type and value checks (module docstring).

    ``allowed``: the acceptable values (BFCL notation); ``schema``: the parameter's spec (or None).
    """
    allowed = allowed if isinstance(allowed, list) else [allowed]
    desc = schema.get("type") if isinstance(schema, dict) else None
    expected = _PY_TYPES.get(desc) if isinstance(desc, str) else None
    nested = None
    if expected is list and desc in ("array", "tuple"):
        items = schema.get("items")
        item_type = items.get("type") if isinstance(items, dict) else None
        nested = _PY_TYPES.get(item_type) if isinstance(item_type, str) else None
    if expected is float and type(value) is int:
        value = float(value)
    is_variable = False
    if expected is not None:
        valid, is_variable = _type_check(value, allowed, expected, nested)
        if not valid:
            return False
    elif value is None:
        return False
    try:
        if not is_variable:
            if expected is dict:
                return _dict_ok(value, allowed)
            if expected is list and nested is dict:
                return _list_dict_ok(value, allowed)
            if expected is str or (expected is None and type(value) is str):
                return _string_ok(value, allowed)
            if expected is list or (expected is None and type(value) is list):
                return _list_ok(value, allowed)
        return value in allowed
    except (TypeError, KeyError, IndexError, AttributeError, RecursionError):
        return False  # malformed acceptable values (BFCL would raise): not valid


def pair_score(pred: dict, ref: dict, spec: Optional[dict]) -> float:
    """``(1 + m) / (1 + u)`` of one predicted call against one reference call (module docstring)."""
    if pred["name"] != ref["name"]:
        return 0.0
    params = spec.get("parameters") if isinstance(spec, dict) else None
    props = params.get("properties") if isinstance(params, dict) else None
    props = props if isinstance(props, dict) else None
    req = params.get("required") if isinstance(params, dict) else None
    required = set(req) if isinstance(req, list) else set()
    accepted, given = accepted_values(ref), pred["arguments"]
    mandatory = {k for k, v in accepted.items() if "" not in v} | required
    missing = len(mandatory - set(given))
    matched = 0
    for k, v in given.items():
        if (props is not None and k not in props) or k not in accepted:
            continue
        matched += param_valid(v, accepted[k], props.get(k) if props is not None else None)
    return (1.0 + matched) / (1.0 + len(given) + missing)


def max_assignment(w: list[list[float]]) -> float:
    """Maximum total weight of a one-to-one matching (weights >= 0; Hungarian, O(n^2 m))."""
    if not w or not w[0]:
        return 0.0
    if len(w) > len(w[0]):
        w = [list(col) for col in zip(*w)]
    n, m = len(w), len(w[0])
    inf = float("inf")
    u, v = [0.0] * (n + 1), [0.0] * (m + 1)
    p, way = [0] * (m + 1), [0] * (m + 1)
    for i in range(1, n + 1):
        p[0], j0 = i, 0
        minv, used = [inf] * (m + 1), [False] * (m + 1)
        while True:
            used[j0] = True
            i0, delta, j1 = p[j0], inf, 0
            row = w[i0 - 1]
            for j in range(1, m + 1):
                if not used[j]:
                    cur = -row[j - 1] - u[i0] - v[j]
                    if cur < minv[j]:
                        minv[j], way[j] = cur, j0
                    if minv[j] < delta:
                        delta, j1 = minv[j], j
            for j in range(m + 1):
                if used[j]:
                    u[p[j]] += delta
                    v[j] -= delta
                else:
                    minv[j] -= delta
            j0 = j1
            if p[j0] == 0:
                break
        while j0:
            j1 = way[j0]
            p[j0] = p[j1]
            j0 = j1
    return sum(w[p[j] - 1][j - 1] for j in range(1, m + 1) if p[j])


def correctness_score(pred: list[dict], ref: list[dict], specs: Optional[dict[str, dict]] = None) -> float:
    """Best order-free matching of predicted to reference calls, normalised by max(n_pred, n_ref).

    ``specs``: function name -> spec (:func:`tool_reference.function_specs`)."""
    if not pred and not ref:
        return 1.0
    if not pred or not ref:
        return 0.0
    specs = specs or {}
    w = [[pair_score(p, r, specs.get(r["name"])) for r in ref] for p in pred]
    total = max_assignment(w)
    return min(1.0, max(0.0, total / max(len(pred), len(ref))))
