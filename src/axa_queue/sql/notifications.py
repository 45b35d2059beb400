"""The LISTEN/NOTIFY channels and the statements that listen, and `WAITING`, the
waiter's side of the advisory locks through which finishing a job tells those who wait
(`Queue.wait`; the other side is `EXCHANGE`'s `finished`)."""

from __future__ import annotations

from .naming import statement

__all__ = [
    "CANCEL_CHANNEL",
    "CHANNEL",
    "DONE_CHANNEL",
    "LISTEN",
    "LISTEN_CANCEL",
    "LISTEN_DONE",
    "WAITING",
    "WAITING_LOCK_TIMEOUT",
]

CHANNEL = statement("{axa_queue}")
"""The LISTEN/NOTIFY channel; the payload is `<schema> <seconds until the earliest new job>`."""

DONE_CHANNEL = "axa_queue_done"
"""The channel of finished jobs, for waiters; the payload is `<the table's oid> <id> <id>
...` (`EXCHANGE`, `CANCEL` and `MARK_LOST` name one job each), or `<oid> *` (look at
every job waited for: stale recovery finishing more than 150). Sent only while someone
waits, but by `CANCEL`, `MARK_LOST` and `RECOVER_STALE`, which are rare."""

CANCEL_CHANNEL = "axa_queue_cancel"
"""The channel of running jobs a person cancelled (`CANCEL`); the payload is the job's
id. Workers listen to it beside `CHANNEL`; one running the job checks it with a
heartbeat at once (`HEARTBEAT` says which runs are cancelled), so a notification for
another schema's job of the same id costs one heartbeat and stops nothing."""

LISTEN = "LISTEN axa_queue"
"""Receive wake-ups for new jobs."""

LISTEN_CANCEL = "LISTEN axa_queue_cancel"
"""Receive word of running jobs a person cancelled (`CANCEL_CHANNEL`), on the worker's
notification connection."""

LISTEN_DONE = "LISTEN axa_queue_done"
"""Receive word of finished jobs (`DONE_CHANNEL`), for `Queue.wait`."""

WAITING_LOCK_TIMEOUT = "SELECT set_config('lock_timeout', %s, false)"
"""How long `WAITING` may wait for its locks on `SyncQueue.wait`'s own connection (the
wait's time left, as `<n>ms`; `0` for no limit): it waits behind statements finishing
jobs, one of which may itself wait for a row lock."""

WAITING = statement("""SELECT CASE
    WHEN pg_advisory_lock_shared(1635213688, {'axa_queue'}::regclass::oid::int4)::text IS NULL
        THEN NULL
    WHEN pg_advisory_lock(1635213687, {'axa_queue'}::regclass::oid::int4)::text IS NULL THEN NULL
    WHEN pg_advisory_unlock(1635213687, {'axa_queue'}::regclass::oid::int4)
        THEN {'axa_queue'}::regclass::oid::text
    END AS tag""")
"""Say this session waits for jobs of the table to finish, until it ends: hold the
waiting lock shared, so statements that finish jobs notify `DONE_CHANNEL`; then take
and let go the ending lock, which waits for every such statement that may have asked
before to commit (see `EXCHANGE`). Sent after `LISTEN_DONE`, before reading any row
waited for. Returns the table's oid, which notifications name."""
