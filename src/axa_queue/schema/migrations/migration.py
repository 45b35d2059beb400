"""A migration: its statements, each safe to repeat, the statement recording it, and
what it makes sure of (`Expectations`), which setup checks in the catalogs before
deciding there is nothing to do."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = ["Expectations", "Migration", "body_of"]


@dataclass(frozen=True)
class Expectations:
    """What the tables must have once some migrations ran, declared by each migration
    next to its statements. `SETUP_MISSING` takes them as parameters (`params`) and names
    each thing missing the way `lines` does."""

    tables: tuple[str, ...] = ()
    columns: tuple[tuple[str, str], ...] = ()
    """(table, column)."""
    indexes: tuple[str, ...] = ()
    constraints: tuple[tuple[str, str], ...] = ()
    """(table, constraint)."""
    functions: tuple[tuple[str, str], ...] = ()
    """(name, body) of each function: a bare name takes no argument, else the name is
    given with its argument types (`axa_queue_room(regclass,text,integer)`)."""
    triggers: tuple[tuple[str, str, bool], ...] = ()
    """(table, name, whether it must fire always)."""
    storage: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """(table, its `reloptions` that must be set)."""

    def __add__(self, other: Expectations) -> Expectations:
        """Both, `other` (a later migration's) winning for a storage setting both name:
        a later migration may set a table's `fillfactor` again (migration 24's 40 for
        the dependencies, where migration 14 made 70), and only its value is expected."""
        joined = Expectations(
            *(getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self))
        )
        return dataclasses.replace(joined, storage=_later_wins(self.storage, other.storage))

    def lines(self) -> set[str]:
        """Each thing expected, named as `SETUP_MISSING` names it when it is missing."""
        return {
            *(f"table {t}" for t in self.tables),
            *(f"column {t}.{c}" for t, c in self.columns),
            *(f"index {i}" for i in self.indexes),
            *(f"constraint {c}" for _, c in self.constraints),
            *(f"function {f}" if "(" in f else f"function {f}()" for f, _ in self.functions),
            *(f"trigger {g}" for _, g, _ in self.triggers),
            *(f"storage settings of {t}" for t, _ in self.storage),
        }

    def params(self) -> dict[str, Any]:
        """The parameters of `SETUP_MISSING`."""
        return {
            "tables": list(self.tables),
            "column_tables": [t for t, _ in self.columns],
            "columns": [c for _, c in self.columns],
            "indexes": list(self.indexes),
            "constraint_tables": [t for t, _ in self.constraints],
            "constraints": [c for _, c in self.constraints],
            "functions": [f for f, _ in self.functions],
            "bodies": [b for _, b in self.functions],
            "trigger_tables": [t for t, _, _ in self.triggers],
            "triggers": [g for _, g, _ in self.triggers],
            "trigger_always": [a for _, _, a in self.triggers],
            "storage_tables": [t for t, settings in self.storage for _ in settings],
            "storage": [s for _, settings in self.storage for s in settings],
        }


def _later_wins(
    earlier: tuple[tuple[str, tuple[str, ...]], ...], later: tuple[tuple[str, tuple[str, ...]], ...]
) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The storage settings of `earlier` that `later` does not set again (the same table
    and option, whatever the value), then `later`'s."""
    again = {(table, setting.split("=", 1)[0]) for table, settings in later for setting in settings}
    kept = tuple(
        (table, rest)
        for table, settings in earlier
        if (rest := tuple(s for s in settings if (table, s.split("=", 1)[0]) not in again))
    )
    return kept + later


@dataclass(frozen=True)
class Migration:
    """One step of the schema: its statements, each safe to repeat, the statement
    recording it in `axa_schema_version`, and what it makes sure of."""

    version: int
    name: str
    statements: tuple[str, ...]
    record: str
    makes: Expectations

    def all_statements(self) -> tuple[str, ...]:
        """Its statements, then its record: what applying it runs."""
        return (*self.statements, self.record)


def body_of(function: str) -> str:
    """The body of a `CREATE FUNCTION ... AS $$<body>$$` statement, as `pg_proc` keeps it."""
    return function.split("$$")[1]
