"""axa-queue: a job queue for Python services that lives entirely in PostgreSQL.

Jobs are rows in `axa_queue`, claimed with `FOR UPDATE SKIP LOCKED` by worker loops
in any number of processes. A run is fenced by its attempt number, a person's acts
are kept in an append-only table, schedules queue each due time exactly once, and a
job's arguments are never shown. The tables are shared with the Rust crate
`axa_postgres_job_queue`.
"""

from __future__ import annotations

from .acts.bulk import (
    BulkResult,
    cancel_all,
    release_all,
    retry_all,
)
from .acts.names import (
    Pause,
    name_acts_on,
    pause,
    paused_on,
    resume,
)
from .acts.records import (
    MAX_REASON_CHARS,
    NIL_JOB,
    Act,
    ActKind,
    ActResult,
    acts_on,
    cancel,
    retry,
)
from .context import JobContext, current_job
from .errors import (
    ArgumentsError,
    AxaQueueError,
    ClaimLostError,
    DrainError,
    JobNotFoundError,
    NoResultError,
    NotACodeError,
    NotInAJobError,
    NotOpenError,
    OptionsError,
    ScheduleError,
    SchemaError,
    StepError,
    WaitTimeoutError,
)
from .handlers.handler import JobHandler
from .handlers.policies import Discard, Exponential, Retry, Sleep, Snooze
from .handlers.retries import backoff
from .health import Health
from .jobs.attempts import attempts_on
from .jobs.enqueue import enqueue_all_on, enqueue_on
from .jobs.ids import Duplicate
from .jobs.keys import KeyCounts
from .jobs.linked import Composition, Workflow
from .jobs.model import Attempt, Counts, JobInfo, JobState, NewJob
from .jobs.parents import parent_results_on
from .jobs.reads import counts_on, job_on, jobs_on
from .jobs.steps import Step
from .maintenance import Recovered
from .options import QueueOptions
from .queue import Queue
from .schedules.schedule import Schedule, ScheduleInfo
from .schema.migrations import SETUP_STATEMENTS
from .sync import SyncQueue
from .worker.drain import DrainResult
from .workflows.compose import chain, chord, group
from .workflows.operate import WorkflowInfo, cancel_workflow, workflow_on

__version__ = "0.1.0"

__all__ = [
    "MAX_REASON_CHARS",
    "NIL_JOB",
    "SETUP_STATEMENTS",
    "Act",
    "ActKind",
    "ActResult",
    "ArgumentsError",
    "Attempt",
    "AxaQueueError",
    "BulkResult",
    "ClaimLostError",
    "Composition",
    "Counts",
    "Discard",
    "DrainError",
    "DrainResult",
    "Duplicate",
    "Exponential",
    "Health",
    "JobContext",
    "JobHandler",
    "JobInfo",
    "JobNotFoundError",
    "JobState",
    "KeyCounts",
    "NewJob",
    "NoResultError",
    "NotACodeError",
    "NotInAJobError",
    "NotOpenError",
    "OptionsError",
    "Pause",
    "Queue",
    "QueueOptions",
    "Recovered",
    "Retry",
    "Schedule",
    "ScheduleError",
    "ScheduleInfo",
    "SchemaError",
    "Sleep",
    "Snooze",
    "Step",
    "StepError",
    "SyncQueue",
    "WaitTimeoutError",
    "Workflow",
    "WorkflowInfo",
    "acts_on",
    "attempts_on",
    "backoff",
    "cancel",
    "cancel_all",
    "cancel_workflow",
    "chain",
    "chord",
    "counts_on",
    "current_job",
    "enqueue_all_on",
    "enqueue_on",
    "group",
    "job_on",
    "jobs_on",
    "name_acts_on",
    "parent_results_on",
    "pause",
    "paused_on",
    "release_all",
    "resume",
    "retry",
    "retry_all",
    "workflow_on",
]
