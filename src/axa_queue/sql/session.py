"""The session's own statements: the schema the tables resolve to, the
`search_path` of a transaction, the settings of the queue's own connections, and
whether the database answers."""

from __future__ import annotations

__all__ = ["CURRENT_SCHEMA", "LOCAL_SEARCH_PATH", "PING", "SEARCH_PATH", "SESSION_SETTINGS"]

CURRENT_SCHEMA = "SELECT current_schema()"
"""The schema the tables resolve to, which notifications name (unless the queue is
given its schema)."""

LOCAL_SEARCH_PATH = "SELECT set_config('search_path', %s, true)"
"""Point this transaction's unqualified names at the queue's schema (`QueueOptions.schema`)
for the caller's own statements on `queue.connection()`: a transaction-local setting,
which a transaction pooler carries, where rewriting the caller's SQL could change the
text of its literals."""

SEARCH_PATH = "SELECT current_setting('search_path') AS search_path"
"""The transaction's `search_path`, to set it back (`LOCAL_SEARCH_PATH`) after statements
run in the queue's schema in a transaction that goes on (a Django migration's)."""

PING = "SELECT 1"
"""Whether the database answers."""

SESSION_SETTINGS = "SET jit = off; SET plan_cache_mode = force_generic_plan"
"""The claim's estimates can tempt the JIT, which costs far more than the query. Set
only on connections that are the queue's own: never behind a transaction pooler, where
they would stay on a server connection other clients then use (see `pooler`)."""
