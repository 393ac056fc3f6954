"""What a checked model refuses, said in pictl's words: `images: must be between 1 and 2000 (got 1000000000)`.

pydantic checks every option, inventory, profile and record; what it found wrong reaches a person only through
here, never in pydantic's own phrasing ("Input should be ...", "1 validation error for RunOptions", a type tag).
A field is named as the caller calls it (`name_of`: a flag on the command line, a keyword in Python, a key in
a file), a bound is said whole (both ends, read from the model's field), and the value given is shown, cut
short and printable.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Annotated, Any, Union, get_args, get_origin

import annotated_types as at
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from pictl.text import shown

__all__ = ["Namer", "field_path", "got", "problem", "problem_line"]

Namer = Callable[[str], str]
"""How the caller calls a top-level field (`images` -> `--images` on the command line)."""

_KINDS = {
    "int_type": "a whole number", "int_parsing": "a whole number", "int_from_float": "a whole number",
    "float_type": "a number", "float_parsing": "a number", "finite_number": "a finite number",
    "bool_type": "true or false", "bool_parsing": "true or false",
    "string_type": "text", "string_unicode": "text", "bytes_type": "text",
    "list_type": "a list", "tuple_type": "a list", "set_type": "a list", "iterable_type": "a list",
    "dict_type": "a table of named values", "mapping_type": "a table of named values",
    "model_type": "a table of named values", "model_attributes_type": "a table of named values",
    "dataclass_type": "a table of named values", "callable_type": "a function",
    "none_required": "empty (null)",
}
"""Error types that mean "not of the right kind", and the kind, as people say it."""


def got(value: Any, limit: int = 60) -> str:
    """The value a person gave, as the message shows it: its repr, printable, cut short (a hostile value may be
    megabytes long or nested thousands deep)."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # an int of 5000 digits, a list nested past the recursion limit
        return f"a {type(value).__name__}"
    return shown(text, limit)


def _number(value: Any) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _unwrap(annotation: Any) -> tuple[Any, list[Any]]:
    """`annotation` without `Annotated[...]` and `| None`, and the constraints it carried."""
    constraints: list[Any] = []
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation, *extra = get_args(annotation)
            for item in extra:  # a Field(...) inside Annotated carries its constraints as metadata
                constraints += getattr(item, "metadata", [item])
        elif origin is Union or type(annotation).__name__ == "UnionType":
            members = [a for a in get_args(annotation) if a is not type(None)]
            if len(members) != 1:
                return annotation, constraints
            annotation = members[0]
        else:
            return annotation, constraints


def _fields(owner: Any) -> dict[str, Any]:
    """A model's or a pydantic dataclass's fields (none for anything else)."""
    found = getattr(owner, "__pydantic_fields__", None)
    return found if isinstance(found, dict) else {}


def _constraints(model: Any, loc: tuple[Any, ...]) -> list[Any]:
    """The constraints (ge, le, ...) on the field at `loc` in `model`, following nested models and list items."""
    annotation: Any = model
    constraints: list[Any] = []
    for part in loc:
        if isinstance(part, str):
            info = _fields(annotation).get(part)
            if info is None:
                return []
            annotation, constraints = _unwrap(info.annotation)
            constraints = [*info.metadata, *constraints]
        elif get_origin(annotation) in (list, tuple, set, frozenset):
            args = get_args(annotation)
            if not args:
                return []
            annotation, constraints = _unwrap(args[0])
        else:
            return []
    return constraints


def _range(error: ErrorDetails, model: Any) -> str:
    """A bound broken, said with both ends where the field has both: `between 1 and 2000`, `at least 0`."""
    bounds = dict(error.get("ctx") or {})
    for c in _constraints(model, tuple(error["loc"])) if model is not None else []:
        for name in ("ge", "gt", "le", "lt"):
            if isinstance(c, getattr(at, name.capitalize())):
                bounds.setdefault(name, getattr(c, name))
    low = (f"at least {_number(bounds['ge'])}" if "ge" in bounds
           else f"more than {_number(bounds['gt'])}" if "gt" in bounds else None)
    high = (f"at most {_number(bounds['le'])}" if "le" in bounds
            else f"less than {_number(bounds['lt'])}" if "lt" in bounds else None)
    if "ge" in bounds and "le" in bounds:
        return f"must be between {_number(bounds['ge'])} and {_number(bounds['le'])}"
    return "must be " + " and ".join(p for p in (low, high) if p)


def problem(error: ErrorDetails, model: Any = None, *, name_of: Namer = str) -> str:
    """What is wrong with one field, in plain words and with the value given: `must be a whole number (got
    'two')`. `model` (the model or pydantic dataclass checked) lets a bound be said with both of its ends and
    an unknown field be matched to the nearest known one."""
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    if kind in ("value_error", "assertion_error"):  # our own validators' words: they say what is wrong
        return str(ctx.get("error", error["msg"])).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if kind == "missing":
        return "missing"
    if kind == "extra_forbidden":
        loc = tuple(error["loc"])
        known = list(_fields(_owner(model, loc[:-1])))
        near = difflib.get_close_matches(str(loc[-1]), known, n=1) if loc else []
        return "unknown field" + (f" (did you mean {name_of(near[0]) if len(loc) == 1 else near[0]}?)" if near else "")
    if kind in _KINDS:
        what = f"must be {_KINDS[kind]}"
    elif kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        what = _range(error, model)
    elif kind in ("literal_error", "enum"):
        expected = str(ctx.get("expected", "?"))
        what = f"must be {'one of ' if ',' in expected else ''}{expected}"
    elif kind == "is_instance_of":
        what = f"must be a {ctx.get('class', 'value of another kind')}"
    elif kind in ("string_too_short", "string_too_long"):
        n = ctx.get("min_length" if kind == "string_too_short" else "max_length")
        if kind == "string_too_short" and n == 1:
            return "must not be empty"
        length = len(value) if isinstance(value, str) else "?"
        return f"must have {'at least' if kind == 'string_too_short' else 'at most'} {n} characters (got {length})"
    elif kind in ("too_short", "too_long"):
        n = ctx.get("min_length" if kind == "too_short" else "max_length")
        return (f"must have {'at least' if kind == 'too_short' else 'at most'} {n} item(s) "
                f"(got {ctx.get('actual_length', '?')})")
    elif kind == "string_pattern_mismatch":
        what = f"must match {ctx.get('pattern', 'the expected form')}"
    else:  # a kind not worded here: pydantic's sentence, without its "Input should be"
        msg = str(error["msg"]).removeprefix("Value error, ")
        what = msg.replace("Input should be", "must be").replace("input should be", "must be")
        what = what[:1].lower() + what[1:]
    return f"{what} (got {got(value)})"


def _owner(model: Any, loc: tuple[Any, ...]) -> Any:
    """The model that holds the field at `loc` + (name,): `model` itself at the top, else a nested one."""
    annotation: Any = model
    for part in loc:
        if isinstance(part, str):
            info = _fields(annotation).get(part)
            if info is None:
                return None
            annotation, _ = _unwrap(info.annotation)
        elif get_origin(annotation) in (list, tuple):
            annotation, _ = _unwrap((get_args(annotation) or (None,))[0])
    return annotation


def field_path(loc: tuple[Any, ...], name_of: Namer = str) -> str:
    """Where the problem is: the top field as the caller calls it (`name_of`), then keys and `[index]`es; a key
    a person wrote may hold anything (a newline, a dot): one that is not a plain name is quoted."""
    parts: list[str] = []
    for i, item in enumerate(loc):
        if isinstance(item, int):
            if parts:
                parts[-1] += f"[{item}]"
            else:
                parts.append(f"[{item}]")
            continue
        text = str(item)
        if i == 0:
            text = name_of(text)
        elif not text.replace("_", "a").replace("-", "a").isalnum():
            text = repr(text)
        parts.append(shown(text, 80))
    return ".".join(parts)


def problem_line(exc: ValidationError, model: Any = None, *, name_of: Namer = str, source: str = "") -> str:
    """The first problem as one line, `SOURCE: FIELD: PROBLEM (and N more)`; a problem of the whole model (one
    of its own checks) has no FIELD, and no SOURCE is said where there is none."""
    errors = exc.errors()
    first = errors[0]
    where = field_path(tuple(first["loc"]), name_of)
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return ": ".join(p for p in (source, where, problem(first, model, name_of=name_of) + more) if p)
