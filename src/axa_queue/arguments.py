"""Arguments: what a job's arguments may be, and typed (dataclass) arguments both ways.

A job's arguments are stored as JSON in a `jsonb` column, so they are checked in
Python before any SQL, with an `ArgumentsError` that names the job and the problem and
never a value or a key (keys are arguments too):

- plain JSON values only: `dict` (string keys), `list`, `tuple`, `str`, `int`,
  finite `float`, `bool`, `None`;
- no NUL character and no lone surrogate in any string or key (`jsonb` cannot hold
  them, and PostgreSQL's refusal would quote the data);
- nested at most `MAX_ARGS_DEPTH` deep.

A dataclass instance is queued as an object of its fields (those set by `__init__`).
Inside one, `date`, `datetime` (ISO 8601 text), `Decimal`, `UUID` (text) and `Enum`
(its value) are converted, and a handler whose parameter is annotated with the
dataclass gets them back as they were (`from_json`). Outside a dataclass they are
refused: the handler would get a string back, so say how (a dataclass, or convert).

What a handler returns (its job's result) is checked the same way (`result_json`), but
a value that cannot be stored fails the run's attempt rather than raising where it was
made: there is no caller to raise to.

`from_json` builds the handler's dataclass from the stored JSON and checks it: unknown
keys, missing fields and values of the wrong type fail the attempt with a `TypeError`
naming the declared field and the type it expects, never the value or the unknown keys.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import types
import typing
from collections.abc import Callable
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any, Literal, Union
from uuid import UUID

from .errors import ArgumentsError

__all__ = ["MAX_ARGS_DEPTH", "from_json", "result_json", "storable_problem", "to_json"]

MAX_ARGS_DEPTH = 100
"""The deepest a job's arguments may nest (objects and arrays within each other).
Deeper is refused when the job is made: the Rust crate's JSON reader stops at 128, and
Python's own recursion limit is not far off."""

CONVERTED = "date, datetime, Decimal, UUID and Enum"
"""The field types a dataclass's arguments are converted for, both ways."""


_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
"""Made once: `json.dumps` with options makes an encoder per call, most of its cost."""


def _made_encoder() -> Callable[[Any], str]:
    """`_ENCODER.encode` for what `_plain` returns, without the C encoder it makes at each
    call (two thirds of its cost for a small object): the same C encoder, made once with
    the same options. No circular check: `_plain` returns a new tree, never one that
    holds itself (it refuses those). `_ENCODER.encode` where Python has no C encoder."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - a Python without the C accelerator
        return _ENCODER.encode
    try:
        chunks = make(
            None,
            _ENCODER.default,
            json.encoder.encode_basestring_ascii,
            None,
            _ENCODER.key_separator,
            _ENCODER.item_separator,
            _ENCODER.sort_keys,
            _ENCODER.skipkeys,
            _ENCODER.allow_nan,
        )
    except TypeError:  # pragma: no cover - another signature: use the plain way
        return _ENCODER.encode

    def encode(plain: Any) -> str:
        if isinstance(plain, str):
            return json.encoder.encode_basestring_ascii(plain)
        return "".join(chunks(plain, 0))

    return encode


_encode = _made_encoder()
"""The JSON text of a value `_plain` returned, as `_ENCODER.encode` makes it."""


class _Refused(Exception):
    """What makes a value unstorable; the text never holds the value."""


def storable_problem(text: str) -> str | None:
    """Why PostgreSQL cannot store `text` (as `text` or in `jsonb`), or `None`."""
    if "\x00" in text:
        return "a NUL character (\\u0000), which PostgreSQL cannot store"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "a lone surrogate (not UTF-8), which PostgreSQL cannot store"
    return None


def to_json(value: Any, job: str) -> str:
    """The arguments of job `job` as JSON text, or `ArgumentsError` saying why not."""
    try:
        return _encode(_plain(value, 0, typed=False))
    except _Refused as refused:
        problem = str(refused)
    except (ValueError, TypeError, RecursionError):  # a number too long to print, ...
        problem = "they hold a value JSON cannot hold"
    raise ArgumentsError(f"the arguments of job {job!r} cannot be queued: {problem}")


RESULT_WORDS = (
    ("they hold", "it holds"),
    ("they nest", "it nests"),
    ("they have", "it has"),
    ("pass the arguments as a dataclass", "return a dataclass"),
    ("are converted both ways", "are stored as JSON text"),
)
"""How a problem with arguments is said of a return value."""


def result_json(value: Any, job: str) -> tuple[str | None, str | None]:
    """What job `job`'s handler returned, as JSON text to store as its result, checked
    as arguments are (plain JSON values, a dataclass as its fields, no NUL character or
    lone surrogate, nested at most `MAX_ARGS_DEPTH` deep): `(text, None)`, or `(None,
    why not)`, a sentence naming the job and the type, never a value."""
    try:
        return _encode(_plain(value, 0, typed=False)), None
    except _Refused as refused:
        problem = str(refused)
    except (ValueError, TypeError, RecursionError):  # a number too long to print, ...
        problem = "they hold a value JSON cannot hold"
    for said, meant in RESULT_WORDS:
        problem = problem.replace(said, meant)
    kind = type(value).__name__
    itself = f"it holds a {kind}, which JSON cannot hold"
    a_kind = f"{'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind}"
    if problem.startswith(itself):  # the value itself, not something inside it
        problem = f"JSON cannot hold {a_kind}{problem[len(itself) :]}"
    return None, (
        f"job {job!r} returned {a_kind} that cannot be stored as its result: {problem} "
        "(return JSON values: dict, list, str, int, float, bool, None, or a dataclass of them)"
    )


def _text(value: str, what: str) -> str:
    problem = storable_problem(value)
    if problem is not None:
        raise _Refused(f"{what} holds {problem}")
    return value


def _plain(value: Any, depth: int, typed: bool) -> Any:
    """`value` as plain JSON values; `typed` inside a dataclass. `depth` counts the
    objects and arrays around `value`; it is checked before going down, so this never
    recurses more than `MAX_ARGS_DEPTH` deep. The plain cases come first: most
    arguments are a small object of strings and numbers."""
    kind = type(value)
    if kind is str:
        if value.isascii() and "\x00" not in value:
            return value
        return _text(value, "a string")
    if kind is int or kind is bool or value is None:
        return value
    if kind is dict or kind is list or kind is tuple:
        if depth >= MAX_ARGS_DEPTH:
            raise _Refused(f"they nest deeper than {MAX_ARGS_DEPTH} levels (or hold themselves)")
        if kind is dict:
            return {
                key if type(key) is str and key.isascii() and "\x00" not in key else _key(key): (
                    _plain(item, depth + 1, typed)
                )
                for key, item in value.items()
            }
        return [_plain(item, depth + 1, typed) for item in value]
    return _other(value, depth, typed)


def _other(value: Any, depth: int, typed: bool) -> Any:
    """`_plain` of anything but a plain `str`, `int`, `bool`, `None`, `dict`, `list` or
    `tuple`: floats, subclasses, dataclasses and the types converted inside them."""
    if typed and isinstance(value, enum.Enum):
        return _plain(value.value, depth, typed)
    if isinstance(value, str):
        return _text(value, "a string")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Refused("they hold a number JSON cannot hold (NaN or infinity)")
        return value
    if isinstance(value, (dict, list, tuple)):
        plain = dict(value) if isinstance(value, dict) else list(value)
        return _plain(plain, depth, typed)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if depth >= MAX_ARGS_DEPTH:
            raise _Refused(f"they nest deeper than {MAX_ARGS_DEPTH} levels (or hold themselves)")
        return {
            f.name: _plain(getattr(value, f.name), depth + 1, True)
            for f in dataclasses.fields(value)
            if f.init
        }
    kind = type(value).__name__
    if isinstance(value, (date, Decimal, UUID, enum.Enum)):
        if typed:
            return _text(str(value) if not isinstance(value, date) else value.isoformat(), kind)
        raise _Refused(
            f"they hold a {kind}, which JSON cannot hold: pass the arguments as a "
            f"dataclass (its {CONVERTED} fields are converted both ways) or convert "
            "it to a JSON value yourself"
        )
    raise _Refused(f"they hold a {kind}, which JSON cannot hold")


def _key(key: Any) -> Any:
    if isinstance(key, str):
        return _text(key, "a key")
    if key is None or isinstance(key, int) or (isinstance(key, float) and math.isfinite(key)):
        return key  # JSON makes it a string, as json.dumps does
    raise _Refused(f"they have a key of type {type(key).__name__}; JSON keys are strings")


# --- back from JSON ------------------------------------------------------------------------


def from_json(cls: type[Any], raw: Any, job: str) -> Any:
    """An instance of the dataclass `cls` from the stored JSON value `raw`, converted
    and checked by its fields' declared types; a `TypeError` naming the field (never
    the value, nor an unknown key) when the value does not fit."""
    return _Decoder(job).dataclass(cls, raw, "")


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
        if unknown:
            where = f"field {prefix!r}" if prefix else "it"
            raise TypeError(
                f"job {self.job!r}: {where} was given {unknown} key(s) that {cls.__name__} "
                "does not declare (not named here: keys are arguments too)"
            )
        values: dict[str, Any] = {}
        for f in fields:
            path = f"{prefix}.{f.name}" if prefix else f.name
            if f.name not in raw:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise TypeError(
                        f"job {self.job!r}: {cls.__name__} needs field {path!r}, "
                        "which was not given"
                    )
                continue
            values[f.name] = self.value(hints.get(f.name, Any), raw[f.name], path)
        return cls(**values)

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
