"""A statement's named parameters numbered as PostgreSQL reads them (`$1`, `$2`...),
once, for the statements a worker sends on every turn of its loop.

psycopg turns `%(name)s` into `$1` with a regular expression over the whole text on
each execution of a statement longer than 4,096 characters (it caches only shorter
ones): 39 µs for the exchange (`EXCHANGE`, 6.9 KB), 53 µs for the keyed one, on every
statement a worker sends; numbered, 2.7 µs (docs/performance.md).
Numbered here once, the text goes as it is through a raw cursor
(`psycopg.AsyncRawCursor`), with the values in the order of `names`.

The placeholders read are psycopg's: `%(name)s`, the same name the same number, and
`%%` for a literal `%`; any other (`%s`, `%(name)b`) is refused, as the statements
numbered here use none.
"""

from __future__ import annotations

import functools
import re
from typing import Any, NamedTuple

__all__ = ["Numbered", "numbered"]

_PLACEHOLDER = re.compile(r"%(?:\(([^)]+)\)(.)|(.))", re.DOTALL)
"""psycopg's placeholder: `%(name)` and a format letter, or `%` and any character."""


class Numbered(NamedTuple):
    """A statement as a raw cursor sends it: its text with `$1`, `$2`..., and the name
    of each parameter in that order."""

    query: bytes
    names: tuple[str, ...]

    def values(self, params: dict[str, Any]) -> list[Any]:
        """The values of `params` in the statement's order (the others are left out);
        a missing one raises `KeyError` naming it: a mistake in the code, never in a
        value."""
        return [params[name] for name in self.names]


@functools.lru_cache(maxsize=256)
def numbered(statement: str) -> Numbered:
    """`statement` (named placeholders, as every statement in `sql` is written) with
    its parameters numbered; computed once per statement text (a schema's version of a
    statement, `in_schema`, is a text of its own)."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        name, kind, other = match.groups()
        if other == "%":
            return "%"
        if name is None or kind != "s":
            raise ValueError(f"only %(name)s placeholders can be numbered, not {match[0]!r}")
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    return Numbered(_PLACEHOLDER.sub(number, statement).encode(), tuple(names))
