"""The app's migrations: one per schema version of `axa_queue.schema.migrations`, each
running that version's statements (`tables.operation`). A schema version added later
gets its Django migration here too (a test checks there is one for each)."""
