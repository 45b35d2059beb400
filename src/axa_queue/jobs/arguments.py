"""Arguments: what a job's arguments may be, and typed (dataclass, pydantic) arguments as
they are stored (`typed` builds them back for a handler).

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

`typed.from_json` builds the handler's dataclass or model back from the stored JSON.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import sys
from collections.abc import Callable
from datetime import date
from decimal import Decimal
from typing import Any
from uuid import UUID

from ..errors import ArgumentsError

__all__ = [
    "MAX_ARGS_DEPTH",
    "MAX_RESULT_CHARS",
    "encode",
    "is_model",
    "is_typed",
    "pydantic_module",
    "result_json",
    "storable_problem",
    "to_json",
]

MAX_RESULT_CHARS = 16 * 1024 * 1024
"""The longest a result may be, in characters of its JSON text (16 Mi): a result is a
job's answer, stored in its row and sent by the statement that records every loop's
endings, which a result of hundreds of megabytes would hold up for seconds (and past
PostgreSQL's 256 MB a `jsonb` value cannot be stored at all). Store big outputs
elsewhere and return a reference to them."""

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


def pydantic_module() -> Any:
    """The pydantic module if it was imported (by the user: never here), else `None`."""
    return sys.modules.get("pydantic")


def is_model(cls: object) -> bool:
    """Whether `cls` is a pydantic (v2) model class. pydantic is not imported for this:
    a model class exists only once it was."""
    pydantic = pydantic_module()
    return (
        pydantic is not None
        and isinstance(cls, type)
        and issubclass(cls, pydantic.BaseModel)
        and hasattr(cls, "model_validate_json")  # pydantic 2, not pydantic 1's BaseModel
    )


def is_typed(cls: object) -> bool:
    """Whether a handler whose argument is annotated with `cls` is typed: `cls` is a
    dataclass or a pydantic model (`typed.from_json` builds it from the stored JSON)."""
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


encode = _made_encoder()
"""The JSON text of a value `_plain` returned (or of JSON values as `json.loads` reads
them), as `_ENCODER.encode` makes it."""


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
        return encode(_plain(value, 0, typed=False))
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
        text = encode(_plain(value, 0, typed=False))
        if len(text) <= MAX_RESULT_CHARS:
            return text, None
        return None, (
            f"job {job!r} returned a result of {len(text) / 2**20:,.0f} Mi characters as JSON, "
            f"more than the {MAX_RESULT_CHARS // 2**20} Mi a result may be: store big "
            "outputs elsewhere (a table of yours, object storage) and return a reference"
        )
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
