"""Typed arguments back from JSON: the handler's dataclass or pydantic model built from
a job's stored arguments, and checked (`from_json`).

Unknown keys, missing fields and values of the wrong type fail the attempt with a
`TypeError` naming the declared fields (the missing ones, each one of the wrong type
with the type it expects, or pydantic's error type), counting the unknown keys, never
naming them (a key may be data: an e-mail address, a token) nor showing a value. How
they are stored is `arguments`'.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import types
import typing
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any, Literal, Union
from uuid import UUID

from .arguments import encode, is_model, pydantic_module

__all__ = ["MAX_PROBLEMS", "from_json"]

MAX_PROBLEMS = 10
"""The most problems a typed handler's error lists (pydantic reports them all)."""


def _count(number: int, noun: str) -> str:
    """ "1 key", "2 keys"."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


def from_json(cls: type[Any], raw: Any, job: str) -> Any:
    """An instance of the dataclass or pydantic model `cls` from the stored JSON value
    `raw`, converted and checked by its fields' declared types; a `TypeError` naming
    the fields (never a value, nor an unknown key) when the value does not fit."""
    if is_model(cls):
        return _Decoder(job).model(cls, raw, "")
    return _Decoder(job).dataclass(cls, raw, "")


def _validation_errors(error: BaseException) -> list[dict[str, Any]] | None:
    """What a pydantic `ValidationError` found, without the input values (its text
    quotes them), or `None` for another exception."""
    pydantic = pydantic_module()
    if pydantic is None or not isinstance(error, pydantic.ValidationError):
        return None
    try:
        found = error.errors(include_url=False, include_context=False, include_input=False)
    except TypeError:  # pragma: no cover - a pydantic 2 before include_input: unread
        found = error.errors()
    return [{"type": one.get("type"), "loc": one.get("loc", ())} for one in found]


def _declared_names(cls: Any) -> set[str]:
    """The field names (and aliases) of `cls` and of every model or dataclass its fields'
    types reach: what a pydantic error's location may name. Any other text in a
    location is data (a dict's key, a union's tag) and is not shown."""
    names: set[str] = set()
    seen: set[int] = set()
    todo = [cls]
    while todo:
        hint = todo.pop()
        if id(hint) in seen:
            continue
        seen.add(id(hint))
        todo.extend(typing.get_args(hint))
        if is_model(hint):
            for name, info in hint.model_fields.items():
                names.add(name)
                names.update(
                    alias for alias in (info.alias, info.validation_alias) if isinstance(alias, str)
                )
                todo.append(info.annotation)
        elif isinstance(hint, type) and dataclasses.is_dataclass(hint):
            with contextlib.suppress(Exception):  # unresolvable annotations: only the names
                todo.extend(typing.get_type_hints(hint).values())
            names.update(f.name for f in dataclasses.fields(hint))
    return names


def _json_type(value: object) -> str:
    """The JSON type of a decoded value: object, array, string, number, boolean or null."""
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return "null" if value is None else type(value).__name__


def _type_name(hint: Any) -> str:
    """A declared type as it is written in code, without module names: `list[Line]`."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        return " | ".join("None" if a is type(None) else _type_name(a) for a in args)
    if origin is Literal:
        return f"Literal[{', '.join(repr(a) for a in args)}]"
    if origin is not None and args:
        inner = ", ".join("..." if a is Ellipsis else _type_name(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if isinstance(hint, type):
        return hint.__name__
    return str(hint).replace("typing.", "")


class _Decoder:
    def __init__(self, job: str) -> None:
        self.job = job

    def fail(self, where: str, expected: Any, raw: Any) -> TypeError:
        return TypeError(
            f"job {self.job!r}: field {where!r} expects {_type_name(expected)}, "
            f"got a JSON {_json_type(raw)}"
        )

    def dataclass(self, cls: type[Any], raw: Any, prefix: str) -> Any:
        """`cls` from the JSON object `raw`; `prefix` is the dotted path of the field that
        holds it (empty at the top)."""
        if not isinstance(raw, dict):
            if not prefix:
                raise TypeError(
                    f"job {self.job!r} expects a JSON object for {cls.__name__}, "
                    f"got a JSON {_json_type(raw)}"
                )
            raise self.fail(prefix, cls, raw)
        try:
            hints = typing.get_type_hints(cls)
        except Exception:  # unresolvable annotations: the fields go unchecked
            hints = {}
        fields = [f for f in dataclasses.fields(cls) if f.init]
        declared = {f.name for f in fields}
        unknown = sum(1 for key in raw if key not in declared)
        missing = [
            f"{prefix}.{f.name}" if prefix else f.name
            for f in fields
            if f.name not in raw
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ]
        if unknown or missing:
            raise TypeError(
                f"job {self.job!r}: {self.absent(cls.__name__, prefix, missing, unknown)}"
            )
        values: dict[str, Any] = {}
        for f in fields:
            if f.name in raw:
                path = f"{prefix}.{f.name}" if prefix else f.name
                values[f.name] = self.value(hints.get(f.name, Any), raw[f.name], path)
        try:
            return cls(**values)
        except Exception as error:  # a pydantic dataclass validates in __init__
            problems = _validation_errors(error)
            if problems is None:
                raise
        raise self.invalid(cls, prefix, problems)

    def absent(self, kind: str, prefix: str, missing: list[str], unknown: int) -> str:
        """What is said of an object of type `kind` at `prefix` that lacks the fields
        `missing` (dotted paths) and was given `unknown` keys it does not declare."""
        parts = []
        if missing:
            names = ", ".join(repr(path) for path in missing)
            parts.append(
                f"{kind} needs field{'s' if len(missing) > 1 else ''} {names}, "
                f"which {'were' if len(missing) > 1 else 'was'} not given"
            )
        if unknown:
            where = f"field {prefix!r}" if prefix else "it"
            parts.append(
                f"{where} was given {_count(unknown, 'key')} that {kind} does not declare "
                "(not named here: keys are arguments too)"
            )
        return "; ".join(parts)

    def model(self, cls: type[Any], raw: Any, prefix: str) -> Any:
        """The pydantic model `cls` from the JSON value `raw`, validated as JSON (what
        it was stored as: a strict model takes a date from its text)."""
        if not isinstance(raw, dict) and not issubclass(cls, pydantic_module().RootModel):
            if not prefix:
                raise TypeError(
                    f"job {self.job!r} expects a JSON object for {cls.__name__}, "
                    f"got a JSON {_json_type(raw)}"
                )
            raise self.fail(prefix, cls, raw)
        try:
            return cls.model_validate_json(encode(raw))
        except Exception as error:
            problems = _validation_errors(error)
            if problems is None:
                raise
        raise self.invalid(cls, prefix, problems)

    def invalid(self, cls: type[Any], prefix: str, problems: list[dict[str, Any]]) -> TypeError:
        """The `TypeError` for what pydantic found wrong with the `cls` at `prefix`: the
        fields' paths and pydantic's error types, never an input value, nor the name of a
        key that was not declared (or of a dict's key: those are arguments too)."""
        names = _declared_names(cls)

        def path(loc: Any) -> str:
            text = prefix
            for part in loc:
                if isinstance(part, int):
                    text += f"[{part}]"
                elif isinstance(part, str) and part in names:
                    text += f".{part}" if text else part
                else:
                    text += "[*]"
            return text

        missing: list[str] = []
        unknown: dict[str, int] = {}
        wrong: list[str] = []
        for problem in problems:
            loc, kind = tuple(problem["loc"] or ()), str(problem["type"])
            if kind == "missing":
                missing.append(path(loc))
            elif kind == "extra_forbidden" and loc:
                where = path(loc[:-1])
                unknown[where] = unknown.get(where, 0) + 1
            else:
                where = path(loc)
                wrong.append(f"field {where!r} is not valid ({kind})" if where else kind)
        parts = [self.absent(cls.__name__, prefix, missing, 0)] if missing else []
        parts += [
            self.absent(cls.__name__ if where == prefix else "its type", where, [], n)
            for where, n in unknown.items()
        ]
        parts += wrong
        more = len(parts) - MAX_PROBLEMS
        said = "; ".join(parts[:MAX_PROBLEMS]) + (f"; and {more} more" if more > 0 else "")
        what = f"field {prefix!r} does" if prefix else "the arguments do"
        return TypeError(f"job {self.job!r}: {what} not fit {cls.__name__}: {said}")

    def value(self, hint: Any, raw: Any, where: str) -> Any:
        if hint is Any or hint is object or isinstance(hint, typing.TypeVar):
            return raw
        origin = typing.get_origin(hint)
        if origin is Union or (hasattr(types, "UnionType") and origin is types.UnionType):
            options = typing.get_args(hint)
            if raw is None and type(None) in options:
                return None
            given = [option for option in options if option is not type(None)]
            if len(given) == 1 and isinstance(raw, (dict, list)):
                return self.value(given[0], raw, where)  # Optional[X]: X's message says where
            for option in options:
                if option is type(None):
                    continue
                try:
                    return self.value(option, raw, where)
                except TypeError:
                    continue
            raise self.fail(where, hint, raw)
        if origin is Literal:
            if raw in typing.get_args(hint) and not isinstance(raw, (list, dict)):
                return raw
            raise TypeError(
                f"job {self.job!r}: field {where!r} expects one of the values of {_type_name(hint)}"
            )
        if origin in (list, tuple, dict) or hint in (list, tuple, dict):
            return self.container(hint, origin or hint, raw, where)
        if not isinstance(hint, type):
            return raw  # an annotation this does not check (a Protocol, a NewType, ...)
        if dataclasses.is_dataclass(hint):
            if not isinstance(raw, dict):
                raise self.fail(where, hint, raw)
            return self.dataclass(hint, raw, where)
        if is_model(hint):
            return self.model(hint, raw, where)
        if issubclass(hint, enum.Enum):
            try:
                return hint(raw)
            except (ValueError, TypeError):
                raise TypeError(
                    f"job {self.job!r}: field {where!r} expects one of the values of {hint.__name__}"
                ) from None
        if hint is bool:
            if isinstance(raw, bool):
                return raw
            raise self.fail(where, hint, raw)
        if hint is int:
            if isinstance(raw, int) and not isinstance(raw, bool):
                return raw
            raise self.fail(where, hint, raw)
        if hint is float:
            if isinstance(raw, (int, float)) and not isinstance(raw, bool):
                return float(raw)
            raise self.fail(where, hint, raw)
        if hint is str:
            if isinstance(raw, str):
                return raw
            raise self.fail(where, hint, raw)
        if hint in (datetime, date, Decimal, UUID):
            return self.parsed(hint, raw, where)
        return raw  # another class: passed as stored, unchecked

    def parsed(self, hint: type[Any], raw: Any, where: str) -> Any:
        number = isinstance(raw, (int, float)) and not isinstance(raw, bool)
        if not isinstance(raw, str) and not (hint is Decimal and number):
            raise self.fail(where, hint, raw)
        try:
            if hint is Decimal:
                return Decimal(str(raw))
            if hint is UUID:
                return UUID(raw)
            text = raw[:-1] + "+00:00" if raw.endswith(("Z", "z")) else raw  # for 3.10
            if hint is datetime:
                return datetime.fromisoformat(text)
            return date.fromisoformat(raw)
        except (ValueError, InvalidOperation):
            raise TypeError(
                f"job {self.job!r}: field {where!r} expects {hint.__name__} "
                f"({'ISO 8601 text' if hint in (date, datetime) else 'its text'}), "
                "got a string that is not one"
            ) from None

    def container(self, hint: Any, origin: Any, raw: Any, where: str) -> Any:
        args = typing.get_args(hint)
        if origin is dict:
            if not isinstance(raw, dict):
                raise self.fail(where, hint, raw)
            item = args[1] if len(args) == 2 else Any
            return {key: self.value(item, value, f"{where}[*]") for key, value in raw.items()}
        if not isinstance(raw, list):
            raise self.fail(where, hint, raw)
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            if len(raw) != len(args):
                raise TypeError(
                    f"job {self.job!r}: field {where!r} expects {_type_name(hint)}, "
                    f"got a JSON array of {len(raw)}"
                )
            return tuple(
                self.value(a, v, f"{where}[{i}]")
                for i, (a, v) in enumerate(zip(args, raw, strict=True))
            )
        item = args[0] if args else Any
        items = [self.value(item, value, f"{where}[{i}]") for i, value in enumerate(raw)]
        return tuple(items) if origin is tuple else items
