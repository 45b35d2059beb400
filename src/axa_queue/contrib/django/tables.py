"""The queue's tables through Django's migrations: each schema version is one Django
migration (`migrations/`) whose operation (`apply`) runs that version's statements, as
`Queue.setup` would, on the database `AXA_QUEUE["DATABASE"]` names.

It runs in the migration's transaction, holding the advisory setup lock (so it takes
turns with workers setting up at the same time) with `setup_lock_timeout` as the
statements' lock timeout, and in `AXA_QUEUE["OPTIONS"]["schema"]` when one is given.
A version already recorded with all it makes in place runs nothing, as `Queue.setup`
(a database `axa-queue setup` made is left as it is). Reversing it does nothing: the
tables are shared with workers and the Rust crate, and are dropped by hand if ever.
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.db import DatabaseError, migrations

from ... import SchemaError, sql
from ... import schema as queue_schema
from ...db.adapters import run
from ...db.calls import Call
from . import conf

__all__ = ["apply", "operation"]

_SEARCH_PATH = Call(sql.SEARCH_PATH, (), lambda rows, _n: rows[0].search_path)
"""The transaction's `search_path`, to set it back after the migration's statements."""


def apply(version: int) -> Any:
    """The `RunPython` function that brings the tables to schema version `version`."""

    def forward(apps: Any, schema_editor: Any) -> None:
        connection = schema_editor.connection
        if connection.alias != conf.database_alias():
            return
        options = conf.queue_options()
        schema = options.resolved_schema()
        with connection.cursor() as cursor:
            timeout = round(options.setup_lock_timeout.total_seconds() * 1000)
            cursor.execute(queue_schema.SETUP_LOCK_TIMEOUT, [f"{timeout}ms"])
            held = "the setup lock (a worker or a migration is setting the tables up)"
            try:
                cursor.execute(queue_schema.TAKE_SETUP_LOCK, [queue_schema.SETUP_LOCK])
                held = "a lock on them"
                search_path = run(connection, _SEARCH_PATH)
                if schema is not None:
                    cursor.execute(sql.LOCAL_SEARCH_PATH, [schema])
                if run(connection, queue_schema.needs(version, schema)):
                    for statement in queue_schema.statements_of(version):
                        cursor.execute(statement)  # no parameters: a `%` stays as written
            except DatabaseError as error:
                if isinstance(error.__cause__, psycopg.errors.LockNotAvailable):
                    raise SchemaError(
                        f"could not bring the job queue's tables to schema version "
                        f"{version} within {timeout / 1000:g} s (setup_lock_timeout): "
                        f"another transaction holds {held}; run migrate again when the "
                        "database is quiet"
                    ) from None
                raise
            # The migration's own record goes where Django's tables are.
            cursor.execute(sql.LOCAL_SEARCH_PATH, [search_path])

    forward.__name__ = f"apply_schema_version_{version}"
    return forward


def operation(version: int) -> Any:
    """The migration operation for schema version `version`."""
    return migrations.RunPython(apply(version), migrations.RunPython.noop, elidable=False)
