"""The session's own statements: the schema the tables resolve to, the
`search_path` of a transaction, the settings of the queue's own connections, and
whether the database answers."""

from __future__ import annotations

__all__ = [
    "CLAIM_SETTINGS",
    "CLOCK",
    "CURRENT_SCHEMA",
    "EXCHANGE_ROW_WAIT",
    "LOCAL_SEARCH_PATH",
    "PING",
    "SEARCH_PATH",
    "SESSION_SETTINGS",
]

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

CLOCK = "SELECT now() AS now"
"""The database's clock (its transaction's start): when the dashboard counted a bulk
act's jobs, so the act confirmed takes no job that changed after (`web.act`)."""

PING = "SELECT 1"
"""Whether the database answers."""

SESSION_SETTINGS = "SET jit = off; SET plan_cache_mode = force_generic_plan"
"""The claim's estimates can tempt the JIT, which costs far more than the query. Set
only on connections that are the queue's own: never behind a transaction pooler, where
they would stay on a server connection other clients then use (see `pooler`)."""

CLAIM_SETTINGS = "SET enable_sort = off; SET enable_seqscan = off"
"""The exchange loop's own connection, which sends nothing but the claim statements
(`EXCHANGE` and its variants), plans them without a sort wherever an index gives the
order. The claim reads each name's levels `ORDER BY name, priority DESC, run_at`, an
order only `axa_queue_pick` gives; with statistics taken while next to no job was
queued, every partial index of queued jobs looks empty to the planner, and it would
as soon read `axa_queue_ready` or `axa_queue_claim` (shallower) whole and sort what it
found: every queued job of every name. A sort it cannot avoid (the ranking in
`picked`) it still makes.

Nor does it scan a table whole: every row it changes is found by key (the endings and
start marks by primary key, the claimed rows by the `ctid` its scan locked), and a plan
made while the table was empty (or its statistics said so) took a sequential scan for
each, since a table of ten pages or less (the planner's least guess for one never
vacuumed) costs less to read whole than ten random pages; kept as the generic plan, it
read the whole table once the table filled (1,940 buffers for a claim of 5 among
100,000 jobs). No shape of the statement avoids it (a key lookup, a `ctid` list, a
join: each costs a random page a row, against one page, or none, for a table planned
as empty); this setting does, whatever the statistics, and the claim's tables all have
the indexes its reads need. Set after `SESSION_SETTINGS`, on that connection only, and
like them never behind a transaction pooler."""

EXCHANGE_ROW_WAIT = "SET lock_timeout = '2s'"
"""How long the exchange loop's connection waits for a lock: its statement records
every loop's endings and claims, and an ending waits for its job's row, which a
person's open transaction may hold (an act not yet committed, a dependent being
queued in a request's transaction, a `SELECT ... FOR UPDATE` by hand) for as long as
it stays open. Past this, the statement fails (`lock_not_available`), the rows held
are found (`ROWS_FREE`) and their endings kept aside until free, and the rest is
sent again (`worker.held`): one held row delays its own run's ending, not every
loop's. Set with `CLAIM_SETTINGS`, on that connection only, never behind a
transaction pooler (which would keep it on a server connection others use: there the
exchange waits as long as the row is held)."""
