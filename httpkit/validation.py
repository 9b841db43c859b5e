"""Request bodies parsed by pydantic models, with the error messages our APIs promise.

A model is the one statement of what a request may hold: /openapi.json is generated from it
(httpkit/openapi.py) and `validate(Model, body)` parses with it. A body that breaks a rule raises
`InvalidRequest` (a ValueError: message, param, status, code) for its first problem, in the
model's field order, an object's unknown fields first. The words come from `Errors` markers
written next to the rules they explain:

    class Req(BaseModel):
        error_messages: ClassVar[Errors] = Errors(type="'{name}' must be of type {label}, got {got}")
        max_tokens: Annotated[int | None, Field(ge=1),
                              Errors(greater_than_equal="'max_tokens' must be at least 1, got {input}")] = None

A marker maps pydantic error types (`greater_than_equal`, `missing`, ...), the groups "type" (a
wrong JSON type) and "range" (a bound), and, model-wide, "body" (the body is not an object) and
"object" (a list item where this model belongs is not one) to a template (`str.format`) or a
callable of the same variables; a kind mapped to None defers to the model's words. The deepest
level of the error's location words it: its field's marker, then its model's `error_messages`
(a kind named exactly first, then `BUILT_IN`, then groups, then defaults); failing that, the
default of a marker further out (the error is inside one of its objects or list items). A
validator that needs its own words raises `InvalidRequest`, a plain ValueError (its text is the
message), or `PydanticCustomError` (a kind for a marker to word).

Template variables: name (the top-level field, also the error's `param`), at (where the marker
applies: a.b[0].c), item (`at` and the list index after it), loc (the whole location), input
(the offending value), value (the top-level field's value), got (input's type name, "a boolean"
for booleans), type (type(input).__name__), label (the field's declared type: int, int/float,
bool, str, list, dict), lo and hi (the field's bounds), unknown (an object's unknown fields,
sorted) and unknown_names (them, joined with ", "), and pydantic's ctx (ge, max_length, ...).

No web framework here: the pipelines parse with it too.
"""
from __future__ import annotations

import logging
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import annotated_types
from pydantic import BaseModel, ValidationError

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)
Template = str | Callable[[Mapping[str, Any]], str]
_RANGE = {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "multiple_of"}
# what every API says the same way about a text field, unless a marker at the field names the kind
BUILT_IN: dict[str, Template] = {"string_unicode": "{at}: contains an unpaired surrogate (\\ud800-\\udfff)"}


class InvalidRequest(ValueError):
    """A request that breaks a rule: what to tell the client, and the field (`param`) it names."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code


class Errors:
    """The messages for one field (in its Annotated metadata) or one model (`error_messages`)."""

    def __init__(self, default: Template | None = None, /, *, status: int | None = None, code: str | None = None,
                 **kinds: Template):
        self.default, self.kinds, self.status, self.code = default, kinds, status, code

    def template(self, kind: str) -> Template | None:
        if kind in self.kinds:
            return self.kinds[kind]
        if kind in _RANGE and "range" in self.kinds:
            return self.kinds["range"]
        if _is_type_error(kind) and "type" in self.kinds:
            return self.kinds["type"]
        return self.default


def validate(model: type[M], data: Any, *, context: dict | None = None) -> M:
    """`model.model_validate(data)`, or InvalidRequest for the first problem, in our words."""
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        raise explain(exc, model, data) from None


def explain(exc: ValidationError, model: type[BaseModel], data: Any) -> InvalidRequest:
    errors = exc.errors(include_url=False)
    error = _pick(errors, model)
    ours = (error.get("ctx") or {}).get("error")
    name = error["loc"][0] if error["loc"] and isinstance(error["loc"][0], str) else None
    if isinstance(ours, InvalidRequest):                      # a validator's own words
        if ours.param is None and name is not None:
            ours.param = name
        return ours
    if error["type"] == "value_error" and isinstance(ours, ValueError):
        return InvalidRequest(str(ours), name)                 # a validator's check, in its own words
    levels, path, _ = _walk(model, error["loc"])
    unknown = sorted(str(e["loc"][-1]) for e in errors
                     if e["type"] == "extra_forbidden" and e["loc"][:-1] == error["loc"][:-1])
    if error["type"] == "extra_forbidden" and len(error["loc"]) == 1:
        name = unknown[0]
    value = data.get(name) if isinstance(data, dict) and name is not None else None
    kind = error["type"]
    if kind == "model_type" and levels[-1][1] is None:   # the body / a list item is not an object
        kind = "object" if error["loc"] else "body"
    for n, (cls, field, depth) in enumerate(reversed(levels)):
        info = cls.model_fields.get(field) if field else None
        found = _template([m for m in (info.metadata if info else ()) if isinstance(m, Errors)]
                          + [m for m in (getattr(cls, "error_messages", None),) if isinstance(m, Errors)],
                          kind, info, deepest=n == 0)
        if found is None:
            continue
        marker, template = found
        variables = {**(error.get("ctx") or {}), "name": name, "at": _format_loc(path[:depth]),
                     "item": _format_loc(path[:depth] + _indices(path[depth:])), "loc": _format_loc(path),
                     "input": error.get("input"), "value": value, "got": _got(error.get("input")),
                     "type": type(error.get("input")).__name__, "label": _label(info.annotation) if info else "dict",
                     "unknown": unknown, "unknown_names": ", ".join(unknown), **_bounds(info)}
        try:
            message = template(variables) if callable(template) else template.format(**variables)
        except (KeyError, IndexError, ValueError, AttributeError) as exc:
            # a bug in our template (a stray "{"): still the client's 400, in pydantic's words
            log.error("error template %r failed: %r", template, exc)
            where = _format_loc(path)
            message = f"{where}: {error['msg']}" if where else error["msg"]
        return InvalidRequest(message, name, marker.status or 400, marker.code)
    where = _format_loc(path)
    return InvalidRequest(f"{where}: {error['msg']}" if where else error["msg"], name)


def _template(markers: list[Errors], kind: str, info, deepest: bool) -> tuple[Errors, Template] | None:
    if not deepest:                                      # the error is inside this level's value
        return next(((m, m.default) for m in markers if m.default is not None), None)
    exact = next(((m, m.kinds[kind]) for m in markers if m.kinds.get(kind) is not None), None)
    if exact is None and kind in BUILT_IN and info is not None and "str" in _label(info.annotation).split("/"):
        exact = (Errors(), BUILT_IN[kind])
    return exact or next(((m, t) for m in markers if (t := m.template(kind)) is not None), None)


# ---- which error -------------------------------------------------------------------------------
def _pick(errors: list[dict], model: type[BaseModel]) -> dict:
    """The first error; an object's unknown fields before anything else inside it; of the members
    of a union, the one that came closest (right types, deepest, fewest errors)."""
    first = errors[0]
    for n in range(len(first["loc"]) + 1):                     # the outermost object first
        extra = [e for e in errors if e["type"] == "extra_forbidden" and e["loc"][:-1] == first["loc"][:n]]
        if extra:
            return min(extra, key=lambda e: str(e["loc"][-1]))
    tags = _walk(model, first["loc"])[2]
    if not tags:
        return first
    tag = tags[0]
    site = tuple(first["loc"][:tag])
    branches: dict[tuple, list[dict]] = {}
    for e in errors:
        if tuple(e["loc"][:tag]) == site and len(e["loc"]) > tag:
            branches.setdefault(tuple(e["loc"][:tag + 1]), []).append(e)
    best = max(branches.values(), key=lambda errs: (not any(_is_type_error(e["type"]) for e in errs),
                                                     max(len(e["loc"]) for e in errs), -len(errs)))
    return best[0]


def _walk(model: type[BaseModel], loc: tuple) -> tuple[list[tuple[type[BaseModel], str | None, int]], list, list[int]]:
    """The (model, field, depth in path) levels along `loc`, `loc` without the tags of union
    members, and where those tags were in `loc`."""
    levels: list[tuple[type[BaseModel], str | None, int]] = [(model, None, 0)]
    path: list = []
    tags: list[int] = []
    current: list[type[BaseModel]] = [model]            # the models the value at this point may be
    for i, part in enumerate(loc):
        if isinstance(part, int):
            path.append(part)
            continue
        owner, field = next(((m, f) for m in current if (f := _field(m, part))), (None, None))
        if owner is not None:
            path.append(part)
            levels.append((owner, field, len(path)))
            current = _models_in(owner.model_fields[field].annotation)
            continue
        tags.append(i)
        tagged = [m for m in current if m.__name__ == part]     # a union member's tag
        if tagged:
            current = tagged
            if levels[-1][1] is not None or levels[-1][0] is not tagged[0]:
                levels.append((tagged[0], None, len(path)))
    if len(current) == 1 and levels[-1][0] is not current[0] and path and isinstance(path[-1], int):
        levels.append((current[0], None, len(path)))          # an error at a list item that is a model
    return levels, path, tags


def _field(model: type[BaseModel], wire_name: str) -> str | None:
    """The attribute of `model` that `wire_name` (a field's name or alias) is."""
    if wire_name in model.model_fields:
        return wire_name
    return next((name for name, info in model.model_fields.items() if info.alias == wire_name), None)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        root = annotation.model_fields.get("root") if getattr(annotation, "__pydantic_root_model__", False) else None
        return _models_in(root.annotation) if root is not None else [annotation]
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        if not isinstance(arg, (str, int, float)) and arg is not None:
            out += [m for m in _models_in(arg) if m not in out]
    return out


# ---- wording -----------------------------------------------------------------------------------
def _is_type_error(kind: str) -> bool:
    return kind.endswith(("_type", "_parsing")) or kind == "int_from_float"


def _format_loc(path: list) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _indices(rest: list) -> list:
    return [rest[0]] if rest and isinstance(rest[0], int) else []


def _got(value: Any) -> str:
    return "a boolean" if isinstance(value, bool) else type(value).__name__


def _label(annotation: Any) -> str:
    """How the OpenAI-style messages name a field's type: int, int/float, bool, str, list, dict."""
    names = {bool: "bool", int: "int", float: "int/float", str: "str", list: "list", dict: "dict"}
    seen: list[str] = []

    def visit(t: Any) -> None:
        origin = typing.get_origin(t)
        if origin is typing.Annotated:
            return visit(typing.get_args(t)[0])
        if origin in (typing.Union, types.UnionType):
            for arg in typing.get_args(t):
                visit(arg)
            return
        base = origin or t
        if isinstance(base, type) and issubclass(base, BaseModel):
            base = dict
        label = names.get(base) if isinstance(base, type) else None
        if label and label not in seen:
            seen.append(label)
    visit(annotation)
    return "/".join(seen) or "object"


def _bounds(info) -> dict:
    lo = hi = None
    for m in info.metadata if info else ():
        if isinstance(m, (annotated_types.Ge, annotated_types.Gt)):
            lo = getattr(m, "ge", getattr(m, "gt", None))
        elif isinstance(m, (annotated_types.Le, annotated_types.Lt)):
            hi = getattr(m, "le", getattr(m, "lt", None))
    return {"lo": lo, "hi": hi}
