"""Arguments: what a job's arguments may be, and typed (dataclass, pydantic) arguments both ways.

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

A pydantic (v2) model, at the top or anywhere inside, is queued as
`model_dump(mode="json", by_alias=True)` (its JSON form, which pydantic validates
back), then checked as any JSON value is; a handler annotated with the model gets it
back through `model_validate_json`. pydantic stays optional and is never imported
here: a model exists only once its user imported pydantic, so the module is looked up
in `sys.modules`, and only for a value that is not plain JSON.

What a handler returns (its job's result) is checked the same way (`result_json`), but
a value that cannot be stored fails the run's attempt rather than raising where it was
made: there is no caller to raise to.

`from_json` builds the handler's dataclass or model from the stored JSON and checks it:
unknown keys, missing fields and values of the wrong type fail the attempt with a
`TypeError` naming the declared fields (the missing ones, each one of the wrong type
with the type it expects, or pydantic's error type), counting the unknown keys, never
naming them (a key may be data: an e-mail address, a token) nor showing a value.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import math
import sys
import types
import typing
from collections.abc import Callable
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any, Literal, Union
from uuid import UUID

from ..errors import ArgumentsError

__all__ = [
    "MAX_ARGS_DEPTH",
    "from_json",
    "is_model",
    "is_typed",
    "result_json",
    "storable_problem",
    "to_json",
]

MAX_ARGS_DEPTH = 100
"""The deepest a job's arguments may nest (objects and arrays within each other).
Deeper is refused when the job is made: the Rust crate's JSON reader stops at 128, and
Python's own recursion limit is not far off."""

CONVERTED = "date, datetime, Decimal, UUID and Enum"
"""The field types a dataclass's arguments are converted for, both ways."""

CONVERT = (
    ": convert it to a JSON value (dict, list, str, int, float, bool, None), or pass "
    "dataclasses or pydantic models"
)
"""What to do with a value of a type JSON cannot hold."""

MAX_PROBLEMS = 10
"""The most problems a typed handler's error lists (pydantic reports them all)."""


def _a(word: str) -> str:
    """`word` after its indefinite article, as it is said: "a set", "an object", "an M",
    "a UUID", "an HTTPError" (an initialism is read letter by letter)."""
    if word[:2].isupper() or len(word) == 1:  # an initialism: the first letter's name
        vowel = word[:1].upper() in "AEFHILMNORSX"
    else:
        vowel = word[:1].lower() in "aeiou" and not word.lower().startswith(
            ("uni", "use", "usu", "uti", "one", "eu")
        )
    return f"{'an' if vowel else 'a'} {word}"


def _count(number: int, noun: str) -> str:
    """ "1 key", "2 keys"."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _pydantic() -> Any:
    """The pydantic module if it was imported (by the user: never here), else `None`."""
    return sys.modules.get("pydantic")


def is_model(cls: object) -> bool:
    """Whether `cls` is a pydantic (v2) model class. pydantic is not imported for this:
    a model class exists only once it was."""
    pydantic = _pydantic()
    return (
        pydantic is not None
        and isinstance(cls, type)
        and issubclass(cls, pydantic.BaseModel)
        and hasattr(cls, "model_validate_json")  # pydantic 2, not pydantic 1's BaseModel
    )


def is_typed(cls: object) -> bool:
    """Whether a handler whose argument is annotated with `cls` is typed: `cls` is a
    dataclass or a pydantic model (`from_json` builds it from the stored JSON)."""
    return isinstance(cls, type) and (dataclasses.is_dataclass(cls) or is_model(cls))


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
    (CONVERT, ""),  # `result_json` says what to return
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
    a_kind = _a(type(value).__name__)
    itself = f"it holds {a_kind}, which JSON cannot hold"
    if problem.startswith(itself):  # the value itself, not something inside it
        problem = f"JSON cannot hold {a_kind}{problem[len(itself) :]}"
    return None, (
        f"job {job!r} returned {a_kind} that cannot be stored as its result: {problem} "
        "(return JSON values: dict, list, str, int, float, bool, None, or a dataclass or "
        "pydantic model of them)"
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
    if is_model(type(value)):
        return _plain(_dumped(value), depth, True)
    kind = type(value).__name__
    if isinstance(value, (date, Decimal, UUID, enum.Enum)):
        if typed:
            text = value.isoformat() if isinstance(value, date) else str(value)
            return _text(text, _a(kind))
        raise _Refused(
            f"they hold {_a(kind)}, which JSON cannot hold: pass the arguments as a "
            f"dataclass (its {CONVERTED} fields are converted both ways) or a pydantic "
            "model, or convert it to a JSON value yourself"
        )
    raise _Refused(f"they hold {_a(kind)}, which JSON cannot hold{CONVERT}")


def _dumped(model: Any) -> Any:
    """A pydantic model as the JSON values pydantic validates back into it (its aliases
    as keys). Its serialization warnings are off: they quote the value."""
    try:
        return model.model_dump(mode="json", by_alias=True, round_trip=True, warnings=False)
    except (ValueError, TypeError, RecursionError):  # what pydantic's text says is not ours
        pass
    raise _Refused(
        f"they hold {_a(type(model).__name__)} that pydantic cannot dump as JSON "
        '(its model_dump(mode="json") raised)'
    )


def _key(key: Any) -> Any:
    if isinstance(key, str):
        return _text(key, "a key")
    if key is None or isinstance(key, int) or (isinstance(key, float) and math.isfinite(key)):
        return key  # JSON makes it a string, as json.dumps does
    raise _Refused(f"they have a key of type {type(key).__name__}; JSON keys are strings")


# --- back from JSON ------------------------------------------------------------------------


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
    pydantic = _pydantic()
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
        if not isinstance(raw, dict) and not issubclass(cls, _pydantic().RootModel):
            if not prefix:
                raise TypeError(
                    f"job {self.job!r} expects a JSON object for {cls.__name__}, "
                    f"got a JSON {_json_type(raw)}"
                )
            raise self.fail(prefix, cls, raw)
        try:
            return cls.model_validate_json(_encode(raw))
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
