"""Every SQL statement axa-queue sends at run time, each named and with a line saying
what it does, in one module per table or concern:

- `session`: the schema, the `search_path`, the connections' settings, a ping;
- `notifications`: the channels, LISTEN, and the waiters' locks (`WAITING`);
- `jobs`: queuing jobs, reading and counting them;
- `exchange`: the exchange of endings for claims, and its variants (`EXCHANGE_LIMITED`,
  `CLAIM`), composed from named CTEs;
- `rates`: the variant gated by rate limits (`EXCHANGE_RATED`), with the rate limits'
  pieces (the gates, the slots stamped, when to look again);
- `keys`: fairness by key: queuing jobs with a key, the keyed claim (`EXCHANGE_KEYED`,
  made of `exchange`'s and `rates`' pieces and its own), the counts by key;
- `runs`: a run after its claim (heartbeats, giving back, lost runs);
- `maintenance`: stale recovery, retention, and the rebuild of bloated indexes;
- `history`: the history table's partitions, and moving finished jobs to it;
- `attempts`: a row per run (the exchange's pieces that keep it), read back and purged;
- `acts`, `pauses`, `schedules`, `workers`, `web`: a person's acts on jobs and on job
  names, the schedules, the worker processes, the dashboard;
- `testing`: `drain()` and `axa_queue.testing`;
- `workflows`: jobs queued with their dependencies, a workflow read and cancelled, a
  dependent's parents' results;
- `steps`: durable steps, read once by a run and each recorded fenced by its attempt.

Every statement is here by name (`sql.EXCHANGE`), and `statements()` lists them for
`axa-queue sql --statement NAME`, which prints any one whole. The statements that make
the tables are in the `schema` package.

Nothing here is built from values: parameters go in as `%s` placeholders. (The one
exception is DDL, which takes no parameters: `maintenance.reindex` and `drop_index`
name an index the catalog gave, quoted by `psycopg.sql.Identifier`.) Names are
unqualified, so the connection's `search_path` decides the schema, unless the queue is
given one (`QueueOptions.schema`): then `in_schema` names it in each statement, by
filling the statement's template with `psycopg.sql` (`naming`). The statements a
worker sends on every turn go with their parameters numbered once (`numbered`), so
psycopg need not convert a long text on each execution.

Statements that read or stamp the time take it as `%(now)s`, read as
`COALESCE(%(now)s::timestamptz, now())` (or `clock_timestamp()` where that is the
statement's clock): NULL, what the package always sends, is the database's clock; a
test passes a later time to let time pass without waiting for it.
"""

from __future__ import annotations

import sys

from .acts import (
    ACTS as ACTS,
)
from .acts import (
    CANCEL as CANCEL,
)
from .acts import (
    CANCEL_BATCH as CANCEL_BATCH,
)
from .acts import (
    MATCHING as MATCHING,
)
from .acts import (
    MATCHING_MOVED as MATCHING_MOVED,
)
from .acts import (
    MISSING as MISSING,
)
from .acts import (
    RETRY as RETRY,
)
from .acts import (
    RETRY_BATCH as RETRY_BATCH,
)
from .acts import (
    RETRY_MOVED_BATCH as RETRY_MOVED_BATCH,
)
from .attempts import (
    ATTEMPTS as ATTEMPTS,
)
from .attempts import (
    ATTEMPTS_DROP as ATTEMPTS_DROP,
)
from .counts import (
    COUNT_ESTIMATES as COUNT_ESTIMATES,
)
from .counts import (
    COUNTS as COUNTS,
)
from .counts import (
    COUNTS_BY_NAME as COUNTS_BY_NAME,
)
from .counts import (
    COUNTS_SAMPLE_MOVED as COUNTS_SAMPLE_MOVED,
)
from .counts import (
    FINISHED_COUNTS_BY_NAME as FINISHED_COUNTS_BY_NAME,
)
from .counts import (
    LIVE_COUNTS_BY_NAME as LIVE_COUNTS_BY_NAME,
)
from .exchange import (
    CLAIM as CLAIM,
)
from .exchange import (
    EXCHANGE as EXCHANGE,
)
from .exchange import (
    EXCHANGE_LIMITED as EXCHANGE_LIMITED,
)
from .history import (
    HISTORY_DAYS as HISTORY_DAYS,
)
from .history import (
    HISTORY_DAYS_PAST as HISTORY_DAYS_PAST,
)
from .history import (
    HISTORY_DROP as HISTORY_DROP,
)
from .history import (
    HISTORY_FIRST_DAY as HISTORY_FIRST_DAY,
)
from .history import (
    HISTORY_LOCK_TIMEOUT as HISTORY_LOCK_TIMEOUT,
)
from .history import (
    HISTORY_MOVABLE as HISTORY_MOVABLE,
)
from .history import (
    HISTORY_MOVE as HISTORY_MOVE,
)
from .history import (
    HISTORY_PURGEABLE as HISTORY_PURGEABLE,
)
from .jobs import (
    ENQUEUE as ENQUEUE,
)
from .jobs import (
    ENQUEUE_COPY as ENQUEUE_COPY,
)
from .jobs import (
    ENQUEUE_MANY as ENQUEUE_MANY,
)
from .jobs import (
    ENQUEUE_UNIQUE as ENQUEUE_UNIQUE,
)
from .jobs import (
    ENQUEUE_UNIQUE_ONE as ENQUEUE_UNIQUE_ONE,
)
from .jobs import (
    JOB as JOB,
)
from .jobs import (
    JOBS as JOBS,
)
from .jobs import (
    RESULT as RESULT,
)
from .jobs import (
    TASK_RESULT as TASK_RESULT,
)
from .keys import (
    ENQUEUE_COPY_KEYED as ENQUEUE_COPY_KEYED,
)
from .keys import (
    ENQUEUE_KEYED as ENQUEUE_KEYED,
)
from .keys import (
    ENQUEUE_MANY_KEYED as ENQUEUE_MANY_KEYED,
)
from .keys import (
    EXCHANGE_KEYED as EXCHANGE_KEYED,
)
from .keys import (
    KEY_COUNTS as KEY_COUNTS,
)
from .maintenance import (
    GIVE_BACK_GONE as GIVE_BACK_GONE,
)
from .maintenance import (
    GIVE_BACK_LIMIT as GIVE_BACK_LIMIT,
)
from .maintenance import (
    INDEX_SIZES as INDEX_SIZES,
)
from .maintenance import (
    PURGE as PURGE,
)
from .maintenance import (
    PURGEABLE as PURGEABLE,
)
from .maintenance import (
    RECOVER_STALE as RECOVER_STALE,
)
from .maintenance import (
    REINDEX_LOCK as REINDEX_LOCK,
)
from .maintenance import (
    REINDEX_UNLOCK as REINDEX_UNLOCK,
)
from .maintenance import (
    REINDEX_WAIT as REINDEX_WAIT,
)
from .maintenance import (
    REINDEX_WAIT_RESET as REINDEX_WAIT_RESET,
)
from .maintenance import (
    STALE as STALE,
)
from .maintenance import (
    drop_index as drop_index,
)
from .maintenance import (
    reindex as reindex,
)
from .naming import in_schema as in_schema
from .notifications import (
    CANCEL_CHANNEL as CANCEL_CHANNEL,
)
from .notifications import (
    CHANNEL as CHANNEL,
)
from .notifications import (
    DONE_CHANNEL as DONE_CHANNEL,
)
from .notifications import (
    LISTEN as LISTEN,
)
from .notifications import (
    LISTEN_CANCEL as LISTEN_CANCEL,
)
from .notifications import (
    LISTEN_DONE as LISTEN_DONE,
)
from .notifications import (
    WAITING as WAITING,
)
from .notifications import (
    WAITING_LOCK_TIMEOUT as WAITING_LOCK_TIMEOUT,
)
from .numbered import Numbered as Numbered
from .numbered import numbered as numbered
from .pauses import (
    NAME_ACTS as NAME_ACTS,
)
from .pauses import (
    PAUSE as PAUSE,
)
from .pauses import (
    PAUSED as PAUSED,
)
from .pauses import (
    RESUME as RESUME,
)
from .rates import (
    EXCHANGE_RATED as EXCHANGE_RATED,
)
from .runs import (
    FAIL_UNCLAIMABLE as FAIL_UNCLAIMABLE,
)
from .runs import (
    GIVE_BACK as GIVE_BACK,
)
from .runs import (
    HEARTBEAT as HEARTBEAT,
)
from .runs import (
    MARK_LOST as MARK_LOST,
)
from .runs import (
    ROWS_FREE as ROWS_FREE,
)
from .schedules import (
    CRON_TICK as CRON_TICK,
)
from .schedules import (
    SCHEDULE_ARCHIVE as SCHEDULE_ARCHIVE,
)
from .schedules import (
    SCHEDULE_TICK as SCHEDULE_TICK,
)
from .schedules import (
    SCHEDULES as SCHEDULES,
)
from .schedules import (
    SCHEDULES_DUE as SCHEDULES_DUE,
)
from .schedules import (
    SCHEDULES_SEEN as SCHEDULES_SEEN,
)
from .session import (
    CLAIM_SETTINGS as CLAIM_SETTINGS,
)
from .session import (
    CLOCK as CLOCK,
)
from .session import (
    CURRENT_SCHEMA as CURRENT_SCHEMA,
)
from .session import (
    EXCHANGE_ROW_WAIT as EXCHANGE_ROW_WAIT,
)
from .session import (
    LOCAL_SEARCH_PATH as LOCAL_SEARCH_PATH,
)
from .session import (
    PING as PING,
)
from .session import (
    SEARCH_PATH as SEARCH_PATH,
)
from .session import (
    SESSION_SETTINGS as SESSION_SETTINGS,
)
from .steps import STEP_RECORD as STEP_RECORD
from .steps import STEPS_DROP as STEPS_DROP
from .steps import STEPS_DROP_BATCH as STEPS_DROP_BATCH
from .steps import STEPS_RECORDED as STEPS_RECORDED
from .testing import (
    DRAIN_DUE_NOW as DRAIN_DUE_NOW,
)
from .testing import (
    DRAIN_READY as DRAIN_READY,
)
from .testing import (
    DRAIN_REVIEW as DRAIN_REVIEW,
)
from .testing import (
    END_SESSIONS as END_SESSIONS,
)
from .testing import (
    ENQUEUED as ENQUEUED,
)
from .web import (
    WEB_ACTS as WEB_ACTS,
)
from .web import (
    WEB_ESTIMATE_READY as WEB_ESTIMATE_READY,
)
from .web import (
    WEB_ESTIMATE_WAITING as WEB_ESTIMATE_WAITING,
)
from .web import (
    WEB_FINISHED_PER_MINUTE as WEB_FINISHED_PER_MINUTE,
)
from .web import (
    WEB_JOBS_NEWEST as WEB_JOBS_NEWEST,
)
from .web import (
    WEB_JOBS_OLDEST as WEB_JOBS_OLDEST,
)
from .web import (
    WEB_LIVE_COUNTS as WEB_LIVE_COUNTS,
)
from .workers import (
    ABSENT_BEAT_MS as ABSENT_BEAT_MS,
)
from .workers import (
    GIVE_BACK_GRACE_MS as GIVE_BACK_GRACE_MS,
)
from .workers import (
    GONE_AFTER_BEATS as GONE_AFTER_BEATS,
)
from .workers import (
    PRESENCE_HOLD as PRESENCE_HOLD,
)
from .workers import (
    PRESENCE_LOCK as PRESENCE_LOCK,
)
from .workers import (
    UNHANDLED_JOBS as UNHANDLED_JOBS,
)
from .workers import (
    WORKER_GONE as WORKER_GONE,
)
from .workers import (
    WORKER_GONE_JOBS as WORKER_GONE_JOBS,
)
from .workers import (
    WORKER_SEEN as WORKER_SEEN,
)
from .workers import (
    WORKERS as WORKERS,
)
from .workers import (
    WORKERS_FORGET as WORKERS_FORGET,
)
from .workflows import CANCEL_WORKFLOW as CANCEL_WORKFLOW
from .workflows import ENQUEUE_LINKED as ENQUEUE_LINKED
from .workflows import PARENT_RESULTS as PARENT_RESULTS
from .workflows import WORKFLOW as WORKFLOW
from .workflows import WORKFLOW_OF as WORKFLOW_OF
from .workflows import WORKFLOWS_DROP as WORKFLOWS_DROP

__all__ = ["CANCEL_CHANNEL", "CHANNEL", "DONE_CHANNEL", "Numbered", "in_schema", "numbered"]


def statements() -> dict[str, str]:
    """Every named statement, by name, in name order: the text constants of this
    package's modules but the channels' names (what `axa-queue sql --statement NAME`
    prints)."""
    module = sys.modules[__name__]
    return {
        name: value
        for name, value in sorted(vars(module).items())
        if name.isupper() and isinstance(value, str) and not name.endswith("CHANNEL")
    }
