"""Migration 24, additive: the endings of a workflow's parents cost less. Two changes
to what migration 22 left, each measured on a chord of 10,000 drained by one process
(`bench/workflows.py`, where the exchange records about 200 endings a statement):

- the note: `axa_queue_note_batched` measured its chunk with `length()`, which counts
  the characters of the text one by one (a third of the row trigger's time, about 2 µs
  an ending). `axa_queue_note_octets` is the same function measuring it in bytes
  (`octet_length()`, read from the text's header; the ids are ASCII, so the two
  agree), and the trigger `axa_queue_release` now calls it;
- the dependencies' pages: `axa_queue_deps` was filled to 70% (`fillfactor` 70), room
  for about 30 new versions on a page of about 75 rows. A statement marking the
  dependencies of 200 parents claimed in their order (their rows are inserted in that
  order since this release) found no room after the first 30 of a page, so the rest
  were not HOT: a new entry in both indexes for each. Filled to 40%, a page's rows all
  fit a new version beside them: the release's time fell by a third (93 to 60 ms for
  10,000 endings). Pages already written keep their fill; new ones take the new one.

`axa_queue_note_batched` stays as it was (nothing calls it)."""

from __future__ import annotations

from ...sql.naming import statement
from .migration import Expectations, Migration, body_of

__all__ = [
    "DEPS_FILLFACTOR",
    "MIGRATION_24",
    "RECORD_24",
    "SETUP_DEPS_ROOM",
    "SETUP_NOTE_OCTETS_FUNCTION",
    "SETUP_NOTE_OCTETS_TRIGGER",
]

DEPS_FILLFACTOR = 40
"""How full `axa_queue_deps`'s pages are filled by inserts (written as a number in
`SETUP_DEPS_ROOM`)."""

SETUP_NOTE_OCTETS_FUNCTION = statement(
    """CREATE OR REPLACE FUNCTION {axa_queue_note_octets}() RETURNS trigger
LANGUAGE plpgsql AS $${body}$$""",
    body="""
DECLARE
    list text := 'axa_queue.' || NEW.status || '_' || TG_RELID::text;
    noted text := current_setting(list, true);
    chunks integer;
BEGIN
    IF noted IS NULL OR noted = '' THEN
        noted := set_config('axa_queue.endings', 'on', true);
        noted := '';
    ELSIF octet_length(noted) >= 2368 THEN
        chunks := COALESCE(NULLIF(current_setting(list || '_chunks', true), ''), '0')::integer + 1;
        noted := set_config(list || '_' || chunks, noted, true);
        noted := set_config(list || '_chunks', chunks::text, true);
        noted := '';
    END IF;
    noted := set_config(list, noted || NEW.id::text || ',', true);
    IF NEW.run_trace IS NOT NULL THEN
        noted := set_config('axa_queue.traced_' || TG_RELID::text, 'on', true);
    END IF;
    RETURN NEW;
END
""",
)
"""Migration 22's `axa_queue_note_batched`, its chunk measured in bytes: the same notes,
in the same settings and chunks (`axa_queue_noted` reads them back)."""

SETUP_NOTE_OCTETS_TRIGGER = statement("""CREATE OR REPLACE TRIGGER axa_queue_release
    BEFORE UPDATE OF status ON {axa_queue} FOR EACH ROW
    WHEN (NEW.dependents AND OLD.status IS DISTINCT FROM NEW.status
          AND NEW.status IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION {axa_queue_note_octets}()""")
"""Migration 18's noting trigger, by its name and with its `WHEN`, calling
`axa_queue_note_octets`."""

SETUP_DEPS_ROOM = statement("""DO $$
BEGIN
    IF NOT coalesce((SELECT reloptions FROM pg_class WHERE oid = {'axa_queue_deps'}::regclass)
                    @> ARRAY['fillfactor=40'], false) THEN
        ALTER TABLE {axa_queue_deps} SET (fillfactor = 40);
    END IF;
END
$$""")
"""Room on each page of the dependencies for every row's `done` to be written beside it
(a HOT update), even when a statement marks a whole page's rows; set once, so later
setups take no lock (`SHARE UPDATE EXCLUSIVE`, which lets reads and writes go on)."""

RECORD_24 = statement("""INSERT INTO {axa_schema_version} (version, name)
    VALUES (24, 'releases marked in place') ON CONFLICT (version) DO NOTHING""")
"""Migration 24 is applied."""

MIGRATION_24 = Migration(
    24,
    "releases marked in place",
    (SETUP_NOTE_OCTETS_FUNCTION, SETUP_NOTE_OCTETS_TRIGGER, SETUP_DEPS_ROOM),
    RECORD_24,
    Expectations(
        functions=(("axa_queue_note_octets", body_of(SETUP_NOTE_OCTETS_FUNCTION)),),
        storage=(("axa_queue_deps", (f"fillfactor={DEPS_FILLFACTOR}",)),),
    ),
)
"""Migration 24 and what it makes sure of."""
