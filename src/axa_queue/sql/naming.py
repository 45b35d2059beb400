"""How a statement names the queue's tables and functions: as placeholders of a
`psycopg.sql` template, filled with bare names for the connection's `search_path`, or
with the queue's schema (`in_schema`, for `QueueOptions.schema`).

A statement that names a table or function of the queue is written through
`statement`, as a template:

- `{axa_queue}` names the table (or a function, `{axa_queue_room}(...)`): bare,
  `axa_queue`, or in a schema, `"jobs".axa_queue`;
- `{'axa_queue'}` is the string literal naming it, for `::regclass` and `to_regclass`:
  `'axa_queue'`, or `'"jobs".axa_queue'`;
- a literal brace is doubled (`'{{}}'`, an empty array);
- what never takes the schema is written bare: the channels (`'axa_queue_done'`,
  `LISTEN axa_queue`), settings (`axa_queue.notify`), a table's name qualifying its
  column (`axa_queue.run_at`, which the `FROM` item's own name answers), index and
  trigger names (made in their table's schema), and a function's body (`verbatim`).

The module constant is the template filled with bare names: the statement as sent
without a schema, and as `axa-queue sql --statement NAME` prints it, whole. The
schema's version fills the same template with `psycopg.sql.Identifier(schema)` before
each name and `psycopg.sql.Literal` for the string literals: no statement text is ever
searched or rewritten, and any schema name is quoted as PostgreSQL reads it.
"""

from __future__ import annotations

import functools

from psycopg import sql as pgsql

__all__ = ["NAMES", "in_schema", "statement"]

NAMES = (
    "axa_queue",
    "axa_schedule",
    "axa_job_acts",
    "axa_schema_version",
    "axa_workers",
    "axa_rate_slots",
    "axa_paused",
    "axa_queue_history",
    "axa_queue_attempts",
    "axa_queue_deps",
    "axa_workflows",
    "axa_queue_steps",
    "axa_queue_notify",
    "axa_job_acts_refuse",
    "axa_job_acts_role",
    "axa_queue_room",
    "axa_queue_rate_room",
    "axa_queue_key_room",
    "axa_queue_history_days",
    "axa_queue_history_drop",
    "axa_queue_blocked_rule",
    "axa_queue_release",
    "axa_queue_note_ending",
    "axa_queue_release_all",
    "axa_queue_no_parent",
    "axa_queue_note_traced",
    "axa_queue_release_traced",
    "axa_queue_noted",
    "axa_queue_note_batched",
    "axa_queue_note_octets",
    "axa_queue_release_batched",
    "axa_queue_rate_slots_free",
)
"""The tables and functions the setup makes in the queue's schema: the names a template
may place. Each is a plain lowercase name, which needs no quotes, so it is written
bare after the quoted schema (`"jobs".axa_queue`), as `psql` shows it."""

_templates: dict[str, tuple[str, dict[str, str]]] = {}
"""Each statement made by `statement`, by its text without a schema: its template and
its verbatim pieces."""


def _names(schema: str | None) -> dict[str, pgsql.Composable]:
    """What each placeholder becomes: the bare names, or the names in `schema`."""
    if schema is None:
        return {
            **{name: pgsql.SQL(name) for name in NAMES},
            **{f"'{name}'": pgsql.Literal(name) for name in NAMES},
        }
    quoted = pgsql.Identifier(schema)
    return {
        **{name: pgsql.Composed([quoted, pgsql.SQL("." + name)]) for name in NAMES},
        **{f"'{name}'": pgsql.Literal(f"{quoted.as_string()}.{name}") for name in NAMES},
    }


def _filled(template: str, verbatim: dict[str, str], schema: str | None) -> str:
    pieces = {key: pgsql.SQL(piece) for key, piece in verbatim.items()}
    return pgsql.SQL(template).format(**_names(schema), **pieces).as_string()


def statement(template: str, **verbatim: str) -> str:
    """The statement `template` makes without a schema (its names bare), remembered so
    that `in_schema` can make it in any schema. `verbatim` are pieces placed as they
    are in every schema (`{body}`: a function's body, which must be the same in every
    schema for setup to find it in place). Refuses a placeholder that is not one of
    `NAMES` (a `KeyError` when the module is imported)."""
    text = _filled(template, verbatim, None)
    known = _templates.setdefault(text, (template, verbatim))
    if known != (template, verbatim):
        raise ValueError(f"two templates make the same statement: {text[:60]!r}...")
    return text


@functools.lru_cache(maxsize=1024)
def in_schema(statement: str, schema: str) -> str:
    """`statement` with the queue's tables and functions in `schema`, so it runs
    whatever the connection's `search_path` (a transaction pooler refuses to set it at
    connect, and shares the server connection). Computed once per statement. A
    statement that names none of them (`SELECT 1`, `LISTEN axa_queue`) has no template
    and comes back as it is."""
    made = _templates.get(statement)
    if made is None:
        return statement
    template, verbatim = made
    return _filled(template, verbatim, schema)
